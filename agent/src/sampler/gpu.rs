//! GPUs through NVML (`nvml-wrapper`). The library is loaded once; a machine
//! without the NVIDIA driver is a normal state that the agent reports once.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::path::Path;

use gputel_proto::GpuSample;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::FieldValueSample;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::{Device, Nvml};
use tracing::{debug, warn};

/// NVML field id of the HBM temperature (`NVML_FI_DEV_MEMORY_TEMP`).
const FI_DEV_MEMORY_TEMP: u32 = 82;
/// The library NVML ships as, found through the dynamic loader's search path.
pub const DEFAULT_NVML_LIB: &str = "libnvidia-ml.so.1";

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

/// What is known of one GPU from start-up: it does not change while it runs.
#[derive(Debug, Clone)]
struct GpuIdentity {
    index: u32,
    uuid: String,
    model: String,
}

/// Samples every GPU NVML reports.
#[derive(Debug)]
pub struct GpuSampler {
    nvml: Nvml,
    gpus: Vec<GpuIdentity>,
    driver_version: Option<String>,
    /// (gpu, metric) pairs whose failure was already logged.
    reported: HashSet<(u32, &'static str)>,
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

impl GpuSampler {
    /// Loads NVML from `lib` (default: the system's `libnvidia-ml.so.1`) and
    /// lists the GPUs.
    pub fn open(lib: Option<&Path>) -> Result<Self, GpuUnavailable> {
        let lib_name = lib.map_or_else(|| DEFAULT_NVML_LIB.to_owned(), |p| p.display().to_string());
        let mut builder = Nvml::builder();
        if let Some(path) = lib {
            builder.lib_path(path.as_os_str());
        } else {
            builder.lib_path(OsStr::new(DEFAULT_NVML_LIB));
        }
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
        let count = nvml.device_count().map_err(GpuUnavailable::Count)?;
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            match nvml.device_by_index(index) {
                Ok(device) => gpus.push(GpuIdentity {
                    index,
                    uuid: device.uuid().unwrap_or_default(),
                    model: device.name().unwrap_or_default(),
                }),
                Err(e) => warn!(gpu = index, error = %e, "GPU skipped: NVML cannot open it"),
            }
        }
        let driver_version = nvml.sys_driver_version().ok();
        Ok(Self {
            nvml,
            gpus,
            driver_version,
            reported: HashSet::new(),
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

    /// Appends one sample per GPU. Metrics a GPU does not support are left
    /// unset; other failures are unset too, and returned (each (GPU, metric)
    /// pair is logged once, then only at debug level).
    pub fn sample(&mut self, ts_us: i64, out: &mut Vec<GpuSample>) -> Vec<GpuError> {
        let mut errors = Vec::new();
        for gpu in &self.gpus {
            let device = match self.nvml.device_by_index(gpu.index) {
                Ok(device) => device,
                Err(source) => {
                    errors.push(GpuError {
                        gpu: gpu.index,
                        metric: "handle",
                        source,
                    });
                    continue;
                }
            };
            let mut read = Reader {
                gpu: gpu.index,
                errors: &mut errors,
            };
            out.push(sample_device(&device, gpu, ts_us, &mut read));
        }
        for e in &errors {
            if self.reported.insert((e.gpu, e.metric)) {
                warn!(gpu = e.gpu, metric = e.metric, error = %e.source, "GPU metric unavailable; further failures of it are logged at debug level");
            } else {
                debug!(gpu = e.gpu, metric = e.metric, error = %e.source, "GPU metric unavailable");
            }
        }
        errors
    }
}

/// Collects failures while one device is read.
struct Reader<'a> {
    gpu: u32,
    errors: &'a mut Vec<GpuError>,
}

impl Reader<'_> {
    /// The value, or None: silently for "not supported", recorded otherwise.
    fn get<T>(&mut self, metric: &'static str, result: Result<T, NvmlError>) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(NvmlError::NotSupported) => None,
            Err(source) => {
                self.errors.push(GpuError {
                    gpu: self.gpu,
                    metric,
                    source,
                });
                None
            }
        }
    }
}

fn sample_device(
    device: &Device<'_>,
    gpu: &GpuIdentity,
    ts_us: i64,
    read: &mut Reader<'_>,
) -> GpuSample {
    let utilization = read.get("utilization", device.utilization_rates());
    let memory = read.get("memory_info", device.memory_info());
    let memory_temperature = read
        .get(
            "memory_temperature",
            device.field_values_for(&[FieldId(FI_DEV_MEMORY_TEMP)]),
        )
        .and_then(|values| values.into_iter().next())
        .and_then(|sample| {
            let sample: Result<FieldValueSample, NvmlError> = sample;
            read.get("memory_temperature", sample.and_then(|s| s.value))
        })
        .and_then(sample_as_u32);
    GpuSample {
        ts_us,
        gpu: gpu.index,
        uuid: gpu.uuid.clone(),
        model: gpu.model.clone(),
        temperature_c: read.get("temperature", device.temperature(TemperatureSensor::Gpu)),
        memory_temperature_c: memory_temperature,
        power_mw: read.get("power", device.power_usage()),
        energy_mj: read.get("energy", device.total_energy_consumption()),
        sm_clock_mhz: read.get("sm_clock", device.clock_info(Clock::SM)),
        memory_clock_mhz: read.get("memory_clock", device.clock_info(Clock::Memory)),
        gpu_util_pct: utilization.as_ref().map(|u| u.gpu),
        memory_copy_util_pct: utilization.as_ref().map(|u| u.memory),
        fb_used_bytes: memory.as_ref().map(|m| m.used),
        fb_free_bytes: memory.as_ref().map(|m| m.free),
        fb_total_bytes: memory.as_ref().map(|m| m.total),
        ..GpuSample::default()
    }
}

fn sample_as_u32(value: SampleValue) -> Option<u32> {
    match value {
        SampleValue::U32(v) => Some(v),
        SampleValue::U64(v) => u32::try_from(v).ok(),
        SampleValue::I64(v) => u32::try_from(v).ok(),
        SampleValue::F64(v) if v.is_finite() && v >= 0.0 => Some(v.round() as u32),
        SampleValue::F64(_) => None,
    }
}
