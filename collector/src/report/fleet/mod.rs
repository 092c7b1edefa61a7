//! `gputel-collector report`: the study's figures for the whole fleet, read
//! in process from the store and written as one self-contained HTML page.
//!
//! Every figure is computed here from the Parquet files (only the columns
//! it needs, one hour at a time) and names the shipped SQL of
//! schemas/sql/ that computes the same numbers in DuckDB; the tests check
//! one against the other. Quantities are time-weighted (see [`scan`]).

pub mod cdf;
pub mod html;
mod scan;
pub mod svg;
mod trace;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use gputel_schemas::derive::{self, CpuJiffies, Reading};
use object_store::ObjectStore;
use serde::Serialize;

use super::read::{Counting, ReadStats, all_rows_of, list};
use super::{ReportError, rfc3339};
use cdf::{Curve, Distribution, Windowed};
pub use scan::Window;
use scan::{Col, Names, Scan};

/// What a report covers and how it resamples.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    pub window: Window,
    /// Average each device over windows of this length before the CDFs
    /// (the study's 15 s); None: every sample as it is.
    pub resample_us: Option<i64>,
}

/// The metrics of the fleet CDFs: (column of fleet_cdf.sql, title, unit).
pub const CDF_METRICS: [(&str, &str, &str); 13] = [
    ("gpu_util_pct", "GPU utilization", "%"),
    ("sm_active_pct", "SM activity", "%"),
    ("sm_occupancy_pct", "SM occupancy", "%"),
    ("tensor_active_pct", "Tensor core activity", "%"),
    ("gpu_mem_share_pct", "GPU memory used, of its capacity", "%"),
    ("power_share_pct", "GPU power, of its limit", "%"),
    ("temperature_c", "GPU temperature", "°C"),
    ("memory_temperature_c", "GPU memory temperature", "°C"),
    ("cpu_busy_pct", "Host CPU busy (user + system)", "%"),
    ("host_mem_share_pct", "Host memory used, of its total", "%"),
    (
        "ib_xmit_share_pct",
        "InfiniBand send, of the link rate",
        "%",
    ),
    (
        "ib_rcv_share_pct",
        "InfiniBand receive, of the link rate",
        "%",
    ),
    ("power_w", "GPU power", "W"),
];
const GPU_METRICS: usize = 8;

/// The states of idle_gpu_power.sql, in its order.
pub const POWER_STATES: [&str; 3] = ["unallocated", "allocated, idle", "allocated, active"];
/// Under this utilization a GPU is idle (utilization_by_job_type.sql, job_imbalance.sql).
const IDLE_UTIL_PCT: f64 = 5.0;

/// One state of idle_gpu_power.sql, over all nodes.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PowerState {
    pub state: &'static str,
    pub time_s: f64,
    pub time_share: f64,
    pub power_w_mean: Option<f64>,
    pub power_w_p50: Option<f64>,
    pub power_w_max: Option<f64>,
    pub energy_share: f64,
    #[serde(skip)]
    pub curve: Curve,
}

/// One GPU's throttled time (throttle_time.sql).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Throttle {
    pub node: String,
    pub gpu: i64,
    pub time_s: f64,
    pub thermal_s: f64,
    pub power_s: f64,
    pub hw_slowdown_s: f64,
    /// With any of the three.
    pub throttled_s: f64,
}

impl Throttle {
    /// Throttled for any reason, % of the observed time.
    pub fn share_pct(&self) -> f64 {
        if self.time_s > 0.0 {
            100.0 * self.throttled_s / self.time_s
        } else {
            0.0
        }
    }
}

/// One job as the telemetry saw it (job_duration_vs_utilization.sql,
/// job_imbalance.sql).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Job {
    pub job_id: String,
    pub job_type: Option<String>,
    pub state: Option<String>,
    pub gpus: usize,
    pub duration_s: f64,
    pub observed_gpu_s: f64,
    pub gpu_util_mean_pct: Option<f64>,
    pub sm_active_mean_pct: Option<f64>,
    pub idle_share_pct: Option<f64>,
    pub mem_peak_min_pct: Option<f64>,
    pub mem_peak_max_pct: Option<f64>,
}

/// One job type (utilization_by_job_type.sql).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct JobType {
    pub job_type: String,
    pub jobs: usize,
    pub gpu_hours: f64,
    pub gpu_util_mean_pct: Option<f64>,
    pub sm_active_mean_pct: Option<f64>,
    pub idle_share_pct: Option<f64>,
}

/// One XID category (xid_failures.sql, the '(all)' rows).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct XidCategory {
    pub category: String,
    pub events: u64,
    pub gpus: usize,
    pub jobs: usize,
    pub codes: Vec<i64>,
}

/// One group of gpu_time_share.sql's 'trace' scope.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TraceShare {
    /// 'job_type' or 'state'.
    pub dimension: &'static str,
    pub value: String,
    pub jobs: usize,
    pub gpu_time_s: f64,
    /// Of the trace's GPU time, 0 to 1.
    pub share: Option<f64>,
}

/// The whole report's numbers.
#[derive(Debug, Clone, Serialize)]
pub struct Fleet {
    pub store: String,
    pub first_ts: Option<String>,
    pub last_ts: Option<String>,
    pub nodes: usize,
    pub gpus: usize,
    pub gpu_rows: u64,
    pub resample_s: Option<f64>,
    /// By fleet_cdf.sql's column name; metrics without data are absent.
    pub cdfs: BTreeMap<&'static str, Curve>,
    pub power_states: Vec<PowerState>,
    pub throttle: Vec<Throttle>,
    pub jobs: Vec<Job>,
    pub job_types: Vec<JobType>,
    pub xids: Vec<XidCategory>,
    /// The trace's GPU time by job type and by folded state.
    pub trace_shares: Vec<TraceShare>,
    /// Where the job trace came from: the store's `scheduler_job` table, or
    /// the file given to `--jobs`.
    pub trace_from: String,
    pub read: ReadStats,
}

/// A job trace read from a file for this report alone (`--jobs`), in place
/// of the store's `scheduler_job` table.
#[derive(Debug, Clone, Copy)]
pub struct TraceFile<'a> {
    pub name: &'a str,
    pub trace: &'a crate::import::Trace,
}

/// Per-job sums over its gpu rows.
#[derive(Default)]
struct JobSums {
    first_us: i64,
    last_us: i64,
    time_s: f64,
    util: (f64, f64),
    sm: (f64, f64),
    idle_s: f64,
    /// Per (node, gpu): peak memory share, %.
    mem_peak: BTreeMap<(u32, i64), Option<f64>>,
}

/// Per-device sums for throttling.
#[derive(Default, Clone)]
struct ThrottleSums {
    time_s: f64,
    thermal_s: f64,
    power_s: f64,
    hw_s: f64,
    any_s: f64,
}

const GPU_COLUMNS: [&str; 14] = [
    "gpu_util_pct",
    "sm_active_pct",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "fb_used_bytes",
    "fb_total_bytes",
    "power_mw",
    "power_limit_mw",
    "temperature_c",
    "memory_temperature_c",
    "clock_event_reasons",
    "job_id",
    "job_count",
    "pod_uid",
];
/// Offset of GPU_COLUMNS in a scanned gpu batch (node, gpu, gi, ci, ts).
const GPU_AT: usize = 5;

/// Clock event reason bits, as the job report reads them.
const THERMAL_BITS: i64 = 0x20 | 0x40;
const POWER_BITS: i64 = 0x4 | 0x80;
const HW_SLOWDOWN_BIT: i64 = 0x8;

/// Makes the fleet's figures from `store`, its jobs typed by `trace_file`
/// when given, else by the store's imported trace.
pub async fn fleet(
    store: Arc<dyn ObjectStore>,
    store_name: &str,
    options: Options,
    trace_file: Option<TraceFile<'_>>,
) -> Result<Result<Fleet, String>, ReportError> {
    let counting = Arc::new(Counting::new(store));
    let store: Arc<dyn ObjectStore> = counting.clone();
    let mut stats = ReadStats::default();
    let mut names = Names::default();
    let window = options.window;

    let gpu_hours = scan::hours(store.as_ref(), "gpu", window).await?;
    let node_hours = scan::hours(store.as_ref(), "node", window).await?;
    let ib_hours = scan::hours(store.as_ref(), "ib", window).await?;
    if gpu_hours.is_empty() && node_hours.is_empty() {
        return Ok(Err(empty(store.as_ref(), store_name, window).await?));
    }

    // The node table first: its nodes' sampling intervals are the fallback
    // weight of devices seen once.
    let node_scan = Scan {
        store: &store,
        spec: scan::NODE,
        hours: &node_hours,
        window,
    };
    let (mut nodes, intervals) = node_scan.devices(&mut names, &mut stats, true).await?;
    let mut cpu = Windowed::new(options.resample_us);
    let mut host_mem = Windowed::new(options.resample_us);
    // Each node's last CPU counters: a row's shares are over the time since.
    let mut last_cpu: HashMap<u32, CpuJiffies> = HashMap::new();
    node_scan
        .weighted(
            &[
                "cpu_user_jiffies",
                "cpu_system_jiffies",
                "cpu_iowait_jiffies",
                "cpu_idle_jiffies",
                "cpu_steal_jiffies",
                "memory_total_kib",
                "memory_available_kib",
                // Files written before the counters hold the shares, and
                // those before memory in KiB hold used and total bytes.
                "cpu_user_pct",
                "cpu_system_pct",
                "memory_used_bytes",
                "memory_total_bytes",
            ],
            &mut names,
            &mut nodes,
            &intervals,
            &mut stats,
            |r| {
                let w = r.weight_us as f64 / 1e6;
                let c = |i: usize| r.batch.col(2 + i);
                let counter = |i: usize| c(i).counter(r.row);
                let now =
                    CpuJiffies::of(counter(0), counter(1), counter(2), counter(3), counter(4));
                let busy = now
                    .and_then(|now| {
                        let prev = last_cpu.insert(r.device, now)?;
                        now.shares_since(&prev).map(|s| s.user + s.system)
                    })
                    .or_else(|| c(7).num(r.row).zip(c(8).num(r.row)).map(|(u, s)| u + s));
                cpu.add(r.device, r.ts_us, busy, w);
                let (total, available) = (c(5).num(r.row), c(6).num(r.row));
                let used = total.zip(available).map(|(t, a)| t - a);
                let mem = share(used, total).or_else(|| share(c(9).num(r.row), c(10).num(r.row)));
                host_mem.add(r.device, r.ts_us, mem, w);
            },
        )
        .await?;

    // The GPUs.
    let gpu_scan = Scan {
        store: &store,
        spec: scan::GPU,
        hours: &gpu_hours,
        window,
    };
    let (mut devices, _) = gpu_scan.devices(&mut names, &mut stats, false).await?;
    let mut gpus = GpuSums::new(options.resample_us);
    gpu_scan
        .weighted(
            &GPU_COLUMNS,
            &mut names,
            &mut devices,
            &intervals,
            &mut stats,
            |r| gpus.add(&r),
        )
        .await?;
    let mut ib_share = [
        Windowed::new(options.resample_us),
        Windowed::new(options.resample_us),
    ];
    if !ib_hours.is_empty() {
        let ib_scan = Scan {
            store: &store,
            spec: scan::IB,
            hours: &ib_hours,
            window,
        };
        let (mut ports, _) = ib_scan.devices(&mut names, &mut stats, false).await?;
        // Each port's last reading of its data counters (transmitted, received).
        let mut last: HashMap<u32, [Option<Reading>; 2]> = HashMap::new();
        ib_scan
            .weighted(
                // Files written before the counters-only schema hold the rates.
                &[
                    "rate_gbps",
                    "xmit_bytes",
                    "rcv_bytes",
                    "xmit_bytes_per_s",
                    "rcv_bytes_per_s",
                ],
                &mut names,
                &mut ports,
                &intervals,
                &mut stats,
                |r| {
                    let w = r.weight_us as f64 / 1e6;
                    let c = |i: usize| r.batch.col(4 + i);
                    let readings = last.entry(r.device).or_default();
                    let mut per_s = [None; 2];
                    for (i, (prev, rate)) in readings.iter_mut().zip(&mut per_s).enumerate() {
                        let Some(value) = c(1 + i).counter(r.row) else {
                            continue;
                        };
                        let now = Reading {
                            ts_us: r.ts_us,
                            value,
                        };
                        let sat = Some(derive::IB_SATURATED_BYTES);
                        *rate = prev.and_then(|p| derive::per_second(p, now, sat));
                        *prev = Some(now);
                    }
                    for (i, rate) in per_s.iter_mut().enumerate() {
                        *rate = rate.or_else(|| c(3 + i).num(r.row));
                    }
                    // bytes/s × 8 / 1e9 is Gb/s; ports with no known rate are left out.
                    let Some(rate) = c(0).num(r.row).filter(|g| *g > 0.0) else {
                        return;
                    };
                    let of_rate = |b: Option<f64>| b.map(|b| 100.0 * b * 8.0 / 1e9 / rate);
                    ib_share[0].add(r.device, r.ts_us, of_rate(per_s[0]), w);
                    ib_share[1].add(r.device, r.ts_us, of_rate(per_s[1]), w);
                },
            )
            .await?;
    }

    let (trace, trace_from) = match trace_file {
        Some(file) => (trace::of_file(file.trace), file.name.to_owned()),
        None => (
            trace::latest(&store, &mut stats).await?,
            gputel_schemas::scheduler_job::NAME.to_owned(),
        ),
    };
    let events = read_events(&store, window, &mut stats).await?;

    let mut cdfs = BTreeMap::new();
    let finished = std::mem::take(&mut gpus.metrics)
        .into_iter()
        .chain([cpu, host_mem])
        .chain(ib_share);
    for (windowed, name) in finished.zip(cdf_order()) {
        let dist = windowed.finish();
        if !dist.is_empty() {
            cdfs.insert(name, Curve::of(&dist));
        }
    }
    let power_states = power_states(&gpus.states);
    let mut throttle: Vec<Throttle> = gpus
        .throttle
        .iter()
        .map(|(&(node, gpu), t)| Throttle {
            node: names.name(node).to_owned(),
            gpu,
            time_s: t.time_s,
            thermal_s: t.thermal_s,
            power_s: t.power_s,
            hw_slowdown_s: t.hw_s,
            throttled_s: t.any_s,
        })
        .collect();
    throttle.sort_by(|a, b| {
        b.share_pct()
            .total_cmp(&a.share_pct())
            .then_with(|| (&a.node, a.gpu).cmp(&(&b.node, b.gpu)))
    });
    let jobs = gpus.jobs(&trace);
    let job_types = job_types(&gpus.jobs, &gpus.job_names, &trace);
    // A GPU's rows are visited device by device: a MIG GPU's instances one
    // after the other, so its line is put in time order before it is searched.
    for line in gpus.timeline.values_mut() {
        line.sort_by_key(|&(ts_us, _)| ts_us);
    }
    let xids = xid_categories(&events, &gpus.timeline, &names, &gpus.job_names);
    let trace_shares = trace::shares(&trace);
    (stats.bytes_read, stats.requests) = counting.read();
    let gpu_count = gpus.throttle.len();
    let node_count = nodes.len();
    Ok(Ok(Fleet {
        store: store_name.to_owned(),
        first_ts: (gpus.first_us <= gpus.last_us).then(|| rfc3339(gpus.first_us)),
        last_ts: (gpus.first_us <= gpus.last_us).then(|| rfc3339(gpus.last_us)),
        nodes: node_count,
        gpus: gpu_count,
        gpu_rows: gpus.rows,
        resample_s: options.resample_us.map(|us| us as f64 / 1e6),
        cdfs,
        power_states,
        throttle,
        jobs,
        job_types,
        xids,
        trace_shares,
        trace_from,
        read: stats,
    }))
}

/// The CDF metrics in the order the scans feed them: the GPU's, the
/// node's, the ports'.
fn cdf_order() -> impl Iterator<Item = &'static str> {
    [
        "gpu_util_pct",
        "sm_active_pct",
        "sm_occupancy_pct",
        "tensor_active_pct",
        "gpu_mem_share_pct",
        "power_share_pct",
        "temperature_c",
        "memory_temperature_c",
        "power_w",
        "cpu_busy_pct",
        "host_mem_share_pct",
        "ib_xmit_share_pct",
        "ib_rcv_share_pct",
    ]
    .into_iter()
}

/// Each GPU's (node, gpu) job over time: (from µs, job), a new entry
/// whenever the job changes.
type Timeline = HashMap<(u32, i64), Vec<(i64, Option<u32>)>>;

/// What the gpu scan adds up.
struct GpuSums {
    metrics: Vec<Windowed>,
    /// Per state of [`POWER_STATES`]: power distribution, observed time.
    states: [(Distribution, f64); 3],
    throttle: BTreeMap<(u32, i64), ThrottleSums>,
    jobs: HashMap<u32, JobSums>,
    job_names: Names,
    /// Each GPU's job over time, for events that carry none: (from, job).
    timeline: Timeline,
    rows: u64,
    first_us: i64,
    last_us: i64,
}

impl GpuSums {
    fn new(resample_us: Option<i64>) -> Self {
        Self {
            metrics: (0..=GPU_METRICS)
                .map(|_| Windowed::new(resample_us))
                .collect(),
            states: Default::default(),
            throttle: BTreeMap::new(),
            jobs: HashMap::new(),
            job_names: Names::default(),
            timeline: HashMap::new(),
            rows: 0,
            first_us: i64::MAX,
            last_us: i64::MIN,
        }
    }

    fn add(&mut self, r: &scan::Row<'_>) {
        self.rows += 1;
        self.first_us = self.first_us.min(r.ts_us);
        self.last_us = self.last_us.max(r.ts_us);
        let w = r.weight_us as f64 / 1e6;
        let c = |i: usize| r.batch.col(GPU_AT + i);
        let row = r.row;
        let util = c(0).num(row);
        let sm = c(1).num(row);
        let mem = share(c(4).num(row), c(5).num(row));
        let power_w = c(6).num(row).map(|p| p / 1e3);
        let values = [
            util,
            sm,
            c(2).num(row),
            c(3).num(row),
            mem,
            share(c(6).num(row), c(7).num(row)),
            c(8).num(row),
            c(9).num(row),
            power_w,
        ];
        for (m, v) in self.metrics.iter_mut().zip(values) {
            m.add(r.device, r.ts_us, v, w);
        }
        let gpu = (r.key.node, r.key.parts[0].unwrap_or(-1));
        let job_count = c(12).int(row).unwrap_or(0);
        let state = if job_count == 0 && c(13).text(row).is_none() {
            0
        } else if util == Some(0.0) {
            1
        } else {
            2
        };
        self.states[state].1 += w;
        if let Some(p) = power_w {
            self.states[state].0.add(p, w);
        }
        let t = self.throttle.entry(gpu).or_default();
        t.time_s += w;
        if let Some(reasons) = c(10).int(row) {
            if reasons & THERMAL_BITS != 0 {
                t.thermal_s += w;
            }
            if reasons & POWER_BITS != 0 {
                t.power_s += w;
            }
            if reasons & HW_SLOWDOWN_BIT != 0 {
                t.hw_s += w;
            }
            if reasons & (THERMAL_BITS | POWER_BITS | HW_SLOWDOWN_BIT) != 0 {
                t.any_s += w;
            }
        }
        let job = c(11).text(row).map(|j| self.job_names.id(j));
        let line = self.timeline.entry(gpu).or_default();
        if line.last().is_none_or(|l| l.1 != job) {
            line.push((r.ts_us, job));
        }
        let Some(job) = job else { return };
        let s = self.jobs.entry(job).or_insert_with(|| JobSums {
            first_us: i64::MAX,
            last_us: i64::MIN,
            ..JobSums::default()
        });
        s.first_us = s.first_us.min(r.ts_us);
        s.last_us = s.last_us.max(r.ts_us);
        s.time_s += w;
        if let Some(u) = util {
            s.util.0 += u * w;
            s.util.1 += w;
            if u < IDLE_UTIL_PCT {
                s.idle_s += w;
            }
        }
        if let Some(sm) = sm {
            s.sm.0 += sm * w;
            s.sm.1 += w;
        }
        let peak = s.mem_peak.entry(gpu).or_default();
        if let Some(m) = mem {
            *peak = Some(peak.map_or(m, |p: f64| p.max(m)));
        }
    }

    /// Each job, longest first (job_duration_vs_utilization.sql's order).
    fn jobs(&self, trace: &HashMap<String, trace::TraceJob>) -> Vec<Job> {
        let mut out: Vec<Job> = self
            .jobs
            .iter()
            .map(|(&id, s)| {
                let job_id = self.job_names.name(id).to_owned();
                let t = trace.get(&job_id);
                let span_s = (s.last_us - s.first_us) as f64 / 1e6;
                let peaks: Vec<f64> = s.mem_peak.values().flatten().copied().collect();
                Job {
                    job_type: t.and_then(|t| t.job_type.clone()),
                    state: t.and_then(|t| t.state.clone()),
                    gpus: s.mem_peak.len(),
                    duration_s: t.and_then(|t| t.duration_s).unwrap_or(span_s),
                    observed_gpu_s: s.time_s,
                    gpu_util_mean_pct: mean(s.util),
                    sm_active_mean_pct: mean(s.sm),
                    idle_share_pct: (s.util.1 > 0.0).then(|| 100.0 * s.idle_s / s.util.1),
                    mem_peak_min_pct: peaks.iter().copied().reduce(f64::min),
                    mem_peak_max_pct: peaks.iter().copied().reduce(f64::max),
                    job_id,
                }
            })
            .collect();
        out.sort_by(|a, b| {
            b.duration_s
                .total_cmp(&a.duration_s)
                .then_with(|| a.job_id.cmp(&b.job_id))
        });
        out
    }
}

fn mean((sum, weight): (f64, f64)) -> Option<f64> {
    (weight > 0.0).then(|| sum / weight)
}

/// idle_gpu_power.sql's '(all)' rows.
fn power_states(states: &[(Distribution, f64); 3]) -> Vec<PowerState> {
    let time: f64 = states.iter().map(|s| s.1).sum();
    let energy = |d: &Distribution| d.mean().map_or(0.0, |m| m * d.total_s());
    let all_energy: f64 = states.iter().map(|s| energy(&s.0)).sum();
    POWER_STATES
        .iter()
        .zip(states)
        .filter(|(_, s)| s.1 > 0.0)
        .map(|(name, (dist, time_s))| {
            let q = dist.quantiles(&[50.0, 100.0]);
            PowerState {
                state: name,
                time_s: *time_s,
                time_share: time_s / time,
                power_w_mean: dist.mean(),
                power_w_p50: q[0],
                power_w_max: q[1],
                energy_share: if all_energy > 0.0 {
                    energy(dist) / all_energy
                } else {
                    0.0
                },
                curve: Curve::of(dist),
            }
        })
        .collect()
}

/// utilization_by_job_type.sql.
fn job_types(
    jobs: &HashMap<u32, JobSums>,
    job_names: &Names,
    trace: &HashMap<String, trace::TraceJob>,
) -> Vec<JobType> {
    #[derive(Default)]
    struct Sums {
        jobs: usize,
        time_s: f64,
        util: (f64, f64),
        sm: (f64, f64),
        idle_s: f64,
    }
    let mut by_type: BTreeMap<String, Sums> = BTreeMap::new();
    // In job order, so that the sums' last digits do not depend on the map's.
    let mut ordered: Vec<(&u32, &JobSums)> = jobs.iter().collect();
    ordered.sort_unstable_by_key(|(id, _)| **id);
    for (&id, s) in ordered {
        let job_type = trace
            .get(job_names.name(id))
            .and_then(|t| t.job_type.clone())
            .unwrap_or_else(|| "unknown".into());
        let t = by_type.entry(job_type).or_default();
        t.jobs += 1;
        t.time_s += s.time_s;
        t.util.0 += s.util.0;
        t.util.1 += s.util.1;
        t.sm.0 += s.sm.0;
        t.sm.1 += s.sm.1;
        t.idle_s += s.idle_s;
    }
    let mut out: Vec<JobType> = by_type
        .into_iter()
        .map(|(job_type, s)| JobType {
            job_type,
            jobs: s.jobs,
            gpu_hours: s.time_s / 3600.0,
            gpu_util_mean_pct: mean(s.util),
            sm_active_mean_pct: mean(s.sm),
            idle_share_pct: (s.util.1 > 0.0).then(|| 100.0 * s.idle_s / s.util.1),
        })
        .collect();
    out.sort_by(|a, b| {
        b.gpu_hours
            .total_cmp(&a.gpu_hours)
            .then_with(|| a.job_type.cmp(&b.job_type))
    });
    out
}

/// One XID event: when, which GPU, which code, its job (if it names one).
struct XidEvent {
    ts_us: i64,
    node: String,
    gpu: Option<i64>,
    code: i64,
    job_id: Option<String>,
}

/// Every XID event of the window.
async fn read_events(
    store: &Arc<dyn ObjectStore>,
    window: Window,
    stats: &mut ReadStats,
) -> Result<Vec<XidEvent>, ReportError> {
    let hours = scan::hours(store.as_ref(), "event", window).await?;
    let files: Vec<_> = hours.into_values().flatten().collect();
    let columns = ["ts", "node", "gpu", "kind", "code", "job_id"];
    let batches = all_rows_of(store, &files, &columns, stats).await?;
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for batch in &batches {
        let c: Vec<Col> = columns.iter().map(|n| Col::of(batch, n)).collect();
        for row in 0..batch.num_rows() {
            if c[3].text(row) != Some("xid") {
                continue;
            }
            let (Some(ts_us), Some(node)) = (c[0].int(row), c[1].text(row)) else {
                continue;
            };
            if !window.holds(ts_us) {
                continue;
            }
            let event = XidEvent {
                ts_us,
                node: node.to_owned(),
                gpu: c[2].int(row),
                code: c[4].int(row).unwrap_or_default(),
                job_id: c[5].text(row).map(str::to_owned),
            };
            // A flush file and its hour's compacted file may both be listed.
            if seen.insert((
                ts_us,
                event.node.clone(),
                event.gpu,
                event.code,
                event.job_id.clone(),
            )) {
                out.push(event);
            }
        }
    }
    Ok(out)
}

/// xid_failures.sql's '(all)' rows, with the jobs each category hit: an
/// event's job is its own job_id, else the job of its GPU's last row at or
/// before it (the event_attributed view).
fn xid_categories(
    events: &[XidEvent],
    timeline: &Timeline,
    names: &Names,
    job_names: &Names,
) -> Vec<XidCategory> {
    #[derive(Default)]
    struct Sums {
        events: u64,
        gpus: BTreeSet<(String, Option<i64>)>,
        jobs: BTreeSet<String>,
        codes: BTreeSet<i64>,
    }
    let mut by: BTreeMap<String, Sums> = BTreeMap::new();
    for e in events {
        let category = u64::try_from(e.code)
            .ok()
            .and_then(gputel_schemas::xid::lookup)
            .map_or("unknown", |x| x.category.name());
        let job = e.job_id.clone().or_else(|| {
            let node = names.get(&e.node)?;
            let line = timeline.get(&(node, e.gpu?))?;
            let at = line.partition_point(|(from, _)| *from <= e.ts_us);
            let (_, job) = line.get(at.checked_sub(1)?)?;
            job.map(|j| job_names.name(j).to_owned())
        });
        let s = by.entry(category.to_owned()).or_default();
        s.events += 1;
        s.gpus.insert((e.node.clone(), e.gpu));
        s.codes.insert(e.code);
        if let Some(job) = job {
            s.jobs.insert(job);
        }
    }
    by.into_iter()
        .map(|(category, s)| XidCategory {
            category,
            events: s.events,
            gpus: s.gpus.len(),
            jobs: s.jobs.len(),
            codes: s.codes.into_iter().collect(),
        })
        .collect()
}

/// The names of the study's published utilization series (AcmeTrace's
/// data/utils.py) for the metrics that have one.
const ACME_NAMES: [(&str, &str); 12] = [
    ("gpu_util_pct", "GPU_UTIL"),
    ("sm_active_pct", "SM_ACTIVE"),
    ("sm_occupancy_pct", "SM_OCCUPANCY"),
    ("tensor_active_pct", "PIPE_TENSOR_ACTIVE"),
    ("gpu_mem_share_pct", "FB_USED"),
    ("power_w", "POWER_USAGE"),
    ("temperature_c", "GPU_TEMP"),
    ("memory_temperature_c", "MEMORY_TEMP"),
    ("cpu_busy_pct", "NODE_CPU_UTILIZATION"),
    ("host_mem_share_pct", "NODE_MEMORY_UTILIZATION"),
    ("ib_xmit_share_pct", "NODE_IB_SEND"),
    ("ib_rcv_share_pct", "NODE_IB_RECEIVE"),
];

/// The CDFs as CSV, 1000 percentiles per metric: `metric` (fleet_cdf.sql's
/// column), `acme_metric` (the study's series name, empty without one),
/// `percentile` (0 to 100) and `value` (in the metric's unit: %, W, °C).
pub fn cdf_csv(fleet: &Fleet) -> String {
    let mut out = String::from("metric,acme_metric,percentile,value\n");
    let pcts = cdf::thousand();
    for (metric, curve) in &fleet.cdfs {
        let acme = ACME_NAMES
            .iter()
            .find(|a| a.0 == *metric)
            .map_or("", |a| a.1);
        for (pct, value) in pcts.iter().zip(&curve.thousand) {
            let value = value.map(|v| v.to_string()).unwrap_or_default();
            out.push_str(&format!("{metric},{acme},{pct:.4},{value}\n"));
        }
    }
    out
}

/// 100 × part / whole; None without both or with a zero whole.
fn share(part: Option<f64>, whole: Option<f64>) -> Option<f64> {
    match (part, whole) {
        (Some(p), Some(w)) if w != 0.0 => Some(100.0 * p / w),
        _ => None,
    }
}

/// The message for a store with nothing to draw.
async fn empty(
    store: &dyn ObjectStore,
    store_name: &str,
    window: Window,
) -> Result<String, ReportError> {
    let anything = !list(store, "").await?.is_empty();
    let bounds = match (window.from_us, window.to_us) {
        (None, None) => String::new(),
        (from, to) => format!(
            " between {} and {}",
            from.map_or("the start".into(), rfc3339),
            to.map_or("the end".into(), rfc3339)
        ),
    };
    Ok(if anything {
        format!(
            "{store_name} holds no gpu or node samples{bounds}: nothing to draw. Drop or \
             widen --from/--to, or wait for the collector's first flush."
        )
    } else {
        format!(
            "{store_name} holds no telemetry: no collector has written there yet, or --store \
             names another place."
        )
    })
}
