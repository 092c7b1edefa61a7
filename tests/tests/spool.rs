//! The agent's spool: batches sampled while the collector is away arrive
//! exactly once when it is back, even across an agent restart; a full spool
//! drops the oldest, says so, and the newest still arrive; a clean stop
//! leaves nothing pending for the next start, and each run's summary counts
//! its own batches.

use std::time::Duration;

use gputel_tests::{
    Running, assert_gpu_rows_exactly_once, duckdb_value, fixture_agent, start_collector,
    summary_field, table_scan, unused_port,
};

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
    agent_run_logged(spool, collector, ticks, drain, extra).0
}

/// As [`agent_run`]; returns the summary and the agent's log.
fn agent_run_logged(
    spool: &std::path::Path,
    collector: &str,
    ticks: u32,
    drain: &str,
    extra: &[&str],
) -> (String, String) {
    let mut agent = fixture_agent("gpu-node-044");
    agent
        .args(["--collector", collector, "--interval", "50ms"])
        .args(["--ticks", &ticks.to_string(), "--drain-timeout", drain])
        .arg("--spool-dir")
        .arg(spool)
        .args(extra);
    let (out, log) = Running::spawn(agent).wait_with_log(Duration::from_secs(60));
    let summary = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(out.status.success(), "agent failed: {summary}");
    (summary, log.join("\n"))
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
    let (second, log) = agent_run_logged(&spool, &format!("http://{addr}"), 10, "20s", &[]);
    assert!(
        log.contains(
            "spool holds unacknowledged batches from before; they are sent first batches=15"
        ),
        "{log}"
    );
    // This run's ten, and the first run's fifteen apart.
    assert_eq!(field(&second, "batches"), 10, "{second}");
    assert_eq!(field(&second, "acknowledged"), 10, "{second}");
    assert_eq!(field(&second, "unacknowledged"), 0, "{second}");
    assert_eq!(field(&second, "earlier_pending"), 15, "{second}");
    assert_eq!(field(&second, "earlier_acknowledged"), 15, "{second}");
    assert_eq!(field(&second, "earlier_unacknowledged"), 0, "{second}");
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

    // What was kept arrives: the newest ticks of the first run, and the
    // second run's one. The spool is full when the second run starts, so
    // its tick may come before the collector has acknowledged the earlier
    // batches and push the oldest out unacknowledged: counted as dropped,
    // though they may already be on their way (then they are stored too).
    // Nothing is lost without a count, and nothing is stored twice.
    let dropped_again = field(&second, "dropped");
    let earlier_acknowledged = field(&second, "earlier_acknowledged");
    assert_eq!(earlier_acknowledged + dropped_again, kept, "{second}");
    let scan = table_scan(&store, "node");
    let count = |what: &str| {
        let v = duckdb_value(tmp.path(), &format!("select {what} from {scan}"));
        v.as_u64().unwrap_or_else(|| panic!("{what}: {v}"))
    };
    let rows = count("count(*)");
    assert_eq!(count("count(distinct ts)"), rows, "a tick stored twice");
    assert!(
        (earlier_acknowledged + 1..=kept + 1).contains(&rows),
        "{rows} rows\n{first}\n{second}"
    );
}

#[test]
fn a_clean_stop_leaves_nothing_pending_and_each_run_counts_its_own() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let spool = tmp.path().join("spool");
    let store = tmp.path().join("store");
    let (collector, addr) = start_collector(&store, &["--flush-interval", "300ms"]);
    let collector_url = format!("http://{addr}");

    let (first, _) = agent_run_logged(&spool, &collector_url, 12, "20s", &[]);
    assert_eq!(field(&first, "batches"), 12, "{first}");
    assert_eq!(field(&first, "acknowledged"), 12, "{first}");
    assert_eq!(field(&first, "unacknowledged"), 0, "{first}");

    // Restarted on the same spool: the first run's batches were all
    // delivered, so nothing is pending and nothing of them is counted again.
    let (second, log) = agent_run_logged(&spool, &collector_url, 5, "20s", &[]);
    assert!(!log.contains("spool holds unacknowledged"), "{log}");
    assert!(
        log.contains("connected") && log.contains(" pending=0"),
        "{log}"
    );
    assert_eq!(
        second,
        "ticks=5 batches=5 acknowledged=5 rejected=0 dropped=0 unacknowledged=0 \
         acknowledged_rows: gpu=40 node=5 ib=20"
    );
    // Its numbers went on from the first run's: the collector stored both.
    assert!(
        collector
            .terminate(Duration::from_secs(30))
            .status
            .success()
    );
    assert_gpu_rows_exactly_once(tmp.path(), &store, 17 * 8);
}
