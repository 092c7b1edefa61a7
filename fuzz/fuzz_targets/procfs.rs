//! The host sampler's reads of /proc (stat, meminfo, loadavg, twice, so CPU
//! shares are computed) and job attribution's parsers for /proc/PID/cgroup and
//! /proc/PID/environ, over arbitrary file contents: truncated, binary, huge
//! numbers. Nothing panics, and what is reported stays within its range.
#![no_main]

use arbitrary::Arbitrary;
use gputel_agent::jobs::{owner_from_cgroup, slurm_job_from_environ};
use gputel_agent::sampler::node::NodeSampler;
use gputel_agent::sampler::{Sampler, Tick};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct Proc {
    stat: [Vec<u8>; 2],
    meminfo: Vec<u8>,
    loadavg: Vec<u8>,
    cgroup: String,
    environ: Vec<u8>,
}

fuzz_target!(|input: Proc| {
    let root = tempfile::tempdir_in(gputel_fuzz::scratch_dir()).expect("a scratch directory");
    let write = |name: &str, bytes: &[u8]| {
        std::fs::write(root.path().join(name), bytes).expect("write a proc file");
    };
    write("meminfo", &input.meminfo);
    write("loadavg", &input.loadavg);
    let mut sampler = NodeSampler::new(root.path());
    for (n, stat) in input.stat.iter().enumerate() {
        write("stat", stat);
        let mut tick = Tick::new(n as i64 * 1_000_000);
        sampler.sample(&mut tick);
        let [sample] = tick.batch.node.as_slice() else {
            panic!("one node row per tick, got {}", tick.batch.node.len());
        };
        for share in [
            sample.cpu_user_pct,
            sample.cpu_system_pct,
            sample.cpu_iowait_pct,
            sample.cpu_idle_pct,
        ]
        .into_iter()
        .flatten()
        {
            assert!((0.0..=100.0).contains(&share), "CPU share {share}");
        }
    }
    let _ = owner_from_cgroup(&input.cgroup);
    if let Some(job) = slurm_job_from_environ(&input.environ) {
        assert!(!job.is_empty());
    }
});
