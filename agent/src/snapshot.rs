//! `gputel-agent --once`: one snapshot of every source as JSON, for operators
//! and tests.

use std::time::Duration;

use gputel_proto::{GpuEvent, GpuProcess, GpuSample, IbPortSample, NodeSample};
use serde::Serialize;

use crate::clock::now_us;
use crate::sampling::{Gpus, Samplers};

/// What `--once` prints.
#[derive(Debug, Serialize)]
pub struct Snapshot {
    pub node: String,
    /// The sample time, RFC 3339 UTC.
    pub ts: String,
    pub ts_us: i64,
    pub agent_version: &'static str,
    pub gpu_status: GpuStatus,
    pub gpus: Vec<GpuSample>,
    /// The host's row; null when `node` is not among the sources.
    pub host: Option<NodeSample>,
    pub ib_ports: Vec<IbPortSample>,
    /// Events seen while the snapshot was taken (XID errors, lost GPUs, throttling).
    pub events: Vec<GpuEvent>,
    /// Compute processes on the GPUs.
    pub gpu_processes: Vec<GpuProcess>,
    /// Sources or metrics that failed, in words.
    pub errors: Vec<String>,
}

/// Whether GPUs could be sampled, and why not.
#[derive(Debug, Serialize)]
pub struct GpuStatus {
    pub available: bool,
    pub driver_version: Option<String>,
    pub reason: Option<String>,
}

/// Samples twice, `gap` apart, so rates and CPU shares have a previous
/// reading, and returns the second sample.
pub fn take(node: &str, mut samplers: Samplers, gap: Duration) -> Snapshot {
    let first = samplers.sample(now_us()).batch;
    std::thread::sleep(gap);
    let ts_us = now_us();
    let tick = samplers.sample(ts_us);
    let gpu_status = match samplers.gpus() {
        Gpus::Sampled { driver_version, .. } => GpuStatus {
            available: true,
            driver_version: driver_version.clone(),
            reason: None,
        },
        Gpus::Unavailable(why) => GpuStatus {
            available: false,
            driver_version: None,
            reason: Some(format!("GPUs are unavailable: {why}")),
        },
        Gpus::Disabled => GpuStatus {
            available: false,
            driver_version: None,
            reason: Some("GPUs are not sampled: gpu is not among the configured sources".into()),
        },
    };
    let mut batch = tick.batch;
    // Processes are listed on the first tick; events may come with either.
    let mut events = first.event;
    events.append(&mut batch.event);
    let mut gpu_processes = first.gpu_process;
    gpu_processes.append(&mut batch.gpu_process);
    Snapshot {
        node: node.to_owned(),
        ts: rfc3339(ts_us),
        ts_us,
        agent_version: env!("CARGO_PKG_VERSION"),
        gpu_status,
        gpus: std::mem::take(&mut batch.gpu),
        host: batch.node.pop(),
        ib_ports: batch.ib,
        events,
        gpu_processes,
        errors: tick.errors.iter().map(ToString::to_string).collect(),
    }
}

fn rfc3339(ts_us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(ts_us)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_of_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(
            rfc3339(1_795_240_812_345_678),
            "2026-11-21T06:00:12.345678Z"
        );
    }
}
