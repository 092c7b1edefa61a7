//! SM activity on GPUs without GPM, through DCGM's profiling fields, end to
//! end: the real agent on the fake NVML and the fake DCGM
//! (`tests/fake-dcgm`), both driven by one scenario of A100s
//! (`tests/fake-nvml/scenarios/a100x2.toml`), through `--once` and through a
//! collector into Parquet, where the characterization queries read it. Then
//! what goes wrong on real nodes: no DCGM, no host engine, a profiler another
//! tool holds, and profiling paused for a job that profiles itself.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gputel_tests::{
    Running, SCENARIO_ENV, duckdb, duckdb_bin, fake_dcgm, fixture_agent, http_get, start_collector,
    table_scan, taking_every_tick, workspace_root,
};
use serde_json::{Value, json};

/// Two A100s: GPU 0 runs Slurm job 4242 (SM active 62.5 %, occupancy
/// 31.25 %, tensor 50 %, DRAM 37.5 %, graphics engine 75 %), GPU 1 is idle.
fn a100x2() -> PathBuf {
    workspace_root().join("tests/fake-nvml/scenarios/a100x2.toml")
}

/// GPU 0's activity in a100x2.toml, in the columns' names.
const GPU0_ACTIVITY: [(&str, f64); 5] = [
    ("sm_active_pct", 62.5),
    ("sm_occupancy_pct", 31.25),
    ("tensor_active_pct", 50.0),
    ("dram_active_pct", 37.5),
    ("gr_engine_active_pct", 75.0),
];

/// a100x2.toml with `from` replaced by `to`, written to `dir`.
fn a100x2_with(dir: &Path, from: &str, to: &str) -> PathBuf {
    let text = std::fs::read_to_string(a100x2()).expect("read a100x2.toml");
    assert!(text.contains(from), "a100x2.toml has no {from:?}");
    let path = dir.join("scenario.toml");
    std::fs::write(&path, text.replacen(from, to, 1)).expect("write scenario");
    path
}

/// `args`, with `--dcgm-lib` the fake DCGM unless they name another.
fn with_fake_dcgm(args: &[&str]) -> Vec<std::ffi::OsString> {
    let mut all: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
    if !args.contains(&"--dcgm-lib") {
        all.push("--dcgm-lib".into());
        all.push(fake_dcgm().into());
    }
    all
}

/// `--once` on `scenario` with the fake DCGM and `args`: the snapshot and
/// the agent's log lines.
fn once(scenario: &Path, args: &[&str]) -> (Value, Vec<String>) {
    let out = fixture_agent("gpu-node-017")
        .args(["--once", "--interval", "200ms", "--sources", "gpu"])
        .args(with_fake_dcgm(args))
        .env(SCENARIO_ENV, scenario)
        .output()
        .expect("run gputel-agent");
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "gputel-agent --once failed: {log}");
    let snap = serde_json::from_slice(&out.stdout).expect("--once prints JSON");
    (snap, log.lines().map(str::to_owned).collect())
}

/// Log lines at warning level.
fn warnings(log: &[String]) -> Vec<&String> {
    log.iter().filter(|l| l.contains(" WARN ")).collect()
}

/// The five activity columns and the source of one `--once` GPU.
fn activity(gpu: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for (field, _) in GPU0_ACTIVITY {
        out.insert(field.to_owned(), gpu[field].clone());
    }
    out.insert("profiling_source".into(), gpu["profiling_source"].clone());
    Value::Object(out)
}

fn gpu0_from(source: &str) -> Value {
    let mut want = serde_json::Map::new();
    for (field, v) in GPU0_ACTIVITY {
        want.insert(field.to_owned(), json!(v));
    }
    want.insert("profiling_source".into(), json!(source));
    Value::Object(want)
}

fn idle_from(source: &str) -> Value {
    let mut want = serde_json::Map::new();
    for (field, _) in GPU0_ACTIVITY {
        want.insert(field.to_owned(), json!(0.0));
    }
    want.insert("profiling_source".into(), json!(source));
    Value::Object(want)
}

fn nulls() -> Value {
    let mut want = serde_json::Map::new();
    for (field, _) in GPU0_ACTIVITY {
        want.insert(field.to_owned(), Value::Null);
    }
    want.insert("profiling_source".into(), Value::Null);
    Value::Object(want)
}

#[test]
fn an_a100_node_reads_its_activity_through_dcgm() {
    let (snap, log) = once(&a100x2(), &[]);
    let gpus = snap["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0]["model"], json!("NVIDIA A100-SXM4-80GB"));
    assert_eq!(activity(&gpus[0]), gpu0_from("dcgm"));
    assert_eq!(activity(&gpus[1]), idle_from("dcgm"));
    // The rest of the row is NVML's, as always.
    assert_eq!(gpus[0]["gpu_util_pct"], json!(96));
    assert_eq!(gpus[0]["fb_used_bytes"], json!(68_719_476_736_u64));
    assert_eq!(snap["errors"], json!([]));
    assert_eq!(warnings(&log), Vec::<&String>::new());
    let reading: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("reading SM, tensor and DRAM activity through DCGM"))
        .collect();
    assert_eq!(reading.len(), 1, "{log:#?}");
    assert!(
        reading[0].contains("gpus=[0, 1] dcgm=3.3.9 host=127.0.0.1:5555"),
        "{}",
        reading[0]
    );
}

#[test]
fn gpm_where_the_gpu_has_it_dcgm_elsewhere_or_as_the_flag_says() {
    let dir = tempfile::tempdir().expect("tempdir");
    // An H100 (GPM) beside an A100 (none); the fake DCGM reads both.
    let scenario = a100x2_with(
        dir.path(),
        "[[gpu]]\nname = \"NVIDIA A100-SXM4-80GB\"\nuuid = \"GPU-a1000001",
        "[[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\nsm_active_pct = 87.5\n\n\
         [[gpu]]\nname = \"NVIDIA A100-SXM4-80GB\"\nuuid = \"GPU-a1000001",
    );
    let sm = |snap: &Value| -> Vec<(Value, Value)> {
        snap["gpus"]
            .as_array()
            .expect("gpus")
            .iter()
            .map(|g| (g["sm_active_pct"].clone(), g["profiling_source"].clone()))
            .collect()
    };
    let (auto, log) = once(&scenario, &[]);
    assert_eq!(
        sm(&auto),
        [
            (json!(62.5), json!("dcgm")),
            (json!(87.5), json!("gpm")),
            (json!(0.0), json!("dcgm")),
        ]
    );
    assert!(
        log.iter()
            .any(|l| l.contains("through DCGM") && l.contains("gpus=[0, 2]")),
        "{log:#?}"
    );

    // dcgm: every GPU through DCGM, the H100 included.
    let (all, _) = once(&scenario, &["--profiling-source", "dcgm"]);
    assert_eq!(
        sm(&all),
        [
            (json!(62.5), json!("dcgm")),
            (json!(87.5), json!("dcgm")),
            (json!(0.0), json!("dcgm")),
        ]
    );

    // gpm: DCGM is never loaded, so even a missing library is no warning.
    let (gpm, log) = once(
        &scenario,
        &[
            "--profiling-source",
            "gpm",
            "--dcgm-lib",
            "/nonexistent/libdcgm.so.4",
        ],
    );
    assert_eq!(
        sm(&gpm),
        [
            (Value::Null, Value::Null),
            (json!(87.5), json!("gpm")),
            (Value::Null, Value::Null),
        ]
    );
    assert_eq!(warnings(&log), Vec::<&String>::new());
    assert!(
        log.iter().any(|l| l.contains(
            "no GPM on these GPUs (it needs Hopper or newer): their SM, tensor and DRAM activity stay null (--profiling-source gpm) gpus=[0, 2]"
        )),
        "{log:#?}"
    );
}

#[test]
fn a_host_engine_on_a_unix_socket_and_dcgm_embedded_in_the_agent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = a100x2_with(
        dir.path(),
        "host_engine = \"127.0.0.1:5555\"",
        "host_engine = \"unix:///run/gputel-test/hostengine.sock\"",
    );
    // Looking on TCP finds nothing: said once, in words, and null.
    let (snap, log) = once(&socket, &[]);
    assert_eq!(activity(&snap["gpus"][0]), nulls());
    let warned = warnings(&log);
    assert_eq!(warned.len(), 1, "{log:#?}");
    assert!(
        warned[0].contains(
            "SM activity, SM occupancy, tensor and DRAM activity of these GPUs are not read \
             through DCGM: cannot connect to the DCGM host engine at 127.0.0.1:5555: \
             dcgmConnect_v2 failed with DCGM_ST_CONNECTION_NOT_VALID (-21)"
        ) && warned[0].contains("is nv-hostengine running")
            && warned[0].contains("trying again every minute gpus=[0, 1]"),
        "{}",
        warned[0]
    );
    let (snap, log) = once(
        &socket,
        &["--dcgm-host", "unix:///run/gputel-test/hostengine.sock"],
    );
    assert_eq!(activity(&snap["gpus"][0]), gpu0_from("dcgm"));
    assert_eq!(warnings(&log), Vec::<&String>::new());

    // No host engine at all: DCGM embedded in the agent.
    let embedded = a100x2_with(
        dir.path(),
        "host_engine = \"127.0.0.1:5555\"",
        "host_engine = \"\"",
    );
    let (snap, log) = once(&embedded, &["--dcgm-host", "embedded"]);
    assert_eq!(activity(&snap["gpus"][0]), gpu0_from("dcgm"));
    assert!(log.iter().any(|l| l.contains("host=embedded")), "{log:#?}");
    let cannot = a100x2_with(
        dir.path(),
        "host_engine = \"127.0.0.1:5555\"",
        "embedded = false",
    );
    let (snap, log) = once(&cannot, &["--dcgm-host", "embedded"]);
    assert_eq!(activity(&snap["gpus"][0]), nulls());
    let warned = warnings(&log);
    assert_eq!(warned.len(), 1, "{log:#?}");
    assert!(
        warned[0].contains(
            "cannot start DCGM embedded in the agent: dcgmStartEmbedded_v2 failed with \
             DCGM_ST_INIT_ERROR (-7): DCGM initialization error gpus=[0, 1]"
        ),
        "{}",
        warned[0]
    );
}

#[test]
fn metrics_serves_dcgms_values_under_dcgm_exporters_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (collector, addr) = start_collector(&dir.path().join("store"), &[]);
    let mut cmd = fixture_agent("gpu-node-017");
    cmd.args(["--collector", &format!("http://{addr}")])
        .args(["--interval", "100ms", "--metrics-listen", "127.0.0.1:0"])
        .args(with_fake_dcgm(&[]))
        .env(SCENARIO_ENV, a100x2())
        .env("RUST_LOG", "info");
    let mut agent = Running::spawn(cmd);
    let metrics = agent.metrics_address();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let body = loop {
        let (status, body) = http_get(&metrics, "/metrics").expect("GET /metrics");
        assert_eq!(status, 200);
        if body.contains("DCGM_FI_PROF_SM_ACTIVE{") {
            break body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no profiling series:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // DCGM's own unit, a ratio, on GPU 0's series.
    for (name, want) in [
        ("DCGM_FI_PROF_SM_ACTIVE", "0.625"),
        ("DCGM_FI_PROF_SM_OCCUPANCY", "0.3125"),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0.5"),
        ("DCGM_FI_PROF_DRAM_ACTIVE", "0.375"),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0.75"),
    ] {
        let prefix =
            format!("{name}{{gpu=\"0\",UUID=\"GPU-a1000000-0000-4000-8000-000000000000\",");
        let line = body
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no {prefix}…:\n{body}"));
        assert_eq!(line.rsplit(' ').next(), Some(want), "{line}");
    }
    agent.terminate(Duration::from_secs(30));
    collector.terminate(Duration::from_secs(30));
}

/// Streams `ticks` ticks of 100 ms of `scenario` (the fake DCGM, `args`,
/// the fixture host) to a collector writing `<dir>/store`; returns the store and the
/// agent's log lines.
fn stream(dir: &Path, scenario: &Path, ticks: u64, args: &[&str]) -> (PathBuf, Vec<String>) {
    let store = dir.join("store");
    let (collector, addr) = start_collector(&store, &["--flush-interval", "1s"]);
    let out = fixture_agent("gpu-node-017")
        .args(["--collector", &format!("http://{addr}")])
        .args(["--interval", "100ms", "--ticks", &ticks.to_string()])
        .args(with_fake_dcgm(args))
        .env(SCENARIO_ENV, scenario)
        .output()
        .expect("run gputel-agent");
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "agent failed: {log}");
    assert!(
        collector
            .terminate(Duration::from_secs(30))
            .status
            .success(),
        "collector failed"
    );
    (store, log.lines().map(str::to_owned).collect())
}

/// Per GPU of the store: rows, rows with each activity column, their
/// minimum and maximum, and the profiling sources seen.
fn activity_by_gpu(dir: &Path, store: &Path) -> Vec<serde_json::Map<String, Value>> {
    duckdb(
        dir,
        &format!(
            "select gpu, count(*) as rows, count(sm_active_pct) as sm_rows,
                    min(sm_active_pct) as sm_min, max(sm_active_pct) as sm_max,
                    max(sm_occupancy_pct) as occupancy, max(tensor_active_pct) as tensor,
                    max(dram_active_pct) as dram, max(gr_engine_active_pct) as gr_engine,
                    string_agg(distinct profiling_source::varchar, ',') as sources,
                    count(temperature_c) as temperature_rows
             from {} group by gpu order by gpu",
            table_scan(store, "gpu")
        ),
    )
}

/// Runs `.read schemas/sql/views.sql` and `.read schemas/sql/<file>` on a
/// store as README.md does; returns the rows.
fn characterization(store: &Path, file: &str) -> Vec<Value> {
    let sql = workspace_root().join("schemas/sql");
    let out = Command::new(duckdb_bin())
        .current_dir(workspace_root())
        .arg("-json")
        .arg("-c")
        .arg(format!("SET VARIABLE store = '{}'", store.display()))
        .arg("-c")
        .arg(format!(".read {}", sql.join("views.sql").display()))
        .arg("-c")
        .arg(format!(".read {}", sql.join(file).display()))
        .output()
        .expect("run duckdb");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "duckdb on {file}: {stderr}"
    );
    serde_json::from_slice(&out.stdout).expect("duckdb prints JSON")
}

#[test]
fn an_a100_job_has_sm_activity_in_parquet_and_in_per_job_utilization() {
    const TICKS: u64 = 8;
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = a100x2();
    let (store, _) = taking_every_tick(
        TICKS,
        100,
        |attempt| {
            let run = dir.path().join(format!("run-{attempt}"));
            std::fs::create_dir_all(&run).expect("mkdir");
            stream(&run, &scenario, TICKS, &[])
        },
        |(store, _)| store.clone(),
    );
    // DCGM has a value at the first tick already (GPM needs two samples);
    // each of the ticks stands for its 0.1 s.
    assert_eq!(
        activity_by_gpu(dir.path(), &store),
        [
            json!({"gpu": 0, "rows": TICKS, "sm_rows": TICKS, "sm_min": 62.5, "sm_max": 62.5,
                   "occupancy": 31.25, "tensor": 50.0, "dram": 37.5, "gr_engine": 75.0,
                   "sources": "dcgm", "temperature_rows": TICKS}),
            json!({"gpu": 1, "rows": TICKS, "sm_rows": TICKS, "sm_min": 0.0, "sm_max": 0.0,
                   "occupancy": 0.0, "tensor": 0.0, "dram": 0.0, "gr_engine": 0.0,
                   "sources": "dcgm", "temperature_rows": TICKS}),
        ]
        .map(|v| v.as_object().cloned().expect("object"))
    );
    let rows = characterization(&store, "per_job_utilization.sql");
    let metric = |name: &str| {
        rows.iter()
            .find(|r| r["job_id"] == "4242" && r["metric"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} row for job 4242: {rows:#?}"))
    };
    assert_eq!(
        metric("sm_active_pct"),
        json!({"job_id": "4242", "gpus": 1, "metric": "sm_active_pct",
               "time_s": TICKS as f64 / 10.0, "mean": 62.5, "p50": 62.5, "p95": 62.5,
               "max": 62.5})
    );
    assert_eq!(metric("gpu_util_pct")["mean"], json!(96.0));
    assert_eq!(rows.len(), 4, "job 4242's four metrics: {rows:#?}");
}

#[test]
fn without_dcgm_the_columns_stay_null_and_it_is_said_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, log) = stream(
        dir.path(),
        &a100x2(),
        5,
        &["--dcgm-lib", "/nonexistent/libdcgm.so.4"],
    );
    let warned = warnings(&log);
    assert_eq!(warned.len(), 1, "{log:#?}");
    assert!(
        warned[0].contains(
            "SM activity, SM occupancy, tensor and DRAM activity of these GPUs are not read \
             through DCGM (they stay null): DCGM library /nonexistent/libdcgm.so.4 could not \
             be loaded ("
        ) && warned[0].contains("install DCGM"),
        "{}",
        warned[0]
    );
    for gpu in activity_by_gpu(dir.path(), &store) {
        assert_eq!(
            (&gpu["rows"], &gpu["sm_rows"], &gpu["sources"]),
            (&json!(5), &json!(0), &Value::Null),
            "{gpu:?}"
        );
        // Nothing else is lost.
        assert_eq!(gpu["temperature_rows"], json!(5), "{gpu:?}");
    }
}

#[test]
fn a_busy_profiler_is_said_once_and_the_rest_carries_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let busy = a100x2_with(
        dir.path(),
        "version = \"3.3.9\"",
        "version = \"3.3.9\"\nprofiler = \"busy\"",
    );
    let (store, log) = stream(dir.path(), &busy, 5, &[]);
    let warned = warnings(&log);
    assert_eq!(warned.len(), 1, "{log:#?}");
    assert!(
        warned[0].contains(
            "not read through DCGM: dcgmWatchFields failed with \
             DCGM_ST_PROFILING_LIBRARY_ERROR (-37)"
        ) && warned[0].contains(
            "the GPUs' profiling counters are in use by another profiler (dcgm-exporter or \
             another program with a DCGM of its own, Nsight Systems or Nsight Compute, a CUPTI tool)"
        ) && warned[0].contains("trying again every minute"),
        "{}",
        warned[0]
    );
    for gpu in activity_by_gpu(dir.path(), &store) {
        assert_eq!(
            (
                &gpu["rows"],
                &gpu["sm_rows"],
                &gpu["sources"],
                &gpu["temperature_rows"]
            ),
            (&json!(5), &json!(0), &Value::Null, &json!(5)),
            "{gpu:?}"
        );
    }
}

#[test]
fn the_pause_file_frees_the_counters_until_it_is_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pause = dir.path().join("profiling-paused");
    std::fs::write(&pause, "").expect("create the pause file");
    let store = dir.path().join("store");
    let (collector, addr) = start_collector(&store, &["--flush-interval", "1s"]);
    let mut agent = fixture_agent("gpu-node-017");
    agent
        .args(["--collector", &format!("http://{addr}")])
        .args(["--interval", "100ms", "--ticks", "30", "--sources", "gpu"])
        .arg("--dcgm-lib")
        .arg(fake_dcgm())
        .arg("--dcgm-pause-file")
        .arg(&pause)
        .env(SCENARIO_ENV, a100x2())
        .env("RUST_LOG", "info");
    let mut agent = Running::spawn(agent);
    agent.wait_for_log("DCGM profiling paused", Duration::from_secs(30));
    // A few paused ticks, then the job's profiler is done.
    std::thread::sleep(Duration::from_millis(600));
    std::fs::remove_file(&pause).expect("remove the pause file");
    agent.wait_for_log(
        "DCGM profiling resumed: the pause file is gone",
        Duration::from_secs(30),
    );
    let out = agent.wait(Duration::from_secs(60));
    assert!(out.status.success(), "agent failed");
    assert!(
        collector
            .terminate(Duration::from_secs(30))
            .status
            .success(),
        "collector failed"
    );
    let rows = duckdb(
        dir.path(),
        &format!(
            "select sm_active_pct, profiling_source::varchar as source from {}
             where gpu = 0 order by ts",
            table_scan(&store, "gpu")
        ),
    );
    assert_eq!(rows.len(), 30);
    // Null while paused, then the job's activity: never the other way round.
    let first_value = rows
        .iter()
        .position(|r| !r["sm_active_pct"].is_null())
        .expect("values after the resume");
    assert!(first_value >= 2, "paused ticks: {first_value}");
    assert!(
        first_value <= 28,
        "ticks after the resume: {}",
        30 - first_value
    );
    for (i, row) in rows.iter().enumerate() {
        let want = if i < first_value {
            json!({"sm_active_pct": null, "source": null})
        } else {
            json!({"sm_active_pct": 62.5, "source": "dcgm"})
        };
        assert_eq!(Value::Object(row.clone()), want, "tick {i}");
    }
}
