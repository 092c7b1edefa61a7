//! The agent's spool: batches sampled while the collector is away arrive
//! exactly once when it is back, even across an agent restart; a full spool
//! drops the oldest, says so, and the newest still arrive.

use std::time::Duration;

use gputel_tests::{
    Running, assert_gpu_rows_exactly_once, duckdb_value, fixture_agent, start_collector,
    summary_field, table_scan, unused_port,
};
use serde_json::json;

fn field(summary: &str, key: &str) -> u64 {
    let value = summary_field(summary, key);
    value
        .parse()
        .unwrap_or_else(|e| panic!("{key}={value} in {summary:?}: {e}"))
}

/// Runs an agent with `spool` for `ticks` ticks against `collector`, waiting
/// `drain` for acknowledgements at the end; returns its summary.
fn agent_run(
    spool: &std::path::Path,
    collector: &str,
    ticks: u32,
    drain: &str,
    extra: &[&str],
) -> String {
    let mut agent = fixture_agent("gpu-node-044");
    agent
        .args(["--collector", collector, "--interval", "50ms"])
        .args(["--ticks", &ticks.to_string(), "--drain-timeout", drain])
        .arg("--spool-dir")
        .arg(spool)
        .args(extra);
    let out = Running::spawn(agent).wait(Duration::from_secs(60));
    let summary = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(out.status.success(), "agent failed: {summary}");
    summary
}

#[test]
fn an_outage_and_an_agent_restart_lose_and_double_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let spool = tmp.path().join("spool");
    let nobody = format!("http://127.0.0.1:{}", unused_port());
    // The collector is down for the whole first run: everything stays spooled.
    let first = agent_run(&spool, &nobody, 15, "1s", &[]);
    assert_eq!(field(&first, "unacknowledged"), 15, "{first}");
    assert_eq!(field(&first, "dropped"), 0, "{first}");

    // The agent restarts (same spool) and the collector comes back.
    let store = tmp.path().join("store");
    let (collector, addr) = start_collector(&store, &["--flush-interval", "300ms"]);
    let second = agent_run(&spool, &format!("http://{addr}"), 10, "20s", &[]);
    assert_eq!(field(&second, "batches"), 10, "{second}");
    assert_eq!(field(&second, "acknowledged"), 25, "{second}");
    assert_eq!(field(&second, "unacknowledged"), 0, "{second}");
    assert!(
        collector
            .terminate(Duration::from_secs(30))
            .status
            .success()
    );

    assert_gpu_rows_exactly_once(tmp.path(), &store, 25 * 8);
}

#[test]
fn a_full_spool_drops_the_oldest_counts_it_and_the_newest_arrive() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let spool = tmp.path().join("spool");
    let nobody = format!("http://127.0.0.1:{}", unused_port());
    // About 1.6 KB a batch: 32 KiB holds a score of them.
    let first = agent_run(&spool, &nobody, 60, "1s", &["--spool-max-bytes", "32768"]);
    let dropped = field(&first, "dropped");
    let kept = field(&first, "unacknowledged");
    assert!(dropped > 0, "{first}");
    assert_eq!(dropped + kept, 60, "{first}");

    let store = tmp.path().join("store");
    let (collector, addr) = start_collector(&store, &["--flush-interval", "300ms"]);
    let second = agent_run(
        &spool,
        &format!("http://{addr}"),
        1,
        "20s",
        &["--spool-max-bytes", "32768"],
    );
    assert_eq!(field(&second, "unacknowledged"), 0, "{second}");
    assert!(
        collector
            .terminate(Duration::from_secs(30))
            .status
            .success()
    );

    // What was kept arrives: the newest ticks of the first run, and the second run's one.
    let scan = table_scan(&store, "node");
    assert_eq!(
        duckdb_value(tmp.path(), &format!("select count(*) from {scan}")),
        json!(kept + 1)
    );
}
