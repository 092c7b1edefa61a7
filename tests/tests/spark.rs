//! Apache Spark reads the store as the collector wrote it, on S3: two agents
//! on the fake NVML (jobs, a Kubernetes pod, idle and unallocated GPUs, XIDs,
//! throttling, InfiniBand ports), a load generator's three hours of
//! synthetic history, and three scheduler trace imports, all written by a
//! collector to an S3 server (moto, `GPUTEL_S3_SERVER`). One Spark session
//! (`scripts/lib/spark_queries.py` run by `GPUTEL_SPARK`, the S3A jars in
//! `GPUTEL_SPARK_JARS`; scripts/test installs them) reads `s3a://` and runs
//! every query of schemas/spark/; each must give the rows the DuckDB query
//! of the same name (schemas/sql/) gives on a download of the same bucket,
//! floats to the last decimal their query rounds to. A query filtered on
//! date and hour must read that partition's files only, as the scan's
//! metrics report.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gputel_tests::s3::{S3, s3_env, s3_server_bin};
use gputel_tests::{
    Running, SCENARIO_ENV, TRACE_IMPORTS, collector_bin, fixture_agent, provided_path, run_loadgen,
    shipped_query, unused_port, workspace_root,
};
use serde_json::Value;

const BUCKET: &str = "gputel-spark";
const PREFIX: &str = "cluster-a";
const TICKS: u64 = 25;
/// The whole Spark run: JVM start, views over S3, every query.
const SPARK_TIMEOUT: Duration = Duration::from_secs(420);

/// Node A: jobs 4242, 5151 and 7171 through their processes (pids of
/// tests/fixtures/proc), a Kubernetes pod (6161), job 8080 through the
/// job-mapping directory on an idle GPU, an unallocated GPU. Traces step
/// every 100 ms, one agent tick, so values spread over several readings.
const SCENARIO_A: &str = r#"
step_ms = 100

[[gpu]]   # 0: job 4242, an application XID
gpu_util_pct = [98, 90, 95, 60, 98]
sm_active_pct = [85.5, 80.25, 70.0, 40.5]
fb_used_bytes = 64424509440
power_mw = [650000, 600000, 655500, 420250]
temperature_c = [70, 71, 72]
processes = [{ pid = 4242, used_memory_bytes = 64424509440 }]
xid_events = [{ at_ms = 300, xid = 13 }]

[[gpu]]   # 1: job 5151, three XIDs
gpu_util_pct = [90, 0, 45]
sm_active_pct = 60.0
fb_used_bytes = [42949672960, 21474836480]
power_mw = [500000, 150000, 320000]
temperature_c = 65
processes = [{ pid = 5151, used_memory_bytes = 42949672960 }]
xid_events = [{ at_ms = 300, xid = 31 }, { at_ms = 300, xid = 48 }, { at_ms = 500, xid = 48 }]

[[gpu]]   # 2: job 7171, thermal throttling
gpu_util_pct = 75
sm_active_pct = 50.0
fb_used_bytes = 21474836480
power_mw = 400000
temperature_c = 80
clock_event_reasons = [0, 32, 32, 0, 0, 64, 0, 0]
processes = [{ pid = 7171, used_memory_bytes = 21474836480 }]

[[gpu]]   # 3: a Kubernetes pod
gpu_util_pct = [90, 10]
sm_active_pct = 70.0
fb_used_bytes = 32212254720
power_mw = 550000
temperature_c = 66
processes = [{ pid = 6161, used_memory_bytes = 32212254720 }]

[[gpu]]   # 4: job 8080 (mapping directory), idle
gpu_util_pct = 0
sm_active_pct = 0.0
fb_used_bytes = 2147483648
power_mw = [90000, 95000]
temperature_c = 40

[[gpu]]   # 5: unallocated, NVML's unknown XID
gpu_util_pct = 0
sm_active_pct = 0.0
fb_used_bytes = 0
power_mw = [70000, 72000, 71000]
temperature_c = 35
xid_events = [{ at_ms = 300, xid = 999 }]
"#;

/// Node B: job 4242's second node, power capping; job 9999 (mapping
/// directory, in no trace) with an XID 79.
const SCENARIO_B: &str = r#"
step_ms = 100

[[gpu]]   # 0: job 4242, power capping
gpu_util_pct = [99, 97]
sm_active_pct = 88.5
fb_used_bytes = 75161927680
power_mw = 680000
temperature_c = 71
clock_event_reasons = [0, 4, 4, 0, 128, 0]
processes = [{ pid = 4242, used_memory_bytes = 75161927680 }]

[[gpu]]   # 1: job 9999, XID 79
gpu_util_pct = 50
sm_active_pct = 30.0
fb_used_bytes = 10737418240
power_mw = 300000
temperature_c = 55
xid_events = [{ at_ms = 300, xid = 79 }]
"#;

/// The load generator's history: 40 ticks 5 minutes apart from 08:00, so
/// the partitions hour=08 to hour=11 of 2026-11-02; the pruned query reads
/// hour 09.
const HISTORY_START: &str = "2026-11-02T08:00:00Z";
const PRUNED_DATE: &str = "2026-11-02";
const PRUNED_HOUR: u32 = 9;

/// Writes the store into the bucket: agents, load generator, imports.
fn write_store(s3: &S3, dir: &Path) {
    let store = format!("s3://{BUCKET}/{PREFIX}");
    let mut cmd = Command::new(collector_bin());
    s3_env(&mut cmd)
        .args(["--plaintext", "--listen", "127.0.0.1:0", "--store", &store])
        .args(["--s3-endpoint", &s3.endpoint(), "--s3-allow-http"])
        .arg("--wal-dir")
        .arg(dir.join("wal"))
        .args(["--flush-interval", "1s"])
        .env("RUST_LOG", "info");
    let mut collector = Running::spawn(cmd);
    let addr = collector.listening_address();

    let agents: Vec<(&str, Running)> = [
        ("gpu-node-001", SCENARIO_A, "4", "8080"),
        ("gpu-node-002", SCENARIO_B, "1", "9999"),
    ]
    .into_iter()
    .map(|(node, scenario, mapped_gpu, mapped_job)| {
        let scenario_file = dir.join(format!("{node}.toml"));
        std::fs::write(&scenario_file, scenario).expect("write scenario");
        let map = dir.join(format!("jobmap-{node}"));
        std::fs::create_dir_all(&map).expect("mkdir");
        std::fs::write(map.join(mapped_gpu), format!("{mapped_job}\n")).expect("write mapping");
        let mut cmd = fixture_agent(node);
        cmd.args(["--collector", &format!("http://{addr}")])
            .args(["--interval", "100ms", "--ticks", &TICKS.to_string()])
            .args(["--process-interval", "1h"])
            .arg("--hpc-job-mapping-dir")
            .arg(&map)
            .env(SCENARIO_ENV, &scenario_file);
        (node, Running::spawn(cmd))
    })
    .collect();
    run_loadgen(
        &addr,
        "120s",
        &[
            "--agents",
            "2",
            "--gpus",
            "4",
            "--ticks",
            "40",
            "--interval-ms",
            "300000",
            "--start-ts",
            HISTORY_START,
        ],
    );
    for (node, agent) in agents {
        let out = agent.wait(Duration::from_secs(60));
        let summary = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && summary.contains(" unacknowledged=0 "),
            "agent {node}: {summary}"
        );
    }
    assert!(
        collector
            .terminate(Duration::from_secs(60))
            .status
            .success(),
        "collector failed"
    );

    for (n, (format, text)) in TRACE_IMPORTS.iter().enumerate() {
        let file = dir.join(format!("trace-{n}.{format}"));
        std::fs::write(&file, text).expect("write trace");
        let mut cmd = Command::new(collector_bin());
        s3_env(&mut cmd)
            .env("AWS_ENDPOINT_URL", s3.endpoint())
            .env("AWS_ALLOW_HTTP", "true")
            .args(["import-jobs", "--format", format])
            .arg(&file)
            .args(["--store", &store]);
        let out = cmd.output().expect("run import-jobs");
        assert!(
            out.status.success(),
            "import-jobs {format}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The queries both dialects have: every schemas/spark/*.sql but views.sql.
fn spark_queries() -> Vec<String> {
    let names = |dir: &str| -> BTreeSet<String> {
        std::fs::read_dir(workspace_root().join(dir))
            .expect("list a query directory")
            .map(|e| {
                e.expect("dir entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|f| f.ends_with(".sql") && f != "views.sql")
            .map(|f| f.trim_end_matches(".sql").to_owned())
            .collect()
    };
    let (spark, duckdb) = (names("schemas/spark"), names("schemas/sql"));
    assert_eq!(
        spark, duckdb,
        "every DuckDB query of schemas/sql/ has its Spark SQL version in schemas/spark/, and no other"
    );
    spark.into_iter().collect()
}

/// Runs one Spark session: every query, then the pruned count, with
/// --explain for the scans' metrics. Returns the JSON it printed.
fn run_spark(python: &Path, s3: &S3, dir: &Path, queries: &[String], pruned_sql: &str) -> Value {
    let (out_path, err_path) = (dir.join("spark.json"), dir.join("spark.log"));
    let mut cmd = Command::new(python);
    s3_env(&mut cmd)
        .current_dir(workspace_root())
        .arg("scripts/lib/spark_queries.py")
        .args(["--json", "--explain"])
        .args(["--store", &format!("s3://{BUCKET}/{PREFIX}")])
        .args(["--s3-endpoint", &s3.endpoint()])
        .args(queries)
        .args(["--sql", pruned_sql])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("create spark.json"))
        .stderr(std::fs::File::create(&err_path).expect("create spark.log"));
    let started = Instant::now();
    let mut child = cmd.spawn().expect("start pyspark");
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if started.elapsed() > SPARK_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "Spark did not finish within {SPARK_TIMEOUT:?}:\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(status.success(), "spark_queries.py failed: {status}\n{log}");
    eprintln!("Spark ran in {:.1} s", started.elapsed().as_secs_f64());
    let text = std::fs::read_to_string(&out_path).expect("read spark.json");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("spark printed {text:?}: {e}\n{log}"))
}

/// A timestamp as both print it ("2026-11-02 08:00:00.1+00",
/// "2026-11-02T08:00:00.100000Z") in one form; other text as it is.
fn timestamp(text: &str) -> Option<String> {
    let t = text
        .trim_end_matches('Z')
        .trim_end_matches("+00:00")
        .trim_end_matches("+00");
    let parsed = chrono::NaiveDateTime::parse_from_str(t, "%Y-%m-%d %H:%M:%S%.f")
        .or_else(|_| chrono::NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%S%.f"))
        .ok()?;
    (t.len() >= 19).then(|| parsed.format("%Y-%m-%d %H:%M:%S%.6f").to_string())
}

/// Decimal places of a number as printed (`12.35` has 2).
fn decimals(n: &serde_json::Number) -> usize {
    let s = n.to_string();
    s.split_once('.').map_or(0, |(_, f)| {
        f.trim_end_matches(|c: char| !c.is_ascii_digit()).len()
    })
}

/// Whether DuckDB's value and Spark's agree: numbers within a part in 10^9,
/// or one unit of the last decimal printed (the engines round a float that
/// lies on a half differently: DuckDB's round(1.005, 2) is 1.0, Spark's
/// 1.01); timestamps as instants; arrays and objects item by item.
fn same(duckdb: &Value, spark: &Value) -> bool {
    match (duckdb, spark) {
        (Value::Number(a), Value::Number(b)) => {
            let (x, y) = (a.as_f64().expect("f64"), b.as_f64().expect("f64"));
            let unit = 10f64.powi(-(decimals(a).max(decimals(b)).clamp(2, 9) as i32));
            x == y
                || (x - y).abs() <= 1e-9 * x.abs().max(y.abs())
                || (x - y).abs() <= unit * 1.000_001
        }
        (Value::String(a), Value::String(b)) => match (timestamp(a), timestamp(b)) {
            (Some(a), Some(b)) => a == b,
            _ => a == b,
        },
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
        }
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| same(v, w)))
        }
        (a, b) => a == b,
    }
}

#[test]
fn spark_reads_the_s3_store_and_answers_as_duckdb() {
    let Some(python) = provided_path(
        "GPUTEL_SPARK",
        "scripts/test installs pyspark and the S3A jars (scripts/lib/tools.sh, ensure_spark) and sets it",
    ) else {
        return;
    };
    let Some(moto) = s3_server_bin() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let s3 = S3::start(&moto, unused_port());
    s3.create_bucket(BUCKET);
    write_store(&s3, dir);
    let local = dir.join("download");
    s3.download(BUCKET, &format!("{PREFIX}/"), &local);

    let queries = spark_queries();
    let pruned_sql = format!(
        "SELECT count(*) AS n FROM gpu WHERE date = DATE'{PRUNED_DATE}' AND hour = {PRUNED_HOUR}"
    );
    let spark = run_spark(&python, &s3, dir, &queries, &pruned_sql);
    let results = &spark["queries"];

    // Every query: DuckDB's rows on the download, Spark's on the bucket.
    let mut differ = Vec::new();
    for q in &queries {
        let got = results[q]["rows"].as_array().expect("rows").clone();
        let want = shipped_query(&local, "SET TimeZone = 'UTC'", &format!("{q}.sql"), "");
        assert!(!want.is_empty(), "{q} has rows on the test store");
        eprintln!(
            "{q}: {} rows, Spark {} s",
            want.len(),
            results[q]["seconds"].as_f64().unwrap_or(f64::NAN)
        );
        if !same(&Value::Array(want.clone()), &Value::Array(got.clone())) {
            differ.push(format!(
                "{q}\nduckdb: {}\n spark: {}",
                serde_json::to_string_pretty(&want).expect("json"),
                serde_json::to_string_pretty(&got).expect("json")
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "Spark and DuckDB differ:\n{}",
        differ.join("\n")
    );

    // Partition pruning: the filtered count reads the files of its one
    // partition, and gives DuckDB's count.
    let gpu_dir = local.join("gpu");
    let parquet_in = |dir: &Path| -> usize {
        walk(dir)
            .iter()
            .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
            .count()
    };
    let partition = gpu_dir.join(format!("date={PRUNED_DATE}/hour={PRUNED_HOUR:02}"));
    let (in_partition, in_table) = (parquet_in(&partition), parquet_in(&gpu_dir));
    assert!(
        in_partition > 0 && in_partition < in_table,
        "{in_partition} of {in_table} gpu files"
    );
    let sql = &results["sql"];
    let scans = sql["scans"].as_array().expect("scans");
    assert_eq!(scans.len(), 1, "one scan: {scans:?}");
    let scan = &scans[0];
    assert_eq!(scan["table"], "gpu", "{scan}");
    assert_eq!(
        scan["files_read"].as_u64(),
        Some(in_partition as u64),
        "{scan}"
    );
    assert_eq!(
        scan["files_total"].as_u64(),
        Some(in_table as u64),
        "{scan}"
    );
    assert_eq!(scan["partitions_read"].as_u64(), Some(1), "{scan}");
    let filters = scan["partition_filters"].as_str().expect("filters");
    assert!(
        filters.contains(&format!("= {PRUNED_DATE}"))
            && filters.contains(&format!("= {PRUNED_HOUR})")),
        "PartitionFilters: {filters}"
    );
    let want = gputel_tests::duckdb_value(
        &local,
        &format!(
            "SELECT count(*) FROM read_parquet('gpu/**/*.parquet', hive_partitioning = true, \
             hive_types = {{'date': DATE, 'hour': INTEGER}}) \
             WHERE date = DATE '{PRUNED_DATE}' AND hour = {PRUNED_HOUR}"
        ),
    );
    assert_eq!(
        sql["rows"][0]["n"].as_u64(),
        want.as_u64(),
        "the pruned count"
    );
    eprintln!(
        "pruned: read {in_partition} of {in_table} gpu files; Spark {} s up, views {} s",
        spark["session_s"], spark["views_s"]
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("list dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// The columns schemas/spark/views.sql declares for each stored table are
/// the table's columns (schemas/golden/*.schema), then the columns of older
/// versions the views read, then the partition columns: a column added to a
/// table must be added there too, or Spark would not read it.
#[test]
fn spark_views_declare_every_stored_column() {
    let views = std::fs::read_to_string(workspace_root().join("schemas/spark/views.sql"))
        .expect("read schemas/spark/views.sql");
    let declared: BTreeMap<String, Vec<String>> = views
        .split("CREATE OR REPLACE TEMPORARY VIEW ")
        .skip(1)
        .filter_map(|stmt| {
            let (name, rest) = stmt.split_once(" (")?;
            let (columns, tail) = rest.split_once(") USING")?;
            tail.trim_start().starts_with("parquet").then(|| {
                let names = top_level_items(columns)
                    .iter()
                    .map(|c| {
                        c.split_whitespace()
                            .next()
                            .unwrap_or("")
                            .trim_matches('`')
                            .to_owned()
                    })
                    .filter(|c| !c.is_empty())
                    .collect();
                (name.trim().to_owned(), names)
            })
        })
        .collect();
    let legacy: BTreeMap<&str, &[&str]> = BTreeMap::from([
        (
            "node",
            &[
                "cpu_user_pct",
                "cpu_system_pct",
                "cpu_iowait_pct",
                "cpu_idle_pct",
                "memory_total_bytes",
                "memory_used_bytes",
                "memory_available_bytes",
            ][..],
        ),
        (
            "ib",
            &[
                "xmit_bytes_per_s",
                "rcv_bytes_per_s",
                "xmit_packets_per_s",
                "rcv_packets_per_s",
            ][..],
        ),
    ]);
    for table in [
        "gpu",
        "node",
        "ib",
        "event",
        "alert",
        "gpu_process",
        "job",
        "scheduler_job",
    ] {
        let golden = std::fs::read_to_string(
            workspace_root().join(format!("schemas/golden/{table}.schema")),
        )
        .expect("read a golden schema");
        let mut want: Vec<String> = golden
            .lines()
            .filter_map(|l| l.split_once(':').map(|(n, _)| n.trim().to_owned()))
            .collect();
        want.extend(
            legacy
                .get(table)
                .into_iter()
                .flat_map(|c| c.iter().map(|s| (*s).to_owned())),
        );
        if table == "scheduler_job" {
            want.push("month".into());
        } else {
            want.extend(["date".into(), "hour".into()]);
        }
        let view = [table.to_owned(), format!("{table}_stored")]
            .into_iter()
            .find(|v| declared.contains_key(v))
            .unwrap_or_else(|| panic!("schemas/spark/views.sql declares no view of {table}"));
        assert_eq!(
            declared[&view], want,
            "the columns of {view} in schemas/spark/views.sql"
        );
    }
}

/// A column list's items: split at the commas outside `<…>` (MAP<K, V>).
fn top_level_items(list: &str) -> Vec<String> {
    let (mut items, mut item, mut depth) = (Vec::new(), String::new(), 0usize);
    for c in list.chars() {
        match c {
            '<' => depth += 1,
            '>' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut item));
                continue;
            }
            _ => {}
        }
        item.push(c);
    }
    items.push(item);
    items
}
