//! The sampling loop: one thread that wakes at wall-clock multiples of the
//! interval, asks every sampler for its rows with the tick's one timestamp,
//! and hands the batch to the network side.

use std::collections::HashSet;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use gputel_proto::Batch;
use tracing::{debug, info, warn};

use crate::clock::{next_tick, now_us};
use crate::config::Config;
use crate::jobs::JobAttributor;
use crate::sampler::gpu::{GpuOptions, GpuSampler, GpuUnavailable};
use crate::sampler::ib::IbSampler;
use crate::sampler::node::NodeSampler;
use crate::systemd::Progress;

/// Distinct error messages remembered for log deduplication.
const MAX_REMEMBERED_ERRORS: usize = 1024;

/// Every sampler of the node.
#[derive(Debug)]
pub struct Samplers {
    pub gpu: Result<GpuSampler, GpuUnavailable>,
    pub node: NodeSampler,
    pub ib: IbSampler,
    pub jobs: JobAttributor,
    reported: HashSet<String>,
}

/// Rows of one tick (its `seq` is left at 0) and what failed while taking them.
#[derive(Debug, Default)]
pub struct Tick {
    pub batch: Batch,
    pub errors: Vec<String>,
}

impl Samplers {
    /// Opens every source. A missing driver or missing InfiniBand is reported
    /// here, once, and the other sources carry on.
    pub fn open(config: &Config) -> Self {
        let gpu = GpuSampler::open(&GpuOptions {
            lib: config.nvml_lib.clone(),
            procfs_root: config.procfs_root.clone(),
            process_interval_us: i64::try_from(config.process_interval.as_micros())
                .unwrap_or(i64::MAX),
        });
        match &gpu {
            Ok(gpu) => info!(
                gpus = gpu.gpu_count(),
                driver = gpu.driver_version().unwrap_or("unknown"),
                "NVML loaded"
            ),
            Err(e) => warn!("GPUs will not be sampled: {e}"),
        }
        let ib_dir = config.sysfs_root.join("class/infiniband");
        if !ib_dir.is_dir() {
            info!(
                dir = %ib_dir.display(),
                "no InfiniBand devices; IB ports will be sampled if they appear"
            );
        }
        let ib = IbSampler::new(&config.sysfs_root);
        Self {
            gpu,
            node: NodeSampler::new(&config.procfs_root),
            ib,
            jobs: JobAttributor::new(&config.procfs_root, config.hpc_job_mapping_dir.clone()),
            reported: HashSet::new(),
        }
    }

    /// Samples every source at `ts_us`.
    pub fn sample(&mut self, ts_us: i64) -> Tick {
        let mut tick = Tick::default();
        if let Ok(gpu) = &mut self.gpu {
            for e in gpu.sample(ts_us, &mut tick.batch) {
                tick.errors.push(e.to_string());
            }
        }
        let mut errors = Vec::new();
        tick.batch.node.push(self.node.sample(ts_us, &mut errors));
        self.ib.sample(ts_us, &mut tick.batch.ib, &mut errors);
        let listed = self.gpu.as_ref().is_ok_and(GpuSampler::processes_listed);
        self.jobs.apply(&mut tick.batch, listed);
        for e in errors {
            let text = e.to_string();
            // GPU errors are logged by their sampler; host errors here, once each.
            if self.reported.len() < MAX_REMEMBERED_ERRORS && self.reported.insert(text.clone()) {
                warn!("{text}");
            } else {
                debug!("{text}");
            }
            tick.errors.push(text);
        }
        tick
    }
}

/// Samples at every tick until `stop` receives a message or is dropped, or
/// `ticks` ticks are done; each batch goes to `emit` with seq numbers from
/// `first_seq` on. Returns the number of ticks taken. `progress` shows the
/// watchdog whether a tick is under way and since when.
pub fn run(
    mut samplers: Samplers,
    interval: Duration,
    ticks: Option<u64>,
    first_seq: u64,
    stop: &Receiver<()>,
    progress: &Progress,
    mut emit: impl FnMut(Batch) -> bool,
) -> u64 {
    let interval_us = interval.as_micros().max(1) as i64;
    let mut taken = 0;
    let mut seq = first_seq.saturating_sub(1);
    while ticks.is_none_or(|n| taken < n) {
        let now = now_us();
        let ts_us = next_tick(now, interval_us);
        progress.idle();
        match stop.recv_timeout(Duration::from_micros((ts_us - now) as u64)) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
        }
        progress.busy();
        let late_us = now_us() - ts_us;
        if late_us > interval_us {
            warn!(
                late_ms = late_us / 1000,
                "woke more than one interval late; ticks were skipped"
            );
        }
        let mut tick = samplers.sample(ts_us);
        seq += 1;
        tick.batch.seq = seq;
        taken += 1;
        if !emit(tick.batch) {
            break;
        }
    }
    progress.idle();
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_fall_on_multiples_of_the_interval() {
        assert_eq!(next_tick(1_000_000, 1_000_000), 2_000_000);
        assert_eq!(next_tick(1_000_001, 1_000_000), 2_000_000);
        assert_eq!(next_tick(1_999_999, 1_000_000), 2_000_000);
        assert_eq!(
            next_tick(1_795_240_812_345_678, 15_000_000),
            1_795_240_815_000_000
        );
    }
}
