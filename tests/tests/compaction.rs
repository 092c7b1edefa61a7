//! `gputel-collector compact` on a local store: the many small files of a
//! closed hour become one, DuckDB finds the same rows and keys before and
//! after, queries running during the compaction never see a row twice or
//! miss one, late rows flushed into a compacted hour are kept once, and rows
//! stored twice (two collectors after a failover) are kept once per key.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gputel_tests::{collector_bin, duckdb, duckdb_bin, duckdb_value, run_loadgen, start_collector};
use serde_json::json;

const AGENTS: u64 = 4;
const GPUS: u64 = 8;
const TICKS: u64 = 900;

fn loadgen(addr: &str, prefix: &str, start: &str) {
    let (agents, gpus, ticks) = (AGENTS.to_string(), GPUS.to_string(), TICKS.to_string());
    run_loadgen(
        addr,
        "120s",
        &[
            "--agents",
            &agents,
            "--gpus",
            &gpus,
            "--ticks",
            &ticks,
            "--interval-ms",
            "1000",
            "--start-ts",
            start,
            "--node-prefix",
            prefix,
        ],
    );
}

/// Rows, distinct keys and a checksum of the keys of the `gpu` table.
fn summary_sql(store: &Path) -> String {
    format!(
        "select count(*) as n, count(distinct (node, gpu, ts)) as k, \
         sum(hash(node, gpu, ts)::hugeint)::varchar as h \
         from read_parquet('{}/gpu/**/*.parquet')",
        store.display()
    )
}

fn parquet_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read the hour directory")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".parquet"))
        .collect();
    names.sort();
    names
}

fn compact(store: &Path) -> String {
    let out = Command::new(collector_bin())
        .args(["compact", "--min-age", "0s", "--store"])
        .arg(store)
        .output()
        .expect("run gputel-collector compact");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "compact failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// One reader's query: when it ran and what it returned (or its error).
struct Query {
    started: Instant,
    ended: Instant,
    result: Result<String, String>,
}

#[test]
fn compaction_keeps_every_row_once_even_for_concurrent_readers() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    // An hour that closed at least an hour ago, in UTC.
    let start = duckdb_value(
        tmp.path(),
        "select strftime(date_trunc('hour', now() at time zone 'UTC') - interval 2 hour, \
         '%Y-%m-%dT%H:00:00Z')",
    );
    let start = start.as_str().expect("a time").to_owned();
    let hour_dir = store.join(format!("gpu/date={}/hour={}", &start[..10], &start[11..13]));

    let (collector, addr) = start_collector(
        &store,
        &[
            "--flush-interval",
            "100ms",
            "--flush-rows",
            "1000",
            "--max-unwritten-rows",
            "2000",
            "--compact-interval",
            "0",
        ],
    );
    loadgen(&addr, "n-", &start);
    assert!(
        collector
            .terminate(Duration::from_secs(60))
            .status
            .success()
    );

    let before_files = parquet_files(&hour_dir);
    assert!(before_files.len() >= 10, "{before_files:?}");
    let sql = summary_sql(&store);
    let before = duckdb(tmp.path(), &sql);
    let rows = AGENTS * GPUS * TICKS;
    assert_eq!(before[0]["n"], json!(rows));
    assert_eq!(before[0]["k"], json!(rows));
    let expected = serde_json::to_string(&before).unwrap();

    // Readers query in a loop while the compaction runs.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let stop = Arc::clone(&stop);
            let done = Arc::clone(&done);
            let sql = sql.clone();
            let dir = tmp.path().to_owned();
            std::thread::spawn(move || {
                let mut queries = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let started = Instant::now();
                    let out = Command::new(duckdb_bin())
                        .current_dir(&dir)
                        .args(["-json", "-c", &sql])
                        .output()
                        .expect("run duckdb");
                    let result = if out.status.success() {
                        let rows: serde_json::Value =
                            serde_json::from_slice(&out.stdout).expect("duckdb's json");
                        Ok(serde_json::to_string(&rows).expect("json"))
                    } else {
                        Err(String::from_utf8_lossy(&out.stderr).into_owned())
                    };
                    queries.push(Query {
                        started,
                        ended: Instant::now(),
                        result,
                    });
                    done.fetch_add(1, Ordering::SeqCst);
                }
                queries
            })
        })
        .collect();
    // The readers are warm (each query cached nothing) before it starts.
    while done.load(Ordering::SeqCst) < 2 {
        std::thread::yield_now();
    }
    let compact_started = Instant::now();
    let report = compact(&store);
    let compact_ended = Instant::now();
    stop.store(true, Ordering::SeqCst);
    let queries: Vec<Query> = readers
        .into_iter()
        .flat_map(|r| r.join().expect("reader thread"))
        .collect();

    let overlapping = queries
        .iter()
        .filter(|q| q.started < compact_ended && q.ended > compact_started)
        .count();
    let mut failed = 0;
    for q in &queries {
        match &q.result {
            Ok(got) => assert_eq!(got, &expected, "a query saw other rows during compaction"),
            // The one reader-side failure: a query that listed a merged
            // file before the exchange and opens it after finds it gone.
            Err(e) => {
                assert!(
                    e.contains("No such file") || e.contains("No files found"),
                    "unexpected reader error: {e}"
                );
                failed += 1;
            }
        }
    }
    eprintln!(
        "{} queries, {overlapping} overlapping the compaction, {failed} failed with a vanished file; {report}",
        queries.len()
    );
    assert!(overlapping >= 1, "no query overlapped the compaction");
    assert!(
        queries.len() - failed >= 1,
        "no query succeeded: {failed} failed"
    );

    // One sorted file with the same rows and keys; its row group holds them all.
    let after_files = parquet_files(&hour_dir);
    assert_eq!(after_files.len(), 1, "{after_files:?}");
    assert!(after_files[0].starts_with("c-"), "{after_files:?}");
    assert_eq!(
        serde_json::to_string(&duckdb(tmp.path(), &sql)).unwrap(),
        expected
    );
    let groups = duckdb(
        tmp.path(),
        &format!(
            "select row_group_id, any_value(row_group_num_rows) as n from parquet_metadata('{}') group by all",
            hour_dir.join(&after_files[0]).display()
        ),
    );
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0]["n"], json!(rows));
    assert!(
        !store.join(".compacting").exists()
            || std::fs::read_dir(store.join(".compacting"))
                .unwrap()
                .next()
                .is_none(),
        "staging directories left behind"
    );

    // Late rows for the compacted hour, from a restarted collector (same
    // log, same collector id): stored beside the compacted file, once.
    let (collector, addr) = start_collector(
        &store,
        &["--flush-interval", "100ms", "--compact-interval", "0"],
    );
    loadgen(&addr, "late-", &start);
    assert!(
        collector
            .terminate(Duration::from_secs(60))
            .status
            .success()
    );
    let total = duckdb(tmp.path(), &sql);
    assert_eq!(total[0]["n"], json!(2 * rows));
    assert_eq!(total[0]["k"], json!(2 * rows));
    compact(&store);
    assert_eq!(parquet_files(&hour_dir).len(), 1);
    assert_eq!(
        serde_json::to_string(&duckdb(tmp.path(), &sql)).unwrap(),
        serde_json::to_string(&total).unwrap()
    );
}

/// Rows, keys and keys held by more than one row of a table.
fn key_counts(dir: &Path, store: &Path, table: &str, key: &str) -> serde_json::Value {
    let scan = format!("read_parquet('{}/{table}/**/*.parquet')", store.display());
    let counts = duckdb(
        dir,
        &format!(
            "select (select count(*) from {scan}) as rows, count(*) as keys, \
             count(*) filter (where n > 1) as repeated \
             from (select count(*) as n from {scan} group by {key})"
        ),
    );
    serde_json::Value::Object(counts[0].clone())
}

/// Two collectors stored an overlapping stretch of one node's rows (an
/// agent failed over from one to the other and resent what the first had
/// not acknowledged): 30 of 120 `gpu` rows and 5 of 20 `node` rows are
/// there twice. Compaction keeps one row per key, the row of the file whose
/// name sorts last where two differ, keeps both MIG devices' rows beside
/// their GPU's, and counts what it dropped in its summary.
#[test]
fn compaction_keeps_one_row_per_key() {
    use gputel_collector::buffer::WriteBuffer;
    use gputel_collector::persist::write_file;
    use gputel_collector::store::open_store;
    use gputel_collector::validate::validate_batch;
    use gputel_proto::{Batch, GpuSample, NodeSample};
    use gputel_schemas::PartitionPath;

    // 2026-01-01T06:00:00Z: a closed hour.
    const T0: i64 = 1_767_247_200_000_000;
    const S: i64 = 1_000_000;
    let tmp = tempfile::tempdir().unwrap();
    let store_dir = tmp.path().join("store");
    std::fs::create_dir_all(&store_dir).unwrap();
    let store = open_store(store_dir.to_str().unwrap(), &Default::default()).unwrap();

    // Ticks `ticks` of node n1: GPUs 0 to 3, two MIG devices on GPU 0.
    // `hot` raises GPU 3's temperature: the same key with other values.
    let rows = |ticks: std::ops::Range<i64>, hot: bool| {
        let mut batch = Batch {
            seq: 1,
            ..Default::default()
        };
        for t in ticks {
            let ts_us = T0 + t * S;
            for gpu in 0..4 {
                batch.gpu.push(GpuSample {
                    ts_us,
                    gpu,
                    uuid: format!("GPU-{gpu}"),
                    model: "NVIDIA A100-SXM4-80GB".into(),
                    temperature_c: Some(if hot && gpu == 3 { 90 } else { 40 + gpu }),
                    mig_mode: Some(gpu == 0),
                    ..Default::default()
                });
            }
            for instance in [1, 2] {
                batch.gpu.push(GpuSample {
                    ts_us,
                    gpu: 0,
                    uuid: "GPU-0".into(),
                    model: "NVIDIA A100-SXM4-80GB MIG 3g.40gb".into(),
                    gpu_instance_id: Some(instance),
                    compute_instance_id: Some(0),
                    mig_uuid: Some(format!("MIG-{instance}")),
                    ..Default::default()
                });
            }
            batch.node.push(NodeSample {
                ts_us,
                cpu_count: 64,
                cpu_user_jiffies: Some(25_000),
                ..Default::default()
            });
        }
        let mut buffer = WriteBuffer::default();
        buffer.append("n1", validate_batch(&batch, T0).expect("a valid batch"));
        buffer.take_batches().expect("rows fit their schemas")
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The first collector's ticks 0 to 9, the second's 5 to 14.
    for (stem, ticks, hot) in [
        ("a1-0000000000000001", 0..10, false),
        ("b2-0000000000000001", 5..15, true),
    ] {
        for (table, key, batch) in rows(ticks, hot) {
            let path = PartitionPath::new(table, key, stem).expect("a valid stem");
            runtime
                .block_on(write_file(&store, &path, batch))
                .expect("write a file");
        }
    }

    let gpu_key = "node, gpu, gpu_instance_id, compute_instance_id, ts";
    let counts = |table: &str, key: &str| key_counts(tmp.path(), &store_dir, table, key);
    assert_eq!(
        counts("gpu", gpu_key),
        json!({"rows": 120, "keys": 90, "repeated": 30})
    );
    assert_eq!(
        counts("node", "node, ts"),
        json!({"rows": 20, "keys": 15, "repeated": 5})
    );

    let summary = compact(&store_dir);
    assert!(
        summary.starts_with("compacted 2 hours (4 files, 140 rows, "),
        "{summary}"
    );
    assert!(summary.contains(" -> 2 files, 105 rows, "), "{summary}");
    assert!(
        summary.contains("; 35 duplicate rows removed, 5 of them with values differing from the row kept; 0 hours left as they are"),
        "{summary}"
    );

    assert_eq!(
        counts("gpu", gpu_key),
        json!({"rows": 90, "keys": 90, "repeated": 0})
    );
    assert_eq!(
        counts("node", "node, ts"),
        json!({"rows": 15, "keys": 15, "repeated": 0})
    );
    // Both MIG devices at every tick, beside GPU 0's own row; GPU 3's
    // temperature at the ticks both files held is the second file's.
    let scan = format!("read_parquet('{}/gpu/**/*.parquet')", store_dir.display());
    assert_eq!(
        duckdb(
            tmp.path(),
            &format!(
                "select gpu_instance_id as gi, count(*) as n from {scan} \
                 where gpu = 0 group by gi order by gi nulls first"
            )
        ),
        [
            json!({"gi": null, "n": 15}),
            json!({"gi": 1, "n": 15}),
            json!({"gi": 2, "n": 15}),
        ]
        .map(|v| v.as_object().unwrap().clone())
    );
    assert_eq!(
        duckdb(
            tmp.path(),
            &format!(
                "select temperature_c as c, count(*) as n from {scan} \
                 where gpu = 3 group by c order by c"
            )
        ),
        [json!({"c": 43, "n": 5}), json!({"c": 90, "n": 10})]
            .map(|v| v.as_object().unwrap().clone())
    );
}
