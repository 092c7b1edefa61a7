//! The collector on a real S3-compatible server (moto's server mode, which
//! scripts/test installs and names in `GPUTEL_S3_SERVER`) on loopback: files
//! land under the bucket's prefix, two collectors share a bucket without a
//! name colliding, `import-jobs` writes there too, a store that is down
//! at first loses nothing, and one collector at a time compacts the bucket
//! (its compaction lease, by conditional writes).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use gputel_tests::s3::{S3, s3_env, s3_server_bin};
use gputel_tests::{
    Running, collector_bin, duckdb_value, run_loadgen, unused_port, workspace_root,
};
use serde_json::json;

const BUCKET: &str = "gputel-test";
const PREFIX: &str = "cluster-a/telemetry";

/// A collector writing to `s3://BUCKET/<prefix>` on `s3`, its log in `wal`.
fn s3_collector(endpoint: &str, prefix: &str, wal: &Path, extra: &[&str]) -> (Running, String) {
    let mut cmd = Command::new(collector_bin());
    s3_env(&mut cmd)
        .args(["--plaintext", "--listen", "127.0.0.1:0"])
        .args(["--store", &format!("s3://{BUCKET}/{prefix}")])
        .args(["--s3-endpoint", endpoint, "--s3-allow-http"])
        .arg("--wal-dir")
        .arg(wal)
        .args(["--flush-interval", "300ms"])
        .args(extra)
        .env("RUST_LOG", "info");
    let mut collector = Running::spawn(cmd);
    let addr = collector.listening_address();
    (collector, addr)
}

fn loadgen(addr: &str, prefix: &str, agents: u32, ticks: u64) {
    let (agents, ticks) = (agents.to_string(), ticks.to_string());
    run_loadgen(
        addr,
        "120s",
        &[
            "--agents",
            &agents,
            "--gpus",
            "8",
            "--ticks",
            &ticks,
            "--node-prefix",
            prefix,
        ],
    );
}

fn gpu_rows(dir: &Path, local: &Path, node_prefix: &str) -> (u64, u64) {
    let scan = format!(
        "read_parquet('{}/gpu/**/*.parquet', hive_partitioning = true)",
        local.display()
    );
    let n = duckdb_value(
        dir,
        &format!("select count(*) from {scan} where starts_with(node, '{node_prefix}')"),
    );
    let k = duckdb_value(
        dir,
        &format!(
            "select count(distinct (node, gpu, ts)) from {scan} where starts_with(node, '{node_prefix}')"
        ),
    );
    (n.as_u64().expect("count"), k.as_u64().expect("count"))
}

#[test]
fn two_collectors_share_a_bucket_and_import_jobs_writes_there() {
    let Some(bin) = s3_server_bin() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3::start(&bin, unused_port());
    s3.create_bucket(BUCKET);

    let (a, addr_a) = s3_collector(&s3.endpoint(), PREFIX, &tmp.path().join("a.wal"), &[]);
    let (b, addr_b) = s3_collector(&s3.endpoint(), PREFIX, &tmp.path().join("b.wal"), &[]);
    loadgen(&addr_a, "a-", 2, 40);
    loadgen(&addr_b, "b-", 3, 40);
    for collector in [a, b] {
        let out = collector.terminate(Duration::from_secs(60));
        assert!(out.status.success(), "collector exit: {:?}", out.status);
    }

    // Acme trace import through the same store code, S3 settings from the
    // environment only.
    let mut import = Command::new(collector_bin());
    s3_env(&mut import)
        .env("AWS_ENDPOINT_URL", s3.endpoint())
        .env("AWS_ALLOW_HTTP", "true")
        .args(["import-jobs", "--format", "acme"])
        .arg(workspace_root().join("collector/tests/data/acme.csv"))
        .args(["--store", &format!("s3://{BUCKET}/{PREFIX}")]);
    let out = import.output().expect("run import-jobs");
    assert!(
        out.status.success(),
        "import-jobs: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let local = tmp.path().join("downloaded");
    let keys = s3.download(BUCKET, PREFIX, &local);
    // Nothing outside the prefix, nothing but Parquet files inside it, but
    // under _gputel/: the compaction lease one of the two took, given up at
    // its stop, and each collector's list of the nodes it streams, emptied
    // at its stop.
    assert_eq!(s3.keys(BUCKET, "").len(), keys.len());
    let (ours, keys): (Vec<String>, Vec<String>) = keys
        .into_iter()
        .partition(|k| k.starts_with(&format!("{PREFIX}/_gputel/")));
    let read = |rel: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(local.join(rel)).unwrap()).expect("JSON")
    };
    assert_eq!(ours.len(), 3, "{ours:?}");
    let lease = read("_gputel/compaction.lease");
    assert_eq!(lease["expires_us"], json!(0), "{lease}");
    for key in ours.iter().filter(|k| k.contains("/_gputel/sessions/")) {
        let list = read(key.strip_prefix(&format!("{PREFIX}/")).unwrap());
        assert_eq!(list["nodes"], json!([]), "{list}");
    }
    assert!(keys.iter().all(|k| k.ends_with(".parquet")), "{keys:?}");
    // Each collector's files carry its own id: the two sets do not meet.
    let gpu_stems: Vec<&str> = keys
        .iter()
        .filter(|k| k.contains("/gpu/"))
        .map(|k| k.rsplit('/').next().unwrap().split('-').next().unwrap())
        .collect();
    let ids: std::collections::BTreeSet<&str> = gpu_stems.iter().copied().collect();
    assert_eq!(ids.len(), 2, "two collector ids in {gpu_stems:?}");
    assert!(
        keys.iter()
            .any(|k| k.starts_with(&format!("{PREFIX}/scheduler_job/month="))),
        "{keys:?}"
    );

    assert_eq!(gpu_rows(tmp.path(), &local, "a-"), (2 * 8 * 40, 2 * 8 * 40));
    assert_eq!(gpu_rows(tmp.path(), &local, "b-"), (3 * 8 * 40, 3 * 8 * 40));
    let jobs = duckdb_value(
        tmp.path(),
        &format!(
            "select count(*) > 0 from read_parquet('{}/scheduler_job/**/*.parquet')",
            local.display()
        ),
    );
    assert_eq!(jobs, json!(true));

    // A job's report read from the bucket is the report of the downloaded copy.
    let job = duckdb_value(
        tmp.path(),
        &format!(
            "select min(job_id) from read_parquet('{}/job/**/*.parquet')",
            local.display()
        ),
    );
    let job = job.as_str().expect("a job in the job table");
    // Runs the collector's `args` on `store` (with the S3 settings when it
    // is the bucket) and returns its stdout, after it exited 0.
    let collector_stdout = |args: &[&str], store: &str, s3_settings: bool| -> Vec<u8> {
        let mut cmd = Command::new(collector_bin());
        if s3_settings {
            s3_env(&mut cmd)
                .env("AWS_ENDPOINT_URL", s3.endpoint())
                .env("AWS_ALLOW_HTTP", "true");
        }
        let out = cmd
            .args(args)
            .args(["--store", store])
            .output()
            .expect("run gputel-collector");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let report = |store: &str, s3_settings: bool| -> serde_json::Value {
        let stdout = collector_stdout(&["job", job, "--json"], store, s3_settings);
        let mut report: serde_json::Value = serde_json::from_slice(&stdout).expect("JSON");
        report["read"] = serde_json::Value::Null;
        report
    };
    let from_s3 = report(&format!("s3://{BUCKET}/{PREFIX}"), true);
    let from_dir = report(&local.display().to_string(), false);
    assert_eq!(from_s3, from_dir);
    assert_eq!(from_s3["job_id"], job);
    assert_eq!(from_s3["gpus"], 8);

    // So is the fleet report: the hours' files of two collectors, merged
    // node by node, from the bucket as from the copy.
    let page = tmp.path().join("fleet.html");
    let page = page.to_str().expect("a UTF-8 path");
    let fleet = |store: &str, s3_settings: bool| -> serde_json::Value {
        let stdout = collector_stdout(&["report", "--json", "--out", page], store, s3_settings);
        let json = stdout.split(|b| *b == b'\n').next().expect("a JSON line");
        let mut fleet: serde_json::Value = serde_json::from_slice(json).expect("JSON");
        fleet["store"] = serde_json::Value::Null;
        fleet["read"] = serde_json::Value::Null;
        fleet
    };
    let from_s3 = fleet(&format!("s3://{BUCKET}/{PREFIX}"), true);
    let from_dir = fleet(&local.display().to_string(), false);
    assert_eq!(from_s3, from_dir);
    // Five agents of 8 GPUs, 40 ticks each.
    assert_eq!(from_s3["gpus"], 40);
    assert_eq!(from_s3["gpu_rows"], 5 * 8 * 40);
}

#[test]
fn a_store_down_at_first_loses_nothing_and_doubles_nothing() {
    let Some(bin) = s3_server_bin() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let port = unused_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let wal = tmp.path().join("c.wal");
    // Few unwritten rows allowed: acknowledgements stop soon and the load
    // generator's agents keep their batches and retry.
    let (collector, addr) = s3_collector(&endpoint, PREFIX, &wal, &["--max-unwritten-rows", "500"]);
    let mut collector = collector;
    let agents = std::thread::spawn(move || loadgen(&addr, "late-", 2, 60));
    collector.wait_for_log("flush failed", Duration::from_secs(60));
    assert!(
        !agents.is_finished(),
        "the agents finished although nothing could be stored"
    );

    let s3 = S3::start(&bin, port);
    s3.create_bucket(BUCKET);
    agents.join().expect("load generator thread");
    let out = collector.terminate(Duration::from_secs(60));
    assert!(out.status.success(), "collector exit: {:?}", out.status);

    let local = tmp.path().join("downloaded");
    s3.download(BUCKET, PREFIX, &local);
    assert_eq!(
        gpu_rows(tmp.path(), &local, "late-"),
        (2 * 8 * 60, 2 * 8 * 60)
    );
}

/// The start of the hour that began two hours ago, in RFC 3339: an hour
/// closed long enough for the background compaction.
fn closed_hour() -> String {
    let now = chrono::Utc::now();
    let hour = now - chrono::Duration::hours(2);
    format!("{}:00:00Z", hour.format("%Y-%m-%dT%H"))
}

/// `gputel-collector compact` on the bucket, for hours closed ten minutes
/// ago or more; its stdout, after it exited 0. The test's rows of the
/// current hour begin 30 s before they are sent, so near the top of the
/// hour some fall in the hour just closed, which the background
/// compaction leaves alone for another five minutes: with `--min-age 0s`
/// the command would find them and compact them.
fn compact_bucket(s3: &S3) -> String {
    let mut cmd = Command::new(collector_bin());
    s3_env(&mut cmd)
        .env("AWS_ENDPOINT_URL", s3.endpoint())
        .env("AWS_ALLOW_HTTP", "true")
        .args(["compact", "--min-age", "10m"])
        .args(["--store", &format!("s3://{BUCKET}/{PREFIX}")]);
    let out = cmd.output().expect("run gputel-collector compact");
    assert!(
        out.status.success(),
        "compact: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn one_collector_at_a_time_compacts_a_shared_bucket() {
    let Some(bin) = s3_server_bin() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let s3 = S3::start(&bin, unused_port());
    s3.create_bucket(BUCKET);
    let every_second = ["--compact-interval", "1s"];

    let (mut a, addr_a) = s3_collector(
        &s3.endpoint(),
        PREFIX,
        &tmp.path().join("a.wal"),
        &every_second,
    );
    let took = a.wait_for_log("took the compaction lease", Duration::from_secs(30));
    assert!(took.contains("holder=\"collector "), "{took}");
    let (mut b, addr_b) = s3_collector(
        &s3.endpoint(),
        PREFIX,
        &tmp.path().join("b.wal"),
        &every_second,
    );
    let start = closed_hour();
    // Through each collector: rows of the current hour and of a closed one.
    for (addr, prefix, start) in [
        (&addr_a, "a-now-", None),
        (&addr_a, "a-", Some(&start)),
        (&addr_b, "b-now-", None),
        (&addr_b, "b-", Some(&start)),
    ] {
        let mut args = vec![
            "--agents",
            "2",
            "--gpus",
            "8",
            "--ticks",
            "30",
            "--interval-ms",
            "1000",
            "--node-prefix",
            prefix,
        ];
        if let Some(start) = start {
            args.extend(["--start-ts", start.as_str()]);
        }
        run_loadgen(addr, "120s", &args);
    }
    // Both collectors' files of the closed hour are merged by a, the holder,
    // into one file per table.
    let gpu_hour = format!(
        "{PREFIX}/gpu/date={}/hour={}/",
        &start[..10],
        &start[11..13]
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let keys = s3.keys(BUCKET, &gpu_hour);
        let parquet: Vec<&String> = keys.iter().filter(|k| k.ends_with(".parquet")).collect();
        if parquet.len() == 1 && parquet[0].contains("/c-") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not compacted: {keys:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let compacted = a.wait_for_log("compacted", Duration::from_secs(30));
    assert!(compacted.contains("duplicates=0"), "{compacted}");

    // The command finds the lease held and does nothing.
    let holder = took
        .split("holder=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the holder in the log line")
        .to_owned();
    let skipped = compact_bucket(&s3);
    assert!(
        skipped.starts_with(&format!(
            "nothing done in s3://{BUCKET}/{PREFIX}: the compaction lease of this store is held by {holder} until "
        )),
        "{skipped}"
    );

    // a stops and gives the lease up; b takes it at its next round.
    let (out, a_log) = a.terminate_with_log(Duration::from_secs(60));
    assert!(out.status.success());
    let b_took = b.wait_for_log("took the compaction lease", Duration::from_secs(30));
    assert!(!b_took.contains(&holder), "{b_took}");
    let (out, b_log) = b.terminate_with_log(Duration::from_secs(60));
    assert!(out.status.success());
    // b never compacted while a held the lease.
    let b_compactions = b_log.iter().filter(|l| l.contains(" compacted ")).count();
    assert_eq!(b_compactions, 0, "{b_log:?}");
    assert_eq!(
        a_log
            .iter()
            .filter(|l| l.contains("took the compaction lease"))
            .count(),
        1
    );

    // With both stopped the lease is free: the command runs (nothing left to do).
    let ran = compact_bucket(&s3);
    assert!(
        ran.starts_with("compacted 0 hours "),
        "{ran}\na: {a_log:#?}\nb: {b_log:#?}"
    );

    let local = tmp.path().join("downloaded");
    s3.download(BUCKET, PREFIX, &local);
    let scan = format!(
        "read_parquet('{}/gpu/**/*.parquet', hive_partitioning = true)",
        local.display()
    );
    // The closed hour's rows of both, once each; the current hour's too.
    let rows = duckdb_value(
        tmp.path(),
        &format!("select count(*) || ' ' || count(distinct (node, gpu, ts)) from {scan}"),
    );
    assert_eq!(
        rows,
        json!(format!("{} {}", 4 * 2 * 8 * 30, 4 * 2 * 8 * 30))
    );
}
