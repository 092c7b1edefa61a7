//! Job alignment end to end: processes in Slurm cgroup v1 and v2 and in
//! Kubernetes pods, put on GPUs by the fake NVML, give every GPU row its
//! job through the whole pipeline; the HPC job-mapping directory wins.

use gputel_tests::{duckdb, duckdb_value, fixture_agent, run_scenario_pipeline, table_scan};
use serde_json::{Value, json};

/// GPU k runs the fixture process of the k-th row below; GPU 5 is shared by
/// two jobs, GPU 6 runs a process that ended before /proc was read, GPU 7 is idle.
const SCENARIO: &str = r#"
[[gpu]]
processes = [{ pid = 4242, used_memory_bytes = 1000 }]
[[gpu]]
processes = [{ pid = 5151, used_memory_bytes = 2000 }]
[[gpu]]
processes = [{ pid = 6161, used_memory_bytes = 3000 }]
[[gpu]]
processes = [{ pid = 6262, used_memory_bytes = 4000 }]
[[gpu]]
processes = [{ pid = 7171, used_memory_bytes = 5000 }]
[[gpu]]
processes = [{ pid = 4242, used_memory_bytes = 6000 }, { pid = 5151, used_memory_bytes = 7000 }]
[[gpu]]
processes = [{ pid = 999999, used_memory_bytes = 8000 }]
[[gpu]]
xid_events = [{ at_ms = 0, xid = 13 }]
"#;

const TICKS: u64 = 12;

#[test]
fn every_gpu_row_carries_the_job_that_owns_the_gpu() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = run_scenario_pipeline(tmp.path(), SCENARIO, TICKS, &[]);

    let gpus = table_scan(&store, "gpu");
    let rows = duckdb(
        tmp.path(),
        &format!(
            "select gpu, job_id, pod_uid, job_count, count(*) as ticks from {gpus} \
             group by all order by gpu"
        ),
    );
    let rows: Vec<Value> = rows.into_iter().map(Value::Object).collect();
    let t = TICKS;
    assert_eq!(
        rows,
        [
            json!({"gpu": 0, "job_id": "4242", "pod_uid": null, "job_count": 1, "ticks": t}),
            json!({"gpu": 1, "job_id": "5151", "pod_uid": null, "job_count": 1, "ticks": t}),
            json!({"gpu": 2, "job_id": null, "pod_uid": "8f3c2a1e-4b5d-4c6e-9f70-123456789abc", "job_count": 0, "ticks": t}),
            json!({"gpu": 3, "job_id": null, "pod_uid": "5e6f7a8b-1c2d-4e3f-8a9b-0c1d2e3f4a5b", "job_count": 0, "ticks": t}),
            json!({"gpu": 4, "job_id": "7171", "pod_uid": null, "job_count": 1, "ticks": t}),
            json!({"gpu": 5, "job_id": null, "pod_uid": null, "job_count": 2, "ticks": t}),
            json!({"gpu": 6, "job_id": null, "pod_uid": null, "job_count": 0, "ticks": t}),
            json!({"gpu": 7, "job_id": null, "pod_uid": null, "job_count": 0, "ticks": t}),
        ]
    );
    // The processes name their own jobs, the shared GPU's included.
    let processes = duckdb(
        tmp.path(),
        &format!(
            "select distinct gpu, pid, job_id, command from {} order by gpu, pid",
            table_scan(&store, "gpu_process")
        ),
    );
    let processes: Vec<Value> = processes.into_iter().map(Value::Object).collect();
    assert_eq!(
        processes,
        [
            json!({"gpu": 0, "pid": 4242, "job_id": "4242", "command": "python"}),
            json!({"gpu": 1, "pid": 5151, "job_id": "5151", "command": "python3"}),
            json!({"gpu": 2, "pid": 6161, "job_id": null, "command": "torchrun"}),
            json!({"gpu": 3, "pid": 6262, "job_id": null, "command": "python"}),
            json!({"gpu": 4, "pid": 7171, "job_id": "7171", "command": "python"}),
            json!({"gpu": 5, "pid": 4242, "job_id": "4242", "command": "python"}),
            json!({"gpu": 5, "pid": 5151, "job_id": "5151", "command": "python3"}),
            json!({"gpu": 6, "pid": 999999, "job_id": null, "command": ""}),
        ]
    );
    // Every node row lists the node's jobs.
    assert_eq!(
        duckdb_value(
            tmp.path(),
            &format!(
                "select list_distinct(flatten(list(jobs))) from {}",
                table_scan(&store, "node")
            )
        )
        .as_array()
        .map(|jobs| {
            let mut jobs: Vec<_> = jobs.iter().filter_map(Value::as_str).collect();
            jobs.sort_unstable();
            jobs.join(",")
        }),
        Some("4242,5151,7171".to_owned())
    );
    // What the collector observed of each job: its GPUs and samples.
    let observed = duckdb(
        tmp.path(),
        &format!(
            "select job_id, list(distinct gpu order by gpu) as gpus, sum(samples)::integer as samples \
             from {} group by job_id order by job_id",
            table_scan(&store, "job")
        ),
    );
    let observed: Vec<Value> = observed.into_iter().map(Value::Object).collect();
    assert_eq!(
        observed,
        [
            json!({"job_id": "4242", "gpus": [0], "samples": t}),
            json!({"job_id": "5151", "gpus": [1], "samples": t}),
            json!({"job_id": "7171", "gpus": [4], "samples": t}),
        ]
    );
    // An XID on an idle GPU has no job.
    assert_eq!(
        duckdb_value(
            tmp.path(),
            &format!(
                "select count(*) from {} where kind = 'xid' and gpu = 7 and job_id is null",
                table_scan(&store, "event")
            )
        ),
        json!(1)
    );
}

#[test]
fn the_job_mapping_directory_names_the_job_in_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mapping = tmp.path().join("mapping");
    std::fs::create_dir(&mapping).expect("mkdir");
    std::fs::write(mapping.join("0"), "4242\n").expect("write mapping");
    let out = fixture_agent("gpu-node-017")
        .args(["--once", "--interval", "50ms", "--hpc-job-mapping-dir"])
        .arg(&mapping)
        .output()
        .expect("run gputel-agent");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snap: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(snap["gpus"][0]["job_id"], json!("4242"));
    assert_eq!(snap["gpus"][0]["job_count"], json!(1));
    assert_eq!(snap["gpus"][1]["job_id"], json!(null));
    assert_eq!(snap["host"]["jobs"], json!(["4242"]));
}
