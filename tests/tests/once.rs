//! `gputel-agent --once`: one JSON snapshot, with and without GPUs.

use std::process::Command;

use gputel_tests::{SCENARIO_ENV, agent_bin, fake_nvml, fixture, workspace_root};
use serde_json::{Value, json};

fn once(nvml_lib: &std::path::Path, scenario: Option<&std::path::Path>) -> Value {
    once_with(nvml_lib, scenario, &[])
}

/// `--once` with `args` added to the usual flags.
fn once_with(
    nvml_lib: &std::path::Path,
    scenario: Option<&std::path::Path>,
    args: &[&str],
) -> Value {
    let mut cmd = Command::new(agent_bin());
    cmd.args(["--once", "--node", "gpu-node-017", "--interval", "50ms"])
        .arg("--nvml-lib")
        .arg(nvml_lib)
        .arg("--procfs-root")
        .arg(fixture("proc"))
        .arg("--sysfs-root")
        .arg(fixture("sys"))
        .args(args)
        .env_remove(SCENARIO_ENV);
    if let Some(scenario) = scenario {
        cmd.env(SCENARIO_ENV, scenario);
    }
    let out = cmd.output().expect("run gputel-agent");
    assert!(
        out.status.success(),
        "gputel-agent --once failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("--once prints JSON")
}

const GPU_FIELDS: [&str; 15] = [
    "ts_us",
    "gpu",
    "uuid",
    "model",
    "temperature_c",
    "memory_temperature_c",
    "power_mw",
    "energy_mj",
    "sm_clock_mhz",
    "memory_clock_mhz",
    "gpu_util_pct",
    "memory_copy_util_pct",
    "fb_used_bytes",
    "fb_free_bytes",
    "fb_total_bytes",
];

#[test]
fn the_default_fake_presents_eight_h100s_with_every_field() {
    let snap = once(&gputel_tests::fake_nvml(), None);
    assert_eq!(
        snap["gpu_status"],
        json!({"available": true, "driver_version": "550.54.15", "reason": null})
    );
    let gpus = snap["gpus"].as_array().expect("gpus array");
    assert_eq!(gpus.len(), 8);
    for (i, gpu) in gpus.iter().enumerate() {
        let fields = gpu.as_object().expect("object");
        for field in GPU_FIELDS {
            assert!(!fields[field].is_null(), "GPU {i}: {field} is null");
        }
        // Every other field too, but for retired pages (H100s remap rows
        // instead), the job and pod (the built-in GPUs run nothing, and
        // there is no kubelet: the labels are an empty map), the MIG device
        // fields (MIG is disabled) and the fan (SXM boards have none).
        assert_eq!(fields.len(), 63, "{gpu}");
        assert_eq!(gpu["pod_labels"], json!({}));
        for (field, value) in fields {
            let absent = field.starts_with("retired_pages_")
                || [
                    "job_id",
                    "pod_uid",
                    "pod_namespace",
                    "pod_name",
                    "container",
                    "fan_speed_pct",
                ]
                .contains(&field.as_str())
                || [
                    "gpu_instance_id",
                    "compute_instance_id",
                    "mig_profile",
                    "mig_uuid",
                ]
                .contains(&field.as_str());
            assert_eq!(value.is_null(), absent, "GPU {i}: {field} = {value}");
        }
        assert_eq!(gpu["job_count"], json!(0));
        assert_eq!(gpu["mig_mode"], json!(false));
        assert_eq!(gpu["pcie_link_gen"], json!(5));
        assert_eq!(gpu["pcie_link_width_max"], json!(16));
        assert_eq!(gpu["performance_state"], json!(0));
        // H100s: GPM, read a second time by --once, so it has values.
        assert_eq!(gpu["profiling_source"], json!("gpm"));
        assert_eq!(gpu["gpu"], json!(i));
        assert_eq!(gpu["model"], json!("NVIDIA H100 80GB HBM3"));
        assert_eq!(
            gpu["uuid"],
            json!(format!("GPU-0000000{i:x}-fake-4000-8000-00000000000{i:x}"))
        );
        assert_eq!(gpu["fb_total_bytes"], json!(85_520_809_984_u64));
        assert_eq!(gpu["fb_reserved_bytes"], json!(566_231_040));
        // The HGX H100 board's bus numbers, in index order.
        let bus = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb][i];
        assert_eq!(gpu["pci_bus_id"], json!(format!("00000000:{bus:02X}:00.0")));
        assert_eq!(
            (&gpu["enc_util_pct"], &gpu["dec_util_pct"]),
            (&json!(0), &json!(0))
        );
        let used = gpu["fb_used_bytes"].as_u64().unwrap();
        let free = gpu["fb_free_bytes"].as_u64().unwrap();
        // free = total - reserved (540 MiB in the built-in scenario) - used
        assert_eq!(used + free, 85_520_809_984 - 566_231_040);
        assert_eq!(gpu["ts_us"], snap["ts_us"]);
    }
    // Host and InfiniBand from the fixture trees.
    assert_eq!(snap["node"], json!("gpu-node-017"));
    assert_eq!(snap["host"]["cpu_count"], json!(8));
    assert_eq!(snap["host"]["memory_total_kib"], json!(2_113_389_424_u64));
    assert_eq!(snap["host"]["load1"], json!(23.41));
    let ports = snap["ib_ports"].as_array().expect("ib_ports array");
    assert_eq!(ports.len(), 4);
    assert_eq!(ports[0]["device"], json!("mlx5_0"));
    assert_eq!(ports[0]["rcv_bytes"], json!(4 * 1_984_460_973_326_841_u64));
    assert_eq!(ports[0]["state"], json!("ACTIVE"));
    assert_eq!(ports[0]["rate_gbps"], json!(400.0));
    assert_eq!(snap["errors"], json!([]));
}

#[test]
fn a_scenario_sets_exact_values_and_unsupported_metrics_are_null() {
    let scenario = workspace_root().join("tests/fake-nvml/scenarios/two-gpus.toml");
    let snap = once(&fake_nvml(), Some(&scenario));
    let gpus = snap["gpus"].as_array().expect("gpus array");
    assert_eq!(gpus.len(), 2);
    let h100 = &gpus[0];
    assert_eq!(
        h100["uuid"],
        json!("GPU-3f5b2c1e-8a4d-4e6f-9b7a-1c2d3e4f5a6b")
    );
    assert_eq!(h100["temperature_c"], json!(62));
    assert_eq!(h100["memory_temperature_c"], json!(70));
    assert_eq!(h100["power_mw"], json!(512_000));
    assert_eq!(h100["sm_clock_mhz"], json!(1980));
    assert_eq!(h100["memory_clock_mhz"], json!(2619));
    assert_eq!(h100["gpu_util_pct"], json!(97));
    assert_eq!(h100["memory_copy_util_pct"], json!(41));
    assert_eq!(h100["fb_used_bytes"], json!(42_949_672_960_u64));
    assert_eq!(
        h100["fb_free_bytes"],
        json!(85_520_809_984_u64 - 566_231_040 - 42_949_672_960)
    );
    // 1e6 mJ at init, then 512 J per second of the snapshot's 50 ms gap and start-up.
    let energy = h100["energy_mj"].as_u64().unwrap();
    assert!(
        (1_000_000..1_000_000 + 512_000).contains(&energy),
        "{energy}"
    );
    let a100 = &gpus[1];
    assert_eq!(a100["model"], json!("NVIDIA A100-SXM4-80GB"));
    assert_eq!(a100["memory_temperature_c"], json!(null));
    assert_eq!(a100["temperature_c"], json!(34));
    // Not supported is a normal state, not an error.
    assert_eq!(snap["errors"], json!([]));
}

#[test]
fn without_a_driver_the_host_is_still_sampled() {
    let snap = once(std::path::Path::new("/nonexistent/libnvidia-ml.so.1"), None);
    assert_eq!(snap["gpu_status"]["available"], json!(false));
    let reason = snap["gpu_status"]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(
            "GPUs are unavailable: NVIDIA driver library /nonexistent/libnvidia-ml.so.1 could not be loaded"
        ),
        "{reason}"
    );
    assert_eq!(snap["gpus"], json!([]));
    assert_eq!(snap["host"]["memory_total_kib"], json!(2_113_389_424_u64));
    assert_eq!(snap["ib_ports"].as_array().map(Vec::len), Some(4));
}

#[test]
fn a_driver_that_is_not_running_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("down.toml");
    std::fs::write(&scenario, "init_error = \"driver_not_loaded\"\n").unwrap();
    let snap = once(&fake_nvml(), Some(&scenario));
    assert_eq!(snap["gpu_status"]["available"], json!(false));
    let reason = snap["gpu_status"]["reason"].as_str().unwrap();
    assert!(
        reason.ends_with("is loaded but the driver is not running"),
        "{reason}"
    );
}

#[test]
fn a_source_left_out_of_sources_is_not_read() {
    // Without gpu, NVML is not even loaded: a missing library is no error.
    let host_only = once_with(
        std::path::Path::new("/nonexistent/libnvidia-ml.so.1"),
        None,
        &["--sources", "node"],
    );
    assert_eq!(
        host_only["gpu_status"],
        json!({
            "available": false,
            "driver_version": null,
            "reason": "GPUs are not sampled: gpu is not among the configured sources"
        })
    );
    assert_eq!(host_only["gpus"], json!([]));
    assert_eq!(host_only["ib_ports"], json!([]));
    assert_eq!(
        host_only["host"]["memory_total_kib"],
        json!(2_113_389_424_u64)
    );
    assert_eq!(host_only["errors"], json!([]));

    let without_host = once_with(&fake_nvml(), None, &["--sources", "ib,gpu"]);
    assert_eq!(without_host["gpu_status"]["available"], json!(true));
    assert_eq!(without_host["gpus"].as_array().map(Vec::len), Some(8));
    assert_eq!(without_host["host"], json!(null));
    assert_eq!(without_host["ib_ports"].as_array().map(Vec::len), Some(4));
}

#[test]
fn an_unknown_source_is_refused_with_the_known_ones() {
    let out = Command::new(agent_bin())
        .args(["--once", "--node", "n", "--sources", "gpu,nvlink"])
        .output()
        .expect("run gputel-agent");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("invalid value 'nvlink' for '--sources <SOURCES>'")
            && stderr.contains("[possible values: gpu, node, ib]"),
        "{stderr}"
    );
}
