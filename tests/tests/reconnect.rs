//! The agent rides out a collector that starts late and restarts mid-run:
//! every tick lands once.

use std::time::Duration;

use gputel_tests::{
    Running, assert_gpu_rows_exactly_once, collector_on, duckdb_value, fixture_agent, table_scan,
    unused_port,
};
use serde_json::json;

const TICKS: u64 = 40;

#[test]
fn a_late_and_restarting_collector_loses_and_doubles_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let port = unused_port();

    // The agent starts first, with nothing listening.
    let mut cmd = fixture_agent("gpu-node-042");
    cmd.args(["--collector", &format!("http://127.0.0.1:{port}")])
        .args(["--interval", "100ms", "--ticks", &TICKS.to_string()])
        .args(["--drain-timeout", "20s"]);
    let mut agent = Running::spawn(cmd);
    agent.wait_for_log("collector unreachable", Duration::from_secs(10));

    let mut collector = collector_on(port, &store, "300ms");
    collector.wait_for_log("flushed", Duration::from_secs(10));
    agent.wait_for_log("connected", Duration::from_secs(10));
    // A clean restart while the agent streams: what was written is
    // acknowledged before the streams close; the rest is resent.
    let stopped = collector.terminate(Duration::from_secs(30));
    assert!(stopped.status.success());
    agent.wait_for_log("stream lost; reconnecting", Duration::from_secs(10));
    let collector = collector_on(port, &store, "300ms");

    let agent = agent.wait(Duration::from_secs(60));
    let summary = String::from_utf8_lossy(&agent.stdout).trim().to_owned();
    assert!(agent.status.success(), "{summary}");
    assert!(
        summary.starts_with(&format!(
            "ticks={TICKS} batches={TICKS} acknowledged={TICKS} rejected=0 dropped=0 unacknowledged=0"
        )),
        "{summary}"
    );
    assert!(
        collector
            .terminate(Duration::from_secs(30))
            .status
            .success()
    );

    assert_gpu_rows_exactly_once(tmp.path(), &store, TICKS * 8);
    assert_eq!(
        duckdb_value(
            tmp.path(),
            &format!("select count(*) from {}", table_scan(&store, "node"))
        ),
        json!(TICKS)
    );
}

#[test]
fn a_collector_killed_mid_stream_loses_and_doubles_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let port = unused_port();
    let mut collector = collector_on(port, &store, "300ms");
    let mut cmd = fixture_agent("gpu-node-043");
    cmd.args(["--collector", &format!("http://127.0.0.1:{port}")])
        .args(["--interval", "100ms", "--ticks", &TICKS.to_string()])
        .args(["--drain-timeout", "20s"]);
    let mut agent = Running::spawn(cmd);
    agent.wait_for_log("connected", Duration::from_secs(10));
    collector.wait_for_log("flushed", Duration::from_secs(10));
    // SIGKILL: no last flush. Acknowledged batches are only in the log.
    let killed = collector.signal("KILL", Duration::from_secs(10));
    assert!(!killed.status.success());
    agent.wait_for_log("stream lost; reconnecting", Duration::from_secs(10));
    let mut collector = collector_on(port, &store, "300ms");
    // The same store and log: the replay is written before agents connect.
    let agent = agent.wait(Duration::from_secs(60));
    let summary = String::from_utf8_lossy(&agent.stdout).trim().to_owned();
    assert!(agent.status.success(), "{summary}");
    assert!(
        summary.starts_with(&format!(
            "ticks={TICKS} batches={TICKS} acknowledged={TICKS} rejected=0 dropped=0 unacknowledged=0"
        )),
        "{summary}"
    );
    collector.wait_for_log("agent disconnected", Duration::from_secs(10));
    assert!(
        collector
            .terminate(Duration::from_secs(30))
            .status
            .success()
    );

    assert_gpu_rows_exactly_once(tmp.path(), &store, TICKS * 8);
}
