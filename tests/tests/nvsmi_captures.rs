//! Real GPUs as the agent sees them: every `nvidia-smi -q -x` capture in
//! `tests/fixtures/nvidia-smi/` goes through `nvsmi-scenario` into the fake
//! NVML, `gputel-agent --once` samples it, and every value the XML states
//! must arrive in the GPU's row in NVML's unit. The expected values are read
//! from the XML here, with lookups of this test's own, not taken from the
//! converter's output.

use std::path::Path;
use std::process::Command;

use gputel_tests::{SCENARIO_ENV, fixture, fixture_agent};
use roxmltree::{Document, Node, ParsingOptions};
use serde_json::{Value, json};

const MIB: f64 = 1_048_576.0;

fn nvsmi_scenario_bin() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .join("nvsmi-scenario");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --workspace` first",
        bin.display()
    );
    bin
}

fn child<'a, 'i>(node: Node<'a, 'i>, path: &str) -> Option<Node<'a, 'i>> {
    let mut n = node;
    for name in path.split('/') {
        n = n.children().find(|c| c.has_tag_name(name))?;
    }
    Some(n)
}

/// The number an element states (`"81559 MiB"` → 81559, `"16x"` → 16,
/// `"P0"` → 0, Yes/Enabled/Active → 1, No/Disabled/Not Active → 0); None
/// for N/A and the like, or a missing element.
fn num(node: Node<'_, '_>, path: &str) -> Option<f64> {
    let text = child(node, path)?.text()?.trim();
    match text {
        "Yes" | "Enabled" | "Active" => return Some(1.0),
        "No" | "Disabled" | "Not Active" => return Some(0.0),
        _ => {}
    }
    let word = text.split(' ').next()?;
    let word = word.strip_prefix('P').unwrap_or(word);
    let word = word.strip_suffix('x').unwrap_or(word);
    word.parse().ok()
}

/// The first of `paths` with a number.
fn first(node: Node<'_, '_>, paths: &[&str]) -> Option<f64> {
    paths.iter().find_map(|p| num(node, p))
}

/// A JSON value for an expected number: scaled and rounded, or null.
fn expect(v: Option<f64>, scale: f64) -> Value {
    v.map_or(Value::Null, |v| json!((v * scale).round() as u64))
}

/// ECC totals as NVML's total fields count them: v10's single/double bit
/// totals, or SRAM plus DRAM, corrected and uncorrected.
fn ecc(gpu: Node<'_, '_>, counter: &str) -> (Value, Value) {
    let base = format!("ecc_errors/{counter}");
    if child(gpu, &format!("{base}/single_bit")).is_some() {
        return (
            expect(num(gpu, &format!("{base}/single_bit/total")), 1.0),
            expect(num(gpu, &format!("{base}/double_bit/total")), 1.0),
        );
    }
    let total = |leaves: &[&str]| {
        let values: Vec<f64> = leaves
            .iter()
            .filter_map(|l| num(gpu, &format!("{base}/{l}")))
            .collect();
        (!values.is_empty()).then(|| values.iter().sum::<f64>())
    };
    (
        expect(total(&["sram_correctable", "dram_correctable"]), 1.0),
        expect(
            total(&[
                "sram_uncorrectable",
                "sram_uncorrectable_parity",
                "sram_uncorrectable_secded",
                "dram_uncorrectable",
            ]),
            1.0,
        ),
    )
}

/// The clock event reasons bitmask from the Active/Not Active children.
fn reasons(gpu: Node<'_, '_>) -> Value {
    let names = [
        "gpu_idle",
        "applications_clocks_setting",
        "sw_power_cap",
        "hw_slowdown",
        "sync_boost",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
        "display_clocks_setting",
    ];
    for prefix in ["clocks_event_reason", "clocks_throttle_reason"] {
        let Some(block) = child(gpu, &format!("{prefix}s")) else {
            continue;
        };
        let mut mask = 0_u64;
        for (bit, name) in names.iter().enumerate() {
            if num(block, &format!("{prefix}_{name}")) == Some(1.0) {
                mask |= 1 << bit;
            }
        }
        return json!(mask);
    }
    Value::Null
}

fn once(scenario: &Path) -> Value {
    let out = fixture_agent("gpu-node-017")
        .args(["--once", "--interval", "50ms", "--sources", "gpu"])
        .env(SCENARIO_ENV, scenario)
        .output()
        .expect("run gputel-agent");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("--once prints JSON")
}

fn check_capture(file: &Path, tmp: &Path) -> usize {
    let xml = std::fs::read_to_string(file).expect("read capture");
    let options = ParsingOptions {
        allow_dtd: true,
        ..ParsingOptions::default()
    };
    let doc = Document::parse_with_options(&xml, options).expect("capture is XML");
    let converted = Command::new(nvsmi_scenario_bin())
        .arg(file)
        .output()
        .expect("run nvsmi-scenario");
    assert!(
        converted.status.success(),
        "{}",
        String::from_utf8_lossy(&converted.stderr)
    );
    let scenario = tmp.join("scenario.toml");
    std::fs::write(&scenario, &converted.stdout).expect("write scenario");
    let snap = once(&scenario);
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("?");
    assert_eq!(snap["errors"], json!([]), "{name}");
    assert_eq!(
        snap["gpu_status"]["driver_version"],
        json!(child(doc.root_element(), "driver_version").and_then(|n| n.text())),
        "{name}"
    );
    let rows = snap["gpus"].as_array().expect("gpus");
    let gpus: Vec<Node> = doc
        .root_element()
        .children()
        .filter(|n| n.has_tag_name("gpu"))
        .collect();
    let own: Vec<&Value> = rows
        .iter()
        .filter(|r| r["gpu_instance_id"].is_null())
        .collect();
    assert_eq!(own.len(), gpus.len(), "{name}: GPU rows");
    let mut uuids = std::collections::HashSet::new();
    for (i, (gpu, row)) in gpus.iter().zip(&own).enumerate() {
        let at = format!("{name} GPU {i}");
        let text = |p: &str| child(*gpu, p).and_then(|n| n.text()).map(str::trim);
        assert_eq!(row["model"], json!(text("product_name")), "{at}: model");
        let uuid = text("uuid").expect("uuid");
        // Scrubbed captures repeat one UUID; the converter derives the rest.
        if uuids.insert(uuid) {
            assert_eq!(row["uuid"], json!(uuid), "{at}: uuid");
        }
        let migs: Vec<Node> = child(*gpu, "mig_devices")
            .map(|m| {
                m.children()
                    .filter(|c| c.has_tag_name("mig_device"))
                    .collect()
            })
            .unwrap_or_default();
        let (sbe_vol, dbe_vol) = ecc(*gpu, "volatile");
        let (sbe_agg, dbe_agg) = ecc(*gpu, "aggregate");
        let link = "pci/pci_gpu_link_info";
        let mut expected = vec![
            (
                "temperature_c",
                expect(num(*gpu, "temperature/gpu_temp"), 1.0),
            ),
            (
                "memory_temperature_c",
                expect(num(*gpu, "temperature/memory_temp"), 1.0),
            ),
            (
                "power_mw",
                expect(
                    first(
                        *gpu,
                        &[
                            "power_readings/power_draw",
                            "gpu_power_readings/power_draw",
                            "gpu_power_readings/average_power_draw",
                        ],
                    ),
                    1000.0,
                ),
            ),
            (
                "power_limit_mw",
                expect(
                    first(
                        *gpu,
                        &[
                            "power_readings/enforced_power_limit",
                            "gpu_power_readings/current_power_limit",
                        ],
                    ),
                    1000.0,
                ),
            ),
            ("sm_clock_mhz", expect(num(*gpu, "clocks/sm_clock"), 1.0)),
            (
                "memory_clock_mhz",
                expect(num(*gpu, "clocks/mem_clock"), 1.0),
            ),
            (
                "gpu_util_pct",
                expect(num(*gpu, "utilization/gpu_util"), 1.0),
            ),
            (
                "memory_copy_util_pct",
                expect(num(*gpu, "utilization/memory_util"), 1.0),
            ),
            ("ecc_corrected_volatile", sbe_vol),
            ("ecc_uncorrected_volatile", dbe_vol),
            ("ecc_corrected_aggregate", sbe_agg),
            ("ecc_uncorrected_aggregate", dbe_agg),
            (
                "retired_pages_sbe",
                expect(
                    num(
                        *gpu,
                        "retired_pages/multiple_single_bit_retirement/retired_count",
                    ),
                    1.0,
                ),
            ),
            (
                "retired_pages_dbe",
                expect(
                    num(*gpu, "retired_pages/double_bit_retirement/retired_count"),
                    1.0,
                ),
            ),
            (
                "retired_pages_pending",
                num(*gpu, "retired_pages/pending_retirement")
                    .map_or(Value::Null, |v| json!(v == 1.0)),
            ),
            (
                "remapped_rows_corrected",
                expect(num(*gpu, "remapped_rows/remapped_row_corr"), 1.0),
            ),
            (
                "remapped_rows_uncorrected",
                expect(num(*gpu, "remapped_rows/remapped_row_unc"), 1.0),
            ),
            (
                "remapped_rows_pending",
                num(*gpu, "remapped_rows/remapped_row_pending")
                    .map_or(Value::Null, |v| json!(v == 1.0)),
            ),
            (
                "remapped_rows_failure",
                num(*gpu, "remapped_rows/remapped_row_failure")
                    .map_or(Value::Null, |v| json!(v == 1.0)),
            ),
            (
                "pcie_replay_count",
                expect(num(*gpu, "pci/replay_counter"), 1.0),
            ),
            (
                "pcie_link_gen",
                expect(num(*gpu, &format!("{link}/pcie_gen/current_link_gen")), 1.0),
            ),
            (
                "pcie_link_gen_max",
                expect(num(*gpu, &format!("{link}/pcie_gen/max_link_gen")), 1.0),
            ),
            (
                "pcie_link_width",
                expect(
                    num(*gpu, &format!("{link}/link_widths/current_link_width")),
                    1.0,
                ),
            ),
            (
                "pcie_link_width_max",
                expect(
                    num(*gpu, &format!("{link}/link_widths/max_link_width")),
                    1.0,
                ),
            ),
            ("fan_speed_pct", expect(num(*gpu, "fan_speed"), 1.0)),
            (
                "performance_state",
                expect(num(*gpu, "performance_state"), 1.0),
            ),
            ("clock_event_reasons", reasons(*gpu)),
            (
                "mig_mode",
                num(*gpu, "mig_mode/current_mig").map_or(Value::Null, |v| json!(v == 1.0)),
            ),
        ];
        if migs.is_empty() {
            // MiB to bytes; a MIG-enabled GPU's memory is on its devices' rows.
            let fb = |leaf: &str| num(*gpu, &format!("fb_memory_usage/{leaf}"));
            expected.push(("fb_total_bytes", expect(fb("total"), MIB)));
            expected.push(("fb_used_bytes", expect(fb("used"), MIB)));
            expected.push(("fb_free_bytes", expect(fb("free"), MIB)));
        }
        for (column, want) in expected {
            assert_eq!(row[column], want, "{at}: {column}");
        }

        // MIG devices: one row each, with their own memory, after the GPU's.
        let index = row["gpu"].clone();
        let instances: Vec<&Value> = rows
            .iter()
            .filter(|r| r["gpu"] == index && !r["gpu_instance_id"].is_null())
            .collect();
        assert_eq!(instances.len(), migs.len(), "{at}: MIG device rows");
        for (m, r) in migs.iter().zip(instances) {
            let got = json!([
                r["gpu_instance_id"],
                r["compute_instance_id"],
                r["fb_total_bytes"],
                r["fb_used_bytes"],
                r["fb_free_bytes"],
                r["power_mw"]
            ]);
            let want = json!([
                expect(num(*m, "gpu_instance_id"), 1.0),
                expect(num(*m, "compute_instance_id"), 1.0),
                expect(num(*m, "fb_memory_usage/total"), MIB),
                expect(num(*m, "fb_memory_usage/used"), MIB),
                expect(num(*m, "fb_memory_usage/free"), MIB),
                Value::Null
            ]);
            assert_eq!(got, want, "{at}: MIG device");
        }

        // Compute processes, with NVML's memory in bytes.
        let want: Vec<Value> = child(*gpu, "processes")
            .map(|p| {
                p.children()
                    .filter(|c| c.has_tag_name("process_info"))
                    .filter(|c| {
                        child(*c, "type")
                            .and_then(|t| t.text())
                            .is_some_and(|t| t.contains('C'))
                    })
                    .map(|c| {
                        json!([
                            expect(num(c, "pid"), 1.0),
                            expect(num(c, "used_memory"), MIB)
                        ])
                    })
                    .collect()
            })
            .unwrap_or_default();
        let got: Vec<Value> = snap["gpu_processes"]
            .as_array()
            .expect("gpu_processes")
            .iter()
            .filter(|p| p["gpu"] == index)
            .map(|p| json!([p["pid"], p["used_memory_bytes"]]))
            .collect();
        assert_eq!(got, want, "{at}: processes");
    }
    gpus.len()
}

#[test]
fn every_capture_arrives_in_the_gpu_rows_in_nvml_units() {
    let dir = fixture("nvidia-smi");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("captures")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "xml"))
        .collect();
    files.sort();
    let mut gpus = Vec::new();
    for file in &files {
        let tmp = tempfile::tempdir().expect("tempdir");
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        gpus.push((name, check_capture(file, tmp.path())));
    }
    let gpus: Vec<(&str, usize)> = gpus.iter().map(|(n, c)| (n.as_str(), *c)).collect();
    assert_eq!(
        gpus,
        [
            ("a100-sxm4-40gb_570.148.08_v12.xml", 1),
            ("a100-sxm4-80gb-mig_535.54.03_v12.xml", 1),
            ("a10g_515.105.01_v11.xml", 1),
            ("h100-80gb-hbm3_580.159.04_v13.xml", 1),
            ("h100-sxm5-x8_580.105.08_v13.xml", 8),
            ("h200_580.159.04_v13.xml", 1),
            ("t4_515.105.01_v11.xml", 1),
            ("t4_595.91.07_v13.xml", 1),
            ("v100-sxm3-32gb_410.104_v10.xml", 1),
        ]
    );
}

/// Values from the captures that the test above would pass on by accident
/// if the converter dropped them: the V100's ECC errors and retired pages,
/// the MIG A100's devices, the A10G's fan and idle PCIe link.
#[test]
fn notable_capture_values_are_exact() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let row = |file: &str| {
        let out = Command::new(nvsmi_scenario_bin())
            .arg(fixture("nvidia-smi").join(file))
            .output()
            .expect("run nvsmi-scenario");
        let path = tmp.path().join(format!("{file}.toml"));
        std::fs::write(&path, out.stdout).expect("write");
        once(&path)
    };
    let v100 = row("v100-sxm3-32gb_410.104_v10.xml");
    let g = &v100["gpus"][0];
    assert_eq!(
        json!([
            g["ecc_corrected_volatile"],
            g["ecc_uncorrected_volatile"],
            g["ecc_corrected_aggregate"],
            g["ecc_uncorrected_aggregate"],
            g["retired_pages_dbe"],
            g["retired_pages_pending"],
            g["mig_mode"]
        ]),
        json!([1, 1, 291, 7627, 2, true, null])
    );
    let a10g = row("a10g_515.105.01_v11.xml");
    let g = &a10g["gpus"][0];
    assert_eq!(
        json!([
            g["fan_speed_pct"],
            g["pcie_link_gen"],
            g["pcie_link_gen_max"],
            g["pcie_link_width"]
        ]),
        json!([0, 1, 4, 8])
    );
    let mig = row("a100-sxm4-80gb-mig_535.54.03_v12.xml");
    let devices: Vec<Value> = mig["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|g| json!([g["gpu_instance_id"], g["mig_profile"], g["fb_used_bytes"]]))
        .collect();
    assert_eq!(
        devices,
        [
            json!([null, null, null]),
            json!([3, "1g.20gb", 12 << 20]),
            json!([4, "1g.20gb", 12 << 20]),
            json!([5, "1g.20gb", 12 << 20]),
            json!([6, "1g.20gb", 12 << 20]),
        ]
    );
    assert_eq!(mig["gpus"][0]["mig_mode"], json!(true));
    assert_eq!(mig["gpus"][0]["gpu_util_pct"], json!(null));
}

/// The fake against the real thing: a capture (`nvidia-smi -q -x` on a
/// real idle GPU) through the converter and the fake NVML reads as
/// `gputel-agent --once` read the real driver seconds later on the same GPU
/// (the recording's `once-idle.json`). What cannot change while a GPU idles
/// must be equal; what is measured, within what moves in a few seconds; the
/// XML's whole MiB within one MiB of NVML's bytes.
fn fake_reads_as_the_real_driver_did(capture: &str, recording: &str, model: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = Command::new(nvsmi_scenario_bin())
        .arg(fixture("nvidia-smi").join(capture))
        .output()
        .expect("run nvsmi-scenario");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let scenario = tmp.path().join("scenario.toml");
    std::fs::write(&scenario, &out.stdout).expect("write scenario");
    let fake = once(&scenario);
    let real: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture(recording).join("once-idle.json"))
            .expect("the recorded --once"),
    )
    .expect("JSON");
    assert_eq!(fake["gpu_status"]["driver_version"], json!("580.159.04"));
    assert_eq!(real["gpu_status"]["driver_version"], json!("580.159.04"));
    let (f, r) = (&fake["gpus"][0], &real["gpus"][0]);
    for field in [
        "model",
        "uuid",
        "pci_bus_id",
        "fb_total_bytes",
        "fb_used_bytes",
        "power_limit_mw",
        "memory_clock_mhz",
        "gpu_util_pct",
        "memory_copy_util_pct",
        "enc_util_pct",
        "dec_util_pct",
        "clock_event_reasons",
        "ecc_corrected_volatile",
        "ecc_uncorrected_volatile",
        "ecc_corrected_aggregate",
        "ecc_uncorrected_aggregate",
        "retired_pages_sbe",
        "remapped_rows_corrected",
        "remapped_rows_uncorrected",
        "remapped_rows_pending",
        "remapped_rows_failure",
        "mig_mode",
        "pcie_link_gen",
        "pcie_link_gen_max",
        "pcie_link_width",
        "pcie_link_width_max",
        "fan_speed_pct",
        "performance_state",
    ] {
        assert_eq!(f[field], r[field], "{field}");
    }
    assert_eq!(r["model"], json!(model));
    let near = |field: &str, within: f64| {
        let (a, b) = (f[field].as_f64(), r[field].as_f64());
        let (Some(a), Some(b)) = (a, b) else {
            panic!("{field}: fake {} real {}", f[field], r[field]);
        };
        assert!((a - b).abs() <= within, "{field}: fake {a} real {b}");
    };
    near("temperature_c", 1.0);
    near("memory_temperature_c", 1.0);
    near("power_mw", 2_000.0);
    near("sm_clock_mhz", 0.0);
    near("fb_reserved_bytes", MIB);
    near("fb_free_bytes", MIB);
}

/// The H200 of `tests/fixtures/h200-recording` (2026-11-25).
#[test]
fn the_fake_h200_reads_as_the_real_driver_did() {
    fake_reads_as_the_real_driver_did("h200_580.159.04_v13.xml", "h200-recording", "NVIDIA H200");
}

/// The H100 of `tests/fixtures/h100-recording` (2026-11-27).
#[test]
fn the_fake_h100_reads_as_the_real_driver_did() {
    fake_reads_as_the_real_driver_did(
        "h100-80gb-hbm3_580.159.04_v13.xml",
        "h100-recording",
        "NVIDIA H100 80GB HBM3",
    );
}
