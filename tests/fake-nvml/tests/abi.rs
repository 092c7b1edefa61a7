//! Loads the built `libgputel_fake_nvml.so` the way the agent does, through
//! `nvml-wrapper` (and, for error paths the wrapper never takes, through the
//! raw `nvml-wrapper-sys` bindings), and checks what every export returns.
//!
//! The scenario is chosen by an environment variable read at init, so all
//! checks run sequentially from the one test in this file.

use std::ffi::{CStr, OsStr, c_char, c_uint};
use std::path::Path;
use std::ptr;
use std::time::Instant;

use gputel_fake_nvml::{MEMORY_V2_VERSION, SCENARIO_ENV};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::{FieldValueSample, MemoryInfo, PciInfo, Utilization};
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper_sys::bindings::{
    NvmlLib, nvmlDevice_t, nvmlFieldValue_t, nvmlMemory_v2_t,
    nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH as ARGUMENT_VERSION_MISMATCH,
    nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE as INSUFFICIENT_SIZE,
    nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT as INVALID_ARGUMENT,
    nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED as NOT_SUPPORTED,
    nvmlReturn_enum_NVML_ERROR_UNINITIALIZED as UNINITIALIZED,
    nvmlReturn_enum_NVML_SUCCESS as SUCCESS,
};

const MEMORY_TEMP: u32 = nvml_wrapper_sys::bindings::field_id::NVML_FI_DEV_MEMORY_TEMP;
const GIB: u64 = 1 << 30;

/// GPU 0 has a constant for every metric (energy integrates a constant
/// power); GPUs 1 and 2 share traces one step apart, with a step of an hour
/// so the test always sees step 0.
const CONSTANT_SCENARIO: &str = r#"
driver_version = "535.129.03"
nvml_version = "12.535.129.03"
step_ms = 3600000

[[gpu]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-11111111-2222-4333-8444-555555555555"
pci_bus_id = "00000000:C1:00.0"
minor_number = 3
fb_total_bytes = 85520809984
fb_reserved_bytes = 566231040
fb_used_bytes = 42949672960
temperature_c = 62
memory_temperature_c = 70
power_mw = 512000
energy_initial_mj = 1000000
graphics_clock_mhz = 1755
sm_clock_mhz = 1980
memory_clock_mhz = 2619
video_clock_mhz = 1635
gpu_util_pct = 97
memory_copy_util_pct = 41

[[gpu]]
count = 2
phase_steps = 1
name = "NVIDIA A100-SXM4-80GB"
temperature_c = [50, 60]
memory_temperature_c = "unsupported"
power_mw = [61000, 250000]
energy_mj = 123456
"#;

fn set_scenario(path: Option<&Path>) {
    // SAFETY: this file holds a single test, so no other thread reads or
    // writes the environment while it runs.
    unsafe {
        match path {
            Some(p) => std::env::set_var(SCENARIO_ENV, p),
            None => std::env::remove_var(SCENARIO_ENV),
        }
    }
}

/// The samples of `field_values_for`, each of which must convert.
fn samples(
    fields: Result<Vec<Result<FieldValueSample, NvmlError>>, NvmlError>,
) -> Vec<FieldValueSample> {
    fields
        .expect("nvmlDeviceGetFieldValues succeeds")
        .into_iter()
        .map(|f| f.expect("each field value converts"))
        .collect()
}

fn init(lib: &Path) -> Result<Nvml, NvmlError> {
    Nvml::builder().lib_path(lib.as_os_str()).init()
}

#[test]
fn fake_nvml_through_nvml_wrapper() {
    let lib = gputel_fake_nvml::cdylib_path().unwrap_or_else(|| {
        panic!("libgputel_fake_nvml.so is not next to this test; `cargo test -p gputel-fake-nvml` builds it")
    });
    let dir = tempfile::tempdir().expect("temp dir");

    let scenario = dir.path().join("constant.toml");
    std::fs::write(&scenario, CONSTANT_SCENARIO).expect("write scenario");
    set_scenario(Some(&scenario));
    constant_scenario_reads_exactly(&lib);
    error_paths_over_the_raw_abi(&lib);

    bad_scenarios_fail_init(&lib, dir.path());

    set_scenario(None);
    default_scenario_is_eight_moving_h100s(&lib);
}

fn constant_scenario_reads_exactly(lib: &Path) {
    let before_init = Instant::now();
    let nvml = init(lib).expect("init with the constant scenario");
    assert_eq!(nvml.device_count().expect("count"), 3);
    assert_eq!(nvml.sys_driver_version().expect("driver"), "535.129.03");
    assert_eq!(nvml.sys_nvml_version().expect("nvml"), "12.535.129.03");

    let gpu = nvml.device_by_index(0).expect("GPU 0");
    assert_eq!(gpu.index().expect("index"), 0);
    assert_eq!(
        gpu.uuid().expect("uuid"),
        "GPU-11111111-2222-4333-8444-555555555555"
    );
    assert_eq!(gpu.name().expect("name"), "NVIDIA H100 80GB HBM3");
    assert_eq!(gpu.minor_number().expect("minor"), 3);
    assert_eq!(gpu.temperature(TemperatureSensor::Gpu).expect("temp"), 62);
    assert_eq!(gpu.power_usage().expect("power"), 512_000);
    assert_eq!(gpu.clock_info(Clock::Graphics).expect("clock"), 1755);
    assert_eq!(gpu.clock_info(Clock::SM).expect("clock"), 1980);
    assert_eq!(gpu.clock_info(Clock::Memory).expect("clock"), 2619);
    assert_eq!(gpu.clock_info(Clock::Video).expect("clock"), 1635);
    assert_eq!(
        gpu.utilization_rates().expect("util"),
        Utilization {
            gpu: 97,
            memory: 41
        }
    );
    let MemoryInfo {
        free,
        reserved,
        total,
        used,
        ..
    } = gpu.memory_info().expect("memory");
    assert_eq!(
        (total, reserved, used, free),
        (
            85_520_809_984,
            566_231_040,
            40 * GIB,
            85_520_809_984 - 566_231_040 - 40 * GIB
        )
    );
    assert_eq!(
        gpu.pci_info().expect("pci"),
        PciInfo {
            bus: 0xc1,
            bus_id: "00000000:C1:00.0".to_owned(),
            device: 0,
            domain: 0,
            pci_device_id: 0x2330_10DE,
            pci_sub_system_id: Some(0x16C1_10DE),
        }
    );

    let fields = samples(gpu.field_values_for(&[FieldId(MEMORY_TEMP), FieldId(9999)]));
    assert_eq!(fields.len(), 2);
    assert_eq!(fields[0].field, FieldId(MEMORY_TEMP));
    assert!(fields[0].timestamp > 0, "field values carry a timestamp");
    assert!(matches!(fields[0].value, Ok(SampleValue::U32(70))));
    assert!(matches!(fields[1].value, Err(NvmlError::NotSupported)));

    // Energy integrates 512 W from 1000 J at init: bounded by the time this
    // test has seen pass, and never decreasing.
    let first = gpu.total_energy_consumption().expect("energy");
    let second = gpu.total_energy_consumption().expect("energy");
    let seen_ms = u64::try_from(before_init.elapsed().as_millis()).expect("ms fit u64");
    assert!(first >= 1_000_000, "{first}");
    assert!(second >= first, "{second} < {first}");
    assert!(
        second <= 1_000_000 + 512 * seen_ms,
        "{second} after {seen_ms} ms"
    );

    let a100 = nvml.device_by_index(1).expect("GPU 1");
    let twin = nvml.device_by_index(2).expect("GPU 2");
    assert_eq!(
        a100.uuid().expect("uuid"),
        "GPU-00000001-fake-4000-8000-000000000001"
    );
    assert_eq!(
        twin.uuid().expect("uuid"),
        "GPU-00000002-fake-4000-8000-000000000002"
    );
    // Derived identity: HGX bus numbers by index, minor number = index.
    assert_eq!(a100.pci_info().expect("pci").bus_id, "00000000:2A:00.0");
    assert_eq!(twin.pci_info().expect("pci").bus_id, "00000000:3A:00.0");
    assert_eq!(twin.minor_number().expect("minor"), 2);
    assert_eq!(a100.temperature(TemperatureSensor::Gpu).expect("temp"), 50);
    assert_eq!(twin.temperature(TemperatureSensor::Gpu).expect("temp"), 60);
    assert_eq!(a100.power_usage().expect("power"), 61_000);
    assert_eq!(twin.power_usage().expect("power"), 250_000);
    assert_eq!(a100.total_energy_consumption().expect("energy"), 123_456);
    let fields = samples(a100.field_values_for(&[FieldId(MEMORY_TEMP)]));
    assert!(matches!(fields[0].value, Err(NvmlError::NotSupported)));
    assert!(matches!(
        nvml.device_by_index(3),
        Err(NvmlError::InvalidArg)
    ));

    // Init is counted: a second instance shares the state and dropping it
    // (one nvmlShutdown) leaves the first working.
    let again = init(lib).expect("second init");
    assert_eq!(again.device_count().expect("count"), 3);
    drop(again);
    assert_eq!(gpu.temperature(TemperatureSensor::Gpu).expect("temp"), 62);
    nvml.shutdown().expect("last shutdown");
}

fn error_paths_over_the_raw_abi(lib: &Path) {
    // SAFETY: the fake library has no initializers that could misbehave.
    let raw = unsafe { NvmlLib::new(OsStr::new(lib)) }.expect("dlopen the fake library");
    // SAFETY (all calls below): every pointer passed is null on purpose or
    // points to a live local of the declared type and size.
    unsafe {
        let mut count: c_uint = 0;
        assert_eq!(raw.nvmlDeviceGetCount_v2(&mut count), UNINITIALIZED);
        assert_eq!(raw.nvmlShutdown(), UNINITIALIZED);

        assert_eq!(raw.nvmlInit_v2(), SUCCESS);
        assert_eq!(raw.nvmlInitWithFlags(0), SUCCESS);
        assert_eq!(raw.nvmlDeviceGetCount_v2(ptr::null_mut()), INVALID_ARGUMENT);
        assert_eq!(raw.nvmlDeviceGetCount_v2(&mut count), SUCCESS);
        assert_eq!(count, 3);

        let mut device: nvmlDevice_t = ptr::null_mut();
        assert_eq!(
            raw.nvmlDeviceGetHandleByIndex_v2(3, &mut device),
            INVALID_ARGUMENT
        );
        assert_eq!(
            raw.nvmlDeviceGetHandleByIndex_v2(0, ptr::null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(raw.nvmlDeviceGetHandleByIndex_v2(0, &mut device), SUCCESS);
        let mut index: c_uint = 99;
        for bogus in [ptr::null_mut(), ptr::without_provenance_mut(0x1234)] {
            assert_eq!(raw.nvmlDeviceGetIndex(bogus, &mut index), INVALID_ARGUMENT);
        }
        assert_eq!(
            raw.nvmlDeviceGetIndex(device, ptr::null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(raw.nvmlDeviceGetIndex(device, &mut index), SUCCESS);
        assert_eq!(index, 0);

        // "NVIDIA H100 80GB HBM3" is 21 bytes and needs 22 with its NUL.
        let mut name = [0 as c_char; 22];
        assert_eq!(
            raw.nvmlDeviceGetName(device, name.as_mut_ptr(), 21),
            INSUFFICIENT_SIZE
        );
        assert_eq!(
            raw.nvmlDeviceGetName(device, ptr::null_mut(), 22),
            INVALID_ARGUMENT
        );
        assert_eq!(
            raw.nvmlDeviceGetName(device, name.as_mut_ptr(), 22),
            SUCCESS
        );
        assert_eq!(
            CStr::from_ptr(name.as_ptr()).to_str(),
            Ok("NVIDIA H100 80GB HBM3")
        );
        let mut version = [0 as c_char; 4];
        assert_eq!(
            raw.nvmlSystemGetDriverVersion(version.as_mut_ptr(), 4),
            INSUFFICIENT_SIZE
        );

        let mut temp: c_uint = 0;
        assert_eq!(
            raw.nvmlDeviceGetTemperature(device, 1, &mut temp),
            INVALID_ARGUMENT
        );
        let mut clock: c_uint = 0;
        assert_eq!(
            raw.nvmlDeviceGetClockInfo(device, 4, &mut clock),
            INVALID_ARGUMENT
        );

        let mut memory: nvmlMemory_v2_t = std::mem::zeroed();
        assert_eq!(
            raw.nvmlDeviceGetMemoryInfo_v2(device, &mut memory),
            ARGUMENT_VERSION_MISMATCH
        );
        memory.version = (size_of::<nvmlMemory_v2_t>() | (1 << 24)) as c_uint;
        assert_eq!(
            raw.nvmlDeviceGetMemoryInfo_v2(device, &mut memory),
            ARGUMENT_VERSION_MISMATCH
        );
        memory.version = MEMORY_V2_VERSION;
        assert_eq!(raw.nvmlDeviceGetMemoryInfo_v2(device, &mut memory), SUCCESS);
        assert_eq!(memory.version, MEMORY_V2_VERSION);
        assert_eq!(memory.used, 40 * GIB);

        let mut fields: [nvmlFieldValue_t; 2] = std::mem::zeroed();
        fields[0].fieldId = MEMORY_TEMP;
        fields[1].fieldId = 9999;
        assert_eq!(
            raw.nvmlDeviceGetFieldValues(device, -1, fields.as_mut_ptr()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            raw.nvmlDeviceGetFieldValues(device, 1, ptr::null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            raw.nvmlDeviceGetFieldValues(device, 2, fields.as_mut_ptr()),
            SUCCESS
        );
        assert_eq!(fields[0].nvmlReturn, SUCCESS);
        assert_eq!(fields[0].valueType, 1, "NVML_VALUE_TYPE_UNSIGNED_INT");
        assert_eq!(fields[0].value.uiVal, 70);
        assert_eq!(fields[1].nvmlReturn, NOT_SUPPORTED);

        assert_eq!(
            CStr::from_ptr(raw.nvmlErrorString(NOT_SUPPORTED)).to_str(),
            Ok("Not Supported")
        );

        // Two inits, two shutdowns; then the library is uninitialized again.
        assert_eq!(raw.nvmlShutdown(), SUCCESS);
        assert_eq!(raw.nvmlDeviceGetCount_v2(&mut count), SUCCESS);
        assert_eq!(raw.nvmlShutdown(), SUCCESS);
        assert_eq!(raw.nvmlDeviceGetCount_v2(&mut count), UNINITIALIZED);
        assert_eq!(raw.nvmlDeviceGetIndex(device, &mut index), UNINITIALIZED);
        assert_eq!(raw.nvmlShutdown(), UNINITIALIZED);
    }
}

fn bad_scenarios_fail_init(lib: &Path, dir: &Path) {
    set_scenario(Some(&dir.join("does-not-exist.toml")));
    assert!(matches!(init(lib), Err(NvmlError::Unknown)));

    let broken = dir.join("broken.toml");
    std::fs::write(&broken, "[[gpu]]\ntemprature_c = 40\n").expect("write");
    set_scenario(Some(&broken));
    assert!(matches!(init(lib), Err(NvmlError::Unknown)));

    let no_driver = dir.join("no-driver.toml");
    std::fs::write(&no_driver, "init_error = \"driver_not_loaded\"\n").expect("write");
    set_scenario(Some(&no_driver));
    assert!(matches!(init(lib), Err(NvmlError::DriverNotLoaded)));
}

fn default_scenario_is_eight_moving_h100s(lib: &Path) {
    let nvml = init(lib).expect("init with the built-in scenario");
    assert_eq!(nvml.device_count().expect("count"), 8);
    assert_eq!(nvml.sys_driver_version().expect("driver"), "550.54.15");
    let mut bus_ids = Vec::new();
    for i in 0..8 {
        let gpu = nvml.device_by_index(i).expect("GPU");
        assert_eq!(gpu.name().expect("name"), "NVIDIA H100 80GB HBM3");
        assert_eq!(
            gpu.uuid().expect("uuid"),
            format!("GPU-{i:08x}-fake-4000-8000-{i:012x}")
        );
        let temp = gpu.temperature(TemperatureSensor::Gpu).expect("temp");
        assert!((35..=80).contains(&temp), "temperature {temp}");
        let power = gpu.power_usage().expect("power");
        assert!((90_000..=700_000).contains(&power), "power {power}");
        let sm = gpu.clock_info(Clock::SM).expect("clock");
        assert!((1275..=1980).contains(&sm), "SM clock {sm}");
        assert_eq!(gpu.clock_info(Clock::Memory).expect("clock"), 2619);
        let util = gpu.utilization_rates().expect("util");
        assert!(util.gpu <= 100 && util.memory <= 100, "{util:?}");
        let memory = gpu.memory_info().expect("memory");
        assert_eq!(memory.total, 85_520_809_984);
        assert!((GIB..=75 * GIB).contains(&memory.used), "{memory:?}");
        assert_eq!(memory.total - memory.reserved - memory.used, memory.free);
        let fields = samples(gpu.field_values_for(&[FieldId(MEMORY_TEMP)]));
        assert!(
            matches!(fields[0].value, Ok(SampleValue::U32(t)) if t > temp),
            "HBM runs warmer than the core: {:?} vs {temp}",
            fields[0].value
        );
        bus_ids.push(gpu.pci_info().expect("pci").bus_id);
    }
    assert_eq!(
        bus_ids,
        [
            "00000000:18:00.0",
            "00000000:2A:00.0",
            "00000000:3A:00.0",
            "00000000:5D:00.0",
            "00000000:9A:00.0",
            "00000000:AB:00.0",
            "00000000:BA:00.0",
            "00000000:DB:00.0",
        ]
    );
}
