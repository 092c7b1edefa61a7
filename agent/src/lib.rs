//! gputel agent: samples GPUs (NVML), the host (/proc) and InfiniBand ports
//! (/sys) at wall-clock-aligned ticks, and streams batches of rows to a
//! collector over gRPC.
//!
//! Data flow: [`sampler`] (one file per source) → [`sampling`] (the tick loop,
//! on its own thread) → [`client`] (queue, stream, acknowledgements); the
//! latest tick also goes to [`metrics`], the local Prometheus endpoint.
//! [`jobs`] and [`kube`] attribute GPU rows to scheduler jobs and
//! Kubernetes pods. [`systemd`] tells the service manager when the agent is ready and pets
//! its watchdog while the sampling loop makes progress.

pub mod client;
pub mod clock;
pub mod collectors;
pub mod config;
pub mod jobs;
pub mod kube;
pub mod metrics;
mod run;
pub mod sampler;
pub mod sampling;
pub mod snapshot;
pub mod spool;
pub mod systemd;

pub use run::{RunError, Summary, run};
