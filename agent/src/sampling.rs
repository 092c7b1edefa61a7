//! The sampling loop: one thread that wakes at wall-clock multiples of the
//! interval, asks every sampler for its rows with the tick's one timestamp,
//! and hands the batch to the network side.

use std::collections::HashSet;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use gputel_runtime::time::duration_us;

use gputel_proto::Batch;
use tracing::{debug, info, warn};

use crate::clock::{next_tick, now_us};
use crate::config::Config;
use crate::jobs::JobAttributor;
use crate::kube::PodsRx;
use crate::sampler::dcgm::DcgmOptions;
use crate::sampler::gpu::{GpuOptions, GpuSampler};
use crate::sampler::ib::IbSampler;
use crate::sampler::node::NodeSampler;
use crate::sampler::{Sampler, Source, Tick};
use crate::systemd::Progress;

/// Distinct error messages remembered for log deduplication.
const MAX_REMEMBERED_ERRORS: usize = 1024;

/// The enabled samplers of the node, and job attribution of their rows.
#[derive(Debug)]
pub struct Samplers {
    samplers: Vec<Box<dyn Sampler>>,
    jobs: JobAttributor,
    gpus: Gpus,
    /// Whether the host is sampled (`node`) and InfiniBand ports are (`ib`).
    node: bool,
    ib: bool,
    reported: HashSet<String>,
}

/// What became of the GPU source when the samplers were opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gpus {
    /// NVML is loaded and sees `count` GPUs.
    Sampled {
        count: usize,
        driver_version: Option<String>,
    },
    /// The source is enabled, but NVML could not be loaded or started: why, in words.
    Unavailable(String),
    /// The source is not in the configured sources.
    Disabled,
}

impl Samplers {
    /// Opens every configured source, in [`Source::ALL`]'s order. A missing
    /// driver or missing InfiniBand is reported here, once, and the other
    /// sources carry on.
    pub fn open(config: &Config) -> Self {
        let enabled = |source| config.sources.contains(&source);
        let mut samplers: Vec<Box<dyn Sampler>> = Vec::new();
        let mut gpus = Gpus::Disabled;
        if enabled(Source::Gpu) {
            match GpuSampler::open(&GpuOptions {
                lib: config.nvml_lib.clone(),
                procfs_root: config.procfs_root.clone(),
                process_interval_us: duration_us(config.process_interval),
                slow_read_interval_us: duration_us(config.slow_read_interval),
                profiling: config.profiling_source,
                dcgm: DcgmOptions {
                    lib: config.dcgm_lib.clone(),
                    host: config.dcgm_host.clone(),
                    pause_file: config.dcgm_pause_file.clone(),
                    interval: config.interval,
                },
            }) {
                Ok(gpu) => {
                    let driver_version = gpu.driver_version().map(str::to_owned);
                    info!(
                        gpus = gpu.gpu_count(),
                        driver = driver_version.as_deref().unwrap_or("unknown"),
                        "NVML loaded"
                    );
                    gpus = Gpus::Sampled {
                        count: gpu.gpu_count(),
                        driver_version,
                    };
                    samplers.push(Box::new(gpu));
                }
                Err(e) => {
                    warn!("GPUs will not be sampled: {e}");
                    gpus = Gpus::Unavailable(e.to_string());
                }
            }
        }
        if enabled(Source::Node) {
            samplers.push(Box::new(
                NodeSampler::new(&config.procfs_root).with_rapl(&config.sysfs_root),
            ));
        }
        if enabled(Source::Ib) {
            let ib_dir = config.sysfs_root.join("class/infiniband");
            if !ib_dir.is_dir() {
                info!(
                    dir = %ib_dir.display(),
                    "no InfiniBand devices; IB ports will be sampled if they appear"
                );
            }
            samplers.push(Box::new(IbSampler::new(&config.sysfs_root)));
        }
        let disabled: Vec<_> = Source::ALL.into_iter().filter(|s| !enabled(*s)).collect();
        if !disabled.is_empty() {
            let names: Vec<_> = disabled.iter().map(|s| s.name()).collect();
            info!(sources = ?names, "not sampled: left out of the configured sources");
        }
        Self {
            samplers,
            jobs: JobAttributor::new(&config.procfs_root, config.hpc_job_mapping_dir.clone()),
            gpus,
            node: enabled(Source::Node),
            ib: enabled(Source::Ib),
            reported: HashSet::new(),
        }
    }

    /// Stamps the GPU rows with the pods the kubelet allocated them to, as
    /// `pods` last published them.
    pub fn with_pods(mut self, pods: PodsRx) -> Self {
        self.jobs = self.jobs.with_pods(pods);
        self
    }

    /// What became of the GPU source.
    pub fn gpus(&self) -> &Gpus {
        &self.gpus
    }

    /// What is sampled, in words: "8 GPUs and the host", "the host (no GPUs)".
    pub fn describe(&self) -> String {
        let host = match (self.node, self.ib) {
            (true, _) => Some("the host"),
            (false, true) => Some("InfiniBand ports"),
            (false, false) => None,
        };
        let gpus = match &self.gpus {
            Gpus::Sampled { count: 1, .. } => Some("1 GPU".to_owned()),
            Gpus::Sampled { count, .. } => Some(format!("{count} GPUs")),
            Gpus::Unavailable(_) | Gpus::Disabled => None,
        };
        let no_gpus = matches!(self.gpus, Gpus::Unavailable(_));
        match (gpus, host) {
            (Some(gpus), Some(host)) => format!("{gpus} and {host}"),
            (Some(gpus), None) => gpus,
            (None, Some(host)) if no_gpus => format!("{host} (no GPUs)"),
            (None, Some(host)) => host.to_owned(),
            (None, None) => "nothing (no GPUs)".to_owned(),
        }
    }

    /// Samples every enabled source at `ts_us` and attributes the GPU rows
    /// to jobs. Each distinct failure is logged once as a warning, and at
    /// debug level after that; all of them are in the returned tick.
    pub fn sample(&mut self, ts_us: i64) -> Tick {
        let mut tick = Tick::new(ts_us);
        for sampler in &mut self.samplers {
            let before = tick.errors.len();
            sampler.sample(&mut tick);
            for e in &tick.errors[before..] {
                let text = e.to_string();
                let source = sampler.source().name();
                if self.reported.len() < MAX_REMEMBERED_ERRORS && self.reported.insert(text.clone())
                {
                    warn!(
                        source,
                        "{text}; further failures like it are logged at debug level"
                    );
                } else {
                    debug!(source, "{text}");
                }
            }
        }
        self.jobs.apply(&mut tick.batch, tick.processes_listed);
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
    use clap::Parser;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures");

    fn samplers(args: &[&str]) -> Samplers {
        samplers_on(&format!("{FIXTURES}/proc"), args)
    }

    /// Samplers on the fixture trees, with procfs at `proc`, and no NVML.
    fn samplers_on(proc: &str, args: &[&str]) -> Samplers {
        let sys = format!("{FIXTURES}/sys");
        let mut argv = vec![
            "gputel-agent",
            "--plaintext",
            "--node",
            "n",
            "--nvml-lib",
            "/nonexistent/libnvidia-ml.so.1",
            "--procfs-root",
            proc,
            "--sysfs-root",
            &sys,
        ];
        argv.extend_from_slice(args);
        let config = Config::load(&crate::config::Cli::parse_from(argv)).expect("config");
        Samplers::open(&config)
    }

    #[test]
    fn only_enabled_sources_are_sampled_and_described() {
        let mut all = samplers(&[]);
        assert!(matches!(all.gpus(), Gpus::Unavailable(why) if why.contains("/nonexistent")));
        assert_eq!(all.describe(), "the host (no GPUs)");
        let tick = all.sample(1_000_000);
        assert_eq!((tick.batch.node.len(), tick.batch.ib.len()), (1, 4));

        let mut ib = samplers(&["--sources", "ib"]);
        assert_eq!(ib.gpus(), &Gpus::Disabled);
        assert_eq!(ib.describe(), "InfiniBand ports");
        let tick = ib.sample(1_000_000);
        assert_eq!((tick.batch.node.len(), tick.batch.ib.len()), (0, 4));

        assert_eq!(samplers(&["--sources", "node"]).describe(), "the host");
        assert_eq!(
            samplers(&["--sources", "gpu"]).describe(),
            "nothing (no GPUs)"
        );
    }

    #[test]
    fn every_failure_is_in_the_tick_each_time_it_happens() {
        let root = tempfile::tempdir().expect("tempdir");
        let proc = root.path().to_str().expect("utf-8");
        // No stat, meminfo or loadavg: three errors, at every tick.
        let mut host = samplers_on(proc, &["--sources", "node"]);
        for ts in [1_000_000, 2_000_000] {
            let errors: Vec<String> = host
                .sample(ts)
                .errors
                .iter()
                .map(|e| e.to_string())
                .collect();
            assert_eq!(errors.len(), 3, "{errors:?}");
            assert!(
                errors[0].starts_with(&format!("cannot read {proc}/stat: ")),
                "{errors:?}"
            );
        }
    }

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
