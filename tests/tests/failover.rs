//! Two collectors on one store and agents that fail over between them: one
//! collector is killed (SIGKILL) while the load generator's agents stream to
//! both; its agents move to the other and resend what it had not
//! acknowledged; restarted, as systemd restarts it, it replays its log. No
//! row is lost; rows the killed one made durable but could not acknowledge
//! (a window of one log sync, often empty) are stored twice, and compaction
//! keeps each once.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use gputel_tests::{
    Running, collector_bin, duckdb_value, loadgen_bin, summary_field, table_scan, unused_port,
};
use serde_json::json;

const AGENTS: u64 = 8;
const GPUS: u64 = 8;
const TICKS: u64 = 400;

/// A collector on `127.0.0.1:port` writing to `store`, its log in `wal`.
fn collector(port: u16, store: &Path, wal: &Path) -> Running {
    let mut cmd = Command::new(collector_bin());
    cmd.args(["--plaintext", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--store")
        .arg(store)
        .arg("--wal-dir")
        .arg(wal)
        .args(["--flush-interval", "1s", "--compact-interval", "0"])
        .env("RUST_LOG", "info");
    let mut collector = Running::spawn(cmd);
    collector.wait_for_log("listening on ", Duration::from_secs(30));
    collector
}

/// Rows and distinct (node, gpu, ts) of the `gpu` table.
fn rows_and_keys(dir: &Path, store: &Path) -> (u64, u64) {
    let scan = table_scan(store, "gpu");
    let n = duckdb_value(dir, &format!("select count(*) from {scan}"));
    let k = duckdb_value(
        dir,
        &format!("select count(*) from (select distinct node, gpu, ts from {scan})"),
    );
    (n.as_u64().expect("a count"), k.as_u64().expect("a count"))
}

#[test]
fn a_collector_killed_under_load_loses_nothing_and_compaction_keeps_each_row_once() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let (port_a, port_b) = (unused_port(), unused_port());
    let mut a = collector(port_a, &store, &tmp.path().join("a.wal"));
    let mut b = collector(port_b, &store, &tmp.path().join("b.wal"));

    // An hour that closed two hours ago: compaction may merge it at once.
    let start = chrono::Utc::now() - chrono::Duration::hours(2);
    let start = format!("{}:00:00Z", start.format("%Y-%m-%dT%H"));
    let mut cmd = Command::new(loadgen_bin());
    cmd.args([
        "--collector",
        &format!("http://127.0.0.1:{port_a},http://127.0.0.1:{port_b}"),
        "--agents",
        &AGENTS.to_string(),
        "--gpus",
        &GPUS.to_string(),
        "--ticks",
        &TICKS.to_string(),
        "--interval-ms",
        "50",
        "--pace",
        "--start-ts",
        &start,
        "--node-prefix",
        "f-",
        "--timeout",
        "120s",
    ])
    .env("RUST_LOG", "info");
    let mut loadgen = Running::spawn(cmd);
    // Both collectors have streams before one dies.
    for c in [&mut a, &mut b] {
        c.wait_for_log("agent connected", Duration::from_secs(30));
    }
    std::thread::sleep(Duration::from_secs(6));
    let killed = a.signal("KILL", Duration::from_secs(30));
    assert!(!killed.status.success());
    // The agents that were on a resend to b what a had not acknowledged.
    let lost = loadgen.wait_for_log("stream lost", Duration::from_secs(30));
    assert!(lost.contains(&format!("127.0.0.1:{port_a}")), "{lost}");
    let moved = loadgen.wait_for_log(
        &format!("collector=http://127.0.0.1:{port_b}"),
        Duration::from_secs(30),
    );
    assert!(moved.contains("connected"), "{moved}");
    // Restarted as systemd would: its log replays what it had acknowledged.
    std::thread::sleep(Duration::from_secs(2));
    let a = collector(port_a, &store, &tmp.path().join("a.wal"));

    let (out, log) = loadgen.wait_with_log(Duration::from_secs(180));
    let summary = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(out.status.success(), "{summary}\n{}", log.join("\n"));
    let batches = AGENTS * TICKS;
    assert_eq!(
        summary_field(&summary, "acknowledged"),
        batches.to_string(),
        "{summary}"
    );
    for zero in ["rejected", "dropped"] {
        assert_eq!(summary_field(&summary, zero), "0", "{summary}");
    }
    let failovers = log.iter().filter(|l| l.contains("stream lost")).count();
    assert!(failovers >= 1, "{}", log.join("\n"));
    for c in [a, b] {
        assert!(c.terminate(Duration::from_secs(60)).status.success());
    }

    // Every row is stored: some twice (made durable by a, resent to b).
    let rows = AGENTS * GPUS * TICKS;
    let (stored, keys) = rows_and_keys(tmp.path(), &store);
    assert_eq!(keys, rows, "a row lost");
    assert!(stored >= rows);
    let out = Command::new(collector_bin())
        .args(["compact", "--min-age", "0s", "--store"])
        .arg(&store)
        .output()
        .expect("run gputel-collector compact");
    let compacted = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{compacted}");
    // Of every table's rows stored twice, the gpu table's alone are these.
    let removed: u64 = compacted
        .split(" duplicate rows removed, 0 of them with values differing")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no duplicate count, or differing values: {compacted}"));
    assert!(
        removed >= stored - rows,
        "{stored} stored for {rows}: {compacted}"
    );
    assert_eq!(rows_and_keys(tmp.path(), &store), (rows, rows));
    eprintln!(
        "{failovers} streams failed over; {} gpu rows stored twice before compaction; {compacted}",
        stored - rows
    );
    assert_eq!(
        duckdb_value(
            tmp.path(),
            &format!(
                "select count(distinct node) from {}",
                table_scan(&store, "gpu")
            )
        ),
        json!(AGENTS)
    );
}
