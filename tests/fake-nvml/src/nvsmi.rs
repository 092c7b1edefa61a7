//! `nvidia-smi -q -x` captures as scenarios: a real GPU's readings, served
//! by the fake library through the same NVML calls the driver answers.
//!
//! Elements are looked up by path, never by position, with the names of
//! every DTD from v10 to v13 (`power_readings` → `gpu_power_readings`,
//! `power_draw` → `average_power_draw`, `clocks_throttle_reasons` →
//! `clocks_event_reasons`, the three ECC shapes). What the XML writes
//! instead of a value (`N/A`, `Not Supported`, `Requested functionality has
//! been deprecated`, a missing element) becomes `"unsupported"`, the error
//! NVML gave nvidia-smi; `Insufficient Permissions`, `GPU is lost` and
//! `Unknown Error` become their own errors. Units become NVML's: MiB →
//! bytes, W → mW, `16x` → 16, `P0` → 0.
//!
//! What the XML cannot say is not invented: GPM activity is off (`gpm =
//! false`), PCIe and NVLink traffic counters are unsupported. A MIG
//! device's profile is not in the XML: it is derived from its SM count and
//! memory (`1g.20gb`).

use std::collections::HashSet;
use std::fmt::{self, Write as _};

use roxmltree::{Document, Node, ParsingOptions};

/// Why a capture cannot be converted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertError(pub String);

impl fmt::Display for ConvertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConvertError {}

fn error(message: impl Into<String>) -> ConvertError {
    ConvertError(message.into())
}

/// The descendant of `node` at `path` (`"fb_memory_usage/total"`).
pub fn find<'a, 'i>(node: Node<'a, 'i>, path: &str) -> Option<Node<'a, 'i>> {
    path.split('/').try_fold(node, |n, name| {
        n.children()
            .find(|c| c.is_element() && c.has_tag_name(name))
    })
}

/// The trimmed text of the element at `path`; None when it is missing.
pub fn text<'a>(node: Node<'a, '_>, path: &str) -> Option<&'a str> {
    find(node, path).map(|n| n.text().unwrap_or_default().trim())
}

/// A reading: the number in a value with a unit (`"81559 MiB"`, `"68.57 W"`,
/// `"16x"`, `"P0"`), or the NVML error name nvidia-smi printed instead.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reading {
    Value(f64),
    Error(&'static str),
}

/// What nvidia-smi printed for an NVML error, as the scenario names it.
fn error_name(s: &str) -> &'static str {
    match s {
        "Insufficient Permissions" => "no_permission",
        "GPU is lost" => "gpu_lost",
        "Unknown Error" => "unknown",
        // N/A, Not Supported, Requested functionality has been deprecated,
        // an empty or missing element.
        _ => "unsupported",
    }
}

/// The reading of the element at `path`.
pub fn reading(node: Node<'_, '_>, path: &str) -> Reading {
    let Some(s) = text(node, path) else {
        return Reading::Error("unsupported");
    };
    let number = s
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .trim_start_matches('P')
        .trim_end_matches('x');
    match number.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Reading::Value(v),
        _ => match s {
            "Yes" | "Enabled" | "Active" => Reading::Value(1.0),
            "No" | "Disabled" | "Not Active" => Reading::Value(0.0),
            // NVML_PSTATE_UNKNOWN.
            "Unknown" => Reading::Value(32.0),
            _ => Reading::Error(error_name(s)),
        },
    }
}

/// The first of `paths` that holds a value; else the first one's error.
fn first_reading(node: Node<'_, '_>, paths: &[&str]) -> Reading {
    let readings: Vec<Reading> = paths.iter().map(|p| reading(node, p)).collect();
    readings
        .iter()
        .copied()
        .find(|r| matches!(r, Reading::Value(_)))
        .or_else(|| {
            // A renamed element is missing, not unsupported: prefer the
            // error of one that is there.
            paths
                .iter()
                .zip(&readings)
                .find(|(p, _)| find(node, p).is_some())
                .map(|(_, r)| *r)
        })
        .unwrap_or(Reading::Error("unsupported"))
}

/// The sum of the readings that hold values; an error when none does.
fn sum(node: Node<'_, '_>, paths: &[&str]) -> Reading {
    let values: Vec<f64> = paths
        .iter()
        .filter_map(|p| match reading(node, p) {
            Reading::Value(v) => Some(v),
            Reading::Error(_) => None,
        })
        .collect();
    if values.is_empty() {
        first_reading(node, paths)
    } else {
        Reading::Value(values.iter().sum())
    }
}

/// The ECC counts NVML's totals (fields 3–6) report, from whichever shape
/// the capture has: `(corrected, uncorrected)` of `volatile` or `aggregate`.
pub fn ecc_totals(gpu: Node<'_, '_>, counter: &str) -> (Reading, Reading) {
    let base = format!("ecc_errors/{counter}");
    if find(gpu, &format!("{base}/single_bit")).is_some() {
        return (
            reading(gpu, &format!("{base}/single_bit/total")),
            reading(gpu, &format!("{base}/double_bit/total")),
        );
    }
    let p = |leaf: &str| format!("{base}/{leaf}");
    let corrected = sum(gpu, &[&p("sram_correctable"), &p("dram_correctable")]);
    let uncorrected = sum(
        gpu,
        &[
            &p("sram_uncorrectable"),
            &p("sram_uncorrectable_parity"),
            &p("sram_uncorrectable_secded"),
            &p("dram_uncorrectable"),
        ],
    );
    (corrected, uncorrected)
}

/// Bits of `nvmlClocksEventReason*`, by the suffix of the XML's element names.
const REASON_BITS: [(&str, u64); 9] = [
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("display_clocks_setting", 0x100),
];

/// The clock event reasons bitmask: `clocks_event_reasons` (535 and newer)
/// or `clocks_throttle_reasons`, `Active` children set.
pub fn clock_event_reasons(gpu: Node<'_, '_>) -> Reading {
    for (block, prefix) in [
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ] {
        let Some(node) = find(gpu, block) else {
            continue;
        };
        let mut bits = 0;
        let mut any = false;
        for (name, bit) in REASON_BITS {
            if let Reading::Value(v) = reading(node, &format!("{prefix}{name}")) {
                any = true;
                if v == 1.0 {
                    bits |= bit;
                }
            }
        }
        return if any {
            Reading::Value(bits as f64)
        } else {
            Reading::Error("unsupported")
        };
    }
    Reading::Error("unsupported")
}

/// A MIG device's profile from its SMs and memory: `<slices>g.<GB>gb`,
/// with the slices of the A100 (14 SMs each) and H100/H200 profiles;
/// `<SMs>sm.<GB>gb` for a count neither knows.
pub fn mig_profile(sm_count: Option<u64>, fb_total_mib: u64) -> String {
    let gb = (fb_total_mib as f64 / 1024.0).round() as u64;
    let slices = sm_count.and_then(|sms| match sms {
        16 | 26 => Some(1),
        32 => Some(2),
        60 => Some(3),
        64 => Some(4),
        132 => Some(7),
        n if n % 14 == 0 && n / 14 <= 7 => Some(n / 14),
        _ => None,
    });
    match (slices, sm_count) {
        (Some(g), _) => format!("{g}g.{gb}gb"),
        (None, Some(sms)) => format!("{sms}sm.{gb}gb"),
        (None, None) => format!("{gb}gb"),
    }
}

/// MiB to bytes, as NVML reports framebuffer sizes.
const MIB: f64 = 1_048_576.0;

/// Converts `nvidia-smi -q -x` output to scenario TOML.
pub fn convert(xml: &str) -> Result<String, ConvertError> {
    // nvidia-smi names its DTD (`nvsmi_device_v13.dtd`); it is not read.
    let options = ParsingOptions {
        allow_dtd: true,
        ..ParsingOptions::default()
    };
    let doc =
        Document::parse_with_options(xml, options).map_err(|e| error(format!("not XML: {e}")))?;
    let root = doc.root_element();
    if !root.has_tag_name("nvidia_smi_log") {
        return Err(error(format!(
            "the root element is <{}>, not <nvidia_smi_log>",
            root.tag_name().name()
        )));
    }
    let driver = text(root, "driver_version").unwrap_or("550.54.15");
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Converted by nvsmi-scenario from `nvidia-smi -q -x` output (driver {driver}).\n\
         # Readings are constants: the capture is one instant. GPM and the PCIe\n\
         # and NVLink counters are not in the XML, so they are off here.\n"
    );
    let _ = writeln!(out, "driver_version = {}", quote(driver));
    let gpus: Vec<Node> = root
        .children()
        .filter(|n| n.is_element() && n.has_tag_name("gpu"))
        .collect();
    if gpus.is_empty() {
        return Err(error("the capture has no <gpu> element"));
    }
    let mut uuids = HashSet::new();
    let mut minors = HashSet::new();
    for (i, gpu) in gpus.iter().enumerate() {
        convert_gpu(&mut out, *gpu, i, &mut uuids, &mut minors)?;
    }
    Ok(out)
}

fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(q, "\\u{:04X}", c as u32);
            }
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

/// Writes `key = value` (scaled and rounded) or `key = "error"`.
fn metric(out: &mut String, key: &str, r: Reading, scale: f64) {
    let _ = match r {
        Reading::Value(v) => writeln!(out, "{key} = {}", (v * scale).round() as u64),
        Reading::Error(e) => writeln!(out, "{key} = \"{e}\""),
    };
}

fn hex(gpu: Node<'_, '_>, path: &str) -> Option<u32> {
    text(gpu, path).and_then(|s| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok())
}

fn convert_gpu(
    out: &mut String,
    gpu: Node<'_, '_>,
    i: usize,
    uuids: &mut HashSet<String>,
    minors: &mut HashSet<u64>,
) -> Result<(), ConvertError> {
    let _ = writeln!(out, "\n[[gpu]]");
    let name = text(gpu, "product_name").unwrap_or("NVIDIA GPU");
    let _ = writeln!(out, "name = {}", quote(name));
    if let Some(uuid) = text(gpu, "uuid") {
        if uuids.insert(uuid.to_owned()) {
            let _ = writeln!(out, "uuid = {}", quote(uuid));
        } else {
            let _ = writeln!(
                out,
                "# uuid {uuid} is repeated in the capture (scrubbed upstream): derived instead"
            );
        }
    }
    if let Some(bus) = text(gpu, "pci/pci_bus_id").or_else(|| gpu.attribute("id")) {
        let _ = writeln!(out, "pci_bus_id = {}", quote(bus));
    }
    for (key, path) in [
        ("pci_device_id", "pci/pci_device_id"),
        ("pci_subsystem_id", "pci/pci_sub_system_id"),
    ] {
        if let Some(id) = hex(gpu, path) {
            let _ = writeln!(out, "{key} = 0x{id:08X}");
        }
    }
    if let Reading::Value(m) = reading(gpu, "minor_number")
        && minors.insert(m as u64)
    {
        let _ = writeln!(out, "minor_number = {}", m as u64);
    }

    // Framebuffer: v10 has no `reserved` (NVML v1 folds it into used).
    let fb = |leaf: &str| reading(gpu, &format!("fb_memory_usage/{leaf}"));
    let Reading::Value(total) = fb("total") else {
        return Err(error(format!("GPU {i}: no fb_memory_usage/total")));
    };
    let _ = writeln!(out, "fb_total_bytes = {}", (total * MIB) as u64);
    if let Reading::Value(reserved) = fb("reserved") {
        let _ = writeln!(out, "fb_reserved_bytes = {}", (reserved * MIB) as u64);
    }
    metric(out, "fb_used_bytes", fb("used"), MIB);
    // nvidia-smi's own free, which need not be total - reserved - used.
    metric(out, "fb_free_bytes", fb("free"), MIB);

    metric(
        out,
        "temperature_c",
        reading(gpu, "temperature/gpu_temp"),
        1.0,
    );
    metric(
        out,
        "memory_temperature_c",
        reading(gpu, "temperature/memory_temp"),
        1.0,
    );
    let power = first_reading(
        gpu,
        &[
            "power_readings/power_draw",
            "gpu_power_readings/power_draw",
            "gpu_power_readings/average_power_draw",
        ],
    );
    metric(out, "power_mw", power, 1000.0);
    let limit = first_reading(
        gpu,
        &[
            "power_readings/enforced_power_limit",
            "gpu_power_readings/current_power_limit",
            "power_readings/power_limit",
        ],
    );
    metric(out, "power_limit_mw", limit, 1000.0);
    for (key, path) in [
        ("graphics_clock_mhz", "clocks/graphics_clock"),
        ("sm_clock_mhz", "clocks/sm_clock"),
        ("memory_clock_mhz", "clocks/mem_clock"),
        ("video_clock_mhz", "clocks/video_clock"),
        ("gpu_util_pct", "utilization/gpu_util"),
        ("memory_copy_util_pct", "utilization/memory_util"),
        ("enc_util_pct", "utilization/encoder_util"),
        ("dec_util_pct", "utilization/decoder_util"),
        ("pcie_replay_count", "pci/replay_counter"),
        (
            "pcie_link_gen",
            "pci/pci_gpu_link_info/pcie_gen/current_link_gen",
        ),
        (
            "pcie_link_gen_max",
            "pci/pci_gpu_link_info/pcie_gen/max_link_gen",
        ),
        (
            "pcie_link_width",
            "pci/pci_gpu_link_info/link_widths/current_link_width",
        ),
        (
            "pcie_link_width_max",
            "pci/pci_gpu_link_info/link_widths/max_link_width",
        ),
        ("fan_speed_pct", "fan_speed"),
        ("performance_state", "performance_state"),
        (
            "retired_pages_sbe",
            "retired_pages/multiple_single_bit_retirement/retired_count",
        ),
        (
            "retired_pages_dbe",
            "retired_pages/double_bit_retirement/retired_count",
        ),
        ("retired_pages_pending", "retired_pages/pending_retirement"),
        ("remapped_rows_corrected", "remapped_rows/remapped_row_corr"),
        (
            "remapped_rows_uncorrected",
            "remapped_rows/remapped_row_unc",
        ),
        (
            "remapped_rows_pending",
            "remapped_rows/remapped_row_pending",
        ),
        (
            "remapped_rows_failure",
            "remapped_rows/remapped_row_failure",
        ),
    ] {
        metric(out, key, reading(gpu, path), 1.0);
    }
    metric(out, "clock_event_reasons", clock_event_reasons(gpu), 1.0);
    for (counter, corrected, uncorrected) in [
        ("volatile", "ecc_sbe_volatile", "ecc_dbe_volatile"),
        ("aggregate", "ecc_sbe_aggregate", "ecc_dbe_aggregate"),
    ] {
        let (c, u) = ecc_totals(gpu, counter);
        metric(out, corrected, c, 1.0);
        metric(out, uncorrected, u, 1.0);
    }
    metric(out, "mig_mode", reading(gpu, "mig_mode/current_mig"), 1.0);
    metric(
        out,
        "mig_mode_pending",
        reading(gpu, "mig_mode/pending_mig"),
        1.0,
    );
    let _ = writeln!(
        out,
        "gpm = false\npcie_tx_bytes_per_s = \"unsupported\"\npcie_rx_bytes_per_s = \"unsupported\"\n\
         nvlink_tx_bytes_per_s = \"unsupported\"\nnvlink_rx_bytes_per_s = \"unsupported\""
    );

    // Compute processes (type C or C+G); graphics-only ones are not what
    // nvmlDeviceGetComputeRunningProcesses lists. On a MIG device they go
    // under it.
    let mut own = Vec::new();
    let mut on_mig: Vec<((u64, u64), String)> = Vec::new();
    for p in find(gpu, "processes")
        .into_iter()
        .flat_map(|n| n.children().filter(|c| c.has_tag_name("process_info")))
    {
        if !text(p, "type").is_some_and(|t| t.contains('C')) {
            continue;
        }
        let Reading::Value(pid) = reading(p, "pid") else {
            continue;
        };
        let memory = match reading(p, "used_memory") {
            Reading::Value(mib) => format!(", used_memory_bytes = {}", (mib * MIB) as u64),
            Reading::Error(_) => String::new(),
        };
        let entry = format!("{{ pid = {}{memory} }}", pid as u64);
        match (
            reading(p, "gpu_instance_id"),
            reading(p, "compute_instance_id"),
        ) {
            (Reading::Value(gi), Reading::Value(ci)) => {
                on_mig.push(((gi as u64, ci as u64), entry));
            }
            _ => own.push(entry),
        }
    }
    let migs: Vec<Node> = find(gpu, "mig_devices")
        .into_iter()
        .flat_map(|n| n.children().filter(|c| c.has_tag_name("mig_device")))
        .collect();
    if migs.is_empty() && !own.is_empty() {
        let _ = writeln!(out, "processes = [{}]", own.join(", "));
    }
    for m in migs {
        let id = |path: &str| match reading(m, path) {
            Reading::Value(v) => Ok(v as u64),
            Reading::Error(_) => Err(error(format!("GPU {i}: a mig_device has no {path}"))),
        };
        let (gi, ci) = (id("gpu_instance_id")?, id("compute_instance_id")?);
        let Reading::Value(total) = reading(m, "fb_memory_usage/total") else {
            return Err(error(format!(
                "GPU {i}: MIG device {gi}/{ci} has no fb_memory_usage/total"
            )));
        };
        let sms = match reading(m, "device_attributes/shared/multiprocessor_count") {
            Reading::Value(v) => Some(v as u64),
            Reading::Error(_) => None,
        };
        let _ = writeln!(out, "\n[[gpu.mig]]");
        let _ = writeln!(out, "gpu_instance_id = {gi}\ncompute_instance_id = {ci}");
        let _ = writeln!(out, "profile = {}", quote(&mig_profile(sms, total as u64)));
        let _ = writeln!(out, "fb_total_bytes = {}", (total * MIB) as u64);
        if let Reading::Value(reserved) = reading(m, "fb_memory_usage/reserved") {
            let _ = writeln!(out, "fb_reserved_bytes = {}", (reserved * MIB) as u64);
        }
        metric(
            out,
            "fb_used_bytes",
            reading(m, "fb_memory_usage/used"),
            MIB,
        );
        metric(
            out,
            "fb_free_bytes",
            reading(m, "fb_memory_usage/free"),
            MIB,
        );
        let mine: Vec<&str> = on_mig
            .iter()
            .filter(|(k, _)| *k == (gi, ci))
            .map(|(_, e)| e.as_str())
            .collect();
        if !mine.is_empty() {
            let _ = writeln!(out, "processes = [{}]", mine.join(", "));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Scenario;

    #[test]
    fn readings_take_units_and_non_values() {
        let doc = Document::parse(
            "<g><a>81559 MiB</a><b>68.57 W</b><c>16x</c><d>P8</d><e>N/A</e>\
             <f>Requested functionality has been deprecated</f><h>Yes</h><i>GPU is lost</i>\
             <j>Not Supported</j><k>Unknown</k></g>",
        )
        .expect("xml");
        let g = doc.root_element();
        assert_eq!(reading(g, "a"), Reading::Value(81559.0));
        assert_eq!(reading(g, "b"), Reading::Value(68.57));
        assert_eq!(reading(g, "c"), Reading::Value(16.0));
        assert_eq!(reading(g, "d"), Reading::Value(8.0));
        assert_eq!(reading(g, "e"), Reading::Error("unsupported"));
        assert_eq!(reading(g, "f"), Reading::Error("unsupported"));
        assert_eq!(reading(g, "h"), Reading::Value(1.0));
        assert_eq!(reading(g, "i"), Reading::Error("gpu_lost"));
        assert_eq!(reading(g, "j"), Reading::Error("unsupported"));
        assert_eq!(reading(g, "k"), Reading::Value(32.0));
        assert_eq!(reading(g, "missing"), Reading::Error("unsupported"));
    }

    #[test]
    fn mig_profiles_from_sms_and_memory() {
        assert_eq!(mig_profile(Some(14), 19968), "1g.20gb");
        assert_eq!(mig_profile(Some(42), 19968), "3g.20gb");
        assert_eq!(mig_profile(Some(60), 40448), "3g.40gb");
        assert_eq!(mig_profile(Some(16), 9984), "1g.10gb");
        assert_eq!(mig_profile(Some(33), 9984), "33sm.10gb");
    }

    #[test]
    fn not_a_capture_is_refused() {
        assert!(convert("<x/>").is_err_and(|e| e.0.contains("not <nvidia_smi_log>")));
        assert!(
            convert("<nvidia_smi_log></nvidia_smi_log>").is_err_and(|e| e.0.contains("no <gpu>"))
        );
        assert!(convert("no xml").is_err_and(|e| e.0.starts_with("not XML")));
    }

    #[test]
    fn every_committed_capture_converts_to_a_valid_scenario() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/nvidia-smi");
        let mut converted = 0;
        for entry in std::fs::read_dir(&dir).expect("captures") {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "xml") {
                continue;
            }
            let xml = std::fs::read_to_string(&path).expect("read");
            let toml = convert(&xml).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if let Err(e) = Scenario::parse(&toml) {
                panic!("{}: {e}\n{toml}", path.display());
            }
            converted += 1;
        }
        assert_eq!(converted, 9);
    }
}
