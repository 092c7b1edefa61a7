//! From a job's rows to its figures: time weights, per-GPU figures, the
//! job's totals and the hints. Pure functions of the rows, so every rule is
//! tested on made-up samples.

use std::collections::BTreeMap;

use serde::Serialize;

/// How many median intervals one sample may stand for at most: a gap longer
/// than that (an agent down, the job away from the GPU) counts as this much.
pub const MAX_WEIGHT_INTERVALS: f64 = 3.0;
/// A GPU whose time-weighted mean utilization is under this is idle.
pub const IDLE_UTIL_PCT: f64 = 5.0;
/// A busy GPU whose time-weighted mean SM activity is under this keeps few SMs busy.
pub const LOW_SM_ACTIVE_PCT: f64 = 25.0;
/// A busy GPU whose peak memory is under this share of its total used little of it.
pub const LOW_MEMORY_PCT: f64 = 25.0;
/// A GPU throttled (thermal, power or hardware slowdown) for more than this
/// share of its time is worth a look.
pub const THROTTLE_SHARE_PCT: f64 = 5.0;

/// Clock event reason bits (`clock_event_reasons`) by what they say.
const THERMAL_BITS: i64 = 0x20 | 0x40;
const POWER_BITS: i64 = 0x4 | 0x80;
const HW_SLOWDOWN_BIT: i64 = 0x8;

/// One GPU (or MIG device) of one node: rows of one device are one series.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Device {
    pub node: String,
    pub gpu: u32,
    pub gpu_instance_id: Option<u32>,
    pub compute_instance_id: Option<u32>,
}

/// The columns of one `gpu` row the report uses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    pub ts_us: i64,
    pub gpu_util_pct: Option<f64>,
    pub sm_active_pct: Option<f64>,
    pub fb_used_bytes: Option<i64>,
    pub fb_total_bytes: Option<i64>,
    pub power_mw: Option<i64>,
    pub temperature_c: Option<i32>,
    pub memory_temperature_c: Option<i32>,
    pub clock_event_reasons: Option<i64>,
}

/// What a device is, beyond its key: from its rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceInfo {
    pub uuid: Option<String>,
    pub model: Option<String>,
    pub mig_profile: Option<String>,
}

/// The figures of one device over the job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuFigures {
    pub node: String,
    pub gpu: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_instance_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compute_instance_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig_profile: Option<String>,
    pub uuid: Option<String>,
    pub model: Option<String>,
    /// First and last sample, µs since the epoch.
    pub first_ts_us: i64,
    pub last_ts_us: i64,
    pub samples: u64,
    /// The median gap between the device's samples, seconds.
    pub interval_s: f64,
    /// The time its samples stand for: the sum of their weights, seconds.
    pub time_s: f64,
    pub gpu_util_mean_pct: Option<f64>,
    pub gpu_util_max_pct: Option<f64>,
    pub sm_active_mean_pct: Option<f64>,
    pub sm_active_max_pct: Option<f64>,
    pub memory_used_max_bytes: Option<i64>,
    pub memory_total_bytes: Option<i64>,
    /// Peak memory used, % of the GPU's total.
    pub memory_used_max_pct: Option<f64>,
    pub power_mean_w: Option<f64>,
    pub power_max_w: Option<f64>,
    /// Mean power × time, kWh.
    pub energy_kwh: Option<f64>,
    pub temperature_mean_c: Option<f64>,
    pub temperature_max_c: Option<i32>,
    pub memory_temperature_max_c: Option<i32>,
    /// Time with a thermal clock reason set (bits 0x20, 0x40), seconds.
    pub throttle_thermal_s: f64,
    /// Time with a power clock reason set (bits 0x4, 0x80), seconds.
    pub throttle_power_s: f64,
    /// Time with hardware slowdown set (bit 0x8), seconds.
    pub throttle_hw_slowdown_s: f64,
}

/// Per-sample weights of one device's samples, sorted by time: each stands
/// for the gap to the next, at most [`MAX_WEIGHT_INTERVALS`] × the median
/// gap; the last one for the median gap. `fallback_us` is the interval of a
/// device with a single sample (its own median is unknown).
pub fn weights_us(ts_us: &[i64], fallback_us: i64) -> Vec<i64> {
    let median = median_gap_us(ts_us).unwrap_or(fallback_us);
    let cap = (median as f64 * MAX_WEIGHT_INTERVALS) as i64;
    let mut weights: Vec<i64> = ts_us.windows(2).map(|w| (w[1] - w[0]).min(cap)).collect();
    if !ts_us.is_empty() {
        weights.push(median);
    }
    weights
}

/// The median gap between consecutive times (the lower middle of an even
/// count, so it is always one of the gaps); None with fewer than two.
pub fn median_gap_us(ts_us: &[i64]) -> Option<i64> {
    let mut gaps: Vec<i64> = ts_us.windows(2).map(|w| w[1] - w[0]).collect();
    if gaps.is_empty() {
        return None;
    }
    gaps.sort_unstable();
    Some(gaps[(gaps.len() - 1) / 2])
}

/// A time-weighted mean of the values that are there; None when none is.
fn weighted_mean(values: impl Iterator<Item = (Option<f64>, i64)>) -> Option<f64> {
    let (mut sum, mut time) = (0.0, 0i64);
    for (value, weight) in values {
        if let Some(v) = value {
            sum += v * weight as f64;
            time += weight;
        }
    }
    (time > 0).then(|| sum / time as f64)
}

fn max_f64(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    values.flatten().reduce(f64::max)
}

/// The figures of every device, in (node, gpu, instance) order. `samples`
/// may hold a device's rows in any order and twice (a flush file and its
/// compaction's output both read): one row per time is kept.
pub fn figures(
    mut samples: BTreeMap<Device, Vec<Sample>>,
    info: &BTreeMap<Device, DeviceInfo>,
) -> Vec<GpuFigures> {
    for rows in samples.values_mut() {
        rows.sort_by_key(|s| s.ts_us);
        rows.dedup_by_key(|s| s.ts_us);
    }
    // A device seen once takes the job's usual interval: the median of the
    // other devices' medians.
    let mut medians: Vec<i64> = samples
        .values()
        .filter_map(|rows| median_gap_us(&times(rows)))
        .collect();
    medians.sort_unstable();
    let fallback = medians
        .get(medians.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0);
    samples
        .into_iter()
        .filter(|(_, rows)| !rows.is_empty())
        .map(|(device, rows)| {
            let info = info.get(&device).cloned().unwrap_or_default();
            device_figures(device, info, &rows, fallback)
        })
        .collect()
}

fn times(rows: &[Sample]) -> Vec<i64> {
    rows.iter().map(|s| s.ts_us).collect()
}

fn device_figures(
    device: Device,
    info: DeviceInfo,
    rows: &[Sample],
    fallback_us: i64,
) -> GpuFigures {
    let ts = times(rows);
    let weights = weights_us(&ts, fallback_us);
    let weighted = |f: fn(&Sample) -> Option<f64>| {
        weighted_mean(rows.iter().zip(&weights).map(|(s, w)| (f(s), *w)))
    };
    let throttled = |bits: i64| -> f64 {
        let us: i64 = rows
            .iter()
            .zip(&weights)
            .filter(|(s, _)| s.clock_event_reasons.is_some_and(|r| r & bits != 0))
            .map(|(_, w)| *w)
            .sum();
        us as f64 / 1e6
    };
    let time_us: i64 = weights.iter().sum();
    let power_w = |s: &Sample| s.power_mw.map(|p| p as f64 / 1000.0);
    // Energy: each sample's power over the time it stands for.
    let energy_ws = rows
        .iter()
        .zip(&weights)
        .filter_map(|(s, w)| power_w(s).map(|p| p * *w as f64 / 1e6))
        .reduce(|a, b| a + b);
    let memory_used_max_bytes = rows.iter().filter_map(|s| s.fb_used_bytes).max();
    let memory_total_bytes = rows.iter().filter_map(|s| s.fb_total_bytes).max();
    let memory_used_max_pct = match (memory_used_max_bytes, memory_total_bytes) {
        (Some(used), Some(total)) if total > 0 => Some(used as f64 * 100.0 / total as f64),
        _ => None,
    };
    GpuFigures {
        node: device.node,
        gpu: device.gpu,
        gpu_instance_id: device.gpu_instance_id,
        compute_instance_id: device.compute_instance_id,
        mig_profile: info.mig_profile,
        uuid: info.uuid,
        model: info.model,
        first_ts_us: ts.first().copied().unwrap_or_default(),
        last_ts_us: ts.last().copied().unwrap_or_default(),
        samples: rows.len() as u64,
        interval_s: median_gap_us(&ts).unwrap_or(fallback_us) as f64 / 1e6,
        time_s: time_us as f64 / 1e6,
        gpu_util_mean_pct: weighted(|s| s.gpu_util_pct),
        gpu_util_max_pct: max_f64(rows.iter().map(|s| s.gpu_util_pct)),
        sm_active_mean_pct: weighted(|s| s.sm_active_pct),
        sm_active_max_pct: max_f64(rows.iter().map(|s| s.sm_active_pct)),
        memory_used_max_bytes,
        memory_total_bytes,
        memory_used_max_pct,
        power_mean_w: weighted(|s| s.power_mw.map(|p| p as f64 / 1000.0)),
        power_max_w: max_f64(rows.iter().map(power_w)),
        energy_kwh: energy_ws.map(|ws| ws / 3.6e6),
        temperature_mean_c: weighted(|s| s.temperature_c.map(f64::from)),
        temperature_max_c: rows.iter().filter_map(|s| s.temperature_c).max(),
        memory_temperature_max_c: rows.iter().filter_map(|s| s.memory_temperature_c).max(),
        throttle_thermal_s: throttled(THERMAL_BITS),
        throttle_power_s: throttled(POWER_BITS),
        throttle_hw_slowdown_s: throttled(HW_SLOWDOWN_BIT),
    }
}

/// The job as a whole: GPU time and its time-weighted means over all devices.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Totals {
    pub gpus: u64,
    pub nodes: Vec<String>,
    /// The sum of the devices' times, hours.
    pub gpu_hours: f64,
    pub gpu_util_mean_pct: Option<f64>,
    pub sm_active_mean_pct: Option<f64>,
    pub energy_kwh: Option<f64>,
}

/// The job's totals: means weighted by each device's time.
pub fn totals(gpus: &[GpuFigures]) -> Totals {
    let mean = |f: fn(&GpuFigures) -> Option<f64>| {
        let (mut sum, mut time) = (0.0, 0.0);
        for g in gpus {
            if let Some(v) = f(g) {
                sum += v * g.time_s;
                time += g.time_s;
            }
        }
        (time > 0.0).then(|| sum / time)
    };
    let mut nodes: Vec<String> = gpus.iter().map(|g| g.node.clone()).collect();
    nodes.dedup();
    Totals {
        gpus: gpus.len() as u64,
        nodes,
        gpu_hours: gpus.iter().map(|g| g.time_s).sum::<f64>() / 3600.0,
        gpu_util_mean_pct: mean(|g| g.gpu_util_mean_pct),
        sm_active_mean_pct: mean(|g| g.sm_active_mean_pct),
        energy_kwh: gpus
            .iter()
            .filter_map(|g| g.energy_kwh)
            .reduce(|a, b| a + b),
    }
}

/// One piece of advice, with the rule that raised it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hint {
    /// `idle_gpus`, `low_sm_activity`, `memory_unused`, `throttled`, `xid`.
    pub kind: &'static str,
    pub text: String,
}

/// The name of a device in a sentence: `gpu-node-017 GPU 1` (MIG: `… GPU 0 MIG 1/0`).
pub fn device_name(g: &GpuFigures) -> String {
    match (g.gpu_instance_id, g.compute_instance_id) {
        (Some(gi), Some(ci)) => format!("{} GPU {} MIG {gi}/{ci}", g.node, g.gpu),
        (Some(gi), None) => format!("{} GPU {} MIG {gi}", g.node, g.gpu),
        _ => format!("{} GPU {}", g.node, g.gpu),
    }
}

fn names(gpus: &[&GpuFigures]) -> String {
    const SHOWN: usize = 4;
    let mut text: Vec<String> = gpus.iter().take(SHOWN).map(|g| device_name(g)).collect();
    if gpus.len() > SHOWN {
        text.push(format!("{} more", gpus.len() - SHOWN));
    }
    text.join(", ")
}

/// XIDs seen on the job's GPUs, by code: (code, count).
pub type XidCounts = BTreeMap<i64, u64>;

/// The hints, by the thresholds above, in a fixed order.
pub fn hints(gpus: &[GpuFigures], xids: &XidCounts) -> Vec<Hint> {
    let mut hints = Vec::new();
    let idle: Vec<&GpuFigures> = gpus
        .iter()
        .filter(|g| g.gpu_util_mean_pct.is_some_and(|u| u < IDLE_UTIL_PCT))
        .collect();
    if !idle.is_empty() {
        hints.push(Hint {
            kind: "idle_gpus",
            text: format!(
                "{} of {} GPUs were idle (mean utilization under {IDLE_UTIL_PCT} %): {}. \
                 Request only the GPUs the program uses, or check that it spreads its work \
                 over all of them (e.g. one rank per GPU).",
                idle.len(),
                gpus.len(),
                names(&idle)
            ),
        });
    }
    let busy = |g: &&GpuFigures| !g.gpu_util_mean_pct.is_some_and(|u| u < IDLE_UTIL_PCT);
    let low_sm: Vec<&GpuFigures> = gpus
        .iter()
        .filter(busy)
        .filter(|g| g.sm_active_mean_pct.is_some_and(|s| s < LOW_SM_ACTIVE_PCT))
        .collect();
    if !low_sm.is_empty() {
        hints.push(Hint {
            kind: "low_sm_activity",
            text: format!(
                "Low SM activity (mean under {LOW_SM_ACTIVE_PCT} %) on {}: the GPU is busy \
                 but its kernels keep few of its SMs working. Larger batches, fused kernels \
                 or mixed precision usually raise it.",
                names(&low_sm)
            ),
        });
    }
    let low_memory: Vec<&GpuFigures> = gpus
        .iter()
        .filter(busy)
        .filter(|g| g.memory_used_max_pct.is_some_and(|m| m < LOW_MEMORY_PCT))
        .collect();
    if !low_memory.is_empty() {
        hints.push(Hint {
            kind: "memory_unused",
            text: format!(
                "Peak memory under {LOW_MEMORY_PCT} % of the GPU's total on {}: the job would \
                 fit a smaller GPU or a MIG slice, or could run larger batches.",
                names(&low_memory)
            ),
        });
    }
    let throttled: Vec<&GpuFigures> = gpus
        .iter()
        .filter(|g| {
            let t = g.throttle_thermal_s + g.throttle_power_s + g.throttle_hw_slowdown_s;
            g.time_s > 0.0 && t * 100.0 / g.time_s > THROTTLE_SHARE_PCT
        })
        .collect();
    if !throttled.is_empty() {
        hints.push(Hint {
            kind: "throttled",
            text: format!(
                "Clocks slowed for heat or power more than {THROTTLE_SHARE_PCT} % of the time \
                 on {}: the job ran slower than the GPU can; tell the cluster's admins \
                 (cooling, power limits).",
                names(&throttled)
            ),
        });
    }
    if !xids.is_empty() {
        let codes: Vec<String> = xids
            .iter()
            .map(|(code, count)| {
                let what = u64::try_from(*code)
                    .ok()
                    .and_then(gputel_schemas::xid::lookup)
                    .map_or_else(
                        || "unknown".to_owned(),
                        |x| format!("{}, {}", x.name, x.category.name()),
                    );
                format!("{code} ×{count} ({what})")
            })
            .collect();
        hints.push(Hint {
            kind: "xid",
            text: format!(
                "XID errors on the job's GPUs: {}. Application XIDs are the program's own \
                 faults; the others are the GPU's or the driver's (see the XID catalogue).",
                codes.join("; ")
            ),
        });
    }
    hints
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(node: &str, gpu: u32) -> Device {
        Device {
            node: node.into(),
            gpu,
            gpu_instance_id: None,
            compute_instance_id: None,
        }
    }

    fn sample(ts_s: i64, util: f64) -> Sample {
        Sample {
            ts_us: ts_s * 1_000_000,
            gpu_util_pct: Some(util),
            ..Sample::default()
        }
    }

    #[test]
    fn each_sample_stands_for_the_gap_to_the_next_capped_at_three_intervals() {
        let s = 1_000_000;
        // 1 s ticks, one 10 s outage, then the last sample.
        let ts = [0, s, 2 * s, 3 * s, 13 * s, 14 * s];
        assert_eq!(median_gap_us(&ts), Some(s));
        assert_eq!(weights_us(&ts, 0), [s, s, s, 3 * s, s, s]);
        // A single sample takes the fallback; none gives none.
        assert_eq!(weights_us(&[5 * s], 15 * s), [15 * s]);
        assert_eq!(weights_us(&[], s), Vec::<i64>::new());
        // An even count of gaps takes the lower middle.
        assert_eq!(median_gap_us(&[0, 1, 3, 6, 10]), Some(2));
    }

    #[test]
    fn a_fleet_of_1s_and_15s_agents_is_weighted_by_time_not_by_samples() {
        // Node a samples every second at 100 %, node b every 15 s at 0 %,
        // both for 60 s: each is half the GPU time, whatever the counts.
        let mut samples = BTreeMap::new();
        samples.insert(
            device("a", 0),
            (0..60).map(|t| sample(t, 100.0)).collect::<Vec<_>>(),
        );
        samples.insert(
            device("b", 0),
            (0..4).map(|t| sample(t * 15, 0.0)).collect::<Vec<_>>(),
        );
        let gpus = figures(samples, &BTreeMap::new());
        assert_eq!(gpus[0].samples, 60);
        assert_eq!(gpus[0].time_s, 60.0);
        assert_eq!(gpus[0].interval_s, 1.0);
        assert_eq!(gpus[1].samples, 4);
        assert_eq!(gpus[1].time_s, 60.0);
        assert_eq!(gpus[1].interval_s, 15.0);
        let totals = totals(&gpus);
        assert_eq!(totals.gpu_util_mean_pct, Some(50.0));
        assert_eq!(totals.gpu_hours, 120.0 / 3600.0);
        assert_eq!(totals.nodes, ["a", "b"]);
        // A sample count would say 60/64 = 93.75 %.
    }

    #[test]
    fn a_gpus_figures_weigh_each_sample_by_its_time() {
        let rows = vec![
            // 10 s at 100 W, 80 %, thermal throttling, 10 of 80 GiB.
            Sample {
                ts_us: 0,
                gpu_util_pct: Some(80.0),
                sm_active_pct: Some(40.0),
                fb_used_bytes: Some(10 << 30),
                fb_total_bytes: Some(80 << 30),
                power_mw: Some(100_000),
                temperature_c: Some(60),
                memory_temperature_c: Some(70),
                clock_event_reasons: Some(0x20),
            },
            // 10 s at 300 W, 40 %, power capped, 20 GiB; then its last 10 s.
            Sample {
                ts_us: 10_000_000,
                gpu_util_pct: Some(40.0),
                sm_active_pct: None,
                fb_used_bytes: Some(20 << 30),
                fb_total_bytes: Some(80 << 30),
                power_mw: Some(300_000),
                temperature_c: Some(80),
                memory_temperature_c: None,
                clock_event_reasons: Some(0x4),
            },
            Sample {
                ts_us: 20_000_000,
                gpu_util_pct: Some(40.0),
                power_mw: Some(300_000),
                clock_event_reasons: Some(0x8 | 0x1),
                ..Sample::default()
            },
        ];
        let mut samples = BTreeMap::new();
        // Stored twice and out of order: counted once.
        let mut twice = rows.clone();
        twice.extend(rows.iter().rev().cloned());
        samples.insert(device("n", 3), twice);
        let g = &figures(samples, &BTreeMap::new())[0];
        assert_eq!(g.samples, 3);
        assert_eq!(g.time_s, 30.0);
        assert_eq!(g.gpu_util_mean_pct, Some(160.0 / 3.0));
        assert_eq!(g.gpu_util_max_pct, Some(80.0));
        assert_eq!(g.sm_active_mean_pct, Some(40.0));
        assert_eq!(g.memory_used_max_bytes, Some(20 << 30));
        assert_eq!(g.memory_used_max_pct, Some(25.0));
        assert_eq!(g.power_mean_w, Some(700.0 / 3.0));
        assert_eq!(g.power_max_w, Some(300.0));
        // (100 + 300 + 300) W × 10 s = 7000 J.
        assert_eq!(g.energy_kwh, Some(7000.0 / 3.6e6));
        assert_eq!(g.temperature_mean_c, Some(70.0));
        assert_eq!(g.temperature_max_c, Some(80));
        assert_eq!(g.memory_temperature_max_c, Some(70));
        assert_eq!(g.throttle_thermal_s, 10.0);
        assert_eq!(g.throttle_power_s, 10.0);
        assert_eq!(g.throttle_hw_slowdown_s, 10.0);
    }

    fn gpu(node: &str, util: f64, sm: Option<f64>, memory_pct: f64, throttle_s: f64) -> GpuFigures {
        let mut samples = BTreeMap::new();
        samples.insert(device(node, 0), vec![sample(0, util), sample(100, util)]);
        let mut g = figures(samples, &BTreeMap::new()).remove(0);
        g.sm_active_mean_pct = sm;
        g.memory_used_max_pct = Some(memory_pct);
        g.throttle_thermal_s = throttle_s;
        g
    }

    #[test]
    fn hints_follow_their_thresholds() {
        // Each GPU just on the quiet side of every threshold: no hint.
        let fine = [gpu("a", 5.0, Some(25.0), 25.0, 10.0)];
        assert_eq!(hints(&fine, &XidCounts::new()), []);
        // Just past them: one hint each.
        let gpus = [
            gpu("a", 4.9, Some(1.0), 1.0, 0.0),
            gpu("b", 90.0, Some(24.9), 24.9, 10.1),
            gpu("c", 90.0, None, 90.0, 0.0),
        ];
        let xids = XidCounts::from([(13, 2), (79, 1), (999, 1)]);
        let got = hints(&gpus, &xids);
        let kinds: Vec<&str> = got.iter().map(|h| h.kind).collect();
        assert_eq!(
            kinds,
            [
                "idle_gpus",
                "low_sm_activity",
                "memory_unused",
                "throttled",
                "xid"
            ]
        );
        // The idle GPU is named once, as idle; not again for its SMs or memory.
        assert!(
            got[0]
                .text
                .starts_with("1 of 3 GPUs were idle (mean utilization under 5 %): a GPU 0.")
        );
        assert!(got[1].text.contains(" on b GPU 0: "), "{}", got[1].text);
        assert!(got[2].text.contains(" on b GPU 0: "), "{}", got[2].text);
        assert!(got[3].text.contains(" on b GPU 0: "), "{}", got[3].text);
        assert!(
            got[4].text.starts_with(
                "XID errors on the job's GPUs: 13 ×2 (Graphics Engine Exception, application); \
                 79 ×1 (GPU has fallen off the bus, hardware); 999 ×1 (unknown)."
            ),
            "{}",
            got[4].text
        );
    }
}
