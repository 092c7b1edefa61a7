//! The part of DCGM's C API the agent calls, bound by hand.
//!
//! Written against DCGM's published headers `dcgmlib/dcgm_agent.h`,
//! `dcgm_structs.h` and `dcgm_fields.h` of DCGM 4.6.0 (Apache-2.0, NVIDIA
//! Corporation); every call, struct and constant here has the same layout
//! and value since DCGM 3.0 (`libdcgm.so.3`). Only what the agent uses is
//! here. A versioned struct carries `MAKE_DCGM_VERSION(type, n)`, its size
//! with `n` in the top byte, which DCGM checks (`DCGM_ST_VER_MISMATCH`); the
//! sizes below are asserted at compile time against the headers' layouts,
//! so a wrong field makes the build fail rather than the call.

use std::ffi::{c_char, c_double, c_int, c_longlong, c_uint, c_ushort};

/// `dcgmReturn_t`: `DCGM_ST_OK` or a negative `DCGM_ST_*`.
pub type Return = c_int;
/// `dcgmHandle_t` (a `uintptr_t`).
pub type Handle = usize;
/// `dcgmGpuGrp_t` (a `uintptr_t`).
pub type GpuGroup = usize;
/// `dcgmFieldGrp_t` (a `uintptr_t`).
pub type FieldGroup = usize;

/// `MAKE_DCGM_VERSION(typeName, ver)`.
pub const fn make_version(size: usize, version: u32) -> c_uint {
    size as c_uint | (version << 24)
}

/// `dcgmReturn_t` values the agent names (dcgm_structs.h).
pub mod status {
    pub const OK: i32 = 0;
    pub const BADPARAM: i32 = -1;
    pub const GENERIC_ERROR: i32 = -3;
    pub const MEMORY: i32 = -4;
    pub const NOT_CONFIGURED: i32 = -5;
    pub const NOT_SUPPORTED: i32 = -6;
    pub const INIT_ERROR: i32 = -7;
    pub const NVML_ERROR: i32 = -8;
    pub const UNINITIALIZED: i32 = -10;
    pub const TIMEOUT: i32 = -11;
    pub const VER_MISMATCH: i32 = -12;
    pub const UNKNOWN_FIELD: i32 = -13;
    pub const NO_DATA: i32 = -14;
    pub const STALE_DATA: i32 = -15;
    pub const NOT_WATCHED: i32 = -16;
    pub const NO_PERMISSION: i32 = -17;
    pub const GPU_IS_LOST: i32 = -18;
    pub const CONNECTION_NOT_VALID: i32 = -21;
    pub const GPU_NOT_SUPPORTED: i32 = -22;
    pub const MAX_LIMIT: i32 = -24;
    pub const DUPLICATE_KEY: i32 = -26;
    pub const REQUIRES_ROOT: i32 = -29;
    pub const MODULE_NOT_LOADED: i32 = -33;
    pub const IN_USE: i32 = -34;
    pub const PROFILING_NOT_SUPPORTED: i32 = -36;
    pub const PROFILING_LIBRARY_ERROR: i32 = -37;
    pub const PROFILING_MULTI_PASS: i32 = -38;
    pub const PAUSED: i32 = -54;
    pub const NVML_NOT_LOADED: i32 = -56;

    /// The header's name of a status, e.g. "DCGM_ST_IN_USE".
    pub fn name(status: i32) -> &'static str {
        match status {
            OK => "DCGM_ST_OK",
            BADPARAM => "DCGM_ST_BADPARAM",
            GENERIC_ERROR => "DCGM_ST_GENERIC_ERROR",
            MEMORY => "DCGM_ST_MEMORY",
            NOT_CONFIGURED => "DCGM_ST_NOT_CONFIGURED",
            NOT_SUPPORTED => "DCGM_ST_NOT_SUPPORTED",
            INIT_ERROR => "DCGM_ST_INIT_ERROR",
            NVML_ERROR => "DCGM_ST_NVML_ERROR",
            UNINITIALIZED => "DCGM_ST_UNINITIALIZED",
            TIMEOUT => "DCGM_ST_TIMEOUT",
            VER_MISMATCH => "DCGM_ST_VER_MISMATCH",
            UNKNOWN_FIELD => "DCGM_ST_UNKNOWN_FIELD",
            NO_DATA => "DCGM_ST_NO_DATA",
            STALE_DATA => "DCGM_ST_STALE_DATA",
            NOT_WATCHED => "DCGM_ST_NOT_WATCHED",
            NO_PERMISSION => "DCGM_ST_NO_PERMISSION",
            GPU_IS_LOST => "DCGM_ST_GPU_IS_LOST",
            CONNECTION_NOT_VALID => "DCGM_ST_CONNECTION_NOT_VALID",
            GPU_NOT_SUPPORTED => "DCGM_ST_GPU_NOT_SUPPORTED",
            MAX_LIMIT => "DCGM_ST_MAX_LIMIT",
            DUPLICATE_KEY => "DCGM_ST_DUPLICATE_KEY",
            REQUIRES_ROOT => "DCGM_ST_REQUIRES_ROOT",
            MODULE_NOT_LOADED => "DCGM_ST_MODULE_NOT_LOADED",
            IN_USE => "DCGM_ST_IN_USE",
            PROFILING_NOT_SUPPORTED => "DCGM_ST_PROFILING_NOT_SUPPORTED",
            PROFILING_LIBRARY_ERROR => "DCGM_ST_PROFILING_LIBRARY_ERROR",
            PROFILING_MULTI_PASS => "DCGM_ST_PROFILING_MULTI_PASS",
            PAUSED => "DCGM_ST_PAUSED",
            NVML_NOT_LOADED => "DCGM_ST_NVML_NOT_LOADED",
            _ => "an unknown DCGM status",
        }
    }
}

/// `DCGM_MAX_NUM_DEVICES`: the GPU ids `dcgmGetAllSupportedDevices` can return.
pub const MAX_NUM_DEVICES: usize = 32;
/// `DCGM_MAX_STR_LENGTH`.
pub const MAX_STR_LENGTH: usize = 256;
/// `DCGM_MAX_BLOB_LENGTH`: the size of a field value's union.
pub const MAX_BLOB_LENGTH: usize = 4096;
/// `DCGM_GROUP_EMPTY` of `dcgmGroupType_t`.
pub const GROUP_EMPTY: c_int = 1;
/// `DCGM_OPERATION_MODE_AUTO`: the embedded engine updates watched fields by itself.
pub const OPERATION_MODE_AUTO: c_int = 1;
/// `DcgmLoggingSeverityUnspecified`.
pub const LOGGING_SEVERITY_UNSPECIFIED: c_int = -1;
/// `DCGM_FE_GPU` of `dcgm_field_entity_group_t`.
pub const FE_GPU: c_int = 1;
/// `DCGM_FV_FLAG_LIVE_DATA`: ask the driver now instead of the cache.
pub const FV_FLAG_LIVE_DATA: c_uint = 1;
/// `DCGM_FT_DOUBLE`, `DCGM_FT_STRING` (a field value's `fieldType`).
pub const FT_DOUBLE: c_ushort = b'd' as c_ushort;
pub const FT_STRING: c_ushort = b's' as c_ushort;
/// `DCGM_FP64_BLANK`: doubles at or above it are "no value" markers
/// (blank, not found, not supported, not permitted).
pub const FP64_BLANK: f64 = 140_737_488_355_328.0;

/// Field ids (dcgm_fields.h).
pub mod field {
    /// `DCGM_FI_DEV_UUID`: the GPU's UUID, as NVML gives it.
    pub const DEV_UUID: u16 = 54;
    /// `DCGM_FI_PROF_GR_ENGINE_ACTIVE`: ratio of time the graphics or compute engine was busy.
    pub const PROF_GR_ENGINE_ACTIVE: u16 = 1001;
    /// `DCGM_FI_PROF_SM_ACTIVE`: ratio of cycles an SM had at least one warp assigned.
    pub const PROF_SM_ACTIVE: u16 = 1002;
    /// `DCGM_FI_PROF_SM_OCCUPANCY`: resident warps as a ratio of the SMs' maximum.
    pub const PROF_SM_OCCUPANCY: u16 = 1003;
    /// `DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`: ratio of cycles any tensor pipe was active.
    pub const PROF_PIPE_TENSOR_ACTIVE: u16 = 1004;
    /// `DCGM_FI_PROF_DRAM_ACTIVE`: ratio of cycles the memory interface was busy.
    pub const PROF_DRAM_ACTIVE: u16 = 1005;
}

/// `dcgmConnectV2Params_v2`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ConnectV2Params {
    pub version: c_uint,
    pub persist_after_disconnect: c_uint,
    pub timeout_ms: c_uint,
    pub address_is_unix_socket: c_uint,
}

/// `dcgmConnectV2Params_version2`.
pub const CONNECT_V2_PARAMS_VERSION2: c_uint =
    make_version(std::mem::size_of::<ConnectV2Params>(), 2);

/// `DCGM_MODULE_ID_COUNT_V1`: the deny list's length in `dcgmStartEmbeddedV2Params_v2`.
pub const MODULE_ID_COUNT_V1: usize = 10;

/// `dcgmStartEmbeddedV2Params_v2` (DCGM 2.4 and newer).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct StartEmbeddedV2Params {
    pub version: c_uint,
    /// `dcgmOperationMode_t`.
    pub op_mode: c_int,
    /// Out: the handle of the embedded engine.
    pub dcgm_handle: Handle,
    /// NULL: DCGM does not log.
    pub log_file: *const c_char,
    /// `DcgmLoggingSeverity_t`.
    pub severity: c_int,
    pub deny_list_count: c_uint,
    pub service_account: *const c_char,
    pub deny_list: [c_uint; MODULE_ID_COUNT_V1],
}

/// `dcgmStartEmbeddedV2Params_version2`.
pub const START_EMBEDDED_V2_PARAMS_VERSION2: c_uint =
    make_version(std::mem::size_of::<StartEmbeddedV2Params>(), 2);

/// `dcgmVersionInfo_v2`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct VersionInfo {
    pub version: c_uint,
    /// "key:value" pairs separated by ';', e.g. "version:4.2.3;arch:x86_64;…".
    pub raw_build_info_string: [c_char; MAX_STR_LENGTH * 2],
}

/// `dcgmVersionInfo_version2`.
pub const VERSION_INFO_VERSION2: c_uint = make_version(std::mem::size_of::<VersionInfo>(), 2);

/// `dcgmGroupEntityPair_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupEntityPair {
    /// `dcgm_field_entity_group_t`.
    pub entity_group_id: c_int,
    /// `dcgm_field_eid_t`: the DCGM GPU id for `DCGM_FE_GPU`.
    pub entity_id: c_uint,
}

/// The value union of `dcgmFieldValue_v2`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union Value {
    pub i64: i64,
    pub dbl: f64,
    pub str: [c_char; MAX_STR_LENGTH],
    pub blob: [u8; MAX_BLOB_LENGTH],
}

/// `dcgmFieldValue_v2`: one field of one entity.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FieldValueV2 {
    pub version: c_uint,
    /// `dcgm_field_entity_group_t`.
    pub entity_group_id: c_int,
    pub entity_id: c_uint,
    pub field_id: c_ushort,
    /// `DCGM_FT_*`: which member of `value` holds it.
    pub field_type: c_ushort,
    /// `DCGM_ST_OK`, or why there is no value.
    pub status: c_int,
    pub unused: c_uint,
    /// When DCGM took the value, µs since the epoch.
    pub ts: i64,
    pub value: Value,
}

/// `dcgmFieldValue_version2`.
pub const FIELD_VALUE_VERSION2: c_uint = make_version(std::mem::size_of::<FieldValueV2>(), 2);

impl FieldValueV2 {
    /// A zeroed record with its version set, for DCGM to fill.
    pub fn empty() -> FieldValueV2 {
        FieldValueV2 {
            version: FIELD_VALUE_VERSION2,
            entity_group_id: 0,
            entity_id: 0,
            field_id: 0,
            field_type: 0,
            status: 0,
            unused: 0,
            ts: 0,
            value: Value {
                blob: [0; MAX_BLOB_LENGTH],
            },
        }
    }

    /// The value as a double, when DCGM gave one.
    pub fn double(&self) -> Option<f64> {
        if self.field_type != FT_DOUBLE {
            return None;
        }
        // SAFETY: a DCGM_FT_DOUBLE record holds `dbl`; every bit pattern is an f64.
        Some(unsafe { self.value.dbl })
    }

    /// The value as text, when DCGM gave a string (up to its NUL).
    pub fn string(&self) -> Option<String> {
        if self.field_type != FT_STRING {
            return None;
        }
        // SAFETY: a DCGM_FT_STRING record holds `str`; any bytes are valid u8s.
        let bytes = unsafe { self.value.blob };
        let text = &bytes[..MAX_STR_LENGTH];
        let end = text.iter().position(|b| *b == 0).unwrap_or(text.len());
        Some(String::from_utf8_lossy(&text[..end]).into_owned())
    }
}

impl std::fmt::Debug for FieldValueV2 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FieldValueV2")
            .field("entity_id", &self.entity_id)
            .field("field_id", &self.field_id)
            .field("field_type", &self.field_type)
            .field("status", &self.status)
            .field("ts", &self.ts)
            .finish()
    }
}

// The layouts on LP64 Linux, as the headers define them: a mismatch fails
// the build here instead of a call at run time.
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<ConnectV2Params>() == 16);
    assert!(size_of::<StartEmbeddedV2Params>() == 80);
    assert!(offset_of!(StartEmbeddedV2Params, dcgm_handle) == 8);
    assert!(offset_of!(StartEmbeddedV2Params, service_account) == 32);
    assert!(offset_of!(StartEmbeddedV2Params, deny_list) == 40);
    assert!(size_of::<VersionInfo>() == 516);
    assert!(size_of::<GroupEntityPair>() == 8);
    assert!(size_of::<Value>() == 4096 && align_of::<Value>() == 8);
    assert!(offset_of!(FieldValueV2, field_id) == 12);
    assert!(offset_of!(FieldValueV2, status) == 16);
    assert!(offset_of!(FieldValueV2, ts) == 24);
    assert!(offset_of!(FieldValueV2, value) == 32);
    assert!(size_of::<FieldValueV2>() == 4128);
};

/// `dcgmInit`
pub type Init = unsafe extern "C" fn() -> Return;
/// `dcgmShutdown`
pub type Shutdown = unsafe extern "C" fn() -> Return;
/// `errorString`: a static description of a status, or NULL.
pub type ErrorString = unsafe extern "C" fn(result: Return) -> *const c_char;
/// `dcgmVersionInfo`
pub type VersionInfoFn = unsafe extern "C" fn(info: *mut VersionInfo) -> Return;
/// `dcgmConnect_v2`
pub type ConnectV2 = unsafe extern "C" fn(
    ip_address: *const c_char,
    params: *mut ConnectV2Params,
    handle: *mut Handle,
) -> Return;
/// `dcgmDisconnect`
pub type Disconnect = unsafe extern "C" fn(handle: Handle) -> Return;
/// `dcgmStartEmbedded_v2`
pub type StartEmbeddedV2 = unsafe extern "C" fn(params: *mut StartEmbeddedV2Params) -> Return;
/// `dcgmStopEmbedded`
pub type StopEmbedded = unsafe extern "C" fn(handle: Handle) -> Return;
/// `dcgmGetAllSupportedDevices`: `gpu_ids` has room for `MAX_NUM_DEVICES`.
pub type GetAllSupportedDevices =
    unsafe extern "C" fn(handle: Handle, gpu_ids: *mut c_uint, count: *mut c_int) -> Return;
/// `dcgmGroupCreate`
pub type GroupCreate = unsafe extern "C" fn(
    handle: Handle,
    group_type: c_int,
    name: *const c_char,
    group: *mut GpuGroup,
) -> Return;
/// `dcgmGroupAddDevice`
pub type GroupAddDevice =
    unsafe extern "C" fn(handle: Handle, group: GpuGroup, gpu_id: c_uint) -> Return;
/// `dcgmGroupDestroy`
pub type GroupDestroy = unsafe extern "C" fn(handle: Handle, group: GpuGroup) -> Return;
/// `dcgmFieldGroupCreate`
pub type FieldGroupCreate = unsafe extern "C" fn(
    handle: Handle,
    count: c_int,
    field_ids: *const c_ushort,
    name: *const c_char,
    field_group: *mut FieldGroup,
) -> Return;
/// `dcgmFieldGroupDestroy`
pub type FieldGroupDestroy =
    unsafe extern "C" fn(handle: Handle, field_group: FieldGroup) -> Return;
/// `dcgmWatchFields`: `update_freq` in µs, `max_keep_age` in s.
pub type WatchFields = unsafe extern "C" fn(
    handle: Handle,
    group: GpuGroup,
    field_group: FieldGroup,
    update_freq: c_longlong,
    max_keep_age: c_double,
    max_keep_samples: c_int,
) -> Return;
/// `dcgmUnwatchFields`
pub type UnwatchFields =
    unsafe extern "C" fn(handle: Handle, group: GpuGroup, field_group: FieldGroup) -> Return;
/// `dcgmEntitiesGetLatestValues`: `values` has room for entities × fields records.
pub type EntitiesGetLatestValues = unsafe extern "C" fn(
    handle: Handle,
    entities: *mut GroupEntityPair,
    entity_count: c_uint,
    fields: *mut c_ushort,
    field_count: c_uint,
    flags: c_uint,
    values: *mut FieldValueV2,
) -> Return;
/// `dcgmProfPause`
pub type ProfPause = unsafe extern "C" fn(handle: Handle) -> Return;
/// `dcgmProfResume`
pub type ProfResume = unsafe extern "C" fn(handle: Handle) -> Return;

#[cfg(test)]
mod tests {
    use super::*;

    /// The struct versions DCGM expects, as the headers' macros compute them.
    #[test]
    fn struct_versions_are_the_headers() {
        assert_eq!(CONNECT_V2_PARAMS_VERSION2, 0x0200_0010);
        assert_eq!(START_EMBEDDED_V2_PARAMS_VERSION2, 0x0200_0050);
        assert_eq!(VERSION_INFO_VERSION2, 0x0200_0204);
        assert_eq!(FIELD_VALUE_VERSION2, 0x0200_1020);
    }

    #[test]
    fn values_read_by_their_type() {
        let mut v = FieldValueV2::empty();
        v.field_type = FT_DOUBLE;
        v.value.dbl = 0.875;
        assert_eq!(v.double(), Some(0.875));
        assert_eq!(v.string(), None);
        let mut s = FieldValueV2::empty();
        s.field_type = FT_STRING;
        let uuid = b"GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
        // SAFETY: writing bytes into the union's blob.
        unsafe { s.value.blob[..uuid.len()].copy_from_slice(uuid) };
        assert_eq!(
            s.string().as_deref(),
            Some("GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d")
        );
        assert_eq!(s.double(), None);
        assert_eq!(status::name(-37), "DCGM_ST_PROFILING_LIBRARY_ERROR");
        assert_eq!(status::name(-999), "an unknown DCGM status");
    }
}
