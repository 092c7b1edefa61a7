//! A fake `libnvidia-ml.so` for tests.
//!
//! Built as a `cdylib`, it exports the NVML C functions gputel's agent calls,
//! so the agent runs its real `nvml-wrapper` code against GPUs described by a
//! scenario file (see the README next to this crate's `Cargo.toml`). The file
//! is named by the [`SCENARIO_ENV`] environment variable and read at the first
//! `nvmlInit`; without it the library presents eight moving H100s.
//!
//! As an `rlib` it exposes the scenario parser and the value computations,
//! which tests and other crates can use to predict what the library reports.

mod ffi;
pub mod nvsmi;

pub use ffi::{MEMORY_V2_VERSION, SUPPORTED_EVENT_TYPES};
// The scenario format is shared with the fake DCGM library.
pub use gputel_fake_scenario::{
    DEFAULT_SCENARIO_TOML, DcgmScenario, Energy, Fault, Gpu, HostEngine, MAX_MIG_DEVICES,
    MemoryReading, Metric, MigDevice, PciAddress, Process, Profiler, SCENARIO_ENV, Sample,
    Scenario, ScenarioError, Value, XidEvent, metric, scenario,
};

/// Where Cargo put the fake library for the running test executable, if it is
/// there: `target/<profile>/deps/` (next to test executables, rebuilt for every
/// test run that depends on this crate), else `target/<profile>/` (refreshed
/// only by `cargo build`).
pub fn cdylib_path() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let name = format!(
        "{}gputel_fake_nvml{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join(&name))
        .find(|p| p.is_file())
}
