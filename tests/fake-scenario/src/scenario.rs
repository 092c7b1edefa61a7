//! The scenario file: which GPUs the fake libraries present and what each
//! of them reads over time. The format is documented in
//! `tests/fake-nvml/README.md`.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

use nvml_wrapper_sys::bindings::{
    NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE,
    NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE, NVML_SYSTEM_NVML_VERSION_BUFFER_SIZE,
};
use serde::Deserialize;

use crate::dcgm::{DcgmScenario, RawDcgm};
use crate::metric::{Fault, Metric, Sample};

/// The environment variable naming the scenario file, read at each first `nvmlInit`.
pub const SCENARIO_ENV: &str = "GPUTEL_FAKE_NVML_SCENARIO";

/// The scenario used when [`SCENARIO_ENV`] is unset or empty: eight moving H100s.
pub const DEFAULT_SCENARIO_TOML: &str = include_str!("../../fake-nvml/scenarios/h100x8.toml");

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
/// The H100 SXM5 board power limit.
const DEFAULT_POWER_LIMIT_MW: u64 = 700_000;
/// PCIe traffic of a training job that streams its input from the host.
const DEFAULT_PCIE_TX_BYTES_PER_S: u64 = 2_000_000_000;
const DEFAULT_PCIE_RX_BYTES_PER_S: u64 = 1_500_000_000;
/// NVLink traffic of data-parallel all-reduce on an HGX H100 (the links
/// carry up to 450 GB/s each way).
const DEFAULT_NVLINK_TX_BYTES_PER_S: u64 = 40_000_000_000;
const DEFAULT_NVLINK_RX_BYTES_PER_S: u64 = 36_000_000_000;
/// An H100 SXM5 on a PCIe 5.0 x16 link.
const DEFAULT_PCIE_LINK_GEN: u64 = 5;
const DEFAULT_PCIE_LINK_WIDTH: u64 = 16;

/// Rate × ms per counter unit: mW·ms per mJ, (B/s)·ms per byte.
const RATE_MS_PER_UNIT: u64 = 1000;
/// (B/s)·ms per KiB, the unit of the NVLink throughput counters.
const RATE_MS_PER_KIB: u64 = 1000 * 1024;

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

/// One XID error the GPU reports through the event API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XidEvent {
    /// When it happens, in ms since init.
    pub at_ms: u64,
    /// The XID (`nvmlEventData_t.eventData`), e.g. 79 for "fallen off the bus".
    pub xid: u64,
    /// The MIG GPU instance it is attributed to (`gpuInstanceId`); `None`
    /// reports 0xFFFFFFFF, no instance.
    pub gpu_instance_id: Option<u32>,
    /// The compute instance within it (`computeInstanceId`).
    pub compute_instance_id: Option<u32>,
}

/// The most MIG devices one GPU holds (seven on A100 and H100); also what
/// `nvmlDeviceGetMaxMigDeviceCount` reports for a MIG-capable GPU.
pub const MAX_MIG_DEVICES: usize = 7;

/// One MIG device: a compute instance within a GPU instance of a
/// MIG-enabled GPU, with its own handle, name, UUID, memory and processes.
#[derive(Debug, Clone, PartialEq)]
pub struct MigDevice {
    /// NVML GPU instance id (`nvmlDeviceGetGpuInstanceId`).
    pub gpu_instance_id: u32,
    /// NVML compute instance id within it (`nvmlDeviceGetComputeInstanceId`).
    pub compute_instance_id: u32,
    /// The profile, e.g. `1g.10gb`.
    pub profile: String,
    /// `nvmlDeviceGetName` of the MIG handle: `<GPU name> MIG <profile>`.
    pub name: String,
    /// `MIG-…` UUID.
    pub uuid: String,
    /// The instance's framebuffer, bytes.
    pub fb_total_bytes: u64,
    /// Reserved within it, bytes.
    pub fb_reserved_bytes: u64,
    /// Used, bytes.
    pub fb_used_bytes: Metric,
    /// Free, bytes, when the scenario gives it; else total − reserved − used.
    pub fb_free_bytes: Option<Metric>,
    /// GPM activity of the GPU instance (`nvmlGpmMigSampleGet`), %.
    pub graphics_active_pct: Metric<f64>,
    /// GPM SM active, %.
    pub sm_active_pct: Metric<f64>,
    /// GPM SM occupancy, %.
    pub sm_occupancy_pct: Metric<f64>,
    /// GPM tensor pipe active, %.
    pub tensor_active_pct: Metric<f64>,
    /// GPM DRAM active, %.
    pub dram_active_pct: Metric<f64>,
    /// Processes with a compute context on this instance.
    pub processes: Vec<Process>,
}

/// A process with a compute context on the GPU
/// (`nvmlDeviceGetComputeRunningProcesses_v3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Process {
    /// Process id.
    pub pid: u32,
    /// Framebuffer the process uses; `None` reports NVML_VALUE_NOT_AVAILABLE.
    pub used_memory_bytes: Option<u64>,
    /// First ms since init at which the process runs.
    #[serde(default)]
    pub from_ms: u64,
    /// First ms since init at which it no longer runs; `None`: never ends.
    pub until_ms: Option<u64>,
}

impl Process {
    /// Whether the process runs `elapsed_ms` after init.
    pub fn runs_at(&self, elapsed_ms: u64) -> bool {
        self.from_ms <= elapsed_ms && self.until_ms.is_none_or(|until| elapsed_ms < until)
    }
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
#[derive(Debug, Clone, PartialEq)]
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
    /// Video encoder utilization, % (`nvmlDeviceGetEncoderUtilization`).
    pub enc_util_pct: Metric,
    /// Video decoder utilization, % (`nvmlDeviceGetDecoderUtilization`).
    pub dec_util_pct: Metric,
    /// Framebuffer used, bytes.
    pub fb_used_bytes: Metric,
    /// Framebuffer free, bytes, when the scenario gives it (a capture's
    /// own reading); else total − reserved − used.
    pub fb_free_bytes: Option<Metric>,
    /// Enforced (and management) power limit, mW.
    pub power_limit_mw: Metric,
    /// Clock event (throttle) reasons, a bitmask of `nvmlClocksEventReason*`.
    pub clock_event_reasons: Metric,
    /// Volatile single-bit ECC errors (field NVML_FI_DEV_ECC_SBE_VOL_TOTAL).
    pub ecc_sbe_volatile: Metric,
    /// Volatile double-bit ECC errors (NVML_FI_DEV_ECC_DBE_VOL_TOTAL).
    pub ecc_dbe_volatile: Metric,
    /// Aggregate single-bit ECC errors (NVML_FI_DEV_ECC_SBE_AGG_TOTAL).
    pub ecc_sbe_aggregate: Metric,
    /// Aggregate double-bit ECC errors (NVML_FI_DEV_ECC_DBE_AGG_TOTAL).
    pub ecc_dbe_aggregate: Metric,
    /// Pages retired for single-bit errors (NVML_FI_DEV_RETIRED_SBE).
    pub retired_pages_sbe: Metric,
    /// Pages retired for double-bit errors (NVML_FI_DEV_RETIRED_DBE).
    pub retired_pages_dbe: Metric,
    /// 1 while a page retirement waits for a reboot (NVML_FI_DEV_RETIRED_PENDING).
    pub retired_pages_pending: Metric,
    /// Rows remapped for correctable errors (NVML_FI_DEV_REMAPPED_COR).
    pub remapped_rows_corrected: Metric,
    /// Rows remapped for uncorrectable errors (NVML_FI_DEV_REMAPPED_UNC).
    pub remapped_rows_uncorrected: Metric,
    /// 1 while a row remapping waits for a GPU reset (NVML_FI_DEV_REMAPPED_PENDING).
    pub remapped_rows_pending: Metric,
    /// 1 once a row remapping has failed (NVML_FI_DEV_REMAPPED_FAILURE).
    pub remapped_rows_failure: Metric,
    /// PCIe replays (NVML_FI_DEV_PCIE_REPLAY_COUNTER).
    pub pcie_replay_count: Metric,
    /// PCIe transmit rate, B/s, integrated into NVML_FI_DEV_PCIE_COUNT_TX_BYTES.
    pub pcie_tx_bytes_per_s: Metric,
    /// PCIe receive rate, B/s, integrated into NVML_FI_DEV_PCIE_COUNT_RX_BYTES.
    pub pcie_rx_bytes_per_s: Metric,
    /// NVLink transmit rate over all links, B/s (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, KiB).
    pub nvlink_tx_bytes_per_s: Metric,
    /// NVLink receive rate over all links, B/s (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, KiB).
    pub nvlink_rx_bytes_per_s: Metric,
    /// Whether the GPM API works on this GPU (Hopper and newer).
    pub gpm: bool,
    /// GPM NVML_GPM_METRIC_GRAPHICS_UTIL, %.
    pub graphics_active_pct: Metric<f64>,
    /// GPM NVML_GPM_METRIC_SM_UTIL (SM active), %.
    pub sm_active_pct: Metric<f64>,
    /// GPM NVML_GPM_METRIC_SM_OCCUPANCY, %.
    pub sm_occupancy_pct: Metric<f64>,
    /// GPM NVML_GPM_METRIC_ANY_TENSOR_UTIL (tensor pipe active), %.
    pub tensor_active_pct: Metric<f64>,
    /// GPM NVML_GPM_METRIC_DRAM_BW_UTIL (DRAM active), %.
    pub dram_active_pct: Metric<f64>,
    /// XID errors, sorted by time (events at the same time keep file order).
    pub xid_events: Vec<XidEvent>,
    /// From this ms since init on, every call for this GPU fails with
    /// NVML_ERROR_GPU_IS_LOST.
    pub lost_at_ms: Option<u64>,
    /// Processes with a compute context.
    pub processes: Vec<Process>,
    /// MIG mode now (`nvmlDeviceGetMigMode` current): 1 enabled, 0 disabled.
    pub mig_mode: Metric,
    /// MIG mode after the next GPU reset (pending).
    pub mig_mode_pending: Metric,
    /// The MIG devices, in `nvmlDeviceGetMigDeviceHandleByIndex` order.
    pub mig: Vec<MigDevice>,
    /// PCIe link generation now (`nvmlDeviceGetCurrPcieLinkGeneration`).
    pub pcie_link_gen: Metric,
    /// Highest PCIe link generation (`nvmlDeviceGetMaxPcieLinkGeneration`).
    pub pcie_link_gen_max: Metric,
    /// PCIe lanes now (`nvmlDeviceGetCurrPcieLinkWidth`).
    pub pcie_link_width: Metric,
    /// Most PCIe lanes (`nvmlDeviceGetMaxPcieLinkWidth`).
    pub pcie_link_width_max: Metric,
    /// Fan 0 speed, % of its maximum (`nvmlDeviceGetFanSpeed_v2`).
    pub fan_speed_pct: Metric,
    /// Performance state 0–15, or 32 for unknown (`nvmlDeviceGetPerformanceState`).
    pub performance_state: Metric,
}

impl Gpu {
    /// Whether MIG is enabled `elapsed_ms` after init.
    pub fn mig_enabled(&self, elapsed_ms: u64) -> bool {
        self.read(&self.mig_mode, elapsed_ms) == Ok(1)
    }

    /// The MIG device in handle slot `slot`, while MIG is enabled.
    pub fn mig_device(&self, slot: usize, elapsed_ms: u64) -> Option<&MigDevice> {
        self.mig.get(slot).filter(|_| self.mig_enabled(elapsed_ms))
    }

    /// The framebuffer of MIG device `mig` `elapsed_ms` after init.
    pub fn mig_memory(&self, mig: &MigDevice, elapsed_ms: u64) -> Result<MemoryReading, Fault> {
        let used = self.read(&mig.fb_used_bytes, elapsed_ms)?;
        let free = match &mig.fb_free_bytes {
            Some(free) => self.read(free, elapsed_ms)?,
            None => mig
                .fb_total_bytes
                .saturating_sub(mig.fb_reserved_bytes)
                .saturating_sub(used),
        };
        Ok(MemoryReading {
            total: mig.fb_total_bytes,
            reserved: mig.fb_reserved_bytes,
            free,
            used,
        })
    }

    /// The processes running `elapsed_ms` after init on the whole GPU, each
    /// with its MIG device (`None` outside MIG): the GPU's own, then each
    /// MIG device's, in scenario order.
    pub fn all_processes_at(
        &self,
        elapsed_ms: u64,
    ) -> impl Iterator<Item = (&Process, Option<&MigDevice>)> {
        let mig_on = self.mig_enabled(elapsed_ms);
        self.processes_at(elapsed_ms).map(|p| (p, None)).chain(
            self.mig.iter().filter(move |_| mig_on).flat_map(move |m| {
                m.processes
                    .iter()
                    .filter(move |p| p.runs_at(elapsed_ms))
                    .map(move |p| (p, Some(m)))
            }),
        )
    }

    /// The trace step this GPU is at `elapsed_ms` after init.
    pub fn step(&self, elapsed_ms: u64) -> u64 {
        (elapsed_ms / self.step_ms.max(1)).wrapping_add(self.offset_steps)
    }

    /// What `metric` (one of this GPU's fields) reads `elapsed_ms` after init.
    pub fn read<T: Copy>(&self, metric: &Metric<T>, elapsed_ms: u64) -> Result<T, Fault> {
        metric.at(self.step(elapsed_ms)).get()
    }

    /// Whether the GPU has fallen off the bus `elapsed_ms` after init.
    pub fn is_lost(&self, elapsed_ms: u64) -> bool {
        self.lost_at_ms.is_some_and(|lost| elapsed_ms >= lost)
    }

    /// A counter that integrates `rate` (one of this GPU's fields) from 0 at
    /// init: `floor(∫₀ᵗ rate dt / rate_ms_per_unit)`, `t` in ms, starting at
    /// this GPU's phase. Steps where the rate is an error count as 0; a rate
    /// that is an error constant fails the counter with that error.
    pub fn integrate(
        &self,
        rate: &Metric,
        rate_ms_per_unit: u64,
        elapsed_ms: u64,
    ) -> Result<u64, Fault> {
        if let Metric::Constant(Sample::Fault(f)) = rate {
            return Err(*f);
        }
        let step = u128::from(self.step_ms.max(1));
        let start = u128::from(self.offset_steps) * step;
        let end = start + u128::from(elapsed_ms);
        // The integral never decreases, so neither does the counter.
        let area = rate.integral(self.step_ms, end) - rate.integral(self.step_ms, start);
        let units = area / u128::from(rate_ms_per_unit.max(1));
        Ok(u64::try_from(units).unwrap_or(u64::MAX))
    }

    /// The total energy counter `elapsed_ms` after init, in mJ.
    pub fn energy_mj(&self, elapsed_ms: u64) -> Result<u64, Fault> {
        match &self.energy {
            Energy::Given(metric) => self.read(metric, elapsed_ms),
            // mW·ms = µJ, 1000 to the mJ.
            Energy::FromPower { initial_mj } => self
                .integrate(&self.power_mw, RATE_MS_PER_UNIT, elapsed_ms)
                .map(|mj| initial_mj.saturating_add(mj)),
        }
    }

    /// Bytes sent over PCIe since init (NVML_FI_DEV_PCIE_COUNT_TX_BYTES).
    pub fn pcie_tx_bytes(&self, elapsed_ms: u64) -> Result<u64, Fault> {
        self.integrate(&self.pcie_tx_bytes_per_s, RATE_MS_PER_UNIT, elapsed_ms)
    }

    /// Bytes received over PCIe since init (NVML_FI_DEV_PCIE_COUNT_RX_BYTES).
    pub fn pcie_rx_bytes(&self, elapsed_ms: u64) -> Result<u64, Fault> {
        self.integrate(&self.pcie_rx_bytes_per_s, RATE_MS_PER_UNIT, elapsed_ms)
    }

    /// KiB sent over all NVLinks since init (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX).
    pub fn nvlink_tx_kib(&self, elapsed_ms: u64) -> Result<u64, Fault> {
        self.integrate(&self.nvlink_tx_bytes_per_s, RATE_MS_PER_KIB, elapsed_ms)
    }

    /// KiB received over all NVLinks since init (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX).
    pub fn nvlink_rx_kib(&self, elapsed_ms: u64) -> Result<u64, Fault> {
        self.integrate(&self.nvlink_rx_bytes_per_s, RATE_MS_PER_KIB, elapsed_ms)
    }

    /// The XID events an event set can ever receive: those up to the moment
    /// the GPU is lost (the XID reported as it falls off included).
    pub fn deliverable_xid_events(&self) -> &[XidEvent] {
        let n = match self.lost_at_ms {
            Some(lost) => self.xid_events.partition_point(|e| e.at_ms <= lost),
            None => self.xid_events.len(),
        };
        &self.xid_events[..n]
    }

    /// The processes running `elapsed_ms` after init, in scenario order.
    pub fn processes_at(&self, elapsed_ms: u64) -> impl Iterator<Item = &Process> {
        self.processes.iter().filter(move |p| p.runs_at(elapsed_ms))
    }

    /// Framebuffer memory `elapsed_ms` after init.
    pub fn memory(&self, elapsed_ms: u64) -> Result<MemoryReading, Fault> {
        let used = self.read(&self.fb_used_bytes, elapsed_ms)?;
        let free = match &self.fb_free_bytes {
            Some(free) => self.read(free, elapsed_ms)?,
            None => self
                .fb_total_bytes
                .saturating_sub(self.fb_reserved_bytes)
                .saturating_sub(used),
        };
        Ok(MemoryReading {
            total: self.fb_total_bytes,
            reserved: self.fb_reserved_bytes,
            free,
            used,
        })
    }
}

/// A parsed, validated scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// `nvmlSystemGetDriverVersion`.
    pub driver_version: String,
    /// `nvmlSystemGetNVMLVersion`.
    pub nvml_version: String,
    /// When set, `nvmlInit` fails with this error (a node without a working driver).
    pub init_error: Option<Fault>,
    /// From this many ms after init on, every call about a GPU blocks
    /// forever (a driver that hangs).
    pub hang_at_ms: Option<u64>,
    /// The GPUs, in NVML index order.
    pub gpus: Vec<Gpu>,
    /// What the fake DCGM library presents besides the GPUs (`[dcgm]`).
    pub dcgm: DcgmScenario,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    driver_version: Option<String>,
    nvml_version: Option<String>,
    step_ms: Option<u64>,
    init_error: Option<Fault>,
    hang_at_ms: Option<u64>,
    #[serde(default)]
    gpu: Vec<RawGpu>,
    dcgm: Option<RawDcgm>,
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
    enc_util_pct: Option<Metric>,
    dec_util_pct: Option<Metric>,
    fb_used_bytes: Option<Metric>,
    fb_free_bytes: Option<Metric>,
    power_limit_mw: Option<Metric>,
    clock_event_reasons: Option<Metric>,
    ecc_sbe_volatile: Option<Metric>,
    ecc_dbe_volatile: Option<Metric>,
    ecc_sbe_aggregate: Option<Metric>,
    ecc_dbe_aggregate: Option<Metric>,
    retired_pages_sbe: Option<Metric>,
    retired_pages_dbe: Option<Metric>,
    retired_pages_pending: Option<Metric>,
    remapped_rows_corrected: Option<Metric>,
    remapped_rows_uncorrected: Option<Metric>,
    remapped_rows_pending: Option<Metric>,
    remapped_rows_failure: Option<Metric>,
    pcie_replay_count: Option<Metric>,
    pcie_tx_bytes_per_s: Option<Metric>,
    pcie_rx_bytes_per_s: Option<Metric>,
    nvlink_tx_bytes_per_s: Option<Metric>,
    nvlink_rx_bytes_per_s: Option<Metric>,
    gpm: Option<bool>,
    graphics_active_pct: Option<Metric<f64>>,
    sm_active_pct: Option<Metric<f64>>,
    sm_occupancy_pct: Option<Metric<f64>>,
    tensor_active_pct: Option<Metric<f64>>,
    dram_active_pct: Option<Metric<f64>>,
    xid_events: Option<Vec<XidEvent>>,
    lost_at_ms: Option<u64>,
    processes: Option<Vec<Process>>,
    mig_mode: Option<Metric>,
    mig_mode_pending: Option<Metric>,
    mig: Option<Vec<RawMig>>,
    pcie_link_gen: Option<Metric>,
    pcie_link_gen_max: Option<Metric>,
    pcie_link_width: Option<Metric>,
    pcie_link_width_max: Option<Metric>,
    fan_speed_pct: Option<Metric>,
    performance_state: Option<Metric>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMig {
    gpu_instance_id: u32,
    compute_instance_id: Option<u32>,
    profile: String,
    uuid: Option<String>,
    fb_total_bytes: u64,
    fb_reserved_bytes: Option<u64>,
    fb_used_bytes: Option<Metric>,
    fb_free_bytes: Option<Metric>,
    graphics_active_pct: Option<Metric<f64>>,
    sm_active_pct: Option<Metric<f64>>,
    sm_occupancy_pct: Option<Metric<f64>>,
    tensor_active_pct: Option<Metric<f64>>,
    dram_active_pct: Option<Metric<f64>>,
    processes: Option<Vec<Process>>,
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

    /// The built-in scenario (`tests/fake-nvml/scenarios/h100x8.toml`).
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
        let unsupported = |m: Option<Metric>| m.unwrap_or(Metric::fault(Fault::NotSupported));
        let percent = |m: Option<Metric<f64>>| m.unwrap_or(Metric::constant(0.0));
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
            enc_util_pct: metric(g.enc_util_pct, 0),
            dec_util_pct: metric(g.dec_util_pct, 0),
            fb_used_bytes: metric(g.fb_used_bytes, 0),
            fb_free_bytes: g.fb_free_bytes,
            power_limit_mw: metric(g.power_limit_mw, DEFAULT_POWER_LIMIT_MW),
            clock_event_reasons: metric(g.clock_event_reasons, 0),
            ecc_sbe_volatile: metric(g.ecc_sbe_volatile, 0),
            ecc_dbe_volatile: metric(g.ecc_dbe_volatile, 0),
            ecc_sbe_aggregate: metric(g.ecc_sbe_aggregate, 0),
            ecc_dbe_aggregate: metric(g.ecc_dbe_aggregate, 0),
            // Hopper remaps rows instead of retiring pages.
            retired_pages_sbe: unsupported(g.retired_pages_sbe),
            retired_pages_dbe: unsupported(g.retired_pages_dbe),
            retired_pages_pending: unsupported(g.retired_pages_pending),
            remapped_rows_corrected: metric(g.remapped_rows_corrected, 0),
            remapped_rows_uncorrected: metric(g.remapped_rows_uncorrected, 0),
            remapped_rows_pending: metric(g.remapped_rows_pending, 0),
            remapped_rows_failure: metric(g.remapped_rows_failure, 0),
            pcie_replay_count: metric(g.pcie_replay_count, 0),
            pcie_tx_bytes_per_s: metric(g.pcie_tx_bytes_per_s, DEFAULT_PCIE_TX_BYTES_PER_S),
            pcie_rx_bytes_per_s: metric(g.pcie_rx_bytes_per_s, DEFAULT_PCIE_RX_BYTES_PER_S),
            nvlink_tx_bytes_per_s: metric(g.nvlink_tx_bytes_per_s, DEFAULT_NVLINK_TX_BYTES_PER_S),
            nvlink_rx_bytes_per_s: metric(g.nvlink_rx_bytes_per_s, DEFAULT_NVLINK_RX_BYTES_PER_S),
            gpm: g.gpm.unwrap_or(true),
            graphics_active_pct: percent(g.graphics_active_pct),
            sm_active_pct: percent(g.sm_active_pct),
            sm_occupancy_pct: percent(g.sm_occupancy_pct),
            tensor_active_pct: percent(g.tensor_active_pct),
            dram_active_pct: percent(g.dram_active_pct),
            xid_events: {
                let mut events = g.xid_events.unwrap_or_default();
                // Stable: two events at the same time stay in file order.
                events.sort_by_key(|e| e.at_ms);
                events
            },
            lost_at_ms: g.lost_at_ms,
            processes: g.processes.unwrap_or_default(),
            mig_mode_pending: g
                .mig_mode_pending
                .or_else(|| g.mig_mode.clone())
                .unwrap_or(Metric::constant(0)),
            mig_mode: metric(g.mig_mode, 0),
            mig: Vec::new(),
            pcie_link_gen: metric(g.pcie_link_gen, DEFAULT_PCIE_LINK_GEN),
            pcie_link_gen_max: metric(g.pcie_link_gen_max, DEFAULT_PCIE_LINK_GEN),
            pcie_link_width: metric(g.pcie_link_width, DEFAULT_PCIE_LINK_WIDTH),
            pcie_link_width_max: metric(g.pcie_link_width_max, DEFAULT_PCIE_LINK_WIDTH),
            // SXM boards are cooled by the chassis: no fan of their own.
            fan_speed_pct: unsupported(g.fan_speed_pct),
            performance_state: metric(g.performance_state, 0),
        };
        let mut template = template;
        template.mig = build_mig(&at, &template, g.mig.unwrap_or_default())?;

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
            ("power_limit_mw", &template.power_limit_mw),
            ("remapped_rows_corrected", &template.remapped_rows_corrected),
            (
                "remapped_rows_uncorrected",
                &template.remapped_rows_uncorrected,
            ),
        ] {
            check_max(&at(key), m, u32_max, nvml_u32)?;
        }
        for (key, m) in [
            ("retired_pages_pending", &template.retired_pages_pending),
            ("remapped_rows_pending", &template.remapped_rows_pending),
            ("remapped_rows_failure", &template.remapped_rows_failure),
            ("mig_mode", &template.mig_mode),
            ("mig_mode_pending", &template.mig_mode_pending),
        ] {
            check_max(&at(key), m, 1, "and this field is a flag: 0 or 1")?;
        }
        for (key, m) in [
            ("graphics_active_pct", &template.graphics_active_pct),
            ("sm_active_pct", &template.sm_active_pct),
            ("sm_occupancy_pct", &template.sm_occupancy_pct),
            ("tensor_active_pct", &template.tensor_active_pct),
            ("dram_active_pct", &template.dram_active_pct),
        ] {
            check_percent(&at(key), m)?;
        }
        check_processes(&at("processes"), &template.processes)?;
        for (key, m) in [
            ("gpu_util_pct", &template.gpu_util_pct),
            ("memory_copy_util_pct", &template.memory_copy_util_pct),
            ("enc_util_pct", &template.enc_util_pct),
            ("dec_util_pct", &template.dec_util_pct),
            ("fan_speed_pct", &template.fan_speed_pct),
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
            for m in &mut gpu.mig {
                if m.uuid.is_empty() {
                    m.uuid = default_mig_uuid(index, m.gpu_instance_id, m.compute_instance_id);
                }
            }
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
        for m in &gpu.mig {
            if !uuids.insert(m.uuid.as_str()) {
                return Err(invalid(
                    at.clone(),
                    format!("MIG uuid \"{}\" is used by an earlier device", m.uuid),
                ));
            }
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

    let dcgm = raw
        .dcgm
        .unwrap_or_default()
        .build()
        .map_err(|(key, problem)| invalid(format!("[dcgm] {key}"), problem))?;

    Ok(Scenario {
        driver_version,
        nvml_version,
        init_error: raw.init_error,
        hang_at_ms: raw.hang_at_ms,
        gpus,
        dcgm,
    })
}

/// The MIG devices of one `[[gpu]]` entry, checked against the GPU:
/// only on a GPU whose `mig_mode` is 1 throughout, with distinct
/// (GPU instance, compute instance) ids, and no processes outside them.
fn build_mig(
    at: &dyn Fn(&str) -> String,
    gpu: &Gpu,
    raw: Vec<RawMig>,
) -> Result<Vec<MigDevice>, ScenarioError> {
    if raw.is_empty() {
        for e in &gpu.xid_events {
            if e.gpu_instance_id.is_some() || e.compute_instance_id.is_some() {
                return Err(invalid(
                    at("xid_events"),
                    "an event names a MIG instance but the GPU has no [[gpu.mig]] devices",
                ));
            }
        }
        return Ok(Vec::new());
    }
    if gpu.mig_mode != Metric::constant(1) {
        return Err(invalid(
            at("mig"),
            "MIG devices need mig_mode = 1 (enabled) on their GPU",
        ));
    }
    if !gpu.processes.is_empty() {
        return Err(invalid(
            at("processes"),
            "a MIG-enabled GPU runs processes on its MIG devices: list them under [[gpu.mig]]",
        ));
    }
    if raw.len() > MAX_MIG_DEVICES {
        return Err(invalid(
            at("mig"),
            format!(
                "{} MIG devices; a GPU holds at most {MAX_MIG_DEVICES}",
                raw.len()
            ),
        ));
    }
    let mut out: Vec<MigDevice> = Vec::with_capacity(raw.len());
    for (i, m) in raw.into_iter().enumerate() {
        let at = |key: &str| at(&format!("mig {}, {key}", i + 1));
        let compute_instance_id = m.compute_instance_id.unwrap_or(0);
        if out.iter().any(|o| {
            o.gpu_instance_id == m.gpu_instance_id && o.compute_instance_id == compute_instance_id
        }) {
            return Err(invalid(
                at("gpu_instance_id"),
                format!(
                    "GPU instance {} compute instance {compute_instance_id} is listed twice",
                    m.gpu_instance_id
                ),
            ));
        }
        if m.profile.is_empty() {
            return Err(invalid(
                at("profile"),
                "must name the profile, e.g. \"1g.10gb\"",
            ));
        }
        let name = format!("{} MIG {}", gpu.name, m.profile);
        check_c_string(&at("profile"), &name, NVML_DEVICE_NAME_V2_BUFFER_SIZE)?;
        if let Some(uuid) = &m.uuid {
            check_c_string(&at("uuid"), uuid, NVML_DEVICE_UUID_V2_BUFFER_SIZE)?;
        }
        let fb_reserved_bytes = m.fb_reserved_bytes.unwrap_or(0);
        if fb_reserved_bytes > m.fb_total_bytes {
            return Err(invalid(
                at("fb_reserved_bytes"),
                format!(
                    "{fb_reserved_bytes} is more than fb_total_bytes ({})",
                    m.fb_total_bytes
                ),
            ));
        }
        let percent = |p: Option<Metric<f64>>| p.unwrap_or(Metric::constant(0.0));
        let device = MigDevice {
            gpu_instance_id: m.gpu_instance_id,
            compute_instance_id,
            profile: m.profile,
            name,
            uuid: m.uuid.unwrap_or_default(),
            fb_total_bytes: m.fb_total_bytes,
            fb_reserved_bytes,
            fb_used_bytes: m.fb_used_bytes.unwrap_or(Metric::constant(0)),
            fb_free_bytes: m.fb_free_bytes,
            graphics_active_pct: percent(m.graphics_active_pct),
            sm_active_pct: percent(m.sm_active_pct),
            sm_occupancy_pct: percent(m.sm_occupancy_pct),
            tensor_active_pct: percent(m.tensor_active_pct),
            dram_active_pct: percent(m.dram_active_pct),
            processes: m.processes.unwrap_or_default(),
        };
        check_max(
            &at("fb_used_bytes"),
            &device.fb_used_bytes,
            device.fb_total_bytes - fb_reserved_bytes,
            "fb_total_bytes - fb_reserved_bytes of the MIG device",
        )?;
        for (key, p) in [
            ("graphics_active_pct", &device.graphics_active_pct),
            ("sm_active_pct", &device.sm_active_pct),
            ("sm_occupancy_pct", &device.sm_occupancy_pct),
            ("tensor_active_pct", &device.tensor_active_pct),
            ("dram_active_pct", &device.dram_active_pct),
        ] {
            check_percent(&at(key), p)?;
        }
        check_processes(&at("processes"), &device.processes)?;
        out.push(device);
    }
    for e in &gpu.xid_events {
        let known = match (e.gpu_instance_id, e.compute_instance_id) {
            (None, None) => true,
            (Some(gi), ci) => out.iter().any(|m| {
                m.gpu_instance_id == gi && ci.is_none_or(|ci| m.compute_instance_id == ci)
            }),
            (None, Some(_)) => false,
        };
        if !known {
            return Err(invalid(
                at("xid_events"),
                format!(
                    "XID {} at {} ms names GPU instance {:?} compute instance {:?}, \
                     which is not among the GPU's [[gpu.mig]] devices",
                    e.xid, e.at_ms, e.gpu_instance_id, e.compute_instance_id
                ),
            ));
        }
    }
    Ok(out)
}

/// The UUID a MIG device gets when the scenario gives none.
fn default_mig_uuid(gpu: u32, gi: u32, ci: u32) -> String {
    format!("MIG-{gpu:08x}-fake-4{gi:03x}-8{ci:03x}-000000000000")
}

fn check_percent(at: &str, metric: &Metric<f64>) -> Result<(), ScenarioError> {
    for sample in metric.samples() {
        if let Sample::Value(v) = sample
            && *v > 100.0
        {
            return Err(invalid(
                at,
                format!("{v} is above 100, and GPM and DCGM activity is a percentage"),
            ));
        }
    }
    Ok(())
}

fn check_processes(at: &str, processes: &[Process]) -> Result<(), ScenarioError> {
    for (i, p) in processes.iter().enumerate() {
        if let Some(until) = p.until_ms
            && until <= p.from_ms
        {
            return Err(invalid(
                at,
                format!(
                    "pid {}: until_ms ({until}) must be after from_ms ({}); \
                     the process runs from from_ms up to, not including, until_ms",
                    p.pid, p.from_ms
                ),
            ));
        }
        if p.used_memory_bytes == Some(u64::MAX) {
            return Err(invalid(
                at,
                format!(
                    "pid {}: used_memory_bytes = {} is NVML_VALUE_NOT_AVAILABLE; \
                     leave the key out to report memory as not available",
                    p.pid,
                    u64::MAX
                ),
            ));
        }
        let overlaps = |q: &Process| {
            q.pid == p.pid
                && q.until_ms.is_none_or(|until| p.from_ms < until)
                && p.until_ms.is_none_or(|until| q.from_ms < until)
        };
        if processes[..i].iter().any(overlaps) {
            return Err(invalid(
                at,
                format!(
                    "pid {} is listed twice at overlapping times; one process has one entry per GPU",
                    p.pid
                ),
            ));
        }
    }
    Ok(())
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
        // GPM activity moves with utilization and stays a percentage.
        assert!(gpu.gpm);
        let sm_active: Vec<f64> = (0..60)
            .filter_map(|t| gpu.read(&gpu.sm_active_pct, t * 1000).ok())
            .collect();
        assert_eq!(sm_active.len(), 60);
        assert_eq!(sm_active.iter().copied().fold(f64::MAX, f64::min), 0.0);
        assert_eq!(sm_active.iter().copied().fold(0.0, f64::max), 92.0);
        for t in 0..60 {
            let read = |m: &Metric<f64>| gpu.read(m, t * 1000).unwrap_or(f64::NAN);
            let (gr, sm, occ, tensor, dram) = (
                read(&gpu.graphics_active_pct),
                read(&gpu.sm_active_pct),
                read(&gpu.sm_occupancy_pct),
                read(&gpu.tensor_active_pct),
                read(&gpu.dram_active_pct),
            );
            assert!(
                gr >= sm && sm >= tensor && tensor >= occ && occ >= dram && dram >= 0.0,
                "step {t}: {gr} {sm} {occ} {tensor} {dram}"
            );
        }
        let reasons: Vec<u64> = (0..60)
            .filter_map(|t| gpu.read(&gpu.clock_event_reasons, t * 1000).ok())
            .collect();
        assert_eq!(reasons.iter().filter(|r| **r == 4).count(), 7);
        assert_eq!(reasons.iter().filter(|r| **r == 1).count(), 3);
        assert!(gpu.xid_events.is_empty() && gpu.processes.is_empty());
        assert_eq!(gpu.lost_at_ms, None);

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

        assert_eq!(g.read(&g.power_limit_mw, 5), Ok(700_000));
        assert_eq!(g.read(&g.clock_event_reasons, 5), Ok(0));
        for ecc in [
            &g.ecc_sbe_volatile,
            &g.ecc_dbe_volatile,
            &g.ecc_sbe_aggregate,
            &g.ecc_dbe_aggregate,
            &g.remapped_rows_corrected,
            &g.remapped_rows_uncorrected,
            &g.remapped_rows_pending,
            &g.remapped_rows_failure,
            &g.pcie_replay_count,
        ] {
            assert_eq!(g.read(ecc, 5), Ok(0));
        }
        for retired in [
            &g.retired_pages_sbe,
            &g.retired_pages_dbe,
            &g.retired_pages_pending,
        ] {
            assert_eq!(g.read(retired, 5), Err(Fault::NotSupported));
        }
        // One second at the default rates.
        assert_eq!(g.pcie_tx_bytes(1000), Ok(2_000_000_000));
        assert_eq!(g.pcie_rx_bytes(1000), Ok(1_500_000_000));
        assert_eq!(g.nvlink_tx_kib(1000), Ok(40_000_000_000 / 1024));
        assert_eq!(g.nvlink_rx_kib(1000), Ok(36_000_000_000 / 1024));
        assert_eq!(g.pcie_tx_bytes(0), Ok(0));
        assert!(g.gpm);
        for pct in [
            &g.graphics_active_pct,
            &g.sm_active_pct,
            &g.sm_occupancy_pct,
            &g.tensor_active_pct,
            &g.dram_active_pct,
        ] {
            assert_eq!(g.read(pct, 5), Ok(0.0));
        }
        assert!(g.xid_events.is_empty());
        assert_eq!(g.lost_at_ms, None);
        assert!(!g.is_lost(u64::MAX));
        assert!(g.processes.is_empty());
    }

    #[test]
    fn counters_integrate_their_rates_like_energy() {
        let s = parse(
            r#"
            step_ms = 1000
            [[gpu]]
            pcie_tx_bytes_per_s = [1000, 3000]
            pcie_rx_bytes_per_s = "unsupported"
            nvlink_tx_bytes_per_s = [1024000, "gpu_lost"]
            nvlink_rx_bytes_per_s = 1023
            "#,
        );
        let g = &s.gpus[0];
        // 1 s at 1000 B/s, then 0.5 s at 3000 B/s; then a whole 2 s cycle more.
        assert_eq!(g.pcie_tx_bytes(1500), Ok(1000 + 1500));
        assert_eq!(g.pcie_tx_bytes(3500), Ok(1000 + 1500 + 4000));
        assert_eq!(g.pcie_rx_bytes(1500), Err(Fault::NotSupported));
        // 1000 KiB/s for 1 s; the error step counts as 0.
        assert_eq!(g.nvlink_tx_kib(1000), Ok(1000));
        assert_eq!(g.nvlink_tx_kib(1999), Ok(1000));
        assert_eq!(g.nvlink_tx_kib(2500), Ok(1500));
        // Whole KiB only: 1023 B/s reaches 1 KiB just after one second.
        assert_eq!(g.nvlink_rx_kib(1000), Ok(0));
        assert_eq!(g.nvlink_rx_kib(1001), Ok(1));
    }

    #[test]
    fn events_loss_processes_and_gpm_are_parsed() {
        let s = parse(
            r#"
            [[gpu]]
            gpm = false
            sm_active_pct = [87.5, 90]
            power_limit_mw = 650000
            clock_event_reasons = [0, 32]
            retired_pages_pending = 1
            remapped_rows_failure = [0, 1]
            lost_at_ms = 60000
            xid_events = [
                { at_ms = 60000, xid = 79 },
                { at_ms = 1500, xid = 48 },
                { at_ms = 70000, xid = 31 },
                { at_ms = 1500, xid = 63 },
            ]
            processes = [
                { pid = 4242, used_memory_bytes = 1073741824, until_ms = 99999999 },
                { pid = 7, from_ms = 1000, until_ms = 2000 },
                { pid = 4242, used_memory_bytes = 5, from_ms = 999999999 },
            ]
            "#,
        );
        let g = &s.gpus[0];
        assert!(!g.gpm);
        assert_eq!(g.read(&g.sm_active_pct, 0), Ok(87.5));
        assert_eq!(g.read(&g.sm_active_pct, 1000), Ok(90.0));
        assert_eq!(g.read(&g.power_limit_mw, 0), Ok(650_000));
        assert_eq!(g.read(&g.clock_event_reasons, 1000), Ok(32));
        assert_eq!(g.read(&g.retired_pages_pending, 0), Ok(1));
        let xids: Vec<_> = g.xid_events.iter().map(|e| (e.at_ms, e.xid)).collect();
        assert_eq!(
            xids,
            [(1500, 48), (1500, 63), (60000, 79), (70000, 31)],
            "sorted by time, equal times in file order"
        );
        // The XID 79 reported as the GPU falls off is the last one delivered.
        assert_eq!(g.deliverable_xid_events().len(), 3);
        assert!(!g.is_lost(59_999));
        assert!(g.is_lost(60_000));
        let running = |t| g.processes_at(t).map(|p| p.pid).collect::<Vec<_>>();
        assert_eq!(running(0), [4242]);
        assert_eq!(running(1000), [4242, 7]);
        assert_eq!(running(1999), [4242, 7]);
        assert_eq!(running(2000), [4242]);
        assert_eq!(g.processes[1].used_memory_bytes, None);
    }

    #[test]
    fn new_keys_are_validated() {
        let e = error("[[gpu]]\nretired_pages_pending = 2\n");
        assert_eq!(
            e,
            "[[gpu]] entry 1 (retired_pages_pending): 2 is above 1, and this field is a flag: 0 or 1"
        );
        let e = error("[[gpu]]\nremapped_rows_failure = [0, 3]\n");
        assert!(e.contains("(remapped_rows_failure): 3 is above 1"), "{e}");
        let e = error("[[gpu]]\nsm_active_pct = [50, 100.5]\n");
        assert_eq!(
            e,
            "[[gpu]] entry 1 (sm_active_pct): 100.5 is above 100, and GPM and DCGM activity is a percentage"
        );
        let e = error("[[gpu]]\npower_limit_mw = 4294967296\n");
        assert!(
            e.contains("(power_limit_mw): 4294967296 is above 4294967295"),
            "{e}"
        );
        let e = error("[[gpu]]\nremapped_rows_corrected = 1.5\n");
        assert!(e.contains("1.5 is not an integer"), "{e}");
        let e = error("[[gpu]]\ngpm = 1\n");
        assert!(e.starts_with("line 2, column 7: "), "{e}");
        let e = error("[[gpu]]\nxid_events = [{ at_ms = 1, xid = 79, gpu = 0 }]\n");
        assert!(e.contains("unknown field `gpu`"), "{e}");
        let e = error("[[gpu]]\nprocesses = [{ pid = 1, from_ms = 5, until_ms = 5 }]\n");
        assert!(
            e.starts_with(
                "[[gpu]] entry 1 (processes): pid 1: until_ms (5) must be after from_ms (5)"
            ),
            "{e}"
        );
        let e =
            error("[[gpu]]\nprocesses = [{ pid = 1, until_ms = 10 }, { pid = 1, from_ms = 9 }]\n");
        assert!(
            e.contains("pid 1 is listed twice at overlapping times"),
            "{e}"
        );
        let e = error(&format!(
            "[[gpu]]\nprocesses = [{{ pid = 1, used_memory_bytes = {} }}]\n",
            u64::MAX
        ));
        assert!(e.contains("is NVML_VALUE_NOT_AVAILABLE"), "{e}");
        // Back to back, the same pid is two runs, not an overlap.
        parse("[[gpu]]\nprocesses = [{ pid = 1, until_ms = 10 }, { pid = 1, from_ms = 10 }]\n");
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
    fn hang_at_ms_is_parsed() {
        assert_eq!(parse("hang_at_ms = 2500\n").hang_at_ms, Some(2500));
        assert_eq!(parse("").hang_at_ms, None);
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
        let e = error("[[gpu]]\ndec_util_pct = 250\n");
        assert_eq!(
            e,
            "[[gpu]] entry 1 (dec_util_pct): 250 is above 100, and utilization is a percentage"
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
        let readme = include_str!("../../fake-nvml/README.md");
        let blocks: Vec<&str> = readme
            .split("```toml\n")
            .skip(1)
            .filter_map(|rest| rest.split("```").next())
            .collect();
        assert_eq!(blocks.len(), 6, "the README's TOML examples");
        for block in &blocks {
            if let Err(e) = Scenario::parse(block) {
                panic!("README example does not parse: {e}\n{block}");
            }
        }
        assert_eq!(
            parse(blocks[2]),
            parse(include_str!("../../fake-nvml/scenarios/two-gpus.toml")),
            "the README's complete example is scenarios/two-gpus.toml"
        );
        let mig = parse(blocks[1]);
        assert_eq!(mig.gpus[0].mig.len(), 1);
        let lost = parse(blocks[3]);
        let g = &lost.gpus[7];
        assert_eq!(g.read(&g.temperature_c, 59_999), Ok(71));
        assert_eq!(g.read(&g.temperature_c, 60_000), Err(Fault::GpuLost));
        let bad_day = parse(blocks[4]);
        let g = &bad_day.gpus[0];
        assert_eq!(g.read(&g.ecc_dbe_volatile, 29_999), Ok(0));
        assert_eq!(g.read(&g.ecc_dbe_volatile, 30_000), Ok(2));
        assert_eq!(g.deliverable_xid_events().len(), 3);
        assert!(g.is_lost(60_000) && !g.is_lost(59_999));
        assert_eq!(g.processes_at(9_999).count(), 1);
        assert_eq!(g.processes_at(10_000).count(), 2);
        assert_eq!(g.read(&g.sm_active_pct, 0), Ok(71.5));
        let dcgm = parse(blocks[5]);
        assert_eq!(
            dcgm.dcgm,
            crate::DcgmScenario {
                version: "3.3.9".into(),
                host_engine: Some(crate::HostEngine::Tcp("127.0.0.1:5555".into())),
                embedded: true,
                profiler: crate::Profiler::Busy,
            }
        );
        assert!(!dcgm.gpus[0].gpm);
        assert_eq!(dcgm.gpus[0].read(&dcgm.gpus[0].sm_active_pct, 0), Ok(62.5));
    }

    #[test]
    fn the_dcgm_table_is_checked_like_the_rest() {
        assert_eq!(parse("").dcgm, crate::DcgmScenario::default());
        let none = parse("[dcgm]\nhost_engine = \"\"\nembedded = false\n");
        assert_eq!(none.dcgm.host_engine, None);
        assert!(!none.dcgm.embedded);
        assert_eq!(
            parse("[dcgm]\nhost_engine = \"unix:///run/dcgm.sock\"\n")
                .dcgm
                .host_engine,
            Some(crate::HostEngine::Unix("/run/dcgm.sock".into()))
        );
        assert_eq!(
            error("[dcgm]\nhost_engine = \"unix://dcgm.sock\"\n"),
            "[dcgm] host_engine: \"unix://dcgm.sock\": a Unix socket is written unix:///absolute/path"
        );
        let err = error("[dcgm]\nprofiler = \"taken\"\n");
        assert!(
            err.starts_with(
                "line 2, column 12: unknown variant `taken`, expected one of `free`, `busy`"
            ),
            "{err}"
        );
        let err = error("[dcgm]\nhostengine = \"127.0.0.1:5555\"\n");
        assert!(err.contains("unknown field `hostengine`"), "{err}");
    }

    #[test]
    fn example_scenarios_parse() {
        for (file, text) in [
            (
                "two-gpus.toml",
                include_str!("../../fake-nvml/scenarios/two-gpus.toml"),
            ),
            (
                "h100x8.toml",
                include_str!("../../fake-nvml/scenarios/h100x8.toml"),
            ),
            (
                "a100x2.toml",
                include_str!("../../fake-nvml/scenarios/a100x2.toml"),
            ),
        ] {
            if let Err(e) = Scenario::parse(text) {
                panic!("{file}: {e}");
            }
        }
        let two = parse(include_str!("../../fake-nvml/scenarios/two-gpus.toml"));
        assert_eq!(two.gpus.len(), 2);
        let g1 = &two.gpus[1];
        assert_eq!(
            g1.read(&g1.memory_temperature_c, 0),
            Err(Fault::NotSupported)
        );
        assert!(two.gpus[0].gpm && !g1.gpm);
        let g0 = &two.gpus[0];
        assert_eq!(g0.read(&g0.sm_active_pct, 0), Ok(87.5));
        let pids: Vec<_> = g0
            .processes_at(0)
            .map(|p| (p.pid, p.used_memory_bytes))
            .collect();
        assert_eq!(pids, [(4242, Some(40 << 30))]);
    }

    #[test]
    fn mig_devices_are_parsed_and_checked() {
        let s = parse(
            r#"
            [[gpu]]
            name = "NVIDIA H100 80GB HBM3"
            mig_mode = 1
            xid_events = [{ at_ms = 5, xid = 31, gpu_instance_id = 9 }]
            [[gpu.mig]]
            gpu_instance_id = 9
            profile = "1g.10gb"
            fb_total_bytes = 10468982784
            fb_used_bytes = [1024, 2048]
            processes = [{ pid = 4242, used_memory_bytes = 1024 }]
            "#,
        );
        let g = &s.gpus[0];
        assert!(g.mig_enabled(0));
        let m = &g.mig[0];
        assert_eq!(m.name, "NVIDIA H100 80GB HBM3 MIG 1g.10gb");
        assert_eq!(m.uuid, "MIG-00000000-fake-4009-8000-000000000000");
        assert_eq!(m.compute_instance_id, 0);
        assert_eq!(
            g.mig_memory(m, 1000).map(|r| (r.used, r.free)),
            Ok((2048, 10468982784 - 2048))
        );
        let on: Vec<_> = g
            .all_processes_at(0)
            .map(|(p, m)| (p.pid, m.map(|m| m.gpu_instance_id)))
            .collect();
        assert_eq!(on, [(4242, Some(9))]);
        assert_eq!(g.read(&g.mig_mode_pending, 0), Ok(1));
        assert_eq!(g.read(&g.fan_speed_pct, 0), Err(Fault::NotSupported));

        let e = error(
            "[[gpu]]\n[[gpu.mig]]\ngpu_instance_id = 1\nprofile = \"1g.10gb\"\nfb_total_bytes = 1\n",
        );
        assert_eq!(
            e,
            "[[gpu]] entry 1 (mig): MIG devices need mig_mode = 1 (enabled) on their GPU"
        );
        let e = error(
            "[[gpu]]\nmig_mode = 1\n[[gpu.mig]]\ngpu_instance_id = 1\nprofile = \"a\"\nfb_total_bytes = 1\n\
             [[gpu.mig]]\ngpu_instance_id = 1\nprofile = \"b\"\nfb_total_bytes = 1\n",
        );
        assert!(
            e.contains(
                "(mig 2, gpu_instance_id): GPU instance 1 compute instance 0 is listed twice"
            ),
            "{e}"
        );
        let e = error("[[gpu]]\nxid_events = [{ at_ms = 1, xid = 79, gpu_instance_id = 3 }]\n");
        assert!(e.contains("the GPU has no [[gpu.mig]] devices"), "{e}");
        let e = error(
            "[[gpu]]\nmig_mode = 1\nprocesses = [{ pid = 1 }]\n[[gpu.mig]]\ngpu_instance_id = 1\nprofile = \"a\"\nfb_total_bytes = 1\n",
        );
        assert!(e.contains("list them under [[gpu.mig]]"), "{e}");
    }
}
