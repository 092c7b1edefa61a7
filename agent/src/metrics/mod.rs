//! The agent's `/metrics` endpoint: the latest tick's values in the Prometheus
//! text exposition format 0.0.4, under dcgm-exporter's metric and label names
//! so that its Grafana dashboards and alert rules work unchanged.
//!
//! The sampling thread hands every tick's batch to [`Metrics::record`], which
//! keeps the rows and updates the event counters; a scrape renders what the
//! last tick recorded, so scraping never calls NVML or reads /proc.
//!
//! Units follow DCGM, not the wire protocol: watts, MiB, ratios 0–1 for the
//! profiling (GPM) fields. A field the sample leaves unset has no series.

mod gpu;
mod ib;
mod node;
mod serve;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use gputel_proto::{Batch, EventKind, GpuSample, IbPortSample, NodeSample};
use prometheus::TextEncoder;
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

use crate::clock::now_us;
use gpu::*;
use ib::*;
use node::*;
pub use serve::{BindError, bind, serve};

/// The scrape path.
pub const PATH: &str = "/metrics";
/// The response's content type: the text format 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// dcgm-exporter's label names on every per-GPU series.
const LABEL_GPU: &str = "gpu";
const LABEL_UUID: &str = "UUID";
const LABEL_DEVICE: &str = "device";
const LABEL_MODEL: &str = "modelName";
/// dcgm-exporter's labels of a MIG device's series, after `modelName`.
const LABEL_MIG_PROFILE: &str = "GPU_I_PROFILE";
const LABEL_MIG_ID: &str = "GPU_I_ID";
const LABEL_HOSTNAME: &str = "Hostname";
/// dcgm-exporter's HPC job mapping label, present only when the job is known.
const LABEL_HPC_JOB: &str = "hpc_job";

const MIB: u64 = 1024 * 1024;

/// Counters and gauges as Prometheus types them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gauge,
    Counter,
}

/// A metric read from one row: its name, type, help text and how its value
/// comes from the row (None: no series for that row).
#[derive(Debug)]
struct RowMetric<R: 'static> {
    name: &'static str,
    kind: Kind,
    help: &'static str,
    value: fn(&R) -> Option<f64>,
}

/// The agent itself.
const AGENT_INFO: &str = "gputel_agent_build_info";
const AGENT_INFO_HELP: &str = "Always 1; the version label is the agent's version.";
const AGENT_TICKS: &str = "gputel_agent_ticks_total";
const AGENT_TICKS_HELP: &str = "Ticks sampled since the agent started.";
const AGENT_LAST_TICK: &str = "gputel_agent_last_tick_timestamp_seconds";
const AGENT_LAST_TICK_HELP: &str = "Time of the last tick, in seconds since the Unix epoch.";
const AGENT_TICK_DURATION: &str = "gputel_agent_tick_duration_seconds";
const AGENT_TICK_DURATION_HELP: &str = "Seconds from the last tick's time until all its samples were taken (wake-up delay plus sampling).";

/// The latest tick's values and the counters that outlive ticks, for
/// scrapes. Thread-safe: the sampling thread records, the HTTP side renders.
#[derive(Debug)]
pub struct Metrics {
    /// The node name, dcgm-exporter's `Hostname` label.
    hostname: String,
    state: Mutex<Recorded>,
}

/// What the ticks so far left for scrapes.
#[derive(Debug, Clone, Default)]
struct Recorded {
    /// The last tick's rows, shared with scrapes in progress.
    tick: Arc<TickRows>,
    /// Per GPU (index, UUID): its events since the agent started.
    events: BTreeMap<(u32, String), GpuEvents>,
    ticks: u64,
}

#[derive(Debug, Default)]
struct TickRows {
    ts_us: i64,
    /// Seconds from `ts_us` until the tick was recorded.
    duration_s: f64,
    gpu: Vec<GpuSample>,
    node: Option<NodeSample>,
    ib: Vec<IbPortSample>,
}

#[derive(Debug, Clone, Default)]
struct GpuEvents {
    /// The GPU's model, from its rows, for the labels of DCGM_FI_DEV_XID_ERRORS.
    model: String,
    last_xid: Option<u64>,
    /// Count per XID.
    xids: BTreeMap<u64, u64>,
    /// Count per event kind name.
    kinds: BTreeMap<&'static str, u64>,
}

impl Metrics {
    /// Empty metrics for node `hostname`; a scrape before the first tick shows
    /// only the agent's own metrics.
    pub fn new(hostname: &str) -> Self {
        Self {
            hostname: hostname.to_owned(),
            state: Mutex::new(Recorded::default()),
        }
    }

    /// Takes one tick's batch: its rows replace the previous tick's, its
    /// events are counted. Call it once per tick from the sampling loop; it
    /// copies the rows (about half a microsecond for eight GPUs, four IB
    /// ports, in a release build) and waits on a scrape at most as long as
    /// the scrape takes to clone the recorded state (an `Arc` and the event
    /// counters).
    pub fn record(&self, batch: &Batch) {
        self.record_at(batch, now_us());
    }

    fn record_at(&self, batch: &Batch, now_us: i64) {
        let ts_us = batch
            .node
            .first()
            .map(|n| n.ts_us)
            .or_else(|| batch.gpu.first().map(|g| g.ts_us))
            .or_else(|| batch.ib.first().map(|p| p.ts_us));
        let rows = Arc::new(TickRows {
            ts_us: ts_us.unwrap_or(0),
            duration_s: ts_us.map_or(0.0, |ts| (now_us - ts).max(0) as f64 / 1e6),
            gpu: batch.gpu.clone(),
            node: batch.node.first().cloned(),
            ib: batch.ib.clone(),
        });
        let mut state = self.lock();
        state.ticks += 1;
        for event in &batch.event {
            let kind = event.kind();
            let entry = state
                .events
                .entry((event.gpu, event.uuid.clone()))
                .or_default();
            if let Some(row) = batch
                .gpu
                .iter()
                .find(|g| g.gpu == event.gpu && g.uuid == event.uuid)
            {
                entry.model.clone_from(&row.model);
            }
            *entry.kinds.entry(kind.name()).or_default() += 1;
            if kind == EventKind::Xid {
                entry.last_xid = Some(event.code);
                *entry.xids.entry(event.code).or_default() += 1;
            }
        }
        let previous = std::mem::replace(&mut state.tick, rows);
        drop(state);
        // The previous rows are freed here, outside the lock (or by the last
        // scrape that still holds them).
        drop(previous);
    }

    /// Every metric in the text exposition format 0.0.4.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let state = self.lock().clone();
        let families = state.families(&self.hostname);
        let mut out = String::with_capacity(64 * 1024);
        TextEncoder::new().encode_utf8(&families, &mut out)?;
        Ok(out)
    }

    fn lock(&self) -> MutexGuard<'_, Recorded> {
        // A panic elsewhere while holding the lock leaves consistent data:
        // every update is a plain assignment or increment.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The scheduler job that owns a GPU, for dcgm-exporter's `hpc_job` label;
/// no label while the GPU is idle or shared by several jobs.
fn hpc_job(sample: &GpuSample) -> Option<&str> {
    sample.job_id.as_deref()
}

/// A MIG device row's profile and GPU instance id, for dcgm-exporter's
/// `GPU_I_PROFILE` and `GPU_I_ID` labels.
fn mig_labels(sample: &GpuSample) -> Option<(&str, u32)> {
    let gi = sample.gpu_instance_id?;
    Some((sample.mig_profile.as_deref().unwrap_or_default(), gi))
}

/// dcgm-exporter's labels of one GPU (or MIG device), in its order.
fn gpu_labels(
    gpu: u32,
    uuid: &str,
    model: &str,
    mig: Option<(&str, u32)>,
    hostname: &str,
    job: Option<&str>,
) -> Vec<LabelPair> {
    let mut labels = vec![
        label(LABEL_GPU, gpu.to_string()),
        label(LABEL_UUID, uuid),
        // dcgm-exporter names the device node, nvidia<minor>; the minor number
        // is not on the wire and equals the index on ordinary systems.
        label(LABEL_DEVICE, format!("nvidia{gpu}")),
        label(LABEL_MODEL, model),
    ];
    if let Some((profile, gi)) = mig {
        labels.push(label(LABEL_MIG_PROFILE, profile));
        labels.push(label(LABEL_MIG_ID, gi.to_string()));
    }
    labels.push(label(LABEL_HOSTNAME, hostname));
    if let Some(job) = job {
        labels.push(label(LABEL_HPC_JOB, job));
    }
    labels
}

/// The labels of gputel's own per-GPU series: dcgm-exporter's without the
/// camelCase `modelName` (join on `UUID` for the model).
fn gputel_gpu_labels(gpu: u32, uuid: &str, hostname: &str) -> Vec<LabelPair> {
    vec![
        label(LABEL_GPU, gpu.to_string()),
        label(LABEL_UUID, uuid),
        label(LABEL_DEVICE, format!("nvidia{gpu}")),
        label(LABEL_HOSTNAME, hostname),
    ]
}

impl Recorded {
    fn families(&self, hostname: &str) -> Vec<MetricFamily> {
        let tick = &self.tick;
        let mut out = Vec::new();

        let row_labels: Vec<Vec<LabelPair>> = tick
            .gpu
            .iter()
            .map(|g| {
                gpu_labels(
                    g.gpu,
                    &g.uuid,
                    &g.model,
                    mig_labels(g),
                    hostname,
                    hpc_job(g),
                )
            })
            .collect();
        for m in GPU_METRICS {
            let series = tick
                .gpu
                .iter()
                .zip(&row_labels)
                .filter_map(|(g, labels)| (m.value)(g).map(|v| sample(labels.clone(), m.kind, v)))
                .collect();
            push(&mut out, m.name, m.help, m.kind, series);
        }

        // Events: GPUs keep their series after they leave the rows (a GPU
        // that fell off the bus after an XID is the interesting case).
        let job_of = |gpu: u32, uuid: &str| {
            tick.gpu
                .iter()
                .find(|g| g.gpu == gpu && g.uuid == uuid && g.gpu_instance_id.is_none())
                .and_then(hpc_job)
        };
        let mut last_xid = Vec::new();
        let mut xids = Vec::new();
        let mut kinds = Vec::new();
        for ((gpu, uuid), events) in &self.events {
            if let Some(xid) = events.last_xid {
                let labels = gpu_labels(
                    *gpu,
                    uuid,
                    &events.model,
                    None,
                    hostname,
                    job_of(*gpu, uuid),
                );
                last_xid.push(sample(labels, Kind::Gauge, xid as f64));
            }
            let labels = gputel_gpu_labels(*gpu, uuid, hostname);
            for (xid, count) in &events.xids {
                let mut labels = labels.clone();
                labels.push(label("xid", xid.to_string()));
                xids.push(sample(labels, Kind::Counter, *count as f64));
            }
            for (kind, count) in &events.kinds {
                let mut labels = labels.clone();
                labels.push(label("kind", *kind));
                kinds.push(sample(labels, Kind::Counter, *count as f64));
            }
        }
        push(&mut out, XID_LAST, XID_LAST_HELP, Kind::Gauge, last_xid);
        push(&mut out, XID_EVENTS, XID_EVENTS_HELP, Kind::Counter, xids);
        push(&mut out, GPU_EVENTS, GPU_EVENTS_HELP, Kind::Counter, kinds);

        if let Some(node) = &tick.node {
            for m in NODE_METRICS {
                let series = (m.value)(node)
                    .map(|v| sample(Vec::new(), m.kind, v))
                    .into_iter()
                    .collect();
                push(&mut out, m.name, m.help, m.kind, series);
            }
            let cpu = NODE_CPU_MODES
                .iter()
                .filter_map(|(mode, pct)| {
                    pct(node)
                        .and_then(ratio)
                        .map(|v| sample(vec![label("mode", *mode)], Kind::Gauge, v))
                })
                .collect();
            push(&mut out, NODE_CPU, NODE_CPU_HELP, Kind::Gauge, cpu);
        }

        let port_labels: Vec<Vec<LabelPair>> = tick
            .ib
            .iter()
            .map(|p| {
                vec![
                    label("device", p.device.as_str()),
                    label("port", p.port.to_string()),
                ]
            })
            .collect();
        let states = tick
            .ib
            .iter()
            .zip(&port_labels)
            .map(|(p, labels)| {
                let mut labels = labels.clone();
                labels.push(label("state", p.state.as_str()));
                sample(labels, Kind::Gauge, 1.0)
            })
            .collect();
        push(&mut out, IB_STATE, IB_STATE_HELP, Kind::Gauge, states);
        for m in IB_METRICS {
            let series = tick
                .ib
                .iter()
                .zip(&port_labels)
                .filter_map(|(p, labels)| (m.value)(p).map(|v| sample(labels.clone(), m.kind, v)))
                .collect();
            push(&mut out, m.name, m.help, m.kind, series);
        }

        let info = vec![sample(
            vec![label("version", env!("CARGO_PKG_VERSION"))],
            Kind::Gauge,
            1.0,
        )];
        push(&mut out, AGENT_INFO, AGENT_INFO_HELP, Kind::Gauge, info);
        let ticks = vec![sample(Vec::new(), Kind::Counter, self.ticks as f64)];
        push(
            &mut out,
            AGENT_TICKS,
            AGENT_TICKS_HELP,
            Kind::Counter,
            ticks,
        );
        if self.ticks > 0 {
            let last = vec![sample(Vec::new(), Kind::Gauge, tick.ts_us as f64 / 1e6)];
            push(
                &mut out,
                AGENT_LAST_TICK,
                AGENT_LAST_TICK_HELP,
                Kind::Gauge,
                last,
            );
            let took = vec![sample(Vec::new(), Kind::Gauge, tick.duration_s)];
            push(
                &mut out,
                AGENT_TICK_DURATION,
                AGENT_TICK_DURATION_HELP,
                Kind::Gauge,
                took,
            );
        }
        out
    }
}

/// Adds a family unless it has no series (the format has no empty families).
fn push(out: &mut Vec<MetricFamily>, name: &str, help: &str, kind: Kind, series: Vec<Metric>) {
    if series.is_empty() {
        return;
    }
    let mut family = MetricFamily::default();
    family.set_name(name.to_owned());
    family.set_help(help.to_owned());
    family.set_field_type(match kind {
        Kind::Gauge => MetricType::GAUGE,
        Kind::Counter => MetricType::COUNTER,
    });
    family.set_metric(series);
    out.push(family);
}

fn sample(labels: Vec<LabelPair>, kind: Kind, value: f64) -> Metric {
    let mut metric = Metric::from_label(labels);
    match kind {
        Kind::Gauge => {
            let mut gauge = Gauge::default();
            gauge.set_value(value);
            metric.set_gauge(gauge);
        }
        Kind::Counter => {
            let mut counter = Counter::default();
            counter.set_value(value);
            metric.set_counter(counter);
        }
    }
    metric
}

fn label(name: &str, value: impl Into<String>) -> LabelPair {
    let mut pair = LabelPair::default();
    pair.set_name(name.to_owned());
    pair.set_value(value.into());
    pair
}

/// Milli-units to units (mW to W).
fn milli(v: u32) -> f64 {
    f64::from(v) / 1000.0
}

/// Bytes to whole MiB, rounded down as DCGM does.
fn mib(bytes: u64) -> f64 {
    (bytes / MIB) as f64
}

fn flag(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

/// An `f32` as the decimal it prints as (0.52, not 0.5199999809265137);
/// None when not finite.
fn decimal(v: f32) -> Option<f64> {
    if !v.is_finite() {
        return None;
    }
    v.to_string().parse().ok()
}

/// A percentage as DCGM's ratio 0–1, to six decimals (finer than an `f32`
/// percentage holds, and 97.3 % reads 0.973, not 0.9729999999999999).
fn ratio(pct: f32) -> Option<f64> {
    decimal(pct).map(|p| (p * 1e4).round() / 1e6)
}

#[cfg(test)]
mod tests {
    use gputel_proto::GpuEvent;

    use super::*;

    const TS_US: i64 = 1_795_240_815_000_000;

    fn h100(gpu: u32) -> GpuSample {
        GpuSample {
            ts_us: TS_US,
            gpu,
            uuid: format!("GPU-0000000{gpu}-fake-4000-8000-00000000000{gpu}"),
            model: "NVIDIA H100 80GB HBM3".into(),
            temperature_c: Some(61),
            memory_temperature_c: Some(68),
            power_mw: Some(512_345),
            energy_mj: Some(123_456_789),
            sm_clock_mhz: Some(1980),
            memory_clock_mhz: Some(2619),
            gpu_util_pct: Some(97),
            memory_copy_util_pct: Some(41),
            fb_used_bytes: Some(42_949_672_960),
            fb_free_bytes: Some(42_571_137_024),
            fb_total_bytes: Some(85_520_809_984),
            sm_active_pct: Some(97.3),
            sm_occupancy_pct: Some(41.25),
            tensor_active_pct: Some(12.5),
            dram_active_pct: Some(0.5),
            gr_engine_active_pct: Some(98.5),
            power_limit_mw: Some(700_000),
            clock_event_reasons: Some(0x4),
            ecc_corrected_volatile: Some(3),
            ecc_uncorrected_volatile: Some(0),
            ecc_corrected_aggregate: Some(17),
            ecc_uncorrected_aggregate: Some(1),
            remapped_rows_corrected: Some(2),
            remapped_rows_uncorrected: Some(0),
            remapped_rows_pending: Some(false),
            remapped_rows_failure: Some(false),
            pcie_replay_count: Some(5),
            pcie_tx_bytes_per_s: Some(1_000_000),
            pcie_rx_bytes_per_s: Some(2_000_000),
            nvlink_tx_bytes_per_s: Some(300_000_000_000),
            nvlink_rx_bytes_per_s: Some(290_000_000_000),
            ..GpuSample::default()
        }
    }

    /// Labels of h100(gpu) on node gpu-node-017.
    fn labels(gpu: u32) -> String {
        format!(
            "gpu=\"{gpu}\",UUID=\"GPU-0000000{gpu}-fake-4000-8000-00000000000{gpu}\",device=\"nvidia{gpu}\",\
             modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"gpu-node-017\""
        )
    }

    fn xid(gpu: u32, code: u64) -> GpuEvent {
        GpuEvent {
            ts_us: TS_US,
            gpu,
            uuid: format!("GPU-0000000{gpu}-fake-4000-8000-00000000000{gpu}"),
            kind: EventKind::Xid as i32,
            code,
            ..GpuEvent::default()
        }
    }

    fn rendered(metrics: &Metrics) -> Vec<String> {
        metrics
            .render()
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The sample lines (not comments) of metric `name`.
    fn series(lines: &[String], name: &str) -> Vec<String> {
        lines
            .iter()
            .filter(|l| {
                l.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            })
            .cloned()
            .collect()
    }

    #[test]
    fn gpu_rows_render_with_dcgm_names_labels_and_units() {
        let metrics = Metrics::new("gpu-node-017");
        let batch = Batch {
            seq: 1,
            gpu: vec![h100(0), h100(1)],
            ..Batch::default()
        };
        metrics.record_at(&batch, TS_US + 1500);
        let lines = rendered(&metrics);
        let l0 = labels(0);
        let l1 = labels(1);
        for (name, value) in [
            ("DCGM_FI_DEV_SM_CLOCK", "1980"),
            ("DCGM_FI_DEV_MEM_CLOCK", "2619"),
            ("DCGM_FI_DEV_MEMORY_TEMP", "68"),
            ("DCGM_FI_DEV_GPU_TEMP", "61"),
            // mW to W.
            ("DCGM_FI_DEV_POWER_USAGE", "512.345"),
            ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "700"),
            ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "123456789"),
            ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "5"),
            ("DCGM_FI_DEV_GPU_UTIL", "97"),
            ("DCGM_FI_DEV_MEM_COPY_UTIL", "41"),
            ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "4"),
            // Bytes to MiB, rounded down: 42571137024 B is 40599.0234375 MiB.
            ("DCGM_FI_DEV_FB_FREE", "40599"),
            ("DCGM_FI_DEV_FB_USED", "40960"),
            ("DCGM_FI_DEV_FB_TOTAL", "81559"),
            ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "3"),
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "0"),
            ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "17"),
            ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "1"),
            ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "2"),
            ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "0"),
            ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "0"),
            ("DCGM_FI_DEV_ROW_REMAP_PENDING", "0"),
            // Percent to DCGM's ratio.
            ("DCGM_FI_PROF_SM_ACTIVE", "0.973"),
            ("DCGM_FI_PROF_SM_OCCUPANCY", "0.4125"),
            ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0.125"),
            ("DCGM_FI_PROF_DRAM_ACTIVE", "0.005"),
            ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0.985"),
            ("DCGM_FI_PROF_PCIE_TX_BYTES", "1000000"),
            ("DCGM_FI_PROF_PCIE_RX_BYTES", "2000000"),
            ("DCGM_FI_PROF_NVLINK_TX_BYTES", "300000000000"),
            ("DCGM_FI_PROF_NVLINK_RX_BYTES", "290000000000"),
        ] {
            assert_eq!(
                series(&lines, name),
                [
                    format!("{name}{{{l0}}} {value}"),
                    format!("{name}{{{l1}}} {value}")
                ],
                "{name}"
            );
        }
        // Header lines: help and dcgm-exporter's types.
        let text = lines.join("\n");
        for header in [
            "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).\n# TYPE DCGM_FI_DEV_POWER_USAGE gauge",
            "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n# TYPE DCGM_FI_DEV_FB_USED gauge",
            "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter",
            "# TYPE DCGM_FI_DEV_PCIE_REPLAY_COUNTER counter",
            "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter",
            "# TYPE DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS counter",
            "# TYPE DCGM_FI_DEV_ROW_REMAP_FAILURE gauge",
            "# TYPE DCGM_FI_PROF_SM_ACTIVE gauge",
            "# TYPE DCGM_FI_PROF_PCIE_TX_BYTES gauge",
        ] {
            assert!(text.contains(header), "no {header:?} in\n{text}");
        }
        // Every family has help and type; every sample a family above it.
        for family in lines.iter().filter_map(|l| l.strip_prefix("# TYPE ")) {
            let name = family.split(' ').next().unwrap();
            assert!(
                lines
                    .iter()
                    .any(|l| l.starts_with(&format!("# HELP {name} "))),
                "{name} has no help"
            );
        }
        // No job is known yet, so no hpc_job label.
        assert!(!text.contains("hpc_job"), "{text}");
        // Retired pages are pre-Ampere: unset on an H100, so no series.
        assert!(!text.contains("DCGM_FI_DEV_RETIRED"), "{text}");
    }

    #[test]
    fn unset_fields_have_no_series() {
        let metrics = Metrics::new("gpu-node-017");
        let bare = GpuSample {
            ts_us: TS_US,
            gpu: 1,
            uuid: "GPU-0000000a-fake-4000-8000-00000000000a".into(),
            model: "NVIDIA A100-SXM4-80GB".into(),
            temperature_c: Some(34),
            ..GpuSample::default()
        };
        let mut full = h100(0);
        full.sm_active_pct = None;
        full.power_mw = None;
        let batch = Batch {
            gpu: vec![full, bare],
            ..Batch::default()
        };
        metrics.record_at(&batch, TS_US);
        let lines = rendered(&metrics);
        assert_eq!(
            series(&lines, "DCGM_FI_DEV_GPU_TEMP"),
            [
                format!("DCGM_FI_DEV_GPU_TEMP{{{}}} 61", labels(0)),
                "DCGM_FI_DEV_GPU_TEMP{gpu=\"1\",UUID=\"GPU-0000000a-fake-4000-8000-00000000000a\",\
                 device=\"nvidia1\",modelName=\"NVIDIA A100-SXM4-80GB\",Hostname=\"gpu-node-017\"} 34"
                    .to_owned(),
            ]
        );
        // Only GPU 0 has the others; an unset field on GPU 0 has no series at all.
        assert_eq!(series(&lines, "DCGM_FI_DEV_MEMORY_TEMP").len(), 1);
        assert_eq!(series(&lines, "DCGM_FI_DEV_FB_USED").len(), 1);
        for absent in [
            "DCGM_FI_PROF_SM_ACTIVE",
            "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_XID_ERRORS",
        ] {
            assert!(
                !lines.iter().any(|l| l.contains(absent)),
                "{absent} rendered:\n{}",
                lines.join("\n")
            );
        }
    }

    #[test]
    fn xids_are_counted_across_batches_and_the_last_one_stays() {
        let metrics = Metrics::new("gpu-node-017");
        metrics.record_at(
            &Batch {
                gpu: vec![h100(0), h100(1)],
                event: vec![xid(1, 79), xid(1, 48)],
                ..Batch::default()
            },
            TS_US,
        );
        // The next tick: another 79 on GPU 1, and GPU 1 is gone from the rows.
        let mut next = h100(0);
        next.ts_us = TS_US + 1_000_000;
        metrics.record_at(
            &Batch {
                gpu: vec![next],
                event: vec![xid(1, 79)],
                ..Batch::default()
            },
            TS_US + 1_000_000,
        );
        let lines = rendered(&metrics);
        let uuid = "GPU-00000001-fake-4000-8000-000000000001";
        assert_eq!(
            series(&lines, "DCGM_FI_DEV_XID_ERRORS"),
            [format!("DCGM_FI_DEV_XID_ERRORS{{{}}} 79", labels(1))]
        );
        let own = format!("gpu=\"1\",UUID=\"{uuid}\",device=\"nvidia1\",Hostname=\"gpu-node-017\"");
        assert_eq!(
            series(&lines, "gputel_xid_events_total"),
            [
                format!("gputel_xid_events_total{{{own},xid=\"48\"}} 1"),
                format!("gputel_xid_events_total{{{own},xid=\"79\"}} 2"),
            ]
        );
        assert_eq!(
            series(&lines, "gputel_gpu_events_total"),
            [format!("gputel_gpu_events_total{{{own},kind=\"xid\"}} 3")]
        );
        let text = lines.join("\n");
        assert!(
            text.contains("# TYPE DCGM_FI_DEV_XID_ERRORS gauge"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE gputel_xid_events_total counter"),
            "{text}"
        );
        assert_eq!(
            series(&lines, "gputel_agent_ticks_total"),
            ["gputel_agent_ticks_total 2"]
        );
        assert_eq!(
            series(&lines, "gputel_agent_last_tick_timestamp_seconds"),
            ["gputel_agent_last_tick_timestamp_seconds 1795240816"]
        );
        // Without a node row the batch's time is the GPU rows'.
        assert_eq!(
            series(&lines, "gputel_agent_tick_duration_seconds"),
            ["gputel_agent_tick_duration_seconds 0"]
        );
    }

    #[test]
    fn host_and_infiniband_rows_render_under_gputel_names() {
        let metrics = Metrics::new("gpu-node-017");
        let node = NodeSample {
            ts_us: TS_US,
            cpu_count: 224,
            cpu_user_pct: Some(45.2),
            cpu_system_pct: Some(3.1),
            cpu_iowait_pct: None,
            cpu_idle_pct: Some(51.7),
            memory_total_bytes: Some(2_164_110_770_176),
            memory_used_bytes: Some(242_539_954_176),
            memory_available_bytes: Some(1_921_570_816_000),
            load1: Some(23.41),
            load5: Some(22.87),
            load15: None,
            jobs: Vec::new(),
        };
        let port = IbPortSample {
            ts_us: TS_US,
            device: "mlx5_0".into(),
            port: 1,
            state: "ACTIVE".into(),
            rate_gbps: Some(400.0),
            xmit_bytes: Some(7_937_843_893_307_364),
            rcv_bytes: Some(1_000),
            xmit_packets: Some(10),
            rcv_packets: None,
            xmit_bytes_per_s: Some(12_345.5),
            symbol_error: Some(0),
            link_downed: Some(1),
            ..IbPortSample::default()
        };
        metrics.record_at(
            &Batch {
                node: vec![node],
                ib: vec![port],
                ..Batch::default()
            },
            TS_US + 2500,
        );
        let lines = rendered(&metrics);
        let expect = |name: &str, want: &[&str]| assert_eq!(series(&lines, name), want, "{name}");
        expect("gputel_node_cpus", &["gputel_node_cpus 224"]);
        expect(
            "gputel_node_cpu_ratio",
            &[
                "gputel_node_cpu_ratio{mode=\"user\"} 0.452",
                "gputel_node_cpu_ratio{mode=\"system\"} 0.031",
                "gputel_node_cpu_ratio{mode=\"idle\"} 0.517",
            ],
        );
        expect(
            "gputel_node_memory_total_bytes",
            &["gputel_node_memory_total_bytes 2164110770176"],
        );
        expect(
            "gputel_node_memory_used_bytes",
            &["gputel_node_memory_used_bytes 242539954176"],
        );
        expect(
            "gputel_node_memory_available_bytes",
            &["gputel_node_memory_available_bytes 1921570816000"],
        );
        expect("gputel_node_load1", &["gputel_node_load1 23.41"]);
        expect("gputel_node_load5", &["gputel_node_load5 22.87"]);
        expect("gputel_node_load15", &[]);
        let port = "device=\"mlx5_0\",port=\"1\"";
        expect(
            "gputel_infiniband_port_state",
            &[&format!(
                "gputel_infiniband_port_state{{{port},state=\"ACTIVE\"}} 1"
            )],
        );
        // 400 Gb/s is 50 GB/s.
        expect(
            "gputel_infiniband_rate_bytes_per_second",
            &[&format!(
                "gputel_infiniband_rate_bytes_per_second{{{port}}} 50000000000"
            )],
        );
        expect(
            "gputel_infiniband_port_data_transmitted_bytes_total",
            &[&format!(
                "gputel_infiniband_port_data_transmitted_bytes_total{{{port}}} 7937843893307364"
            )],
        );
        expect(
            "gputel_infiniband_port_data_transmitted_bytes_per_second",
            &[&format!(
                "gputel_infiniband_port_data_transmitted_bytes_per_second{{{port}}} 12345.5"
            )],
        );
        expect("gputel_infiniband_port_packets_received_total", &[]);
        expect(
            "gputel_infiniband_link_downed_total",
            &[&format!("gputel_infiniband_link_downed_total{{{port}}} 1")],
        );
        expect(
            "gputel_agent_tick_duration_seconds",
            &["gputel_agent_tick_duration_seconds 0.0025"],
        );
        expect(
            "gputel_agent_last_tick_timestamp_seconds",
            &["gputel_agent_last_tick_timestamp_seconds 1795240815"],
        );
        let text = lines.join("\n");
        assert!(text.contains("# TYPE gputel_infiniband_port_data_received_bytes_total counter"));
        assert!(text.contains("# TYPE gputel_node_cpu_ratio gauge"));
        // No GPU rows, no DCGM series.
        assert!(!text.contains("DCGM_"), "{text}");
    }

    #[test]
    fn before_the_first_tick_only_the_agent_reports() {
        let metrics = Metrics::new("gpu-node-017");
        assert_eq!(
            metrics.render().unwrap(),
            format!(
                "# HELP gputel_agent_build_info Always 1; the version label is the agent's version.\n\
                 # TYPE gputel_agent_build_info gauge\n\
                 gputel_agent_build_info{{version=\"{}\"}} 1\n\
                 # HELP gputel_agent_ticks_total Ticks sampled since the agent started.\n\
                 # TYPE gputel_agent_ticks_total counter\n\
                 gputel_agent_ticks_total 0\n",
                env!("CARGO_PKG_VERSION")
            )
        );
    }

    #[test]
    fn label_values_are_escaped() {
        let metrics = Metrics::new("n");
        let mut g = h100(0);
        g.model = "a \"quoted\" \\ model\n".into();
        metrics.record_at(
            &Batch {
                gpu: vec![g],
                ..Batch::default()
            },
            TS_US,
        );
        let text = metrics.render().unwrap();
        assert!(
            text.contains(r#"modelName="a \"quoted\" \\ model\n",Hostname="n"} 61"#),
            "{text}"
        );
    }

    #[test]
    fn ratios_and_decimals_read_as_written() {
        assert_eq!(ratio(97.3), Some(0.973));
        assert_eq!(ratio(100.0), Some(1.0));
        assert_eq!(ratio(0.0), Some(0.0));
        assert_eq!(ratio(33.333_332), Some(0.333333));
        assert_eq!(ratio(f32::NAN), None);
        assert_eq!(decimal(0.52), Some(0.52));
        assert_eq!(decimal(f32::INFINITY), None);
    }

    /// A MIG device's series carry dcgm-exporter's GPU_I_PROFILE and
    /// GPU_I_ID after modelName; the GPU's own row keeps the physical
    /// series, so power is counted once per GPU.
    #[test]
    fn mig_devices_get_the_instance_labels_and_power_stays_on_the_gpu() {
        let metrics = Metrics::new("gpu-node-017");
        let gpu = GpuSample {
            fb_used_bytes: None,
            fb_free_bytes: None,
            fb_total_bytes: None,
            mig_mode: Some(true),
            ..h100(0)
        };
        let instance = GpuSample {
            ts_us: TS_US,
            gpu: 0,
            uuid: gpu.uuid.clone(),
            model: gpu.model.clone(),
            gpu_instance_id: Some(9),
            compute_instance_id: Some(0),
            mig_profile: Some("1g.10gb".into()),
            fb_used_bytes: Some(5 * MIB + 7),
            job_id: Some("4242".into()),
            ..GpuSample::default()
        };
        let batch = Batch {
            gpu: vec![gpu, instance],
            ..Batch::default()
        };
        metrics.record_at(&batch, TS_US);
        let text = metrics.render().expect("render");
        let fb = "DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"GPU-00000000-fake-4000-8000-000000000000\",\
                  device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",GPU_I_PROFILE=\"1g.10gb\",\
                  GPU_I_ID=\"9\",Hostname=\"gpu-node-017\",hpc_job=\"4242\"} 5\n";
        assert!(text.contains(fb), "{text}");
        assert_eq!(text.matches("DCGM_FI_DEV_FB_USED{").count(), 1, "{text}");
        let power = format!("DCGM_FI_DEV_POWER_USAGE{{{}}} 512.345\n", labels(0));
        assert!(text.contains(&power), "{text}");
        assert_eq!(
            text.matches("DCGM_FI_DEV_POWER_USAGE{").count(),
            1,
            "{text}"
        );
    }
}
