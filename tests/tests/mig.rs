//! MIG end to end: an A100 split into two MIG devices, each running a
//! process of its own Slurm job (fixture processes 4242 on cgroup v2 and
//! 5151 on cgroup v1), beside an H100 without MIG. Every MIG device gets a
//! row with its own memory and job, the A100 a row with its power, and the
//! per-job and per-node sums come out right in DuckDB.

use gputel_tests::{SCENARIO_ENV, duckdb, fixture_agent, run_scenario_pipeline, table_scan};
use serde_json::{Value, json};

const GIB: u64 = 1 << 30;
/// 19968 MiB, a 3g.20gb instance of an A100-SXM4-40GB.
const MIG_TOTAL: u64 = 19968 << 20;

const SCENARIO: &str = r#"
[[gpu]]
name = "NVIDIA A100-SXM4-40GB"
uuid = "GPU-a100a100-0000-4000-8000-000000000000"
fb_total_bytes = 42949672960
power_mw = 250000
temperature_c = 45
gpm = false
mig_mode = 1
xid_events = [{ at_ms = 0, xid = 31, gpu_instance_id = 2, compute_instance_id = 0 }]

[[gpu.mig]]
gpu_instance_id = 1
profile = "3g.20gb"
uuid = "MIG-11111111-2222-5333-8444-555555555555"
fb_total_bytes = 20937965568
fb_used_bytes = 8589934592
processes = [{ pid = 4242, used_memory_bytes = 8589934592 }]

[[gpu.mig]]
gpu_instance_id = 2
profile = "3g.20gb"
uuid = "MIG-66666666-7777-5888-8999-aaaaaaaaaaaa"
fb_total_bytes = 20937965568
fb_used_bytes = 4294967296
processes = [{ pid = 5151, used_memory_bytes = 4294967296 }]

[[gpu]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-4100b100-0000-4000-8000-000000000001"
power_mw = 500000
fb_used_bytes = 1073741824
processes = [{ pid = 7171, used_memory_bytes = 1073741824 }]
"#;

const TICKS: u64 = 6;

fn values(rows: Vec<serde_json::Map<String, Value>>) -> Vec<Value> {
    rows.into_iter().map(Value::Object).collect()
}

#[test]
fn mig_devices_are_rows_with_their_own_memory_and_job() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // MIG mode is a slow read; read at every tick here, it is on every row.
    let store = run_scenario_pipeline(
        tmp.path(),
        SCENARIO,
        TICKS,
        &["--slow-read-interval", "100ms"],
    );
    let gpus = table_scan(&store, "gpu");
    let rows = values(duckdb(
        tmp.path(),
        &format!(
            "select gpu, gpu_instance_id as gi, compute_instance_id as ci, mig_profile, mig_uuid, \
             mig_mode, uuid, job_id, job_count, power_mw, temperature_c, fb_used_bytes, \
             fb_free_bytes, fb_total_bytes, gpu_util_pct, count(*) as ticks \
             from {gpus} group by all order by gpu, gi nulls first"
        ),
    ));
    let t = TICKS;
    let a100 = "GPU-a100a100-0000-4000-8000-000000000000";
    assert_eq!(
        rows,
        [
            // The A100 itself: power and temperature, no framebuffer (its MIG
            // devices have it), no utilization (NVML has none in MIG mode),
            // and both jobs: shared, so no job_id.
            json!({"gpu": 0, "gi": null, "ci": null, "mig_profile": null, "mig_uuid": null,
                   "mig_mode": true, "uuid": a100, "job_id": null, "job_count": 2,
                   "power_mw": 250_000, "temperature_c": 45, "fb_used_bytes": null,
                   "fb_free_bytes": null, "fb_total_bytes": null, "gpu_util_pct": null, "ticks": t}),
            json!({"gpu": 0, "gi": 1, "ci": 0, "mig_profile": "3g.20gb",
                   "mig_uuid": "MIG-11111111-2222-5333-8444-555555555555", "mig_mode": null,
                   "uuid": a100, "job_id": "4242", "job_count": 1, "power_mw": null,
                   "temperature_c": null, "fb_used_bytes": 8 * GIB,
                   "fb_free_bytes": MIG_TOTAL - 8 * GIB, "fb_total_bytes": MIG_TOTAL,
                   "gpu_util_pct": null, "ticks": t}),
            json!({"gpu": 0, "gi": 2, "ci": 0, "mig_profile": "3g.20gb",
                   "mig_uuid": "MIG-66666666-7777-5888-8999-aaaaaaaaaaaa", "mig_mode": null,
                   "uuid": a100, "job_id": "5151", "job_count": 1, "power_mw": null,
                   "temperature_c": null, "fb_used_bytes": 4 * GIB,
                   "fb_free_bytes": MIG_TOTAL - 4 * GIB, "fb_total_bytes": MIG_TOTAL,
                   "gpu_util_pct": null, "ticks": t}),
            json!({"gpu": 1, "gi": null, "ci": null, "mig_profile": null, "mig_uuid": null,
                   "mig_mode": false, "uuid": "GPU-4100b100-0000-4000-8000-000000000001",
                   "job_id": "7171", "job_count": 1, "power_mw": 500_000, "temperature_c": 40,
                   "fb_used_bytes": GIB, "fb_free_bytes": 85_520_809_984 - GIB,
                   "fb_total_bytes": 85_520_809_984_u64, "gpu_util_pct": 0, "ticks": t}),
        ]
    );

    // Power is counted once per GPU: the node draws 750 W at every tick.
    let node_power = values(duckdb(
        tmp.path(),
        &format!(
            "select sum(power_mw)::bigint as w, count(*) as rows from {gpus} group by ts \
             order by ts limit 1"
        ),
    ));
    assert_eq!(node_power, [json!({"w": 750_000, "rows": 4})]);

    // Per job: the framebuffer it holds and its samples, MIG devices and
    // whole GPUs alike.
    let per_job = values(duckdb(
        tmp.path(),
        &format!(
            "select job_id, count(*) as samples, max(fb_used_bytes) as fb_used, \
             list(distinct gpu_instance_id) as instances \
             from {gpus} where job_id is not null group by job_id order by job_id"
        ),
    ));
    assert_eq!(
        per_job,
        [
            json!({"job_id": "4242", "samples": t, "fb_used": 8 * GIB, "instances": [1]}),
            json!({"job_id": "5151", "samples": t, "fb_used": 4 * GIB, "instances": [2]}),
            json!({"job_id": "7171", "samples": t, "fb_used": GIB, "instances": [null]}),
        ]
    );

    // Each process is on its MIG device, with its job.
    let processes = values(duckdb(
        tmp.path(),
        &format!(
            "select distinct gpu, gpu_instance_id as gi, compute_instance_id as ci, pid, \
             used_memory_bytes, job_id from {} order by gpu, pid",
            table_scan(&store, "gpu_process")
        ),
    ));
    assert_eq!(
        processes,
        [
            json!({"gpu": 0, "gi": 1, "ci": 0, "pid": 4242, "used_memory_bytes": 8 * GIB, "job_id": "4242"}),
            json!({"gpu": 0, "gi": 2, "ci": 0, "pid": 5151, "used_memory_bytes": 4 * GIB, "job_id": "5151"}),
            json!({"gpu": 1, "gi": null, "ci": null, "pid": 7171, "used_memory_bytes": GIB, "job_id": "7171"}),
        ]
    );

    // The XID NVML attributed to GPU instance 2 carries it and its job, and
    // is counted on that MIG device's row only.
    let events = values(duckdb(
        tmp.path(),
        &format!(
            "select gpu, gpu_instance_id as gi, compute_instance_id as ci, kind, code, job_id \
             from {}",
            table_scan(&store, "event")
        ),
    ));
    assert_eq!(
        events,
        [json!({"gpu": 0, "gi": 2, "ci": 0, "kind": "xid", "code": 31, "job_id": "5151"})]
    );
    let xids = values(duckdb(
        tmp.path(),
        &format!(
            "select gpu, gpu_instance_id as gi, sum(xid_count)::integer as xids from {gpus} \
             group by all order by gpu, gi nulls first"
        ),
    ));
    assert_eq!(
        xids,
        [
            json!({"gpu": 0, "gi": null, "xids": 0}),
            json!({"gpu": 0, "gi": 1, "xids": 0}),
            json!({"gpu": 0, "gi": 2, "xids": 1}),
            json!({"gpu": 1, "gi": null, "xids": 0}),
        ]
    );
}

/// The HPC job-mapping file `<gpu>.<GPU instance id>` (dcgm-exporter's name
/// for a MIG device's) names that device's job, over its processes'.
#[test]
fn the_mapping_file_of_a_mig_device_names_its_job() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("scenario.toml");
    std::fs::write(&path, SCENARIO).expect("write scenario");
    let mapping = tmp.path().join("mapping");
    std::fs::create_dir(&mapping).expect("mkdir");
    std::fs::write(mapping.join("0.2"), "8080\n").expect("write mapping");
    let out = fixture_agent("gpu-node-017")
        .args(["--once", "--interval", "50ms", "--hpc-job-mapping-dir"])
        .arg(&mapping)
        .env(SCENARIO_ENV, &path)
        .output()
        .expect("run gputel-agent");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snap: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let jobs: Vec<Value> = snap["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|g| json!([g["gpu"], g["gpu_instance_id"], g["job_id"], g["job_count"]]))
        .collect();
    assert_eq!(
        jobs,
        [
            json!([0, null, null, 2]),
            json!([0, 1, "4242", 1]),
            json!([0, 2, "8080", 1]),
            json!([1, null, "7171", 1]),
        ]
    );
    assert_eq!(snap["host"]["jobs"], json!(["4242", "7171", "8080"]));
    assert_eq!(snap["errors"], json!([]));
}
