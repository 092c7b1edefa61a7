//! The exported NVML C functions. Signatures and struct layouts come from
//! `nvml-wrapper-sys`, the bindings `nvml-wrapper` calls them through.
//!
//! Every function catches panics (a panic must not unwind into C) and takes
//! the one global lock, so calls from many threads see a consistent state.
//! `nvmlEventSetWait_v2` releases the lock while it blocks.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong};
use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nvml_wrapper_sys::bindings::{
    NVML_GPM_METRICS_GET_VERSION, NVML_GPM_SUPPORT_VERSION, NVML_VALUE_NOT_AVAILABLE,
    field_id::{
        NVML_FI_DEV_ECC_DBE_AGG_TOTAL, NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        NVML_FI_DEV_ECC_SBE_AGG_TOTAL, NVML_FI_DEV_ECC_SBE_VOL_TOTAL, NVML_FI_DEV_MEMORY_TEMP,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        NVML_FI_DEV_PCIE_COUNT_RX_BYTES, NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
        NVML_FI_DEV_PCIE_REPLAY_COUNTER, NVML_FI_DEV_POWER_AVERAGE, NVML_FI_DEV_POWER_INSTANT,
        NVML_FI_DEV_REMAPPED_COR, NVML_FI_DEV_REMAPPED_FAILURE, NVML_FI_DEV_REMAPPED_PENDING,
        NVML_FI_DEV_REMAPPED_UNC, NVML_FI_DEV_RETIRED_DBE, NVML_FI_DEV_RETIRED_PENDING,
        NVML_FI_DEV_RETIRED_SBE, NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    },
    nvmlClockType_enum_NVML_CLOCK_GRAPHICS as CLOCK_GRAPHICS,
    nvmlClockType_enum_NVML_CLOCK_MEM as CLOCK_MEM, nvmlClockType_enum_NVML_CLOCK_SM as CLOCK_SM,
    nvmlClockType_enum_NVML_CLOCK_VIDEO as CLOCK_VIDEO, nvmlClockType_t, nvmlDevice_st,
    nvmlDevice_t, nvmlEventData_t, nvmlEventMigConfigChange, nvmlEventSet_st, nvmlEventSet_t,
    nvmlEventTypeDoubleBitEccError, nvmlEventTypePState, nvmlEventTypeSingleBitEccError,
    nvmlEventTypeXidCriticalError, nvmlFieldValue_t, nvmlGpmMetric_t__bindgen_ty_1,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_ANY_TENSOR_UTIL as GPM_ANY_TENSOR_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_DRAM_BW_UTIL as GPM_DRAM_BW_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_GRAPHICS_UTIL as GPM_GRAPHICS_UTIL,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_OCCUPANCY as GPM_SM_OCCUPANCY,
    nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL as GPM_SM_UTIL, nvmlGpmMetricsGet_t,
    nvmlGpmSample_st, nvmlGpmSample_t, nvmlGpmSupport_t, nvmlMemory_v2_t, nvmlPciInfo_t,
    nvmlProcessInfo_t, nvmlPstates_t, nvmlReturn_t,
    nvmlTemperatureSensors_enum_NVML_TEMPERATURE_GPU, nvmlTemperatureSensors_t, nvmlUtilization_t,
    nvmlValue_t, nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT,
    nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, nvmlValueType_t,
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

use crate::metric::{Fault, Metric};
use crate::scenario::{Gpu, MAX_MIG_DEVICES, MigDevice, SCENARIO_ENV, Scenario, XidEvent};

/// What `nvmlMemory_v2_t.version` must hold: NVML_STRUCT_VERSION(Memory, 2).
pub const MEMORY_V2_VERSION: c_uint = (size_of::<nvmlMemory_v2_t>() | (2 << 24)) as c_uint;

/// What `nvmlDeviceGetSupportedEventTypes` reports, as an H100 does: ECC
/// errors, P-state changes, XID errors and MIG configuration changes. Only
/// XID events ever fire.
pub const SUPPORTED_EVENT_TYPES: u64 = (nvmlEventTypeSingleBitEccError
    | nvmlEventTypeDoubleBitEccError
    | nvmlEventTypePState
    | nvmlEventTypeXidCriticalError
    | nvmlEventMigConfigChange) as u64;

const XID_EVENT: u64 = nvmlEventTypeXidCriticalError as u64;

/// `gpuInstanceId` / `computeInstanceId` of a GPU without MIG.
const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// MIG device handles are `MIG_HANDLE_BASE + GPU index × MIG_SLOTS + slot`,
/// far above the GPU handles (index + 1), so the two never meet.
const MIG_HANDLE_BASE: usize = 1 << 24;
const MIG_SLOTS: usize = 256;

/// The opaque handle of MIG device `slot` of GPU `gpu`.
fn mig_handle(gpu: usize, slot: usize) -> nvmlDevice_t {
    ptr::without_provenance_mut::<nvmlDevice_st>(MIG_HANDLE_BASE + gpu * MIG_SLOTS + slot)
}

/// When and on which GPU `nvmlGpmSampleGet` filled a sample.
#[derive(Debug, Clone, Copy)]
struct GpmTaken {
    gpu: usize,
    /// The GPU instance, for a sample of one (`nvmlGpmMigSampleGet`, or
    /// `nvmlGpmSampleGet` on a MIG handle).
    gpu_instance_id: Option<u32>,
    elapsed_ms: u64,
    /// Order of `nvmlGpmSampleGet` calls: a later sample has a larger number.
    seq: u64,
}

/// A sample from `nvmlGpmSampleAlloc`; its heap address is its handle.
#[derive(Debug, Default)]
struct GpmSampleSlot {
    taken: Option<GpmTaken>,
}

/// A set from `nvmlEventSetCreate`; its heap address is its handle.
#[derive(Debug, Default)]
struct EventSetSlot {
    /// Event types registered, by GPU index.
    registered: BTreeMap<usize, u64>,
    /// How many of each GPU's XID events this set has received, by GPU index.
    delivered: BTreeMap<usize, usize>,
}

/// The library's state between `nvmlInit` and the matching last `nvmlShutdown`.
struct Session {
    scenario: Scenario,
    started: Instant,
    /// Live GPM samples by handle address.
    gpm_samples: HashMap<usize, Box<GpmSampleSlot>>,
    /// Live event sets by handle address.
    event_sets: HashMap<usize, Box<EventSetSlot>>,
    /// `nvmlGpmSampleGet` calls so far.
    gpm_samples_taken: u64,
}

impl Session {
    fn new(scenario: Scenario) -> Session {
        Session {
            scenario,
            started: Instant::now(),
            gpm_samples: HashMap::new(),
            event_sets: HashMap::new(),
            gpm_samples_taken: 0,
        }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The index of the GPU behind a handle from `nvmlDeviceGetHandleByIndex_v2`.
    fn gpu_index(&self, device: nvmlDevice_t) -> Option<usize> {
        // Handles are index + 1, so a null handle is never valid.
        device
            .addr()
            .checked_sub(1)
            .filter(|i| *i < self.scenario.gpus.len())
    }

    /// The index of a handle's GPU and the time since init, or the error
    /// every device call returns for an unknown handle or a lost GPU. A MIG
    /// device's handle gets NVML_ERROR_NOT_SUPPORTED: these calls are about
    /// the physical GPU.
    fn live_gpu(&self, device: nvmlDevice_t) -> Result<(usize, u64), nvmlReturn_t> {
        match self.live_device(device)? {
            (index, None, t) => Ok((index, t)),
            (_, Some(_), _) => Err(NOT_SUPPORTED),
        }
    }

    /// The GPU behind a GPU or MIG device handle, the MIG device's slot (for
    /// a MIG handle), and the time since init; a MIG handle is valid while
    /// its GPU has MIG enabled.
    fn live_device(
        &self,
        device: nvmlDevice_t,
    ) -> Result<(usize, Option<usize>, u64), nvmlReturn_t> {
        let t = self.elapsed_ms();
        let (index, slot) = match device.addr().checked_sub(MIG_HANDLE_BASE) {
            Some(mig) => (mig / MIG_SLOTS, Some(mig % MIG_SLOTS)),
            None => (self.gpu_index(device).ok_or(INVALID_ARGUMENT)?, None),
        };
        let gpu = self.scenario.gpus.get(index).ok_or(INVALID_ARGUMENT)?;
        if gpu.is_lost(t) {
            return Err(GPU_IS_LOST);
        }
        if let Some(slot) = slot
            && gpu.mig_device(slot, t).is_none()
        {
            return Err(INVALID_ARGUMENT);
        }
        Ok((index, slot, t))
    }

    /// The next XID event the set will receive, with its GPU index: the
    /// earliest undelivered one over the GPUs it registered (the lower index
    /// first at equal times).
    fn next_xid(&self, set: &EventSetSlot) -> Option<(usize, XidEvent)> {
        set.registered
            .iter()
            .filter(|(_, types)| *types & XID_EVENT != 0)
            .filter_map(|(&index, _)| {
                let events = self.scenario.gpus.get(index)?.deliverable_xid_events();
                let delivered = set.delivered.get(&index).copied().unwrap_or(0);
                events.get(delivered).map(|e| (index, *e))
            })
            .min_by_key(|(index, e)| (e.at_ms, *index))
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

/// Wakes `nvmlEventSetWait_v2` callers when a set or the session goes away
/// (due events need no wake-up: waiters sleep exactly until the next one).
static WAKE: Condvar = Condvar::new();

fn lock() -> MutexGuard<'static, State> {
    // Every update of the state is one assignment or one map insert or
    // remove, so a panic caught by `guard` cannot leave it half-changed: a
    // poisoned lock is still usable.
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

/// Runs `f` with the session to change, or returns NVML_ERROR_UNINITIALIZED.
fn with_session_mut(f: impl FnOnce(&mut Session) -> nvmlReturn_t) -> nvmlReturn_t {
    guard(|| match &mut lock().session {
        Some(session) => f(session),
        None => UNINITIALIZED,
    })
}

/// Runs `f` with the handle's GPU and the time since init; a lost GPU
/// returns NVML_ERROR_GPU_IS_LOST without calling `f`.
fn with_gpu(device: nvmlDevice_t, f: impl FnOnce(&Gpu, u64) -> nvmlReturn_t) -> nvmlReturn_t {
    hang_if_due();
    with_session(|session| match session.live_gpu(device) {
        Ok((index, t)) => match session.scenario.gpus.get(index) {
            Some(gpu) => f(gpu, t),
            None => INVALID_ARGUMENT,
        },
        Err(code) => code,
    })
}

/// Runs `f` with the GPU behind a GPU or MIG device handle, the MIG device
/// (None for a GPU handle) and the time since init; a lost GPU returns
/// NVML_ERROR_GPU_IS_LOST without calling `f`.
fn with_device(
    device: nvmlDevice_t,
    f: impl FnOnce(&Gpu, Option<&MigDevice>, u64) -> nvmlReturn_t,
) -> nvmlReturn_t {
    hang_if_due();
    with_session(|session| match session.live_device(device) {
        Ok((index, slot, t)) => match session.scenario.gpus.get(index) {
            Some(gpu) => f(gpu, slot.and_then(|s| gpu.mig.get(s)), t),
            None => INVALID_ARGUMENT,
        },
        Err(code) => code,
    })
}

/// Blocks forever once the scenario's `hang_at_ms` has passed, without
/// holding the library's lock, like a driver call that never returns.
fn hang_if_due() {
    let due = lock()
        .session
        .as_ref()
        .is_some_and(|s| s.scenario.hang_at_ms.is_some_and(|at| s.elapsed_ms() >= at));
    if due {
        // park() may return spuriously; nothing ever unparks this thread.
        loop {
            std::thread::park();
        }
    }
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
        state.session = Some(Session::new(scenario));
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
                // Blocked waits return NVML_ERROR_UNINITIALIZED.
                WAKE.notify_all();
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
        let handle = ptr::without_provenance_mut::<nvmlDevice_st>(index as usize + 1);
        // Like the real driver (nvidia-smi's "Unable to determine the device
        // handle for GPU …: GPU is lost"), a lost GPU has no handle.
        if let Err(code) = s.live_gpu(handle) {
            return code;
        }
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
    with_device(device, |g, mig, _| unsafe {
        put_str(uuid, length, mig.map_or(&g.uuid, |m| &m.uuid))
    })
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
    with_device(device, |g, mig, _| unsafe {
        put_str(name, length, mig.map_or(&g.name, |m| &m.name))
    })
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
/// NVML_ERROR_NOT_SUPPORTED while MIG is enabled, as NVML answers.
///
/// # Safety
/// `utilization` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    with_gpu(device, |g, t| {
        if g.mig_enabled(t) {
            return NOT_SUPPORTED;
        }
        let value = as_c_uint(g.read(&g.gpu_util_pct, t)).and_then(|gpu| {
            as_c_uint(g.read(&g.memory_copy_util_pct, t))
                .map(|memory| nvmlUtilization_t { gpu, memory })
        });
        // SAFETY: forwarded from the caller.
        unsafe { put(utilization, value) }
    })
}

/// The sampling period the encoder and decoder utilization calls report, µs.
const CODEC_SAMPLING_PERIOD_US: c_uint = 1_000_000;

/// One codec utilization reading and its sampling period; nothing is
/// written unless both pointers are valid and the metric reads.
///
/// # Safety
/// `utilization` and `sampling_period_us` must be null or valid for a write.
unsafe fn codec_utilization(
    device: nvmlDevice_t,
    metric: fn(&Gpu) -> &Metric,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |g, t| {
        if utilization.is_null() || sampling_period_us.is_null() {
            return INVALID_ARGUMENT;
        }
        match as_c_uint(g.read(metric(g), t)) {
            Ok(pct) => {
                // SAFETY: both non-null, and the caller promises they are valid.
                unsafe {
                    utilization.write(pct);
                    sampling_period_us.write(CODEC_SAMPLING_PERIOD_US);
                }
                SUCCESS
            }
            Err(fault) => fault.code(),
        }
    })
}

/// Video encoder utilization, %, over the last sampling period.
///
/// # Safety
/// Both pointers must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEncoderUtilization(
    device: nvmlDevice_t,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller.
    unsafe { codec_utilization(device, |g| &g.enc_util_pct, utilization, sampling_period_us) }
}

/// Video decoder utilization, %, over the last sampling period.
///
/// # Safety
/// Both pointers must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDecoderUtilization(
    device: nvmlDevice_t,
    utilization: *mut c_uint,
    sampling_period_us: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller.
    unsafe { codec_utilization(device, |g| &g.dec_util_pct, utilization, sampling_period_us) }
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
    with_device(device, |g, mig, t| {
        if memory.is_null() {
            return INVALID_ARGUMENT;
        }
        // SAFETY: non-null, and the caller promises it is valid.
        if unsafe { (*memory).version } != MEMORY_V2_VERSION {
            return ARGUMENT_VERSION_MISMATCH;
        }
        let reading = match mig {
            Some(m) => g.mig_memory(m, t),
            None => g.memory(t),
        };
        let value = reading.map(|m| nvmlMemory_v2_t {
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

/// Field values (the ids `field_value` knows); any other field id gets
/// NVML_ERROR_NOT_SUPPORTED in its entry.
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
            match field_value(g, entry.fieldId, t) {
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

/// One field value of `g` at `t`: its NVML value type and value.
fn field_value(g: &Gpu, field_id: c_uint, t: u64) -> Result<(nvmlValueType_t, nvmlValue_t), Fault> {
    let uint = |metric: &Metric| {
        as_c_uint(g.read(metric, t)).map(|v| {
            (
                nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_INT,
                nvmlValue_t { uiVal: v },
            )
        })
    };
    let ull = |value: Result<u64, Fault>| {
        value.map(|v| {
            (
                nvmlValueType_enum_NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                nvmlValue_t { ullVal: v },
            )
        })
    };
    match field_id {
        NVML_FI_DEV_MEMORY_TEMP => uint(&g.memory_temperature_c),
        NVML_FI_DEV_POWER_INSTANT | NVML_FI_DEV_POWER_AVERAGE => uint(&g.power_mw),
        NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION => ull(g.energy_mj(t)),
        NVML_FI_DEV_ECC_SBE_VOL_TOTAL => ull(g.read(&g.ecc_sbe_volatile, t)),
        NVML_FI_DEV_ECC_DBE_VOL_TOTAL => ull(g.read(&g.ecc_dbe_volatile, t)),
        NVML_FI_DEV_ECC_SBE_AGG_TOTAL => ull(g.read(&g.ecc_sbe_aggregate, t)),
        NVML_FI_DEV_ECC_DBE_AGG_TOTAL => ull(g.read(&g.ecc_dbe_aggregate, t)),
        NVML_FI_DEV_RETIRED_SBE => ull(g.read(&g.retired_pages_sbe, t)),
        NVML_FI_DEV_RETIRED_DBE => ull(g.read(&g.retired_pages_dbe, t)),
        NVML_FI_DEV_RETIRED_PENDING => uint(&g.retired_pages_pending),
        NVML_FI_DEV_REMAPPED_COR => uint(&g.remapped_rows_corrected),
        NVML_FI_DEV_REMAPPED_UNC => uint(&g.remapped_rows_uncorrected),
        NVML_FI_DEV_REMAPPED_PENDING => uint(&g.remapped_rows_pending),
        NVML_FI_DEV_REMAPPED_FAILURE => uint(&g.remapped_rows_failure),
        NVML_FI_DEV_PCIE_REPLAY_COUNTER => ull(g.read(&g.pcie_replay_count, t)),
        NVML_FI_DEV_PCIE_COUNT_TX_BYTES => ull(g.pcie_tx_bytes(t)),
        NVML_FI_DEV_PCIE_COUNT_RX_BYTES => ull(g.pcie_rx_bytes(t)),
        // Summed over all links, whatever the entry's scopeId.
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX => ull(g.nvlink_tx_kib(t)),
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX => ull(g.nvlink_rx_kib(t)),
        _ => Err(Fault::NotSupported),
    }
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

/// The power limit the driver enforces, in mW (`power_limit_mw`).
///
/// # Safety
/// `limit` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller.
    with_gpu(device, |g, t| unsafe {
        put(limit, as_c_uint(g.read(&g.power_limit_mw, t)))
    })
}

/// The power management limit, in mW: the same `power_limit_mw`.
///
/// # Safety
/// `limit` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimit(
    device: nvmlDevice_t,
    limit: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller.
    with_gpu(device, |g, t| unsafe {
        put(limit, as_c_uint(g.read(&g.power_limit_mw, t)))
    })
}

/// Why the clocks are held down: the `clock_event_reasons` bitmask.
///
/// # Safety
/// `reasons` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller.
    with_gpu(device, |g, t| unsafe {
        put(reasons, g.read(&g.clock_event_reasons, t))
    })
}

/// The older name of `nvmlDeviceGetCurrentClocksEventReasons`, same result.
///
/// # Safety
/// `reasons` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller.
    unsafe { nvmlDeviceGetCurrentClocksEventReasons(device, reasons) }
}

/// The processes with a compute context now. With `*info_count` smaller
/// than their number (0 and a null `infos` to ask), sets it to that number
/// and returns NVML_ERROR_INSUFFICIENT_SIZE.
///
/// # Safety
/// `info_count` must be null or valid for reads and writes; `infos` must be
/// null or valid for writes of `*info_count` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    info_count: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    with_device(device, |g, mig, t| {
        if info_count.is_null() {
            return INVALID_ARGUMENT;
        }
        // A MIG handle lists its own processes; the GPU's handle all of
        // them, each with the instance it runs on.
        let running: Vec<_> = match mig {
            Some(m) => m
                .processes
                .iter()
                .filter(|p| p.runs_at(t))
                .map(|p| (p, Some(m)))
                .collect(),
            None => g.all_processes_at(t).collect(),
        };
        let needed = c_uint::try_from(running.len()).unwrap_or(c_uint::MAX);
        // SAFETY: non-null, and the caller promises it is valid.
        let capacity = unsafe { info_count.read() };
        if capacity < needed {
            // SAFETY: as above.
            unsafe { info_count.write(needed) };
            return INSUFFICIENT_SIZE;
        }
        if needed > 0 && infos.is_null() {
            return INVALID_ARGUMENT;
        }
        for (i, (p, on)) in running.iter().enumerate() {
            let info = nvmlProcessInfo_t {
                pid: p.pid,
                // NVML_VALUE_NOT_AVAILABLE is -1: all bits set.
                usedGpuMemory: p
                    .used_memory_bytes
                    .unwrap_or(NVML_VALUE_NOT_AVAILABLE as c_ulonglong),
                gpuInstanceId: on.map_or(NO_INSTANCE, |m| m.gpu_instance_id),
                computeInstanceId: on.map_or(NO_INSTANCE, |m| m.compute_instance_id),
            };
            // SAFETY: i < needed <= capacity, the caller's entry count.
            unsafe { infos.add(i).write(info) };
        }
        // SAFETY: as above.
        unsafe { info_count.write(needed) };
        SUCCESS
    })
}

/// Whether the GPU supports GPM (`gpm`); the caller sets `version` to
/// NVML_GPM_SUPPORT_VERSION.
///
/// # Safety
/// `support` must be null or valid for reads and writes of `nvmlGpmSupport_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(
    device: nvmlDevice_t,
    support: *mut nvmlGpmSupport_t,
) -> nvmlReturn_t {
    with_gpu(device, |g, _| {
        if support.is_null() {
            return INVALID_ARGUMENT;
        }
        // SAFETY: non-null, and the caller promises it is valid.
        let support = unsafe { &mut *support };
        if support.version != NVML_GPM_SUPPORT_VERSION {
            return ARGUMENT_VERSION_MISMATCH;
        }
        support.isSupportedDevice = c_uint::from(g.gpm);
        SUCCESS
    })
}

/// A new, empty GPM sample.
///
/// # Safety
/// `sample` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(sample: *mut nvmlGpmSample_t) -> nvmlReturn_t {
    with_session_mut(|session| {
        if sample.is_null() {
            return INVALID_ARGUMENT;
        }
        let mut slot = Box::<GpmSampleSlot>::default();
        let handle = ptr::from_mut(&mut *slot).cast::<nvmlGpmSample_st>();
        session.gpm_samples.insert(handle.addr(), slot);
        // SAFETY: forwarded from the caller.
        unsafe { put(sample, Ok(handle)) }
    })
}

/// Frees a sample from `nvmlGpmSampleAlloc`.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpmSampleFree(sample: nvmlGpmSample_t) -> nvmlReturn_t {
    with_session_mut(|session| match session.gpm_samples.remove(&sample.addr()) {
        Some(_) => SUCCESS,
        None => INVALID_ARGUMENT,
    })
}

/// Records in `sample` that it was taken on this GPU (or, for a MIG
/// handle, on its GPU instance), now.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpmSampleGet(device: nvmlDevice_t, sample: nvmlGpmSample_t) -> nvmlReturn_t {
    with_session_mut(|session| {
        let (gpu, slot, elapsed_ms) = match session.live_device(device) {
            Ok(found) => found,
            Err(code) => return code,
        };
        let gpu_instance_id = slot
            .and_then(|s| session.scenario.gpus.get(gpu)?.mig.get(s))
            .map(|m| m.gpu_instance_id);
        take_gpm_sample(session, gpu, gpu_instance_id, elapsed_ms, sample)
    })
}

/// Records in `sample` that it was taken on GPU instance `gpu_instance_id`
/// of this (MIG-enabled) GPU, now.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlGpmMigSampleGet(
    device: nvmlDevice_t,
    gpu_instance_id: c_uint,
    sample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    with_session_mut(|session| {
        let (gpu, elapsed_ms) = match session.live_gpu(device) {
            Ok(found) => found,
            Err(code) => return code,
        };
        let exists = session.scenario.gpus.get(gpu).is_some_and(|g| {
            g.mig_enabled(elapsed_ms) && g.mig.iter().any(|m| m.gpu_instance_id == gpu_instance_id)
        });
        if !exists {
            return INVALID_ARGUMENT;
        }
        take_gpm_sample(session, gpu, Some(gpu_instance_id), elapsed_ms, sample)
    })
}

fn take_gpm_sample(
    session: &mut Session,
    gpu: usize,
    gpu_instance_id: Option<u32>,
    elapsed_ms: u64,
    sample: nvmlGpmSample_t,
) -> nvmlReturn_t {
    {
        if !session.scenario.gpus.get(gpu).is_some_and(|g| g.gpm) {
            return NOT_SUPPORTED;
        }
        session.gpm_samples_taken += 1;
        let seq = session.gpm_samples_taken;
        match session.gpm_samples.get_mut(&sample.addr()) {
            Some(slot) => {
                slot.taken = Some(GpmTaken {
                    gpu,
                    gpu_instance_id,
                    elapsed_ms,
                    seq,
                });
                SUCCESS
            }
            None => INVALID_ARGUMENT,
        }
    }
}

/// The GPM metric of `g` (or of its MIG device `mig`) with NVML id `id`,
/// if the scenario has it.
fn gpm_metric<'a>(g: &'a Gpu, mig: Option<&'a MigDevice>, id: c_uint) -> Option<&'a Metric<f64>> {
    if let Some(m) = mig {
        return match id {
            GPM_GRAPHICS_UTIL => Some(&m.graphics_active_pct),
            GPM_SM_UTIL => Some(&m.sm_active_pct),
            GPM_SM_OCCUPANCY => Some(&m.sm_occupancy_pct),
            GPM_ANY_TENSOR_UTIL => Some(&m.tensor_active_pct),
            GPM_DRAM_BW_UTIL => Some(&m.dram_active_pct),
            _ => None,
        };
    }
    match id {
        GPM_GRAPHICS_UTIL => Some(&g.graphics_active_pct),
        GPM_SM_UTIL => Some(&g.sm_active_pct),
        GPM_SM_OCCUPANCY => Some(&g.sm_occupancy_pct),
        GPM_ANY_TENSOR_UTIL => Some(&g.tensor_active_pct),
        GPM_DRAM_BW_UTIL => Some(&g.dram_active_pct),
        _ => None,
    }
}

/// The requested GPM metrics between two samples of one GPU, as the
/// scenario has them at the second sample's time; an unknown metric id gets
/// NVML_ERROR_NOT_SUPPORTED in its entry.
///
/// # Safety
/// `metrics_get` must be null or valid for reads and writes of `nvmlGpmMetricsGet_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmMetricsGet(metrics_get: *mut nvmlGpmMetricsGet_t) -> nvmlReturn_t {
    with_session(|session| {
        if metrics_get.is_null() {
            return INVALID_ARGUMENT;
        }
        // SAFETY: non-null, and the caller promises it is valid.
        let request = unsafe { &mut *metrics_get };
        if request.version != NVML_GPM_METRICS_GET_VERSION {
            return ARGUMENT_VERSION_MISMATCH;
        }
        let taken = |sample: nvmlGpmSample_t| {
            session
                .gpm_samples
                .get(&sample.addr())
                .and_then(|slot| slot.taken)
        };
        let (Some(first), Some(second)) = (taken(request.sample1), taken(request.sample2)) else {
            return INVALID_ARGUMENT;
        };
        if first.gpu != second.gpu
            || first.gpu_instance_id != second.gpu_instance_id
            || second.seq <= first.seq
        {
            return INVALID_ARGUMENT;
        }
        let Some(g) = session.scenario.gpus.get(second.gpu) else {
            return INVALID_ARGUMENT;
        };
        if g.is_lost(session.elapsed_ms()) {
            return GPU_IS_LOST;
        }
        if !g.gpm {
            return NOT_SUPPORTED;
        }
        // GPM is per GPU instance: its compute instances share the values.
        let mig = second
            .gpu_instance_id
            .and_then(|gi| g.mig.iter().find(|m| m.gpu_instance_id == gi));
        let Some(entries) = request.metrics.get_mut(..request.numMetrics as usize) else {
            return INVALID_ARGUMENT;
        };
        for entry in entries {
            entry.metricInfo = nvmlGpmMetric_t__bindgen_ty_1 {
                shortName: ptr::null_mut(),
                longName: ptr::null_mut(),
                unit: ptr::null_mut(),
            };
            let value = gpm_metric(g, mig, entry.metricId)
                .ok_or(Fault::NotSupported)
                .and_then(|m| g.read(m, second.elapsed_ms));
            match value {
                Ok(v) => {
                    entry.value = v;
                    entry.nvmlReturn = SUCCESS;
                }
                Err(fault) => {
                    entry.value = 0.0;
                    entry.nvmlReturn = fault.code();
                }
            }
        }
        SUCCESS
    })
}

/// A new, empty event set.
///
/// # Safety
/// `set` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    with_session_mut(|session| {
        if set.is_null() {
            return INVALID_ARGUMENT;
        }
        let mut slot = Box::<EventSetSlot>::default();
        let handle = ptr::from_mut(&mut *slot).cast::<nvmlEventSet_st>();
        session.event_sets.insert(handle.addr(), slot);
        // SAFETY: forwarded from the caller.
        unsafe { put(set, Ok(handle)) }
    })
}

/// Frees a set from `nvmlEventSetCreate`; a wait blocked on it returns
/// NVML_ERROR_INVALID_ARGUMENT.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    with_session_mut(|session| match session.event_sets.remove(&set.addr()) {
        Some(_) => {
            WAKE.notify_all();
            SUCCESS
        }
        None => INVALID_ARGUMENT,
    })
}

/// The event types this GPU can report: [`SUPPORTED_EVENT_TYPES`].
///
/// # Safety
/// `event_types` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    event_types: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller.
    with_gpu(device, |_, _| unsafe {
        put(event_types, Ok(SUPPORTED_EVENT_TYPES))
    })
}

/// Adds this GPU's `event_types` to the set; types the GPU does not support
/// return NVML_ERROR_NOT_SUPPORTED.
#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    event_types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    with_session_mut(|session| {
        let gpu = match session.live_gpu(device) {
            Ok((gpu, _)) => gpu,
            Err(code) => return code,
        };
        if event_types & !SUPPORTED_EVENT_TYPES != 0 {
            return NOT_SUPPORTED;
        }
        let Some(slot) = session.event_sets.get_mut(&set.addr()) else {
            return INVALID_ARGUMENT;
        };
        *slot.registered.entry(gpu).or_insert(0) |= event_types;
        // A wait already blocked on this set may now have an event due.
        WAKE.notify_all();
        SUCCESS
    })
}

/// The next XID event for the set, waiting up to `timeout_ms` for one to
/// fall due; NVML_ERROR_TIMEOUT when none did. Blocks without the lock.
///
/// # Safety
/// `data` must be null or valid for a write of `nvmlEventData_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let called = Instant::now();
        let deadline = called
            .checked_add(Duration::from_millis(u64::from(timeout_ms)))
            .unwrap_or(called);
        let mut state = lock();
        loop {
            let Some(session) = state.session.as_mut() else {
                return UNINITIALIZED;
            };
            if data.is_null() {
                return INVALID_ARGUMENT;
            }
            let Some(slot) = session.event_sets.get(&set.addr()) else {
                return INVALID_ARGUMENT;
            };
            let now_ms = session.elapsed_ms();
            let wake = match session.next_xid(slot) {
                Some((gpu, event)) if event.at_ms <= now_ms => {
                    if let Some(slot) = session.event_sets.get_mut(&set.addr()) {
                        *slot.delivered.entry(gpu).or_insert(0) += 1;
                    }
                    let event = nvmlEventData_t {
                        device: ptr::without_provenance_mut::<nvmlDevice_st>(gpu + 1),
                        eventType: XID_EVENT,
                        eventData: event.xid,
                        gpuInstanceId: event.gpu_instance_id.unwrap_or(NO_INSTANCE),
                        computeInstanceId: event.compute_instance_id.unwrap_or(NO_INSTANCE),
                    };
                    // SAFETY: non-null, and the caller promises it is valid.
                    unsafe { data.write(event) };
                    return SUCCESS;
                }
                Some((_, event)) => session
                    .started
                    .checked_add(Duration::from_millis(event.at_ms))
                    .unwrap_or(deadline),
                None => deadline,
            };
            let now = Instant::now();
            if now >= deadline {
                return TIMEOUT;
            }
            // Sleeps without the lock, so other threads' calls go on.
            let timeout = wake.min(deadline).saturating_duration_since(now);
            state = WAKE
                .wait_timeout(state, timeout)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    })
}

/// Whether MIG is enabled now (`mig_mode`) and after the next reset
/// (`mig_mode_pending`): 1 or 0 each.
///
/// # Safety
/// `current` and `pending` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: nvmlDevice_t,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |g, t| {
        if pending.is_null() {
            return INVALID_ARGUMENT;
        }
        let now = as_c_uint(g.read(&g.mig_mode, t));
        let next = as_c_uint(g.read(&g.mig_mode_pending, t));
        let (now, next) = match (now, next) {
            (Ok(now), Ok(next)) => (now, next),
            (Err(f), _) | (_, Err(f)) => return f.code(),
        };
        // SAFETY: forwarded from the caller; `pending` checked above.
        unsafe {
            let code = put(current, Ok(now));
            if code == SUCCESS {
                pending.write(next);
            }
            code
        }
    })
}

/// How many MIG devices the GPU can hold: [`MAX_MIG_DEVICES`] on a GPU
/// with MIG (enabled or not); NVML_ERROR_NOT_SUPPORTED without.
///
/// # Safety
/// `count` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |g, t| {
        let value = g.read(&g.mig_mode, t).map(|_| MAX_MIG_DEVICES as c_uint);
        // SAFETY: forwarded from the caller.
        unsafe { put(count, value) }
    })
}

/// The handle of MIG device `index` (0-based, scenario order);
/// NVML_ERROR_NOT_FOUND for an empty slot or while MIG is disabled.
///
/// # Safety
/// `mig_device` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: nvmlDevice_t,
    index: c_uint,
    mig_device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    with_gpu(device, |g, t| {
        if index as usize >= MAX_MIG_DEVICES {
            return INVALID_ARGUMENT;
        }
        let value = match g.mig_device(index as usize, t) {
            Some(_) => Ok(mig_handle(g.index as usize, index as usize)),
            None => return NOT_FOUND,
        };
        // SAFETY: forwarded from the caller.
        unsafe { put(mig_device, value) }
    })
}

/// 1 for a MIG device's handle, 0 for a GPU's.
///
/// # Safety
/// `is_mig` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: nvmlDevice_t,
    is_mig: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller.
    with_device(device, |_, mig, _| unsafe {
        put(is_mig, Ok(c_uint::from(mig.is_some())))
    })
}

/// The GPU handle of a MIG device's GPU.
///
/// # Safety
/// `parent` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    device: nvmlDevice_t,
    parent: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    with_device(device, |g, mig, _| {
        if mig.is_none() {
            return INVALID_ARGUMENT;
        }
        let handle = ptr::without_provenance_mut::<nvmlDevice_st>(g.index as usize + 1);
        // SAFETY: forwarded from the caller.
        unsafe { put(parent, Ok(handle)) }
    })
}

/// A MIG device's GPU instance id; NVML_ERROR_INVALID_ARGUMENT for a GPU handle.
///
/// # Safety
/// `id` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, mig, _| match mig {
        // SAFETY: forwarded from the caller.
        Some(m) => unsafe { put(id, Ok(m.gpu_instance_id)) },
        None => INVALID_ARGUMENT,
    })
}

/// A MIG device's compute instance id; NVML_ERROR_INVALID_ARGUMENT for a GPU handle.
///
/// # Safety
/// `id` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: nvmlDevice_t,
    id: *mut c_uint,
) -> nvmlReturn_t {
    with_device(device, |_, mig, _| match mig {
        // SAFETY: forwarded from the caller.
        Some(m) => unsafe { put(id, Ok(m.compute_instance_id)) },
        None => INVALID_ARGUMENT,
    })
}

/// Defines an export that reads one `u32` metric of the GPU.
macro_rules! gpu_u32_export {
    ($(#[$doc:meta])* $name:ident, $field:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// `value` must be null or valid for a write.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(device: nvmlDevice_t, value: *mut c_uint) -> nvmlReturn_t {
            // SAFETY: forwarded from the caller.
            with_gpu(device, |g, t| unsafe { put(value, as_c_uint(g.read(&g.$field, t))) })
        }
    };
}

gpu_u32_export!(
    /// The PCIe link generation now (`pcie_link_gen`).
    nvmlDeviceGetCurrPcieLinkGeneration,
    pcie_link_gen
);
gpu_u32_export!(
    /// The highest PCIe link generation GPU and host share (`pcie_link_gen_max`).
    nvmlDeviceGetMaxPcieLinkGeneration,
    pcie_link_gen_max
);
gpu_u32_export!(
    /// The PCIe lanes in use now (`pcie_link_width`).
    nvmlDeviceGetCurrPcieLinkWidth,
    pcie_link_width
);
gpu_u32_export!(
    /// The most PCIe lanes (`pcie_link_width_max`).
    nvmlDeviceGetMaxPcieLinkWidth,
    pcie_link_width_max
);
gpu_u32_export!(
    /// Fan speed in % of its maximum (`fan_speed_pct`), the one fan.
    nvmlDeviceGetFanSpeed,
    fan_speed_pct
);

/// Fan `fan`'s speed in %: the GPU has one fan (`fan_speed_pct`), or none
/// when that is "unsupported", and then, as an H200 SXM with driver 580
/// answers for its fan 0, any fan is an invalid argument.
///
/// # Safety
/// `speed` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed_v2(
    device: nvmlDevice_t,
    fan: c_uint,
    speed: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |g, t| {
        let value = as_c_uint(g.read(&g.fan_speed_pct, t));
        if matches!(value, Err(Fault::NotSupported)) || (fan != 0 && value.is_ok()) {
            return INVALID_ARGUMENT;
        }
        // SAFETY: forwarded from the caller.
        unsafe { put(speed, value) }
    })
}

/// 1 fan; 0 when `fan_speed_pct` is "unsupported" (a board the chassis
/// cools, as an H200 SXM reports itself); `fan_speed_pct`'s other errors.
///
/// # Safety
/// `count` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumFans(
    device: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    with_gpu(device, |g, t| {
        let value = match g.read(&g.fan_speed_pct, t) {
            Err(Fault::NotSupported) => Ok(0),
            other => other.map(|_| 1),
        };
        // SAFETY: forwarded from the caller.
        unsafe { put(count, value) }
    })
}

/// The performance state (`performance_state`: 0–15, 32 unknown).
///
/// # Safety
/// `state` must be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPerformanceState(
    device: nvmlDevice_t,
    state: *mut nvmlPstates_t,
) -> nvmlReturn_t {
    // SAFETY: forwarded from the caller.
    with_gpu(device, |g, t| unsafe {
        put(state, as_c_uint(g.read(&g.performance_state, t)))
    })
}
