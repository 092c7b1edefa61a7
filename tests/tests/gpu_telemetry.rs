//! Complete GPU telemetry through the fake NVML: every metric family with
//! exact values, GPM absent on older GPUs, XID events, a GPU falling off the
//! bus, throttling episodes and compute processes, end to end into Parquet.

use gputel_tests::{
    SCENARIO_ENV, duckdb, duckdb_value, fixture_agent, run_scenario_pipeline, table_scan,
};
use serde_json::{Value, json};

fn once_with(scenario: &str) -> Value {
    once_with_args(scenario, &[])
}

fn once_with_args(scenario: &str, args: &[&str]) -> Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("scenario.toml");
    std::fs::write(&path, scenario).expect("write scenario");
    let out = fixture_agent("gpu-node-017")
        .args(["--once", "--interval", "200ms"])
        .args(args)
        .env(SCENARIO_ENV, &path)
        .output()
        .expect("run gputel-agent");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("--once prints JSON")
}

const ONE_H100: &str = r#"
[[gpu]]
name = "NVIDIA H100 80GB HBM3"
pci_bus_id = "00000000:9A:00.0"
enc_util_pct = 4
dec_util_pct = 62
fb_reserved_bytes = 566231040
temperature_c = 71
power_mw = 650000
power_limit_mw = 700000
sm_active_pct = 87.5
sm_occupancy_pct = 42.25
tensor_active_pct = 61.0
dram_active_pct = 33.5
graphics_active_pct = 91.0
clock_event_reasons = 36
ecc_sbe_volatile = 12
ecc_dbe_volatile = 1
ecc_sbe_aggregate = 340
ecc_dbe_aggregate = 2
remapped_rows_corrected = 5
remapped_rows_uncorrected = 1
remapped_rows_pending = 1
remapped_rows_failure = 0
pcie_replay_count = 17
pcie_tx_bytes_per_s = 2000000000
pcie_rx_bytes_per_s = 1000000000
nvlink_tx_bytes_per_s = 40000000000
nvlink_rx_bytes_per_s = 30000000000
"#;

fn assert_near(value: &Value, want: f64, what: &str) {
    let v = value
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: {value} is not a number"));
    assert!(
        (v - want).abs() <= want * 0.05,
        "{what}: {v} is not within 5% of {want}"
    );
}

#[test]
fn every_metric_family_reads_exactly() {
    let snap = once_with(ONE_H100);
    let gpu = &snap["gpus"][0];
    for (field, want) in [
        ("temperature_c", json!(71)),
        ("power_mw", json!(650_000)),
        ("power_limit_mw", json!(700_000)),
        ("sm_active_pct", json!(87.5)),
        ("sm_occupancy_pct", json!(42.25)),
        ("tensor_active_pct", json!(61.0)),
        ("dram_active_pct", json!(33.5)),
        ("gr_engine_active_pct", json!(91.0)),
        ("profiling_source", json!("gpm")),
        ("clock_event_reasons", json!(36)),
        ("ecc_corrected_volatile", json!(12)),
        ("ecc_uncorrected_volatile", json!(1)),
        ("ecc_corrected_aggregate", json!(340)),
        ("ecc_uncorrected_aggregate", json!(2)),
        ("remapped_rows_corrected", json!(5)),
        ("remapped_rows_uncorrected", json!(1)),
        ("remapped_rows_pending", json!(true)),
        ("remapped_rows_failure", json!(false)),
        ("pcie_replay_count", json!(17)),
        // H100s remap rows; they do not retire pages.
        ("retired_pages_sbe", json!(null)),
        ("retired_pages_dbe", json!(null)),
        ("retired_pages_pending", json!(null)),
        ("xid_count", json!(0)),
        ("pci_bus_id", json!("00000000:9A:00.0")),
        ("enc_util_pct", json!(4)),
        ("dec_util_pct", json!(62)),
        ("fb_reserved_bytes", json!(566_231_040)),
    ] {
        assert_eq!(gpu[field], want, "{field}");
    }
    // Rates come from NVML's counters between the two readings of --once,
    // taken a few milliseconds off the tick times: near, not exact.
    assert_near(&gpu["pcie_tx_bytes_per_s"], 2e9, "pcie_tx_bytes_per_s");
    assert_near(&gpu["pcie_rx_bytes_per_s"], 1e9, "pcie_rx_bytes_per_s");
    assert_near(&gpu["nvlink_tx_bytes_per_s"], 4e10, "nvlink_tx_bytes_per_s");
    assert_near(&gpu["nvlink_rx_bytes_per_s"], 3e10, "nvlink_rx_bytes_per_s");
    // The energy counter integrates 650 W; its rate is the average power.
    assert_near(&gpu["power_avg_mw"], 650_000.0, "power_avg_mw");
    assert_eq!(snap["errors"], json!([]));
}

#[test]
fn without_gpm_or_dcgm_the_activity_columns_are_null_not_zero() {
    // No DCGM on this node (tests/tests/dcgm.rs has it).
    let snap = once_with_args(
        r#"
[[gpu]]
name = "NVIDIA A100-SXM4-80GB"
gpm = false
sm_active_pct = 50.0
"#,
        &["--dcgm-lib", "/nonexistent/libdcgm.so.4"],
    );
    let gpu = &snap["gpus"][0];
    for field in [
        "sm_active_pct",
        "sm_occupancy_pct",
        "tensor_active_pct",
        "dram_active_pct",
        "gr_engine_active_pct",
        "profiling_source",
    ] {
        assert_eq!(gpu[field], json!(null), "{field}");
    }
    assert_eq!(gpu["temperature_c"], json!(40));
    assert_eq!(snap["errors"], json!([]));
}

#[test]
fn xids_lost_gpus_throttling_and_processes_land_in_their_tables() {
    let dir = tempfile::tempdir().unwrap();
    let store = run_scenario_pipeline(
        dir.path(),
        r#"
step_ms = 400

[[gpu]]
count = 3

[[gpu]]
xid_events = [{ at_ms = 300, xid = 79 }, { at_ms = 300, xid = 999 }, { at_ms = 300, xid = 79 }]
processes = [{ pid = 4242, used_memory_bytes = 1073741824 }]

[[gpu]]
lost_at_ms = 600

[[gpu]]
clock_event_reasons = [0, 32, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]

[[gpu]]
count = 2
"#,
        20,
        &["--process-interval", "1h"],
    );
    let events = table_scan(&store, "event");
    let rows = duckdb(
        dir.path(),
        &format!("select gpu, kind, code from {events} order by gpu, kind, code"),
    );
    let rows: Vec<Value> = rows.into_iter().map(Value::Object).collect();
    assert_eq!(
        rows,
        [
            json!({"gpu": 3, "kind": "xid", "code": 79}),
            json!({"gpu": 3, "kind": "xid", "code": 79}),
            // A code nvml-wrapper's enum does not know keeps its number.
            json!({"gpu": 3, "kind": "xid", "code": 999}),
            json!({"gpu": 4, "kind": "gpu_lost", "code": 0}),
            json!({"gpu": 5, "kind": "thermal_throttle", "code": 32}),
        ]
    );
    let gpus = table_scan(&store, "gpu");
    // Each XID is counted once, on its GPU's row.
    assert_eq!(
        duckdb_value(
            dir.path(),
            &format!("select sum(xid_count)::integer from {gpus} where gpu = 3")
        ),
        json!(3)
    );
    // The lost GPU stops reporting; the others report every tick.
    let per_gpu = duckdb(
        dir.path(),
        &format!("select gpu, count(*) as n from {gpus} group by gpu order by gpu"),
    );
    for row in &per_gpu {
        let (gpu, n) = (row["gpu"].as_i64().unwrap(), row["n"].as_i64().unwrap());
        if gpu == 4 {
            assert!((1..20).contains(&n), "lost GPU reported {n} ticks");
        } else {
            assert_eq!(n, 20, "GPU {gpu}");
        }
    }
    assert_eq!(per_gpu.len(), 8);
    // Processes are listed at the first tick, then every --process-interval
    // (an hour here): once, with /proc's name for the pid.
    let processes = duckdb(
        dir.path(),
        &format!(
            "select gpu, pid, used_memory_bytes, command from {}",
            table_scan(&store, "gpu_process")
        ),
    );
    assert_eq!(
        Value::Array(processes.into_iter().map(Value::Object).collect()),
        json!([{"gpu": 3, "pid": 4242, "used_memory_bytes": 1073741824, "command": "python"}])
    );
}
