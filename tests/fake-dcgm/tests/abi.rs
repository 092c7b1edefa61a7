//! Loads the built `libgputel_fake_dcgm.so` as the agent does (libloading,
//! by C name) and checks what every export returns for a scenario: the
//! versions it accepts, the host engine it answers at, groups, watches,
//! values as ratios (in no promised order), pausing, and a busy profiler.
//!
//! The scenario is chosen by an environment variable read at the first
//! `dcgmInit`, so all checks run sequentially from the one test in this file.

use std::ffi::{CStr, c_char, c_double, c_int, c_longlong, c_uint, c_ushort};

use gputel_fake_dcgm::{
    CONNECT_V2_PARAMS_VERSION2, ConnectV2Params, FE_GPU, FIELD_VALUE_VERSION2, FP64_BLANK,
    FT_DOUBLE, FT_STRING, FieldValueV2, GroupEntityPair, MAX_NUM_DEVICES, StartEmbeddedHead,
    VERSION_INFO_VERSION2, VersionInfo, status,
};
use gputel_fake_scenario::SCENARIO_ENV;
use libloading::Library;

type Init = unsafe extern "C" fn() -> c_int;
type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type VersionInfoFn = unsafe extern "C" fn(*mut VersionInfo) -> c_int;
type Connect = unsafe extern "C" fn(*const c_char, *mut ConnectV2Params, *mut usize) -> c_int;
type OnHandle = unsafe extern "C" fn(usize) -> c_int;
type StartEmbedded = unsafe extern "C" fn(*mut StartEmbeddedHead) -> c_int;
type Devices = unsafe extern "C" fn(usize, *mut c_uint, *mut c_int) -> c_int;
type GroupCreate = unsafe extern "C" fn(usize, c_int, *const c_char, *mut usize) -> c_int;
type GroupAdd = unsafe extern "C" fn(usize, usize, c_uint) -> c_int;
type FieldGroupCreate =
    unsafe extern "C" fn(usize, c_int, *const c_ushort, *const c_char, *mut usize) -> c_int;
type Watch = unsafe extern "C" fn(usize, usize, usize, c_longlong, c_double, c_int) -> c_int;
type Latest = unsafe extern "C" fn(
    usize,
    *mut GroupEntityPair,
    c_uint,
    *mut c_ushort,
    c_uint,
    c_uint,
    *mut FieldValueV2,
) -> c_int;

const SCENARIO: &str = r#"
[dcgm]
version = "3.3.9"
host_engine = "unix:///run/fake-dcgm.sock"

[[gpu]]
uuid = "GPU-00000000-0000-4000-8000-0000000000aa"
gpm = false
sm_active_pct = 62.5
sm_occupancy_pct = 31.25
tensor_active_pct = 50
dram_active_pct = 37.5
graphics_active_pct = 75

[[gpu]]
uuid = "GPU-00000000-0000-4000-8000-0000000000bb"
sm_active_pct = 12.5
"#;

/// The profiling fields in the agent's order: SM active, occupancy, tensor, DRAM, graphics.
const FIELDS: [c_ushort; 5] = [1002, 1003, 1004, 1005, 1001];

struct Fake {
    lib: Library,
}

impl Fake {
    fn f<T: Copy>(&self, name: &str) -> T {
        let mut c_name = name.as_bytes().to_vec();
        c_name.push(0);
        // SAFETY: each T below is the C signature of the named function.
        unsafe {
            *self
                .lib
                .get::<T>(&c_name)
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        }
    }

    fn call0(&self, name: &str) -> c_int {
        // SAFETY: no arguments.
        unsafe { self.f::<Init>(name)() }
    }

    fn on_handle(&self, name: &str, handle: usize) -> c_int {
        // SAFETY: a plain value.
        unsafe { self.f::<OnHandle>(name)(handle) }
    }

    fn connect(&self, address: &CStr, unix: bool) -> Result<usize, c_int> {
        let mut params = ConnectV2Params {
            version: CONNECT_V2_PARAMS_VERSION2,
            persist_after_disconnect: 0,
            timeout_ms: 1000,
            address_is_unix_socket: unix.into(),
        };
        let mut handle = 0;
        // SAFETY: a NUL-terminated address and a v2 record.
        let ret = unsafe {
            self.f::<Connect>("dcgmConnect_v2")(address.as_ptr(), &mut params, &mut handle)
        };
        if ret == status::OK {
            Ok(handle)
        } else {
            Err(ret)
        }
    }

    fn latest(
        &self,
        handle: usize,
        gpus: &[c_uint],
        fields: &[c_ushort],
        live: bool,
    ) -> Vec<FieldValueV2> {
        let mut entities: Vec<GroupEntityPair> = gpus
            .iter()
            .map(|id| GroupEntityPair {
                entity_group_id: FE_GPU,
                entity_id: *id,
            })
            .collect();
        let mut fields = fields.to_vec();
        let mut values = vec![
            FieldValueV2 {
                version: 0,
                entity_group_id: 0,
                entity_id: 0,
                field_id: 0,
                field_type: 0,
                status: 99,
                unused: 0,
                ts: 0,
                value: [0; 512],
            };
            entities.len() * fields.len()
        ];
        // SAFETY: room for entities × fields records.
        let ret = unsafe {
            self.f::<Latest>("dcgmEntitiesGetLatestValues")(
                handle,
                entities.as_mut_ptr(),
                entities.len() as c_uint,
                fields.as_mut_ptr(),
                fields.len() as c_uint,
                u32::from(live),
                values.as_mut_ptr(),
            )
        };
        assert_eq!(ret, status::OK);
        values
    }
}

fn double(v: &FieldValueV2) -> f64 {
    assert_eq!(v.field_type, FT_DOUBLE, "{v:?}");
    f64::from_bits(v.value[0])
}

fn string(v: &FieldValueV2) -> String {
    assert_eq!(v.field_type, FT_STRING, "{v:?}");
    let bytes: Vec<u8> = v.value[..32].iter().flat_map(|w| w.to_ne_bytes()).collect();
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

#[test]
fn every_export_answers_as_dcgm_does() {
    let path = gputel_fake_dcgm::cdylib_path().unwrap_or_else(|| {
        panic!("libgputel_fake_dcgm.so is not next to this test; `cargo test -p gputel-fake-dcgm` builds it")
    });
    // SAFETY: the fake's initializers are Rust statics.
    let fake = Fake {
        lib: unsafe { Library::new(&path) }.expect("load the fake"),
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let scenario = dir.path().join("scenario.toml");
    std::fs::write(&scenario, SCENARIO).expect("write scenario");
    // SAFETY: the test sets the variable before any call reads it, on one thread.
    unsafe { std::env::set_var(SCENARIO_ENV, &scenario) };

    // Before init: uninitialized.
    assert_eq!(
        fake.connect(c"/run/fake-dcgm.sock", true),
        Err(status::UNINITIALIZED)
    );
    assert_eq!(fake.call0("dcgmInit"), status::OK);

    // The version, for the right struct version only.
    let version_info = fake.f::<VersionInfoFn>("dcgmVersionInfo");
    let mut info = VersionInfo {
        version: VERSION_INFO_VERSION2,
        raw_build_info_string: [0; 512],
    };
    // SAFETY: a dcgmVersionInfo_v2.
    assert_eq!(unsafe { version_info(&mut info) }, status::OK);
    // SAFETY: NUL-terminated by the fake.
    let raw = unsafe { CStr::from_ptr(info.raw_build_info_string.as_ptr()) };
    assert!(
        raw.to_string_lossy().starts_with("version:3.3.9;"),
        "{raw:?}"
    );
    info.version = VERSION_INFO_VERSION2 - 1;
    // SAFETY: as above.
    assert_eq!(unsafe { version_info(&mut info) }, status::VER_MISMATCH);

    // The host engine answers on its socket only.
    assert_eq!(
        fake.connect(c"127.0.0.1:5555", false),
        Err(status::CONNECTION_NOT_VALID)
    );
    assert_eq!(
        fake.connect(c"/run/fake-dcgm.sock", false),
        Err(status::CONNECTION_NOT_VALID)
    );
    let handle = fake.connect(c"/run/fake-dcgm.sock", true).expect("connect");
    let error_string = fake.f::<ErrorString>("errorString");
    // SAFETY: a static string.
    let words = unsafe { CStr::from_ptr(error_string(status::CONNECTION_NOT_VALID)) };
    assert_eq!(
        words.to_str(),
        Ok("Host engine connection invalid or disconnected")
    );

    // Both GPUs, with the scenario's UUIDs.
    let mut ids = [0; MAX_NUM_DEVICES];
    let mut count = 0;
    // SAFETY: room for 32 ids.
    let ret = unsafe {
        fake.f::<Devices>("dcgmGetAllSupportedDevices")(handle, ids.as_mut_ptr(), &mut count)
    };
    assert_eq!((ret, count, &ids[..2]), (status::OK, 2, &[0, 1][..]));
    let uuids = fake.latest(handle, &[0, 1], &[54], true);
    // Records come in the reverse order of the entities asked.
    assert_eq!(uuids[0].entity_id, 1);
    assert_eq!(
        string(&uuids[0]),
        "GPU-00000000-0000-4000-8000-0000000000bb"
    );
    assert_eq!(
        string(&uuids[1]),
        "GPU-00000000-0000-4000-8000-0000000000aa"
    );
    assert_eq!(uuids[1].version, FIELD_VALUE_VERSION2);

    // A group of GPU 0, the five fields, watched.
    let mut group = 0;
    // SAFETY: a name and a place for the id.
    let ret =
        unsafe { fake.f::<GroupCreate>("dcgmGroupCreate")(handle, 1, c"g".as_ptr(), &mut group) };
    assert_eq!(ret, status::OK);
    let mut again = 0;
    // SAFETY: as above; the name is taken.
    let ret =
        unsafe { fake.f::<GroupCreate>("dcgmGroupCreate")(handle, 1, c"g".as_ptr(), &mut again) };
    assert_eq!(ret, status::BADPARAM);
    // SAFETY: plain values.
    assert_eq!(
        unsafe { fake.f::<GroupAdd>("dcgmGroupAddDevice")(handle, group, 0) },
        status::OK
    );
    // SAFETY: plain values; GPU 7 does not exist.
    assert_eq!(
        unsafe { fake.f::<GroupAdd>("dcgmGroupAddDevice")(handle, group, 7) },
        status::BADPARAM
    );
    let mut field_group = 0;
    // SAFETY: five ids, a name and a place for the id.
    let ret = unsafe {
        fake.f::<FieldGroupCreate>("dcgmFieldGroupCreate")(
            handle,
            5,
            FIELDS.as_ptr(),
            c"f".as_ptr(),
            &mut field_group,
        )
    };
    assert_eq!(ret, status::OK);
    let before = fake.latest(handle, &[0], &FIELDS, false);
    assert!(
        before.iter().all(|v| v.status == status::NOT_WATCHED),
        "{before:?}"
    );
    let watch = fake.f::<Watch>("dcgmWatchFields");
    // SAFETY: plain values.
    assert_eq!(
        unsafe { watch(handle, group, field_group, 0, 5.0, 0) },
        status::BADPARAM
    );
    // SAFETY: plain values.
    assert_eq!(
        unsafe { watch(handle, group, field_group, 1_000_000, 5.0, 0) },
        status::OK
    );

    // Ratios of the scenario's percentages, for the watched GPU only.
    let values = fake.latest(handle, &[0, 1], &FIELDS, false);
    let gpu0: Vec<f64> = values[5..].iter().map(double).collect();
    assert_eq!(gpu0, [0.625, 0.3125, 0.5, 0.375, 0.75]);
    assert!(
        values[5..]
            .iter()
            .all(|v| v.status == status::OK && v.entity_id == 0 && v.ts > 0)
    );
    assert!(
        values[..5]
            .iter()
            .all(|v| v.status == status::NOT_WATCHED && v.entity_id == 1)
    );

    // Paused: blanks with status OK, as DCGM stores them.
    assert_eq!(fake.on_handle("dcgmProfPause", handle), status::OK);
    let paused = fake.latest(handle, &[0], &FIELDS, false);
    assert!(
        paused
            .iter()
            .all(|v| v.status == status::OK && double(v) == FP64_BLANK),
        "{paused:?}"
    );
    assert_eq!(fake.on_handle("dcgmProfResume", handle), status::OK);
    assert_eq!(double(&fake.latest(handle, &[0], &FIELDS, false)[0]), 0.625);

    // Embedded, with any of the three parameter versions.
    let start = fake.f::<StartEmbedded>("dcgmStartEmbedded_v2");
    let mut params = [0u64; 13];
    let head = params.as_mut_ptr().cast::<StartEmbeddedHead>();
    // SAFETY: 104 zeroed bytes, enough for every version.
    unsafe { (*head).version = 80 | (2 << 24) };
    // SAFETY: as above.
    assert_eq!(unsafe { start(head) }, status::OK);
    // SAFETY: as above.
    let embedded = unsafe { (*head).dcgm_handle };
    assert_ne!(embedded, 0);
    assert_eq!(fake.on_handle("dcgmStopEmbedded", embedded), status::OK);
    assert_eq!(
        fake.on_handle("dcgmStopEmbedded", embedded),
        status::BADPARAM
    );
    // SAFETY: as above.
    unsafe { (*head).version = 81 | (2 << 24) };
    // SAFETY: as above.
    assert_eq!(unsafe { start(head) }, status::VER_MISMATCH);

    assert_eq!(fake.on_handle("dcgmDisconnect", handle), status::OK);
    assert_eq!(fake.call0("dcgmShutdown"), status::OK);
    assert_eq!(fake.call0("dcgmShutdown"), status::UNINITIALIZED);

    // Another profiler holds the counters: the watch fails as DCGM's does.
    let busy = dir.path().join("busy.toml");
    std::fs::write(&busy, "[dcgm]\nprofiler = \"busy\"\n\n[[gpu]]\n").expect("write");
    // SAFETY: as above.
    unsafe { std::env::set_var(SCENARIO_ENV, &busy) };
    assert_eq!(fake.call0("dcgmInit"), status::OK);
    let handle = fake
        .connect(c"127.0.0.1", false)
        .expect("the default host engine, default port");
    let (mut group, mut field_group) = (0, 0);
    // SAFETY: as above.
    unsafe {
        assert_eq!(
            fake.f::<GroupCreate>("dcgmGroupCreate")(handle, 0, c"all".as_ptr(), &mut group),
            status::OK
        );
        assert_eq!(
            fake.f::<FieldGroupCreate>("dcgmFieldGroupCreate")(
                handle,
                5,
                FIELDS.as_ptr(),
                c"f".as_ptr(),
                &mut field_group
            ),
            status::OK
        );
        assert_eq!(
            watch(handle, group, field_group, 1_000_000, 5.0, 0),
            status::PROFILING_LIBRARY_ERROR
        );
        // Fields that are not profiling fields are watched as usual.
        let uuid_only = [54];
        let mut other = 0;
        assert_eq!(
            fake.f::<FieldGroupCreate>("dcgmFieldGroupCreate")(
                handle,
                1,
                uuid_only.as_ptr(),
                c"u".as_ptr(),
                &mut other
            ),
            status::OK
        );
        assert_eq!(watch(handle, group, other, 1_000_000, 5.0, 0), status::OK);
    }
    assert_eq!(fake.call0("dcgmShutdown"), status::OK);
}
