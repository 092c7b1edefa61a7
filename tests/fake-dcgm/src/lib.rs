//! A fake `libdcgm.so` for tests.
//!
//! Built as a `cdylib`, it exports the DCGM C functions gputel's agent calls
//! (see `agent/src/sampler/dcgm/sys.rs`), with the signatures and struct
//! layouts of DCGM's headers (`dcgm_agent.h`, `dcgm_structs.h`,
//! `dcgm_fields.h`, DCGM 3.0 to 4.x), written here independently of the
//! agent's bindings so that a layout mistake on either side shows. What the
//! GPUs read comes from the fake NVML's scenario file (named by the same
//! environment variable, `GPUTEL_FAKE_NVML_SCENARIO`, read at the first
//! `dcgmInit`): the same `[[gpu]]` entries, in the same order and with the
//! same UUIDs, and its `[dcgm]` table for the host engine, the embedded
//! engine and the profiler. See this crate's README.
//!
//! Every function catches panics (a panic must not unwind into C) and takes
//! the one global lock.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CStr, c_char, c_double, c_int, c_longlong, c_uint, c_ushort};
use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use gputel_fake_scenario::{Gpu, Metric, Profiler, SCENARIO_ENV, Scenario};

/// `dcgmReturn_t` values (dcgm_structs.h).
pub mod status {
    pub const OK: i32 = 0;
    pub const BADPARAM: i32 = -1;
    pub const NOT_CONFIGURED: i32 = -5;
    pub const NOT_SUPPORTED: i32 = -6;
    pub const INIT_ERROR: i32 = -7;
    pub const UNINITIALIZED: i32 = -10;
    pub const VER_MISMATCH: i32 = -12;
    pub const NOT_WATCHED: i32 = -16;
    pub const GPU_IS_LOST: i32 = -18;
    pub const CONNECTION_NOT_VALID: i32 = -21;
    pub const DUPLICATE_KEY: i32 = -26;
    pub const MODULE_NOT_LOADED: i32 = -33;
    pub const IN_USE: i32 = -34;
    pub const PROFILING_NOT_SUPPORTED: i32 = -36;
    pub const PROFILING_LIBRARY_ERROR: i32 = -37;
    pub const PROFILING_MULTI_PASS: i32 = -38;
}
use status::*;

/// `MAKE_DCGM_VERSION(type, ver)`.
const fn make_version(size: usize, version: u32) -> c_uint {
    size as c_uint | (version << 24)
}

/// `DCGM_MAX_NUM_DEVICES`.
pub const MAX_NUM_DEVICES: usize = 32;
/// `DCGM_GROUP_DEFAULT`, `DCGM_GROUP_EMPTY`.
const GROUP_DEFAULT: c_int = 0;
const GROUP_EMPTY: c_int = 1;
/// `DCGM_FE_GPU`.
pub const FE_GPU: c_int = 1;
/// `DCGM_FT_DOUBLE`, `DCGM_FT_STRING`.
pub const FT_DOUBLE: c_ushort = b'd' as c_ushort;
pub const FT_STRING: c_ushort = b's' as c_ushort;
/// `DCGM_FP64_BLANK`, and `DCGM_FP64_NOT_SUPPORTED` (blank + 2).
pub const FP64_BLANK: f64 = 140_737_488_355_328.0;
const FP64_NOT_SUPPORTED: f64 = FP64_BLANK + 2.0;
/// `DCGM_MAX_FIELD_IDS_PER_FIELD_GROUP`.
const MAX_FIELD_IDS_PER_FIELD_GROUP: c_int = 128;
/// Field ids: `DCGM_FI_DEV_UUID`, and the profiling range
/// (`DCGM_FI_PROF_GR_ENGINE_ACTIVE` 1001 … `DCGM_FI_PROF_DRAM_ACTIVE` 1005).
pub const FI_DEV_UUID: c_ushort = 54;
const FI_PROF_FIRST: c_ushort = 1001;
const FI_PROF_LAST: c_ushort = 1099;

/// `dcgmConnectV2Params_v2` (v1 is its first two members).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ConnectV2Params {
    pub version: c_uint,
    pub persist_after_disconnect: c_uint,
    pub timeout_ms: c_uint,
    pub address_is_unix_socket: c_uint,
}

/// `dcgmConnectV2Params_version1`, `_version2`.
pub const CONNECT_V2_PARAMS_VERSION1: c_uint = make_version(8, 1);
pub const CONNECT_V2_PARAMS_VERSION2: c_uint = make_version(size_of::<ConnectV2Params>(), 2);

/// The members every `dcgmStartEmbeddedV2Params_v1`/`_v2`/`_v3` begins with.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct StartEmbeddedHead {
    pub version: c_uint,
    pub op_mode: c_int,
    pub dcgm_handle: usize,
}

/// The versions of `dcgmStartEmbeddedV2Params`: v1 (72 bytes, DCGM 2.0),
/// v2 (80, DCGM 2.4), v3 (104, DCGM 4.3).
pub const START_EMBEDDED_VERSIONS: [c_uint; 3] = [
    make_version(72, 1),
    make_version(80, 2),
    make_version(104, 3),
];

/// `dcgmVersionInfo_v2`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct VersionInfo {
    pub version: c_uint,
    pub raw_build_info_string: [c_char; 512],
}

/// `dcgmVersionInfo_version2`.
pub const VERSION_INFO_VERSION2: c_uint = make_version(size_of::<VersionInfo>(), 2);

/// `dcgmGroupEntityPair_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct GroupEntityPair {
    pub entity_group_id: c_int,
    pub entity_id: c_uint,
}

/// `dcgmFieldValue_v2`, with its value union as bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FieldValueV2 {
    pub version: c_uint,
    pub entity_group_id: c_int,
    pub entity_id: c_uint,
    pub field_id: c_ushort,
    pub field_type: c_ushort,
    pub status: c_int,
    pub unused: c_uint,
    pub ts: i64,
    /// The union of `i64`, `dbl`, `str[256]` and `blob[4096]`.
    pub value: [u64; 512],
}

/// `dcgmFieldValue_version2`.
pub const FIELD_VALUE_VERSION2: c_uint = make_version(size_of::<FieldValueV2>(), 2);

const _: () = {
    assert!(size_of::<ConnectV2Params>() == 16);
    assert!(size_of::<VersionInfo>() == 516);
    assert!(size_of::<FieldValueV2>() == 4128);
    assert!(std::mem::offset_of!(FieldValueV2, value) == 32);
};

impl std::fmt::Debug for FieldValueV2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FieldValueV2")
            .field("entity_id", &self.entity_id)
            .field("field_id", &self.field_id)
            .field("status", &self.status)
            .finish()
    }
}

impl FieldValueV2 {
    fn set_double(&mut self, v: f64) {
        self.field_type = FT_DOUBLE;
        self.value[0] = v.to_bits();
    }

    fn set_string(&mut self, s: &str) {
        self.field_type = FT_STRING;
        let mut bytes = [0u8; 256];
        let n = s.len().min(255);
        bytes[..n].copy_from_slice(&s.as_bytes()[..n]);
        for (i, chunk) in bytes.chunks(8).enumerate() {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.value[i] = u64::from_ne_bytes(word);
        }
    }
}

#[derive(Debug)]
struct Group {
    name: String,
    gpus: Vec<c_uint>,
}

#[derive(Debug)]
struct FieldGroup {
    name: String,
    fields: Vec<c_ushort>,
}

/// The library's state between the first `dcgmInit` and the last `dcgmShutdown`.
#[derive(Debug)]
struct Dcgm {
    scenario: Scenario,
    started: Instant,
    /// Live handles, from `dcgmConnect_v2` and `dcgmStartEmbedded_v2`.
    handles: BTreeSet<usize>,
    groups: BTreeMap<usize, Group>,
    field_groups: BTreeMap<usize, FieldGroup>,
    /// (group, field group) pairs watched.
    watches: BTreeSet<(usize, usize)>,
    /// Handles, groups and field groups are numbered from one counter.
    next_id: usize,
    paused: bool,
}

impl Dcgm {
    fn new(scenario: Scenario) -> Dcgm {
        Dcgm {
            scenario,
            started: Instant::now(),
            handles: BTreeSet::new(),
            groups: BTreeMap::new(),
            field_groups: BTreeMap::new(),
            watches: BTreeSet::new(),
            next_id: 1,
            paused: false,
        }
    }

    fn id(&mut self) -> usize {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn handle(&self, handle: usize) -> Result<(), c_int> {
        if self.handles.contains(&handle) {
            Ok(())
        } else {
            Err(BADPARAM)
        }
    }

    fn watched(&self, gpu: c_uint, field: c_ushort) -> bool {
        self.watches.iter().any(|(g, fg)| {
            self.groups.get(g).is_some_and(|g| g.gpus.contains(&gpu))
                && self
                    .field_groups
                    .get(fg)
                    .is_some_and(|fg| fg.fields.contains(&field))
        })
    }

    /// One record of `dcgmEntitiesGetLatestValues`.
    fn value(&self, gpu_id: c_uint, field: c_ushort, live: bool, out: &mut FieldValueV2) {
        *out = FieldValueV2 {
            version: FIELD_VALUE_VERSION2,
            entity_group_id: FE_GPU,
            entity_id: gpu_id,
            field_id: field,
            field_type: 0,
            status: OK,
            unused: 0,
            ts: now_us(),
            value: [0; 512],
        };
        let Some(gpu) = self.scenario.gpus.get(gpu_id as usize) else {
            out.status = BADPARAM;
            return;
        };
        let t = self.elapsed_ms();
        if field == FI_DEV_UUID {
            out.set_string(&gpu.uuid);
            return;
        }
        if !live && !self.watched(gpu_id, field) {
            out.status = NOT_WATCHED;
            out.set_double(FP64_BLANK);
            return;
        }
        if gpu.is_lost(t) {
            out.status = GPU_IS_LOST;
            out.set_double(FP64_BLANK);
            return;
        }
        let Some(metric) = activity(gpu, field) else {
            out.status = NOT_SUPPORTED;
            out.set_double(FP64_NOT_SUPPORTED);
            return;
        };
        if self.paused {
            // DCGM stores blanks while profiling is paused.
            out.set_double(FP64_BLANK);
            return;
        }
        match gpu.read(metric, t) {
            Ok(percent) => out.set_double(percent / 100.0),
            Err(_) => {
                out.status = NOT_SUPPORTED;
                out.set_double(FP64_NOT_SUPPORTED);
            }
        }
    }
}

/// The scenario metric behind a profiling field, in percent.
fn activity(gpu: &Gpu, field: c_ushort) -> Option<&Metric<f64>> {
    Some(match field {
        1001 => &gpu.graphics_active_pct,
        1002 => &gpu.sm_active_pct,
        1003 => &gpu.sm_occupancy_pct,
        1004 => &gpu.tensor_active_pct,
        1005 => &gpu.dram_active_pct,
        _ => return None,
    })
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

struct State {
    refcount: u32,
    dcgm: Option<Dcgm>,
}

static STATE: Mutex<State> = Mutex::new(State {
    refcount: 0,
    dcgm: None,
});

fn lock() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `f`; a panic answers `DCGM_ST_BADPARAM` instead of unwinding into C.
fn guard(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(BADPARAM)
}

/// Runs `f` on the initialized library, or answers `DCGM_ST_UNINITIALIZED`.
fn with_dcgm(f: impl FnOnce(&mut Dcgm) -> Result<(), c_int>) -> c_int {
    guard(|| match lock().dcgm.as_mut() {
        Some(dcgm) => f(dcgm).err().unwrap_or(OK),
        None => UNINITIALIZED,
    })
}

/// Starts the library: reads the scenario on the first call, counts later ones.
#[unsafe(no_mangle)]
pub extern "C" fn dcgmInit() -> c_int {
    guard(|| {
        let mut state = lock();
        if state.refcount > 0 {
            state.refcount += 1;
            return OK;
        }
        match Scenario::from_env() {
            Ok(scenario) => {
                state.dcgm = Some(Dcgm::new(scenario));
                state.refcount = 1;
                OK
            }
            Err((path, e)) => {
                let what = match path {
                    Some(p) => format!("scenario file {} (from {SCENARIO_ENV})", p.display()),
                    None => "built-in scenario".to_owned(),
                };
                let _ = writeln!(
                    std::io::stderr(),
                    "gputel-fake-dcgm: dcgmInit fails with DCGM_ST_INIT_ERROR: {what}: {e}"
                );
                INIT_ERROR
            }
        }
    })
}

/// Undoes one init; the last one drops every connection, group and watch.
#[unsafe(no_mangle)]
pub extern "C" fn dcgmShutdown() -> c_int {
    guard(|| {
        let mut state = lock();
        match state.refcount {
            0 => UNINITIALIZED,
            1 => {
                state.refcount = 0;
                state.dcgm = None;
                OK
            }
            n => {
                state.refcount = n - 1;
                OK
            }
        }
    })
}

/// A static description of a status.
#[unsafe(no_mangle)]
pub extern "C" fn errorString(result: c_int) -> *const c_char {
    let s: &'static CStr = match result {
        OK => c"Success",
        BADPARAM => c"A bad parameter was passed to a function",
        NOT_CONFIGURED => c"Setting not configured",
        NOT_SUPPORTED => c"Feature not supported",
        INIT_ERROR => c"DCGM initialization error",
        UNINITIALIZED => c"DCGM is not initialized",
        VER_MISMATCH => c"Version mismatch between received and understood API",
        NOT_WATCHED => c"Field is not being watched",
        GPU_IS_LOST => c"GPU is lost",
        CONNECTION_NOT_VALID => c"Host engine connection invalid or disconnected",
        DUPLICATE_KEY => c"Duplicate key passed to a function",
        MODULE_NOT_LOADED => c"The module serving this request is not loaded",
        IN_USE => c"The affected resource is in use",
        PROFILING_NOT_SUPPORTED => c"Profiling is not supported for this group of GPUs or GPU",
        PROFILING_LIBRARY_ERROR => c"The profiling library returned an unrecoverable error",
        PROFILING_MULTI_PASS => c"The profiling metrics cannot be collected in a single pass",
        _ => return std::ptr::null(),
    };
    s.as_ptr()
}

/// The scenario's `[dcgm] version`, as DCGM's build information.
///
/// # Safety
/// `info` must be null or point to a `dcgmVersionInfo_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcgmVersionInfo(info: *mut VersionInfo) -> c_int {
    with_dcgm(|dcgm| {
        // SAFETY: null or a dcgmVersionInfo_v2, per the contract.
        let info = unsafe { info.as_mut() }.ok_or(BADPARAM)?;
        if info.version != VERSION_INFO_VERSION2 {
            return Err(VER_MISMATCH);
        }
        let text = format!(
            "version:{};arch:x86_64;buildtype:Release;commit:gputel-fake-dcgm",
            dcgm.scenario.dcgm.version
        );
        info.raw_build_info_string = [0; 512];
        for (dst, src) in info.raw_build_info_string.iter_mut().zip(text.bytes()) {
            *dst = src as c_char;
        }
        Ok(())
    })
}

/// Connects to the scenario's host engine when `address` (TCP or, with
/// `addressIsUnixSocket`, a socket path) is where it listens.
///
/// # Safety
/// `address` must be a NUL-terminated string, `params` a
/// `dcgmConnectV2Params_v1` or `_v2`, `handle` writable; each may be null.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcgmConnect_v2(
    address: *const c_char,
    params: *mut ConnectV2Params,
    handle: *mut usize,
) -> c_int {
    with_dcgm(|dcgm| {
        if address.is_null() || params.is_null() || handle.is_null() {
            return Err(BADPARAM);
        }
        // SAFETY: non-null, NUL-terminated per the contract.
        let address = unsafe { CStr::from_ptr(address) }.to_string_lossy();
        // SAFETY: the version is the first member of either version.
        let version = unsafe { (*params).version };
        let unix = match version {
            CONNECT_V2_PARAMS_VERSION1 => false,
            // SAFETY: a v2 record.
            CONNECT_V2_PARAMS_VERSION2 => unsafe { (*params).address_is_unix_socket != 0 },
            _ => return Err(VER_MISMATCH),
        };
        let reachable = dcgm
            .scenario
            .dcgm
            .host_engine
            .as_ref()
            .is_some_and(|engine| engine.accepts(&address, unix));
        if !reachable {
            return Err(CONNECTION_NOT_VALID);
        }
        let id = dcgm.id();
        dcgm.handles.insert(id);
        // SAFETY: non-null, writable per the contract.
        unsafe { *handle = id };
        Ok(())
    })
}

/// Closes a connection.
#[unsafe(no_mangle)]
pub extern "C" fn dcgmDisconnect(handle: usize) -> c_int {
    with_dcgm(|dcgm| {
        if dcgm.handles.remove(&handle) {
            Ok(())
        } else {
            Err(BADPARAM)
        }
    })
}

/// Starts an embedded engine, when the scenario's `[dcgm] embedded` allows.
///
/// # Safety
/// `params` must be null or a `dcgmStartEmbeddedV2Params_v1`, `_v2` or `_v3`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcgmStartEmbedded_v2(params: *mut StartEmbeddedHead) -> c_int {
    with_dcgm(|dcgm| {
        // SAFETY: null or one of the versions, which all begin with the head.
        let params = unsafe { params.as_mut() }.ok_or(BADPARAM)?;
        if !START_EMBEDDED_VERSIONS.contains(&params.version) {
            return Err(VER_MISMATCH);
        }
        if !dcgm.scenario.dcgm.embedded {
            return Err(INIT_ERROR);
        }
        let id = dcgm.id();
        dcgm.handles.insert(id);
        params.dcgm_handle = id;
        Ok(())
    })
}

/// Stops an embedded engine.
#[unsafe(no_mangle)]
pub extern "C" fn dcgmStopEmbedded(handle: usize) -> c_int {
    dcgmDisconnect(handle)
}

/// Every GPU of the scenario: DCGM GPU id = scenario (NVML) order.
///
/// # Safety
/// `gpu_ids` must have room for `DCGM_MAX_NUM_DEVICES` ids, `count` be writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcgmGetAllSupportedDevices(
    handle: usize,
    gpu_ids: *mut c_uint,
    count: *mut c_int,
) -> c_int {
    with_dcgm(|dcgm| {
        dcgm.handle(handle)?;
        if gpu_ids.is_null() || count.is_null() {
            return Err(BADPARAM);
        }
        let n = dcgm.scenario.gpus.len().min(MAX_NUM_DEVICES);
        for i in 0..n {
            // SAFETY: room for MAX_NUM_DEVICES ids.
            unsafe { *gpu_ids.add(i) = i as c_uint };
        }
        // SAFETY: writable.
        unsafe { *count = n as c_int };
        Ok(())
    })
}

/// A named group: empty, or with every GPU (`DCGM_GROUP_DEFAULT`).
///
/// # Safety
/// `name` must be NUL-terminated and `group` writable, or null.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcgmGroupCreate(
    handle: usize,
    group_type: c_int,
    name: *const c_char,
    group: *mut usize,
) -> c_int {
    with_dcgm(|dcgm| {
        dcgm.handle(handle)?;
        if name.is_null() || group.is_null() {
            return Err(BADPARAM);
        }
        // SAFETY: NUL-terminated per the contract.
        let name = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        if name.is_empty() || dcgm.groups.values().any(|g| g.name == name) {
            return Err(BADPARAM);
        }
        let gpus = match group_type {
            GROUP_EMPTY => Vec::new(),
            GROUP_DEFAULT => (0..dcgm.scenario.gpus.len() as c_uint).collect(),
            _ => return Err(BADPARAM),
        };
        let id = dcgm.id();
        dcgm.groups.insert(id, Group { name, gpus });
        // SAFETY: writable.
        unsafe { *group = id };
        Ok(())
    })
}

/// Adds a GPU to a group.
#[unsafe(no_mangle)]
pub extern "C" fn dcgmGroupAddDevice(handle: usize, group: usize, gpu_id: c_uint) -> c_int {
    with_dcgm(|dcgm| {
        dcgm.handle(handle)?;
        let known = (gpu_id as usize) < dcgm.scenario.gpus.len();
        let group = dcgm.groups.get_mut(&group).ok_or(NOT_CONFIGURED)?;
        if !known || group.gpus.contains(&gpu_id) {
            return Err(BADPARAM);
        }
        group.gpus.push(gpu_id);
        Ok(())
    })
}

/// Removes a group and its watches.
#[unsafe(no_mangle)]
pub extern "C" fn dcgmGroupDestroy(handle: usize, group: usize) -> c_int {
    with_dcgm(|dcgm| {
        dcgm.handle(handle)?;
        dcgm.groups.remove(&group).ok_or(NOT_CONFIGURED)?;
        dcgm.watches.retain(|(g, _)| *g != group);
        Ok(())
    })
}

/// A named group of 1 to 128 field ids.
///
/// # Safety
/// `field_ids` must hold `count` ids, `name` be NUL-terminated, and
/// `field_group` writable; each may be null.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcgmFieldGroupCreate(
    handle: usize,
    count: c_int,
    field_ids: *const c_ushort,
    name: *const c_char,
    field_group: *mut usize,
) -> c_int {
    with_dcgm(|dcgm| {
        dcgm.handle(handle)?;
        if field_ids.is_null()
            || name.is_null()
            || field_group.is_null()
            || !(1..=MAX_FIELD_IDS_PER_FIELD_GROUP).contains(&count)
        {
            return Err(BADPARAM);
        }
        // SAFETY: `count` ids per the contract.
        let fields = unsafe { std::slice::from_raw_parts(field_ids, count as usize) }.to_vec();
        // SAFETY: NUL-terminated per the contract.
        let name = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        if dcgm.field_groups.values().any(|g| g.name == name) {
            return Err(DUPLICATE_KEY);
        }
        let id = dcgm.id();
        dcgm.field_groups.insert(id, FieldGroup { name, fields });
        // SAFETY: writable.
        unsafe { *field_group = id };
        Ok(())
    })
}

/// Removes a field group and its watches.
#[unsafe(no_mangle)]
pub extern "C" fn dcgmFieldGroupDestroy(handle: usize, field_group: usize) -> c_int {
    with_dcgm(|dcgm| {
        dcgm.handle(handle)?;
        dcgm.field_groups
            .remove(&field_group)
            .ok_or(NOT_CONFIGURED)?;
        dcgm.watches.retain(|(_, fg)| *fg != field_group);
        Ok(())
    })
}

/// Watches a field group on a group; profiling fields meet the scenario's
/// `[dcgm] profiler`.
#[unsafe(no_mangle)]
pub extern "C" fn dcgmWatchFields(
    handle: usize,
    group: usize,
    field_group: usize,
    update_freq: c_longlong,
    max_keep_age: c_double,
    _max_keep_samples: c_int,
) -> c_int {
    with_dcgm(|dcgm| {
        dcgm.handle(handle)?;
        if update_freq <= 0 || max_keep_age.is_nan() || max_keep_age < 0.0 {
            return Err(BADPARAM);
        }
        let group_ok = dcgm.groups.contains_key(&group);
        let fields = &dcgm
            .field_groups
            .get(&field_group)
            .ok_or(NOT_CONFIGURED)?
            .fields;
        if !group_ok {
            return Err(NOT_CONFIGURED);
        }
        let profiling = fields
            .iter()
            .any(|f| (FI_PROF_FIRST..=FI_PROF_LAST).contains(f));
        if profiling {
            match dcgm.scenario.dcgm.profiler {
                Profiler::Free => {}
                Profiler::Busy => return Err(PROFILING_LIBRARY_ERROR),
                Profiler::InUse => return Err(IN_USE),
                Profiler::NoRoot => return Err(MODULE_NOT_LOADED),
                Profiler::Unsupported => return Err(PROFILING_NOT_SUPPORTED),
                Profiler::MultiPass => return Err(PROFILING_MULTI_PASS),
            }
        }
        dcgm.watches.insert((group, field_group));
        Ok(())
    })
}

/// Stops a watch.
#[unsafe(no_mangle)]
pub extern "C" fn dcgmUnwatchFields(handle: usize, group: usize, field_group: usize) -> c_int {
    with_dcgm(|dcgm| {
        dcgm.handle(handle)?;
        if dcgm.watches.remove(&(group, field_group)) {
            Ok(())
        } else {
            Err(NOT_CONFIGURED)
        }
    })
}

/// The latest value of every field of every entity. The records come
/// entity by entity, in the reverse of the order asked (DCGM promises no
/// order), each entity's fields in the order asked.
///
/// # Safety
/// `entities` must hold `entity_count` pairs, `fields` `field_count` ids,
/// and `values` room for `entity_count × field_count` records.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcgmEntitiesGetLatestValues(
    handle: usize,
    entities: *mut GroupEntityPair,
    entity_count: c_uint,
    fields: *mut c_ushort,
    field_count: c_uint,
    flags: c_uint,
    values: *mut FieldValueV2,
) -> c_int {
    with_dcgm(|dcgm| {
        dcgm.handle(handle)?;
        if entities.is_null() || fields.is_null() || values.is_null() {
            return Err(BADPARAM);
        }
        // SAFETY: sizes per the contract.
        let (entities, fields, values) = unsafe {
            (
                std::slice::from_raw_parts(entities, entity_count as usize),
                std::slice::from_raw_parts(fields, field_count as usize),
                std::slice::from_raw_parts_mut(
                    values,
                    entity_count as usize * field_count as usize,
                ),
            )
        };
        if entities.iter().any(|e| e.entity_group_id != FE_GPU) {
            return Err(NOT_SUPPORTED);
        }
        let live = flags & 1 != 0;
        let mut out = values.iter_mut();
        for entity in entities.iter().rev() {
            for field in fields {
                if let Some(record) = out.next() {
                    dcgm.value(entity.entity_id, *field, live, record);
                }
            }
        }
        Ok(())
    })
}

/// Pauses profiling: watched profiling fields read blank until resumed.
#[unsafe(no_mangle)]
pub extern "C" fn dcgmProfPause(handle: usize) -> c_int {
    with_dcgm(|dcgm| {
        dcgm.handle(handle)?;
        dcgm.paused = true;
        Ok(())
    })
}

/// Resumes profiling.
#[unsafe(no_mangle)]
pub extern "C" fn dcgmProfResume(handle: usize) -> c_int {
    with_dcgm(|dcgm| {
        dcgm.handle(handle)?;
        dcgm.paused = false;
        Ok(())
    })
}

/// Where Cargo put the fake library for the running test executable, if it
/// is there: `target/<profile>/deps/`, else `target/<profile>/`.
pub fn cdylib_path() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let name = format!(
        "{}gputel_fake_dcgm{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join(&name))
        .find(|p| p.is_file())
}
