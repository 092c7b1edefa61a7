//! The characterization queries of `schemas/sql/`, each run as users run it
//! (the DuckDB CLI, `.read schemas/sql/views.sql`, then `.read` the query)
//! against a store the real pipeline wrote: two agents on the fake NVML with
//! constant readings, fixture /proc with processes of Slurm jobs and a
//! Kubernetes pod, job-mapping directories, one InfiniBand port fed a
//! deterministic traffic pattern, a collector, then a scheduler job trace.
//! Every result is compared with exact values derived from the scenario.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use gputel_tests::{
    Running, SCENARIO_ENV, TRACE_IMPORTS, agent_bin, collector_bin, duckdb_value, fake_nvml,
    fixture, fixture_agent, start_collector, table_scan, taking_every_tick, workspace_root,
};
use serde_json::{Map, Value, json};

const TICKS: u64 = 25;
const NODE_A: &str = "gpu-node-001";
const NODE_B: &str = "gpu-node-002";

/// Node A: eight H100s with constant readings. Processes (pids of
/// tests/fixtures/proc): 4242 is Slurm job 4242 (cgroup v2), 5151 job 5151
/// (cgroup v1), 7171 job 7171 (SLURM_JOB_ID in its environment), 6161 a
/// Kubernetes pod. GPU 5 is shared by jobs 4242 and 5151, so it belongs to
/// neither; GPU 6 is job 8080's through the job-mapping directory, with
/// nothing running; GPU 7 is unallocated.
const SCENARIO_A: &str = r#"
# Traces step once a second: the throttling starts 1 s after the agent's
# NVML init, well after its first tick.
step_ms = 1000

[[gpu]]   # 0: job 4242, an application XID
gpu_util_pct = 98
sm_active_pct = 85.5
fb_used_bytes = 64424509440      # 60 GiB
power_mw = 650000
temperature_c = 70
processes = [{ pid = 4242, used_memory_bytes = 64424509440 }]
xid_events = [{ at_ms = 300, xid = 13 }]

[[gpu]]   # 1: job 4242
gpu_util_pct = 94
sm_active_pct = 80.5
fb_used_bytes = 64424509440      # 60 GiB
power_mw = 600000
temperature_c = 68
processes = [{ pid = 4242, used_memory_bytes = 64424509440 }]

[[gpu]]   # 2: job 5151, three XIDs
gpu_util_pct = 90
sm_active_pct = 60.0
fb_used_bytes = 42949672960      # 40 GiB
power_mw = 500000
temperature_c = 65
processes = [{ pid = 5151, used_memory_bytes = 42949672960 }]
xid_events = [{ at_ms = 300, xid = 31 }, { at_ms = 300, xid = 48 }, { at_ms = 500, xid = 48 }]

[[gpu]]   # 3: job 7171, one thermal throttling episode
gpu_util_pct = 75
sm_active_pct = 50.0
fb_used_bytes = 21474836480      # 20 GiB
power_mw = 400000
temperature_c = 80
clock_event_reasons = [0, 32, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
processes = [{ pid = 7171, used_memory_bytes = 21474836480 }]

[[gpu]]   # 4: a Kubernetes pod, no job id
gpu_util_pct = 90
sm_active_pct = 70.0
fb_used_bytes = 32212254720      # 30 GiB
power_mw = 550000
temperature_c = 66
processes = [{ pid = 6161, used_memory_bytes = 32212254720 }]

[[gpu]]   # 5: shared by jobs 4242 and 5151
gpu_util_pct = 60
sm_active_pct = 40.0
fb_used_bytes = 53687091200      # 50 GiB
power_mw = 450000
temperature_c = 62
processes = [{ pid = 4242, used_memory_bytes = 26843545600 }, { pid = 5151, used_memory_bytes = 26843545600 }]

[[gpu]]   # 6: job 8080 (mapping directory), idle
gpu_util_pct = 0
sm_active_pct = 0.0
fb_used_bytes = 2147483648       # 2 GiB
power_mw = 90000
temperature_c = 40

[[gpu]]   # 7: unallocated, NVML's "unknown XID"
gpu_util_pct = 0
sm_active_pct = 0.0
fb_used_bytes = 0
power_mw = 70000
temperature_c = 35
xid_events = [{ at_ms = 300, xid = 999 }]
"#;

/// Node B: job 4242's third GPU, with one power-cap episode, and job 9999's
/// (mapping directory; no scheduler trace lists it).
const SCENARIO_B: &str = r#"
step_ms = 1000

[[gpu]]   # 0: job 4242
gpu_util_pct = 99
sm_active_pct = 88.5
fb_used_bytes = 75161927680      # 70 GiB
power_mw = 680000
temperature_c = 71
clock_event_reasons = [0, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
processes = [{ pid = 4242, used_memory_bytes = 75161927680 }]

[[gpu]]   # 1: job 9999, XID 79 (the fake keeps it answering)
gpu_util_pct = 50
sm_active_pct = 30.0
fb_used_bytes = 10737418240      # 10 GiB
power_mw = 300000
temperature_c = 55
xid_events = [{ at_ms = 300, xid = 79 }]
"#;

/// `class/infiniband/mlx5_0/ports/1/counters/port_rcv_data` of the fixture
/// (4-byte words).
const MLX5_0_RCV_WORDS: u64 = 1_984_460_973_326_841;
/// Node B's mlx5_0 receives 1 GB (250 M words) between each of its first
/// BUSY_TICKS + 1 ticks, then nothing: BUSY_TICKS busy port-ticks.
const BUSY_TICKS: u64 = 12;
const WORDS_PER_BUSY_TICK: u64 = 250_000_000;

/// A store written by the pipeline, and a scratch directory beside it.
struct Store {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    store: PathBuf,
    /// The schemas/sql files queried so far.
    read: RefCell<BTreeSet<String>>,
}

impl Store {
    /// Runs `.read schemas/sql/views.sql` then `.read schemas/sql/<file>`
    /// (both skipped for `views.sql` itself, where `extra` is the query) with
    /// `store` set; returns the last statement's rows.
    fn query(&self, file: &str, extra: &str) -> Vec<Value> {
        self.read.borrow_mut().insert(file.to_owned());
        query_store(&self.store, file, extra)
    }
}

fn query_store(store: &Path, file: &str, extra: &str) -> Vec<Value> {
    gputel_tests::shipped_query(store, "", file, extra)
}

/// Numbers compared by value: DuckDB prints 60.0 for a DOUBLE and 60 for an
/// integer, and `json!` writes what it is given.
fn normalized(value: Value) -> Value {
    match value {
        Value::Number(n) => json!(n.as_f64().expect("a JSON number is an f64")),
        Value::Array(items) => Value::Array(items.into_iter().map(normalized).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, normalized(v))).collect())
        }
        other => other,
    }
}

#[track_caller]
fn assert_rows(what: &str, got: Vec<Value>, want: Value) {
    let got = normalized(Value::Array(got));
    let want = normalized(want);
    assert_eq!(
        got,
        want,
        "{what}\n got: {}\nwant: {}",
        serde_json::to_string_pretty(&got).expect("json"),
        serde_json::to_string_pretty(&want).expect("json")
    );
}

/// Copies a directory tree (plain files and directories only).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("list dir") {
        let entry = entry.expect("dir entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy file");
        }
    }
}

/// Makes `path` read `values[k]` at its k-th opening, however the agent's
/// ticks are timed: each value is served through a FIFO of its own, and the
/// next FIFO takes the path as soon as the agent has opened the current one
/// (before it can read, so before its next tick). After the last value the
/// path is a plain file holding it. Returns a receiver told once the agent
/// has opened the path for every value.
fn serve_counter(path: &Path, values: Vec<u64>) -> mpsc::Receiver<()> {
    let dir = path.parent().expect("counter has a directory").to_owned();
    let fifos: Vec<PathBuf> = (0..values.len())
        .map(|k| dir.join(format!(".fifo-{k}")))
        .collect();
    let status = Command::new("mkfifo")
        .args(&fifos)
        .status()
        .expect("run mkfifo");
    assert!(status.success(), "mkfifo failed");
    std::fs::rename(&fifos[0], path).expect("install the first FIFO");
    let path = path.to_owned();
    let (done, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for (k, value) in values.iter().enumerate() {
            // Blocks until the agent opens the path, which is FIFO k.
            let mut fifo = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .expect("open FIFO");
            if let Some(next) = fifos.get(k + 1) {
                std::fs::rename(next, &path).expect("install the next FIFO");
            } else {
                let last = dir.join(".last");
                std::fs::write(&last, format!("{value}\n")).expect("write last value");
                std::fs::rename(&last, &path).expect("install the last value");
            }
            // Closing the FIFO is the reader's end of file.
            writeln!(fifo, "{value}").expect("write FIFO");
        }
        let _ = done.send(());
    });
    rx
}

/// Runs the pipeline (two agents, one collector) until both agents took
/// their TICKS ticks (the expectations below count every sample as its
/// 0.1 s tick; `gputel_tests::gpu_ticks_on_grid`), then imports the trace.
fn build_store() -> Store {
    let store = taking_every_tick(TICKS, 100, |_| run_pipeline(), |s| s.store.clone());
    import_trace(&store.dir, &store.store);
    store
}

/// One run of the pipeline: two agents and a collector writing a store.
fn run_pipeline() -> Store {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_owned();
    let store = dir.join("store");

    let scenario_a = dir.join("a.toml");
    let scenario_b = dir.join("b.toml");
    std::fs::write(&scenario_a, SCENARIO_A).expect("write scenario");
    std::fs::write(&scenario_b, SCENARIO_B).expect("write scenario");
    let (map_a, map_b) = (dir.join("jobmap-a"), dir.join("jobmap-b"));
    std::fs::create_dir_all(&map_a).expect("mkdir");
    std::fs::create_dir_all(&map_b).expect("mkdir");
    std::fs::write(map_a.join("6"), "8080\n").expect("write job mapping");
    std::fs::write(map_b.join("1"), "9999\n").expect("write job mapping");

    // Node B's InfiniBand: the fixture ports, mlx5_0 receiving BUSY_TICKS GB.
    let sys_b = dir.join("sys-b");
    copy_tree(&fixture("sys"), &sys_b);
    let fed = serve_counter(
        &sys_b.join("class/infiniband/mlx5_0/ports/1/counters/port_rcv_data"),
        (0..TICKS)
            .map(|k| MLX5_0_RCV_WORDS + WORDS_PER_BUSY_TICK * k.min(BUSY_TICKS))
            .collect(),
    );

    // One alert rule, so that the store has an `alert` table: the GPUs at
    // 70 °C or more (A0 at 70, A3 at 80, B0 at 71) fire at their first sample.
    let rules = dir.join("rules.toml");
    std::fs::write(
        &rules,
        "[[rule]]\nname = \"Warm\"\nmetric = \"temperature_c\"\nop = \">=\"\nthreshold = 70\nfor = \"0s\"\nseverity = \"info\"\n",
    )
    .expect("write rules");
    let rules = rules.to_str().expect("a UTF-8 path");
    let (collector, addr) = start_collector(&store, &["--flush-interval", "1s", "--rules", rules]);
    // fixture_agent's command with a sysfs root of our own (the flag cannot
    // be given twice).
    let agent = |node: &str, scenario: &Path, map: &Path, sys: &Path| {
        let mut cmd = Command::new(agent_bin());
        cmd.arg("--nvml-lib")
            .arg(fake_nvml())
            .arg("--procfs-root")
            .arg(fixture("proc"))
            .arg("--sysfs-root")
            .arg(sys)
            .args(["--node", node, "--plaintext"])
            .args(["--collector", &format!("http://{addr}")])
            .args(["--interval", "100ms", "--ticks", &TICKS.to_string()])
            .args(["--process-interval", "1h"])
            .arg("--hpc-job-mapping-dir")
            .arg(map)
            .env(SCENARIO_ENV, scenario);
        cmd
    };
    let a = Running::spawn(agent(NODE_A, &scenario_a, &map_a, &fixture("sys")));
    let b = Running::spawn(agent(NODE_B, &scenario_b, &map_b, &sys_b));
    for (node, agent) in [(NODE_A, a), (NODE_B, b)] {
        let out = agent.wait(Duration::from_secs(60));
        let summary = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "agent {node}: {summary}");
        assert!(
            summary.contains(&format!("ticks={TICKS} ")) && summary.contains(" unacknowledged=0 "),
            "agent {node}: {summary}"
        );
    }
    fed.recv_timeout(Duration::from_secs(10))
        .expect("node B's agent read every value of its mlx5_0 counter");
    assert!(
        collector
            .terminate(Duration::from_secs(30))
            .status
            .success()
    );

    Store {
        _tmp: tmp,
        dir,
        store,
        read: RefCell::default(),
    }
}

/// Imports the trace with `gputel-collector import-jobs`, one dump after the
/// other.
fn import_trace(dir: &Path, store: &Path) {
    for (n, (format, text)) in TRACE_IMPORTS.iter().enumerate() {
        let file = dir.join(format!("trace-{n}.{format}"));
        std::fs::write(&file, text).expect("write trace");
        import_file(store, format, &file);
    }
}

/// `gputel-collector import-jobs --format FORMAT FILE --store STORE`, which
/// must read every line.
fn import_file(store: &Path, format: &str, file: &Path) {
    let out = Command::new(collector_bin())
        .args(["import-jobs", "--format", format])
        .arg(file)
        .arg("--store")
        .arg(store)
        .output()
        .expect("run gputel-collector import-jobs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains(&file.display().to_string()),
        "import-jobs {format} {}: {}\n{}{stderr}",
        file.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}

/// What each file of schemas/sql/ must return on the store.
type Check = fn(&Store);
const CHECKS: &[(&str, Check)] = &[
    ("views.sql", check_views),
    ("per_job_utilization.sql", check_per_job_utilization),
    ("fleet_cdf.sql", check_fleet_cdf),
    ("idle_gpu_power.sql", check_idle_gpu_power),
    ("gpu_time_share.sql", check_gpu_time_share),
    ("jobs_with_gpu_events.sql", check_jobs_with_gpu_events),
    ("ib_idle_share.sql", check_ib_idle_share),
    ("xid_failures.sql", check_xid_failures),
];

#[test]
fn every_sql_file_has_a_checked_expectation() {
    let on_disk: BTreeSet<String> = std::fs::read_dir(workspace_root().join("schemas/sql"))
        .expect("list schemas/sql")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".sql"))
        .collect();
    let checked: BTreeSet<String> = CHECKS
        .iter()
        .map(|(f, _)| (*f).to_owned())
        .chain(MIXED_CHECKS.iter().map(|(f, _)| (*f).to_owned()))
        .collect();
    assert_eq!(
        on_disk, checked,
        "every schemas/sql/*.sql needs an entry in CHECKS or MIXED_CHECKS, and every entry a file"
    );
}

#[test]
fn every_query_answers_exactly_on_pipeline_data() {
    let store = build_store();
    for (file, check) in CHECKS {
        eprintln!("checking {file}");
        check(&store);
        assert!(
            store.read.borrow().contains(*file),
            "the check of {file} never ran it"
        );
    }
}

/// The views.sql views that may have no file yet.
const OPTIONAL_TABLES: [&str; 6] = [
    "alert",
    "event",
    "gpu_process",
    "ib",
    "job",
    "scheduler_job",
];

/// One query giving every optional table's columns and row count.
fn optional_tables_sql() -> String {
    OPTIONAL_TABLES
        .iter()
        .map(|t| {
            format!(
                "SELECT '{t}' AS view, list(column_name || ' ' || column_type) AS columns, \
                 (SELECT count(*) FROM {t}) AS n FROM (DESCRIBE {t})"
            )
        })
        .collect::<Vec<_>>()
        .join(" UNION ALL ")
        + " ORDER BY view"
}

fn check_views(s: &Store) {
    // Every table is a view with its rows, partition columns typed.
    assert_rows(
        "row counts",
        s.query(
            "views.sql",
            "SELECT (FROM gpu SELECT count(*)) AS gpu, (FROM node SELECT count(*)) AS node, \
                    (FROM ib SELECT count(*)) AS ib, (FROM event SELECT count(*)) AS event, \
                    (FROM gpu_process SELECT count(*)) AS gpu_process, \
                    (FROM alert SELECT string_agg(node || ':' || gpu || ':' || status || ':' || value, ' ' ORDER BY node, gpu)) AS alerts, \
                    (FROM job SELECT sum(samples)::BIGINT) AS job_samples, \
                    (FROM scheduler_job SELECT count(*)) AS scheduler_job, \
                    (FROM scheduler_job_latest SELECT count(*)) AS scheduler_job_latest, \
                    (FROM gpu SELECT typeof(any_value(date)) || ' ' || typeof(any_value(hour))) AS gpu_partitions",
        ),
        json!([{
            "gpu": 10 * TICKS, "node": 2 * TICKS, "ib": 8 * TICKS,
            // XIDs 31, 48, 48 (A2), 13 (A0), 999 (A7), 79 (B1); one thermal
            // and one power throttling episode.
            "event": 8,
            // Listed once (--process-interval 1h): one row per process and GPU.
            "gpu_process": 8,
            // The one rule fired for the three GPUs at 70 °C or more.
            "alerts": "gpu-node-001:0:firing:70.0 gpu-node-001:3:firing:80.0 gpu-node-002:0:firing:71.0",
            // GPUs A0-A3, A6, B0, B1 had one job each at every tick.
            "job_samples": 7 * TICKS,
            // Five imports of (source, job); four job ids.
            "scheduler_job": 5, "scheduler_job_latest": 4,
            "gpu_partitions": "DATE INTEGER",
        }]),
    );
    // The job table aggregated: GPUs, nodes and samples per job; first and
    // last seen are the job's first and last GPU rows.
    let observed = s.query(
        "views.sql",
        "SELECT job_id, nodes, gpus, samples, \
                first_seen = (SELECT min(ts) FROM gpu g WHERE g.job_id = o.job_id) AS first_ok, \
                last_seen = (SELECT max(ts) FROM gpu g WHERE g.job_id = o.job_id) AS last_ok \
         FROM jobs_observed o ORDER BY job_id",
    );
    let row = |job: &str, nodes: &[&str], gpus: u64| {
        json!({"job_id": job, "nodes": nodes, "gpus": gpus, "samples": gpus * TICKS,
               "first_ok": true, "last_ok": true})
    };
    assert_rows(
        "jobs_observed",
        observed,
        json!([
            row("4242", &[NODE_A, NODE_B], 3),
            row("5151", &[NODE_A], 1),
            row("7171", &[NODE_A], 1),
            row("8080", &[NODE_A], 1),
            row("9999", &[NODE_B], 1),
        ]),
    );
    // Re-imports: one row per (source, job), the latest import's; across
    // sources (scheduler_job_latest), the later import.
    assert_rows(
        "scheduler_job",
        s.query(
            "views.sql",
            "SELECT source, job_id, state, job_type, month, \
                    (SELECT source FROM scheduler_job_latest l WHERE l.job_id = j.job_id) AS latest \
             FROM scheduler_job j ORDER BY source, job_id",
        ),
        json!([
            {"source": "acme", "job_id": "4242", "state": "COMPLETED", "job_type": "Pretrain", "month": "2026-11", "latest": "acme"},
            {"source": "acme", "job_id": "5151", "state": "FAILED", "job_type": "Eval", "month": "2026-11", "latest": "acme"},
            {"source": "acme", "job_id": "7171", "state": "RUNNING", "job_type": "SFT", "month": "2026-11", "latest": "sacct"},
            {"source": "acme", "job_id": "8080", "state": "CANCELLED", "job_type": "Debug", "month": "2026-11", "latest": "acme"},
            {"source": "sacct", "job_id": "7171", "state": "COMPLETED", "job_type": null, "month": "2026-11", "latest": "sacct"},
        ]),
    );
    assert_rows(
        "sample_interval",
        s.query("views.sql", "FROM sample_interval ORDER BY node"),
        json!([
            {"node": NODE_A, "interval_us": 100_000},
            {"node": NODE_B, "interval_us": 100_000},
        ]),
    );
    // A store whose optional tables have no file yet: each is an empty view
    // with exactly the columns and types the real files give.
    let partial = s.dir.join("partial");
    copy_tree(&s.store.join("gpu"), &partial.join("gpu"));
    copy_tree(&s.store.join("node"), &partial.join("node"));
    let full = s.query("views.sql", &optional_tables_sql());
    let empty = query_store(&partial, "views.sql", &optional_tables_sql());
    assert_eq!(full.len(), OPTIONAL_TABLES.len());
    let without_counts = |rows: Vec<Value>, n: u64| -> Vec<Value> {
        rows.into_iter()
            .map(|mut r| {
                assert!(r["columns"].as_array().is_some_and(|c| c.len() > 5), "{r}");
                if n == 0 {
                    assert_eq!(r["n"], json!(0), "{r}");
                } else {
                    assert_ne!(r["n"], json!(0), "{r}");
                }
                r.as_object_mut().expect("a row").remove("n");
                r
            })
            .collect()
    };
    assert_rows(
        "optional tables without files",
        without_counts(empty, 0),
        Value::Array(without_counts(full, 1)),
    );
}

fn check_per_job_utilization(s: &Store) {
    // Every sample stands for its 0.1 s tick: time_s is a tenth of the samples.
    let m = |job: &str, gpus: u64, metric: &str, samples: u64, [mean, p50, p95, max]: [f64; 4]| {
        json!({"job_id": job, "gpus": gpus, "metric": metric, "time_s": samples as f64 / 10.0,
               "mean": mean, "p50": p50, "p95": p95, "max": max})
    };
    // GPM activity has no value on a GPU's first tick: one sample fewer.
    let sm = TICKS - 1;
    // Job 4242: 25 samples each of GPUs A0, A1, B0, each GPU a third of the
    // job's time. Utilization 98, 94, 99: mean 97, p50 98 (94 holds a third
    // of the time, 98 brings it to two thirds), p95 99. SM activity 85.5,
    // 80.5, 88.5 (24 each): mean 84.83, p50 85.5. Memory 60, 60, 70 GiB.
    // Power 650, 600, 680 W.
    let constant = |v: f64| [v, v, v, v];
    assert_rows(
        "per_job_utilization",
        s.query("per_job_utilization.sql", ""),
        json!([
            m(
                "4242",
                3,
                "gpu_util_pct",
                3 * TICKS,
                [97.0, 98.0, 99.0, 99.0]
            ),
            m(
                "4242",
                3,
                "sm_active_pct",
                3 * sm,
                [84.83, 85.5, 88.5, 88.5]
            ),
            m(
                "4242",
                3,
                "fb_used_gib",
                3 * TICKS,
                [63.33, 60.0, 70.0, 70.0]
            ),
            m(
                "4242",
                3,
                "power_w",
                3 * TICKS,
                [643.33, 650.0, 680.0, 680.0]
            ),
            m("5151", 1, "gpu_util_pct", TICKS, constant(90.0)),
            m("5151", 1, "sm_active_pct", sm, constant(60.0)),
            m("5151", 1, "fb_used_gib", TICKS, constant(40.0)),
            m("5151", 1, "power_w", TICKS, constant(500.0)),
            m("7171", 1, "gpu_util_pct", TICKS, constant(75.0)),
            m("7171", 1, "sm_active_pct", sm, constant(50.0)),
            m("7171", 1, "fb_used_gib", TICKS, constant(20.0)),
            m("7171", 1, "power_w", TICKS, constant(400.0)),
            m("8080", 1, "gpu_util_pct", TICKS, constant(0.0)),
            m("8080", 1, "sm_active_pct", sm, constant(0.0)),
            m("8080", 1, "fb_used_gib", TICKS, constant(2.0)),
            m("8080", 1, "power_w", TICKS, constant(90.0)),
            m("9999", 1, "gpu_util_pct", TICKS, constant(50.0)),
            m("9999", 1, "sm_active_pct", sm, constant(30.0)),
            m("9999", 1, "fb_used_gib", TICKS, constant(10.0)),
            m("9999", 1, "power_w", TICKS, constant(300.0)),
        ]),
    );
}

fn check_fleet_cdf(s: &Store) {
    // Ten GPUs, each observed for the same time, so each is a tenth of the
    // time and the value at p is the GPU whose tenth holds the p-th
    // percent: sorted by power, 70 (A7), 90 (A6), 300 (B1), 400 (A3),
    // 450 (A5), 500 (A2), 550 (A4), 600 (A1), 650 (A0), 680 (B0).
    let power = [
        70.0, 90.0, 300.0, 400.0, 450.0, 500.0, 550.0, 600.0, 650.0, 680.0,
    ];
    let sm = [0.0, 0.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.5, 85.5, 88.5];
    let temp = [35.0, 40.0, 55.0, 62.0, 65.0, 66.0, 68.0, 70.0, 71.0, 80.0];
    let want: Vec<Value> = (0..=100u64)
        .step_by(5)
        .map(|pct| {
            // The smallest value with at least pct % of the time at or below it.
            let tenth = (pct.div_ceil(10)).max(1) as usize - 1;
            json!({"pct": pct, "sm_active_pct": sm[tenth], "power_w": power[tenth],
                   "temperature_c": temp[tenth]})
        })
        .collect();
    let got = s
        .query("fleet_cdf.sql", "")
        .into_iter()
        .map(|row| {
            json!({"pct": row["pct"], "sm_active_pct": row["sm_active_pct"],
                   "power_w": row["power_w"], "temperature_c": row["temperature_c"]})
        })
        .collect();
    assert_rows("fleet_cdf", got, Value::Array(want));
}

fn check_idle_gpu_power(s: &Store) {
    // Per tick, node A draws 650 + 600 + 500 + 400 + 550 + 450 + 90 + 70 =
    // 3310 W: 70 W unallocated (A7), 90 W allocated but idle (A6), 3150 W
    // active. Node B: 680 + 300 = 980 W, all active. Every sample stands
    // for the 0.1 s tick; p50 is the smallest power with half the time at
    // or below it.
    let row = |node: &str,
               state: &str,
               samples: u64,
               share: f64,
               [mean, p50, max]: [f64; 3],
               energy: f64| {
        json!({"node": node, "state": state, "time_s": samples as f64 / 10.0, "time_share": share,
               "power_w_mean": mean, "power_w_p50": p50, "power_w_max": max, "energy_share": energy})
    };
    assert_rows(
        "idle_gpu_power",
        s.query("idle_gpu_power.sql", ""),
        json!([
            row(
                NODE_A,
                "unallocated",
                TICKS,
                0.125,
                [70.0, 70.0, 70.0],
                0.0211
            ),
            row(
                NODE_A,
                "allocated, idle",
                TICKS,
                0.125,
                [90.0, 90.0, 90.0],
                0.0272
            ),
            // 650, 600, 500, 400, 550, 450: mean 525, half the time at or
            // below 500.
            row(
                NODE_A,
                "allocated, active",
                6 * TICKS,
                0.75,
                [525.0, 500.0, 650.0],
                0.9517
            ),
            row(
                NODE_B,
                "allocated, active",
                2 * TICKS,
                1.0,
                [490.0, 300.0, 680.0],
                1.0
            ),
            // 4290 W in all: 70 / 4290, 90 / 4290, 4130 / 4290.
            row(
                "(all)",
                "unallocated",
                TICKS,
                0.1,
                [70.0, 70.0, 70.0],
                0.0163
            ),
            row(
                "(all)",
                "allocated, idle",
                TICKS,
                0.1,
                [90.0, 90.0, 90.0],
                0.021
            ),
            // 8 active GPUs: mean 4130 / 8 = 516.25; 300, 400, 450, 500
            // are half of them.
            row(
                "(all)",
                "allocated, active",
                8 * TICKS,
                0.8,
                [516.25, 500.0, 680.0],
                0.9627
            ),
        ]),
    );
}

/// A row of gpu_time_share.sql.
fn share_row(
    scope: &str,
    dimension: &str,
    value: &str,
    jobs: u64,
    gpu_time_s: f64,
    share: f64,
) -> Value {
    json!({"scope": scope, "dimension": dimension, "value": value, "jobs": jobs,
           "gpu_time_s": gpu_time_s, "share": share})
}

fn check_gpu_time_share(s: &Store) {
    // Observed: 25 samples 0.1 s apart, 2.5 s per GPU; 4242 has 3 GPUs, the
    // other four jobs 1 each: 17.5 s in all. Trace: its GPU jobs, GPU time
    // from the trace: 4242 21600 s, 7171 7200 s (sacct, its latest import:
    // 2 h on 1 GPU, no type), 8080 1200 s, 5151 600 s: 30600 s in all.
    let obs = |dimension: &str, value: &str, jobs: u64, gpu_time_s: f64, share: f64| {
        share_row("observed", dimension, value, jobs, gpu_time_s, share)
    };
    let trace = |dimension: &str, value: &str, jobs: u64, gpu_time_s: f64, share: f64| {
        share_row("trace", dimension, value, jobs, gpu_time_s, share)
    };
    assert_rows(
        "gpu_time_share",
        s.query("gpu_time_share.sql", ""),
        json!([
            obs("job_type", "Pretrain", 1, 7.5, 0.4286),
            // 7171: the latest import is sacct's, which has no type.
            obs("job_type", "(not in trace)", 1, 2.5, 0.1429),
            obs("job_type", "(untyped)", 1, 2.5, 0.1429),
            obs("job_type", "Debug", 1, 2.5, 0.1429),
            obs("job_type", "Eval", 1, 2.5, 0.1429),
            obs("state", "COMPLETED", 2, 10.0, 0.5714),
            obs("state", "(not in trace)", 1, 2.5, 0.1429),
            obs("state", "CANCELLED", 1, 2.5, 0.1429),
            obs("state", "FAILED", 1, 2.5, 0.1429),
            // 21600 / 30600, 7200 / 30600, ...; 9999 is in no trace.
            trace("job_type", "Pretrain", 1, 21600.0, 0.7059),
            trace("job_type", "(untyped)", 1, 7200.0, 0.2353),
            trace("job_type", "Debug", 1, 1200.0, 0.0392),
            trace("job_type", "Eval", 1, 600.0, 0.0196),
            trace("state", "COMPLETED", 2, 28800.0, 0.9412),
            trace("state", "CANCELLED", 1, 1200.0, 0.0392),
            trace("state", "FAILED", 1, 600.0, 0.0196),
        ]),
    );
}

fn check_jobs_with_gpu_events(s: &Store) {
    let rows = s.query("jobs_with_gpu_events.sql", "");
    // first_ts and last_ts are wall-clock times: compare them with the event
    // table itself, then drop them.
    let times = s.query(
        "views.sql",
        "SELECT node, gpu, kind, code, min(ts)::VARCHAR AS first_ts, max(ts)::VARCHAR AS last_ts \
         FROM event GROUP BY ALL ORDER BY node, gpu, kind, code",
    );
    let mut rest = Vec::new();
    for row in rows {
        let mut row: Map<String, Value> = match row {
            Value::Object(map) => map,
            other => panic!("not a row: {other}"),
        };
        let key = |r: &Map<String, Value>| {
            (
                r["node"].clone(),
                r["gpu"].clone(),
                r["kind"].clone(),
                r["code"].clone(),
            )
        };
        let t = times
            .iter()
            .filter_map(Value::as_object)
            .find(|t| key(t) == key(&row))
            .unwrap_or_else(|| panic!("no events for {row:?}"));
        assert_eq!(
            normalized_ts(&row["first_ts"]),
            normalized_ts(&t["first_ts"]),
            "{row:?}"
        );
        assert_eq!(
            normalized_ts(&row["last_ts"]),
            normalized_ts(&t["last_ts"]),
            "{row:?}"
        );
        row.remove("first_ts");
        row.remove("last_ts");
        rest.push(Value::Object(row));
    }
    let row = |job: &str,
               job_type: Option<&str>,
               state: &str,
               user: &str,
               node: &str,
               gpu: u64,
               kind: &str,
               code: u64,
               events: u64| {
        json!({"job_id": job, "job_type": job_type, "state": state, "user": user, "node": node,
               "gpu": gpu, "kind": kind, "code": code, "events": events})
    };
    assert_rows(
        "jobs_with_gpu_events",
        rest,
        json!([
            // XID 13 on job 4242's GPU A0 (node A sorts first).
            row(
                "4242",
                Some("Pretrain"),
                "COMPLETED",
                "alice",
                NODE_A,
                0,
                "xid",
                13,
                1
            ),
            // Power cap (4) on node B's GPU 0 while job 4242 held it.
            row(
                "4242",
                Some("Pretrain"),
                "COMPLETED",
                "alice",
                NODE_B,
                0,
                "power_throttle",
                4,
                1
            ),
            // Three XIDs on job 5151's GPU, XID 48 twice.
            row(
                "5151",
                Some("Eval"),
                "FAILED",
                "bob",
                NODE_A,
                2,
                "xid",
                31,
                1
            ),
            row(
                "5151",
                Some("Eval"),
                "FAILED",
                "bob",
                NODE_A,
                2,
                "xid",
                48,
                2
            ),
            // SW thermal slowdown (32) on job 7171's GPU.
            row(
                "7171",
                None,
                "COMPLETED",
                "alice",
                NODE_A,
                3,
                "thermal_throttle",
                32,
                1
            ),
            // XID 79 on job 9999's GPU; no trace lists 9999. (A7's 999 is
            // on an unallocated GPU: no job, not listed.)
            json!({"job_id": "9999", "job_type": null, "state": null, "user": null,
                   "node": NODE_B, "gpu": 1, "kind": "xid", "code": 79, "events": 1}),
        ]),
    );
}

/// A timestamp as DuckDB's JSON prints it, and as ::VARCHAR does.
fn normalized_ts(v: &Value) -> String {
    v.as_str()
        .unwrap_or_else(|| panic!("{v} is not a timestamp"))
        .to_owned()
}

fn check_xid_failures(s: &Store) {
    // XIDs: 13 on A0 (job 4242), 31, 48, 48 on A2 (job 5151), 999 on A7
    // (unallocated), 79 on B1 (job 9999, in no trace).
    let row = |category: &str,
               job: &str,
               trace: Option<(&str, &str)>,
               events: u64,
               gpus: u64,
               codes: &[u64]| {
        json!({"category": category, "job_id": job,
               "job_type": trace.map(|t| t.0), "state": trace.map(|t| t.1),
               "events": events, "gpus": gpus, "codes": codes})
    };
    let pretrain = Some(("Pretrain", "COMPLETED"));
    let evaluation = Some(("Eval", "FAILED"));
    assert_rows(
        "xid_failures",
        s.query("xid_failures.sql", ""),
        json!([
            // 13 (graphics engine exception) and 31 (MMU fault): the jobs' own.
            row("application", "(all)", None, 2, 2, &[13, 31]),
            row("application", "4242", pretrain, 1, 1, &[13]),
            row("application", "5151", evaluation, 1, 1, &[31]),
            // 79, fallen off the bus.
            row("hardware", "(all)", None, 1, 1, &[79]),
            row("hardware", "9999", None, 1, 1, &[79]),
            // 48, double-bit ECC, twice on one GPU.
            row("memory", "(all)", None, 2, 1, &[48]),
            row("memory", "5151", evaluation, 2, 1, &[48]),
            // 999 is in no catalogue; the GPU had no job.
            row("unknown", "(all)", None, 1, 1, &[999]),
            row("unknown", "(no job)", None, 1, 1, &[999]),
        ]),
    );
    // The catalogue view is the file: 172 codes, the seven categories.
    assert_rows(
        "xid_catalogue",
        s.query(
            "views.sql",
            "SELECT count(*) AS codes, list(DISTINCT category ORDER BY category) AS categories, \
                    (SELECT name || ' / ' || category || ' / ' || action || ' / ' || reset \
                     FROM xid_catalogue WHERE code = 79) AS xid_79 \
             FROM xid_catalogue",
        ),
        json!([{
            "codes": 172,
            "categories": ["application", "driver", "hardware", "memory", "nvlink", "other", "thermal_power"],
            "xid_79": "GPU has fallen off the bus / hardware / RESTART_BM / node",
        }]),
    );
    // xid_event: each XID once, with its job, name and reset.
    assert_rows(
        "xid_event",
        s.query(
            "views.sql",
            "SELECT node, gpu, code, job_id, name, category, reset FROM xid_event \
             ORDER BY node, gpu, code",
        ),
        json!([
            {"node": NODE_A, "gpu": 0, "code": 13, "job_id": "4242", "name": "Graphics Engine Exception", "category": "application", "reset": "none"},
            {"node": NODE_A, "gpu": 2, "code": 31, "job_id": "5151", "name": "GPU memory page fault", "category": "application", "reset": "none"},
            {"node": NODE_A, "gpu": 2, "code": 48, "job_id": "5151", "name": "Double Bit ECC Error", "category": "memory", "reset": "gpu"},
            {"node": NODE_A, "gpu": 2, "code": 48, "job_id": "5151", "name": "Double Bit ECC Error", "category": "memory", "reset": "gpu"},
            {"node": NODE_A, "gpu": 7, "code": 999, "job_id": null, "name": null, "category": "unknown", "reset": null},
            {"node": NODE_B, "gpu": 1, "code": 79, "job_id": "9999", "name": "GPU has fallen off the bus", "category": "hardware", "reset": "node"},
        ]),
    );
}

fn check_ib_idle_share(s: &Store) {
    // Node A's fixture counters never move: every port-tick idle. Node B's
    // mlx5_0 is busy for BUSY_TICKS ticks. Each port has TICKS - 1 ticks with
    // rates (none on its first).
    // Every port-tick stands for its 0.1 s.
    let ticks = 4 * (TICKS - 1);
    let s_of = |ticks: u64| ticks as f64 / 10.0;
    assert_rows(
        "ib_idle_share",
        s.query("ib_idle_share.sql", ""),
        json!([
            {"node": NODE_A, "ports": 4, "time_s": s_of(ticks), "idle_time_s": s_of(ticks),
             "idle_share": 1.0},
            {"node": NODE_B, "ports": 4, "time_s": s_of(ticks),
             "idle_time_s": s_of(ticks - BUSY_TICKS), "idle_share": 0.875},
            {"node": "(all)", "ports": 8, "time_s": s_of(2 * ticks),
             "idle_time_s": s_of(2 * ticks - BUSY_TICKS), "idle_share": 0.9375},
        ]),
    );
}

/// A GPU that falls off the bus records its XID 79 and its gpu_lost event
/// after its last gpu row, so neither carries a job_id; the query still gives
/// them to the job that held the GPU.
#[test]
fn a_gpu_lost_under_a_job_is_attributed_to_that_job() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = tmp.path().join("store");
    let scenario = tmp.path().join("lost.toml");
    std::fs::write(
        &scenario,
        r#"
[[gpu]]
gpu_util_pct = 97
processes = [{ pid = 4242, used_memory_bytes = 1073741824 }]
xid_events = [{ at_ms = 2000, xid = 79 }]
lost_at_ms = 2000

[[gpu]]
gpu_util_pct = 0
"#,
    )
    .expect("write scenario");
    let (collector, addr) = start_collector(&store, &["--flush-interval", "1s"]);
    let mut agent = fixture_agent(NODE_A);
    agent
        .args(["--collector", &format!("http://{addr}")])
        .args(["--interval", "100ms", "--ticks", "30"])
        .args(["--process-interval", "1h"])
        .env(SCENARIO_ENV, &scenario);
    let out = Running::spawn(agent).wait(Duration::from_secs(60));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        collector
            .terminate(Duration::from_secs(30))
            .status
            .success()
    );
    // The events themselves carry no job.
    assert_eq!(
        duckdb_value(
            tmp.path(),
            &format!(
                "SELECT list(kind || ':' || coalesce(job_id, 'none') ORDER BY kind) FROM {}",
                table_scan(&store, "event")
            )
        ),
        json!(["gpu_lost:none", "xid:none"])
    );
    let rows = query_store(&store, "jobs_with_gpu_events.sql", "");
    let rows: Vec<Value> = rows
        .into_iter()
        .map(|r| {
            let mut r = r.as_object().cloned().expect("a row");
            r.remove("first_ts");
            r.remove("last_ts");
            Value::Object(r)
        })
        .collect();
    let row = |kind: &str, code: u64| {
        json!({"job_id": "4242", "job_type": null, "state": null, "user": null, "node": NODE_A,
               "gpu": 0, "kind": kind, "code": code, "events": 1})
    };
    assert_rows(
        "jobs_with_gpu_events after a lost GPU",
        rows,
        json!([row("gpu_lost", 0), row("xid", 79)]),
    );
}

/// A store written directly (DuckDB's COPY, in the collector's layout) for
/// the time-weighted queries: agents sampling every second and every 15 s,
/// and a scheduler trace with round shares. GPUs (80 GiB, 700 W limit):
/// n1's GPUs 0 and 1 run job a, 60 samples 1 s apart at 100 % (SM activity
/// 80 %, occupancy 40 %, 40 and 60 GiB, 350 W, 60 °C, HBM 70 °C); n2's GPUs
/// 0 and 1 run job b, 4 samples 15 s apart at 0 % (8 GiB, 70 W, 30 °C,
/// HBM 40 °C). Each GPU is observed for 60 s: time-weighted, the fleet is
/// 50 % utilized; counted by samples, it would be 120 / 128 = 93.75 %.
const MIXED_STORE_SQL: &str = r#"
COPY (
    SELECT TIMESTAMPTZ '2026-11-02 08:00:00+00' + to_seconds(s * step) AS ts,
           node, gpu, node || '-' || gpu AS uuid, util AS gpu_util_pct,
           sm AS sm_active_pct, occ AS sm_occupancy_pct,
           occ / 2 AS tensor_active_pct,
           fb_gib * 2^30::BIGINT AS fb_used_bytes, 80 * 2^30::BIGINT AS fb_total_bytes,
           power_w * 1000 AS power_mw, 700000 AS power_limit_mw,
           temp AS temperature_c, temp + 10 AS memory_temperature_c,
           -- n1's GPU 1 is power-capped (0x4) on its first 30 samples.
           CASE WHEN node = 'n1' AND gpu = 1 AND s < 30 THEN 4 ELSE 0 END::BIGINT
               AS clock_event_reasons,
           job_id, 1 AS job_count, NULL::VARCHAR AS pod_uid,
           NULL::INTEGER AS gpu_instance_id, NULL::INTEGER AS compute_instance_id,
           DATE '2026-11-02' AS date, 8 AS hour
    FROM (VALUES ('n1', 0, 1, 60, 100, 80.0, 40.0, 40, 350, 60, 'a'),
                 ('n1', 1, 1, 60, 100, 80.0, 40.0, 60, 350, 60, 'a'),
                 ('n2', 0, 15, 4, 0, 0.0, 0.0, 8, 70, 30, 'b'),
                 ('n2', 1, 15, 4, 0, 0.0, 0.0, 8, 70, 30, 'b'))
         AS t(node, gpu, step, n, util, sm, occ, fb_gib, power_w, temp, job_id),
         range(n) AS r(s)
) TO 'store/gpu' (FORMAT parquet, PARTITION_BY (date, hour));
-- n1 every second for 60 s, 60 % busy, 25 % memory; n2 every 15 s, idle,
-- with one 120 s gap before its last row (weighted 45 s: 3 × its median).
-- 100 CPUs: 10 000 jiffies a second, 100 per percent.
COPY (
    SELECT TIMESTAMPTZ '2026-11-02 08:00:00+00' + to_seconds(at_s) AS ts, node,
           (at_s * 100 * (busy - 10))::BIGINT AS cpu_user_jiffies,
           (at_s * 100 * 10)::BIGINT AS cpu_system_jiffies, 0::BIGINT AS cpu_iowait_jiffies,
           (at_s * 100 * (100 - busy))::BIGINT AS cpu_idle_jiffies, 0::BIGINT AS cpu_steal_jiffies,
           256 * 2^20::BIGINT AS memory_total_kib,
           (256 - mem_gib) * 2^20::BIGINT AS memory_available_kib,
           DATE '2026-11-02' AS date, 8 AS hour
    FROM (SELECT 'n1' AS node, s AS at_s, 60 AS busy, 64 AS mem_gib FROM range(60) r(s)
          UNION ALL
          SELECT 'n2', at_s, 10, 0 FROM (VALUES (0), (15), (30), (45), (165)) v(at_s))
) TO 'store/node' (FORMAT parquet, PARTITION_BY (date, hour));
-- n1's HCA at 400 Gb/s, sending 25 GB/s (50 % of the link) for 60 s.
COPY (
    SELECT TIMESTAMPTZ '2026-11-02 08:00:00+00' + to_seconds(s) AS ts, 'n1' AS node,
           'mlx5_0' AS device, 1 AS port, 'ACTIVE' AS state, 400.0 AS rate_gbps,
           (s * 25e9)::BIGINT AS xmit_bytes, (s * 5e9)::BIGINT AS rcv_bytes,
           DATE '2026-11-02' AS date, 8 AS hour
    FROM range(60) r(s)
) TO 'store/ib' (FORMAT parquet, PARTITION_BY (date, hour));
-- An application XID under job b; a hardware one under job d.
COPY (
    SELECT TIMESTAMPTZ '2026-11-02 08:00:20+00' AS ts, node, gpu, node || '-' || gpu AS uuid,
           'xid' AS kind, code::BIGINT AS code, job_id, DATE '2026-11-02' AS date, 8 AS hour
    FROM (VALUES ('n2', 0, 13, 'b'), ('n3', 0, 79, 'd')) v(node, gpu, code, job_id)
) TO 'store/event' (FORMAT parquet, PARTITION_BY (date, hour));
-- The trace: 1000 GPU-seconds, 600 of them job d's (FAILED, on no GPU of
-- this store); job e asks for no GPU (the trace-only figures leave it out).
COPY (
    SELECT job_id, 'acme' AS source, state, job_type,
           TIMESTAMPTZ '2026-11-02 07:00:00+00' AS submit_time,
           TIMESTAMPTZ '2026-11-02 07:00:00+00' + to_seconds(queue_s) AS start_time,
           TIMESTAMPTZ '2026-11-02 07:00:00+00' + to_seconds(queue_s + duration_s) AS end_time,
           queue_s::BIGINT AS queue_s, duration_s::BIGINT AS duration_s, gpus,
           (gpus * duration_s)::BIGINT AS gpu_time_s,
           TIMESTAMPTZ '2026-11-03 00:00:00+00' AS imported_at, '2026-11' AS month
    FROM (VALUES ('a', 'COMPLETED', 'Pretrain', 10, 100, 2),
                 ('b', 'FAILED', 'Debug', 100, 50, 2),
                 ('c', 'COMPLETED', 'Debug', 0, 100, 1),
                 ('d', 'FAILED', 'Pretrain', 600, 75, 8),
                 ('e', 'COMPLETED', 'Debug', 5, 1000, 0))
         AS t(job_id, state, job_type, queue_s, duration_s, gpus)
) TO 'store/scheduler_job' (FORMAT parquet, PARTITION_BY (month));
"#;

/// The node and ib views' derived columns, by the rules of
/// `gputel_schemas::derive`: node `a`'s CPU counters and port `mlx5_0`'s
/// counters go through a first reading, an unreadable tick, a reset, a
/// saturated legacy counter and an aggregate iowait that goes back; node
/// and port `old` are files written before the counters, whose stored
/// shares and rates the views pass on.
const DERIVED_STORE_SQL: &str = r#"
SET TimeZone = 'UTC';
COPY (
    SELECT TIMESTAMPTZ '2026-11-02 08:00:00+00' + to_seconds(t) AS ts, 'a' AS node,
           8 AS cpu_count, u::BIGINT AS cpu_user_jiffies, sy::BIGINT AS cpu_system_jiffies,
           io::BIGINT AS cpu_iowait_jiffies, idle::BIGINT AS cpu_idle_jiffies,
           st::BIGINT AS cpu_steal_jiffies
    FROM (VALUES (0, 1000, 100, 50, 8850, 0), (1, 1600, 200, 60, 9140, 0),
                 (2, NULL, NULL, NULL, NULL, NULL), (3, 2600, 400, 60, 9740, 200),
                 (4, 2700, 450, 55, 9790, 200), (5, 3200, 450, 55, 10290, 200),
                 (6, 3200, 450, 55, 10290, 200)) v(t, u, sy, io, idle, st)
) TO 'store/node/date=2026-11-02/hour=8/counters.parquet' (FORMAT parquet);
COPY (
    SELECT TIMESTAMPTZ '2026-11-02 08:00:00+00' AS ts, 'old' AS node, 8 AS cpu_count,
           42.5::FLOAT AS cpu_user_pct, 7.5::FLOAT AS cpu_system_pct,
           0::FLOAT AS cpu_iowait_pct, 50::FLOAT AS cpu_idle_pct
) TO 'store/node/date=2026-11-02/hour=8/shares.parquet' (FORMAT parquet);
COPY (
    SELECT TIMESTAMPTZ '2026-11-02 08:00:00+00' + to_seconds(t) AS ts, 'a' AS node,
           'mlx5_0' AS device, 1 AS port, 'ACTIVE' AS state, xb::BIGINT AS xmit_bytes,
           (10 * (t + 1))::BIGINT AS xmit_packets
    FROM (VALUES (0, 1000), (1, 5000), (2, NULL), (3, 9000), (4, 17179869180),
                 (5, 17179869180), (6, 3000)) v(t, xb)
) TO 'store/ib/date=2026-11-02/hour=8/counters.parquet' (FORMAT parquet);
COPY (
    SELECT TIMESTAMPTZ '2026-11-02 08:00:00+00' AS ts, 'old' AS node, 'mlx5_0' AS device,
           1 AS port, 'ACTIVE' AS state, 123.0::DOUBLE AS xmit_bytes_per_s
) TO 'store/ib/date=2026-11-02/hour=8/rates.parquet' (FORMAT parquet);
"#;

#[test]
fn views_derive_shares_and_rates_from_counters_by_the_documented_rules() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for table in ["node", "ib", "gpu"] {
        std::fs::create_dir_all(
            tmp.path()
                .join(format!("store/{table}/date=2026-11-02/hour=8")),
        )
        .expect("mkdir store");
    }
    gputel_tests::duckdb(tmp.path(), DERIVED_STORE_SQL);
    // views.sql needs a gpu table; an empty file with the columns it reads serves.
    gputel_tests::duckdb(
        tmp.path(),
        "COPY (SELECT TIMESTAMPTZ '2026-11-02 08:00:00+00' AS ts, 'a' AS node, 0 AS gpu, \
         'GPU-0' AS uuid, 0 AS gpu_util_pct, 0.0 AS sm_active_pct, 0.0 AS sm_occupancy_pct, \
         0.0 AS tensor_active_pct, 0::BIGINT AS fb_used_bytes, 0::BIGINT AS fb_total_bytes, \
         0::BIGINT AS power_mw, 0::BIGINT AS power_limit_mw, 0 AS temperature_c, \
         0 AS memory_temperature_c, 0::BIGINT AS clock_event_reasons, \
         NULL::VARCHAR AS job_id, 0 AS job_count, NULL::VARCHAR AS pod_uid, \
         NULL::INTEGER AS gpu_instance_id, NULL::INTEGER AS compute_instance_id LIMIT 0) \
         TO 'store/gpu/date=2026-11-02/hour=8/empty.parquet' (FORMAT parquet)",
    );
    let store = tmp.path().join("store");
    let shares = |u: f64, sy: f64, io: f64, idle: f64, st: f64| json!({"user": u, "system": sy, "iowait": io, "idle": idle, "steal": st});
    let none = json!({"user": null, "system": null, "iowait": null, "idle": null, "steal": null});
    assert_rows(
        "node shares",
        gputel_tests::shipped_query(
            &store,
            "",
            "views.sql",
            "SELECT node, epoch(ts) - 1793606400 AS t, cpu_user_pct AS user, \
             cpu_system_pct AS system, cpu_iowait_pct AS iowait, cpu_idle_pct AS idle, \
             cpu_steal_pct AS steal FROM node ORDER BY node, ts",
        )
        .into_iter()
        .map(|mut row| {
            let row = row.as_object_mut().expect("a row");
            let (node, t) = (row.remove("node").unwrap(), row.remove("t").unwrap());
            json!([node, t, row])
        })
        .collect(),
        json!([
            ["a", 0, none],
            // Δ 600 + 100 + 10 + 290 + 0 jiffies.
            ["a", 1, shares(60.0, 10.0, 1.0, 29.0, 0.0)],
            // Unreadable: nothing, and the next row spans both seconds.
            ["a", 2, none],
            ["a", 3, shares(50.0, 10.0, 0.0, 30.0, 10.0)],
            // iowait went from 60 to 55.
            ["a", 4, none],
            ["a", 5, shares(50.0, 0.0, 0.0, 50.0, 0.0)],
            // No CPU time passed.
            ["a", 6, none],
            [
                "old",
                0,
                json!({"user": 42.5, "system": 7.5, "iowait": 0.0, "idle": 50.0, "steal": null})
            ],
        ]),
    );
    assert_rows(
        "ib rates",
        gputel_tests::shipped_query(
            &store,
            "",
            "views.sql",
            "SELECT node, epoch(ts) - 1793606400 AS t, xmit_bytes_per_s AS bytes, \
             xmit_packets_per_s AS packets FROM ib ORDER BY node, ts",
        ),
        json!([
            {"node": "a", "t": 0, "bytes": null, "packets": null},
            {"node": "a", "t": 1, "bytes": 4000.0, "packets": 10.0},
            {"node": "a", "t": 2, "bytes": null, "packets": 10.0},
            // Over the 2 s since the last reading of the counter.
            {"node": "a", "t": 3, "bytes": 2000.0, "packets": 10.0},
            // 4 × (2^32 - 1): a legacy counter that stopped.
            {"node": "a", "t": 4, "bytes": null, "packets": 10.0},
            {"node": "a", "t": 5, "bytes": null, "packets": 10.0},
            // Cleared and counting again: the new value is the increase.
            {"node": "a", "t": 6, "bytes": 3000.0, "packets": 10.0},
            {"node": "old", "t": 0, "bytes": 123.0, "packets": null},
        ]),
    );
}

/// What each time-weighted query must return on the mixed store.
type MixedCheck = fn(&Path);
const MIXED_CHECKS: &[(&str, MixedCheck)] = &[
    ("fleet_cdf.sql", check_fleet_cdf_mixed),
    ("throttle_time.sql", check_throttle_time),
    ("utilization_by_job_type.sql", check_utilization_by_job_type),
    (
        "job_duration_vs_utilization.sql",
        check_job_duration_vs_utilization,
    ),
    ("job_imbalance.sql", check_job_imbalance),
    ("failure_share.sql", check_failure_share),
    ("trace_job_types.sql", check_trace_job_types),
    ("trace_job_cdf.sql", check_trace_job_cdf),
    ("trace_job_type_cdf.sql", check_trace_job_type_cdf),
    ("gpu_time_share.sql", check_gpu_time_share_mixed),
];

#[test]
fn time_weighted_queries_answer_exactly_on_mixed_intervals() {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(tmp.path().join("store")).expect("mkdir store");
    gputel_tests::duckdb(tmp.path(), MIXED_STORE_SQL);
    let store = tmp.path().join("store");

    // The weights: every GPU 60 s; n2's node rows 15 s each but the one
    // before a 120 s gap, capped at 3 × its 15 s median.
    assert_rows(
        "weights",
        query_store(
            &store,
            "views.sql",
            "SELECT (SELECT list(s ORDER BY k) FROM (SELECT node || ':' || gpu AS k, sum(weight_s) AS s \
                     FROM gpu_weighted GROUP BY k)) AS gpu_s, \
                    (SELECT sum(gpu_util_pct * weight_s) / sum(weight_s) FROM gpu_weighted) AS util_mean, \
                    (SELECT list(weight_s ORDER BY ts) FROM node_weighted WHERE node = 'n2') AS n2_s, \
                    (SELECT sum(weight_s) FROM ib_weighted) AS ib_s",
        ),
        json!([{"gpu_s": [60, 60, 60, 60], "util_mean": 50, "n2_s": [15, 15, 15, 45, 15], "ib_s": 60}]),
    );
    for (file, check) in MIXED_CHECKS {
        eprintln!("checking {file}");
        check(&store);
    }
}

/// `value(pct)` for pct 0, 5, ..., 100.
fn by_pct(value: impl Fn(u64) -> Value) -> Vec<Value> {
    (0..=100).step_by(5).map(value).collect()
}

fn check_fleet_cdf_mixed(store: &Path) {
    // GPU metrics: half the GPU time on n2's idle GPUs, half on n1's busy
    // ones (counted by samples, 120 of 128 would be busy: p10 would be 100).
    // Memory shares: 10 % for 120 s, 50 % for 60 s, 75 % for 60 s. Host
    // memory: n2's 0 % for 105 of 165 s (63.6 %), n1's 25 % for the rest.
    // Host CPU, from the jiffy counters (a node's first row has no share):
    // n2's 10 % for 90 of 149 s (60.4 %), n1's 60 % for 59 s. InfiniBand,
    // from the byte counters: 25 GB/s of 400 Gb/s sent, 5 GB/s received.
    let want = by_pct(|p| {
        let busy = p > 50;
        let pick = |idle: f64, used: f64| if busy { used } else { idle };
        let host = |idle: f64, used: f64| if p > 60 { used } else { idle };
        json!({
            "pct": p,
            "gpu_util_pct": pick(0.0, 100.0),
            "sm_active_pct": pick(0.0, 80.0),
            "sm_occupancy_pct": pick(0.0, 40.0),
            "tensor_active_pct": pick(0.0, 20.0),
            "gpu_mem_share_pct": if p <= 50 { 10.0 } else if p <= 75 { 50.0 } else { 75.0 },
            "power_share_pct": pick(10.0, 50.0),
            "power_w": pick(70.0, 350.0),
            "temperature_c": pick(30.0, 60.0),
            "memory_temperature_c": pick(40.0, 70.0),
            "cpu_busy_pct": host(10.0, 60.0),
            "host_mem_share_pct": host(0.0, 25.0),
            "ib_xmit_share_pct": 50.0,
            "ib_rcv_share_pct": 10.0,
        })
    });
    assert_rows(
        "fleet_cdf",
        query_store(store, "fleet_cdf.sql", ""),
        Value::Array(want),
    );
}

fn check_throttle_time(store: &Path) {
    // 30 of n1 GPU 1's 60 s power-capped; nothing else throttled.
    let gpu = |node: &str, gpu: u32, power_s: f64| {
        json!({"node": node, "gpu": gpu, "time_s": 60, "thermal_s": 0, "power_s": power_s,
               "hw_slowdown_s": 0, "throttled_s": power_s, "throttled_pct": power_s / 60.0 * 100.0})
    };
    assert_rows(
        "throttle_time",
        query_store(store, "throttle_time.sql", ""),
        json!([
            gpu("n1", 1, 30.0),
            gpu("n1", 0, 0.0),
            gpu("n2", 0, 0.0),
            gpu("n2", 1, 0.0)
        ]),
    );
}

fn check_utilization_by_job_type(store: &Path) {
    // 120 GPU-seconds each: 1/30 h.
    assert_rows(
        "utilization_by_job_type",
        query_store(store, "utilization_by_job_type.sql", ""),
        json!([
            {"job_type": "Debug", "jobs": 1, "gpu_hours": 0.0333, "gpu_util_mean_pct": 0,
             "sm_active_mean_pct": 0, "idle_share_pct": 100},
            {"job_type": "Pretrain", "jobs": 1, "gpu_hours": 0.0333, "gpu_util_mean_pct": 100,
             "sm_active_mean_pct": 80, "idle_share_pct": 0},
        ]),
    );
}

fn check_job_duration_vs_utilization(store: &Path) {
    // Durations are the trace's; jobs c and d were on no GPU of the store.
    assert_rows(
        "job_duration_vs_utilization",
        query_store(store, "job_duration_vs_utilization.sql", ""),
        json!([
            {"job_id": "a", "job_type": "Pretrain", "gpus": 2, "duration_s": 100,
             "observed_gpu_s": 120, "gpu_util_mean_pct": 100, "sm_active_mean_pct": 80},
            {"job_id": "b", "job_type": "Debug", "gpus": 2, "duration_s": 50,
             "observed_gpu_s": 120, "gpu_util_mean_pct": 0, "sm_active_mean_pct": 0},
        ]),
    );
}

fn check_job_imbalance(store: &Path) {
    // Job a: peaks of 40 and 60 of 80 GiB; job b: 8 and 8.
    assert_rows(
        "job_imbalance",
        query_store(store, "job_imbalance.sql", ""),
        json!([
            {"job_id": "a", "gpus": 2, "mem_peak_min_pct": 50, "mem_peak_max_pct": 75,
             "mem_imbalance_pct": 25, "idle_share_pct": 0},
            {"job_id": "b", "gpus": 2, "mem_peak_min_pct": 10, "mem_peak_max_pct": 10,
             "mem_imbalance_pct": 0, "idle_share_pct": 100},
        ]),
    );
}

fn check_failure_share(store: &Path) {
    // GPU time: a 200, b 100, c 100, d 600 of 1000 GPU-seconds; e asks for
    // no GPU and is left out, as in the study: four jobs. An application XID
    // (13) under b, a hardware one (79) under d.
    let row = |grouping: &str, category: &str, jobs: u64, job_share: f64, gpu_share: f64| {
        json!({"grouping": grouping, "category": category, "jobs": jobs,
               "job_share_pct": job_share, "gpu_time_share_pct": gpu_share})
    };
    assert_rows(
        "failure_share",
        query_store(store, "failure_share.sql", ""),
        json!([
            row("xid_category", "hardware", 1, 25.0, 60.0),
            row("xid_category", "application", 1, 25.0, 10.0),
            row("state", "FAILED", 2, 50.0, 70.0),
            row("state", "COMPLETED", 2, 50.0, 30.0),
        ]),
    );
}

fn check_trace_job_types(store: &Path) {
    // Pretrain: a (2 GPUs, queue 10 s, 100 s) and d (8, 600 s, 75 s);
    // Debug: b (2, 100 s, 50 s) and c (1, 0 s, 100 s). e, without a GPU, is
    // in none.
    let row = |t: &str, jobs: u64, shares: [f64; 2], gpus: [f64; 2], queue: [f64; 2], dur: f64| {
        json!({"job_type": t, "jobs": jobs, "job_share_pct": shares[0],
               "gpu_time_share_pct": shares[1], "gpus_mean": gpus[0], "gpus_p50": gpus[1],
               "queue_p50_s": queue[0], "queue_p95_s": queue[1], "duration_p50_s": dur})
    };
    assert_rows(
        "trace_job_types",
        query_store(store, "trace_job_types.sql", ""),
        json!([
            row(
                "Pretrain",
                2,
                [50.0, 80.0],
                [5.0, 5.0],
                [305.0, 570.5],
                87.5
            ),
            row("Debug", 2, [50.0, 20.0], [1.5, 1.5], [50.0, 95.0], 75.0),
            // Queues 0, 10, 100, 600: p95 interpolates 100 + 0.85 × 500.
            row("all", 4, [100.0, 100.0], [3.25, 2.0], [55.0, 525.0], 87.5),
        ]),
    );
}

fn check_trace_job_cdf(store: &Path) {
    // Durations 50, 75, 100, 100; queues 0, 10, 100, 600; GPUs 1, 2, 2, 8,
    // by GPU time 100 s of 1 GPU, 300 s of 2, 600 s of 8. Not e's 0 GPUs.
    let step = |p: u64, steps: &[(u64, f64)]| {
        steps
            .iter()
            .find(|(upto, _)| p <= *upto)
            .map(|(_, v)| *v)
            .expect("a step for every pct")
    };
    let want = by_pct(|p| {
        json!({
            "pct": p,
            "duration_s": step(p, &[(25, 50.0), (50, 75.0), (100, 100.0)]),
            "queue_s": step(p, &[(25, 0.0), (50, 10.0), (75, 100.0), (100, 600.0)]),
            "gpus_by_jobs": step(p, &[(25, 1.0), (75, 2.0), (100, 8.0)]),
            "gpus_by_gpu_time": step(p, &[(10, 1.0), (40, 2.0), (100, 8.0)]),
        })
    });
    assert_rows(
        "trace_job_cdf",
        query_store(store, "trace_job_cdf.sql", ""),
        Value::Array(want),
    );
}

fn check_trace_job_type_cdf(store: &Path) {
    // Two GPU jobs of each type (e, without a GPU, is left out): the first
    // value covers percentiles up to 50, the second the rest. Debug: b
    // (50 s, queue 100 s, 2 GPUs) and c (100 s, 0 s, 1); Pretrain: a (100 s,
    // 10 s, 2) and d (75 s, 600 s, 8).
    let rows = |job_type: &str, duration: [f64; 2], queue: [f64; 2], gpus: [f64; 2]| {
        by_pct(|p| {
            let i = usize::from(p > 50);
            json!({"job_type": job_type, "pct": p, "jobs": 2, "duration_s": duration[i],
                   "queue_s": queue[i], "gpus": gpus[i]})
        })
    };
    let mut want = rows("Debug", [50.0, 100.0], [0.0, 100.0], [1.0, 2.0]);
    want.extend(rows("Pretrain", [75.0, 100.0], [10.0, 600.0], [2.0, 8.0]));
    assert_rows(
        "trace_job_type_cdf",
        query_store(store, "trace_job_type_cdf.sql", ""),
        Value::Array(want),
    );
}

fn check_gpu_time_share_mixed(store: &Path) {
    // Observed, time-weighted: jobs a and b, 2 GPUs each observed for 60 s
    // (a's sampled 60 times a GPU, b's 4 times). Counted by samples × the
    // node's interval it is the same here; by samples alone a would be 15
    // times b. Trace: a 200, b 100, c 100, d 600 GPU-seconds; e has no GPU.
    let obs = |dimension: &str, value: &str| share_row("observed", dimension, value, 1, 120.0, 0.5);
    let trace = |dimension: &str, value: &str, gpu_time_s: f64, share: f64| {
        share_row("trace", dimension, value, 2, gpu_time_s, share)
    };
    assert_rows(
        "gpu_time_share on mixed intervals",
        query_store(store, "gpu_time_share.sql", ""),
        json!([
            obs("job_type", "Debug"),
            obs("job_type", "Pretrain"),
            obs("state", "COMPLETED"),
            obs("state", "FAILED"),
            trace("job_type", "Pretrain", 800.0, 0.8),
            trace("job_type", "Debug", 200.0, 0.2),
            trace("state", "FAILED", 700.0, 0.7),
            trace("state", "COMPLETED", 300.0, 0.3),
        ]),
    );
}

/// More jobs in Kalos' layout, made up for this test (the published excerpt,
/// tests/fixtures/acme-trace, has no TIMEOUT, NODE_FAIL, Eval or CPU-only
/// job): a timed-out pretraining job, an evaluation lost to a node failure,
/// a finished evaluation, and a job without GPUs.
const KALOS_MORE: &str = "job_id,user,node_num,gpu_num,cpu_num,mem_per_pod_GB,shared_mem_per_pod,type,state,submit_time,start_time,end_time,fail_time,stop_time,duration,queue,gpu_time
k-timeout,uf1,1,8,96,500,50.0,Pretrain,TIMEOUT,2023-05-18 00:00:00+00:00,2023-05-18 00:00:10+00:00,2023-05-18 01:00:10+00:00,,2023-05-18 01:00:10+00:00,3600,10.0,28800.0
k-nodefail,uf2,2,16,192,1000,100.0,Eval,NODE_FAIL,2023-05-18 02:00:00+00:00,2023-05-18 02:00:05+00:00,2023-05-18 02:10:05+00:00,2023-05-18 02:10:05+00:00,,600,5.0,9600.0
k-cpu,uf3,1,0,16,64,8.0,Other,COMPLETED,2023-05-18 03:00:00+00:00,2023-05-18 03:00:01+00:00,2023-05-18 04:00:01+00:00,,,3600,1.0,0.0
k-eval,uf2,1,1,12,100,10.0,Eval,COMPLETED,2023-05-18 04:00:00+00:00,2023-05-18 04:00:02+00:00,2023-05-18 04:20:02+00:00,,,1200,2.0,1200.0
";

/// Telemetry of three jobs, written directly in the collector's layout, and
/// a scheduler_job file of the layout before Kalos' columns existed. Node s1
/// samples every second: Seren job 5778469 on GPUs 0 and 1 for 60 s. Node
/// k1 every 15 s: k-timeout on GPUs 0 and 1 for 120 s, job x (in no trace)
/// on GPU 2 for 60 s.
const EXCERPT_STORE_SQL: &str = r#"
COPY (
    SELECT t0 + to_seconds(s * step) AS ts, node, gpu, node || '-' || gpu AS uuid,
           50 AS gpu_util_pct, job_id,
           NULL::INTEGER AS gpu_instance_id, NULL::INTEGER AS compute_instance_id, date, hour
    FROM (VALUES (TIMESTAMPTZ '2023-02-28 16:30:00+00', 's1', 0, 1, 60, '5778469'),
                 (TIMESTAMPTZ '2023-02-28 16:30:00+00', 's1', 1, 1, 60, '5778469'),
                 (TIMESTAMPTZ '2023-05-18 00:10:00+00', 'k1', 0, 15, 8, 'k-timeout'),
                 (TIMESTAMPTZ '2023-05-18 00:10:00+00', 'k1', 1, 15, 8, 'k-timeout'),
                 (TIMESTAMPTZ '2023-05-18 00:10:00+00', 'k1', 2, 15, 4, 'x'))
         AS t(t0, node, gpu, step, n, job_id)
    JOIN (VALUES ('s1', DATE '2023-02-28', 16), ('k1', DATE '2023-05-18', 0)) AS p(node, date, hour)
         USING (node),
         range(n) AS r(s)
) TO 'store/gpu' (FORMAT parquet, PARTITION_BY (date, hour));
COPY (
    SELECT t0 + to_seconds(s * step) AS ts, node, date, hour
    FROM (VALUES (TIMESTAMPTZ '2023-02-28 16:30:00+00', 's1', 1, 60, DATE '2023-02-28', 16),
                 (TIMESTAMPTZ '2023-05-18 00:10:00+00', 'k1', 15, 8, DATE '2023-05-18', 0))
         AS t(t0, node, step, n, date, hour),
         range(n) AS r(s)
) TO 'store/node' (FORMAT parquet, PARTITION_BY (date, hour));
-- A trace file as import-jobs wrote them before Kalos' columns: 2 GPUs for
-- 760 s.
COPY (
    SELECT 'old1' AS job_id, 'acme' AS source, 'uf9' AS "user", NULL::VARCHAR AS queue,
           'COMPLETED' AS state, 'Pretrain' AS job_type,
           TIMESTAMPTZ '2023-05-19 00:00:00+00' AS submit_time,
           TIMESTAMPTZ '2023-05-19 00:00:40+00' AS start_time,
           TIMESTAMPTZ '2023-05-19 00:13:20+00' AS end_time,
           40::BIGINT AS queue_s, 760::BIGINT AS duration_s, 1::INTEGER AS nodes,
           2::INTEGER AS gpus, 32::INTEGER AS cpus, NULL::VARCHAR AS node_list,
           1520::BIGINT AS gpu_time_s, TIMESTAMPTZ '2023-05-20 00:00:00+00' AS imported_at
) TO 'store/scheduler_job/month=2023-05/old-layout.parquet' (FORMAT parquet);
"#;

#[test]
fn acme_trace_excerpts_keep_every_column_and_fold_states() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = tmp.path().join("store");
    std::fs::create_dir_all(store.join("scheduler_job/month=2023-05")).expect("mkdir store");
    gputel_tests::duckdb(tmp.path(), EXCERPT_STORE_SQL);
    let more = tmp.path().join("kalos-more.csv");
    std::fs::write(&more, KALOS_MORE).expect("write trace");
    for file in [
        fixture("acme-trace/trace_seren.csv"),
        fixture("acme-trace/trace_kalos.csv"),
        more,
    ] {
        import_file(&store, "acme", &file);
    }

    // Every file import-jobs wrote has Kalos' four columns, Seren's too; the
    // old file has none.
    assert_rows(
        "the files' columns",
        gputel_tests::duckdb(
            tmp.path(),
            "SELECT name, type, count(DISTINCT file_name) AS files, \
                    bool_or(file_name LIKE '%old-layout%') AS in_old \
             FROM parquet_schema('store/scheduler_job/**/*.parquet') \
             WHERE name IN ('fail_time', 'stop_time', 'mem_per_pod_gb', 'shared_mem_per_pod') \
             GROUP BY ALL ORDER BY name",
        )
        .into_iter()
        .map(Value::Object)
        .collect(),
        json!([
            {"name": "fail_time", "type": "INT64", "files": 3, "in_old": false},
            {"name": "mem_per_pod_gb", "type": "DOUBLE", "files": 3, "in_old": false},
            {"name": "shared_mem_per_pod", "type": "DOUBLE", "files": 3, "in_old": false},
            {"name": "stop_time", "type": "INT64", "files": 3, "in_old": false},
        ]),
    );
    // Their values, read from the Parquet files by name: the published rows
    // as published (the Kalos job that failed has its fail_time, the one
    // cancelled its stop_time), null where a layout lacks the column.
    let values = gputel_tests::duckdb(
        tmp.path(),
        "SET TimeZone = 'UTC'; \
         SELECT job_id, job_type, state, duration_s, fail_time::VARCHAR AS fail_time, \
                stop_time::VARCHAR AS stop_time, mem_per_pod_gb, shared_mem_per_pod, \
                typeof(fail_time) AS time_type \
         FROM read_parquet('store/scheduler_job/**/*.parquet', union_by_name = true) \
         ORDER BY job_id",
    );
    let row = |job: &str,
               job_type: &str,
               state: &str,
               duration_s: u64,
               times: [Option<&str>; 2],
               mem: [Option<f64>; 2]| {
        json!({"job_id": job, "job_type": job_type, "state": state, "duration_s": duration_s,
               "fail_time": times[0], "stop_time": times[1], "mem_per_pod_gb": mem[0],
               "shared_mem_per_pod": mem[1], "time_type": "TIMESTAMP WITH TIME ZONE"})
    };
    assert_rows(
        "the new columns in Parquet",
        values.into_iter().map(Value::Object).collect(),
        json!([
            row(
                "5778432",
                "Other",
                "FAILED",
                117,
                [None, None],
                [None, None]
            ),
            row(
                "5778469",
                "Other",
                "COMPLETED",
                2693,
                [None, None],
                [None, None]
            ),
            row(
                "dlc1t2ypl09b8qtp",
                "Other",
                "CANCELLED",
                82,
                [None, Some("2023-05-17 11:30:04+00")],
                [Some(1000.0), Some(100.0)]
            ),
            // Kalos' duration as published: 18 s from submit to end (end -
            // start is 8 s), kept, not recomputed.
            row(
                "dlctk696s0jbvitv",
                "Other",
                "FAILED",
                18,
                [Some("2023-05-17 11:01:16+00"), None],
                [Some(1000.0), Some(100.0)]
            ),
            row(
                "k-cpu",
                "Other",
                "COMPLETED",
                3600,
                [None, None],
                [Some(64.0), Some(8.0)]
            ),
            // The trace's spelling of the type: Eval.
            row(
                "k-eval",
                "Eval",
                "COMPLETED",
                1200,
                [None, None],
                [Some(100.0), Some(10.0)]
            ),
            row(
                "k-nodefail",
                "Eval",
                "NODE_FAIL",
                600,
                [Some("2023-05-18 02:10:05+00"), None],
                [Some(1000.0), Some(100.0)]
            ),
            row(
                "k-timeout",
                "Pretrain",
                "TIMEOUT",
                3600,
                [None, Some("2023-05-18 01:00:10+00")],
                [Some(500.0), Some(50.0)]
            ),
            row(
                "old1",
                "Pretrain",
                "COMPLETED",
                760,
                [None, None],
                [None, None]
            ),
        ]),
    );
    // The view reads the old file beside the new ones.
    assert_rows(
        "scheduler_job over old and new files",
        query_store(
            &store,
            "views.sql",
            "SELECT count(*) AS jobs, count(fail_time) AS failed_at, \
                    count(mem_per_pod_gb) AS with_mem, \
                    any_value(job_type) FILTER (job_id = 'old1') AS old_type \
             FROM scheduler_job",
        ),
        json!([{"jobs": 9, "failed_at": 2, "with_mem": 6, "old_type": "Pretrain"}]),
    );

    // The GPU-time shares. Observed, time-weighted: 5778469 2 × 60 s,
    // k-timeout 2 × 120 s, x 60 s: 420 GPU-seconds. Trace: the GPU jobs'
    // gpu_time (k-cpu has no GPU): 936 + 21544 (Seren), 1152 + 5248 (Kalos'
    // excerpt), 28800 + 9600 + 1200 (the made-up ones), 1520 (old1): 70000.
    // TIMEOUT (k-timeout) and NODE_FAIL (k-nodefail) count as FAILED: 936 +
    // 1152 + 28800 + 9600 = 40488, not 2088.
    let obs = |dimension: &str, value: &str, gpu_time_s: f64, share: f64| {
        share_row("observed", dimension, value, 1, gpu_time_s, share)
    };
    let trace = |dimension: &str, value: &str, jobs: u64, gpu_time_s: f64, share: f64| {
        share_row("trace", dimension, value, jobs, gpu_time_s, share)
    };
    assert_rows(
        "gpu_time_share on the AcmeTrace excerpts",
        query_store(&store, "gpu_time_share.sql", ""),
        json!([
            obs("job_type", "Pretrain", 240.0, 0.5714),
            obs("job_type", "Other", 120.0, 0.2857),
            obs("job_type", "(not in trace)", 60.0, 0.1429),
            obs("state", "FAILED", 240.0, 0.5714),
            obs("state", "COMPLETED", 120.0, 0.2857),
            obs("state", "(not in trace)", 60.0, 0.1429),
            // k-timeout 28800 + old1 1520; the four Other jobs; k-nodefail
            // 9600 + k-eval 1200.
            trace("job_type", "Pretrain", 2, 30320.0, 0.4331),
            trace("job_type", "Other", 4, 28880.0, 0.4126),
            trace("job_type", "Eval", 2, 10800.0, 0.1543),
            trace("state", "FAILED", 4, 40488.0, 0.5784),
            // 21544 + 1200 + 1520.
            trace("state", "COMPLETED", 3, 24264.0, 0.3466),
            trace("state", "CANCELLED", 1, 5248.0, 0.075),
        ]),
    );
    // failure_share.sql folds the states the same way, over the same eight
    // GPU jobs.
    let failure = |category: &str, jobs: u64, job_share: f64, gpu_share: f64| {
        json!({"grouping": "state", "category": category, "jobs": jobs,
               "job_share_pct": job_share, "gpu_time_share_pct": gpu_share})
    };
    assert_rows(
        "failure_share on the AcmeTrace excerpts",
        query_store(&store, "failure_share.sql", ""),
        json!([
            failure("FAILED", 4, 50.0, 57.84),
            failure("COMPLETED", 3, 37.5, 34.66),
            failure("CANCELLED", 1, 12.5, 7.5),
        ]),
    );
}
