//! The simulated GPU server of `scripts/run-local` (the `gputel-demo`
//! program): what a training node has, in miniature, for a machine that
//! lacks it, so that every table and every query of `schemas/sql/` has
//! something to show within two minutes.
//!
//! Each simulated part reaches the agent through the path a real one takes:
//!
//! - **GPUs**: eight H100s through the fake NVML library (`tests/fake-nvml`),
//!   driven by a scenario written here (`scenario.toml`, the agent's
//!   `GPUTEL_FAKE_NVML_SCENARIO`). Its readings follow the jobs below: a busy
//!   GPU draws power, heats up and moves data, an idle one does not.
//! - **Jobs and processes**: NVML lists each job's processes on its GPUs, and
//!   `proc/` holds their `cgroup`, `environ` and `comm`, so the agent finds
//!   their jobs as on a Slurm node (cgroup v2, cgroup v1, `SLURM_JOB_ID`); a
//!   debug job that runs nothing is known only from the prolog's job-mapping
//!   file (`jobmap/`, the agent's `--hpc-job-mapping-dir`). `proc/stat`,
//!   `meminfo`, `loadavg` and `sys` link to the real `/proc`, so the host's
//!   CPU, memory, name and boot id stay real (`proc/` is the agent's
//!   `--procfs-root`).
//! - **InfiniBand**: the four NDR ports of `tests/fixtures/sys`, copied to
//!   `sys/` (the agent's `--sysfs-root`); the pretraining job's traffic moves
//!   the counters of two of them every second. `sys/class/powercap` links to
//!   the real one, so RAPL readings stay real.
//! - **The scheduler's job trace**: an Acme-format dump of the jobs (types,
//!   users, final states), imported with `gputel-collector import-jobs`
//!   whenever a job starts or ends, as a periodic `sacct` export would be.
//!
//! The node repeats a ten-minute cycle ([`CYCLE_S`]) for a day
//! ([`CYCLES`]); each cycle's jobs have new ids. A simulation started again
//! in the same directory goes on from the last one ([`History`]): job ids
//! past those it used, the same pretraining job. See [`describe`].

use std::collections::BTreeSet;
use std::fmt::Write as _;

mod node;

pub use node::{DemoError, Node, Options};

/// Length of the repeating cycle, in seconds.
pub const CYCLE_S: u64 = 600;
/// Cycles simulated: a day. Later, the GPUs keep their readings but no job
/// starts or ends any more.
pub const CYCLES: u64 = 144;
/// GPUs on the node.
pub const GPUS: u32 = 8;

/// The pretraining job, on GPUs 0-3 from before the start to past the end.
pub const PRETRAIN_JOB: u64 = 1000;
const PRETRAIN_GPUS: &[u32] = &[0, 1, 2, 3];
/// Its processes' pids: this plus the GPU index.
const PRETRAIN_PID: u32 = 3100;
/// Pids of the cycles' processes: this plus 10 × the job's place among the
/// cycles' jobs plus the process's index among its job's GPUs.
const CYCLE_PID: u32 = 20000;

/// Where a simulation starts in the scheduler's history, so that a restart
/// goes on from the last one: the id of its first cycle's first job (each
/// cycle's jobs follow in slot order), and how long before its start the
/// pretraining job started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct History {
    pub first_job: u64,
    pub pretrain_age_s: u64,
}

impl Default for History {
    fn default() -> Self {
        History {
            first_job: 1001,
            pretrain_age_s: 2 * 3600,
        }
    }
}

impl History {
    /// The first job id of cycle `cycle`.
    pub fn cycle_first_job(&self, cycle: u64) -> u64 {
        self.first_job + cycle * SLOTS.len() as u64
    }
}

/// GPU 2 runs hot from 0:15 to 1:35 of every cycle: above 85 °C for more
/// than the minute `GpuTemperatureHigh` (systemd/alerts.toml) waits, so it
/// fires at 1:15 and resolves at 1:35, once the GPU is below 80 °C.
pub const HOT_GPU: u32 = 2;
pub const HOT_FROM_S: u64 = 15;
pub const HOT_UNTIL_S: u64 = 95;
/// Within that, the driver slows the clocks (SW thermal slowdown), for less
/// than the minute `GpuThermalThrottling` waits.
const SLOWDOWN_FROM_S: u64 = 40;
const SLOWDOWN_UNTIL_S: u64 = 65;

/// Clock event reason bits (NVML's `nvmlClocksEventReason*`).
const REASON_GPU_IDLE: u64 = 0x1;
const REASON_SW_POWER_CAP: u64 = 0x4;
const REASON_SW_THERMAL: u64 = 0x20;

const GIB: u64 = 1 << 30;
/// An H100's framebuffer and what the driver reserves of it.
const FB_TOTAL_BYTES: u64 = 85_520_809_984;
const FB_RESERVED_BYTES: u64 = 566_231_040;
const POWER_LIMIT_MW: u64 = 700_000;

/// What a job does to its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    Pretrain,
    Sft,
    Evaluation,
    /// An interactive session holding its GPU without using it.
    Debug,
}

impl Work {
    /// The job type, as the Acme trace names it.
    pub fn job_type(self) -> &'static str {
        match self {
            Work::Pretrain => "Pretrain",
            Work::Sft => "SFT",
            Work::Evaluation => "Eval",
            Work::Debug => "Debug",
        }
    }

    /// GPU utilization at second `s` of a cycle, %: training iterations
    /// rise and fall with a period of their own; a debug session idles.
    fn util_pct(self, gpu: u32, s: u64) -> u32 {
        // The phase as a whole second of the period, so that every period
        // reads exactly the same.
        let wave = |period_s: u64, offset_s: u64| {
            let phase = (s + offset_s) % period_s;
            (phase as f64 * std::f64::consts::TAU / period_s as f64).sin()
        };
        let offset = u64::from(gpu);
        let pct = match self {
            Work::Pretrain => 72.5 + 27.5 * wave(60, 3 * offset),
            Work::Sft => 80.0 + 15.0 * wave(40, 2 * offset),
            Work::Evaluation => 50.0 + 30.0 * wave(30, 2 * offset),
            Work::Debug => 0.0,
        };
        pct.round().clamp(0.0, 100.0) as u32
    }

    fn fb_used_bytes(self) -> u64 {
        match self {
            Work::Pretrain => 72 * GIB,
            Work::Sft => 58 * GIB,
            Work::Evaluation => 28 * GIB,
            Work::Debug => 12 * GIB,
        }
    }

    /// Share of busy time the tensor pipes are active.
    fn tensor_share(self) -> f64 {
        match self {
            Work::Pretrain => 0.63,
            Work::Sft => 0.55,
            Work::Evaluation => 0.35,
            Work::Debug => 0.0,
        }
    }

    /// NVLink traffic at 100 % utilization, bytes per second each way.
    fn nvlink_bytes_per_s(self) -> u64 {
        match self {
            Work::Pretrain => 180_000_000_000,
            Work::Sft => 60_000_000_000,
            Work::Evaluation | Work::Debug => 0,
        }
    }
}

/// How the agent learns which job a GPU belongs to (README, "Jobs").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attribution {
    /// Its processes' cgroup: Slurm on cgroup v2.
    SlurmCgroupV2,
    /// Its processes' cgroup: Slurm on cgroup v1.
    SlurmCgroupV1,
    /// `SLURM_JOB_ID` in its processes' environment (a cgroup without a job).
    SlurmEnviron,
    /// The prolog's job-mapping file; it runs no process.
    MappingFile,
}

impl Attribution {
    fn describe(self) -> &'static str {
        match self {
            Attribution::SlurmCgroupV2 => "Slurm cgroup v2",
            Attribution::SlurmCgroupV1 => "Slurm cgroup v1",
            Attribution::SlurmEnviron => "SLURM_JOB_ID only",
            Attribution::MappingFile => "job-mapping file only (no process)",
        }
    }
}

/// One job of every cycle.
#[derive(Debug, Clone, Copy)]
pub struct Slot {
    pub work: Work,
    pub gpus: &'static [u32],
    /// When it starts and ends, in seconds into the cycle.
    pub start_s: u64,
    pub end_s: u64,
    pub attribution: Attribution,
    pub user: &'static str,
    /// Its state in the trace once it has ended.
    pub final_state: &'static str,
    /// How long it waited in the queue.
    pub queue_s: u64,
}

/// The jobs of a cycle, in the order of their ids. GPU 7 stays unallocated.
pub const SLOTS: [Slot; 4] = [
    Slot {
        work: Work::Sft,
        gpus: &[4, 5],
        start_s: 0,
        end_s: 100,
        attribution: Attribution::SlurmCgroupV1,
        user: "bob",
        final_state: "COMPLETED",
        queue_s: 20,
    },
    Slot {
        work: Work::Evaluation,
        gpus: &[6],
        start_s: 10,
        end_s: 62,
        attribution: Attribution::SlurmEnviron,
        user: "carol",
        final_state: "FAILED",
        queue_s: 5,
    },
    Slot {
        work: Work::Debug,
        gpus: &[6],
        start_s: 80,
        end_s: CYCLE_S,
        attribution: Attribution::MappingFile,
        user: "dave",
        final_state: "CANCELLED",
        queue_s: 2,
    },
    Slot {
        work: Work::Evaluation,
        gpus: &[4, 5],
        start_s: 130,
        end_s: CYCLE_S,
        attribution: Attribution::SlurmCgroupV2,
        user: "carol",
        final_state: "COMPLETED",
        queue_s: 30,
    },
];

/// An XID of every cycle.
#[derive(Debug, Clone, Copy)]
pub struct Xid {
    pub gpu: u32,
    pub at_s: u64,
    pub xid: u32,
}

/// XID 13 (graphics engine exception) under the SFT job, which carries on;
/// XID 31 (MMU fault) under the evaluation on GPU 6, which fails 2 s later.
pub const XIDS: [Xid; 2] = [
    Xid {
        gpu: 4,
        at_s: 40,
        xid: 13,
    },
    Xid {
        gpu: 6,
        at_s: 60,
        xid: 31,
    },
];

/// One job over the whole simulation; times in seconds since its start
/// (negative: before it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub id: u64,
    pub work: Work,
    pub gpus: Vec<u32>,
    pub nodes: u32,
    pub user: &'static str,
    pub attribution: Attribution,
    pub submit_s: i64,
    pub start_s: i64,
    /// None: runs past the end of the simulation.
    pub end_s: Option<i64>,
    pub final_state: &'static str,
}

impl Job {
    fn runs_at(&self, t: i64) -> bool {
        self.start_s <= t && self.end_s.is_none_or(|end| t < end)
    }

    /// The job's state in a dump taken at `t`.
    fn state_at(&self, t: i64) -> &'static str {
        if t < self.start_s {
            "PENDING"
        } else if self.end_s.is_some_and(|end| end <= t) {
            self.final_state
        } else {
            "RUNNING"
        }
    }
}

/// Every job of the simulation, by id.
pub fn jobs(history: History) -> Vec<Job> {
    let mut jobs = vec![Job {
        id: PRETRAIN_JOB,
        work: Work::Pretrain,
        gpus: PRETRAIN_GPUS.to_vec(),
        nodes: 4,
        user: "alice",
        attribution: Attribution::SlurmCgroupV2,
        submit_s: -(history.pretrain_age_s as i64) - 600,
        start_s: -(history.pretrain_age_s as i64),
        end_s: None,
        final_state: "RUNNING",
    }];
    for cycle in 0..CYCLES {
        for (n, slot) in SLOTS.iter().enumerate() {
            let base = (cycle * CYCLE_S) as i64;
            let start_s = base + slot.start_s as i64;
            jobs.push(Job {
                id: history.cycle_first_job(cycle) + n as u64,
                work: slot.work,
                gpus: slot.gpus.to_vec(),
                nodes: 1,
                user: slot.user,
                attribution: slot.attribution,
                submit_s: start_s - slot.queue_s as i64,
                start_s,
                end_s: Some(base + slot.end_s as i64),
                final_state: slot.final_state,
            });
        }
    }
    jobs
}

/// A process on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    pub gpu: u32,
    pub job: u64,
    pub attribution: Attribution,
    pub used_memory_bytes: u64,
    /// When NVML lists it, in seconds since the start (None: from before).
    pub from_s: Option<u64>,
    pub until_s: Option<u64>,
}

/// Every process: one per GPU of each job that runs one.
pub fn processes(jobs: &[Job]) -> Vec<Process> {
    let mut out = Vec::new();
    // The pretraining job comes first, then the cycles' jobs.
    for (place, job) in jobs.iter().enumerate() {
        if job.attribution == Attribution::MappingFile {
            continue;
        }
        for (n, &gpu) in job.gpus.iter().enumerate() {
            let pid = if job.id == PRETRAIN_JOB {
                PRETRAIN_PID + gpu
            } else {
                CYCLE_PID + 10 * (place as u32 - 1) + n as u32
            };
            out.push(Process {
                pid,
                gpu,
                job: job.id,
                attribution: job.attribution,
                used_memory_bytes: job.work.fb_used_bytes(),
                from_s: u64::try_from(job.start_s).ok(),
                until_s: job.end_s.and_then(|end| u64::try_from(end).ok()),
            });
        }
    }
    out
}

/// What holds `gpu` at second `s` of a cycle.
pub fn work_on(gpu: u32, s: u64) -> Option<Work> {
    if PRETRAIN_GPUS.contains(&gpu) {
        return Some(Work::Pretrain);
    }
    SLOTS
        .iter()
        .find(|slot| slot.gpus.contains(&gpu) && slot.start_s <= s && s < slot.end_s)
        .map(|slot| slot.work)
}

/// One GPU's readings at one second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    pub util_pct: u32,
    pub memory_copy_util_pct: u32,
    pub power_mw: u64,
    pub temperature_c: u32,
    pub memory_temperature_c: u32,
    pub sm_clock_mhz: u32,
    pub clock_event_reasons: u64,
    pub fb_used_bytes: u64,
    pub sm_active_pct: f64,
    pub sm_occupancy_pct: f64,
    pub tensor_active_pct: f64,
    pub dram_active_pct: f64,
    pub graphics_active_pct: f64,
    pub nvlink_bytes_per_s: u64,
    pub pcie_rx_bytes_per_s: u64,
    pub pcie_tx_bytes_per_s: u64,
    pub performance_state: u32,
}

/// `gpu`'s readings at second `s` of a cycle.
pub fn reading(gpu: u32, s: u64) -> Reading {
    let work = work_on(gpu, s);
    let util = work.map_or(0, |w| w.util_pct(gpu, s));
    let share = f64::from(util) / 100.0;
    // An allocated GPU keeps its clocks up and draws more than an idle one.
    let power_w = match work {
        None => 70.0,
        Some(_) if util == 0 => 95.0,
        Some(_) => 150.0 + 5.5 * f64::from(util),
    };
    let power_mw = (power_w * 1000.0) as u64;
    let hot = gpu == HOT_GPU && (HOT_FROM_S..HOT_UNTIL_S).contains(&s);
    let slowed = gpu == HOT_GPU && (SLOWDOWN_FROM_S..SLOWDOWN_UNTIL_S).contains(&s);
    let temperature_c = if hot {
        // 86 °C, peaking at 89 °C in the middle of the episode.
        let x = (s - HOT_FROM_S) as f64 / (HOT_UNTIL_S - HOT_FROM_S) as f64;
        86 + (3.0 * (x * std::f64::consts::PI).sin()).round() as u32
    } else {
        (30.0 + power_w / 700.0 * 48.0).round() as u32
    };
    let mut reasons = 0;
    if work.is_none() || util == 0 {
        reasons |= REASON_GPU_IDLE;
    }
    if power_mw >= 690_000 {
        reasons |= REASON_SW_POWER_CAP;
    }
    if slowed {
        reasons |= REASON_SW_THERMAL;
    }
    let pct = |factor: f64| (f64::from(util) * factor * 10.0).round() / 10.0;
    let nvlink = work.map_or(0, Work::nvlink_bytes_per_s);
    Reading {
        util_pct: util,
        memory_copy_util_pct: (f64::from(util) * 0.62).round() as u32,
        power_mw,
        temperature_c,
        memory_temperature_c: temperature_c + 6,
        sm_clock_mhz: match (work, slowed) {
            (None, _) => 345,
            (Some(_), true) => 1500,
            (Some(_), false) => 1980,
        },
        clock_event_reasons: reasons,
        fb_used_bytes: work.map_or(0, Work::fb_used_bytes),
        sm_active_pct: pct(0.92),
        sm_occupancy_pct: pct(0.48),
        tensor_active_pct: pct(work.map_or(0.0, Work::tensor_share)),
        dram_active_pct: pct(0.41),
        graphics_active_pct: pct(0.97),
        nvlink_bytes_per_s: (nvlink as f64 * share) as u64,
        pcie_rx_bytes_per_s: (4_000_000_000.0 * share) as u64,
        pcie_tx_bytes_per_s: (1_000_000_000.0 * share) as u64,
        performance_state: if work.is_none() { 8 } else { 0 },
    }
}

/// InfiniBand traffic of the pretraining job at second `s` of a cycle, bytes
/// per second each way on each of its two ports: gradients are exchanged
/// while the GPUs compute hard, and only a trickle (under the 1 MB/s that
/// `ib_idle_share.sql` calls idle) flows otherwise.
pub fn ib_bytes_per_s(s: u64) -> u64 {
    let util = Work::Pretrain.util_pct(0, s);
    if util >= 60 {
        u64::from(util) * 250_000_000
    } else {
        100_000
    }
}

/// A trace of `values` in the scenario format: a constant when they are all
/// equal, else the shortest prefix that repeats to make them.
fn trace<T: PartialEq + std::fmt::Display>(values: &[T]) -> String {
    let period = (1..=values.len())
        .find(|&p| {
            values.len().is_multiple_of(p) && values.iter().zip(&values[p..]).all(|(a, b)| a == b)
        })
        .unwrap_or(values.len());
    let items: Vec<String> = values[..period].iter().map(ToString::to_string).collect();
    if period == 1 {
        return items.concat();
    }
    let mut out = String::from("[\n");
    for line in items.chunks(12) {
        let _ = writeln!(out, "    {},", line.join(", "));
    }
    out.push(']');
    out
}

/// A scenario key, and how a [`Reading`] gives its value.
type ScenarioKey = (&'static str, fn(&Reading) -> String);

/// The keys of a GPU's readings in the scenario (tests/fake-nvml/README.md).
const SCENARIO_KEYS: [ScenarioKey; 18] = [
    ("gpu_util_pct", |r| r.util_pct.to_string()),
    ("memory_copy_util_pct", |r| {
        r.memory_copy_util_pct.to_string()
    }),
    ("power_mw", |r| r.power_mw.to_string()),
    ("temperature_c", |r| r.temperature_c.to_string()),
    ("memory_temperature_c", |r| {
        r.memory_temperature_c.to_string()
    }),
    ("sm_clock_mhz", |r| r.sm_clock_mhz.to_string()),
    ("clock_event_reasons", |r| r.clock_event_reasons.to_string()),
    ("fb_used_bytes", |r| r.fb_used_bytes.to_string()),
    ("sm_active_pct", |r| format!("{:.1}", r.sm_active_pct)),
    ("sm_occupancy_pct", |r| format!("{:.1}", r.sm_occupancy_pct)),
    ("tensor_active_pct", |r| {
        format!("{:.1}", r.tensor_active_pct)
    }),
    ("dram_active_pct", |r| format!("{:.1}", r.dram_active_pct)),
    ("graphics_active_pct", |r| {
        format!("{:.1}", r.graphics_active_pct)
    }),
    ("nvlink_tx_bytes_per_s", |r| {
        r.nvlink_bytes_per_s.to_string()
    }),
    ("nvlink_rx_bytes_per_s", |r| {
        r.nvlink_bytes_per_s.to_string()
    }),
    ("pcie_rx_bytes_per_s", |r| r.pcie_rx_bytes_per_s.to_string()),
    ("pcie_tx_bytes_per_s", |r| r.pcie_tx_bytes_per_s.to_string()),
    ("performance_state", |r| r.performance_state.to_string()),
];

/// The fake NVML scenario of the whole simulation.
pub fn scenario(jobs: &[Job]) -> String {
    let processes = processes(jobs);
    let mut out = String::from(
        "# Written by gputel-demo (tests/src/demo/) for scripts/run-local: eight H100s\n\
         # whose readings follow the simulated jobs, one reading a second, repeating\n\
         # every cycle. Format: tests/fake-nvml/README.md.\n\n\
         driver_version = \"550.54.15\"\nstep_ms = 1000\n",
    );
    for gpu in 0..GPUS {
        let readings: Vec<Reading> = (0..CYCLE_S).map(|s| reading(gpu, s)).collect();
        let work: BTreeSet<&str> = (0..CYCLE_S)
            .filter_map(|s| work_on(gpu, s).map(Work::job_type))
            .collect();
        let _ = writeln!(
            out,
            "\n[[gpu]]   # {gpu}: {}",
            if work.is_empty() {
                "unallocated".to_owned()
            } else {
                work.into_iter().collect::<Vec<_>>().join(", ")
            }
        );
        let _ = writeln!(out, "fb_total_bytes = {FB_TOTAL_BYTES}");
        let _ = writeln!(out, "fb_reserved_bytes = {FB_RESERVED_BYTES}");
        let _ = writeln!(out, "power_limit_mw = {POWER_LIMIT_MW}");
        for (key, value) in SCENARIO_KEYS {
            let values: Vec<String> = readings.iter().map(value).collect();
            let _ = writeln!(out, "{key} = {}", trace(&values));
        }
        let xids: Vec<String> = (0..CYCLES)
            .flat_map(|cycle| {
                XIDS.iter()
                    .filter(|x| x.gpu == gpu)
                    .map(move |x| (cycle * CYCLE_S + x.at_s, x.xid))
            })
            .map(|(at_s, xid)| format!("    {{ at_ms = {}, xid = {xid} }},", at_s * 1000))
            .collect();
        if !xids.is_empty() {
            let _ = writeln!(out, "xid_events = [\n{}\n]", xids.join("\n"));
        }
        let on_gpu: Vec<String> = processes
            .iter()
            .filter(|p| p.gpu == gpu)
            .map(|p| {
                let mut entry = format!(
                    "    {{ pid = {}, used_memory_bytes = {}",
                    p.pid, p.used_memory_bytes
                );
                if let Some(from) = p.from_s {
                    let _ = write!(entry, ", from_ms = {}", from * 1000);
                }
                if let Some(until) = p.until_s {
                    let _ = write!(entry, ", until_ms = {}", until * 1000);
                }
                entry.push_str(" },");
                entry
            })
            .collect();
        if !on_gpu.is_empty() {
            let _ = writeln!(out, "processes = [\n{}\n]", on_gpu.join("\n"));
        }
    }
    out
}

/// Unix seconds as the Acme trace writes times: `2026-11-21 08:00:00+00:00`.
fn acme_time(unix_s: i64) -> String {
    chrono::DateTime::from_timestamp(unix_s, 0)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S+00:00").to_string())
        .unwrap_or_default()
}

/// The scheduler's dump at `t` seconds after the start (`start_unix`): the
/// pretraining job and the jobs of this cycle and the last, as submitted so
/// far, in the Acme trace's columns.
pub fn trace_dump(jobs: &[Job], t: i64, start_unix: i64) -> String {
    let mut out = String::from(
        "job_id,user,node_num,gpu_num,cpu_num,type,state,submit_time,start_time,end_time,duration,queue,gpu_time\n",
    );
    let window = t - 2 * CYCLE_S as i64;
    for job in jobs {
        let recent = job.id == PRETRAIN_JOB || job.end_s.is_none_or(|end| end > window);
        if job.submit_s > t || !recent {
            continue;
        }
        let gpus = job.gpus.len() as i64 * i64::from(job.nodes);
        let started = job.start_s <= t;
        let ended = job.end_s.filter(|&end| end <= t);
        let time = |at: i64| acme_time(start_unix + at);
        let duration = ended.map(|end| end - job.start_s);
        let _ = writeln!(
            out,
            "{},{},{},{gpus},{},{},{},{},{},{},{},{},{}",
            job.id,
            job.user,
            job.nodes,
            16 * gpus,
            job.work.job_type(),
            job.state_at(t),
            time(job.submit_s),
            if started {
                time(job.start_s)
            } else {
                String::new()
            },
            ended.map(time).unwrap_or_default(),
            duration.map(|d| d.to_string()).unwrap_or_default(),
            if started {
                (job.start_s - job.submit_s).to_string()
            } else {
                String::new()
            },
            duration.map(|d| (d * gpus).to_string()).unwrap_or_default(),
        );
    }
    out
}

/// Seconds of a cycle at which a job starts or ends: when the scheduler's
/// record changes.
fn trace_changes() -> BTreeSet<u64> {
    SLOTS
        .iter()
        .flat_map(|slot| [slot.start_s % CYCLE_S, slot.end_s % CYCLE_S])
        .collect()
}

/// `m:ss` of a second of the cycle.
fn clock(s: u64) -> String {
    format!("{}:{:02}", s / 60, s % 60)
}

/// What is simulated, in words, for `scripts/run-local`'s banner.
pub fn describe(gpus: bool, ib: bool, history: History) -> String {
    let mut out = String::new();
    if gpus {
        let gpu_list = |gpus: &[u32]| match gpus {
            [one] => format!("GPU {one}"),
            many => format!(
                "GPUs {}",
                many.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
        };
        let _ = writeln!(
            out,
            "  GPUs     8 H100s (the fake NVML library), busy while their jobs compute; GPU 7 never allocated"
        );
        let _ = writeln!(
            out,
            "  jobs     {PRETRAIN_JOB}  {:<10}  {:<12}  {:<11}  {:<9}  Slurm cgroup v2",
            Work::Pretrain.job_type(),
            gpu_list(PRETRAIN_GPUS),
            "throughout",
            "RUNNING"
        );
        let _ = writeln!(
            out,
            "           and every {} minutes for a day, with new ids ({}-{} first, then {}-{}, ...):",
            CYCLE_S / 60,
            history.cycle_first_job(0),
            history.cycle_first_job(1) - 1,
            history.cycle_first_job(1),
            history.cycle_first_job(2) - 1
        );
        for slot in &SLOTS {
            let xids: Vec<String> = XIDS
                .iter()
                .filter(|x| {
                    slot.gpus.contains(&x.gpu) && (slot.start_s..slot.end_s).contains(&x.at_s)
                })
                .map(|x| format!("; XID {} at {}", x.xid, clock(x.at_s)))
                .collect();
            let _ = writeln!(
                out,
                "                 {:<10}  {:<12}  {:<11}  {:<9}  {}{}",
                slot.work.job_type(),
                gpu_list(slot.gpus),
                format!("{}-{}", clock(slot.start_s), clock(slot.end_s)),
                slot.final_state,
                slot.attribution.describe(),
                xids.concat()
            );
        }
        let _ = writeln!(
            out,
            "  heat     GPU {HOT_GPU} above 85 °C from {} to {} of each cycle: GpuTemperatureHigh fires at {}, resolves at {}",
            clock(HOT_FROM_S),
            clock(HOT_UNTIL_S),
            clock(HOT_FROM_S + 60),
            clock(HOT_UNTIL_S)
        );
        let _ = writeln!(
            out,
            "  trace    the jobs' scheduler records (Acme format), imported with gputel-collector import-jobs at each start and end"
        );
    }
    if ib {
        let _ = writeln!(
            out,
            "  network  4 InfiniBand NDR ports (tests/fixtures/sys); mlx5_0 and mlx5_1 carry job {PRETRAIN_JOB}'s traffic"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_two_minutes_hold_every_kind_of_row() {
        // Jobs start and end on GPUs 4-6 within two minutes.
        let jobs = jobs(History::default());
        let ended: Vec<u64> = jobs
            .iter()
            .filter(|j| j.end_s.is_some_and(|end| end <= 120))
            .map(|j| j.id)
            .collect();
        assert_eq!(ended, [1001, 1002]);
        let started: Vec<u64> = jobs
            .iter()
            .filter(|j| (0..120).contains(&j.start_s))
            .map(|j| j.id)
            .collect();
        assert_eq!(started, [1001, 1002, 1003]);
        // Unallocated, allocated idle and active samples.
        assert_eq!(work_on(7, 60), None);
        assert_eq!(reading(7, 60).power_mw, 70_000);
        assert_eq!(work_on(6, 100), Some(Work::Debug));
        assert_eq!(reading(6, 100).util_pct, 0);
        assert_eq!(reading(6, 100).power_mw, 95_000);
        assert!(reading(0, 14).util_pct > 90);
    }

    #[test]
    fn the_hot_gpu_fires_and_resolves_the_default_rule_within_two_minutes() {
        // GpuTemperatureHigh: > 85 °C for a minute; resolves below 80 °C.
        let temps: Vec<u32> = (0..120)
            .map(|s| reading(HOT_GPU, s).temperature_c)
            .collect();
        let above: Vec<u64> = (0..120).filter(|&s| temps[s as usize] > 85).collect();
        assert_eq!(above.first(), Some(&HOT_FROM_S));
        assert_eq!(above.last(), Some(&(HOT_UNTIL_S - 1)));
        assert_eq!(above.len() as u64, HOT_UNTIL_S - HOT_FROM_S);
        assert!(above.len() > 60, "{above:?}");
        assert!(temps[HOT_UNTIL_S as usize] < 80, "{temps:?}");
        // Never critical (90 °C), and no other GPU is ever above 80 °C.
        assert_eq!(temps.iter().max(), Some(&89));
        for gpu in (0..GPUS).filter(|&g| g != HOT_GPU) {
            for s in 0..CYCLE_S {
                assert!(reading(gpu, s).temperature_c <= 80, "GPU {gpu} at {s}");
            }
        }
        // Thermal slowdown for less than the minute GpuThermalThrottling waits.
        let slowed = (0..CYCLE_S)
            .filter(|&s| reading(HOT_GPU, s).clock_event_reasons & REASON_SW_THERMAL != 0)
            .count();
        assert_eq!(slowed, 25);
    }

    #[test]
    fn the_scenario_lists_every_cycles_processes_and_xids() {
        let text = scenario(&jobs(History::default()));
        assert_eq!(text.matches("[[gpu]]").count(), 8);
        // Pretraining: one process per GPU, from before the start.
        assert!(text.contains("{ pid = 3102, used_memory_bytes = 77309411328 },"));
        // The second cycle's SFT job (1005) on GPUs 4 and 5.
        assert!(text.contains(
            "{ pid = 20040, used_memory_bytes = 62277025792, from_ms = 600000, until_ms = 700000 },"
        ));
        assert!(text.contains(
            "{ pid = 20041, used_memory_bytes = 62277025792, from_ms = 600000, until_ms = 700000 },"
        ));
        // No process for the debug jobs; XID 31 once a cycle.
        assert_eq!(text.matches("xid = 31 }").count() as u64, CYCLES);
        assert_eq!(text.matches("xid = 13 }").count() as u64, CYCLES);
        // GPU 7 is idle throughout: constants.
        let gpu7 = text.split("[[gpu]]").nth(8).expect("GPU 7");
        assert!(gpu7.contains("gpu_util_pct = 0\n"), "{gpu7}");
        assert!(gpu7.contains("power_mw = 70000\n"), "{gpu7}");
        // Pretraining GPUs without the heat repeat every minute.
        let gpu0 = text.split("[[gpu]]").nth(1).expect("GPU 0");
        let util = gpu0
            .lines()
            .skip_while(|l| !l.starts_with("gpu_util_pct = ["))
            .skip(1)
            .take_while(|l| *l != "]")
            .flat_map(|l| l.split(',').filter(|v| !v.trim().is_empty()))
            .count();
        assert_eq!(util, 60);
    }

    #[test]
    fn a_trace_is_its_shortest_repeating_prefix() {
        assert_eq!(trace(&[5, 5, 5, 5]), "5");
        assert_eq!(trace(&[1, 2, 1, 2]), "[\n    1, 2,\n]");
        assert_eq!(trace(&[1, 2, 3]), "[\n    1, 2, 3,\n]");
    }

    #[test]
    fn a_dump_states_each_job_as_the_scheduler_knows_it_then() {
        let jobs = jobs(History::default());
        let start = 1_795_000_000; // 2026-11-18 11:06:40 UTC
        let dump = trace_dump(&jobs, 100, start);
        let lines: Vec<&str> = dump.lines().collect();
        assert_eq!(
            lines,
            [
                "job_id,user,node_num,gpu_num,cpu_num,type,state,submit_time,start_time,end_time,duration,queue,gpu_time",
                "1000,alice,4,16,256,Pretrain,RUNNING,2026-11-18 08:56:40+00:00,2026-11-18 09:06:40+00:00,,,600,",
                "1001,bob,1,2,32,SFT,COMPLETED,2026-11-18 11:06:20+00:00,2026-11-18 11:06:40+00:00,2026-11-18 11:08:20+00:00,100,20,200",
                "1002,carol,1,1,16,Eval,FAILED,2026-11-18 11:06:45+00:00,2026-11-18 11:06:50+00:00,2026-11-18 11:07:42+00:00,52,5,52",
                "1003,dave,1,1,16,Debug,RUNNING,2026-11-18 11:07:58+00:00,2026-11-18 11:08:00+00:00,,,2,",
                "1004,carol,1,2,32,Eval,PENDING,2026-11-18 11:08:20+00:00,,,,,",
            ]
        );
        // Two cycles later the first cycle's jobs are no longer listed.
        let later = trace_dump(&jobs, 1300, start);
        assert!(!later.contains("\n1001,"));
        assert!(later.contains("\n1005,"));
        assert_eq!(trace_changes(), BTreeSet::from([0, 10, 62, 80, 100, 130]));
    }

    #[test]
    fn pids_never_repeat_while_their_processes_could_overlap() {
        let procs = processes(&jobs(History::default()));
        let mut seen = BTreeSet::new();
        for p in &procs {
            assert!(seen.insert(p.pid), "pid {} twice", p.pid);
        }
        // 4 pretraining processes, then 2 + 1 + 2 a cycle.
        assert_eq!(procs.len() as u64, 4 + 5 * CYCLES);
    }

    #[test]
    fn infiniband_is_busy_while_pretraining_computes_hard() {
        let busy = (0..60).filter(|&s| ib_bytes_per_s(s) >= 1_000_000).count();
        let idle = (0..60).filter(|&s| ib_bytes_per_s(s) < 1_000_000).count();
        assert_eq!(busy + idle, 60);
        assert!((30..50).contains(&busy), "{busy} busy seconds a minute");
        assert_eq!(ib_bytes_per_s(15), 100 * 250_000_000);
    }
}
