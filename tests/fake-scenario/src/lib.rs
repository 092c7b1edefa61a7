//! The scenario files that drive gputel's fake GPU libraries: the fake NVML
//! (`tests/fake-nvml`) and the fake DCGM (`tests/fake-dcgm`) read the same
//! file, named by [`SCENARIO_ENV`], so one scenario describes what both
//! report. Here are the parser, its validation and the value computations
//! (what a metric reads at a given time since init); the format is
//! documented in `tests/fake-nvml/README.md`.
//!
//! This crate exports no C functions, so each fake library links it without
//! exporting the other's API.

pub mod dcgm;
pub mod metric;
pub mod scenario;

pub use dcgm::{DcgmScenario, HostEngine, Profiler};
pub use metric::{Fault, Metric, Sample, Value};
pub use scenario::{
    DEFAULT_SCENARIO_TOML, Energy, Gpu, MAX_MIG_DEVICES, MemoryReading, MigDevice, PciAddress,
    Process, SCENARIO_ENV, Scenario, ScenarioError, XidEvent,
};
