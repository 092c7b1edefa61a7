//! `gputel-loadgen` against the real collector: it exits 0 only when every
//! batch is acknowledged, its summary counts what was sent, and DuckDB finds
//! every row exactly once.

use std::path::Path;
use std::time::Duration;

use gputel_tests::{duckdb, duckdb_value, run_loadgen, start_collector, summary_field, table_scan};
use serde_json::json;

/// Runs the load generator against `addr` and returns its summary line.
fn loadgen(addr: &str, args: &[&str]) -> String {
    let stdout = run_loadgen(addr, "60s", args);
    assert_eq!(stdout.lines().count(), 1, "one summary line: {stdout}");
    stdout
}

/// Rows of `table` per node whose name starts with `prefix`, and how many
/// distinct keys they have.
fn rows_and_keys(dir: &Path, store: &Path, table: &str, key: &str, prefix: &str) -> (u64, u64) {
    let rows = duckdb(
        dir,
        &format!(
            "select count(*) as n, count(distinct ({key})) as k from {} \
             where starts_with(node, '{prefix}')",
            table_scan(store, table)
        ),
    );
    let n = rows[0]["n"].as_u64().expect("count");
    let k = rows[0]["k"].as_u64().expect("count");
    (n, k)
}

#[test]
fn every_batch_is_acknowledged_and_stored_once() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let (collector, addr) = start_collector(&store, &["--flush-interval", "500ms"]);

    // One stream per agent for the whole run.
    let summary = loadgen(
        &addr,
        &[
            "--agents",
            "4",
            "--gpus",
            "8",
            "--ticks",
            "50",
            "--start-ts",
            "2026-01-01T00:00:05Z",
        ],
    );
    assert!(
        summary.starts_with(
            "agents=4 gpus=8 ticks=50 batches=200 acknowledged=200 rejected=0 dropped=0 \
             rows: gpu=1600 node=200 ib=800 values=25592 elapsed_s="
        ),
        "{summary}"
    );
    // 200 batches of 8 × 12 + 11 + 4 × 5 metric values, and the energy
    // counters of 8 GPUs at the 6 slow-read ticks of each agent (:05, the
    // first, then every 10 s).
    let elapsed: f64 = summary_field(&summary, "elapsed_s").parse().unwrap();
    let per_s: f64 = summary_field(&summary, "values_per_s").parse().unwrap();
    assert!(elapsed > 0.0 && per_s > 0.0, "{summary}");
    assert!(
        (per_s * elapsed - 25592.0).abs() < 0.01 * 25592.0 + per_s * 0.001,
        "{summary}"
    );

    // Windows of 7 ticks, two agents at a time: each window is a new stream
    // that continues the agent's sequence.
    let windowed = loadgen(
        &addr,
        &[
            "--agents",
            "3",
            "--gpus",
            "2",
            "--ticks",
            "20",
            "--window",
            "7",
            "--concurrency",
            "2",
            "--interval-ms",
            "250",
            "--start-ts",
            "2026-01-01T00:01:00Z",
            "--node-prefix",
            "windowed-",
        ],
    );
    // 5 s of ticks: one slow read, at the first.
    assert!(
        windowed.starts_with(
            "agents=3 gpus=2 ticks=20 batches=60 acknowledged=60 rejected=0 dropped=0 \
             rows: gpu=120 node=60 ib=240 values=3306 elapsed_s="
        ),
        "{windowed}"
    );

    // At most two batches unacknowledged: the generator waits for acks on
    // the agent's one stream, and nothing is dropped.
    let held = loadgen(
        &addr,
        &[
            "--agents",
            "1",
            "--gpus",
            "1",
            "--ticks",
            "40",
            "--max-pending",
            "2",
            "--start-ts",
            "2026-01-01T00:02:00Z",
            "--node-prefix",
            "held-",
        ],
    );
    assert!(
        held.starts_with(
            "agents=1 gpus=1 ticks=40 batches=40 acknowledged=40 rejected=0 dropped=0"
        ),
        "{held}"
    );

    // Paced: each tick sent at its time, so four ticks 300 ms apart take at
    // least 900 ms, and their timestamps start from now.
    let before_us = chrono::Utc::now().timestamp_micros();
    let paced = loadgen(
        &addr,
        &[
            "--agents",
            "2",
            "--gpus",
            "1",
            "--ticks",
            "4",
            "--interval-ms",
            "300",
            "--pace",
            "--node-prefix",
            "paced-",
        ],
    );
    assert!(
        paced.starts_with("agents=2 gpus=1 ticks=4 batches=8 acknowledged=8 rejected=0 dropped=0"),
        "{paced}"
    );
    let elapsed: f64 = summary_field(&paced, "elapsed_s").parse().unwrap();
    assert!(
        elapsed >= 0.9,
        "four ticks 300 ms apart sent in {elapsed} s"
    );

    let (stopped, log) = collector.terminate_with_log(Duration::from_secs(30));
    assert!(stopped.status.success(), "collector: {stopped:?}");
    // A stream per agent, and per window where there are windows: 4 + 3 × 3
    // (20 ticks in windows of 7) + 1 + 2.
    let connected = |node: &str| {
        log.iter()
            .filter(|line| line.contains("agent connected") && line.contains(node))
            .count()
    };
    assert_eq!(
        ["loadgen-", "windowed-", "held-", "paced-"].map(connected),
        [4, 9, 1, 2],
        "{log:#?}"
    );
    let first_paced_us = duckdb_value(
        tmp.path(),
        &format!(
            "select min(epoch_us(ts)) from {} where starts_with(node, 'paced-')",
            table_scan(&store, "node")
        ),
    );
    let first_paced_us = first_paced_us.as_i64().expect("paced rows");
    // `now` rounded down to the 300 ms interval.
    assert!(
        (before_us - 300_000..=before_us + 5_000_000).contains(&first_paced_us),
        "first paced tick at {first_paced_us}, the run started at {before_us}"
    );

    let dir = tmp.path();
    assert_eq!(
        rows_and_keys(dir, &store, "gpu", "node, gpu, ts", "loadgen-"),
        (4 * 8 * 50, 4 * 8 * 50)
    );
    assert_eq!(
        rows_and_keys(dir, &store, "node", "node, ts", "loadgen-"),
        (4 * 50, 4 * 50)
    );
    assert_eq!(
        rows_and_keys(dir, &store, "ib", "node, device, port, ts", "loadgen-"),
        (4 * 4 * 50, 4 * 4 * 50)
    );
    // The energy counter is stored at the slow-read ticks the count above
    // took it at.
    assert_eq!(
        duckdb_value(
            dir,
            &format!(
                "select string_agg(distinct strftime(ts, '%S'), ',' order by strftime(ts, '%S')) \
                 || ' ' || count(energy_mj) from {} where starts_with(node, 'loadgen-') \
                 and energy_mj is not null",
                table_scan(&store, "gpu")
            )
        ),
        json!(format!("05,10,20,30,40,50 {}", 4 * 8 * 6))
    );
    assert_eq!(
        rows_and_keys(dir, &store, "gpu", "node, gpu, ts", "windowed-"),
        (3 * 2 * 20, 3 * 2 * 20)
    );
    assert_eq!(
        rows_and_keys(dir, &store, "node", "node, ts", "windowed-"),
        (3 * 20, 3 * 20)
    );
    assert_eq!(
        rows_and_keys(dir, &store, "gpu", "node, gpu, ts", "held-"),
        (40, 40)
    );
    // Node names and tick spacing as asked for.
    assert_eq!(
        duckdb_value(
            dir,
            &format!(
                "select string_agg(distinct node, ',' order by node) from {} \
                 where starts_with(node, 'loadgen-')",
                table_scan(&store, "node")
            )
        ),
        json!("loadgen-1,loadgen-2,loadgen-3,loadgen-4")
    );
    assert_eq!(
        duckdb_value(
            dir,
            &format!(
                "select count(distinct epoch_us(ts)) || ' ' || \
                 (max(epoch_us(ts)) - min(epoch_us(ts))) from {} where node = 'windowed-2'",
                table_scan(&store, "node")
            )
        ),
        json!(format!("20 {}", 19 * 250_000))
    );
}
