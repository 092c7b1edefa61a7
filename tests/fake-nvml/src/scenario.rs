//! The scenario file: which GPUs the fake library presents and what each of
//! them reads over time. The format is documented in this crate's README.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

use nvml_wrapper_sys::bindings::{
    NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE,
    NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE, NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE,
};
use serde::Deserialize;

use crate::metric::{Fault, Metric, Sample};

/// The environment variable naming the scenario file, read at each first `nvmlInit`.
pub const SCENARIO_ENV: &str = "GPUTEL_FAKE_NVML_SCENARIO";

/// The scenario used when [`SCENARIO_ENV`] is unset or empty: eight moving H100s.
pub const DEFAULT_SCENARIO_TOML: &str = include_str!("../scenarios/h100x8.toml");

/// More GPUs than any real node has; a typo in `count` should not allocate gigabytes.
pub const MAX_GPUS: usize = 1024;

const DEFAULT_DRIVER_VERSION: &str = "550.54.15";
const DEFAULT_STEP_MS: u64 = 1000;
const DEFAULT_NAME: &str = "NVIDIA H100 80GB HBM3";
/// 81559 MiB, what an H100 80GB HBM3 reports as total framebuffer.
const DEFAULT_FB_TOTAL_BYTES: u64 = 85_520_809_984;
/// PCI device and subsystem ids of an H100 SXM5 80GB.
const DEFAULT_PCI_DEVICE_ID: u32 = 0x2330_10DE;
const DEFAULT_PCI_SUBSYSTEM_ID: u32 = 0x16C1_10DE;
/// Bus numbers of the eight GPUs of a typical HGX H100 board.
const HGX_BUSES: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

const DEFAULT_TEMPERATURE_C: u64 = 40;
const DEFAULT_MEMORY_TEMPERATURE_C: u64 = 45;
const DEFAULT_POWER_MW: u64 = 100_000;
const DEFAULT_SM_CLOCK_MHZ: u64 = 1980;
const DEFAULT_MEMORY_CLOCK_MHZ: u64 = 2619;
const DEFAULT_VIDEO_CLOCK_MHZ: u64 = 1755;

/// Why a scenario cannot be used.
#[derive(Debug)]
pub enum ScenarioError {
    /// The file could not be read.
    Read(std::io::Error),
    /// The text is not valid TOML or does not fit the format.
    Syntax {
        /// 1-based line of the problem.
        line: usize,
        /// 1-based column of the problem.
        column: usize,
        /// What the TOML parser said.
        message: String,
    },
    /// The format is right but a value is not (out of range, duplicated…).
    Invalid {
        /// Where: a top-level key or `[[gpu]] entry N, key`.
        at: String,
        /// What is wrong and what would be right.
        problem: String,
    },
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScenarioError::Read(e) => write!(f, "cannot read it: {e}"),
            ScenarioError::Syntax {
                line,
                column,
                message,
            } => write!(f, "line {line}, column {column}: {message}"),
            ScenarioError::Invalid { at, problem } => write!(f, "{at}: {problem}"),
        }
    }
}

impl std::error::Error for ScenarioError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ScenarioError::Read(e) => Some(e),
            _ => None,
        }
    }
}

fn invalid(at: impl Into<String>, problem: impl Into<String>) -> ScenarioError {
    ScenarioError::Invalid {
        at: at.into(),
        problem: problem.into(),
    }
}

/// A PCI address `domain:bus:device.0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PciAddress {
    /// PCI domain (segment), at most 0xFFFF.
    pub domain: u32,
    /// Bus number, at most 0xFF.
    pub bus: u32,
    /// Device number, at most 0x1F.
    pub device: u32,
}

impl PciAddress {
    /// The bus id as NVML's `busId` field writes it: `00000000:18:00.0`.
    pub fn bus_id(&self) -> String {
        format!("{:08X}:{:02X}:{:02X}.0", self.domain, self.bus, self.device)
    }

    /// The bus id as NVML's `busIdLegacy` field writes it: `0000:18:00.0`.
    pub fn bus_id_legacy(&self) -> String {
        format!("{:04X}:{:02X}:{:02X}.0", self.domain, self.bus, self.device)
    }

    /// Parses `DDDDDDDD:BB:DD.0` or `DDDD:BB:DD.0` (hex, any case; function 0 only).
    pub fn parse(s: &str) -> Option<PciAddress> {
        let (rest, function) = s.rsplit_once('.')?;
        let mut parts = rest.split(':');
        let (domain, bus, device) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || function != "0" {
            return None;
        }
        let hex = |p: &str, max: u32| {
            u32::from_str_radix(p, 16)
                .ok()
                .filter(|v| !p.is_empty() && *v <= max)
        };
        Some(PciAddress {
            domain: hex(domain, 0xFFFF)?,
            bus: hex(bus, 0xFF)?,
            device: hex(device, 0x1F)?,
        })
    }

    /// Where GPU `index` sits when the scenario does not say: HGX bus numbers,
    /// one PCI domain per eight GPUs.
    fn default_for(index: u32) -> PciAddress {
        PciAddress {
            domain: index / 8,
            bus: HGX_BUSES[index as usize % 8],
            device: 0,
        }
    }
}

/// Where `nvmlDeviceGetTotalEnergyConsumption` gets its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Energy {
    /// The scenario gives the counter itself (`energy_mj`), in mJ.
    Given(Metric),
    /// The counter starts at `initial_mj` and integrates `power_mw` over time.
    FromPower {
        /// Counter value at init, in mJ.
        initial_mj: u64,
    },
}

/// Framebuffer memory as `nvmlDeviceGetMemoryInfo_v2` reports it, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryReading {
    /// Total installed framebuffer.
    pub total: u64,
    /// Reserved by the driver and firmware.
    pub reserved: u64,
    /// `total - reserved - used`.
    pub free: u64,
    /// Allocated by processes.
    pub used: u64,
}

/// One GPU the fake library presents, with every metric resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// NVML index, 0-based, in scenario order.
    pub index: u32,
    /// Product name (`nvmlDeviceGetName`).
    pub name: String,
    /// `GPU-…` UUID (`nvmlDeviceGetUUID`).
    pub uuid: String,
    /// PCI address (`nvmlDeviceGetPciInfo_v3`).
    pub pci: PciAddress,
    /// Combined PCI device and vendor id.
    pub pci_device_id: u32,
    /// Combined PCI subsystem id.
    pub pci_subsystem_id: u32,
    /// The N of /dev/nvidiaN (`nvmlDeviceGetMinorNumber`).
    pub minor_number: u32,
    /// Total framebuffer, bytes.
    pub fb_total_bytes: u64,
    /// Reserved framebuffer, bytes.
    pub fb_reserved_bytes: u64,
    /// Length of one trace step, ms.
    pub step_ms: u64,
    /// Steps this GPU's traces run ahead of the clock (its phase).
    pub offset_steps: u64,
    /// GPU temperature, °C.
    pub temperature_c: Metric,
    /// HBM temperature, °C (field NVML_FI_DEV_MEMORY_TEMP).
    pub memory_temperature_c: Metric,
    /// Power draw, mW.
    pub power_mw: Metric,
    /// Total energy counter.
    pub energy: Energy,
    /// Graphics clock, MHz.
    pub graphics_clock_mhz: Metric,
    /// SM clock, MHz.
    pub sm_clock_mhz: Metric,
    /// Memory clock, MHz.
    pub memory_clock_mhz: Metric,
    /// Video clock, MHz.
    pub video_clock_mhz: Metric,
    /// GPU utilization, %.
    pub gpu_util_pct: Metric,
    /// Memory (copy) utilization, %.
    pub memory_copy_util_pct: Metric,
    /// Framebuffer used, bytes.
    pub fb_used_bytes: Metric,
}

impl Gpu {
    /// The trace step this GPU is at `elapsed_ms` after init.
    pub fn step(&self, elapsed_ms: u64) -> u64 {
        (elapsed_ms / self.step_ms.max(1)).wrapping_add(self.offset_steps)
    }

    /// What `metric` (one of this GPU's fields) reads `elapsed_ms` after init.
    pub fn read(&self, metric: &Metric, elapsed_ms: u64) -> Result<u64, Fault> {
        metric.at(self.step(elapsed_ms)).get()
    }

    /// The total energy counter `elapsed_ms` after init, in mJ.
    pub fn energy_mj(&self, elapsed_ms: u64) -> Result<u64, Fault> {
        match &self.energy {
            Energy::Given(metric) => self.read(metric, elapsed_ms),
            Energy::FromPower { initial_mj } => {
                if let Metric::Constant(Sample::Fault(f)) = self.power_mw {
                    return Err(f);
                }
                let step = u128::from(self.step_ms.max(1));
                let start = u128::from(self.offset_steps) * step;
                let end = start + u128::from(elapsed_ms);
                // mW·ms = µJ; the integral never decreases, so neither does the counter.
                let micro_joules = self.power_mw.integral(self.step_ms, end)
                    - self.power_mw.integral(self.step_ms, start);
                let mj = u64::try_from(micro_joules / 1000).unwrap_or(u64::MAX);
                Ok(initial_mj.saturating_add(mj))
            }
        }
    }

    /// Framebuffer memory `elapsed_ms` after init.
    pub fn memory(&self, elapsed_ms: u64) -> Result<MemoryReading, Fault> {
        let used = self.read(&self.fb_used_bytes, elapsed_ms)?;
        Ok(MemoryReading {
            total: self.fb_total_bytes,
            reserved: self.fb_reserved_bytes,
            free: self
                .fb_total_bytes
                .saturating_sub(self.fb_reserved_bytes)
                .saturating_sub(used),
            used,
        })
    }
}

/// A parsed, validated scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scenario {
    /// `nvmlSystemGetDriverVersion`.
    pub driver_version: String,
    /// `nvmlSystemGetNVMLVersion`.
    pub nvml_version: String,
    /// When set, `nvmlInit` fails with this error (a node without a working driver).
    pub init_error: Option<Fault>,
    /// The GPUs, in NVML index order.
    pub gpus: Vec<Gpu>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    driver_version: Option<String>,
    nvml_version: Option<String>,
    step_ms: Option<u64>,
    init_error: Option<Fault>,
    #[serde(default)]
    gpu: Vec<RawGpu>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGpu {
    count: Option<u32>,
    phase_steps: Option<u64>,
    name: Option<String>,
    uuid: Option<String>,
    pci_bus_id: Option<String>,
    pci_device_id: Option<u32>,
    pci_subsystem_id: Option<u32>,
    minor_number: Option<u32>,
    fb_total_bytes: Option<u64>,
    fb_reserved_bytes: Option<u64>,
    energy_initial_mj: Option<u64>,
    temperature_c: Option<Metric>,
    memory_temperature_c: Option<Metric>,
    power_mw: Option<Metric>,
    energy_mj: Option<Metric>,
    graphics_clock_mhz: Option<Metric>,
    sm_clock_mhz: Option<Metric>,
    memory_clock_mhz: Option<Metric>,
    video_clock_mhz: Option<Metric>,
    gpu_util_pct: Option<Metric>,
    memory_copy_util_pct: Option<Metric>,
    fb_used_bytes: Option<Metric>,
}

impl Scenario {
    /// Parses and validates a scenario from TOML text.
    pub fn parse(text: &str) -> Result<Scenario, ScenarioError> {
        let raw: RawScenario = toml::from_str(text).map_err(|e| {
            let (line, column) = e
                .span()
                .map_or((1, 1), |span| line_column(text, span.start));
            ScenarioError::Syntax {
                line,
                column,
                message: e.message().replace('\n', " "),
            }
        })?;
        build(raw)
    }

    /// Reads, parses and validates the scenario file at `path`.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(ScenarioError::Read)?;
        Scenario::parse(&text)
    }

    /// The built-in scenario (`scenarios/h100x8.toml`).
    pub fn builtin() -> Result<Scenario, ScenarioError> {
        Scenario::parse(DEFAULT_SCENARIO_TOML)
    }

    /// The scenario [`SCENARIO_ENV`] names, or the built-in one when it is
    /// unset or empty. On error, also returns the path that failed.
    pub fn from_env() -> Result<Scenario, (Option<PathBuf>, ScenarioError)> {
        match std::env::var_os(SCENARIO_ENV) {
            Some(path) if !path.is_empty() => {
                let path = PathBuf::from(path);
                Scenario::load(&path).map_err(|e| (Some(path), e))
            }
            _ => Scenario::builtin().map_err(|e| (None, e)),
        }
    }
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
    (line, column)
}

fn check_c_string(at: &str, s: &str, buffer: u32) -> Result<(), ScenarioError> {
    if s.contains('\0') {
        return Err(invalid(at, "must not contain a NUL character"));
    }
    // NVML callers pass fixed buffers; one more byte is the terminating NUL.
    if s.len() >= buffer as usize {
        return Err(invalid(
            at,
            format!(
                "\"{s}\" is {} bytes; NVML callers give it a {buffer}-byte buffer, so at most {} fit",
                s.len(),
                buffer - 1
            ),
        ));
    }
    Ok(())
}

fn check_max(at: &str, metric: &Metric, max: u64, why: &str) -> Result<(), ScenarioError> {
    for sample in metric.samples() {
        if let Sample::Value(v) = sample
            && *v > max
        {
            return Err(invalid(at, format!("{v} is above {max}, {why}")));
        }
    }
    Ok(())
}

fn build(raw: RawScenario) -> Result<Scenario, ScenarioError> {
    let driver_version = raw
        .driver_version
        .unwrap_or_else(|| DEFAULT_DRIVER_VERSION.to_owned());
    check_c_string(
        "driver_version",
        &driver_version,
        NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE,
    )?;
    let nvml_version = raw
        .nvml_version
        .unwrap_or_else(|| format!("12.{driver_version}"));
    check_c_string(
        "nvml_version",
        &nvml_version,
        NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE,
    )?;
    let step_ms = raw.step_ms.unwrap_or(DEFAULT_STEP_MS);
    if step_ms == 0 {
        return Err(invalid("step_ms", "must be at least 1 (milliseconds)"));
    }

    let total: u64 = raw
        .gpu
        .iter()
        .map(|g| u64::from(g.count.unwrap_or(1)))
        .sum();
    if total > MAX_GPUS as u64 {
        return Err(invalid(
            "[[gpu]] count",
            format!("the entries add up to {total} GPUs; at most {MAX_GPUS} are supported"),
        ));
    }

    let mut gpus: Vec<Gpu> = Vec::new();
    for (entry, g) in raw.gpu.into_iter().enumerate() {
        let at = |key: &str| format!("[[gpu]] entry {} ({key})", entry + 1);
        let count = g.count.unwrap_or(1);
        if count != 1 {
            for (key, given) in [
                ("uuid", g.uuid.is_some()),
                ("pci_bus_id", g.pci_bus_id.is_some()),
                ("minor_number", g.minor_number.is_some()),
            ] {
                if given {
                    return Err(invalid(
                        at(key),
                        format!(
                            "identifies one GPU but this entry has count = {count}; \
                             split it into entries of count = 1 or leave {key} out to derive it"
                        ),
                    ));
                }
            }
        }

        let name = g.name.unwrap_or_else(|| DEFAULT_NAME.to_owned());
        check_c_string(&at("name"), &name, NVML_DEVICE_NAME_V2_BUFFER_SIZE)?;
        if let Some(uuid) = &g.uuid {
            check_c_string(&at("uuid"), uuid, NVML_DEVICE_UUID_V2_BUFFER_SIZE)?;
        }
        let pci = match &g.pci_bus_id {
            Some(s) => Some(PciAddress::parse(s).ok_or_else(|| {
                invalid(
                    at("pci_bus_id"),
                    format!("\"{s}\" is not a PCI address like \"00000000:18:00.0\""),
                )
            })?),
            None => None,
        };
        let fb_total_bytes = g.fb_total_bytes.unwrap_or(DEFAULT_FB_TOTAL_BYTES);
        let fb_reserved_bytes = g.fb_reserved_bytes.unwrap_or(0);
        if fb_reserved_bytes > fb_total_bytes {
            return Err(invalid(
                at("fb_reserved_bytes"),
                format!("{fb_reserved_bytes} is more than fb_total_bytes ({fb_total_bytes})"),
            ));
        }

        let metric = |m: Option<Metric>, default: u64| m.unwrap_or(Metric::constant(default));
        let sm_clock_mhz = metric(g.sm_clock_mhz, DEFAULT_SM_CLOCK_MHZ);
        let template = Gpu {
            index: 0,
            name,
            uuid: String::new(),
            pci: PciAddress::default_for(0),
            pci_device_id: g.pci_device_id.unwrap_or(DEFAULT_PCI_DEVICE_ID),
            pci_subsystem_id: g.pci_subsystem_id.unwrap_or(DEFAULT_PCI_SUBSYSTEM_ID),
            minor_number: 0,
            fb_total_bytes,
            fb_reserved_bytes,
            step_ms,
            offset_steps: 0,
            temperature_c: metric(g.temperature_c, DEFAULT_TEMPERATURE_C),
            memory_temperature_c: metric(g.memory_temperature_c, DEFAULT_MEMORY_TEMPERATURE_C),
            power_mw: metric(g.power_mw, DEFAULT_POWER_MW),
            energy: match g.energy_mj {
                Some(m) => {
                    if g.energy_initial_mj.is_some() {
                        return Err(invalid(
                            at("energy_initial_mj"),
                            "only applies when energy is integrated from power_mw; \
                             drop it or drop energy_mj",
                        ));
                    }
                    Energy::Given(m)
                }
                None => Energy::FromPower {
                    initial_mj: g.energy_initial_mj.unwrap_or(0),
                },
            },
            // On Hopper the graphics and SM clocks are one clock.
            graphics_clock_mhz: g.graphics_clock_mhz.unwrap_or_else(|| sm_clock_mhz.clone()),
            sm_clock_mhz,
            memory_clock_mhz: metric(g.memory_clock_mhz, DEFAULT_MEMORY_CLOCK_MHZ),
            video_clock_mhz: metric(g.video_clock_mhz, DEFAULT_VIDEO_CLOCK_MHZ),
            gpu_util_pct: metric(g.gpu_util_pct, 0),
            memory_copy_util_pct: metric(g.memory_copy_util_pct, 0),
            fb_used_bytes: metric(g.fb_used_bytes, 0),
        };

        let u32_max = u64::from(u32::MAX);
        let nvml_u32 = "the largest value NVML reports for this metric";
        for (key, m) in [
            ("temperature_c", &template.temperature_c),
            ("memory_temperature_c", &template.memory_temperature_c),
            ("power_mw", &template.power_mw),
            ("graphics_clock_mhz", &template.graphics_clock_mhz),
            ("sm_clock_mhz", &template.sm_clock_mhz),
            ("memory_clock_mhz", &template.memory_clock_mhz),
            ("video_clock_mhz", &template.video_clock_mhz),
        ] {
            check_max(&at(key), m, u32_max, nvml_u32)?;
        }
        for (key, m) in [
            ("gpu_util_pct", &template.gpu_util_pct),
            ("memory_copy_util_pct", &template.memory_copy_util_pct),
        ] {
            check_max(&at(key), m, 100, "and utilization is a percentage")?;
        }
        check_max(
            &at("fb_used_bytes"),
            &template.fb_used_bytes,
            fb_total_bytes - fb_reserved_bytes,
            "fb_total_bytes - fb_reserved_bytes (used memory cannot exceed what is usable)",
        )?;

        let phase_steps = g.phase_steps.unwrap_or(0);
        for k in 0..u64::from(count) {
            // Bounded by MAX_GPUS above.
            let index = gpus.len() as u32;
            let mut gpu = template.clone();
            gpu.index = index;
            gpu.uuid = g.uuid.clone().unwrap_or_else(|| default_uuid(index));
            gpu.pci = pci.unwrap_or_else(|| PciAddress::default_for(index));
            gpu.minor_number = g.minor_number.unwrap_or(index);
            gpu.offset_steps = k.wrapping_mul(phase_steps);
            gpus.push(gpu);
        }
    }

    let mut uuids = HashSet::new();
    let mut buses = HashSet::new();
    let mut minors = HashSet::new();
    for gpu in &gpus {
        let at = format!("GPU {}", gpu.index);
        if !uuids.insert(gpu.uuid.as_str()) {
            return Err(invalid(
                at,
                format!("uuid \"{}\" is used by an earlier GPU", gpu.uuid),
            ));
        }
        if !buses.insert(gpu.pci) {
            return Err(invalid(
                at,
                format!("PCI address {} is used by an earlier GPU", gpu.pci.bus_id()),
            ));
        }
        if !minors.insert(gpu.minor_number) {
            return Err(invalid(
                at,
                format!(
                    "minor_number {} is used by an earlier GPU",
                    gpu.minor_number
                ),
            ));
        }
    }

    Ok(Scenario {
        driver_version,
        nvml_version,
        init_error: raw.init_error,
        gpus,
    })
}

/// The UUID of GPU `index` when the scenario does not give one.
pub fn default_uuid(index: u32) -> String {
    format!("GPU-{index:08x}-fake-4000-8000-{index:012x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Scenario {
        match Scenario::parse(text) {
            Ok(s) => s,
            Err(e) => panic!("scenario should parse: {e}"),
        }
    }

    fn error(text: &str) -> String {
        match Scenario::parse(text) {
            Ok(s) => panic!("scenario should be rejected: {s:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn builtin_is_eight_moving_h100s() {
        let s = match Scenario::builtin() {
            Ok(s) => s,
            Err(e) => panic!("built-in scenario must parse: {e}"),
        };
        assert_eq!(s.driver_version, "550.54.15");
        assert_eq!(s.nvml_version, "12.550.54.15");
        assert_eq!(s.gpus.len(), 8);
        for (i, gpu) in s.gpus.iter().enumerate() {
            assert_eq!(gpu.index as usize, i);
            assert_eq!(gpu.name, "NVIDIA H100 80GB HBM3");
            assert_eq!(gpu.fb_total_bytes, 85_520_809_984);
            assert_eq!(gpu.uuid, format!("GPU-{i:08x}-fake-4000-8000-{i:012x}"));
            assert_eq!(gpu.minor_number as usize, i);
            assert_eq!(gpu.offset_steps, 7 * i as u64);
            assert_eq!(gpu.read(&gpu.memory_clock_mhz, 0), Ok(2619));
        }
        assert_eq!(s.gpus[0].pci.bus_id(), "00000000:18:00.0");
        assert_eq!(s.gpus[7].pci.bus_id(), "00000000:DB:00.0");

        let gpu = &s.gpus[0];
        let over_a_minute: Vec<u64> = (0..60)
            .filter_map(|t| gpu.read(&gpu.temperature_c, t * 1000).ok())
            .collect();
        assert_eq!(over_a_minute.len(), 60);
        assert_eq!(over_a_minute.iter().min(), Some(&35));
        assert_eq!(over_a_minute.iter().max(), Some(&80));
        let power: Vec<u64> = (0..60)
            .filter_map(|t| gpu.read(&gpu.power_mw, t * 1000).ok())
            .collect();
        assert_eq!(power.iter().min(), Some(&90_000));
        assert_eq!(power.iter().max(), Some(&700_000));
        for t in 0..60 {
            let (core, hbm) = (
                gpu.read(&gpu.temperature_c, t * 1000),
                gpu.read(&gpu.memory_temperature_c, t * 1000),
            );
            assert!(
                matches!((core, hbm), (Ok(c), Ok(h)) if h > c),
                "memory runs warmer than the core at step {t}"
            );
        }
        // Phases differ: GPU 1 is 7 steps ahead of GPU 0.
        assert_eq!(
            s.gpus[1].read(&s.gpus[1].power_mw, 0),
            gpu.read(&gpu.power_mw, 7000)
        );
    }

    #[test]
    fn empty_scenario_has_defaults_and_no_gpus() {
        let s = parse("");
        assert_eq!(s.driver_version, "550.54.15");
        assert_eq!(s.nvml_version, "12.550.54.15");
        assert_eq!(s.init_error, None);
        assert!(s.gpus.is_empty());
    }

    #[test]
    fn missing_metrics_get_documented_constants() {
        let s = parse("[[gpu]]\n");
        let g = &s.gpus[0];
        assert_eq!(g.name, "NVIDIA H100 80GB HBM3");
        assert_eq!(g.uuid, "GPU-00000000-fake-4000-8000-000000000000");
        assert_eq!(g.pci.bus_id(), "00000000:18:00.0");
        assert_eq!(g.pci.bus_id_legacy(), "0000:18:00.0");
        assert_eq!(g.pci_device_id, 0x2330_10DE);
        assert_eq!(g.read(&g.temperature_c, 5), Ok(40));
        assert_eq!(g.read(&g.memory_temperature_c, 5), Ok(45));
        assert_eq!(g.read(&g.power_mw, 5), Ok(100_000));
        assert_eq!(g.read(&g.graphics_clock_mhz, 5), Ok(1980));
        assert_eq!(g.read(&g.sm_clock_mhz, 5), Ok(1980));
        assert_eq!(g.read(&g.memory_clock_mhz, 5), Ok(2619));
        assert_eq!(g.read(&g.video_clock_mhz, 5), Ok(1755));
        assert_eq!(g.read(&g.gpu_util_pct, 5), Ok(0));
        assert_eq!(g.read(&g.memory_copy_util_pct, 5), Ok(0));
        assert_eq!(
            g.memory(5),
            Ok(MemoryReading {
                total: 85_520_809_984,
                reserved: 0,
                free: 85_520_809_984,
                used: 0
            })
        );
        assert_eq!(g.energy_mj(0), Ok(0));
        assert_eq!(g.energy_mj(1500), Ok(150_000));
    }

    #[test]
    fn count_expands_with_derived_identity_and_phase() {
        let s = parse(
            r#"
            step_ms = 500
            [[gpu]]
            count = 3
            phase_steps = 1
            power_mw = [100, 200, 300]
            [[gpu]]
            name = "NVIDIA A100-SXM4-80GB"
            uuid = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
            pci_bus_id = "0000:c1:00.0"
            minor_number = 9
            "#,
        );
        assert_eq!(s.gpus.len(), 4);
        let uuids: Vec<_> = s.gpus.iter().map(|g| g.uuid.as_str()).collect();
        assert_eq!(
            uuids,
            [
                "GPU-00000000-fake-4000-8000-000000000000",
                "GPU-00000001-fake-4000-8000-000000000001",
                "GPU-00000002-fake-4000-8000-000000000002",
                "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
            ]
        );
        let at_start: Vec<_> = s.gpus[..3].iter().map(|g| g.read(&g.power_mw, 0)).collect();
        assert_eq!(at_start, [Ok(100), Ok(200), Ok(300)]);
        let g0 = &s.gpus[0];
        assert_eq!(g0.read(&g0.power_mw, 499), Ok(100));
        assert_eq!(g0.read(&g0.power_mw, 500), Ok(200));
        assert_eq!(g0.read(&g0.power_mw, 1500), Ok(100));
        let a100 = &s.gpus[3];
        assert_eq!(a100.index, 3);
        assert_eq!(a100.name, "NVIDIA A100-SXM4-80GB");
        assert_eq!(a100.pci.bus_id(), "00000000:C1:00.0");
        assert_eq!(a100.minor_number, 9);
    }

    #[test]
    fn energy_integrates_power_trace_from_the_gpus_phase() {
        let s = parse(
            r#"
            step_ms = 1000
            [[gpu]]
            count = 2
            phase_steps = 1
            energy_initial_mj = 5000
            power_mw = [100000, 300000]
            "#,
        );
        let (g0, g1) = (&s.gpus[0], &s.gpus[1]);
        assert_eq!(g0.energy_mj(0), Ok(5000));
        // 1 s at 100 W, then 0.5 s at 300 W.
        assert_eq!(g0.energy_mj(1500), Ok(5000 + 100_000 + 150_000));
        // GPU 1 starts at the 300 W step.
        assert_eq!(g1.energy_mj(1500), Ok(5000 + 300_000 + 50_000));
        // Many cycles later: 200 J per 2-second cycle.
        assert_eq!(g0.energy_mj(3_600_000), Ok(5000 + 1800 * 400_000));
        let mut last = 0;
        for t in (0..10_000).step_by(7) {
            let e = g1.energy_mj(t).unwrap_or(0);
            assert!(e >= last, "energy went down at {t} ms");
            last = e;
        }
    }

    #[test]
    fn explicit_energy_and_faults() {
        let s = parse(
            r#"
            [[gpu]]
            energy_mj = [10, 20]
            memory_temperature_c = "unsupported"
            temperature_c = [50, "gpu_lost"]
            [[gpu]]
            power_mw = "no_permission"
            "#,
        );
        let g = &s.gpus[0];
        assert_eq!(g.energy_mj(1000), Ok(20));
        assert_eq!(g.read(&g.memory_temperature_c, 0), Err(Fault::NotSupported));
        assert_eq!(g.read(&g.temperature_c, 0), Ok(50));
        assert_eq!(g.read(&g.temperature_c, 1000), Err(Fault::GpuLost));
        let h = &s.gpus[1];
        assert_eq!(h.read(&h.power_mw, 0), Err(Fault::NoPermission));
        assert_eq!(h.energy_mj(1000), Err(Fault::NoPermission));
    }

    #[test]
    fn fb_free_is_total_minus_reserved_minus_used() {
        let s = parse(
            "[[gpu]]\nfb_total_bytes = 1000\nfb_reserved_bytes = 100\nfb_used_bytes = [250, 900]\n",
        );
        let g = &s.gpus[0];
        assert_eq!(
            g.memory(0),
            Ok(MemoryReading {
                total: 1000,
                reserved: 100,
                free: 650,
                used: 250
            })
        );
        assert_eq!(g.memory(1000).map(|m| m.free), Ok(0));
    }

    #[test]
    fn init_error_is_parsed() {
        let s = parse("init_error = \"driver_not_loaded\"\n");
        assert_eq!(s.init_error, Some(Fault::DriverNotLoaded));
    }

    #[test]
    fn syntax_errors_name_line_and_column() {
        let e = error("[[gpu]]\ntemprature_c = 3\n");
        assert!(
            e.starts_with("line 2, column 1: unknown field `temprature_c`"),
            "{e}"
        );
        let e = error("[[gpu]]\npower_mw = -5\n");
        assert!(e.starts_with("line 2, column 12: "), "{e}");
        assert!(e.contains("negative"), "{e}");
        let e = error("[[gpu]]\npower_mw = \"missing\"\n");
        assert!(e.contains("unknown error name \"missing\""), "{e}");
        let e = error("[[gpu]]\npower_mw = []\n");
        assert!(e.contains("at least one value"), "{e}");
        let e = error("[[gpu]]\npower_mw = 1.5\n");
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn invalid_values_are_rejected_with_their_location() {
        let e = error("[[gpu]]\n[[gpu]]\ngpu_util_pct = [50, 101]\n");
        assert_eq!(
            e,
            "[[gpu]] entry 2 (gpu_util_pct): 101 is above 100, and utilization is a percentage"
        );
        let e = error("[[gpu]]\nfb_total_bytes = 10\nfb_used_bytes = 11\n");
        assert!(
            e.starts_with("[[gpu]] entry 1 (fb_used_bytes): 11 is above 10"),
            "{e}"
        );
        let e = error("[[gpu]]\ncount = 2\nuuid = \"GPU-x\"\n");
        assert!(
            e.starts_with("[[gpu]] entry 1 (uuid): identifies one GPU"),
            "{e}"
        );
        let e = error("[[gpu]]\nuuid = \"GPU-x\"\n[[gpu]]\nuuid = \"GPU-x\"\n");
        assert_eq!(e, "GPU 1: uuid \"GPU-x\" is used by an earlier GPU");
        let e = error("[[gpu]]\npci_bus_id = \"18:00.0\"\n");
        assert!(e.contains("not a PCI address"), "{e}");
        let e = error("step_ms = 0\n");
        assert!(e.starts_with("step_ms: "), "{e}");
        let e = error("[[gpu]]\ncount = 2000\n");
        assert!(e.contains("at most 1024"), "{e}");
        let e = error(&format!("[[gpu]]\nname = \"{}\"\n", "x".repeat(96)));
        assert!(e.contains("at most 95 fit"), "{e}");
        let e = error("[[gpu]]\npower_mw = 4294967296\n");
        assert!(e.contains("above 4294967295"), "{e}");
    }

    #[test]
    fn pci_addresses_parse_both_widths() {
        let a = PciAddress::parse("00000001:DB:00.0");
        assert_eq!(
            a,
            Some(PciAddress {
                domain: 1,
                bus: 0xdb,
                device: 0
            })
        );
        assert_eq!(
            PciAddress::parse("0000:18:1f.0").map(|a| a.bus_id()),
            Some("00000000:18:1F.0".to_owned())
        );
        assert_eq!(PciAddress::parse("0000:18:00.1"), None);
        assert_eq!(PciAddress::parse("0000:100:00.0"), None);
        assert_eq!(PciAddress::parse("0000::00.0"), None);
    }

    #[test]
    fn readme_examples_parse() {
        let readme = include_str!("../README.md");
        let blocks: Vec<&str> = readme
            .split("```toml\n")
            .skip(1)
            .filter_map(|rest| rest.split("```").next())
            .collect();
        assert_eq!(blocks.len(), 3, "the README's TOML examples");
        for block in &blocks {
            if let Err(e) = Scenario::parse(block) {
                panic!("README example does not parse: {e}\n{block}");
            }
        }
        let lost = parse(blocks[2]);
        let g = &lost.gpus[7];
        assert_eq!(g.read(&g.temperature_c, 59_999), Ok(71));
        assert_eq!(g.read(&g.temperature_c, 60_000), Err(Fault::GpuLost));
    }

    #[test]
    fn example_scenarios_parse() {
        for (file, text) in [
            ("two-gpus.toml", include_str!("../scenarios/two-gpus.toml")),
            ("h100x8.toml", include_str!("../scenarios/h100x8.toml")),
        ] {
            if let Err(e) = Scenario::parse(text) {
                panic!("{file}: {e}");
            }
        }
        let two = parse(include_str!("../scenarios/two-gpus.toml"));
        assert_eq!(two.gpus.len(), 2);
        let g1 = &two.gpus[1];
        assert_eq!(
            g1.read(&g1.memory_temperature_c, 0),
            Err(Fault::NotSupported)
        );
    }
}
