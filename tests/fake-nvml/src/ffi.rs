//! The exported NVML C functions. Signatures and struct layouts come from
//! `nvml-wrapper-sys`, the bindings `nvml-wrapper` calls them through.
//!
//! Every function catches panics (a panic must not unwind into C) and takes
//! the one global lock, so calls from many threads see a consistent state.

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong};
use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use nvml_wrapper_sys::bindings::{
    field_id::{
        NVML_FI_DEV_MEMORY_TEMP, NVML_FI_DEV_POWER_AVERAGE, NVML_FI_DEV_POWER_INSTANT,
        NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    },
    nvmlClockType_enum_NVML_CLOCK_GRAPHICS as CLOCK_GRAPHICS,
    nvmlClockType_enum_NVML_CLOCK_MEM as CLOCK_MEM, nvmlClockType_enum_NVML_CLOCK_SM as CLOCK_SM,
    nvmlClockType_enum_NVML_CLOCK_VIDEO as CLOCK_VIDEO, nvmlClockType_t, nvmlDevice_st,
    nvmlDevice_t, nvmlFieldValue_t, nvmlMemory_v2_t, nvmlPciInfo_t, nvmlReturn_t,
    nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU, nvmlTemperatureSensors_t, nvmlUtilization_t,
    nvmlValue_t, nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT,
    nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
};
use nvml_wrapper_sys::bindings::{
    nvmlReturn_enum_NVML_ERROR_ALREADY_INITIALIZED as ALREADY_INITIALIZED,
    nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH as ARGUMENT_VERSION_MISMATCH,
    nvmlReturn_enum_NVML_ERROR_CORRUPTED_INFOROM as CORRUPTED_INFOROM,
    nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED as DRIVER_NOT_LOADED,
    nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND as FUNCTION_NOT_FOUND,
    nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST as GPU_IS_LOST,
    nvmlReturn_enum_NVML_ERROR_IN_USE as IN_USE,
    nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_POWER as INSUFFICIENT_POWER,
    nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE as INSUFFICIENT_SIZE,
    nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT as INVALID_ARGUMENT,
    nvmlReturn_enum_NVML_ERROR_IRQ_ISSUE as IRQ_ISSUE,
    nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH as LIB_RM_VERSION_MISMATCH,
    nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND as LIBRARY_NOT_FOUND,
    nvmlReturn_enum_NVML_ERROR_MEMORY as MEMORY, nvmlReturn_enum_NVML_ERROR_NO_DATA as NO_DATA,
    nvmlReturn_enum_NVML_ERROR_NO_PERMISSION as NO_PERMISSION,
    nvmlReturn_enum_NVML_ERROR_NOT_FOUND as NOT_FOUND,
    nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED as NOT_SUPPORTED,
    nvmlReturn_enum_NVML_ERROR_OPERATING_SYSTEM as OPERATING_SYSTEM,
    nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED as RESET_REQUIRED,
    nvmlReturn_enum_NVML_ERROR_TIMEOUT as TIMEOUT,
    nvmlReturn_enum_NVML_ERROR_UNINITIALIZED as UNINITIALIZED,
    nvmlReturn_enum_NVML_ERROR_UNKNOWN as UNKNOWN, nvmlReturn_enum_NVML_SUCCESS as SUCCESS,
};

use crate::metric::Fault;
use crate::scenario::{Gpu, SCENARIO_ENV, Scenario};

/// What `nvmlMemory_v2_t.version` must hold: NVML_STRUCT_VERSION(Memory, 2).
pub const MEMORY_V2_VERSION: c_uint = (size_of::<nvmlMemory_v2_t>() | (2 << 24)) as c_uint;

/// The library's state between `nvmlInit` and the matching last `nvmlShutdown`.
struct Session {
    scenario: Scenario,
    started: Instant,
}

impl Session {
    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The GPU behind a handle from `nvmlDeviceGetHandleByIndex_v2`.
    fn gpu(&self, device: nvmlDevice_t) -> Option<&Gpu> {
        // Handles are index + 1, so a null handle is never valid.
        device
            .addr()
            .checked_sub(1)
            .and_then(|i| self.scenario.gpus.get(i))
    }
}

struct State {
    /// Real NVML counts inits; only the last shutdown tears down.
    refcount: u32,
    session: Option<Session>,
}

static STATE: Mutex<State> = Mutex::new(State {
    refcount: 0,
    session: None,
});

fn lock() -> MutexGuard<'static, State> {
    // Every update of the state is a plain assignment, so a panic caught by
    // `guard` cannot leave it half-changed: a poisoned lock is still usable.
    STATE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `f`, turning a panic into NVML_ERROR_UNKNOWN.
fn guard(f: impl FnOnce() -> nvmlReturn_t) -> nvmlReturn_t {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(UNKNOWN)
}

/// Runs `f` with the session, or returns NVML_ERROR_UNINITIALIZED.
fn with_session(f: impl FnOnce(&Session) -> nvmlReturn_t) -> nvmlReturn_t {
    guard(|| match &lock().session {
        Some(session) => f(session),
        None => UNINITIALIZED,
    })
}

/// Runs `f` with the handle's GPU and the time since init.
fn with_gpu(device: nvmlDevice_t, f: impl FnOnce(&Gpu, u64) -> nvmlReturn_t) -> nvmlReturn_t {
    with_session(|session| match session.gpu(device) {
        Some(gpu) => f(gpu, session.elapsed_ms()),
        None => INVALID_ARGUMENT,
    })
}

/// Writes `value` through `out`, or returns NVML_ERROR_INVALID_ARGUMENT for null.
///
/// # Safety
/// `out` must be null or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: Result<T, Fault>) -> nvmlReturn_t {
    if out.is_null() {
        return INVALID_ARGUMENT;
    }
    match value {
        Ok(v) => {
            // SAFETY: non-null, and the caller promises it is valid.
            unsafe { out.write(v) };
            SUCCESS
        }
        Err(fault) => fault.code(),
    }
}

/// Copies `s` and a NUL into the caller's `length`-byte buffer.
///
/// # Safety
/// `buf` must be null or valid for writes of `length` bytes.
unsafe fn put_str(buf: *mut c_char, length: c_uint, s: &str) -> nvmlReturn_t {
    if buf.is_null() {
        return INVALID_ARGUMENT;
    }
    let bytes = s.as_bytes();
    if bytes.len() >= length as usize {
        return INSUFFICIENT_SIZE;
    }
    // SAFETY: bytes.len() + 1 <= length, the caller's buffer size.
    unsafe {
        ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        buf.add(bytes.len()).write(0);
    }
    SUCCESS
}

/// `s` as a NUL-terminated, zero-padded C array (truncated to fit; scenario
/// validation keeps real values short enough).
fn c_array<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (dst, src) in out.iter_mut().zip(s.bytes().take(N.saturating_sub(1))) {
        *dst = src as c_char;
    }
    out
}

fn as_c_uint(v: Result<u64, Fault>) -> Result<c_uint, Fault> {
    // Scenario validation keeps 32-bit metrics within range.
    v.map(|v| c_uint::try_from(v).unwrap_or(c_uint::MAX))
}

fn init() -> nvmlReturn_t {
    guard(|| {
        let mut state = lock();
        if state.refcount > 0 {
            state.refcount = state.refcount.saturating_add(1);
            return SUCCESS;
        }
        let scenario = match Scenario::from_env() {
            Ok(s) => s,
            Err((path, e)) => {
                let what = match path {
                    Some(p) => format!("scenario file {} (from {SCENARIO_ENV})", p.display()),
                    None => "built-in scenario".to_owned(),
                };
                // One line, and never a panic if stderr is closed.
                let _ = writeln!(
                    std::io::stderr(),
                    "gputel-fake-nvml: nvmlInit fails with NVML_ERROR_UNKNOWN: {what}: {e}"
                );
                return UNKNOWN;
            }
        };
        if let Some(fault) = scenario.init_error {
            return fault.code();
        }
        state.session = Some(Session {
            scenario,
            started: Instant::now(),
        });
        state.refcount = 1;
        SUCCESS
    })
}

/// Starts NVML: reads the scenario on the first call, counts later ones.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    init()
}

/// Same as `nvmlInit_v2`; the flags (no GPUs, no attach) change nothing here.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> nvmlReturn_t {
    init()
}

/// Undoes one init; the last one drops the scenario.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guard(|| {
        let mut state = lock();
        match state.refcount {
            0 => UNINITIALIZED,
            1 => {
                state.refcount = 0;
                state.session = None;
                SUCCESS
            }
            n => {
                state.refcount = n - 1;
                SUCCESS
            }
        }
    })
}

/// A static description of an `nvmlReturn_t`, as real NVML words it.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    let s: &'static CStr = match result {
        SUCCESS => c"Success",
        UNINITIALIZED => c"Uninitialized",
        INVALID_ARGUMENT => c"Invalid Argument",
        NOT_SUPPORTED => c"Not Supported",
        NO_PERMISSION => c"Insufficient Permissions",
        ALREADY_INITIALIZED => c"Already Initialized",
        NOT_FOUND => c"Not Found",
        INSUFFICIENT_SIZE => c"Insufficient Size",
        INSUFFICIENT_POWER => c"Insufficient External Power",
        DRIVER_NOT_LOADED => c"Driver Not Loaded",
        TIMEOUT => c"Timeout",
        IRQ_ISSUE => c"Interrupt request issue",
        LIBRARY_NOT_FOUND => c"NVML Shared Library Not Found",
        FUNCTION_NOT_FOUND => c"Function Not Found",
        CORRUPTED_INFOROM => c"Corrupted infoROM",
        GPU_IS_LOST => c"GPU is lost",
        RESET_REQUIRED => c"GPU requires restart",
        OPERATING_SYSTEM => c"The operating system has blocked the request.",
        LIB_RM_VERSION_MISMATCH => c"RM has detected an NVML/RM version mismatch.",
        IN_USE => c"In use by another client",
        MEMORY => c"Insufficient Memory",
        NO_DATA => c"No data",
        ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

/// The scenario's `driver_version`.
///
/// # Safety
/// `version` must be null or valid for writes of `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller.
    with_session(|s| unsafe { put_str(version, length, &s.scenario.driver_version) })
}

/// The scenario's `nvml_version`.
///
/// # Safety
/// `version` must be null or valid for writes of `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller.
    with_session(|s| unsafe { put_str(version, length, &s.scenario.nvml_version) })
}

/// How many GPUs the scenario has.
///
/// # Safety
/// `device_count` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) -> nvmlReturn_t {
    with_session(|s| {
        let n = c_uint::try_from(s.scenario.gpus.len()).unwrap_or(c_uint::MAX);
        // SAFETY: forwarded from the caller.
        unsafe { put(device_count, Ok(n)) }
    })
}

/// The handle of GPU `index`: `index + 1` as an opaque pointer.
///
/// # Safety
/// `device` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    with_session(|s| {
        if index as usize >= s.scenario.gpus.len() {
            return INVALID_ARGUMENT;
        }
        let handle = ptr::without_provenance_mut::<nvmlDevice_st>(index as usize + 1);
        // SAFETY: forwarded from the caller.
        unsafe { put(device, Ok(handle)) }
    })
}

/// The GPU's NVML index.
///
/// # Safety
/// `index` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller.
    with_gpu(device, |g, _| unsafe { put(index, Ok(g.index)) })
}

/// The GPU's UUID.
///
/// # Safety
/// `uuid` must be null or valid for writes of `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller.
    with_gpu(device, |g, _| unsafe { put_str(uuid, length, &g.uuid) })
}

/// The GPU's product name.
///
/// # Safety
/// `name` must be null or valid for writes of `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller.
    with_gpu(device, |g, _| unsafe { put_str(name, length, &g.name) })
}

/// GPU core temperature in °C; only sensor NVML_TEMPERATURE_GPU exists.
///
/// # Safety
/// `temp` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: nvmlDevice_t,
    sensor_type: nvmlTemperatureSensors_t,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |g, t| {
        if sensor_type != nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU {
            return INVALID_ARGUMENT;
        }
        // SAFETY: forwarded from the caller.
        unsafe { put(temp, as_c_uint(g.read(&g.temperature_c, t))) }
    })
}

/// Power draw in mW.
///
/// # Safety
/// `power` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller.
    with_gpu(device, |g, t| unsafe {
        put(power, as_c_uint(g.read(&g.power_mw, t)))
    })
}

/// Energy since init (plus the scenario's initial value) in mJ.
///
/// # Safety
/// `energy` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device: nvmlDevice_t,
    energy: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller.
    with_gpu(device, |g, t| unsafe { put(energy, g.energy_mj(t)) })
}

/// Current clock in MHz of the graphics, SM, memory or video domain.
///
/// # Safety
/// `clock` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: nvmlDevice_t,
    clock_type: nvmlClockType_t,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |g, t| {
        let metric = match clock_type {
            CLOCK_GRAPHICS => &g.graphics_clock_mhz,
            CLOCK_SM => &g.sm_clock_mhz,
            CLOCK_MEM => &g.memory_clock_mhz,
            CLOCK_VIDEO => &g.video_clock_mhz,
            _ => return INVALID_ARGUMENT,
        };
        // SAFETY: forwarded from the caller.
        unsafe { put(clock, as_c_uint(g.read(metric, t))) }
    })
}

/// GPU and memory utilization in %; an error in either fails the call.
///
/// # Safety
/// `utilization` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    with_gpu(device, |g, t| {
        let value = as_c_uint(g.read(&g.gpu_util_pct, t)).and_then(|gpu| {
            as_c_uint(g.read(&g.memory_copy_util_pct, t))
                .map(|memory| nvmlUtilization_t { gpu, memory })
        });
        // SAFETY: forwarded from the caller.
        unsafe { put(utilization, value) }
    })
}

/// Framebuffer total, reserved, free and used bytes; the caller sets
/// `version` to [`MEMORY_V2_VERSION`].
///
/// # Safety
/// `memory` must be null or valid for reads and writes of `nvmlMemory_v2_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    with_gpu(device, |g, t| {
        if memory.is_null() {
            return INVALID_ARGUMENT;
        }
        // SAFETY: non-null, and the caller promises it is valid.
        if unsafe { (*memory).version } != MEMORY_V2_VERSION {
            return ARGUMENT_VERSION_MISMATCH;
        }
        let value = g.memory(t).map(|m| nvmlMemory_v2_t {
            version: MEMORY_V2_VERSION,
            total: m.total,
            reserved: m.reserved,
            free: m.free,
            used: m.used,
        });
        // SAFETY: as above.
        unsafe { put(memory, value) }
    })
}

/// Field values: memory temperature, total energy, and average and instant
/// power; any other field id gets NVML_ERROR_NOT_SUPPORTED in its entry.
///
/// # Safety
/// `values` must be null or valid for reads and writes of `values_count` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: nvmlDevice_t,
    values_count: c_int,
    values: *mut nvmlFieldValue_t,
) -> nvmlReturn_t {
    with_gpu(device, |g, t| {
        let Ok(count) = usize::try_from(values_count) else {
            return INVALID_ARGUMENT;
        };
        if count == 0 {
            return SUCCESS;
        }
        if values.is_null() {
            return INVALID_ARGUMENT;
        }
        // SAFETY: non-null, and the caller promises `count` valid entries.
        let entries = unsafe { std::slice::from_raw_parts_mut(values, count) };
        let timestamp_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        for entry in entries {
            entry.timestamp = timestamp_us;
            entry.latencyUsec = 0;
            let reading = match entry.fieldId {
                NVML_FI_DEV_MEMORY_TEMP => as_c_uint(g.read(&g.memory_temperature_c, t)).map(|v| {
                    (
                        nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT,
                        nvmlValue_t { uiVal: v },
                    )
                }),
                NVML_FI_DEV_POWER_INSTANT | NVML_FI_DEV_POWER_AVERAGE => {
                    as_c_uint(g.read(&g.power_mw, t)).map(|v| {
                        (
                            nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT,
                            nvmlValue_t { uiVal: v },
                        )
                    })
                }
                NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION => g.energy_mj(t).map(|v| {
                    (
                        nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                        nvmlValue_t { ullVal: v },
                    )
                }),
                _ => Err(Fault::NotSupported),
            };
            match reading {
                Ok((value_type, value)) => {
                    entry.valueType = value_type;
                    entry.value = value;
                    entry.nvmlReturn = SUCCESS;
                }
                Err(fault) => entry.nvmlReturn = fault.code(),
            }
        }
        SUCCESS
    })
}

/// PCI address and ids.
///
/// # Safety
/// `pci` must be null or valid for a write of `nvmlPciInfo_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    with_gpu(device, |g, _| {
        let info = nvmlPciInfo_t {
            busIdLegacy: c_array(&g.pci.bus_id_legacy()),
            domain: g.pci.domain,
            bus: g.pci.bus,
            device: g.pci.device,
            pciDeviceId: g.pci_device_id,
            pciSubSystemId: g.pci_subsystem_id,
            busId: c_array(&g.pci.bus_id()),
        };
        // SAFETY: forwarded from the caller.
        unsafe { put(pci, Ok(info)) }
    })
}

/// The N of /dev/nvidiaN.
///
/// # Safety
/// `minor_number` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: nvmlDevice_t,
    minor_number: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller.
    with_gpu(device, |g, _| unsafe {
        put(minor_number, Ok(g.minor_number))
    })
}
