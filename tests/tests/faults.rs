//! The collector killed with SIGKILL, three times, while the load generator's
//! agents stream: afterwards every row is in Parquet exactly once.

use std::process::Command;
use std::time::{Duration, Instant};

use gputel_tests::{Running, assert_gpu_rows_exactly_once, collector_on, loadgen_bin, unused_port};

const AGENTS: u64 = 4;
const GPUS: u64 = 8;
const TICKS: u64 = 3000;

#[test]
fn three_sigkills_mid_stream_lose_and_double_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = tmp.path().join("store");
    let port = unused_port();
    let mut collector = collector_on(port, &store, "200ms");
    let mut loadgen = Command::new(loadgen_bin());
    loadgen
        .args(["--collector", &format!("http://127.0.0.1:{port}")])
        .args(["--agents", &AGENTS.to_string(), "--gpus", &GPUS.to_string()])
        .args(["--ticks", &TICKS.to_string(), "--window", "100"])
        .args(["--timeout", "240s"]);
    let loadgen = Running::spawn(loadgen);
    let started = Instant::now();
    for kill in 1..=3 {
        // Kill only while agents are streaming and something was written.
        collector.wait_for_log("agent connected", Duration::from_secs(60));
        collector.wait_for_log("flushed", Duration::from_secs(60));
        let killed = collector.signal("KILL", Duration::from_secs(10));
        assert!(!killed.status.success(), "kill {kill}");
        collector = collector_on(port, &store, "200ms");
    }
    let out = loadgen.wait(Duration::from_secs(300));
    let summary = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(out.status.success(), "loadgen: {summary}");
    let batches = AGENTS * TICKS;
    assert!(
        summary.contains(&format!(
            "batches={batches} acknowledged={batches} rejected=0 dropped=0"
        )),
        "{summary}"
    );
    assert!(
        collector
            .terminate(Duration::from_secs(60))
            .status
            .success()
    );
    eprintln!(
        "three kills and {batches} batches in {:?}",
        started.elapsed()
    );

    assert_gpu_rows_exactly_once(tmp.path(), &store, AGENTS * GPUS * TICKS);
}
