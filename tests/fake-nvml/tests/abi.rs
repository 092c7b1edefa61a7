//! Loads the built `libgputel_fake_nvml.so` the way the agent does, through
//! `nvml-wrapper` (and, for error paths the wrapper never takes, through the
//! raw `nvml-wrapper-sys` bindings), and checks what every export returns.
//!
//! The scenario is chosen by an environment variable read at init, so all
//! checks run sequentially from the one test in this file.

use std::ffi::{CStr, OsStr, c_char, c_uint, c_ulonglong};
use std::path::Path;
use std::ptr;
use std::time::{Duration, Instant};

use gputel_fake_nvml::{MEMORY_V2_VERSION, SCENARIO_ENV, SUPPORTED_EVENT_TYPES};
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::gpm_metrics_get;
use nvml_wrapper::struct_wrappers::device::{
    FieldValueSample, MemoryInfo, PciInfo, ProcessInfo, Utilization,
};
use nvml_wrapper::structs::device::{FieldId, UtilizationInfo};
use nvml_wrapper::{Device, EventSet, Nvml};
use nvml_wrapper_sys::bindings::field_id::{
    NVML_FI_DEV_ECC_DBE_AGG_TOTAL, NVML_FI_DEV_ECC_DBE_VOL_TOTAL, NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
    NVML_FI_DEV_ECC_SBE_VOL_TOTAL, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
    NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_PCIE_REPLAY_COUNTER, NVML_FI_DEV_REMAPPED_COR,
    NVML_FI_DEV_REMAPPED_FAILURE, NVML_FI_DEV_REMAPPED_PENDING, NVML_FI_DEV_REMAPPED_UNC,
    NVML_FI_DEV_RETIRED_DBE, NVML_FI_DEV_RETIRED_PENDING, NVML_FI_DEV_RETIRED_SBE,
};
use nvml_wrapper_sys::bindings::{
    NVML_GPM_METRICS_GET_VERSION, NVML_GPM_SUPPORT_VERSION, NvmlLib, nvmlDevice_t, nvmlEventData_t,
    nvmlEventSet_t, nvmlEventTypeXidCriticalError, nvmlFieldValue_t, nvmlGpmMetricsGet_t,
    nvmlGpmSample_t, nvmlGpmSupport_t, nvmlMemory_v2_t, nvmlProcessInfo_t,
    nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH as ARGUMENT_VERSION_MISMATCH,
    nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE as INSUFFICIENT_SIZE,
    nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT as INVALID_ARGUMENT,
    nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED as NOT_SUPPORTED,
    nvmlReturn_enum_NVML_ERROR_TIMEOUT as TIMEOUT,
    nvmlReturn_enum_NVML_ERROR_UNINITIALIZED as UNINITIALIZED,
    nvmlReturn_enum_NVML_SUCCESS as SUCCESS,
};

const MEMORY_TEMP: u32 = nvml_wrapper_sys::bindings::field_id::NVML_FI_DEV_MEMORY_TEMP;
const GIB: u64 = 1 << 30;
/// NVML_VALUE_NOT_AVAILABLE as an unsigned long long.
const NOT_AVAILABLE: u64 = u64::MAX;

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
enc_util_pct = 12
dec_util_pct = 34
power_limit_mw = 650000
clock_event_reasons = 36            # SW power cap | SW thermal slowdown
ecc_sbe_volatile = 11
ecc_dbe_volatile = 1
ecc_sbe_aggregate = 1234
ecc_dbe_aggregate = 2
remapped_rows_corrected = 3
remapped_rows_uncorrected = 1
remapped_rows_pending = 1
pcie_replay_count = 17
pcie_tx_bytes_per_s = 1000          # the counter reads the ms since init
pcie_rx_bytes_per_s = 3000
nvlink_tx_bytes_per_s = 1024000     # the KiB counter reads the ms since init
nvlink_rx_bytes_per_s = 2048000
graphics_active_pct = 90.125
sm_active_pct = 87.5
sm_occupancy_pct = 43.25
tensor_active_pct = 61
dram_active_pct = 38.5
processes = [
    { pid = 4242, used_memory_bytes = 1073741824 },
    { pid = 4343 },
    { pid = 99, from_ms = 3600000 },
]

[[gpu]]
count = 2
phase_steps = 1
name = "NVIDIA A100-SXM4-80GB"
temperature_c = [50, 60]
memory_temperature_c = "unsupported"
power_mw = [61000, 250000]
energy_mj = 123456
gpm = false
clock_event_reasons = [1, 4]
retired_pages_sbe = 2
retired_pages_dbe = [0, 1]
retired_pages_pending = 0
enc_util_pct = "unsupported"
"#;

/// XID events and a GPU that falls off the bus: GPU 1 reports XID 48, then
/// XID 79 as it is lost at 1.2 s; its XID 13 at 1.5 s never arrives.
const EVENTS_SCENARIO: &str = r#"
step_ms = 3600000

[[gpu]]
sm_active_pct = 50
xid_events = [{ at_ms = 1000, xid = 79 }, { at_ms = 1000, xid = 79 }]

[[gpu]]
xid_events = [
    { at_ms = 1500, xid = 13 },
    { at_ms = 1200, xid = 79 },
    { at_ms = 600, xid = 48 },
]
lost_at_ms = 1200
processes = [{ pid = 7, used_memory_bytes = 1 }]

[[gpu]]
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

    let events = dir.path().join("events.toml");
    std::fs::write(&events, EVENTS_SCENARIO).expect("write scenario");
    set_scenario(Some(&events));
    xid_events_arrive_once_and_a_lost_gpu_goes_quiet(&lib);

    bad_scenarios_fail_init(&lib, dir.path());

    set_scenario(None);
    default_scenario_is_eight_moving_h100s(&lib);
}

fn constant_scenario_reads_exactly(lib: &Path) {
    let before_init = Instant::now();
    let nvml = init(lib).expect("init with the constant scenario");
    let after_init = Instant::now();
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
    // Encoder and decoder: the scenario's percent over a 1 s sampling period.
    assert_eq!(
        gpu.encoder_utilization().expect("encoder"),
        UtilizationInfo {
            utilization: 12,
            sampling_period: 1_000_000
        }
    );
    assert_eq!(
        gpu.decoder_utilization().expect("decoder"),
        UtilizationInfo {
            utilization: 34,
            sampling_period: 1_000_000
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

    new_readings_are_exact(&nvml, &gpu, before_init, after_init);

    let a100 = nvml.device_by_index(1).expect("GPU 1");
    let twin = nvml.device_by_index(2).expect("GPU 2");
    older_gpu_readings_are_exact(&a100, &twin);
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
    assert!(matches!(
        a100.encoder_utilization(),
        Err(NvmlError::NotSupported)
    ));
    assert_eq!(a100.decoder_utilization().expect("decoder").utilization, 0);
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

        let (mut pct, mut period): (c_uint, c_uint) = (99, 99);
        assert_eq!(
            raw.nvmlDeviceGetEncoderUtilization(device, ptr::null_mut(), &mut period),
            INVALID_ARGUMENT
        );
        assert_eq!(
            raw.nvmlDeviceGetDecoderUtilization(device, &mut pct, ptr::null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!((pct, period), (99, 99), "nothing written on an error");
        assert_eq!(
            raw.nvmlDeviceGetDecoderUtilization(device, &mut pct, &mut period),
            SUCCESS
        );
        assert_eq!((pct, period), (34, 1_000_000));

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

        new_functions_over_the_raw_abi(&raw, device);

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

        assert_eq!(gpu.enforced_power_limit().expect("limit"), 700_000);
        let reasons = gpu.current_throttle_reasons().expect("reasons");
        assert!(
            (ThrottleReasons::SW_POWER_CAP | ThrottleReasons::GPU_IDLE).contains(reasons),
            "{reasons:?}"
        );
        assert_eq!(gpu.running_compute_processes().expect("processes"), []);
        assert!(gpu.gpm_support().expect("GPM support"));
        let first = gpu.gpm_sample().expect("GPM sample");
        let second = gpu.gpm_sample().expect("GPM sample");
        let ids = [
            GpmMetricId::GraphicsUtil,
            GpmMetricId::SmUtil,
            GpmMetricId::AnyTensorUtil,
            GpmMetricId::SmOccupancy,
            GpmMetricId::DramBwUtil,
        ];
        let activity: Vec<f64> = gpm_metrics_get(&nvml, &first, &second, &ids)
            .expect("GPM metrics")
            .into_iter()
            .map(|m| m.expect("each GPM metric").value)
            .collect();
        assert!(
            activity.windows(2).all(|w| w[0] >= w[1]) && (0.0..=97.0).contains(&activity[0]),
            "graphics ≥ SM active ≥ tensor ≥ occupancy ≥ DRAM on the built-in traces: {activity:?}"
        );
        let health: Vec<_> = samples(
            gpu.field_values_for(
                &[
                    NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
                    NVML_FI_DEV_RETIRED_DBE,
                    NVML_FI_DEV_REMAPPED_UNC,
                ]
                .map(FieldId),
            ),
        )
        .into_iter()
        .map(supported)
        .collect();
        assert_eq!(
            health,
            [Some(SampleValue::U64(0)), None, Some(SampleValue::U32(0))]
        );
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

/// A field value, or `None` for NVML_ERROR_NOT_SUPPORTED.
fn supported(sample: FieldValueSample) -> Option<SampleValue> {
    match sample.value {
        Ok(v) => Some(v),
        Err(NvmlError::NotSupported) => None,
        Err(e) => panic!("field {:?} failed: {e}", sample.field),
    }
}

fn whole_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).expect("ms fit u64")
}

/// Power limit, clock event reasons, the new field values, processes, GPM
/// and event registration of the constant scenario's GPU 0.
fn new_readings_are_exact(
    nvml: &Nvml,
    gpu: &Device<'_>,
    before_init: Instant,
    after_init: Instant,
) {
    assert_eq!(gpu.enforced_power_limit().expect("limit"), 650_000);
    assert_eq!(gpu.power_management_limit().expect("limit"), 650_000);
    assert_eq!(
        gpu.current_throttle_reasons().expect("reasons"),
        ThrottleReasons::SW_POWER_CAP | ThrottleReasons::SW_THERMAL_SLOWDOWN
    );

    let ids = [
        NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
        NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
        NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
        NVML_FI_DEV_RETIRED_SBE,
        NVML_FI_DEV_RETIRED_DBE,
        NVML_FI_DEV_RETIRED_PENDING,
        NVML_FI_DEV_REMAPPED_COR,
        NVML_FI_DEV_REMAPPED_UNC,
        NVML_FI_DEV_REMAPPED_PENDING,
        NVML_FI_DEV_REMAPPED_FAILURE,
        NVML_FI_DEV_PCIE_REPLAY_COUNTER,
    ];
    let values: Vec<_> = samples(gpu.field_values_for(&ids.map(FieldId)))
        .into_iter()
        .map(supported)
        .collect();
    use SampleValue::{U32, U64};
    assert_eq!(
        values,
        [
            Some(U64(11)),
            Some(U64(1)),
            Some(U64(1234)),
            Some(U64(2)),
            // An H100 remaps rows instead of retiring pages.
            None,
            None,
            None,
            Some(U32(3)),
            Some(U32(1)),
            Some(U32(1)),
            Some(U32(0)),
            Some(U64(17)),
        ]
    );

    // At 1000 B/s (and 1024000 B/s in KiB) a counter reads the ms since
    // init; all fields of one call are read at the same instant.
    let counters = [
        NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
        NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    ]
    .map(FieldId);
    let read_counters = || {
        let at_least = whole_ms(after_init.elapsed());
        let values: Vec<_> = samples(gpu.field_values_for(&counters))
            .into_iter()
            .map(supported)
            .collect();
        let at_most = whole_ms(before_init.elapsed()) + 1;
        let Some(Some(U64(ms))) = values.first().cloned() else {
            panic!("PCIe TX is an unsigned long long: {values:?}");
        };
        assert!(
            (at_least..=at_most).contains(&ms),
            "{ms} not in {at_least}..={at_most}"
        );
        assert_eq!(
            values,
            [
                Some(U64(ms)),
                Some(U64(3 * ms)),
                Some(U64(ms)),
                Some(U64(2 * ms))
            ]
        );
        ms
    };
    let first = read_counters();
    std::thread::sleep(Duration::from_millis(5));
    let second = read_counters();
    assert!(second >= first + 5, "{second} after {first}");

    assert_eq!(gpu.running_compute_processes_count().expect("count"), 2);
    assert_eq!(
        gpu.running_compute_processes().expect("processes"),
        [
            ProcessInfo {
                pid: 4242,
                used_gpu_memory: UsedGpuMemory::Used(GIB),
                gpu_instance_id: None,
                compute_instance_id: None,
            },
            ProcessInfo {
                pid: 4343,
                used_gpu_memory: UsedGpuMemory::Unavailable,
                gpu_instance_id: None,
                compute_instance_id: None,
            },
        ]
    );

    assert!(gpu.gpm_support().expect("GPM support"));
    let earlier = gpu.gpm_sample().expect("GPM sample");
    let later = gpu.gpm_sample().expect("GPM sample");
    let ids = [
        GpmMetricId::SmUtil,
        GpmMetricId::SmOccupancy,
        GpmMetricId::AnyTensorUtil,
        GpmMetricId::DramBwUtil,
        GpmMetricId::GraphicsUtil,
        GpmMetricId::Fp64Util,
    ];
    let metrics: Vec<_> = gpm_metrics_get(nvml, &earlier, &later, &ids)
        .expect("GPM metrics")
        .into_iter()
        .map(|m| match m {
            Ok(m) => {
                assert_eq!(m.metric_info.unit, "", "no metric info");
                Some((m.metric_id, m.value))
            }
            Err(NvmlError::NotSupported) => None,
            Err(e) => panic!("GPM metric failed: {e}"),
        })
        .collect();
    assert_eq!(
        metrics,
        [
            Some((GpmMetricId::SmUtil, 87.5)),
            Some((GpmMetricId::SmOccupancy, 43.25)),
            Some((GpmMetricId::AnyTensorUtil, 61.0)),
            Some((GpmMetricId::DramBwUtil, 38.5)),
            Some((GpmMetricId::GraphicsUtil, 90.125)),
            None,
        ]
    );
    assert!(matches!(
        gpm_metrics_get(nvml, &later, &earlier, &ids),
        Err(NvmlError::InvalidArg)
    ));
    earlier.free().expect("free a GPM sample");

    let h100_events = EventTypes::SINGLE_BIT_ECC_ERROR
        | EventTypes::DOUBLE_BIT_ECC_ERROR
        | EventTypes::PSTATE_CHANGE
        | EventTypes::CRITICAL_XID_ERROR
        | EventTypes::MIG_CONFIG_CHANGE;
    assert_eq!(gpu.supported_event_types().expect("events"), h100_events);
    assert_eq!(SUPPORTED_EVENT_TYPES, h100_events.bits());
    let set = nvml.create_event_set().expect("event set");
    let set = gpu
        .register_events(
            EventTypes::CRITICAL_XID_ERROR | EventTypes::PSTATE_CHANGE,
            set,
        )
        .expect("register");
    assert!(matches!(set.wait(0), Err(NvmlError::Timeout)));
    // nvml-wrapper frees the set when registration fails.
    let refused = gpu
        .register_events(EventTypes::CLOCK_CHANGE, set)
        .expect_err("clock change events are Kepler-only");
    assert!(matches!(refused.error, NvmlError::NotSupported));
    assert!(refused.source.is_none(), "the set was released");
}

/// The constant scenario's A100s: no GPM, retired pages, no processes.
fn older_gpu_readings_are_exact(a100: &Device<'_>, twin: &Device<'_>) {
    assert!(!a100.gpm_support().expect("GPM support"));
    assert!(matches!(a100.gpm_sample(), Err(NvmlError::NotSupported)));
    assert_eq!(a100.enforced_power_limit().expect("limit"), 700_000);
    assert_eq!(
        a100.current_throttle_reasons().expect("reasons"),
        ThrottleReasons::GPU_IDLE
    );
    assert_eq!(
        twin.current_throttle_reasons().expect("reasons"),
        ThrottleReasons::SW_POWER_CAP
    );
    let retired = [
        NVML_FI_DEV_RETIRED_SBE,
        NVML_FI_DEV_RETIRED_DBE,
        NVML_FI_DEV_RETIRED_PENDING,
        NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
    ]
    .map(FieldId);
    let read = |gpu: &Device<'_>| -> Vec<_> {
        samples(gpu.field_values_for(&retired))
            .into_iter()
            .map(supported)
            .collect()
    };
    use SampleValue::{U32, U64};
    assert_eq!(
        read(a100),
        [Some(U64(2)), Some(U64(0)), Some(U32(0)), Some(U64(0))]
    );
    assert_eq!(
        read(twin),
        [Some(U64(2)), Some(U64(1)), Some(U32(0)), Some(U64(0))]
    );
    assert_eq!(a100.running_compute_processes_count().expect("count"), 0);
    assert_eq!(a100.running_compute_processes().expect("processes"), []);
}

/// Error paths and raw struct contents of the new functions, on the
/// constant scenario's GPU 0.
///
/// # Safety
/// `device` must be GPU 0's handle, with the library initialized.
unsafe fn new_functions_over_the_raw_abi(raw: &NvmlLib, device: nvmlDevice_t) {
    let bogus = ptr::without_provenance_mut(0x1234);
    // SAFETY (all calls below): every pointer passed is null or bogus on
    // purpose, or points to a live local of the declared type and size.
    unsafe {
        let mut reasons: c_ulonglong = 0;
        assert_eq!(
            raw.nvmlDeviceGetCurrentClocksEventReasons(device, &mut reasons),
            SUCCESS
        );
        assert_eq!(reasons, 36);
        reasons = 0;
        assert_eq!(
            raw.nvmlDeviceGetCurrentClocksThrottleReasons(device, &mut reasons),
            SUCCESS
        );
        assert_eq!(reasons, 36);
        assert_eq!(
            raw.nvmlDeviceGetCurrentClocksThrottleReasons(device, ptr::null_mut()),
            INVALID_ARGUMENT
        );
        let mut limit: c_uint = 0;
        assert_eq!(
            raw.nvmlDeviceGetPowerManagementLimit(device, &mut limit),
            SUCCESS
        );
        assert_eq!(limit, 650_000);
        assert_eq!(
            raw.nvmlDeviceGetEnforcedPowerLimit(device, ptr::null_mut()),
            INVALID_ARGUMENT
        );

        // Processes: ask for the count, then fill a big enough buffer.
        let mut count: c_uint = 0;
        assert_eq!(
            raw.nvmlDeviceGetComputeRunningProcesses_v3(device, &mut count, ptr::null_mut()),
            INSUFFICIENT_SIZE
        );
        assert_eq!(count, 2);
        let mut infos: [nvmlProcessInfo_t; 3] = std::mem::zeroed();
        count = 1;
        assert_eq!(
            raw.nvmlDeviceGetComputeRunningProcesses_v3(device, &mut count, infos.as_mut_ptr()),
            INSUFFICIENT_SIZE
        );
        assert_eq!(count, 2);
        assert_eq!(infos[0].pid, 0, "nothing written without room for all");
        count = 3;
        assert_eq!(
            raw.nvmlDeviceGetComputeRunningProcesses_v3(device, &mut count, ptr::null_mut()),
            INVALID_ARGUMENT
        );
        assert_eq!(
            raw.nvmlDeviceGetComputeRunningProcesses_v3(
                device,
                ptr::null_mut(),
                infos.as_mut_ptr()
            ),
            INVALID_ARGUMENT
        );
        count = 3;
        assert_eq!(
            raw.nvmlDeviceGetComputeRunningProcesses_v3(device, &mut count, infos.as_mut_ptr()),
            SUCCESS
        );
        assert_eq!(count, 2);
        let got: Vec<_> = infos
            .iter()
            .map(|p| (p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId))
            .collect();
        assert_eq!(
            got,
            [
                (4242, GIB, u32::MAX, u32::MAX),
                (4343, NOT_AVAILABLE, u32::MAX, u32::MAX),
                (0, 0, 0, 0),
            ]
        );

        // GPM.
        let mut support = nvmlGpmSupport_t {
            version: 0,
            isSupportedDevice: 7,
        };
        assert_eq!(
            raw.nvmlGpmQueryDeviceSupport(device, &mut support),
            ARGUMENT_VERSION_MISMATCH
        );
        support.version = NVML_GPM_SUPPORT_VERSION;
        assert_eq!(raw.nvmlGpmQueryDeviceSupport(device, &mut support), SUCCESS);
        assert_eq!(support.isSupportedDevice, 1);
        assert_eq!(raw.nvmlGpmSampleAlloc(ptr::null_mut()), INVALID_ARGUMENT);
        let (mut first, mut second): (nvmlGpmSample_t, nvmlGpmSample_t) =
            (ptr::null_mut(), ptr::null_mut());
        assert_eq!(raw.nvmlGpmSampleAlloc(&mut first), SUCCESS);
        assert_eq!(raw.nvmlGpmSampleAlloc(&mut second), SUCCESS);
        assert!(!first.is_null() && first != second);
        let mut request: Box<nvmlGpmMetricsGet_t> = Box::new(std::mem::zeroed());
        request.version = NVML_GPM_METRICS_GET_VERSION;
        request.numMetrics = 2;
        request.sample1 = first;
        request.sample2 = second;
        request.metrics[0].metricId = 2; // NVML_GPM_METRIC_SM_UTIL
        request.metrics[1].metricId = 8; // not an NVML metric id
        assert_eq!(
            raw.nvmlGpmMetricsGet(&mut *request),
            INVALID_ARGUMENT,
            "samples never taken"
        );
        assert_eq!(raw.nvmlGpmSampleGet(device, bogus), INVALID_ARGUMENT);
        assert_eq!(raw.nvmlGpmSampleGet(bogus.cast(), first), INVALID_ARGUMENT);
        assert_eq!(raw.nvmlGpmSampleGet(device, first), SUCCESS);
        assert_eq!(raw.nvmlGpmSampleGet(device, second), SUCCESS);
        assert_eq!(raw.nvmlGpmMetricsGet(&mut *request), SUCCESS);
        assert_eq!(request.metrics[0].nvmlReturn, SUCCESS);
        assert_eq!(request.metrics[0].value, 87.5);
        assert!(request.metrics[0].metricInfo.unit.is_null());
        assert_eq!(request.metrics[1].nvmlReturn, NOT_SUPPORTED);
        request.version = 2;
        assert_eq!(
            raw.nvmlGpmMetricsGet(&mut *request),
            ARGUMENT_VERSION_MISMATCH
        );
        request.version = NVML_GPM_METRICS_GET_VERSION;
        request.numMetrics = 211;
        assert_eq!(raw.nvmlGpmMetricsGet(&mut *request), INVALID_ARGUMENT);
        request.numMetrics = 1;
        request.sample2 = first;
        assert_eq!(
            raw.nvmlGpmMetricsGet(&mut *request),
            INVALID_ARGUMENT,
            "a sample is not later than itself"
        );
        assert_eq!(raw.nvmlGpmMetricsGet(ptr::null_mut()), INVALID_ARGUMENT);
        assert_eq!(raw.nvmlGpmSampleFree(first), SUCCESS);
        assert_eq!(raw.nvmlGpmSampleFree(first), INVALID_ARGUMENT);
        assert_eq!(raw.nvmlGpmSampleFree(second), SUCCESS);

        // Event sets.
        let xid = c_ulonglong::from(nvmlEventTypeXidCriticalError);
        assert_eq!(raw.nvmlEventSetCreate(ptr::null_mut()), INVALID_ARGUMENT);
        let mut set: nvmlEventSet_t = ptr::null_mut();
        assert_eq!(raw.nvmlEventSetCreate(&mut set), SUCCESS);
        assert_eq!(
            raw.nvmlDeviceRegisterEvents(device, xid, bogus.cast()),
            INVALID_ARGUMENT
        );
        assert_eq!(raw.nvmlDeviceRegisterEvents(device, xid, set), SUCCESS);
        assert_eq!(raw.nvmlDeviceRegisterEvents(device, 16, set), NOT_SUPPORTED);
        let mut data: nvmlEventData_t = std::mem::zeroed();
        assert_eq!(
            raw.nvmlEventSetWait_v2(set, ptr::null_mut(), 0),
            INVALID_ARGUMENT
        );
        assert_eq!(
            raw.nvmlEventSetWait_v2(bogus.cast(), &mut data, 0),
            INVALID_ARGUMENT
        );
        assert_eq!(raw.nvmlEventSetWait_v2(set, &mut data, 0), TIMEOUT);
        assert_eq!(raw.nvmlEventSetFree(set), SUCCESS);
        assert_eq!(raw.nvmlEventSetFree(set), INVALID_ARGUMENT);
    }
}

/// The device handle of an event or a `Device`, comparable after the GPU
/// is lost (when `Device::index` fails).
fn handle_of(device: &Device<'_>) -> nvmlDevice_t {
    // SAFETY: only compared, never used to make a second owner.
    unsafe { device.handle() }
}

fn xid_events_arrive_once_and_a_lost_gpu_goes_quiet(lib: &Path) {
    let before_init = Instant::now();
    let nvml = init(lib).expect("init with the events scenario");
    let gpus: Vec<Device<'_>> = (0..3)
        .map(|i| nvml.device_by_index(i).expect("GPU"))
        .collect();
    // Two GPM samples of GPU 1 while it still works, compared once it is lost.
    let doomed_first = gpus[1].gpm_sample().expect("GPM sample");
    let doomed_second = gpus[1].gpm_sample().expect("GPM sample");

    let xid = EventTypes::CRITICAL_XID_ERROR;
    let both = nvml.create_event_set().expect("event set");
    let both = gpus[0].register_events(xid, both).expect("register");
    let both = gpus[1].register_events(xid, both).expect("register");
    let quiet = nvml.create_event_set().expect("event set");
    let quiet = gpus[2].register_events(xid, quiet).expect("register");
    // SAFETY: the fake library has no initializers that could misbehave.
    let raw = unsafe { NvmlLib::new(OsStr::new(lib)) }.expect("dlopen the fake library");
    let mut gpu0_only: nvmlEventSet_t = ptr::null_mut();
    // SAFETY: a live local of the declared type; GPU 0's live handle.
    unsafe {
        assert_eq!(raw.nvmlEventSetCreate(&mut gpu0_only), SUCCESS);
        assert_eq!(
            raw.nvmlDeviceRegisterEvents(
                handle_of(&gpus[0]),
                c_ulonglong::from(nvmlEventTypeXidCriticalError),
                gpu0_only
            ),
            SUCCESS
        );
    }

    // A blocked wait does not hold other threads' calls up: they finish
    // long before its 500 ms run out (were the lock held, they could not).
    std::thread::scope(|scope| {
        let spawned = Instant::now();
        let waiter = scope.spawn(move || (quiet.wait(500).map(|_| ()), spawned.elapsed()));
        std::thread::sleep(Duration::from_millis(50));
        for _ in 0..20 {
            assert_eq!(
                gpus[0].temperature(TemperatureSensor::Gpu).expect("temp"),
                40
            );
            assert_eq!(gpus[2].name().expect("name"), "NVIDIA H100 80GB HBM3");
        }
        let calls_done = spawned.elapsed();
        let (result, waited) = waiter.join().expect("the waiting thread");
        assert!(matches!(result, Err(NvmlError::Timeout)), "{result:?}");
        assert!(waited >= Duration::from_millis(500), "{waited:?}");
        assert!(
            calls_done < Duration::from_millis(500),
            "calls waited for a blocked nvmlEventSetWait_v2: {calls_done:?}"
        );
    });

    // Events arrive in time order across the set's GPUs, each once.
    let next = |set: &EventSet<'_>, timeout_ms| {
        let event = set.wait(timeout_ms).expect("an XID event");
        assert_eq!(event.event_type, xid);
        (handle_of(&event.device), event.event_data)
    };
    let (gpu0, gpu1) = (handle_of(&gpus[0]), handle_of(&gpus[1]));
    let xid_value = |v| Some(XidError::Value(v));
    assert_eq!(next(&both, 5000), (gpu1, xid_value(48)));
    assert!(before_init.elapsed() >= Duration::from_millis(600));
    assert_eq!(next(&both, 5000), (gpu0, xid_value(79)));
    assert!(before_init.elapsed() >= Duration::from_millis(1000));
    assert_eq!(
        next(&both, 0),
        (gpu0, xid_value(79)),
        "two events at one time"
    );
    // XID 79 as GPU 1 falls off the bus; its XID 13 after that never comes.
    assert_eq!(next(&both, 5000), (gpu1, xid_value(79)));
    assert!(before_init.elapsed() >= Duration::from_millis(1200));
    let waiting = Instant::now();
    assert!(matches!(both.wait(500), Err(NvmlError::Timeout)));
    assert!(waiting.elapsed() >= Duration::from_millis(500));
    assert!(before_init.elapsed() >= Duration::from_millis(1700));

    // Every set gets its own copy of an event, with MIG ids "none".
    // SAFETY: live locals of the declared types; a set this function created.
    unsafe {
        let mut data: nvmlEventData_t = std::mem::zeroed();
        for _ in 0..2 {
            assert_eq!(raw.nvmlEventSetWait_v2(gpu0_only, &mut data, 0), SUCCESS);
            assert_eq!(
                (
                    data.device,
                    data.eventType,
                    data.eventData,
                    data.gpuInstanceId,
                    data.computeInstanceId
                ),
                (gpu0, 8, 79, u32::MAX, u32::MAX)
            );
        }
        assert_eq!(raw.nvmlEventSetWait_v2(gpu0_only, &mut data, 0), TIMEOUT);
        assert_eq!(raw.nvmlEventSetFree(gpu0_only), SUCCESS);
    }

    // GPU 1 is lost to every call; GPUs 0 and 2 carry on.
    assert_eq!(nvml.device_count().expect("count"), 3);
    assert!(matches!(nvml.device_by_index(1), Err(NvmlError::GpuLost)));
    let lost = &gpus[1];
    assert!(matches!(lost.name(), Err(NvmlError::GpuLost)));
    assert!(matches!(lost.uuid(), Err(NvmlError::GpuLost)));
    assert!(matches!(
        lost.temperature(TemperatureSensor::Gpu),
        Err(NvmlError::GpuLost)
    ));
    assert!(matches!(lost.power_usage(), Err(NvmlError::GpuLost)));
    assert!(matches!(lost.memory_info(), Err(NvmlError::GpuLost)));
    assert!(matches!(
        lost.field_values_for(&[FieldId(MEMORY_TEMP)]),
        Err(NvmlError::GpuLost)
    ));
    assert!(matches!(lost.gpm_support(), Err(NvmlError::GpuLost)));
    assert!(matches!(lost.gpm_sample(), Err(NvmlError::GpuLost)));
    assert!(matches!(
        gpm_metrics_get(&nvml, &doomed_first, &doomed_second, &[GpmMetricId::SmUtil]),
        Err(NvmlError::GpuLost)
    ));
    assert!(matches!(
        lost.running_compute_processes(),
        Err(NvmlError::GpuLost)
    ));
    assert!(matches!(
        lost.supported_event_types(),
        Err(NvmlError::GpuLost)
    ));
    let set = nvml.create_event_set().expect("event set");
    let refused = lost.register_events(xid, set).expect_err("GPU 1 is lost");
    assert!(matches!(refused.error, NvmlError::GpuLost));
    assert_eq!(
        gpus[0].temperature(TemperatureSensor::Gpu).expect("temp"),
        40
    );
    assert_eq!(
        nvml.device_by_index(2)
            .expect("GPU 2")
            .index()
            .expect("index"),
        2
    );

    // GPM samples must come from one GPU, in order.
    let a = gpus[0].gpm_sample().expect("GPM sample");
    let other = gpus[2].gpm_sample().expect("GPM sample");
    let b = gpus[0].gpm_sample().expect("GPM sample");
    assert!(matches!(
        gpm_metrics_get(&nvml, &a, &other, &[GpmMetricId::SmUtil]),
        Err(NvmlError::InvalidArg)
    ));
    let metrics = gpm_metrics_get(&nvml, &a, &b, &[GpmMetricId::SmUtil]).expect("GPM metrics");
    assert!(
        matches!(metrics.as_slice(), [Ok(m)] if m.value == 50.0),
        "{metrics:?}"
    );
}
