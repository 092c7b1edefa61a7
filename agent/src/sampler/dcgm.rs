//! SM activity, SM occupancy, tensor pipe, DRAM and graphics engine activity
//! through DCGM's profiling fields (`DCGM_FI_PROF_*`), for the GPUs that have
//! no GPM (Volta, Turing, Ampere: the A100s of the Acme study) or, with
//! `--profiling-source dcgm`, for every GPU. Part of the `gpu` source: it
//! fills five columns of the rows `gpu.rs` writes and adds no rows of its
//! own, as `rapl.rs` is part of the `node` source.
//!
//! libdcgm is loaded at run time, as NVML is, through hand-written bindings
//! ([`sys`]) checked against the library at load: DCGM 3.0 or newer, found
//! by `dcgmVersionInfo`. The agent connects to a running host engine
//! (nv-hostengine, over TCP or its Unix socket) or starts DCGM embedded in
//! its own process, watches the five fields of its GPUs at the sampling
//! interval, and reads their latest values at every tick. DCGM updates a
//! profiling field with the average over its update period, so a tick's
//! value covers the interval before it, as GPM's do.
//!
//! Only one profiler may hold a GPU's performance counters at a time (a
//! system-wide lock in the driver before Hopper): when another DCGM, Nsight
//! or a CUPTI tool has them, DCGM refuses the watch; the agent says so once,
//! leaves the columns null and tries again every minute. While a pause file
//! exists, the agent pauses DCGM's profiling (`dcgmProfPause`) so a job can
//! profile itself, and resumes it when the file is gone.

mod sys;

use std::ffi::{CString, OsString, c_int, c_uint};
use std::path::{Path, PathBuf};
use std::time::Duration;

use gputel_runtime::time::duration_us;

use libloading::Library;
use tracing::{debug, info, warn};

use super::SampleError;
use sys::status;

/// The libraries DCGM 4 and DCGM 3 install, tried in this order through the
/// dynamic loader's search path.
pub const DEFAULT_DCGM_LIBS: [&str; 2] = ["libdcgm.so.4", "libdcgm.so.3"];

/// Where nv-hostengine listens unless told otherwise.
pub const DEFAULT_DCGM_HOST: &str = "127.0.0.1:5555";

/// The fields watched, in the order of GpuSample's columns (and of GPM's
/// metrics in `gpu.rs`): SM active, SM occupancy, tensor pipe active, DRAM
/// active, graphics engine active.
pub const FIELDS: [u16; 5] = [
    sys::field::PROF_SM_ACTIVE,
    sys::field::PROF_SM_OCCUPANCY,
    sys::field::PROF_PIPE_TENSOR_ACTIVE,
    sys::field::PROF_DRAM_ACTIVE,
    sys::field::PROF_GR_ENGINE_ACTIVE,
];

/// One GPU's readings of [`FIELDS`], in percent.
pub type Activity = [Option<f32>; FIELDS.len()];

/// How long after a failure that may pass (no host engine yet, the profiler
/// held by another tool) the next attempt is made.
const RETRY_US: i64 = 60_000_000;
/// How long connecting to a host engine may take: half an interval, so a
/// retry against an engine that does not answer delays one tick at most,
/// within these bounds.
const CONNECT_TIMEOUT_MIN: Duration = Duration::from_millis(100);
const CONNECT_TIMEOUT_MAX: Duration = Duration::from_secs(5);
/// A latest value older than this many intervals is not this tick's: DCGM
/// stopped updating the field.
const STALE_INTERVALS: u32 = 3;
/// … and never less than this, for short intervals DCGM may not keep up with.
const MIN_STALE: Duration = Duration::from_secs(5);

/// Where DCGM runs: a host engine to connect to, or embedded in the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DcgmHost {
    /// nv-hostengine over TCP: `host:port`, or `host` for port 5555.
    Tcp(String),
    /// nv-hostengine's Unix socket (`nv-hostengine -d PATH`).
    Unix(PathBuf),
    /// DCGM started inside the agent (`dcgmStartEmbedded_v2`).
    Embedded,
}

impl DcgmHost {
    /// Parses `HOST:PORT`, `tcp://HOST:PORT`, `unix:///PATH` or `embedded`.
    pub fn parse(s: &str) -> Result<DcgmHost, String> {
        let s = s.trim();
        let invalid = || {
            format!(
                "{s:?} is not a DCGM host engine: use HOST:PORT (nv-hostengine's default is \
                 {DEFAULT_DCGM_HOST}), unix:///PATH for its Unix socket, or embedded"
            )
        };
        if s == "embedded" {
            return Ok(DcgmHost::Embedded);
        }
        if let Some(path) = s.strip_prefix("unix://") {
            if !path.starts_with('/') || path.len() < 2 {
                return Err(invalid());
            }
            return Ok(DcgmHost::Unix(PathBuf::from(path)));
        }
        let addr = s.strip_prefix("tcp://").unwrap_or(s);
        if addr.is_empty() || addr.contains(['/', ' ', '\t']) {
            return Err(invalid());
        }
        let port_ok = |port: &str| port.parse::<u16>().is_ok_and(|p| p > 0);
        let ok = if let Some(v6) = addr.strip_prefix('[') {
            // [::1] or [::1]:5555
            match v6.split_once(']') {
                Some((host, "")) => !host.is_empty(),
                Some((host, rest)) => {
                    !host.is_empty() && rest.strip_prefix(':').is_some_and(port_ok)
                }
                None => false,
            }
        } else {
            match addr.split_once(':') {
                None => true,
                Some((host, port)) => !host.is_empty() && port_ok(port),
            }
        };
        if ok {
            Ok(DcgmHost::Tcp(addr.to_owned()))
        } else {
            Err(invalid())
        }
    }
}

impl std::fmt::Display for DcgmHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DcgmHost::Tcp(addr) => f.write_str(addr),
            DcgmHost::Unix(path) => write!(f, "unix://{}", path.display()),
            DcgmHost::Embedded => f.write_str("embedded"),
        }
    }
}

impl<'de> serde::Deserialize<'de> for DcgmHost {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        DcgmHost::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// How to reach DCGM, from the configuration.
#[derive(Debug, Clone)]
pub struct DcgmOptions {
    /// libdcgm to load; [`DEFAULT_DCGM_LIBS`] when None.
    pub lib: Option<PathBuf>,
    pub host: DcgmHost,
    /// While this file exists, profiling is paused.
    pub pause_file: Option<PathBuf>,
    /// The sampling interval: DCGM updates the fields this often.
    pub interval: Duration,
}

/// Why DCGM cannot be used at all on this machine.
#[derive(Debug, thiserror::Error)]
pub enum DcgmUnavailable {
    #[error(
        "DCGM library {lib} could not be loaded ({reason}); install DCGM (NVIDIA's datacenter-gpu-manager packages) or name the library with --dcgm-lib"
    )]
    NoLibrary { lib: String, reason: String },
    #[error("{lib} has no function {symbol}: it is not DCGM 3.0 or newer")]
    Symbol { lib: String, symbol: &'static str },
    #[error("{lib} is DCGM {version}; profiling fields are read through DCGM 3.0 or newer")]
    TooOld { lib: String, version: String },
    #[error("{lib}: {source}")]
    Call {
        lib: String,
        #[source]
        source: DcgmError,
    },
}

/// A DCGM call that failed: which one, its status, and DCGM's words for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DcgmError {
    pub call: &'static str,
    pub status: i32,
    /// `errorString(status)`.
    pub words: String,
}

impl DcgmError {
    /// What usually causes this status, and what to do about it.
    fn hint(&self) -> Option<&'static str> {
        Some(match self.status {
            status::IN_USE | status::PROFILING_LIBRARY_ERROR => {
                "the GPUs' profiling counters are in use by another profiler (dcgm-exporter or \
                 another program with a DCGM of its own, Nsight Systems or Nsight Compute, a \
                 CUPTI tool); share one host engine with dcgm-exporter, and pause profiling for \
                 jobs that profile themselves"
            }
            status::MODULE_NOT_LOADED | status::REQUIRES_ROOT | status::NO_PERMISSION => {
                "DCGM's profiling module needs the host engine to run as root, or a driver that \
                 lets every user profile (NVreg_RestrictProfilingToAdminUsers=0)"
            }
            status::PROFILING_NOT_SUPPORTED | status::GPU_NOT_SUPPORTED => {
                "DCGM has no profiling fields for these GPUs"
            }
            status::PROFILING_MULTI_PASS => {
                "these GPUs cannot count the fields together and this DCGM does not multiplex them"
            }
            status::CONNECTION_NOT_VALID => {
                "the host engine cannot be reached: is nv-hostengine running (systemctl status \
                 nvidia-dcgm)? --dcgm-host embedded starts DCGM inside the agent instead"
            }
            status::VER_MISMATCH => {
                "this DCGM does not accept the structure versions of DCGM 3.0 to 4.x"
            }
            _ => return None,
        })
    }

    /// Whether trying again later may succeed: the host engine may start,
    /// the other profiler may finish.
    fn passes(&self) -> bool {
        matches!(
            self.status,
            status::IN_USE
                | status::PROFILING_LIBRARY_ERROR
                | status::CONNECTION_NOT_VALID
                | status::TIMEOUT
        )
    }
}

impl std::fmt::Display for DcgmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} failed with {} ({}): {}",
            self.call,
            status::name(self.status),
            self.status,
            self.words
        )?;
        if let Some(hint) = self.hint() {
            write!(f, "; {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for DcgmError {}

/// The library and the functions the agent calls in it.
struct Api {
    /// How the library was named, for messages.
    name: String,
    init: sys::Init,
    shutdown: sys::Shutdown,
    error_string: sys::ErrorString,
    version_info: sys::VersionInfoFn,
    connect_v2: sys::ConnectV2,
    disconnect: sys::Disconnect,
    start_embedded_v2: sys::StartEmbeddedV2,
    stop_embedded: sys::StopEmbedded,
    get_all_supported_devices: sys::GetAllSupportedDevices,
    group_create: sys::GroupCreate,
    group_add_device: sys::GroupAddDevice,
    group_destroy: sys::GroupDestroy,
    field_group_create: sys::FieldGroupCreate,
    field_group_destroy: sys::FieldGroupDestroy,
    watch_fields: sys::WatchFields,
    unwatch_fields: sys::UnwatchFields,
    entities_get_latest_values: sys::EntitiesGetLatestValues,
    prof_pause: sys::ProfPause,
    prof_resume: sys::ProfResume,
    /// Whether `dcgmInit` succeeded, so `dcgmShutdown` is owed.
    initialized: bool,
    /// Last, so the functions above stay mapped while anything may call them.
    _lib: Library,
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api").field("lib", &self.name).finish()
    }
}

impl Api {
    /// Loads `lib`, or the first of [`DEFAULT_DCGM_LIBS`] the loader finds,
    /// and binds every function; then `dcgmInit`.
    fn load(lib: Option<&Path>) -> Result<Api, DcgmUnavailable> {
        let candidates: Vec<OsString> = match lib {
            Some(path) => vec![path.as_os_str().to_owned()],
            None => DEFAULT_DCGM_LIBS.iter().map(OsString::from).collect(),
        };
        let mut reason = None;
        for candidate in &candidates {
            // SAFETY: loading runs the library's initializers; libdcgm's are
            // DCGM's own and take no arguments from us.
            match unsafe { Library::new(candidate) } {
                Ok(library) => {
                    let mut api = Api::bind(library, candidate.to_string_lossy().into_owned())?;
                    api.call("dcgmInit", {
                        // SAFETY: dcgmInit takes no arguments.
                        unsafe { (api.init)() }
                    })
                    .map_err(|source| DcgmUnavailable::Call {
                        lib: api.name.clone(),
                        source,
                    })?;
                    api.initialized = true;
                    return Ok(api);
                }
                Err(e) => {
                    reason.get_or_insert_with(|| e.to_string());
                }
            }
        }
        let lib = match lib {
            Some(path) => path.display().to_string(),
            None => DEFAULT_DCGM_LIBS.join(" or "),
        };
        Err(DcgmUnavailable::NoLibrary {
            lib,
            reason: reason.unwrap_or_default(),
        })
    }

    fn bind(library: Library, name: String) -> Result<Api, DcgmUnavailable> {
        /// One function of `library`, by its C name.
        fn get<T: Copy>(
            library: &Library,
            name: &str,
            symbol: &'static str,
        ) -> Result<T, DcgmUnavailable> {
            let mut c_name = symbol.as_bytes().to_vec();
            c_name.push(0);
            // SAFETY: every `T` used below is the symbol's C signature, as
            // dcgm_agent.h declares it (see sys.rs).
            unsafe { library.get::<T>(&c_name) }
                .map(|f| *f)
                .map_err(|_| DcgmUnavailable::Symbol {
                    lib: name.to_owned(),
                    symbol,
                })
        }
        let l = &library;
        let n = name.as_str();
        Ok(Api {
            init: get(l, n, "dcgmInit")?,
            shutdown: get(l, n, "dcgmShutdown")?,
            error_string: get(l, n, "errorString")?,
            version_info: get(l, n, "dcgmVersionInfo")?,
            connect_v2: get(l, n, "dcgmConnect_v2")?,
            disconnect: get(l, n, "dcgmDisconnect")?,
            start_embedded_v2: get(l, n, "dcgmStartEmbedded_v2")?,
            stop_embedded: get(l, n, "dcgmStopEmbedded")?,
            get_all_supported_devices: get(l, n, "dcgmGetAllSupportedDevices")?,
            group_create: get(l, n, "dcgmGroupCreate")?,
            group_add_device: get(l, n, "dcgmGroupAddDevice")?,
            group_destroy: get(l, n, "dcgmGroupDestroy")?,
            field_group_create: get(l, n, "dcgmFieldGroupCreate")?,
            field_group_destroy: get(l, n, "dcgmFieldGroupDestroy")?,
            watch_fields: get(l, n, "dcgmWatchFields")?,
            unwatch_fields: get(l, n, "dcgmUnwatchFields")?,
            entities_get_latest_values: get(l, n, "dcgmEntitiesGetLatestValues")?,
            prof_pause: get(l, n, "dcgmProfPause")?,
            prof_resume: get(l, n, "dcgmProfResume")?,
            initialized: false,
            name,
            _lib: library,
        })
    }

    /// `Ok` for `DCGM_ST_OK`, else the error naming `call`.
    fn call(&self, call: &'static str, ret: sys::Return) -> Result<(), DcgmError> {
        if ret == status::OK {
            return Ok(());
        }
        Err(DcgmError {
            call,
            status: ret,
            words: self.words(ret),
        })
    }

    /// DCGM's description of a status.
    fn words(&self, ret: sys::Return) -> String {
        // SAFETY: errorString returns NULL or a static NUL-terminated string.
        let text = unsafe { (self.error_string)(ret) };
        if text.is_null() {
            return "no description".to_owned();
        }
        // SAFETY: non-NULL: a static NUL-terminated string.
        unsafe { std::ffi::CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }

    /// The library's version ("4.2.3"), which must be 3.0 or newer.
    fn check_version(&self) -> Result<String, DcgmUnavailable> {
        let mut info = sys::VersionInfo {
            version: sys::VERSION_INFO_VERSION2,
            raw_build_info_string: [0; sys::MAX_STR_LENGTH * 2],
        };
        // SAFETY: `info` is a dcgmVersionInfo_v2 with its version set.
        let ret = unsafe { (self.version_info)(&mut info) };
        if ret == status::VER_MISMATCH {
            return Err(DcgmUnavailable::TooOld {
                lib: self.name.clone(),
                version: "older than 3.0 (it refuses dcgmVersionInfo_v2)".to_owned(),
            });
        }
        self.call("dcgmVersionInfo", ret)
            .map_err(|source| DcgmUnavailable::Call {
                lib: self.name.clone(),
                source,
            })?;
        let raw: Vec<u8> = info
            .raw_build_info_string
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        let raw = String::from_utf8_lossy(&raw);
        let version = build_info_version(&raw).unwrap_or("unknown").to_owned();
        match major_version(&version) {
            Some(major) if major >= 3 => Ok(version),
            _ => Err(DcgmUnavailable::TooOld {
                lib: self.name.clone(),
                version,
            }),
        }
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        if self.initialized {
            // SAFETY: dcgmInit succeeded; nothing uses DCGM after this.
            let ret = unsafe { (self.shutdown)() };
            if ret != status::OK {
                debug!(status = ret, "dcgmShutdown failed");
            }
        }
    }
}

/// The value of `version` in DCGM's build information
/// ("version:4.2.3;arch:x86_64;…").
fn build_info_version(raw: &str) -> Option<&str> {
    raw.split(';')
        .filter_map(|pair| pair.split_once(':'))
        .find(|(key, _)| key.trim() == "version")
        .map(|(_, value)| value.trim())
}

/// The major number of "4.2.3".
fn major_version(version: &str) -> Option<u32> {
    version.split('.').next()?.parse().ok()
}

/// A connection to DCGM with the fields watched.
#[derive(Debug)]
struct Session {
    handle: sys::Handle,
    embedded: bool,
    group: Option<sys::GpuGroup>,
    field_group: Option<sys::FieldGroup>,
    /// The GPUs read, as DCGM entities, and each one's NVML index.
    entities: Vec<sys::GroupEntityPair>,
    nvml_index: Vec<u32>,
    /// Room for one reading of every field of every entity.
    values: Vec<sys::FieldValueV2>,
}

/// Why a session could not be started.
#[derive(Debug)]
enum StartError {
    Connect {
        host: DcgmHost,
        source: DcgmError,
    },
    Call(DcgmError),
    /// DCGM lists none of the GPUs to read (their UUIDs).
    NoGpus,
}

impl StartError {
    fn passes(&self) -> bool {
        match self {
            StartError::Connect { source, .. } | StartError::Call(source) => source.passes(),
            StartError::NoGpus => false,
        }
    }
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Connect {
                host: DcgmHost::Embedded,
                source,
            } => write!(f, "cannot start DCGM embedded in the agent: {source}"),
            StartError::Connect { host, source } => {
                write!(
                    f,
                    "cannot connect to the DCGM host engine at {host}: {source}"
                )
            }
            StartError::Call(source) => source.fmt(f),
            StartError::NoGpus => f.write_str("DCGM lists none of these GPUs (by UUID)"),
        }
    }
}

impl From<DcgmError> for StartError {
    fn from(e: DcgmError) -> Self {
        StartError::Call(e)
    }
}

impl Session {
    /// Connects (or starts DCGM embedded), finds `wanted`'s GPUs by UUID,
    /// and watches [`FIELDS`] on them every `options.interval`; pauses
    /// profiling when `paused`. Returns the session and the wanted GPUs
    /// DCGM does not list.
    fn start(
        api: &Api,
        options: &DcgmOptions,
        wanted: &[(u32, String)],
        name: &str,
        paused: bool,
    ) -> Result<(Session, Vec<u32>), StartError> {
        let (handle, embedded) = connect(api, &options.host, options.interval)?;
        let mut session = Session {
            handle,
            embedded,
            group: None,
            field_group: None,
            entities: Vec::new(),
            nvml_index: Vec::new(),
            values: Vec::new(),
        };
        match session.set_up(api, options, wanted, name, paused) {
            Ok(missing) => Ok((session, missing)),
            Err(e) => {
                session.close(api);
                Err(e)
            }
        }
    }

    fn set_up(
        &mut self,
        api: &Api,
        options: &DcgmOptions,
        wanted: &[(u32, String)],
        name: &str,
        paused: bool,
    ) -> Result<Vec<u32>, StartError> {
        let mut ids = [0 as c_uint; sys::MAX_NUM_DEVICES];
        let mut count: c_int = 0;
        // SAFETY: `ids` has room for DCGM_MAX_NUM_DEVICES ids.
        let ret =
            unsafe { (api.get_all_supported_devices)(self.handle, ids.as_mut_ptr(), &mut count) };
        api.call("dcgmGetAllSupportedDevices", ret)?;
        let ids = &ids[..usize::try_from(count)
            .unwrap_or(0)
            .min(sys::MAX_NUM_DEVICES)];
        let uuids = self.uuids(api, ids)?;
        let mut missing = Vec::new();
        for (index, uuid) in wanted {
            match uuids.iter().find(|(_, u)| u == uuid) {
                Some((id, _)) => {
                    self.entities.push(sys::GroupEntityPair {
                        entity_group_id: sys::FE_GPU,
                        entity_id: *id,
                    });
                    self.nvml_index.push(*index);
                }
                None => missing.push(*index),
            }
        }
        if self.entities.is_empty() {
            return Err(StartError::NoGpus);
        }
        let c_name = CString::new(name).unwrap_or_default();
        let mut group = 0;
        // SAFETY: a NUL-terminated name and a place for the group id.
        let ret = unsafe {
            (api.group_create)(self.handle, sys::GROUP_EMPTY, c_name.as_ptr(), &mut group)
        };
        api.call("dcgmGroupCreate", ret)?;
        self.group = Some(group);
        for entity in &self.entities {
            // SAFETY: plain values.
            let ret = unsafe { (api.group_add_device)(self.handle, group, entity.entity_id) };
            api.call("dcgmGroupAddDevice", ret)?;
        }
        let mut field_group = 0;
        // SAFETY: FIELDS has FIELDS.len() ids; a NUL-terminated name.
        let ret = unsafe {
            (api.field_group_create)(
                self.handle,
                FIELDS.len() as c_int,
                FIELDS.as_ptr(),
                c_name.as_ptr(),
                &mut field_group,
            )
        };
        api.call("dcgmFieldGroupCreate", ret)?;
        self.field_group = Some(field_group);
        let update_us = duration_us(options.interval);
        let keep = stale_after(options.interval);
        // SAFETY: plain values naming the groups just made.
        let ret = unsafe {
            (api.watch_fields)(
                self.handle,
                group,
                field_group,
                update_us,
                keep.as_secs_f64(),
                0,
            )
        };
        api.call("dcgmWatchFields", ret)?;
        if paused {
            // SAFETY: a live handle.
            api.call("dcgmProfPause", unsafe { (api.prof_pause)(self.handle) })?;
        }
        self.values = vec![sys::FieldValueV2::empty(); self.entities.len() * FIELDS.len()];
        Ok(missing)
    }

    /// The UUID of every GPU id, asked of the driver now.
    fn uuids(&self, api: &Api, ids: &[c_uint]) -> Result<Vec<(c_uint, String)>, DcgmError> {
        let mut entities: Vec<sys::GroupEntityPair> = ids
            .iter()
            .map(|id| sys::GroupEntityPair {
                entity_group_id: sys::FE_GPU,
                entity_id: *id,
            })
            .collect();
        let mut fields = [sys::field::DEV_UUID];
        let mut values = vec![sys::FieldValueV2::empty(); entities.len()];
        // SAFETY: `values` has room for entities × 1 field records.
        let ret = unsafe {
            (api.entities_get_latest_values)(
                self.handle,
                entities.as_mut_ptr(),
                entities.len() as c_uint,
                fields.as_mut_ptr(),
                1,
                sys::FV_FLAG_LIVE_DATA,
                values.as_mut_ptr(),
            )
        };
        api.call("dcgmEntitiesGetLatestValues", ret)?;
        Ok(values
            .iter()
            .filter(|v| v.status == status::OK)
            .filter_map(|v| Some((v.entity_id, v.string()?)))
            .collect())
    }

    /// Fills `values` with the latest reading of every field of every GPU.
    fn latest(&mut self, api: &Api) -> Result<(), DcgmError> {
        let mut fields = FIELDS;
        for v in &mut self.values {
            *v = sys::FieldValueV2::empty();
        }
        // SAFETY: `values` has room for entities × FIELDS records.
        let ret = unsafe {
            (api.entities_get_latest_values)(
                self.handle,
                self.entities.as_mut_ptr(),
                self.entities.len() as c_uint,
                fields.as_mut_ptr(),
                FIELDS.len() as c_uint,
                0,
                self.values.as_mut_ptr(),
            )
        };
        api.call("dcgmEntitiesGetLatestValues", ret)
    }

    /// Undoes what was set up, best effort: the watch, the groups, the
    /// connection or the embedded engine.
    fn close(&mut self, api: &Api) {
        let h = self.handle;
        // SAFETY: the ids are this session's, on its live handle.
        unsafe {
            if let (Some(g), Some(fg)) = (self.group, self.field_group) {
                let _ = (api.unwatch_fields)(h, g, fg);
            }
            if let Some(fg) = self.field_group.take() {
                let _ = (api.field_group_destroy)(h, fg);
            }
            if let Some(g) = self.group.take() {
                let _ = (api.group_destroy)(h, g);
            }
            let ret = if self.embedded {
                (api.stop_embedded)(h)
            } else {
                (api.disconnect)(h)
            };
            if ret != status::OK {
                debug!(status = ret, "closing the DCGM connection failed");
            }
        }
    }
}

/// A handle to DCGM at `host`, and whether it is an embedded engine.
fn connect(
    api: &Api,
    host: &DcgmHost,
    interval: Duration,
) -> Result<(sys::Handle, bool), StartError> {
    let fail = |source| StartError::Connect {
        host: host.clone(),
        source,
    };
    let mut handle: sys::Handle = 0;
    let (address, unix) = match host {
        DcgmHost::Embedded => {
            let mut params = sys::StartEmbeddedV2Params {
                version: sys::START_EMBEDDED_V2_PARAMS_VERSION2,
                op_mode: sys::OPERATION_MODE_AUTO,
                dcgm_handle: 0,
                log_file: std::ptr::null(),
                severity: sys::LOGGING_SEVERITY_UNSPECIFIED,
                deny_list_count: 0,
                service_account: std::ptr::null(),
                deny_list: [0; sys::MODULE_ID_COUNT_V1],
            };
            // SAFETY: a dcgmStartEmbeddedV2Params_v2 with its version set.
            let ret = unsafe { (api.start_embedded_v2)(&mut params) };
            api.call("dcgmStartEmbedded_v2", ret).map_err(fail)?;
            return Ok((params.dcgm_handle, true));
        }
        DcgmHost::Tcp(addr) => (addr.clone(), 0),
        DcgmHost::Unix(path) => (path.display().to_string(), 1),
    };
    let address = CString::new(address).map_err(|_| {
        fail(DcgmError {
            call: "dcgmConnect_v2",
            status: status::BADPARAM,
            words: "the address holds a NUL byte".to_owned(),
        })
    })?;
    let mut params = sys::ConnectV2Params {
        version: sys::CONNECT_V2_PARAMS_VERSION2,
        persist_after_disconnect: 0,
        timeout_ms: (interval / 2)
            .clamp(CONNECT_TIMEOUT_MIN, CONNECT_TIMEOUT_MAX)
            .as_millis() as c_uint,
        address_is_unix_socket: unix,
    };
    // SAFETY: a NUL-terminated address, a dcgmConnectV2Params_v2 with its
    // version set, and a place for the handle.
    let ret = unsafe { (api.connect_v2)(address.as_ptr(), &mut params, &mut handle) };
    api.call("dcgmConnect_v2", ret).map_err(fail)?;
    Ok((handle, false))
}

/// How old a latest value may be and still be this tick's.
fn stale_after(interval: Duration) -> Duration {
    (interval * STALE_INTERVALS).max(MIN_STALE)
}

/// A profiling field's ratio (0–1) in percent; None for DCGM's "no value"
/// markers (`DCGM_FP64_BLANK` and above: blank, not found, not supported,
/// not permitted) and for anything that is not a share.
pub fn percent(ratio: f64) -> Option<f32> {
    if ratio >= sys::FP64_BLANK || !ratio.is_finite() || ratio < 0.0 {
        return None;
    }
    Some((ratio * 100.0) as f32)
}

/// Whether a value DCGM took at `value_ts_us` still describes the tick at
/// `tick_ts_us`.
fn fresh(value_ts_us: i64, tick_ts_us: i64, stale: Duration) -> bool {
    let stale_us = duration_us(stale);
    value_ts_us >= tick_ts_us.saturating_sub(stale_us)
}

/// What DCGM gave at one tick: the activity of every GPU it reads (values
/// may be null: paused, blank, stale).
#[derive(Debug, Default)]
pub struct Readings {
    gpus: Vec<(u32, Activity)>,
}

impl Readings {
    /// The activity of GPU `index` (NVML), when DCGM reads that GPU.
    pub fn get(&self, index: u32) -> Option<&Activity> {
        self.gpus.iter().find(|(i, _)| *i == index).map(|(_, a)| a)
    }
}

#[derive(Debug)]
enum State {
    Watching(Session),
    /// Not watching; the next attempt is at the first tick from `retry_at_us`.
    Waiting {
        retry_at_us: i64,
    },
    /// Given up, for a reason that does not pass; said once.
    Off,
}

/// Reads the profiling fields of some GPUs through DCGM.
#[derive(Debug)]
pub struct DcgmProfiler {
    options: DcgmOptions,
    /// The GPUs to read: NVML index and UUID.
    wanted: Vec<(u32, String)>,
    version: String,
    state: State,
    /// Sessions started, for names no other client has.
    started: u32,
    /// Whether the pause file exists: profiling is (to be) paused.
    paused: bool,
    /// The last failure said as a warning: the same one again is not.
    last_failure: Option<String>,
    /// Whether the last tick had values (None: none yet), to say when they
    /// go blank and when they come back.
    had_values: Option<bool>,
    /// Last, so the session is closed before DCGM is shut down.
    api: Api,
}

impl DcgmProfiler {
    /// Loads DCGM and starts watching the fields of `wanted` (NVML index,
    /// UUID). A library that is missing, too old or fails to start is an
    /// error; a host engine that is not there, or a profiler another tool
    /// holds, is said once and tried again every minute.
    pub fn open(
        options: &DcgmOptions,
        wanted: Vec<(u32, String)>,
        now_us: i64,
    ) -> Result<DcgmProfiler, DcgmUnavailable> {
        let api = Api::load(options.lib.as_deref())?;
        let version = api.check_version()?;
        let mut profiler = DcgmProfiler {
            paused: options.pause_file.as_deref().is_some_and(Path::exists),
            options: options.clone(),
            wanted,
            version,
            state: State::Waiting {
                retry_at_us: now_us,
            },
            started: 0,
            last_failure: None,
            had_values: None,
            api,
        };
        profiler.start(now_us);
        Ok(profiler)
    }

    fn gpus(&self) -> Vec<u32> {
        self.wanted.iter().map(|(index, _)| *index).collect()
    }

    fn start(&mut self, now_us: i64) {
        self.started += 1;
        let name = format!("gputel-{}-{}", std::process::id(), self.started);
        let started = Session::start(&self.api, &self.options, &self.wanted, &name, self.paused);
        match started {
            Ok((session, missing)) => {
                info!(
                    gpus = ?session.nvml_index,
                    dcgm = %self.version,
                    host = %self.options.host,
                    interval = ?self.options.interval,
                    "reading SM, tensor and DRAM activity through DCGM's profiling fields"
                );
                if !missing.is_empty() {
                    warn!(
                        gpus = ?missing,
                        "DCGM does not list these GPUs (by UUID): their SM, tensor and DRAM activity stay null"
                    );
                }
                if self.paused {
                    self.said_paused();
                }
                self.last_failure = None;
                self.had_values = None;
                self.state = State::Watching(session);
            }
            Err(e) => {
                let passes = e.passes();
                let text = e.to_string();
                if self.last_failure.as_deref() == Some(text.as_str()) {
                    debug!("DCGM still unavailable: {text}");
                } else {
                    let retry = if passes {
                        "; trying again every minute"
                    } else {
                        ""
                    };
                    warn!(
                        gpus = ?self.gpus(),
                        "SM activity, SM occupancy, tensor and DRAM activity of these GPUs are not read through DCGM: {text}{retry}"
                    );
                }
                self.last_failure = Some(text);
                self.state = if passes {
                    State::Waiting {
                        retry_at_us: now_us.saturating_add(RETRY_US),
                    }
                } else {
                    State::Off
                };
            }
        }
    }

    fn said_paused(&self) {
        let file = self
            .options
            .pause_file
            .as_deref()
            .map(Path::display)
            .map(|d| d.to_string())
            .unwrap_or_default();
        info!(
            file,
            "DCGM profiling paused while the pause file exists: the GPUs' counters are free for \
             Nsight or another profiler, and SM, tensor and DRAM activity are null meanwhile"
        );
    }

    /// Pauses or resumes profiling when the pause file appeared or went.
    fn follow_pause_file(&mut self, errors: &mut Vec<SampleError>) {
        let Some(file) = self.options.pause_file.as_deref() else {
            return;
        };
        let paused = file.exists();
        if paused == self.paused {
            return;
        }
        if let State::Watching(session) = &self.state {
            let (call, ret) = if paused {
                // SAFETY: a live handle.
                ("dcgmProfPause", unsafe {
                    (self.api.prof_pause)(session.handle)
                })
            } else {
                // SAFETY: a live handle.
                ("dcgmProfResume", unsafe {
                    (self.api.prof_resume)(session.handle)
                })
            };
            if let Err(e) = self.api.call(call, ret) {
                // Tried again at the next tick.
                errors.push(SampleError::Dcgm(e));
                return;
            }
        }
        self.paused = paused;
        if paused {
            self.said_paused();
        } else {
            info!(file = %file.display(), "DCGM profiling resumed: the pause file is gone");
        }
    }

    /// The latest values of the GPUs DCGM reads, for the tick at `ts_us`;
    /// failed calls go to `errors`.
    pub fn read(&mut self, ts_us: i64, errors: &mut Vec<SampleError>) -> Readings {
        self.follow_pause_file(errors);
        if let State::Waiting { retry_at_us } = self.state
            && ts_us >= retry_at_us
        {
            self.start(ts_us);
        }
        let State::Watching(session) = &mut self.state else {
            return Readings::default();
        };
        let mut readings = Readings {
            gpus: session
                .nvml_index
                .iter()
                .map(|i| (*i, [None; FIELDS.len()]))
                .collect(),
        };
        if self.paused {
            return readings;
        }
        if let Err(e) = session.latest(&self.api) {
            if e.status == status::CONNECTION_NOT_VALID {
                warn!(
                    host = %self.options.host,
                    "lost the connection to the DCGM host engine ({e}); reconnecting"
                );
                session.close(&self.api);
                self.state = State::Waiting { retry_at_us: ts_us };
                self.last_failure = None;
                return Readings::default();
            }
            errors.push(SampleError::Dcgm(e));
            return readings;
        }
        let stale = stale_after(self.options.interval);
        for value in &session.values {
            let Some(row) = session
                .entities
                .iter()
                .position(|e| e.entity_id == value.entity_id)
            else {
                continue;
            };
            let Some(slot) = FIELDS.iter().position(|f| *f == value.field_id) else {
                continue;
            };
            match value.status {
                status::OK => {
                    readings.gpus[row].1[slot] = value
                        .double()
                        .filter(|_| fresh(value.ts, ts_us, stale))
                        .and_then(percent);
                }
                // Nothing yet (the first update is one interval away), or
                // nothing for this GPU: null, and nothing to report.
                status::NO_DATA
                | status::NOT_SUPPORTED
                | status::GPU_NOT_SUPPORTED
                | status::PROFILING_NOT_SUPPORTED => {}
                other => errors.push(SampleError::Dcgm(DcgmError {
                    call: "dcgmEntitiesGetLatestValues",
                    status: other,
                    words: format!(
                        "{} (GPU {}, field {})",
                        self.api.words(other),
                        readings.gpus[row].0,
                        value.field_id
                    ),
                })),
            }
        }
        self.note_blanks(&readings);
        readings
    }

    /// Says when the values go blank while watching (someone paused
    /// profiling with `dcgmi profile --pause`, or took the counters), and
    /// when they come back.
    fn note_blanks(&mut self, readings: &Readings) {
        let any = readings
            .gpus
            .iter()
            .any(|(_, activity)| activity.iter().any(Option::is_some));
        match (self.had_values, any) {
            (Some(true), false) => info!(
                "DCGM's profiling values went blank: profiling was paused (dcgmi profile --pause) \
                 or another profiler took the counters; SM, tensor and DRAM activity are null \
                 until they return"
            ),
            (Some(false), true) => info!("DCGM's profiling values are back"),
            _ => {}
        }
        // Before the first value, blanks are DCGM's first update still to come.
        if any || self.had_values.is_some() {
            self.had_values = Some(any);
        }
    }
}

impl Drop for DcgmProfiler {
    fn drop(&mut self) {
        if let State::Watching(session) = &mut self.state {
            session.close(&self.api);
        }
        self.state = State::Off;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_engine_addresses_parse() {
        let ok = |s: &str| DcgmHost::parse(s).expect(s);
        assert_eq!(ok("127.0.0.1:5555"), DcgmHost::Tcp("127.0.0.1:5555".into()));
        assert_eq!(
            ok("tcp://gpu-017:5555"),
            DcgmHost::Tcp("gpu-017:5555".into())
        );
        assert_eq!(ok("localhost"), DcgmHost::Tcp("localhost".into()));
        assert_eq!(ok("[::1]:5555"), DcgmHost::Tcp("[::1]:5555".into()));
        assert_eq!(
            ok("unix:///run/nvidia-dcgm/hostengine.sock"),
            DcgmHost::Unix("/run/nvidia-dcgm/hostengine.sock".into())
        );
        assert_eq!(ok("embedded"), DcgmHost::Embedded);
        for bad in [
            "",
            "unix://",
            "unix://relative.sock",
            "host:",
            "host:99999",
            ":5555",
            "::1",
            "[::1",
            "a b:1",
        ] {
            let err = DcgmHost::parse(bad).expect_err(bad);
            assert!(
                err.ends_with("use HOST:PORT (nv-hostengine's default is 127.0.0.1:5555), unix:///PATH for its Unix socket, or embedded"),
                "{bad}: {err}"
            );
        }
        assert_eq!(ok("unix:///run/x.sock").to_string(), "unix:///run/x.sock");
        assert_eq!(ok("tcp://h:1").to_string(), "h:1");
    }

    #[test]
    fn ratios_become_percent_and_markers_null() {
        assert_eq!(percent(0.875), Some(87.5));
        assert_eq!(percent(0.0), Some(0.0));
        assert_eq!(percent(1.0), Some(100.0));
        assert_eq!(percent(0.3125), Some(31.25));
        // DCGM_FP64_BLANK, _NOT_FOUND, _NOT_SUPPORTED, _NOT_PERMISSIONED.
        for marker in [0.0, 1.0, 2.0, 3.0] {
            assert_eq!(percent(sys::FP64_BLANK + marker), None, "{marker}");
        }
        assert_eq!(percent(-0.5), None);
        assert_eq!(percent(f64::NAN), None);
        assert_eq!(percent(f64::INFINITY), None);
    }

    #[test]
    fn old_values_are_stale() {
        let tick = 1_795_240_812_000_000;
        let second = Duration::from_secs(1);
        // Three intervals of 1 s would be 3 s; the floor is 5 s.
        assert_eq!(stale_after(second), Duration::from_secs(5));
        assert_eq!(
            stale_after(Duration::from_secs(15)),
            Duration::from_secs(45)
        );
        assert!(fresh(tick - 900_000, tick, stale_after(second)));
        assert!(fresh(tick - 5_000_000, tick, stale_after(second)));
        assert!(!fresh(tick - 5_000_001, tick, stale_after(second)));
        assert!(fresh(tick + 10, tick, stale_after(second)));
    }

    #[test]
    fn the_version_is_read_from_the_build_information() {
        let raw = "version:4.2.3;arch:x86_64;buildtype:Release;commit:abc:def";
        assert_eq!(build_info_version(raw), Some("4.2.3"));
        assert_eq!(major_version("4.2.3"), Some(4));
        assert_eq!(major_version("3.3.9"), Some(3));
        assert_eq!(build_info_version("arch:x86_64"), None);
        assert_eq!(major_version("unknown"), None);
    }

    #[test]
    fn errors_name_the_call_the_status_and_the_way_out() {
        let busy = DcgmError {
            call: "dcgmWatchFields",
            status: status::PROFILING_LIBRARY_ERROR,
            words: "The third-party Profiling module returned an unrecoverable error".into(),
        };
        assert_eq!(
            busy.to_string(),
            "dcgmWatchFields failed with DCGM_ST_PROFILING_LIBRARY_ERROR (-37): The third-party \
             Profiling module returned an unrecoverable error; the GPUs' profiling counters are \
             in use by another profiler (dcgm-exporter or another program with a DCGM of its \
             own, Nsight Systems or Nsight Compute, a CUPTI tool); share one host engine with \
             dcgm-exporter, and pause profiling for jobs that profile themselves"
        );
        assert!(busy.passes());
        let refused = StartError::Connect {
            host: DcgmHost::Tcp("127.0.0.1:5555".into()),
            source: DcgmError {
                call: "dcgmConnect_v2",
                status: status::CONNECTION_NOT_VALID,
                words: "Host engine connection invalid/disconnected".into(),
            },
        };
        assert!(refused.passes());
        assert!(
            refused.to_string().starts_with(
                "cannot connect to the DCGM host engine at 127.0.0.1:5555: dcgmConnect_v2 failed \
                 with DCGM_ST_CONNECTION_NOT_VALID (-21): Host engine connection \
                 invalid/disconnected; the host engine cannot be reached"
            ),
            "{refused}"
        );
        let root = DcgmError {
            call: "dcgmWatchFields",
            status: status::MODULE_NOT_LOADED,
            words: "This request is serviced by a module of DCGM that is not currently loaded"
                .into(),
        };
        assert!(!root.passes());
        assert!(
            root.to_string()
                .contains("NVreg_RestrictProfilingToAdminUsers=0")
        );
        assert!(!StartError::NoGpus.passes());
        let no_hint = DcgmError {
            call: "dcgmGroupCreate",
            status: status::MAX_LIMIT,
            words: "Max limit reached for the object".into(),
        };
        assert_eq!(
            no_hint.to_string(),
            "dcgmGroupCreate failed with DCGM_ST_MAX_LIMIT (-24): Max limit reached for the object"
        );
    }

    #[test]
    fn a_missing_library_names_what_was_tried() {
        let err = Api::load(Some(Path::new("/nonexistent/libdcgm.so.4"))).expect_err("absent");
        let text = err.to_string();
        assert!(
            text.starts_with("DCGM library /nonexistent/libdcgm.so.4 could not be loaded (")
                && text.ends_with("or name the library with --dcgm-lib"),
            "{text}"
        );
    }
}
