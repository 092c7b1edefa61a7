//! Inputs shared by gputel's benchmarks: where the fixture trees and the fake
//! NVML library are, a simulated cluster that produces the batches agents
//! send, the count of metric values in stored rows, and [`loadgen`], the
//! load generator behind `gputel-loadgen`.
//!
//! The simulated cluster is deterministic (a fixed-seed generator), so every
//! run measures the same bytes.

pub mod loadgen;

use std::f64::consts::TAU;
use std::path::{Path, PathBuf};

use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use gputel_agent::clock::Cadence;
use gputel_collector::buffer::WriteBuffer;
use gputel_collector::validate::validate_batch;
use gputel_proto::{Batch, GpuSample, IbPortSample, NodeSample};
use gputel_schemas::derive::CpuJiffies;
use gputel_schemas::{PartitionKey, Table};

/// 2024-06-12T16:00:00Z, an hour boundary: a simulated hour is one partition.
pub const START_US: i64 = 1_718_208_000_000_000;
/// One tick at the default 1 s interval.
pub const SECOND_US: i64 = 1_000_000;
/// GPUs on every node of a [`Cluster`] (an HGX H100 board).
pub const GPUS_PER_NODE: u32 = 8;
/// InfiniBand HCAs on every simulated node, one port each, as in the fixtures.
pub const IB_PORTS_PER_NODE: usize = 4;
/// The agent's default `--slow-read-interval`: what costs NVML milliseconds
/// (the energy counter, PCIe bytes and replays, GPM graphics activity, MIG
/// mode) is read at the first tick and then once every 10 s.
pub const SLOW_READ_US: i64 = 10 * SECOND_US;

/// Columns that say which row this is rather than what was measured.
pub const KEY_COLUMNS: &[&str] = &[
    "ts",
    "node",
    "gpu",
    "uuid",
    "model",
    "device",
    "port",
    "gpu_instance_id",
    "compute_instance_id",
];

/// True when the binary runs as a benchmark: `cargo bench` passes `--bench`,
/// `cargo test --benches` does not. Benches shrink their inputs in test mode,
/// which runs unoptimised and only checks that every benchmark works.
pub fn bench_mode() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// `tests/fixtures/`: the procfs and sysfs trees of one 8×H100 node.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// The fake `libgputel_fake_nvml.so`, if some build put it where Cargo puts
/// it: `target/<profile>/deps/` or `target/<profile>/`, this benchmark's
/// profile first, then `release` and `debug`.
pub fn fake_nvml_lib() -> Option<PathBuf> {
    let name = format!(
        "{}gputel_fake_nvml{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    // The bench executable lives in target/<profile>/deps/.
    let exe = std::env::current_exe().ok()?;
    let profile_dir = exe.parent()?.parent()?;
    let target_dir = profile_dir.parent()?;
    [
        profile_dir.to_owned(),
        target_dir.join("release"),
        target_dir.join("debug"),
    ]
    .into_iter()
    .flat_map(|dir| [dir.join("deps").join(&name), dir.join(&name)])
    .find(|p| p.is_file())
}

/// The columns of `table` that hold metric values.
///
/// A *metric value* is one value in a numeric (integer or floating-point)
/// column of a stored row that is not a key column ([`KEY_COLUMNS`]: time,
/// node, GPU index, UUID, model, IB device and port, MIG instance ids). So a `gpu` row holds 11
/// (temperature_c … fb_total_bytes), a `node` row 11 (cpu_count … load15) and
/// an `ib` row 9 (rate_gbps … rcv_packets_per_s); string columns such as the
/// port `state` are not metric values. Nulls are not counted.
pub fn metric_columns(table: Table) -> Vec<usize> {
    table
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| !KEY_COLUMNS.contains(&f.name().as_str()) && is_numeric(f.data_type()))
        .map(|(i, _)| i)
        .collect()
}

fn is_numeric(t: &DataType) -> bool {
    t.is_integer() || t.is_floating()
}

/// Metric values (see [`metric_columns`]) in one record batch of `table`.
pub fn metric_values(table: Table, batch: &RecordBatch) -> u64 {
    metric_columns(table)
        .into_iter()
        .map(|i| {
            let col = batch.column(i);
            (col.len() - col.null_count()) as u64
        })
        .sum()
}

/// A batch as one agent sends it, with the node name of its stream's hello.
#[derive(Debug, Clone)]
pub struct AgentBatch {
    pub node: String,
    pub batch: Batch,
}

/// Validates and buffers `batches`, then takes the buffer: the record batches
/// a flush of exactly these rows writes, one per table and partition.
pub fn buffer_and_take(batches: &[AgentBatch]) -> Vec<(Table, PartitionKey, RecordBatch)> {
    let now_us = batches
        .iter()
        .flat_map(|b| b.batch.node.iter().map(|n| n.ts_us))
        .max()
        .unwrap_or(START_US);
    let mut buffer = WriteBuffer::default();
    for b in batches {
        let valid = validate_batch(&b.batch, now_us).expect("simulated batches are valid");
        buffer.append(&b.node, valid);
    }
    buffer
        .take_batches()
        .expect("simulated rows fit their schemas")
}

/// Metric values in `batches` once stored.
pub fn dataset_metric_values(batches: &[AgentBatch]) -> u64 {
    buffer_and_take(batches)
        .iter()
        .map(|(table, _, rb)| metric_values(*table, rb))
        .sum()
}

/// `seconds` ticks of `nodes` simulated nodes from [`START_US`], in the order
/// a collector receives them: every node's batch of one tick, then the next tick.
pub fn simulate(nodes: usize, seconds: u32) -> Vec<AgentBatch> {
    simulate_values(nodes, seconds, Values::Realistic)
}

/// [`simulate`] with the sensors reporting `values`.
pub fn simulate_values(nodes: usize, seconds: u32, values: Values) -> Vec<AgentBatch> {
    let mut cluster = Cluster::new(nodes).with_values(values);
    let mut out = Vec::with_capacity(nodes * seconds as usize);
    for _ in 0..seconds {
        out.extend(cluster.tick());
    }
    out
}

/// Deterministic pseudo-random numbers (SplitMix64).
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// About normal, mean 0, standard deviation 1 (sum of 12 uniforms).
    fn normal(&mut self) -> f64 {
        (0..12).map(|_| self.unit()).sum::<f64>() - 6.0
    }
}

/// What the simulated sensors report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Values {
    /// A training cluster's telemetry, as [`SimNode`] describes it.
    #[default]
    Realistic,
    /// The worst case for compression: at every tick every gauge is drawn
    /// uniformly over its range (temperatures, power, clocks, utilization,
    /// framebuffer, CPU shares, memory, load) and every counter grows by a
    /// uniform random amount up to its hardware's maximum (energy up to
    /// 700 W, InfiniBand bytes up to 400 Gb/s, packets of 256 B to 4 KiB).
    /// Node names, GPUs, ports, jobs and timestamps are the realistic
    /// mode's, so the keys cost the same.
    Noise,
}

/// Simulated nodes of a training cluster, stepped one 1 s tick at a time:
/// [`GPUS_PER_NODE`] GPUs and [`IB_PORTS_PER_NODE`] ports each. See
/// [`SimNode`] for how one node behaves.
#[derive(Debug)]
pub struct Cluster {
    nodes: Vec<SimNode>,
}

impl Cluster {
    /// `nodes` nodes named `gpu-node-001`, … whose first tick is [`START_US`].
    pub fn new(nodes: usize) -> Self {
        Self {
            nodes: (0..nodes)
                .map(|i| {
                    let name = format!("gpu-node-{:03}", i + 1);
                    SimNode::new(i, name, GPUS_PER_NODE, START_US, SECOND_US)
                })
                .collect(),
        }
    }

    /// The same nodes, reporting `values`.
    pub fn with_values(mut self, values: Values) -> Self {
        self.nodes = self
            .nodes
            .into_iter()
            .map(|n| n.with_values(values))
            .collect();
        self
    }

    /// Every node's batch for the next tick.
    pub fn tick(&mut self) -> Vec<AgentBatch> {
        self.nodes
            .iter_mut()
            .map(|n| AgentBatch {
                node: n.name.clone(),
                batch: n.next_batch(),
            })
            .collect()
    }
}

/// One simulated node of a training cluster, stepped one tick at a time.
///
/// The node runs jobs (30–120 min) separated by idle gaps (2–10 min); about
/// one node in five starts idle; a job's id is on all its GPUs' rows. A
/// training job has an iteration period of 5–12 s that GPU power and memory
/// traffic follow, a gradient all-reduce at InfiniBand line rate in the last
/// 35 % of each iteration (the ports are quiet in between, and flat on idle
/// nodes but for the subnet manager's packets now and then), and a
/// checkpoint every 15–30 min (40 s of low GPU load and disk I/O). Sensors
/// behave as NVML and the kernel report them: temperatures follow power with
/// a 20 s lag in whole °C, power in mW with noise, energy and IB counters
/// only grow, clocks in the H100's 15 MHz steps, CPU shares from whole
/// jiffies of 224 CPUs, load averages with two decimals. Ticks of any
/// length advance this simulated time by their length: counters grow and
/// sensors settle accordingly, rates stay per second.
#[derive(Debug)]
pub struct SimNode {
    name: String,
    rng: Rng,
    seq: u64,
    /// The next tick's timestamp.
    ts_us: i64,
    interval_us: i64,
    /// Simulated time since the start, and its whole seconds.
    elapsed_us: i64,
    t: u32,
    busy: bool,
    /// The node's number in its cluster, part of its job ids.
    index: usize,
    /// Jobs this node has started.
    jobs_started: u32,
    /// The running job's id, as Slurm's: a number, unique in the cluster.
    job_id: Option<String>,
    /// Time left in the current job or idle gap.
    left_us: i64,
    iter_period_s: f64,
    ckpt_every_s: u32,
    ckpt_offset_s: u32,
    gpus: Vec<GpuSim>,
    ports: Vec<PortSim>,
    mem_available_kib: f64,
    /// CPU time since boot, in jiffies: user, system, iowait, idle, steal.
    cpu_jiffies: [u64; 5],
    load: [f64; 3],
    values: Values,
    every_field: bool,
    /// [`every_node_field`]'s energy counters: packages, DRAM.
    rapl_energy_uj: [u64; 2],
    /// When the agent's slow-read ticks come.
    slow_reads: Cadence,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    Train,
    Checkpoint,
}

/// H100 SXM5: 81559 MiB of framebuffer, 540 MiB of it reserved by the driver.
const FB_TOTAL: u64 = 85_520_809_984;
const FB_RESERVED: u64 = 566_231_040;
const MIB: u64 = 1 << 20;
/// 224 CPUs at USER_HZ 100: jiffies in one second.
const CPUS: u32 = 224;
const MEM_TOTAL_KIB: u64 = 2_113_389_424;
const CHECKPOINT_S: u32 = 40;

#[derive(Debug)]
struct GpuSim {
    index: u32,
    uuid: String,
    /// Watts this board draws above or below its siblings under the same load.
    power_offset_w: f64,
    /// Cooling: °C this slot runs above or below its siblings.
    temp_offset_c: f64,
    power_w: f64,
    temp_c: f64,
    energy_mj: u64,
    fb_used: u64,
    /// The time and energy counter of the last slow-read tick.
    last_slow_read: Option<(i64, u64)>,
}

#[derive(Debug)]
struct PortSim {
    device: String,
    xmit_bytes: u64,
    rcv_bytes: u64,
    xmit_packets: u64,
    rcv_packets: u64,
}

impl SimNode {
    /// Node number `index` of a cluster (which fixes its random stream), named
    /// `name`, with `gpus` GPUs and [`IB_PORTS_PER_NODE`] ports, whose first
    /// tick is at `start_us` and the next ones `interval_us` apart (at least 1).
    pub fn new(index: usize, name: String, gpus: u32, start_us: i64, interval_us: i64) -> Self {
        let i = index;
        let mut rng = Rng(0x6770_7574_656c ^ (i as u64).wrapping_mul(0x1000_0001));
        let busy = rng.unit() > 0.2;
        let left_s = if busy {
            rng.range(300.0, 7200.0)
        } else {
            rng.range(120.0, 600.0)
        } as u32;
        let gpus = (0..gpus)
            .map(|g| {
                let power_w = if busy { 450.0 } else { 70.0 };
                GpuSim {
                    index: g,
                    uuid: format!(
                        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
                        rng.next_u64() as u32,
                        rng.next_u64() as u16,
                        0x4000 | (rng.next_u64() as u16 & 0x0fff),
                        0x8000 | (rng.next_u64() as u16 & 0x3fff),
                        rng.next_u64() & 0xffff_ffff_ffff
                    ),
                    power_offset_w: 8.0 * rng.normal(),
                    temp_offset_c: 2.0 * rng.normal(),
                    power_w,
                    temp_c: 30.0 + 0.075 * power_w,
                    // About nine days since the driver loaded, at ~400 W.
                    energy_mj: (rng.range(2.8e11, 3.4e11)) as u64,
                    fb_used: 0,
                    last_slow_read: None,
                }
            })
            .collect();
        let ports = (0..IB_PORTS_PER_NODE)
            .map(|p| {
                let xmit_bytes = 4 * rng.range(1.9e15, 2.0e15) as u64;
                let rcv_bytes = 4 * rng.range(1.9e15, 2.0e15) as u64;
                PortSim {
                    device: format!("mlx5_{p}"),
                    xmit_bytes,
                    rcv_bytes,
                    xmit_packets: xmit_bytes / 840,
                    rcv_packets: rcv_bytes / 840,
                }
            })
            .collect();
        let mut node = Self {
            name,
            seq: 0,
            ts_us: start_us,
            interval_us: interval_us.max(1),
            elapsed_us: 0,
            t: 0,
            busy,
            index,
            jobs_started: 0,
            job_id: None,
            left_us: i64::from(left_s) * SECOND_US,
            iter_period_s: 0.0,
            ckpt_every_s: 0,
            ckpt_offset_s: 0,
            gpus,
            ports,
            mem_available_kib: rng.range(1.80e9, 1.95e9),
            // About nine days since boot, a third of it busy.
            cpu_jiffies: {
                let total = 9.0 * 86_400.0 * f64::from(CPUS * 100);
                let mut share = |s: f64| (total * s * rng.range(0.9, 1.1)) as u64;
                let (user, system, iowait) = (share(0.3), share(0.05), share(0.005));
                let idle = total as u64 - user - system - iowait;
                [user, system, iowait, idle, 0]
            },
            load: [if busy { 24.0 } else { 1.0 }; 3],
            values: Values::Realistic,
            every_field: false,
            rapl_energy_uj: [0; 2],
            slow_reads: Cadence::new(SLOW_READ_US),
            rng,
        };
        node.start_phase();
        node
    }

    /// The same node, reporting `values` from its next tick on.
    pub fn with_values(mut self, values: Values) -> Self {
        self.values = values;
        self
    }

    /// The same node, also filling every field a real HGX H100 node under
    /// Slurm reports ([`every_gpu_field`], [`every_port_field`],
    /// [`every_node_field`]), not only those the realistic mode draws; the
    /// added values are derived from the drawn ones, so the drawn ones are
    /// the same either way.
    pub fn with_every_field(mut self, every_field: bool) -> Self {
        self.every_field = every_field;
        self
    }

    /// The same node, reading its slow columns every `interval_us` instead
    /// of the agent's default [`SLOW_READ_US`] (0: at every tick).
    pub fn with_slow_read_interval(mut self, interval_us: i64) -> Self {
        self.slow_reads = Cadence::new(interval_us);
        self
    }

    /// Draws the parameters of the job (or idle gap) that starts now.
    fn start_phase(&mut self) {
        self.job_id = self.busy.then(|| {
            self.jobs_started += 1;
            (1_000_000 + self.index as u64 * 1000 + u64::from(self.jobs_started)).to_string()
        });
        let rng = &mut self.rng;
        self.iter_period_s = rng.range(5.0, 12.0);
        self.ckpt_every_s = rng.range(900.0, 1800.0) as u32;
        self.ckpt_offset_s = self.t + (rng.unit() * self.ckpt_every_s as f64) as u32;
        // A job's framebuffer footprint: the caching allocator grabs most of it.
        let job_fb = (rng.range(58.0, 76.0) * 1024.0) as u64 * MIB;
        for gpu in &mut self.gpus {
            gpu.fb_used = if self.busy {
                job_fb + (rng.range(0.0, 600.0) as u64) * MIB
            } else {
                0
            };
        }
    }

    fn phase(&self) -> Phase {
        if !self.busy {
            Phase::Idle
        } else if (self.t + self.ckpt_every_s - self.ckpt_offset_s % self.ckpt_every_s)
            % self.ckpt_every_s
            < CHECKPOINT_S
        {
            Phase::Checkpoint
        } else {
            Phase::Train
        }
    }

    /// The node name the rows belong to.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The batch of the next tick, with the next sequence number (from 1).
    pub fn next_batch(&mut self) -> Batch {
        let ts_us = self.ts_us;
        self.ts_us += self.interval_us;
        if self.left_us <= 0 {
            self.busy = !self.busy;
            let left_s = if self.busy {
                self.rng.range(1800.0, 7200.0)
            } else {
                self.rng.range(120.0, 600.0)
            } as u32;
            self.left_us = i64::from(left_s) * SECOND_US;
            self.start_phase();
        }
        self.left_us -= self.interval_us;
        let before_s = self.t;
        self.elapsed_us += self.interval_us;
        self.t = (self.elapsed_us / SECOND_US) as u32;
        self.seq += 1;
        let dt = self.interval_us as f64 / SECOND_US as f64;
        let phase = self.phase();
        // Where in the training iteration this tick falls.
        let theta = TAU * (self.elapsed_us as f64 / SECOND_US as f64) / self.iter_period_s;

        let job_id = &self.job_id;
        let noise = self.values == Values::Noise;
        let gpu: Vec<GpuSample> = self
            .gpus
            .iter_mut()
            .map(|g| {
                let energy_mj = g.energy_mj;
                let sample = g.tick(ts_us, dt, phase, theta, &mut self.rng);
                let sample = if noise {
                    g.energy_mj = energy_mj;
                    g.noise(sample, dt, &mut self.rng)
                } else {
                    sample
                };
                GpuSample {
                    job_id: job_id.clone(),
                    job_count: u32::from(job_id.is_some()),
                    ..sample
                }
            })
            .collect();
        let cpu_before = self.cpu_jiffies;
        let node = self.node_sample(ts_us, dt, before_s, phase);
        let node = if noise {
            self.cpu_jiffies = cpu_before;
            node_noise(node, &mut self.cpu_jiffies, dt, &mut self.rng)
        } else {
            node
        };
        let end_s = self.elapsed_us as f64 / SECOND_US as f64;
        let burst_s = all_reduce_seconds(end_s - dt, end_s, self.iter_period_s);
        let ib: Vec<IbPortSample> = self
            .ports
            .iter_mut()
            .map(|p| {
                let before = p.counters();
                let sample = p.tick(ts_us, dt, phase, burst_s, &mut self.rng);
                if noise {
                    p.set_counters(before);
                    p.noise(sample, dt, &mut self.rng)
                } else {
                    sample
                }
            })
            .collect();
        let (gpu, node, ib) = if self.every_field {
            let jobs = self.job_id.iter().cloned().collect();
            (
                gpu.into_iter().map(|s| every_gpu_field(s, phase)).collect(),
                every_node_field(node, jobs, &mut self.rapl_energy_uj, dt),
                ib.into_iter().map(every_port_field).collect(),
            )
        } else {
            (gpu, node, ib)
        };
        let slow = self.slow_reads.due(ts_us);
        let gpu = gpu
            .into_iter()
            .zip(&mut self.gpus)
            .map(|(s, g)| g.as_sent(s, slow))
            .collect();
        Batch {
            seq: self.seq,
            gpu,
            node: vec![node],
            ib,
            ..Batch::default()
        }
    }

    #[allow(
        clippy::needless_update,
        reason = "the protocol may gain fields; rows leave them unset"
    )]
    /// `dt`: the tick's length in seconds; `before_s`: whole seconds of
    /// simulated time before it.
    fn node_sample(&mut self, ts_us: i64, dt: f64, before_s: u32, phase: Phase) -> NodeSample {
        let rng = &mut self.rng;
        // CPU shares as the agent computes them: whole jiffies over all CPUs.
        let total = f64::from(CPUS * 100) * dt + (15.0 * rng.normal()).round();
        let (user, system, iowait) = match phase {
            Phase::Train => (
                0.28 + 0.03 * rng.normal(),
                0.04 + 0.005 * rng.normal(),
                0.002 * rng.unit(),
            ),
            Phase::Checkpoint => (
                0.12 + 0.02 * rng.normal(),
                0.09 + 0.01 * rng.normal(),
                0.06 + 0.01 * rng.normal(),
            ),
            Phase::Idle => (0.004 * rng.unit(), 0.003 * rng.unit(), 0.0),
        };
        let jiffies = |share: f64| (total * share.max(0.0)).round() as u64;
        let (user, system, iowait) = (jiffies(user), jiffies(system), jiffies(iowait));
        let idle = (total as u64).saturating_sub(user + system + iowait);
        let cpu_tick = [user, system, iowait, idle, 0];

        // Page cache grows under training I/O and drops after checkpoints.
        let drift_kib = match phase {
            Phase::Train => -200.0 + 3000.0 * rng.normal(),
            Phase::Checkpoint => -40_000.0 + 20_000.0 * rng.normal(),
            Phase::Idle => 50.0 + 200.0 * rng.normal(),
        };
        self.mem_available_kib = (self.mem_available_kib + drift_kib * dt).clamp(1.2e9, 2.0e9);

        // The kernel recomputes load averages every 5 s and prints two decimals.
        for _ in before_s / 5..self.t / 5 {
            let runnable = match phase {
                Phase::Train => 24.0 + (3.0 * rng.normal()).round(),
                Phase::Checkpoint => 31.0 + (4.0 * rng.normal()).round(),
                Phase::Idle => (rng.unit() * 3.0).floor(),
            };
            for (load, minutes) in self.load.iter_mut().zip([1.0_f64, 5.0, 15.0]) {
                let decay = (-5.0 / (60.0 * minutes)).exp();
                *load = *load * decay + runnable * (1.0 - decay);
            }
        }
        let two_decimals = |v: f64| ((v * 100.0).round() / 100.0) as f32;

        let mut row = NodeSample {
            ts_us,
            cpu_count: CPUS,
            memory_total_kib: Some(MEM_TOTAL_KIB),
            memory_available_kib: Some(self.mem_available_kib as u64),
            load1: Some(two_decimals(self.load[0])),
            load5: Some(two_decimals(self.load[1])),
            load15: Some(two_decimals(self.load[2])),
            ..NodeSample::default()
        };
        add_jiffies(&mut self.cpu_jiffies, cpu_tick, &mut row);
        row
    }
}

/// PCI bus of each GPU of an HGX H100 board, as NVML prints it.
const HGX_BUSES: [u8; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

/// [`SimNode::with_every_field`]: what an H100 SXM reports beyond the drawn
/// fields, outside MIG mode and under Slurm (so no pod): the fields NVML
/// answers on it. Retired pages (row remapping replaced them) and the fan
/// (an SXM board has none) stay unset, as NVML answers "not supported".
/// Profiling metrics follow utilization, the clock-event reasons the phase
/// and the power draw; error counters are zero, as on a healthy GPU.
fn every_gpu_field(s: GpuSample, phase: Phase) -> GpuSample {
    let util = f64::from(s.gpu_util_pct.unwrap_or(0));
    let copy = f64::from(s.memory_copy_util_pct.unwrap_or(0));
    let power_mw = s.power_mw.unwrap_or(0);
    let pct = |v: f64| Some(((v * 10.0).round() / 10.0) as f32);
    let reasons = match phase {
        Phase::Idle => gputel_proto::clock_event_reasons::GPU_IDLE,
        _ if power_mw > 660_000 => gputel_proto::clock_event_reasons::SW_POWER_CAP,
        _ => 0,
    };
    // NVLink carries the tensor-parallel traffic while training.
    let nvlink = match phase {
        Phase::Train => (copy * 2.5e9) as u64,
        _ => 0,
    };
    GpuSample {
        pci_bus_id: Some(format!(
            "00000000:{:02X}:00.0",
            HGX_BUSES[s.gpu as usize % HGX_BUSES.len()]
        )),
        enc_util_pct: Some(0),
        dec_util_pct: Some(0),
        fb_reserved_bytes: Some(FB_RESERVED),
        sm_active_pct: pct(util * 0.82),
        sm_occupancy_pct: pct(util * 0.31),
        tensor_active_pct: pct(util * 0.47),
        dram_active_pct: pct(copy * 1.4),
        gr_engine_active_pct: pct(util * 0.97),
        profiling_source: Some(gputel_proto::ProfilingSource::Gpm as i32),
        power_limit_mw: Some(700_000),
        power_avg_mw: Some(power_mw),
        clock_event_reasons: Some(reasons),
        ecc_corrected_volatile: Some(0),
        ecc_uncorrected_volatile: Some(0),
        ecc_corrected_aggregate: Some(0),
        ecc_uncorrected_aggregate: Some(0),
        remapped_rows_corrected: Some(0),
        remapped_rows_uncorrected: Some(0),
        remapped_rows_pending: Some(false),
        remapped_rows_failure: Some(false),
        pcie_replay_count: Some(0),
        pcie_tx_bytes_per_s: Some((copy * 1.0e8) as u64),
        pcie_rx_bytes_per_s: Some((copy * 1.2e8) as u64),
        nvlink_tx_bytes_per_s: Some(nvlink),
        nvlink_rx_bytes_per_s: Some(nvlink),
        mig_mode: Some(false),
        pcie_link_gen: Some(if phase == Phase::Idle { 1 } else { 5 }),
        pcie_link_gen_max: Some(5),
        pcie_link_width: Some(16),
        pcie_link_width_max: Some(16),
        performance_state: Some(0),
        ..s
    }
}

/// [`SimNode::with_every_field`]: a ConnectX-7 port's identity and the
/// counters the drawn ones leave unset. On a healthy fabric the error
/// counters stay at zero; unicast packets are the data packets.
fn every_port_field(p: IbPortSample) -> IbPortSample {
    IbPortSample {
        symbol_error: Some(0),
        link_downed: Some(0),
        link_error_recovery: Some(0),
        port_rcv_errors: Some(0),
        port_xmit_discards: Some(0),
        port_xmit_wait: Some(0),
        hw_out_of_buffer: Some(0),
        hw_out_of_sequence: Some(0),
        hw_packet_seq_err: Some(0),
        hw_local_ack_timeout_err: Some(0),
        hw_rnr_nak_retry_err: Some(0),
        hw_implied_nak_seq_err: Some(0),
        unicast_xmit_packets: p.xmit_packets,
        unicast_rcv_packets: p.rcv_packets,
        multicast_xmit_packets: Some(0),
        multicast_rcv_packets: Some(0),
        port_rcv_constraint_errors: Some(0),
        port_xmit_constraint_errors: Some(0),
        port_rcv_remote_physical_errors: Some(0),
        port_rcv_switch_relay_errors: Some(0),
        local_link_integrity_errors: Some(0),
        excessive_buffer_overrun_errors: Some(0),
        vl15_dropped: Some(0),
        port_rcv_discards: Some(0),
        state_id: Some(4),
        phys_state: Some("5: LinkUp".to_owned()),
        phys_state_id: Some(5),
        link_layer: Some("InfiniBand".to_owned()),
        board_id: Some("MT_0000000838".to_owned()),
        fw_ver: Some("28.39.2048".to_owned()),
        hca_type: Some("MT4129".to_owned()),
        node_guid: Some(format!(
            "a088:c203:0012:6e{:02x}",
            p.device.bytes().last().unwrap_or(0)
        )),
        ..p
    }
}

/// [`SimNode::with_every_field`]: the node's jobs and its RAPL energy
/// counters (two packages and their DRAM), which grow with the CPU load.
/// [`SimNode::with_every_field`]: the node's jobs and its RAPL readings (two
/// packages and their DRAM), which follow the load average: the energy
/// counters grow by the power over the tick.
fn every_node_field(
    n: NodeSample,
    jobs: Vec<String>,
    energy_uj: &mut [u64; 2],
    dt: f64,
) -> NodeSample {
    // Two 350 W packages idle at 120 W each; DRAM at a fifth of that.
    let cpu_w = (240.0 + 8.0 * f64::from(n.load1.unwrap_or(0.0))).round();
    let dram_w = (cpu_w / 5.0).round();
    energy_uj[0] += (cpu_w * dt * 1e6) as u64;
    energy_uj[1] += (dram_w * dt * 1e6) as u64;
    NodeSample {
        jobs,
        cpu_package_energy_uj: Some(energy_uj[0]),
        dram_energy_uj: Some(energy_uj[1]),
        cpu_package_power_w: Some(cpu_w),
        dram_power_w: Some(dram_w),
        ..n
    }
}

impl GpuSim {
    #[allow(
        clippy::needless_update,
        reason = "the protocol may gain fields; rows leave them unset"
    )]
    /// `dt`: the tick's length in seconds.
    fn tick(&mut self, ts_us: i64, dt: f64, phase: Phase, theta: f64, rng: &mut Rng) -> GpuSample {
        let target_w = match phase {
            Phase::Train => 560.0 + 110.0 * theta.sin() + self.power_offset_w + 12.0 * rng.normal(),
            Phase::Checkpoint => 140.0 + 0.5 * self.power_offset_w + 10.0 * rng.normal(),
            // An idle H200 read once a second moved by a median 56 mW
            // (tests/fixtures/h200-recording); this gives about 70 mW.
            Phase::Idle => 69.0 + 0.1 * self.power_offset_w + 0.15 * rng.normal(),
        };
        // NVML's power reading averages over about a second.
        let settle = (0.6 * dt).min(1.0);
        self.power_w = (self.power_w + settle * (target_w - self.power_w)).clamp(60.0, 700.0);
        let power_mw = (self.power_w * 1000.0).round() as u32;
        self.energy_mj += (f64::from(power_mw) * dt).round() as u64; // dt s at power_mw mW
        let target_c = 27.0 + 0.075 * self.power_w + self.temp_offset_c;
        // Temperature lags power by about 20 s.
        self.temp_c += (target_c - self.temp_c) / (20.0 / dt).max(1.0) + 0.15 * rng.normal();
        let memory_temp_c = self.temp_c + 5.0 + 0.004 * self.power_w;

        // Boost clock unless the board is at its power limit; idle GPUs park.
        let sm_clock_mhz = match phase {
            Phase::Idle => 345,
            _ if self.power_w > 660.0 => {
                1980 - 15 * (((self.power_w - 660.0) / 6.0) as u32).min(14)
            }
            _ => 1980,
        };
        let (gpu_util, copy_util) = match phase {
            Phase::Train => (
                100.0 - (1.2 * rng.normal()).abs().floor(),
                35.0 + 12.0 * (theta + 1.0).sin() + 3.0 * rng.normal(),
            ),
            Phase::Checkpoint => (rng.range(0.0, 25.0), rng.range(0.0, 8.0)),
            Phase::Idle => (0.0, 0.0),
        };
        // The caching allocator now and then grows or returns a few MiB.
        if phase != Phase::Idle && rng.unit() < dt / 600.0 {
            let step = (rng.range(2.0, 64.0) as u64) * MIB;
            self.fb_used = if rng.unit() < 0.6 {
                (self.fb_used + step).min(FB_TOTAL - FB_RESERVED)
            } else {
                self.fb_used.saturating_sub(step)
            };
        }
        let pct = |v: f64| v.clamp(0.0, 100.0).round() as u32;
        GpuSample {
            ts_us,
            gpu: self.index,
            uuid: self.uuid.clone(),
            model: "NVIDIA H100 80GB HBM3".to_owned(),
            temperature_c: Some(self.temp_c.round() as u32),
            memory_temperature_c: Some(memory_temp_c.round() as u32),
            power_mw: Some(power_mw),
            energy_mj: Some(self.energy_mj),
            sm_clock_mhz: Some(sm_clock_mhz),
            memory_clock_mhz: Some(2619),
            gpu_util_pct: Some(pct(gpu_util)),
            memory_copy_util_pct: Some(pct(copy_util)),
            fb_used_bytes: Some(self.fb_used),
            fb_free_bytes: Some(FB_TOTAL - FB_RESERVED - self.fb_used),
            fb_total_bytes: Some(FB_TOTAL),
            ..GpuSample::default()
        }
    }

    /// `s` as the agent sends it: the columns read only at slow-read ticks
    /// (see [`SLOW_READ_US`]) null between them; at the first slow-read
    /// tick also null those that span two (average power, PCIe rates, GPM
    /// graphics activity); at later ones, average power since the last.
    fn as_sent(&mut self, mut s: GpuSample, slow: bool) -> GpuSample {
        if !slow {
            gputel_agent::sampler::gpu::clear_slow_readings(&mut s);
            return s;
        }
        let now = (s.ts_us, s.energy_mj.unwrap_or(0));
        match self.last_slow_read.replace(now) {
            None => GpuSample {
                power_avg_mw: None,
                pcie_tx_bytes_per_s: None,
                pcie_rx_bytes_per_s: None,
                gr_engine_active_pct: None,
                ..s
            },
            Some((ts_us, energy_mj)) => {
                // mJ per µs × 10⁶: mW.
                let avg_mw = (now.1 - energy_mj) * 1_000_000 / (now.0 - ts_us).max(1) as u64;
                GpuSample {
                    power_avg_mw: s.power_avg_mw.map(|_| avg_mw as u32),
                    ..s
                }
            }
        }
    }
}

impl PortSim {
    #[allow(
        clippy::needless_update,
        reason = "the protocol may gain fields; rows leave them unset"
    )]
    /// `dt`: the tick's length in seconds; `burst_s`: how much of it the
    /// job's all-reduce bursts took ([`all_reduce_seconds`]).
    fn tick(
        &mut self,
        ts_us: i64,
        dt: f64,
        phase: Phase,
        burst_s: f64,
        rng: &mut Rng,
    ) -> IbPortSample {
        let bytes_per_s = match phase {
            // Gradient all-reduce runs near line rate (400 Gb/s, about 46
            // GB/s achieved) in bursts; between them the port is quiet.
            Phase::Train => {
                let burst = 4.6e10 * (1.0 + 0.03 * rng.normal()) * burst_s / dt;
                burst + idle_port_bytes(dt, rng) / dt
            }
            // Checkpoint writes to storage over the same fabric.
            Phase::Checkpoint => 1.5e9 * (1.0 + 0.2 * rng.normal()),
            Phase::Idle => idle_port_bytes(dt, rng) / dt,
        }
        .max(0.0);
        // The data counters count 4-byte words.
        let words = |bytes: f64| 4 * (bytes / 4.0).round() as u64;
        let xmit = words(bytes_per_s * dt);
        let rcv = words(bytes_per_s * dt * (1.0 + 0.01 * rng.normal()));
        // Mostly 4 KiB MTU packets, with small control messages among them.
        let mut packets = |bytes: u64| (bytes as f64 / rng.range(3900.0, 4100.0)).ceil() as u64;
        let (xmit_packets, rcv_packets) = (packets(xmit), packets(rcv));
        let sample = IbPortSample {
            ts_us,
            device: self.device.clone(),
            port: 1,
            state: "ACTIVE".to_owned(),
            rate_gbps: Some(400.0),
            ..IbPortSample::default()
        };
        self.advance([xmit, rcv, xmit_packets, rcv_packets], sample)
    }
}

/// Share of a training iteration its gradient all-reduce keeps the ports
/// busy: the backward pass's second half, overlapped with compute.
const ALL_REDUCE_SHARE: f64 = 0.35;

/// Seconds of [`t0`, `t1`) (simulated time) that fall in an all-reduce
/// burst of a job iterating every `period_s`: the last
/// [`ALL_REDUCE_SHARE`] of each iteration. Sampled once a second against
/// iterations of 5–12 s, some ticks see a whole burst, some part of one and
/// some none, so a busy port's counters alternate between flat and steep.
fn all_reduce_seconds(t0: f64, t1: f64, period_s: f64) -> f64 {
    if period_s <= 0.0 || t1 <= t0 {
        return 0.0;
    }
    let start_in_period = (1.0 - ALL_REDUCE_SHARE) * period_s;
    let first = (t0 / period_s).floor() as i64 - 1;
    let last = (t1 / period_s).floor() as i64 + 1;
    (first..=last)
        .map(|k| {
            let a = k as f64 * period_s + start_in_period;
            let b = a + ALL_REDUCE_SHARE * period_s;
            (b.min(t1) - a.max(t0)).max(0.0)
        })
        .sum()
}

/// Bytes an unused port moves in `dt` seconds: none, but for the subnet
/// manager's sweeps and the odd management datagram (one tick in ten, a few
/// hundred bytes), so its counters stay flat most ticks.
fn idle_port_bytes(dt: f64, rng: &mut Rng) -> f64 {
    if rng.unit() < 0.1 * dt {
        rng.range(256.0, 2048.0)
    } else {
        0.0
    }
}

/// Adds one tick's jiffies (user, system, iowait, idle, steal) to the
/// node's counters and puts the counters in `row`'s CPU fields.
fn add_jiffies(counters: &mut [u64; 5], tick: [u64; 5], row: &mut NodeSample) {
    for (c, t) in counters.iter_mut().zip(tick) {
        *c += t;
    }
    CpuJiffies::from(*counters).write_to(row);
}

/// [`Values::Noise`]: a node row's gauges drawn uniformly over their range,
/// its CPU time split between the modes at random.
fn node_noise(sample: NodeSample, cpu: &mut [u64; 5], dt: f64, rng: &mut Rng) -> NodeSample {
    let total = (f64::from(CPUS * 100) * dt).round() as u64;
    let mut left = total;
    let mut jiffies = || {
        let part = (rng.unit() * left as f64).round() as u64;
        left -= part;
        part
    };
    let (user, system, iowait, steal) = (jiffies(), jiffies(), jiffies(), jiffies());
    let idle = total - user - system - iowait - steal;
    let available_kib = rng.range(0.0, MEM_TOTAL_KIB as f64) as u64;
    let mut load = || Some((rng.range(0.0, f64::from(CPUS)) * 100.0).round() as f32 / 100.0);
    let mut row = NodeSample {
        memory_available_kib: Some(available_kib),
        load1: load(),
        load5: load(),
        load15: load(),
        ..sample
    };
    add_jiffies(cpu, [user, system, iowait, idle, steal], &mut row);
    row
}

impl GpuSim {
    /// [`Values::Noise`]: the sample's gauges drawn uniformly over their
    /// range, the energy counter grown by up to 700 W × `dt`.
    fn noise(&mut self, sample: GpuSample, dt: f64, rng: &mut Rng) -> GpuSample {
        let mut uniform = |lo: u32, hi: u32| rng.range(f64::from(lo), f64::from(hi) + 1.0) as u32;
        let power_mw = uniform(60_000, 700_000);
        let (temperature_c, memory_temperature_c) = (uniform(25, 90), uniform(30, 95));
        let (sm_clock_mhz, memory_clock_mhz) = (uniform(210, 1980), uniform(1593, 2619));
        let (gpu_util_pct, memory_copy_util_pct) = (uniform(0, 100), uniform(0, 100));
        self.energy_mj += (rng.range(0.0, 700_000.0) * dt).round() as u64;
        let fb_used = rng.range(0.0, (FB_TOTAL - FB_RESERVED) as f64) as u64;
        GpuSample {
            temperature_c: Some(temperature_c),
            memory_temperature_c: Some(memory_temperature_c),
            power_mw: Some(power_mw),
            energy_mj: Some(self.energy_mj),
            sm_clock_mhz: Some(sm_clock_mhz),
            memory_clock_mhz: Some(memory_clock_mhz),
            gpu_util_pct: Some(gpu_util_pct),
            memory_copy_util_pct: Some(memory_copy_util_pct),
            fb_used_bytes: Some(fb_used),
            fb_free_bytes: Some(FB_TOTAL - FB_RESERVED - fb_used),
            ..sample
        }
    }
}

impl PortSim {
    /// Adds one tick's bytes and packets (transmitted, received) to the
    /// counters: `sample` with the counters.
    fn advance(&mut self, [xmit, rcv, xp, rp]: [u64; 4], sample: IbPortSample) -> IbPortSample {
        self.xmit_bytes += xmit;
        self.rcv_bytes += rcv;
        self.xmit_packets += xp;
        self.rcv_packets += rp;
        IbPortSample {
            xmit_bytes: Some(self.xmit_bytes),
            rcv_bytes: Some(self.rcv_bytes),
            xmit_packets: Some(self.xmit_packets),
            rcv_packets: Some(self.rcv_packets),
            ..sample
        }
    }

    fn counters(&self) -> [u64; 4] {
        [
            self.xmit_bytes,
            self.rcv_bytes,
            self.xmit_packets,
            self.rcv_packets,
        ]
    }

    fn set_counters(&mut self, [xb, rb, xp, rp]: [u64; 4]) {
        (
            self.xmit_bytes,
            self.rcv_bytes,
            self.xmit_packets,
            self.rcv_packets,
        ) = (xb, rb, xp, rp);
    }

    /// [`Values::Noise`]: the counters grown by a uniform random amount, up
    /// to 400 Gb/s in packets of 256 B to 4 KiB.
    fn noise(&mut self, sample: IbPortSample, dt: f64, rng: &mut Rng) -> IbPortSample {
        let mut bytes = || 4 * (rng.range(0.0, 5.0e10 * dt) / 4.0) as u64;
        let (xmit, rcv) = (bytes(), bytes());
        let mut packets = |bytes: u64| (bytes as f64 / rng.range(256.0, 4096.0)) as u64;
        let (xmit_packets, rcv_packets) = (packets(xmit), packets(rcv));
        self.advance([xmit, rcv, xmit_packets, rcv_packets], sample)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_of_each_table_holds_the_documented_metric_values() {
        assert_eq!(metric_columns(Table::Gpu).len(), 43);
        assert_eq!(metric_columns(Table::Node).len(), 15);
        assert_eq!(metric_columns(Table::Ib).len(), 29);
    }

    #[test]
    fn every_field_adds_what_a_real_node_reports_and_keeps_the_drawn_values() {
        let node = |every| {
            SimNode::new(2, "n-1".to_owned(), 8, START_US, SECOND_US).with_every_field(every)
        };
        let (mut plain, mut full) = (node(false), node(true));
        let mut last_energy: Option<u64> = None;
        for k in 0..900 {
            let (p, f) = (plain.next_batch(), full.next_batch());
            validate_batch(&f, START_US + 3600 * SECOND_US).expect("a full batch is valid");
            // Slow reads every 10 s from the first tick (START_US is a
            // multiple of 10 s).
            let slow = k % 10 == 0;
            for (p, f) in p.gpu.iter().zip(&f.gpu) {
                assert_eq!(
                    (p.power_mw, p.energy_mj, p.temperature_c),
                    (f.power_mw, f.energy_mj, f.temperature_c)
                );
                assert_eq!(f.power_limit_mw, Some(700_000));
                // As NVML answers on an H100 SXM: no retired pages, no fan, no MIG.
                assert_eq!(
                    (f.retired_pages_sbe, f.fan_speed_pct, f.gpu_instance_id),
                    (None, None, None)
                );
                assert_eq!(f.mig_mode, slow.then_some(false));
                assert_eq!(f.energy_mj.is_some(), slow);
                // Average power and graphics activity span two slow reads.
                let spans = slow && k > 0;
                assert_eq!(f.gr_engine_active_pct.is_some(), spans);
                assert_eq!(f.pcie_tx_bytes_per_s.is_some(), spans);
            }
            let gpu0 = &f.gpu[0];
            if slow {
                if let Some(before) = last_energy {
                    // 10 s at the average power, in mJ, to within rounding.
                    let used = gpu0.energy_mj.unwrap() - before;
                    let avg = u64::from(gpu0.power_avg_mw.unwrap());
                    assert!(used.abs_diff(10 * avg) < 10, "{used} mJ, {avg} mW");
                }
                last_energy = gpu0.energy_mj;
            }
            for (p, f) in p.ib.iter().zip(&f.ib) {
                assert_eq!((p.xmit_bytes, p.rcv_packets), (f.xmit_bytes, f.rcv_packets));
                assert_eq!(f.unicast_rcv_packets, f.rcv_packets);
                assert_eq!(f.symbol_error, Some(0));
            }
            let (p, f) = (&p.node[0], &f.node[0]);
            assert_eq!((p.cpu_idle_jiffies, p.load1), (f.cpu_idle_jiffies, f.load1));
            assert!(
                f.cpu_package_power_w
                    .is_some_and(|w| (240.0..700.0).contains(&w))
            );
        }
        // RAPL energy only grows; the node's jobs are its running job.
        let f = full.next_batch();
        assert!(f.node[0].cpu_package_energy_uj.unwrap() > 900 * 240_000_000);
        assert_eq!(
            f.node[0].jobs,
            f.gpu[0].job_id.iter().cloned().collect::<Vec<_>>()
        );

        // Stored values per tick of 8 GPUs: 8 × 34, 15, 4 × 29, and at slow
        // reads 8 × 40 (the realistic mode's 8 × 12, 11, 4 × 5, and 8 × 13).
        let values = |batch: Batch| -> Vec<_> {
            let node = "n-1".to_owned();
            buffer_and_take(&[AgentBatch { node, batch }])
                .into_iter()
                .filter(|(t, _, _)| [Table::Gpu, Table::Node, Table::Ib].contains(t))
                .map(|(t, _, b)| (t, metric_values(t, &b)))
                .collect()
        };
        let plain_tick = values(full.next_batch()); // 901 s
        assert_eq!(
            plain_tick,
            [(Table::Gpu, 8 * 34), (Table::Node, 15), (Table::Ib, 4 * 29)]
        );
        for _ in 902..910 {
            full.next_batch();
        }
        let slow_tick = values(full.next_batch()); // 910 s
        assert_eq!(
            slow_tick,
            [(Table::Gpu, 8 * 40), (Table::Node, 15), (Table::Ib, 4 * 29)]
        );
    }

    #[test]
    fn noise_has_the_realistic_rows_and_keys_with_values_spread_over_their_range() {
        let (real, noise) = (simulate(4, 300), simulate_values(4, 300, Values::Noise));
        assert_eq!(real.len(), noise.len());
        for (r, n) in real.iter().zip(&noise) {
            assert_eq!(
                (&r.node, r.batch.gpu.len(), r.batch.ib.len()),
                (&n.node, 8, 4)
            );
            for (x, y) in r.batch.gpu.iter().zip(&n.batch.gpu) {
                assert_eq!((x.ts_us, &x.uuid, &x.job_id), (y.ts_us, &y.uuid, &y.job_id));
            }
        }
        // Counters still only grow; gauges stay in range but jump anywhere.
        for pair in noise.windows(5) {
            let (a, b) = (&pair[0], &pair[4]);
            for (x, y) in a.batch.ib.iter().zip(&b.batch.ib) {
                assert!(y.xmit_bytes >= x.xmit_bytes && y.rcv_packets >= x.rcv_packets);
            }
        }
        // The energy counter, read every 10 s, grows by up to 700 W × 10 s.
        let slow_reads = noise
            .windows(41)
            .filter(|pair| pair[0].batch.gpu[0].energy_mj.is_some());
        assert_eq!(slow_reads.clone().count(), 4 * 29);
        for pair in slow_reads {
            let (a, b) = (&pair[0], &pair[40]);
            for (x, y) in a.batch.gpu.iter().zip(&b.batch.gpu) {
                let used = y.energy_mj.unwrap() - x.energy_mj.unwrap();
                assert!(used <= 7_000_000, "{used}");
            }
        }
        let powers: Vec<u32> = noise
            .iter()
            .flat_map(|b| b.batch.gpu.iter().filter_map(|g| g.power_mw))
            .collect();
        assert!(powers.iter().all(|p| (60_000..=700_000).contains(p)));
        let distinct: std::collections::HashSet<_> = powers.iter().collect();
        assert!(
            distinct.len() > powers.len() * 9 / 10,
            "{} distinct",
            distinct.len()
        );
        let (lo, hi) = (powers.iter().min().unwrap(), powers.iter().max().unwrap());
        assert!(*lo < 70_000 && *hi > 690_000, "{lo}..{hi}");
        for node in ["gpu-node-001", "gpu-node-004"] {
            let rows: Vec<&NodeSample> = noise
                .iter()
                .filter(|b| b.node == node)
                .flat_map(|b| &b.batch.node)
                .collect();
            assert_eq!(rows.len(), 300, "{node}");
            for pair in rows.windows(2) {
                // Every second of 224 CPUs is in one mode or another.
                assert_eq!(cpu_jiffies(pair[1]) - cpu_jiffies(pair[0]), 22_400);
            }
        }
        for n in noise.iter().flat_map(|b| &b.batch.node) {
            assert!(n.memory_available_kib.unwrap() <= n.memory_total_kib.unwrap());
        }
    }

    #[test]
    fn all_reduce_bursts_take_their_share_of_each_iteration() {
        // Iterations of 8 s: bursts over [5.2, 8), [13.2, 16), …
        assert_eq!(all_reduce_seconds(0.0, 5.0, 8.0), 0.0);
        assert!((all_reduce_seconds(5.0, 6.0, 8.0) - 0.8).abs() < 1e-9);
        assert!((all_reduce_seconds(6.0, 7.0, 8.0) - 1.0).abs() < 1e-9);
        assert!((all_reduce_seconds(7.5, 13.5, 8.0) - 0.8).abs() < 1e-9);
        let hour: f64 = (0..3600)
            .map(|t| all_reduce_seconds(f64::from(t), f64::from(t + 1), 7.3))
            .sum();
        assert!((hour / 3600.0 - ALL_REDUCE_SHARE).abs() < 0.001, "{hour}");
        // Sampled once a second, a busy port's counters are flat in about
        // half its ticks and move at line rate in some.
        let batches = simulate(4, 900);
        let ticks: Vec<(u64, u64)> = batches
            .windows(5)
            .filter(|w| w[0].batch.gpu[0].job_id.is_some())
            .map(|w| {
                let (a, b) = (&w[0].batch.ib[0], &w[4].batch.ib[0]);
                (
                    b.xmit_bytes.unwrap() - a.xmit_bytes.unwrap(),
                    b.xmit_packets.unwrap() - a.xmit_packets.unwrap(),
                )
            })
            .collect();
        let flat = ticks.iter().filter(|(bytes, _)| *bytes < 4096).count();
        let full = ticks
            .iter()
            .filter(|(bytes, _)| *bytes > 40_000_000_000)
            .count();
        assert!(
            flat * 10 > ticks.len() * 3 && flat * 10 < ticks.len() * 7,
            "{flat} of {}",
            ticks.len()
        );
        assert!(full > 0, "no tick at line rate");
        assert!(
            ticks
                .iter()
                .all(|(bytes, packets)| (*bytes == 0) == (*packets == 0))
        );
    }

    #[test]
    fn simulated_data_is_plausible() {
        let batches = simulate(4, 600);
        assert_eq!(batches.len(), 2400);
        for pair in batches.windows(5) {
            let (a, b) = (&pair[0], &pair[4]); // the same node, one tick apart
            assert_eq!(a.node, b.node);
            for (x, y) in a.batch.gpu.iter().zip(&b.batch.gpu) {
                // Read at the slow-read ticks, every 10 s from the first.
                let slow = (y.ts_us - START_US) % SLOW_READ_US == 0;
                assert_eq!(y.energy_mj.is_some(), slow);
                let dt = x
                    .temperature_c
                    .unwrap_or(0)
                    .abs_diff(y.temperature_c.unwrap_or(0));
                assert!(dt <= 3, "temperature jumped {dt} °C in 1 s");
            }
            for (x, y) in a.batch.ib.iter().zip(&b.batch.ib) {
                assert!(y.xmit_bytes >= x.xmit_bytes);
            }
        }
        // An idle GPU's power moves by tens of mW a second, as the H200 of
        // tests/fixtures/h200-recording did at idle (a median of 56 mW).
        let mut idle_steps: Vec<u32> = batches
            .windows(5)
            .flat_map(|pair| pair[0].batch.gpu.iter().zip(&pair[4].batch.gpu))
            .filter(|(x, y)| x.job_id.is_none() && y.job_id.is_none())
            .map(|(x, y)| x.power_mw.unwrap().abs_diff(y.power_mw.unwrap()))
            .collect();
        assert!(idle_steps.len() > 1000, "{} idle steps", idle_steps.len());
        idle_steps.sort_unstable();
        let median = idle_steps[idle_steps.len() / 2];
        assert!((40..=110).contains(&median), "median idle step {median} mW");
        let temps: Vec<u32> = batches
            .iter()
            .flat_map(|b| b.batch.gpu.iter().filter_map(|g| g.temperature_c))
            .collect();
        assert!(temps.iter().all(|t| (25..=90).contains(t)), "{temps:?}");
        let tables = buffer_and_take(&batches);
        let values_of = |want: &[Table]| -> u64 {
            tables
                .iter()
                .filter(|(t, _, _)| want.contains(t))
                .map(|(t, _, rb)| metric_values(*t, rb))
                .sum()
        };
        // The simulation fills 10 GPU metrics plus the XID and job counts (and
        // the energy counter at the 60 slow-read ticks of each node), 11 of
        // the 15 node metrics (not RAPL's) and 5 of the 29 IB metrics (the link
        // rate and the data and packet counters, not the error or driver counters).
        assert_eq!(
            values_of(&[Table::Gpu, Table::Node, Table::Ib]),
            2400 * (8 * 12 + 11 + 4 * 5) + 4 * 60 * 8
        );
        // Between two slow reads the counter grew by the power of each tick.
        let energy: Vec<(u64, u64)> = batches
            .iter()
            .filter(|b| b.node == "gpu-node-002")
            .map(|b| &b.batch.gpu[3])
            .scan(0, |used, g| {
                *used += u64::from(g.power_mw.unwrap());
                Some(g.energy_mj.map(|e| (e, *used)))
            })
            .flatten()
            .collect();
        assert_eq!(energy.len(), 60);
        for w in energy.windows(2) {
            assert_eq!(w[1].0 - w[0].0, w[1].1 - w[0].1);
        }
        // Busy nodes' GPUs carry job ids, from which the collector derives `job` rows.
        let with_job = batches
            .iter()
            .flat_map(|b| &b.batch.gpu)
            .filter(|g| g.job_id.is_some() && g.job_count == 1)
            .count();
        assert!(
            with_job > 0 && with_job < 2400 * 8,
            "{with_job} GPU rows with a job"
        );
        assert!(values_of(&[Table::Job]) > 0);
        assert_eq!(
            dataset_metric_values(&batches),
            values_of(&[Table::Gpu, Table::Node, Table::Ib, Table::Job])
        );
    }

    #[test]
    fn a_node_of_any_size_and_interval_keeps_time_and_counters_consistent() {
        let interval_us = 15 * SECOND_US;
        let mut node = SimNode::new(3, "n-1".to_owned(), 2, START_US, interval_us);
        assert_eq!(node.name(), "n-1");
        let batches: Vec<Batch> = (0..400).map(|_| node.next_batch()).collect();
        for (k, b) in batches.iter().enumerate() {
            assert_eq!(b.seq, k as u64 + 1);
            assert_eq!(b.gpu.len(), 2);
            assert_eq!(b.ib.len(), IB_PORTS_PER_NODE);
            let ts = START_US + k as i64 * interval_us;
            assert!(b.gpu.iter().all(|g| g.ts_us == ts));
            assert_eq!(b.node[0].ts_us, ts);
        }
        for pair in batches.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            for (x, y) in a.gpu.iter().zip(&b.gpu) {
                // 15 s at the reported power, in mJ.
                let used = y.energy_mj.unwrap_or(0) - x.energy_mj.unwrap_or(0);
                assert_eq!(used, 15 * u64::from(y.power_mw.unwrap_or(0)));
            }
            for (x, y) in a.ib.iter().zip(&b.ib) {
                assert!(y.xmit_bytes >= x.xmit_bytes && y.rcv_packets >= x.rcv_packets);
            }
            // 224 CPUs over 15 s, give or take the scheduler tick's jitter.
            let grown = cpu_jiffies(&b.node[0]) - cpu_jiffies(&a.node[0]);
            assert!(grown.abs_diff(224 * 100 * 15) < 100, "{grown}");
        }
    }

    /// All the CPU time a node row counts.
    fn cpu_jiffies(n: &NodeSample) -> u64 {
        CpuJiffies::of_row(n)
            .and_then(|c| c.total())
            .expect("five counters")
    }
}
