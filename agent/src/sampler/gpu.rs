//! GPUs through NVML (`nvml-wrapper`). The library is loaded once; a machine
//! without the NVIDIA driver is a normal state that the agent reports once.
//!
//! Per tick and GPU: identity (the PCI address is read once, at start),
//! temperatures, power and its limit, energy, clocks, utilization (GPU,
//! memory copy, video encoder and decoder), framebuffer, clock event
//! ("throttle") reasons, and
//! one `nvmlDeviceGetFieldValues` call for memory temperature, ECC, retired
//! pages, remapped rows, PCIe replays and the PCIe and NVLink byte counters.
//! GPM (Hopper and newer) gives SM, tensor and DRAM activity between two
//! ticks; on GPUs without GPM (Volta to Ampere), or for every GPU with
//! `--profiling-source dcgm`, DCGM's profiling fields give the same columns
//! (`dcgm.rs`), and `profiling_source` says which one filled a row. XID
//! errors arrive on their own thread through NVML's event API.
//! Compute processes are listed at a slower cadence: those calls are slow and
//! hold a driver lock.
//!
//! What costs NVML milliseconds of CPU is read at the slow-read cadence
//! (`--slow-read-interval`, 10 s), its columns null on the ticks between:
//! the energy counter (3-4 ms a read on an H200 with driver 580, against
//! 2-50 µs for every per-tick call; `benches/README.md`, *On a real GPU*),
//! the PCIe byte and replay counters (0.35 ms for the three fields), GPM's
//! graphics engine activity (1 ms to compute, the other four metrics 1 µs
//! each) and MIG mode (0.13 ms). Rates and averages of those (PCIe bytes
//! per second, `power_avg_mw`) span the time between two slow reads.
//! Counter rates (those, and NVLink's per tick) divide by the time between
//! the readings as made, on a monotonic clock: a tick the agent woke late
//! for does not stretch or shrink them.
//!
//! A MIG-enabled GPU gives one row of its own, with what is physical
//! (temperatures, power, energy, clocks, ECC, PCIe, NVLink), and one row per
//! MIG device (framebuffer, GPM, processes, job), found when NVML is loaded.
//! Every additive reading is on exactly one of these rows, so sums over rows
//! (node power, framebuffer used) stay right.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use gputel_proto::{EventKind, GpuEvent, GpuProcess, GpuSample};
use nvml_wrapper::EventSet;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, PerformanceState, TemperatureSensor};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::gpm::{GpmSample, gpm_metrics_get};
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::nvmlEventData_t;
use tracing::{debug, info, warn};

use super::dcgm::{Activity, DcgmOptions, DcgmProfiler, Readings};
use super::{SampleError, Sampler, Source, Tick};
use crate::clock::{Cadence, monotonic_us, now_us};
use gputel_proto::ProfilingSource;
use gputel_proto::clock_event_reasons as reason;

/// The library NVML ships as, found through the dynamic loader's search path.
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";

/// NVML field ids read in one `nvmlDeviceGetFieldValues` call per GPU and tick.
mod field {
    pub const MEMORY_TEMP: u32 = 82;
    pub const ECC_SBE_VOL_TOTAL: u32 = 3;
    pub const ECC_DBE_VOL_TOTAL: u32 = 4;
    pub const ECC_SBE_AGG_TOTAL: u32 = 5;
    pub const ECC_DBE_AGG_TOTAL: u32 = 6;
    pub const RETIRED_SBE: u32 = 29;
    pub const RETIRED_DBE: u32 = 30;
    pub const RETIRED_PENDING: u32 = 31;
    pub const PCIE_REPLAY_COUNTER: u32 = 94;
    /// KiB transmitted over all NVLinks since the driver loaded.
    pub const NVLINK_THROUGHPUT_DATA_TX: u32 = 138;
    pub const NVLINK_THROUGHPUT_DATA_RX: u32 = 139;
    pub const REMAPPED_COR: u32 = 142;
    pub const REMAPPED_UNC: u32 = 143;
    pub const REMAPPED_PENDING: u32 = 144;
    pub const REMAPPED_FAILURE: u32 = 145;
    /// Bytes over PCIe since the driver loaded.
    pub const PCIE_COUNT_TX_BYTES: u32 = 197;
    pub const PCIE_COUNT_RX_BYTES: u32 = 198;

    /// The ids read at every tick.
    pub const TICK: &[u32] = &[
        MEMORY_TEMP,
        ECC_SBE_VOL_TOTAL,
        ECC_DBE_VOL_TOTAL,
        ECC_SBE_AGG_TOTAL,
        ECC_DBE_AGG_TOTAL,
        RETIRED_SBE,
        RETIRED_DBE,
        RETIRED_PENDING,
        NVLINK_THROUGHPUT_DATA_TX,
        NVLINK_THROUGHPUT_DATA_RX,
        REMAPPED_COR,
        REMAPPED_UNC,
        REMAPPED_PENDING,
        REMAPPED_FAILURE,
    ];

    /// The ids read only at slow-read ticks: 110-150 µs each on an H200
    /// (driver 580), the others 3-12 µs.
    pub const SLOW: &[u32] = &[
        PCIE_REPLAY_COUNTER,
        PCIE_COUNT_TX_BYTES,
        PCIE_COUNT_RX_BYTES,
    ];
}

/// [`field::TICK`] as NVML field ids, built once rather than at every tick.
static TICK_FIELD_IDS: std::sync::LazyLock<Vec<FieldId>> =
    std::sync::LazyLock::new(|| field::TICK.iter().map(|id| FieldId(*id)).collect());

/// [`field::TICK`] and [`field::SLOW`], for a slow-read tick's one call.
static ALL_FIELD_IDS: std::sync::LazyLock<Vec<FieldId>> = std::sync::LazyLock::new(|| {
    field::TICK
        .iter()
        .chain(field::SLOW)
        .map(|id| FieldId(*id))
        .collect()
});

/// GPM metrics, in GpuSample order: SM, SM occupancy, tensor, DRAM,
/// graphics/compute engine.
const GPM_METRICS: [GpmMetricId; 5] = [
    GpmMetricId::SmUtil,
    GpmMetricId::SmOccupancy,
    GpmMetricId::AnyTensorUtil,
    GpmMetricId::DramBwUtil,
    GpmMetricId::GraphicsUtil,
];

/// Where the GPM metrics computed at slow-read ticks only start in
/// [`GPM_METRICS`]: graphics engine activity costs NVML about 1 ms of CPU to
/// compute, the other four about 1 µs each (H200, driver 580).
const GPM_SLOW_FROM: usize = 4;

/// GPM samples kept between ticks: the previous tick's, for the per-tick
/// metrics, and the previous slow-read tick's, for the others.
#[derive(Default)]
struct GpmSamples {
    tick: Option<GpmSample<'static>>,
    slow: Option<GpmSample<'static>>,
}

// GPM and DCGM fill the same five columns, in the same order.
const _: () = assert!(GPM_METRICS.len() == super::dcgm::FIELDS.len());

/// Where SM, tensor and DRAM activity come from (`--profiling-source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Profiling {
    /// GPM on the GPUs that have it (Hopper and newer), DCGM on the others.
    #[default]
    Auto,
    /// GPM only; DCGM is never loaded.
    Gpm,
    /// DCGM for every GPU; GPM only for a GPU DCGM does not read.
    Dcgm,
}

/// How long the XID thread blocks in one wait before it checks for shutdown.
const XID_WAIT_MS: u32 = 500;

/// Why GPUs cannot be sampled on this machine.
#[derive(Debug, thiserror::Error)]
pub enum GpuUnavailable {
    #[error(
        "NVIDIA driver library {lib} could not be loaded ({reason}); is the NVIDIA driver installed?"
    )]
    NoLibrary { lib: String, reason: String },
    #[error("NVIDIA driver library {lib} is loaded but the driver is not running")]
    DriverNotLoaded { lib: String },
    #[error(
        "no permission to talk to the NVIDIA driver through {lib}; run as a user that can open /dev/nvidia*"
    )]
    NoPermission { lib: String },
    #[error("NVML in {lib} failed to start: {source}")]
    Init {
        lib: String,
        #[source]
        source: NvmlError,
    },
    #[error("NVML could not count GPUs: {0}")]
    Count(#[source] NvmlError),
}

/// A GPU metric that NVML failed to give for a reason other than "not supported".
#[derive(Debug, thiserror::Error)]
#[error("GPU {gpu}: {metric}: {source}")]
pub struct GpuError {
    pub gpu: u32,
    pub metric: &'static str,
    #[source]
    pub source: NvmlError,
}

/// Options for [`GpuSampler::open`].
#[derive(Debug, Clone)]
pub struct GpuOptions {
    /// NVML library to load; the system's by default.
    pub lib: Option<PathBuf>,
    /// Where procfs is mounted, for process names.
    pub procfs_root: PathBuf,
    /// Time between process listings, in microseconds.
    pub process_interval_us: i64,
    /// Time between reads of what costs NVML milliseconds (the energy and
    /// PCIe counters, graphics engine activity, MIG mode), in microseconds.
    pub slow_read_interval_us: i64,
    /// Where SM, tensor and DRAM activity come from.
    pub profiling: Profiling,
    /// How to reach DCGM, when it is used.
    pub dcgm: DcgmOptions,
}

/// Counter readings kept from the previous tick (NVLink) or slow-read tick
/// (energy, PCIe), for rates.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    /// When they were read, on a monotonic clock ([`monotonic_us`]).
    ts_us: i64,
    energy_mj: Option<u64>,
    pcie_tx_bytes: Option<u64>,
    pcie_rx_bytes: Option<u64>,
    nvlink_tx_kib: Option<u64>,
    nvlink_rx_kib: Option<u64>,
}

/// One MIG device (a compute instance of a GPU instance) of a MIG-enabled GPU.
struct MigInstance {
    device: Device<'static>,
    gpu_instance_id: u32,
    compute_instance_id: u32,
    /// From the MIG device's name, e.g. "1g.10gb".
    profile: Option<String>,
    uuid: String,
    /// As [`GpuState::gpm`], for the GPU instance (`nvmlGpmMigSampleGet`).
    gpm: Option<GpmSamples>,
}

/// One GPU and what is remembered of it between ticks.
struct GpuState {
    index: u32,
    uuid: String,
    model: String,
    /// NVML's `busId`, e.g. "00000000:18:00.0"; None when NVML cannot say.
    pci_bus_id: Option<String>,
    device: Device<'static>,
    /// The MIG devices, when MIG was enabled as NVML was loaded.
    instances: Vec<MigInstance>,
    /// None when the GPU has no GPM.
    gpm: Option<GpmSamples>,
    /// False when NVML says the GPU has no fans (SXM boards are cooled by
    /// the chassis), whose speed is then not asked for.
    fans: bool,
    /// The previous tick's counters, and the previous slow-read tick's.
    prev: Option<Counters>,
    prev_slow: Option<Counters>,
    prev_reasons: Option<u64>,
    lost: bool,
}

impl std::fmt::Debug for GpuState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuState")
            .field("index", &self.index)
            .field("uuid", &self.uuid)
            .field("gpm", &self.gpm.is_some())
            .field("mig_devices", &self.instances.len())
            .field("lost", &self.lost)
            .finish()
    }
}

/// An XID seen by the event thread, waiting for the next tick.
#[derive(Debug, Clone, Copy)]
struct Xid {
    gpu: u32,
    xid: u64,
    ts_us: i64,
    /// The MIG instance NVML attributes it to, if any.
    gpu_instance_id: Option<u32>,
    compute_instance_id: Option<u32>,
}

impl Xid {
    /// Whether the XID belongs on the row of MIG device (gi, ci) of its GPU
    /// (None: the GPU's own row). An XID NVML attributes to a GPU instance
    /// only counts on each of its compute instances.
    fn on(&self, gpu: u32, instance: Option<(u32, u32)>) -> bool {
        self.gpu == gpu
            && match (instance, self.gpu_instance_id) {
                (None, gi) => gi.is_none(),
                (Some(_), None) => false,
                (Some((gi, ci)), Some(x_gi)) => {
                    gi == x_gi && self.compute_instance_id.is_none_or(|x_ci| x_ci == ci)
                }
            }
    }
}

/// Samples every GPU NVML reports.
#[derive(Debug)]
pub struct GpuSampler {
    gpus: Vec<GpuState>,
    driver_version: Option<String>,
    xids: Arc<Mutex<Vec<Xid>>>,
    xid_watcher: Option<XidWatcher>,
    procfs_root: PathBuf,
    process_listing: Cadence,
    slow_reads: Cadence,
    /// Reads the profiling fields of the GPUs GPM does not cover (or of
    /// all, with `--profiling-source dcgm`); None when DCGM is not used.
    dcgm: Option<DcgmProfiler>,
}

impl GpuSampler {
    /// Loads NVML and lists the GPUs; starts the XID event thread.
    pub fn open(options: &GpuOptions) -> Result<Self, GpuUnavailable> {
        let lib = options.lib.as_deref();
        let lib_name = lib.map_or_else(|| DEFAULT_NVML_LIB.to_owned(), |p| p.display().to_string());
        let mut builder = Nvml::builder();
        builder.lib_path(lib.map_or(OsStr::new(DEFAULT_NVML_LIB), Path::as_os_str));
        let nvml = builder.init().map_err(|e| match e {
            NvmlError::LibloadingError(e) => GpuUnavailable::NoLibrary {
                lib: lib_name.clone(),
                reason: e.to_string(),
            },
            NvmlError::FailedToLoadSymbol(s) => GpuUnavailable::NoLibrary {
                lib: lib_name.clone(),
                reason: format!("symbol {s} missing"),
            },
            NvmlError::DriverNotLoaded => GpuUnavailable::DriverNotLoaded {
                lib: lib_name.clone(),
            },
            NvmlError::NoPermission => GpuUnavailable::NoPermission {
                lib: lib_name.clone(),
            },
            source => GpuUnavailable::Init {
                lib: lib_name.clone(),
                source,
            },
        })?;
        // NVML stays loaded for the life of the process: devices, GPM samples
        // and the event set all borrow it, and threads share it.
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let count = nvml.device_count().map_err(GpuUnavailable::Count)?;
        let mut gpus = Vec::with_capacity(count as usize);
        let mut without_gpm = Vec::new();
        for index in 0..count {
            let device = match nvml.device_by_index(index) {
                Ok(device) => device,
                Err(e) => {
                    warn!(gpu = index, error = %e, "GPU skipped: NVML cannot open it");
                    continue;
                }
            };
            let gpm = match device.gpm_support() {
                Ok(true) => Some(GpmSamples::default()),
                _ => {
                    without_gpm.push(index);
                    None
                }
            };
            let instances = mig_instances(nvml, &device, index, gpm.is_some());
            gpus.push(GpuState {
                index,
                uuid: device.uuid().unwrap_or_default(),
                model: device.name().unwrap_or_default(),
                pci_bus_id: device.pci_info().ok().map(|p| p.bus_id),
                // A driver without nvmlDeviceGetNumFans: ask for the speed.
                fans: device.num_fans().map_or(true, |n| n > 0),
                device,
                instances,
                gpm,
                prev: None,
                prev_slow: None,
                prev_reasons: None,
                lost: false,
            });
        }
        if !without_gpm.is_empty() {
            let how = match options.profiling {
                Profiling::Gpm => {
                    "their SM, tensor and DRAM activity stay null (--profiling-source gpm)"
                }
                Profiling::Auto | Profiling::Dcgm => {
                    "their SM, tensor and DRAM activity come from DCGM when it is there"
                }
            };
            info!(
                gpus = ?without_gpm,
                "no GPM on these GPUs (it needs Hopper or newer): {how}"
            );
        }
        let dcgm = open_dcgm(options, &gpus);
        let xids = Arc::new(Mutex::new(Vec::new()));
        let xid_watcher = XidWatcher::start(nvml, &gpus, Arc::clone(&xids));
        Ok(Self {
            gpus,
            driver_version: nvml.sys_driver_version().ok(),
            xids,
            xid_watcher,
            procfs_root: options.procfs_root.clone(),
            process_listing: Cadence::new(options.process_interval_us),
            slow_reads: Cadence::new(options.slow_read_interval_us),
            dcgm,
        })
    }

    /// GPUs being sampled.
    pub fn gpu_count(&self) -> usize {
        self.gpus.len()
    }

    /// The driver's version, e.g. "550.54.15".
    pub fn driver_version(&self) -> Option<&str> {
        self.driver_version.as_deref()
    }
}

impl Sampler for GpuSampler {
    fn source(&self) -> Source {
        Source::Gpu
    }

    /// One row per reachable GPU, the events since the last tick and, when
    /// due, the compute processes. Unsupported metrics are left unset; other
    /// failures are unset too, and reported.
    fn sample(&mut self, tick: &mut Tick) {
        let ts_us = tick.ts_us;
        let batch = &mut tick.batch;
        let xids = std::mem::take(&mut *self.xids.lock().unwrap_or_else(|e| e.into_inner()));
        for x in &xids {
            if let Some(gpu) = self.gpus.iter().find(|g| g.index == x.gpu) {
                batch.event.push(GpuEvent {
                    ts_us: x.ts_us,
                    gpu: x.gpu,
                    uuid: gpu.uuid.clone(),
                    kind: EventKind::Xid.into(),
                    code: x.xid,
                    gpu_instance_id: x.gpu_instance_id,
                    compute_instance_id: x.compute_instance_id,
                    ..GpuEvent::default()
                });
            }
        }
        let readings = match self.dcgm.as_mut() {
            Some(dcgm) => dcgm.read(ts_us, &mut tick.errors),
            None => Readings::default(),
        };
        let list_processes = self.process_listing.due(ts_us);
        tick.processes_listed = list_processes;
        let slow = self.slow_reads.due(ts_us);
        for gpu in &mut self.gpus {
            let mut read = Reader {
                gpu: gpu.index,
                errors: &mut tick.errors,
                lost: None,
            };
            let xid_count = xids.iter().filter(|x| x.on(gpu.index, None)).count() as u32;
            let dcgm = readings.get(gpu.index);
            let sample = sample_device(
                gpu,
                Due { ts_us, slow },
                xid_count,
                dcgm,
                &mut read,
                &mut batch.event,
            );
            if let Some(detail) = read.lost.take() {
                if !gpu.lost {
                    warn!(gpu = gpu.index, uuid = %gpu.uuid, "GPU lost: {detail}; the other GPUs are still sampled");
                    batch.event.push(GpuEvent {
                        ts_us,
                        gpu: gpu.index,
                        uuid: gpu.uuid.clone(),
                        kind: EventKind::GpuLost.into(),
                        code: 0,
                        detail,
                        ..GpuEvent::default()
                    });
                }
                gpu.lost = true;
                continue;
            }
            if gpu.lost {
                info!(gpu = gpu.index, uuid = %gpu.uuid, "GPU answers again");
                gpu.lost = false;
            }
            batch.gpu.push(sample);
            sample_instances(gpu, Due { ts_us, slow }, &xids, &mut read, &mut batch.gpu);
            if list_processes {
                list_compute_processes(
                    gpu,
                    ts_us,
                    &self.procfs_root,
                    &mut read,
                    &mut batch.gpu_process,
                );
            }
        }
    }
}

impl Drop for GpuSampler {
    fn drop(&mut self) {
        if let Some(watcher) = self.xid_watcher.take() {
            watcher.stop();
        }
    }
}

/// Collects failures while one device is read.
struct Reader<'a> {
    gpu: u32,
    errors: &'a mut Vec<SampleError>,
    /// Set when NVML says the GPU is lost.
    lost: Option<String>,
}

impl Reader<'_> {
    /// The value, or None: silently for "not supported", recorded otherwise.
    fn get<T>(&mut self, metric: &'static str, result: Result<T, NvmlError>) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(NvmlError::NotSupported) => None,
            Err(NvmlError::GpuLost) => {
                self.lost
                    .get_or_insert_with(|| format!("{metric}: {}", NvmlError::GpuLost));
                None
            }
            Err(source) => {
                self.errors.push(SampleError::Gpu(GpuError {
                    gpu: self.gpu,
                    metric,
                    source,
                }));
                None
            }
        }
    }
}

/// Whether `row` was made at a slow-read tick: it holds one of the columns
/// read only then (graphics engine activity counts when GPM gave it; DCGM
/// gives it at every tick).
pub fn has_slow_readings(row: &GpuSample) -> bool {
    row.energy_mj.is_some()
        || row.power_avg_mw.is_some()
        || row.pcie_replay_count.is_some()
        || row.pcie_tx_bytes_per_s.is_some()
        || row.pcie_rx_bytes_per_s.is_some()
        || row.mig_mode.is_some()
        || (row.gr_engine_active_pct.is_some()
            && row.profiling_source == Some(ProfilingSource::Gpm.into()))
}

/// Fills the columns read only at slow-read ticks that `row` lacks from
/// `held`, an earlier row of the same GPU or MIG device: what a scrape
/// between two slow reads shows.
pub fn hold_slow_readings(held: &GpuSample, row: &mut GpuSample) {
    fn hold<T: Copy>(to: &mut Option<T>, from: Option<T>) {
        if to.is_none() {
            *to = from;
        }
    }
    hold(&mut row.energy_mj, held.energy_mj);
    hold(&mut row.power_avg_mw, held.power_avg_mw);
    hold(&mut row.pcie_replay_count, held.pcie_replay_count);
    hold(&mut row.pcie_tx_bytes_per_s, held.pcie_tx_bytes_per_s);
    hold(&mut row.pcie_rx_bytes_per_s, held.pcie_rx_bytes_per_s);
    hold(&mut row.mig_mode, held.mig_mode);
    hold(&mut row.gr_engine_active_pct, held.gr_engine_active_pct);
}

/// Clears the columns read only at slow-read ticks: `row` as a tick between
/// two slow reads sends it (the simulated agents of `gputel-loadgen`). The
/// same columns as [`has_slow_readings`] and [`hold_slow_readings`].
pub fn clear_slow_readings(row: &mut GpuSample) {
    row.energy_mj = None;
    row.power_avg_mw = None;
    row.pcie_replay_count = None;
    row.pcie_tx_bytes_per_s = None;
    row.pcie_rx_bytes_per_s = None;
    row.mig_mode = None;
    row.gr_engine_active_pct = None;
}

/// One `nvmlDeviceGetFieldValues` call's results, by field id.
#[derive(Debug, Default)]
struct Fields {
    values: Vec<(u32, u64)>,
}

impl Fields {
    /// The per-tick fields, and at slow-read ticks the slow ones too.
    fn read(device: &Device<'static>, slow: bool, read: &mut Reader<'_>) -> Fields {
        let ids = if slow {
            &*ALL_FIELD_IDS
        } else {
            &*TICK_FIELD_IDS
        };
        let Some(samples) = read.get("field_values", device.field_values_for(ids)) else {
            return Fields::default();
        };
        let mut values = Vec::with_capacity(samples.len());
        for (id, sample) in ids.iter().zip(samples) {
            let value = sample.and_then(|s| s.value);
            if let Some(v) = read.get(field_name(id.0), value).and_then(sample_as_u64) {
                values.push((id.0, v));
            }
        }
        Fields { values }
    }

    fn get(&self, id: u32) -> Option<u64> {
        self.values.iter().find(|(i, _)| *i == id).map(|(_, v)| *v)
    }

    fn get_u32(&self, id: u32) -> Option<u32> {
        self.get(id).and_then(|v| u32::try_from(v).ok())
    }

    fn get_bool(&self, id: u32) -> Option<bool> {
        self.get(id).map(|v| v != 0)
    }
}

fn field_name(id: u32) -> &'static str {
    match id {
        field::MEMORY_TEMP => "memory_temperature",
        field::ECC_SBE_VOL_TOTAL
        | field::ECC_DBE_VOL_TOTAL
        | field::ECC_SBE_AGG_TOTAL
        | field::ECC_DBE_AGG_TOTAL => "ecc_errors",
        field::RETIRED_SBE | field::RETIRED_DBE | field::RETIRED_PENDING => "retired_pages",
        field::PCIE_REPLAY_COUNTER => "pcie_replay_counter",
        field::NVLINK_THROUGHPUT_DATA_TX | field::NVLINK_THROUGHPUT_DATA_RX => "nvlink_bytes",
        field::REMAPPED_COR
        | field::REMAPPED_UNC
        | field::REMAPPED_PENDING
        | field::REMAPPED_FAILURE => "remapped_rows",
        field::PCIE_COUNT_TX_BYTES | field::PCIE_COUNT_RX_BYTES => "pcie_bytes",
        _ => "field_value",
    }
}

/// A tick's time, and whether the slow reads are due at it.
#[derive(Debug, Clone, Copy)]
struct Due {
    ts_us: i64,
    slow: bool,
}

/// One GPU's own row. Its activity comes from `dcgm` when DCGM reads the
/// GPU, else from GPM.
fn sample_device(
    gpu: &mut GpuState,
    Due { ts_us, slow }: Due,
    xid_count: u32,
    dcgm: Option<&Activity>,
    read: &mut Reader<'_>,
    events: &mut Vec<GpuEvent>,
) -> GpuSample {
    let device = &gpu.device;
    let temperature_c = read.get("temperature", device.temperature(TemperatureSensor::Gpu));
    if read.lost.is_some() {
        // A lost GPU fails every call; one is enough to know.
        return GpuSample::default();
    }
    let utilization = read.get("utilization", device.utilization_rates());
    let encoder = read.get("encoder_utilization", device.encoder_utilization());
    let decoder = read.get("decoder_utilization", device.decoder_utilization());
    // A MIG-enabled GPU's framebuffer is on its MIG devices' rows.
    let memory = if gpu.instances.is_empty() {
        read.get("memory_info", device.memory_info())
    } else {
        None
    };
    let power_mw = read.get("power", device.power_usage());
    let energy_mj = if slow {
        read.get("energy", device.total_energy_consumption())
    } else {
        None
    };
    let reasons = read
        .get("clock_event_reasons", device.current_throttle_reasons())
        .map(|r| r.bits());
    // When the counters were read: their rates span the time between two
    // readings as made, however late a tick's wake-up was. Taken right
    // before the field values (NVLink, PCIe), whose reads then start the
    // same time after it at every tick; energy, read only at slow ticks,
    // the same time before it at every slow tick.
    let read_at_us = monotonic_us();
    let fields = Fields::read(device, slow, read);
    let (activity, source) = match dcgm {
        Some(activity) => {
            // GPM starts over with two fresh samples should DCGM stop.
            if let Some(samples) = gpu.gpm.as_mut() {
                *samples = GpmSamples::default();
            }
            (*activity, ProfilingSource::Dcgm)
        }
        None => {
            let take = || device.gpm_sample();
            let activity = gpu
                .gpm
                .as_mut()
                .map(|samples| sample_gpm(device.nvml(), samples, slow, take, "gpm_sample", read))
                .unwrap_or_default();
            (activity, ProfilingSource::Gpm)
        }
    };

    let now = Counters {
        ts_us: read_at_us,
        nvlink_tx_kib: fields.get(field::NVLINK_THROUGHPUT_DATA_TX),
        nvlink_rx_kib: fields.get(field::NVLINK_THROUGHPUT_DATA_RX),
        ..Counters::default()
    };
    let prev = gpu.prev.replace(now);
    let rate = |pick: fn(&Counters) -> Option<u64>, unit: u64| -> Option<u64> {
        per_second(prev.as_ref(), &now, pick, unit)
    };
    let slow_now = slow.then(|| Counters {
        ts_us: read_at_us,
        energy_mj,
        pcie_tx_bytes: fields.get(field::PCIE_COUNT_TX_BYTES),
        pcie_rx_bytes: fields.get(field::PCIE_COUNT_RX_BYTES),
        ..Counters::default()
    });
    let prev_slow = match slow_now {
        Some(now) => gpu.prev_slow.replace(now),
        None => None,
    };
    let slow_rate = |pick: fn(&Counters) -> Option<u64>, unit: u64| -> Option<u64> {
        per_second(prev_slow.as_ref(), slow_now.as_ref()?, pick, unit)
    };
    let sample = GpuSample {
        ts_us,
        gpu: gpu.index,
        uuid: gpu.uuid.clone(),
        model: gpu.model.clone(),
        pci_bus_id: gpu.pci_bus_id.clone(),
        temperature_c,
        memory_temperature_c: fields.get_u32(field::MEMORY_TEMP),
        power_mw,
        energy_mj,
        sm_clock_mhz: read.get("sm_clock", device.clock_info(Clock::SM)),
        memory_clock_mhz: read.get("memory_clock", device.clock_info(Clock::Memory)),
        gpu_util_pct: utilization.as_ref().map(|u| u.gpu),
        memory_copy_util_pct: utilization.as_ref().map(|u| u.memory),
        enc_util_pct: encoder.map(|u| u.utilization),
        dec_util_pct: decoder.map(|u| u.utilization),
        fb_used_bytes: memory.as_ref().map(|m| m.used),
        fb_free_bytes: memory.as_ref().map(|m| m.free),
        fb_total_bytes: memory.as_ref().map(|m| m.total),
        fb_reserved_bytes: memory.as_ref().map(|m| m.reserved),
        sm_active_pct: activity[0],
        sm_occupancy_pct: activity[1],
        tensor_active_pct: activity[2],
        dram_active_pct: activity[3],
        gr_engine_active_pct: activity[4],
        profiling_source: profiling_source(&activity, source),
        power_limit_mw: read.get("power_limit", device.enforced_power_limit()),
        power_avg_mw: slow_rate(|c| c.energy_mj, 1).and_then(|mw| u32::try_from(mw).ok()),
        clock_event_reasons: reasons,
        ecc_corrected_volatile: fields.get(field::ECC_SBE_VOL_TOTAL),
        ecc_uncorrected_volatile: fields.get(field::ECC_DBE_VOL_TOTAL),
        ecc_corrected_aggregate: fields.get(field::ECC_SBE_AGG_TOTAL),
        ecc_uncorrected_aggregate: fields.get(field::ECC_DBE_AGG_TOTAL),
        retired_pages_sbe: fields.get(field::RETIRED_SBE),
        retired_pages_dbe: fields.get(field::RETIRED_DBE),
        retired_pages_pending: fields.get_bool(field::RETIRED_PENDING),
        remapped_rows_corrected: fields.get_u32(field::REMAPPED_COR),
        remapped_rows_uncorrected: fields.get_u32(field::REMAPPED_UNC),
        remapped_rows_pending: fields.get_bool(field::REMAPPED_PENDING),
        remapped_rows_failure: fields.get_bool(field::REMAPPED_FAILURE),
        pcie_replay_count: fields.get(field::PCIE_REPLAY_COUNTER),
        pcie_tx_bytes_per_s: slow_rate(|c| c.pcie_tx_bytes, 1),
        pcie_rx_bytes_per_s: slow_rate(|c| c.pcie_rx_bytes, 1),
        nvlink_tx_bytes_per_s: rate(|c| c.nvlink_tx_kib, 1024),
        nvlink_rx_bytes_per_s: rate(|c| c.nvlink_rx_kib, 1024),
        xid_count,
        mig_mode: if slow {
            read.get("mig_mode", device.mig_mode())
                .map(|m| m.current == nvml_wrapper_sys::bindings::NVML_DEVICE_MIG_ENABLE)
        } else {
            None
        },
        pcie_link_gen: read.get("pcie_link_gen", device.current_pcie_link_gen()),
        pcie_link_gen_max: read.get("pcie_link_gen_max", device.max_pcie_link_gen()),
        pcie_link_width: read.get("pcie_link_width", device.current_pcie_link_width()),
        pcie_link_width_max: read.get("pcie_link_width_max", device.max_pcie_link_width()),
        fan_speed_pct: if gpu.fans {
            read.get("fan_speed", device.fan_speed(0))
        } else {
            None
        },
        performance_state: read
            .get("performance_state", device.performance_state())
            .and_then(pstate_number),
        ..GpuSample::default()
    };
    // The start of a throttling episode is an event: a reason bit that was
    // clear at the previous tick and is set now.
    if let Some(now_bits) = reasons {
        let started = now_bits & !gpu.prev_reasons.unwrap_or(0);
        for (mask, kind) in [
            (reason::THERMAL, EventKind::ThermalThrottle),
            (reason::POWER, EventKind::PowerThrottle),
        ] {
            if started & mask != 0 && gpu.prev_reasons.is_some() {
                events.push(GpuEvent {
                    ts_us,
                    gpu: gpu.index,
                    uuid: gpu.uuid.clone(),
                    kind: kind.into(),
                    code: now_bits,
                    ..GpuEvent::default()
                });
            }
        }
    }
    gpu.prev_reasons = reasons;
    sample
}

/// `source`, as a row's `profiling_source`, when any of `activity` is set.
fn profiling_source(activity: &Activity, source: ProfilingSource) -> Option<i32> {
    activity
        .iter()
        .any(Option::is_some)
        .then_some(source.into())
}

/// DCGM for the GPUs `options.profiling` gives it (MIG-enabled GPUs are
/// left to GPM: DCGM's profiling fields are read per GPU here); None when
/// there are none, or DCGM cannot be loaded, which is said once.
fn open_dcgm(options: &GpuOptions, gpus: &[GpuState]) -> Option<DcgmProfiler> {
    let wanted: Vec<(u32, String)> = gpus
        .iter()
        .filter(|g| g.instances.is_empty())
        .filter(|g| match options.profiling {
            Profiling::Auto => g.gpm.is_none(),
            Profiling::Dcgm => true,
            Profiling::Gpm => false,
        })
        .map(|g| (g.index, g.uuid.clone()))
        .collect();
    if wanted.is_empty() {
        return None;
    }
    let indices: Vec<u32> = wanted.iter().map(|(index, _)| *index).collect();
    match DcgmProfiler::open(&options.dcgm, wanted, now_us()) {
        Ok(dcgm) => Some(dcgm),
        Err(e) => {
            let instead = match options.profiling {
                Profiling::Dcgm => "they come from GPM where the GPU has it, else stay null",
                Profiling::Auto | Profiling::Gpm => "they stay null",
            };
            warn!(
                gpus = ?indices,
                "SM activity, SM occupancy, tensor and DRAM activity of these GPUs are not read through DCGM ({instead}): {e}"
            );
            None
        }
    }
}

/// P0–P15 as 0–15; None for "unknown".
fn pstate_number(state: PerformanceState) -> Option<u32> {
    use PerformanceState as P;
    let n = match state {
        P::Zero => 0,
        P::One => 1,
        P::Two => 2,
        P::Three => 3,
        P::Four => 4,
        P::Five => 5,
        P::Six => 6,
        P::Seven => 7,
        P::Eight => 8,
        P::Nine => 9,
        P::Ten => 10,
        P::Eleven => 11,
        P::Twelve => 12,
        P::Thirteen => 13,
        P::Fourteen => 14,
        P::Fifteen => 15,
        P::Unknown => return None,
    };
    Some(n)
}

/// The MIG devices of a GPU whose MIG mode is enabled now; none otherwise.
/// A device NVML cannot describe (its instance ids) is left out, said once.
fn mig_instances(
    nvml: &'static Nvml,
    device: &Device<'static>,
    index: u32,
    gpm: bool,
) -> Vec<MigInstance> {
    let enabled = device
        .mig_mode()
        .is_ok_and(|m| m.current == nvml_wrapper_sys::bindings::NVML_DEVICE_MIG_ENABLE);
    if !enabled {
        return Vec::new();
    }
    let slots = device.mig_device_count().unwrap_or(0);
    let mut out = Vec::new();
    for slot in 0..slots {
        let mig = match device.mig_device_by_index(slot) {
            Ok(mig) => mig,
            // Empty slots answer "not found".
            Err(NvmlError::NotFound) => continue,
            Err(e) => {
                warn!(gpu = index, slot, error = %e, "MIG device skipped: NVML cannot open it");
                continue;
            }
        };
        let ids = instance_id(nvml, &mig, InstanceKind::Gpu)
            .and_then(|gi| Ok((gi, instance_id(nvml, &mig, InstanceKind::Compute)?)));
        let (gpu_instance_id, compute_instance_id) = match ids {
            Ok(ids) => ids,
            Err(e) => {
                warn!(gpu = index, slot, error = %e, "MIG device skipped: NVML does not give its instance ids");
                continue;
            }
        };
        let name = mig.name().unwrap_or_default();
        out.push(MigInstance {
            profile: mig_profile(&name),
            uuid: mig.uuid().unwrap_or_default(),
            device: mig,
            gpu_instance_id,
            compute_instance_id,
            gpm: gpm.then(GpmSamples::default),
        });
    }
    info!(
        gpu = index,
        devices = ?out.iter().map(|m| (m.gpu_instance_id, m.compute_instance_id)).collect::<Vec<_>>(),
        "MIG enabled: one row per MIG device (GPU instance, compute instance) besides the GPU's own"
    );
    out
}

/// The profile in a MIG device's name: "1g.10gb" of
/// "NVIDIA H100 80GB HBM3 MIG 1g.10gb".
fn mig_profile(name: &str) -> Option<String> {
    name.rsplit_once(" MIG ")
        .map(|(_, profile)| profile.trim().to_owned())
        .filter(|p| !p.is_empty())
}

#[derive(Debug, Clone, Copy)]
enum InstanceKind {
    Gpu,
    Compute,
}

/// `nvmlDeviceGetGpuInstanceId` or `nvmlDeviceGetComputeInstanceId` of a MIG
/// device: nvml-wrapper does not wrap them, so through its raw symbols.
fn instance_id(
    nvml: &'static Nvml,
    mig: &Device<'static>,
    kind: InstanceKind,
) -> Result<u32, NvmlError> {
    let lib = nvml.lib();
    let get = match kind {
        InstanceKind::Gpu => nvml_sym(lib.nvmlDeviceGetGpuInstanceId.as_ref())?,
        InstanceKind::Compute => nvml_sym(lib.nvmlDeviceGetComputeInstanceId.as_ref())?,
    };
    let mut id: std::ffi::c_uint = 0;
    // SAFETY: the handle is a live MIG device handle of this library, and
    // `id` is a plain integer NVML writes.
    unsafe { nvml_try(get(mig.handle(), &mut id))? };
    Ok(id)
}

/// One row per MIG device of `gpu`: its framebuffer, its GPU instance's GPM
/// activity and its XIDs; the physical readings stay on the GPU's row.
fn sample_instances(
    gpu: &mut GpuState,
    Due { ts_us, slow }: Due,
    xids: &[Xid],
    read: &mut Reader<'_>,
    rows: &mut Vec<GpuSample>,
) {
    let parent = &gpu.device;
    for mig in &mut gpu.instances {
        let memory = read.get("mig_memory_info", mig.device.memory_info());
        let gi = mig.gpu_instance_id;
        let take = || parent.gpm_mig_sample(gi);
        let gpm = mig
            .gpm
            .as_mut()
            .map(|samples| sample_gpm(parent.nvml(), samples, slow, take, "gpm_mig_sample", read))
            .unwrap_or_default();
        let instance = Some((mig.gpu_instance_id, mig.compute_instance_id));
        rows.push(GpuSample {
            ts_us,
            gpu: gpu.index,
            uuid: gpu.uuid.clone(),
            model: gpu.model.clone(),
            // The physical GPU's bus, as dcgm-exporter labels MIG series.
            pci_bus_id: gpu.pci_bus_id.clone(),
            fb_used_bytes: memory.as_ref().map(|m| m.used),
            fb_free_bytes: memory.as_ref().map(|m| m.free),
            fb_total_bytes: memory.as_ref().map(|m| m.total),
            fb_reserved_bytes: memory.as_ref().map(|m| m.reserved),
            sm_active_pct: gpm[0],
            sm_occupancy_pct: gpm[1],
            tensor_active_pct: gpm[2],
            dram_active_pct: gpm[3],
            gr_engine_active_pct: gpm[4],
            profiling_source: profiling_source(&gpm, ProfilingSource::Gpm),
            xid_count: xids.iter().filter(|x| x.on(gpu.index, instance)).count() as u32,
            gpu_instance_id: Some(mig.gpu_instance_id),
            compute_instance_id: Some(mig.compute_instance_id),
            mig_profile: mig.profile.clone(),
            mig_uuid: Some(mig.uuid.clone()),
            ..GpuSample::default()
        });
    }
}

/// Increase per second of a counter between two ticks, times `unit`; None on
/// the first tick, when either reading is missing, or when the counter went
/// backwards (a driver reload resets NVML's counters).
fn per_second(
    prev: Option<&Counters>,
    now: &Counters,
    pick: fn(&Counters) -> Option<u64>,
    unit: u64,
) -> Option<u64> {
    let prev = prev?;
    let elapsed_us = u64::try_from(now.ts_us - prev.ts_us)
        .ok()
        .filter(|&us| us > 0)?;
    let increase = pick(now)?.checked_sub(pick(prev)?)?;
    let per_s = u128::from(increase) * u128::from(unit) * 1_000_000 / u128::from(elapsed_us);
    u64::try_from(per_s).ok()
}

/// GPM activity in GpuSample order: the per-tick metrics between the
/// previous tick and this one, and at slow-read ticks the others between the
/// previous slow-read tick and this one. `take` takes a sample (of a GPU or
/// of a MIG device's GPU instance), named `what` in errors.
fn sample_gpm(
    nvml: &Nvml,
    samples: &mut GpmSamples,
    slow: bool,
    take: impl Fn() -> Result<GpmSample<'static>, NvmlError>,
    what: &'static str,
    read: &mut Reader<'_>,
) -> [Option<f32>; GPM_METRICS.len()] {
    let mut out = [None; GPM_METRICS.len()];
    let mut between = |prev: &mut Option<GpmSample<'static>>, range: std::ops::Range<usize>| {
        let Some(now) = read.get(what, take()) else {
            *prev = None;
            return;
        };
        if let Some(before) = prev.take()
            && let Some(results) = read.get(
                "gpm_metrics",
                gpm_metrics_get(nvml, &before, &now, &GPM_METRICS[range.clone()]),
            )
        {
            for (slot, result) in out[range].iter_mut().zip(results) {
                *slot = read.get("gpm_metric", result).map(|r| r.value as f32);
            }
        }
        *prev = Some(now);
    };
    between(&mut samples.tick, 0..GPM_SLOW_FROM);
    if slow {
        between(&mut samples.slow, GPM_SLOW_FROM..GPM_METRICS.len());
    }
    out
}

/// The compute processes of a GPU, or of each of its MIG devices (each MIG
/// device's own listing works without the privileges the GPU-wide one needs
/// in MIG mode), with the instance each runs on.
fn list_compute_processes(
    gpu: &GpuState,
    ts_us: i64,
    procfs_root: &Path,
    read: &mut Reader<'_>,
    out: &mut Vec<GpuProcess>,
) {
    if gpu.instances.is_empty() {
        if let Some(processes) = read.get("processes", gpu.device.running_compute_processes()) {
            push_processes(gpu, None, processes, ts_us, procfs_root, out);
        }
        return;
    }
    for mig in &gpu.instances {
        if let Some(processes) = read.get("processes", mig.device.running_compute_processes()) {
            let instance = Some((mig.gpu_instance_id, mig.compute_instance_id));
            push_processes(gpu, instance, processes, ts_us, procfs_root, out);
        }
    }
}

fn push_processes(
    gpu: &GpuState,
    instance: Option<(u32, u32)>,
    processes: Vec<nvml_wrapper::struct_wrappers::device::ProcessInfo>,
    ts_us: i64,
    procfs_root: &Path,
    out: &mut Vec<GpuProcess>,
) {
    for p in processes {
        // The process may have ended since NVML listed it: an empty name.
        let command = std::fs::read_to_string(procfs_root.join(p.pid.to_string()).join("comm"))
            .map(|s| s.trim_end().to_owned())
            .unwrap_or_default();
        out.push(GpuProcess {
            ts_us,
            gpu: gpu.index,
            uuid: gpu.uuid.clone(),
            pid: p.pid,
            used_memory_bytes: match p.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => Some(bytes),
                UsedGpuMemory::Unavailable => None,
            },
            command,
            gpu_instance_id: instance.map(|(gi, _)| gi).or(p.gpu_instance_id),
            compute_instance_id: instance.map(|(_, ci)| ci).or(p.compute_instance_id),
            ..GpuProcess::default()
        });
    }
}

fn sample_as_u64(value: SampleValue) -> Option<u64> {
    match value {
        SampleValue::U32(v) => Some(u64::from(v)),
        SampleValue::U64(v) => Some(v),
        SampleValue::I64(v) => u64::try_from(v).ok(),
        SampleValue::F64(v) if v.is_finite() && v >= 0.0 => Some(v.round() as u64),
        SampleValue::F64(_) => None,
    }
}

/// The thread that waits on NVML's event set for XID errors.
#[derive(Debug)]
struct XidWatcher {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl XidWatcher {
    /// Registers every GPU that reports XID events; None when none does.
    fn start(nvml: &'static Nvml, gpus: &[GpuState], queue: Arc<Mutex<Vec<Xid>>>) -> Option<Self> {
        let mut set = match nvml.create_event_set() {
            Ok(set) => set,
            Err(e) => {
                warn!(error = %e, "NVML event set unavailable: XID errors will not be recorded");
                return None;
            }
        };
        let mut registered = Vec::new();
        for gpu in gpus {
            let supported = gpu
                .device
                .supported_event_types()
                .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
            if !supported {
                warn!(
                    gpu = gpu.index,
                    "GPU does not report XID events: its XID errors will not be recorded"
                );
                continue;
            }
            match gpu
                .device
                .register_events(EventTypes::CRITICAL_XID_ERROR, set)
            {
                Ok(s) => {
                    set = s;
                    registered.push(gpu.index);
                }
                Err(e) => {
                    warn!(gpu = gpu.index, error = %e.error, "cannot watch XID events of this GPU");
                    // The failed call consumed the set: build it again without this GPU.
                    set = match nvml.create_event_set() {
                        Ok(s) => s,
                        Err(e) => {
                            warn!(error = %e, "NVML event set unavailable: XID errors will not be recorded");
                            return None;
                        }
                    };
                    for index in &registered {
                        let Some(g) = gpus.iter().find(|g| g.index == *index) else {
                            continue;
                        };
                        match g
                            .device
                            .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                        {
                            Ok(s) => set = s,
                            Err(_) => return None,
                        }
                    }
                }
            }
        }
        if registered.is_empty() {
            return None;
        }
        debug!(gpus = ?registered, "watching XID events");
        // Events name their device by handle; asking a lost GPU its index
        // fails, so match handles instead.
        // SAFETY: the handles are only compared, never used to make calls.
        let handles: Vec<(usize, u32)> = gpus
            .iter()
            .map(|g| (unsafe { g.device.handle() } as usize, g.index))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("xid-events".into())
            .spawn(move || {
                let mut reported = false;
                while !stopping.load(Ordering::Relaxed) {
                    match wait_for_event(nvml, &set, XID_WAIT_MS) {
                        Ok(event) => {
                            if event.eventType & XID_EVENT_TYPE == 0 {
                                continue;
                            }
                            // The raw data is the XID itself, whatever it is:
                            // nvml-wrapper's enum turns 999 into "Unknown",
                            // which must not become a 0 ("no error").
                            let xid = event.eventData;
                            let handle = event.device as usize;
                            let Some(&(_, gpu)) = handles.iter().find(|(h, _)| *h == handle)
                            else {
                                continue;
                            };
                            // 0xFFFFFFFF: not attributed to a MIG instance.
                            let instance = |id: u32| (id != NO_INSTANCE).then_some(id);
                            let gpu_instance_id = instance(event.gpuInstanceId);
                            let compute_instance_id = instance(event.computeInstanceId);
                            warn!(gpu, xid, gpu_instance_id, compute_instance_id, "XID error");
                            queue
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push(Xid {
                                    gpu,
                                    xid,
                                    ts_us: now_us(),
                                    gpu_instance_id,
                                    compute_instance_id,
                                });
                        }
                        Err(NvmlError::Timeout) => {}
                        Err(e) => {
                            if !reported {
                                warn!(error = %e, "waiting for XID events failed; retrying every second");
                                reported = true;
                            }
                            std::thread::sleep(std::time::Duration::from_secs(1));
                        }
                    }
                }
            })
            .ok()?;
        Some(Self { stop, thread })
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
    }
}

/// The instance id of an event NVML attributes to no MIG instance.
const NO_INSTANCE: u32 = 0xFFFF_FFFF;

/// `nvmlEventTypeXidCriticalError`.
const XID_EVENT_TYPE: u64 = EventTypes::CRITICAL_XID_ERROR.bits();

/// Waits up to `timeout_ms` for the next event of `set` and returns NVML's
/// own record of it. `EventSet::wait` would give the XID through an enum
/// that has no number for XID 999; the raw record keeps every code.
fn wait_for_event(
    nvml: &'static Nvml,
    set: &EventSet<'static>,
    timeout_ms: u32,
) -> Result<nvmlEventData_t, NvmlError> {
    let wait = nvml_sym(nvml.lib().nvmlEventSetWait_v2.as_ref())?;
    // SAFETY: the set is alive (borrowed) for the whole call, the record is
    // plain data that NVML fills, and the set's handle is not freed here.
    unsafe {
        let mut event: nvmlEventData_t = std::mem::zeroed();
        nvml_try(wait(set.handle(), &mut event, timeout_ms))?;
        Ok(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slow_columns_are_named_alike_where_they_are_cleared_held_and_found() {
        let full = GpuSample {
            gpu: 3,
            power_mw: Some(612_000),
            energy_mj: Some(9_000_000),
            power_avg_mw: Some(598_000),
            pcie_replay_count: Some(2),
            pcie_tx_bytes_per_s: Some(1_000),
            pcie_rx_bytes_per_s: Some(2_000),
            mig_mode: Some(false),
            gr_engine_active_pct: Some(97.5),
            profiling_source: Some(ProfilingSource::Gpm.into()),
            ..GpuSample::default()
        };
        let mut between = full.clone();
        clear_slow_readings(&mut between);
        assert!(has_slow_readings(&full));
        assert!(!has_slow_readings(&between));
        assert_eq!(between.power_mw, Some(612_000));
        hold_slow_readings(&full, &mut between);
        assert_eq!(between, full);
    }
}
