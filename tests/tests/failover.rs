//! Two collectors on one store and agents that fail over between them: one
//! collector is killed (SIGKILL) while the load generator's agents stream to
//! both; its agents move to the other and resend what it had not
//! acknowledged; restarted, as systemd restarts it, it replays its log. No
//! row is lost; rows the killed one made durable but could not acknowledge
//! (a window of one log sync, often empty) are stored twice, and compaction
//! keeps each once. And a node that moved is not silent on the collector
//! it left, which sees it listed by the other in the store.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use gputel_agent::client::{self, Identity};
use gputel_agent::collectors::Collectors;
use gputel_collector::clock::Clock;
use gputel_collector::memory::MemoryPlan;
use gputel_collector::{ServeOptions, Serving};
use gputel_proto::{Batch, NodeSample};
use parquet::file::reader::{FileReader, SerializedFileReader};
use tokio::net::TcpListener;

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

/// A collector library on 127.0.0.1:0 over the store at `store`, its log in
/// `wal`, watching nodes for silence by `clock`.
async fn serve(store: &Path, wal: &Path, clock: Clock) -> (Serving, String) {
    let store =
        gputel_collector::store::open_store(store.to_str().expect("utf-8"), &Default::default())
            .expect("open the store");
    let (wal, replayed) = gputel_collector::wal::Wal::open(wal).expect("open the log");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let options = ServeOptions {
        flush_interval: Duration::from_secs(3600),
        flush_rows: usize::MAX,
        max_message_bytes: gputel_proto::DEFAULT_MAX_MESSAGE_BYTES,
        memory: MemoryPlan::default(),
        max_agent_rows_per_s: u64::MAX / 16,
        tls: None,
        alert_sink: None,
        node_silence: Some(gputel_collector::silence::DEFAULT_SILENCE_AFTER),
    };
    let serving = gputel_collector::serve(listener, store, clock, options, wal, replayed)
        .await
        .expect("serve");
    let url = format!("http://{}", serving.local_addr());
    (serving, url)
}

/// Batch `seq` of node `n1`: one node row at `ts_us`.
fn node_batch(seq: u64, ts_us: i64) -> Batch {
    Batch {
        seq,
        node: vec![NodeSample {
            ts_us,
            cpu_count: 8,
            ..NodeSample::default()
        }],
        ..Batch::default()
    }
}

/// Waits until `file` exists and `holds(its text)`.
async fn wait_for_file(file: &Path, what: &str, holds: impl Fn(&str) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if std::fs::read_to_string(file).is_ok_and(|text| holds(&text)) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}: never {what}",
            file.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_moved_to_another_collector_is_not_silent_on_the_one_it_left() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let now = Arc::new(AtomicI64::new(gputel_agent::clock::now_us()));
    let clock = Clock::Manual(Arc::clone(&now));
    let (a, url_a) = serve(&store, &tmp.path().join("a.wal"), clock.clone()).await;
    let (b, url_b) = serve(&store, &tmp.path().join("b.wal"), clock.clone()).await;
    let identity = Identity {
        node: "n1".into(),
        agent_id: "agent-n1".into(),
        boot_id: String::new(),
    };
    let t0 = now.load(Ordering::SeqCst);

    // n1 streams to a, then leaves it (its stream ends) for b.
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    for seq in 1..=3 {
        tx.send(node_batch(seq, t0 - 10_000_000 + seq as i64 * 1_000_000))
            .await
            .unwrap();
    }
    drop(tx);
    let to_a = Collectors::new(std::slice::from_ref(&url_a), None, "n1").unwrap();
    let delivered = client::run(to_a, identity.clone(), rx, 16, Duration::from_secs(10)).await;
    assert_eq!(delivered.acknowledged, 3);
    wait_for_file(&tmp.path().join("a.wal/nodes.json"), "lists n1", |t| {
        t.contains("\"n1\"")
    })
    .await;

    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let to_b = Collectors::new(std::slice::from_ref(&url_b), None, "n1").unwrap();
    let streaming = tokio::spawn(client::run(to_b, identity, rx, 16, Duration::from_secs(10)));
    tx.send(node_batch(4, t0 - 6_000_000)).await.unwrap();
    // b names n1 in its list in the store (every 10 s).
    let (b_id, _) = b.shared().log_position();
    let list = store.join(format!(
        "{}/{b_id}.json",
        gputel_collector::peers::SESSIONS_PREFIX
    ));
    wait_for_file(&list, "names n1", |t| t.contains("\"n1\"")).await;

    // 35 s later by the collectors' clock, past its 30 s threshold, n1 is
    // quiet on a while b still hears it: a forgets it rather than call it silent.
    now.fetch_add(35_000_000, Ordering::SeqCst);
    tx.send(node_batch(5, t0 + 30_000_000)).await.unwrap();
    wait_for_file(&tmp.path().join("a.wal/nodes.json"), "forgets n1", |t| {
        !t.contains("\"n1\"")
    })
    .await;
    drop(tx);
    let delivered = streaming.await.unwrap();
    assert_eq!(delivered.acknowledged, 2);

    let (a_id, _) = a.shared().log_position();
    for serving in [a, b] {
        serving.shutdown().await.expect("shut down");
    }
    // a wrote no node_silent event (its event files hold no row).
    let a_events = event_rows(&store.join("event"), &a_id);
    assert_eq!(a_events, 0, "node events written by a");
}

/// Rows in the `event` files under `dir` written by collector `id`.
fn event_rows(dir: &Path, id: &str) -> i64 {
    let mut total = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            total += event_rows(&path, id);
        } else if path.extension().is_some_and(|e| e == "parquet")
            && path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(id))
        {
            let file = std::fs::File::open(&path).expect("open a Parquet file");
            let reader = SerializedFileReader::new(file).expect("a Parquet file");
            total += reader.metadata().file_metadata().num_rows();
        }
    }
    total
}
