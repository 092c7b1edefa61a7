//! The agent rides out a collector that starts late and restarts mid-run:
//! every tick lands once.

use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use gputel_tests::{Running, collector_bin, duckdb_value, fixture_agent, table_scan};
use serde_json::json;

const TICKS: u64 = 40;

fn collector_on(port: u16, store: &std::path::Path) -> Running {
    let mut cmd = Command::new(collector_bin());
    cmd.args(["--listen", &format!("127.0.0.1:{port}"), "--store"])
        .arg(store)
        .arg("--wal-dir")
        .arg(gputel_tests::wal_dir_of(store))
        .args(["--flush-interval", "300ms"]);
    let mut collector = Running::spawn(cmd);
    collector.wait_for_log("listening on ", Duration::from_secs(30));
    collector
}

#[test]
fn a_late_and_restarting_collector_loses_and_doubles_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let port = {
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };

    // The agent starts first, with nothing listening.
    let mut cmd = fixture_agent("gpu-node-042");
    cmd.args(["--collector", &format!("http://127.0.0.1:{port}")])
        .args(["--interval", "100ms", "--ticks", &TICKS.to_string()])
        .args(["--drain-timeout", "20s"]);
    let mut agent = Running::spawn(cmd);
    agent.wait_for_log("collector unreachable", Duration::from_secs(10));

    let mut collector = collector_on(port, &store);
    collector.wait_for_log("flushed", Duration::from_secs(10));
    agent.wait_for_log("connected", Duration::from_secs(10));
    // A clean restart while the agent streams: what was written is
    // acknowledged before the streams close; the rest is resent.
    let stopped = collector.terminate(Duration::from_secs(30));
    assert!(stopped.status.success());
    agent.wait_for_log("stream lost; reconnecting", Duration::from_secs(10));
    let collector = collector_on(port, &store);

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

    let scan = table_scan(&store, "gpu");
    assert_eq!(
        duckdb_value(tmp.path(), &format!("select count(*) from {scan}")),
        json!(TICKS * 8)
    );
    assert_eq!(
        duckdb_value(
            tmp.path(),
            &format!("select count(*) from (select distinct node, gpu, ts from {scan})")
        ),
        json!(TICKS * 8)
    );
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
    let port = {
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let mut collector = collector_on(port, &store);
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
    let mut collector = collector_on(port, &store);
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

    let scan = table_scan(&store, "gpu");
    assert_eq!(
        duckdb_value(tmp.path(), &format!("select count(*) from {scan}")),
        json!(TICKS * 8)
    );
    assert_eq!(
        duckdb_value(
            tmp.path(),
            &format!("select count(*) from (select distinct node, gpu, ts from {scan})")
        ),
        json!(TICKS * 8)
    );
}
