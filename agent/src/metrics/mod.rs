//! The agent's `/metrics` endpoint: the latest tick's values in the Prometheus
//! text exposition format 0.0.4, under dcgm-exporter's metric and label names
//! so that its Grafana dashboards and alert rules work unchanged.
//!
//! The sampling thread hands every tick's batch to [`Metrics::record`], which
//! keeps the rows and updates the event counters; a scrape renders what the
//! last tick recorded, so scraping never calls NVML or reads /proc. The
//! first scrape after a tick renders the page and keeps its bytes (and, on
//! the first request for it, a gzip copy); later scrapes in the same tick
//! send those bytes again, so a tick costs at most one render and one
//! compression however often it is scraped, and none when it is not.
//!
//! Units follow DCGM, not the wire protocol: watts, MiB, ratios 0–1 for the
//! profiling (GPM) fields. A field the sample leaves unset has no series.
//!
//! Labels follow dcgm-exporter 4.6.0-4.8.3, in its order: `gpu`, `UUID`,
//! `pci_bus_id`, `device`, `modelName`, `hostname` (or the `Hostname` of
//! earlier releases, see [`HostnameLabel`]), `DCGM_FI_DRIVER_VERSION` (a
//! `label` row of its default counters), then its attributes sorted by
//! name: `err_code`, `err_msg` (XID series only), and who holds the GPU:
//! `container`, `hpc_job`, `namespace`, `pod` (dcgm-exporter's Kubernetes
//! labels, from the kubelet's pod-resources API as it reads them).

mod gpu;
mod gzip;
mod ib;
mod node;
mod serve;
mod text;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use gputel_proto::{Batch, EventKind, GpuSample, IbPortSample, NodeSample};
use gputel_runtime::time::duration_us;
use tracing::warn;

use crate::clock::now_us;
use crate::sampler::gpu::{has_slow_readings, hold_slow_readings};
use gpu::*;
use gzip::Gzip;
use ib::*;
use node::*;
pub use serve::{BindError, accepts_gzip, bind, serve};
use text::{Labels, Text};

/// The scrape path.
pub const PATH: &str = "/metrics";
/// The response's content type: the text format 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// flate2's level for the gzip copy of a page. On the 89 KB page of 8 GPUs,
/// level 1 gives 7.9 KB in a quarter of level 6's CPU (zlib-rs: 69 against
/// 297 µs); see `metrics_scrape` in benches/README.md.
const GZIP_LEVEL: u32 = 1;
/// Room for a page of 8 GPUs, 4 IB ports and some events (89 KB), so the
/// page is written without growing its buffer.
const PAGE_CAPACITY: usize = 128 * 1024;

/// dcgm-exporter's label names on every per-GPU series.
const LABEL_GPU: &str = "gpu";
const LABEL_UUID: &str = "UUID";
const LABEL_PCI_BUS_ID: &str = "pci_bus_id";
const LABEL_DEVICE: &str = "device";
const LABEL_MODEL: &str = "modelName";
/// The driver version: a `label` row of dcgm-exporter's default counters,
/// named after its DCGM field.
const LABEL_DRIVER_VERSION: &str = "DCGM_FI_DRIVER_VERSION";
/// The XID of `DCGM_FI_DEV_XID_ERRORS`, and its text from the XID catalogue.
const LABEL_ERR_CODE: &str = "err_code";
const LABEL_ERR_MSG: &str = "err_msg";
/// dcgm-exporter's labels of a MIG device's series, after `modelName`.
const LABEL_MIG_PROFILE: &str = "GPU_I_PROFILE";
const LABEL_MIG_ID: &str = "GPU_I_ID";
/// dcgm-exporter's HPC job mapping label, present only when the job is known.
const LABEL_HPC_JOB: &str = "hpc_job";
const LABEL_POD: &str = "pod";
const LABEL_NAMESPACE: &str = "namespace";
const LABEL_CONTAINER: &str = "container";

/// The name of the host label. dcgm-exporter renamed `Hostname` to
/// `hostname` in 4.6.0-4.8.3; dashboards written for earlier releases
/// select on `Hostname`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
pub enum HostnameLabel {
    /// `hostname`, as dcgm-exporter 4.6.0-4.8.3 and later write it.
    #[default]
    #[value(name = "hostname")]
    #[serde(rename = "hostname")]
    Lower,
    /// `Hostname`, as dcgm-exporter up to 4.5.3-4.8.2 wrote it.
    #[value(name = "Hostname")]
    #[serde(rename = "Hostname")]
    Capital,
}

impl HostnameLabel {
    /// The label's name.
    pub fn name(self) -> &'static str {
        match self {
            HostnameLabel::Lower => "hostname",
            HostnameLabel::Capital => "Hostname",
        }
    }
}

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
    host: HostLabels,
    /// How long a GPU's slow readings (energy, PCIe counters, ...: see
    /// `--slow-read-interval`) are shown after the tick that read them, in
    /// microseconds; 0 shows each tick's rows as they are.
    hold_us: i64,
    state: Mutex<Recorded>,
    /// Pages rendered so far (by scrapes and by [`Metrics::render`]).
    renders: AtomicU64,
    /// The compressor of every page's gzip copy.
    gzip: Mutex<Gzip>,
}

/// How a page's bytes are encoded on the wire (HTTP's content coding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// The text as it is.
    Identity,
    /// gzip, for a request whose `Accept-Encoding` allows it.
    Gzip,
}

/// One scrape's answer: the page's bytes, in `encoding`. The bytes are
/// shared with the tick's cache, so cloning them copies nothing.
#[derive(Debug, Clone)]
pub struct Page {
    pub body: Bytes,
    pub encoding: Encoding,
}

/// One tick's page, rendered by the first scrape that wants it. A tick
/// replaces the whole cache, so no page outlives the rows it shows.
#[derive(Debug, Default)]
struct PageCache {
    /// The text.
    plain: OnceLock<Bytes>,
    /// The text gzip-compressed, made on the first gzip request.
    gzip: OnceLock<Bytes>,
}

/// What every per-GPU series says of the node.
#[derive(Debug, Clone)]
struct HostLabels {
    /// The node name, dcgm-exporter's host label's value.
    hostname: String,
    label: HostnameLabel,
    /// NVML's driver version; without it, no `DCGM_FI_DRIVER_VERSION` label.
    driver_version: Option<String>,
}

/// The identity of a GPU as its rows last gave it, for the series of GPUs
/// that have left the rows (a GPU that fell off the bus keeps its XIDs).
#[derive(Debug, Clone, Default)]
struct GpuIdentity {
    gpu: u32,
    uuid: String,
    model: String,
    pci_bus_id: String,
}

/// What the ticks so far left for scrapes.
#[derive(Debug, Clone, Default)]
struct Recorded {
    /// The last tick's rows, shared with scrapes in progress.
    tick: Arc<TickRows>,
    /// Per GPU (index, UUID): its events since the agent started.
    events: BTreeMap<(u32, String), GpuEvents>,
    /// Every GPU that ever had a row, as its last row gave it.
    identity: Vec<GpuIdentity>,
    ticks: u64,
    /// The page of what is recorded here, once a scrape rendered it.
    page: Arc<PageCache>,
}

#[derive(Debug, Default)]
struct TickRows {
    ts_us: i64,
    /// Seconds from `ts_us` until the tick was recorded.
    duration_s: f64,
    gpu: Vec<GpuSample>,
    /// Per row of `gpu`: when its slow readings were read (i64::MIN: never).
    slow_read_us: Vec<i64>,
    node: Option<NodeSample>,
    ib: Vec<IbPortSample>,
}

#[derive(Debug, Clone, Default)]
struct GpuEvents {
    last_xid: Option<u64>,
    /// Count per XID.
    xids: BTreeMap<u64, u64>,
    /// Count per event kind name.
    kinds: BTreeMap<&'static str, u64>,
}

impl Metrics {
    /// Empty metrics for node `hostname`, under the label `hostname` and
    /// without a driver version; a scrape before the first tick shows only
    /// the agent's own metrics.
    pub fn new(hostname: &str) -> Self {
        Self {
            host: HostLabels {
                hostname: hostname.to_owned(),
                label: HostnameLabel::default(),
                driver_version: None,
            },
            hold_us: 0,
            state: Mutex::new(Recorded::default()),
            renders: AtomicU64::new(0),
            gzip: Mutex::new(Gzip::new(GZIP_LEVEL)),
        }
    }

    /// The host label's name.
    pub fn with_hostname_label(mut self, label: HostnameLabel) -> Self {
        self.host.label = label;
        self
    }

    /// Shows each GPU's slow readings, which the agent takes once per
    /// `interval` (`--slow-read-interval`), at the ticks between too, as a
    /// scraper expects every series at every scrape; a reading older than
    /// `interval` plus `tick` (a slow read that failed) is not shown.
    pub fn with_slow_reads(mut self, interval: Duration, tick: Duration) -> Self {
        self.hold_us = duration_us(interval + tick);
        self
    }

    /// The driver version every per-GPU series carries as
    /// `DCGM_FI_DRIVER_VERSION`; None leaves that label out.
    pub fn with_driver_version(mut self, version: Option<&str>) -> Self {
        self.host.driver_version = version.map(str::to_owned);
        self
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
        let mut gpu = batch.gpu.clone();
        let slow_read_us = if self.hold_us > 0 {
            // Only this thread records, so the previous rows stay the last ones.
            let previous = Arc::clone(&self.lock().tick);
            gpu.iter_mut()
                .map(|row| self.hold_slow_readings(&previous, row))
                .collect()
        } else {
            Vec::new()
        };
        let rows = Arc::new(TickRows {
            ts_us: ts_us.unwrap_or(0),
            duration_s: ts_us.map_or(0.0, |ts| (now_us - ts).max(0) as f64 / 1e6),
            gpu,
            slow_read_us,
            node: batch.node.first().cloned(),
            ib: batch.ib.clone(),
        });
        let mut state = self.lock();
        state.ticks += 1;
        for row in &batch.gpu {
            let pci_bus_id = row.pci_bus_id.as_deref().unwrap_or_default();
            // Allocates only for a GPU not seen before or one whose identity changed.
            let known = state
                .identity
                .iter_mut()
                .find(|k| k.gpu == row.gpu && k.uuid == row.uuid);
            match known {
                Some(k) if k.model == row.model && k.pci_bus_id == pci_bus_id => {}
                Some(k) => {
                    k.model.clone_from(&row.model);
                    pci_bus_id.clone_into(&mut k.pci_bus_id);
                }
                None => state.identity.push(GpuIdentity {
                    gpu: row.gpu,
                    uuid: row.uuid.clone(),
                    model: row.model.clone(),
                    pci_bus_id: pci_bus_id.to_owned(),
                }),
            }
        }
        for event in &batch.event {
            let kind = event.kind();
            let entry = state
                .events
                .entry((event.gpu, event.uuid.clone()))
                .or_default();
            *entry.kinds.entry(kind.name()).or_default() += 1;
            if kind == EventKind::Xid {
                entry.last_xid = Some(event.code);
                *entry.xids.entry(event.code).or_default() += 1;
            }
        }
        let previous = std::mem::replace(&mut state.tick, rows);
        let previous_page = std::mem::take(&mut state.page);
        drop(state);
        // The previous rows and page are freed here, outside the lock (or by
        // the last scrape that still holds them).
        drop(previous);
        drop(previous_page);
    }

    /// Fills `row`'s slow readings from the previous tick's row of the same
    /// GPU or MIG device when `row` is not from a slow-read tick and those
    /// are recent enough; returns when `row`'s readings were read.
    fn hold_slow_readings(&self, previous: &TickRows, row: &mut GpuSample) -> i64 {
        if has_slow_readings(row) {
            return row.ts_us;
        }
        let same = |p: &GpuSample| {
            p.gpu == row.gpu
                && p.gpu_instance_id == row.gpu_instance_id
                && p.compute_instance_id == row.compute_instance_id
                && p.uuid == row.uuid
        };
        match previous
            .gpu
            .iter()
            .zip(&previous.slow_read_us)
            .find(|(p, _)| same(p))
        {
            Some((held, &read_us)) if row.ts_us.saturating_sub(read_us) <= self.hold_us => {
                hold_slow_readings(held, row);
                read_us
            }
            _ => i64::MIN,
        }
    }

    /// The page for a scrape that wants `encoding`: the cached bytes of the
    /// last tick's page, rendered (and compressed) first if no scrape since
    /// that tick has done it.
    pub fn scrape(&self, encoding: Encoding) -> Page {
        // The page and the state it shows are taken under one lock, so a
        // tick in between cannot put its values in the previous tick's page.
        let (page, snapshot) = {
            let state = self.lock();
            let page = Arc::clone(&state.page);
            let snapshot = page.plain.get().is_none().then(|| state.clone());
            (page, snapshot)
        };
        let plain = page
            .plain
            .get_or_init(|| match &snapshot {
                Some(state) => Bytes::from(self.render_state(state)),
                // Rendered when the page was taken: not called.
                None => Bytes::from(self.render()),
            })
            .clone();
        let body = match encoding {
            Encoding::Identity => plain,
            Encoding::Gzip => match page.gzip.get() {
                Some(bytes) => bytes.clone(),
                None => match lock(&self.gzip).compress(&plain) {
                    Ok(bytes) => page.gzip.get_or_init(|| Bytes::from(bytes)).clone(),
                    Err(e) => {
                        warn!(error = %e, "cannot gzip /metrics; sending it uncompressed");
                        return Page {
                            body: plain,
                            encoding: Encoding::Identity,
                        };
                    }
                },
            },
        };
        Page { body, encoding }
    }

    /// Every metric in the text exposition format 0.0.4, rendered now
    /// (uncached; scrapes use [`Metrics::scrape`]).
    pub fn render(&self) -> String {
        let state = self.lock().clone();
        self.render_state(&state)
    }

    /// Pages rendered since the agent started.
    pub fn renders(&self) -> u64 {
        self.renders.load(Ordering::Relaxed)
    }

    fn render_state(&self, state: &Recorded) -> String {
        self.renders.fetch_add(1, Ordering::Relaxed);
        let mut text = Text::with_capacity(PAGE_CAPACITY);
        state.write(&self.host, &mut text);
        text.finish()
    }

    fn lock(&self) -> MutexGuard<'_, Recorded> {
        lock(&self.state)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere while holding a lock leaves consistent data: every
    // update is a plain assignment or increment.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Who holds a GPU, as dcgm-exporter labels it: `hpc_job`, the scheduler
/// job (no label while the GPU is idle or shared by several jobs), and, on
/// Kubernetes, `pod`, `namespace` and `container` (no labels while no one
/// pod holds it; `container` only when one container does).
fn holder_labels(sample: &GpuSample) -> Vec<(&'static str, &str)> {
    let mut labels = Vec::new();
    if let Some(job) = sample.job_id.as_deref() {
        labels.push((LABEL_HPC_JOB, job));
    }
    if let (Some(namespace), Some(pod)) =
        (sample.pod_namespace.as_deref(), sample.pod_name.as_deref())
    {
        labels.push((LABEL_POD, pod));
        labels.push((LABEL_NAMESPACE, namespace));
        if let Some(container) = sample.container.as_deref() {
            labels.push((LABEL_CONTAINER, container));
        }
    }
    labels
}

/// A MIG device row's profile and GPU instance id, for dcgm-exporter's
/// `GPU_I_PROFILE` and `GPU_I_ID` labels.
fn mig_labels(sample: &GpuSample) -> Option<(&str, u32)> {
    let gi = sample.gpu_instance_id?;
    Some((sample.mig_profile.as_deref().unwrap_or_default(), gi))
}

/// A GPU's identity, borrowed from a row or from [`GpuIdentity`].
#[derive(Debug, Clone, Copy)]
struct Id<'a> {
    gpu: u32,
    uuid: &'a str,
    model: &'a str,
    pci_bus_id: &'a str,
}

impl GpuIdentity {
    fn id(&self) -> Id<'_> {
        Id {
            gpu: self.gpu,
            uuid: &self.uuid,
            model: &self.model,
            pci_bus_id: &self.pci_bus_id,
        }
    }
}

/// The identity a GPU row gives.
fn id_of(row: &GpuSample) -> Id<'_> {
    Id {
        gpu: row.gpu,
        uuid: &row.uuid,
        model: &row.model,
        pci_bus_id: row.pci_bus_id.as_deref().unwrap_or_default(),
    }
}

/// dcgm-exporter's labels of one GPU (or MIG device), in its order: the
/// GPU's identity, the MIG device's, the host, the driver version, then its
/// attributes (`err_code`, `err_msg`) and the holder's labels (`hpc_job`,
/// `pod`, `namespace`, `container`), together sorted by name.
fn gpu_labels(
    id: Id<'_>,
    mig: Option<(&str, u32)>,
    host: &HostLabels,
    attributes: &[(&str, &str)],
    holder: &[(&str, &str)],
) -> Labels {
    // dcgm-exporter names the device node, nvidia<minor>; the minor number
    // is not on the wire and equals the index on ordinary systems.
    let mut labels = Labels::new()
        .with(LABEL_GPU, &id.gpu.to_string())
        .with(LABEL_UUID, id.uuid)
        .with(LABEL_PCI_BUS_ID, id.pci_bus_id)
        .with(LABEL_DEVICE, &format!("nvidia{}", id.gpu))
        .with(LABEL_MODEL, id.model);
    if let Some((profile, gi)) = mig {
        labels = labels
            .with(LABEL_MIG_PROFILE, profile)
            .with(LABEL_MIG_ID, &gi.to_string());
    }
    labels = labels.with(host.label.name(), &host.hostname);
    if let Some(version) = &host.driver_version {
        labels = labels.with(LABEL_DRIVER_VERSION, version);
    }
    let mut sorted: Vec<(&str, &str)> = attributes.iter().chain(holder).copied().collect();
    sorted.sort_unstable_by_key(|(name, _)| *name);
    for (name, value) in sorted {
        labels = labels.with(name, value);
    }
    labels
}

/// The labels of gputel's own per-GPU series: dcgm-exporter's identity and
/// host labels, in its order, without the camelCase `modelName` and the
/// driver version (join on `UUID` for those).
fn gputel_gpu_labels(id: Id<'_>, host: &HostLabels) -> Labels {
    Labels::new()
        .with(LABEL_GPU, &id.gpu.to_string())
        .with(LABEL_UUID, id.uuid)
        .with(LABEL_PCI_BUS_ID, id.pci_bus_id)
        .with(LABEL_DEVICE, &format!("nvidia{}", id.gpu))
        .with(host.label.name(), &host.hostname)
}

impl Recorded {
    /// Writes every family with a series, in the page's order.
    fn write(&self, host: &HostLabels, text: &mut Text) {
        let tick = &self.tick;
        let no_labels = Labels::new();

        let row_labels: Vec<Labels> = tick
            .gpu
            .iter()
            .map(|g| gpu_labels(id_of(g), mig_labels(g), host, &[], &holder_labels(g)))
            .collect();
        for m in GPU_METRICS {
            text.family(m.name, m.help, m.kind);
            for (g, labels) in tick.gpu.iter().zip(&row_labels) {
                if let Some(v) = (m.value)(g) {
                    text.sample(labels, &[], v);
                }
            }
        }

        // Events: GPUs keep their series after they leave the rows (a GPU
        // that fell off the bus after an XID is the interesting case).
        let holder_of = |gpu: u32, uuid: &str| {
            tick.gpu
                .iter()
                .find(|g| g.gpu == gpu && g.uuid == uuid && g.gpu_instance_id.is_none())
                .map(holder_labels)
                .unwrap_or_default()
        };
        let with_events: Vec<(Id<'_>, &GpuEvents)> = self
            .events
            .iter()
            .map(|((gpu, uuid), events)| {
                let id = self
                    .identity
                    .iter()
                    .find(|k| k.gpu == *gpu && k.uuid == *uuid)
                    .map_or(
                        // A GPU lost before its first row: all that is known.
                        Id {
                            gpu: *gpu,
                            uuid,
                            model: "",
                            pci_bus_id: "",
                        },
                        GpuIdentity::id,
                    );
                (id, events)
            })
            .collect();
        text.family(XID_LAST, XID_LAST_HELP, Kind::Gauge);
        for (id, events) in &with_events {
            if let Some(xid) = events.last_xid {
                // dcgm-exporter's attributes of this family, sorted by name.
                let code = xid.to_string();
                let attributes = [
                    (LABEL_ERR_CODE, code.as_str()),
                    (LABEL_ERR_MSG, gputel_schemas::xid::err_msg(xid)),
                ];
                let holder = holder_of(id.gpu, id.uuid);
                let labels = gpu_labels(*id, None, host, &attributes, &holder);
                text.sample(&labels, &[], xid as f64);
            }
        }
        let own_labels: Vec<Labels> = with_events
            .iter()
            .map(|(id, _)| gputel_gpu_labels(*id, host))
            .collect();
        text.family(XID_EVENTS, XID_EVENTS_HELP, Kind::Counter);
        for ((_, events), labels) in with_events.iter().zip(&own_labels) {
            for (xid, count) in &events.xids {
                text.sample(labels, &[("xid", &xid.to_string())], *count as f64);
            }
        }
        text.family(GPU_EVENTS, GPU_EVENTS_HELP, Kind::Counter);
        for ((_, events), labels) in with_events.iter().zip(&own_labels) {
            for (kind, count) in &events.kinds {
                text.sample(labels, &[("kind", kind)], *count as f64);
            }
        }

        if let Some(node) = &tick.node {
            for m in NODE_METRICS {
                text.family(m.name, m.help, m.kind);
                if let Some(v) = (m.value)(node) {
                    text.sample(&no_labels, &[], v);
                }
            }
            text.family(NODE_CPU, NODE_CPU_HELP, Kind::Counter);
            let user_hz = procfs::ticks_per_second() as f64;
            for (mode, jiffies) in NODE_CPU_MODES {
                if let Some(v) = jiffies(node) {
                    text.sample(&no_labels, &[("mode", mode)], v as f64 / user_hz);
                }
            }
        }

        let port_labels: Vec<Labels> = tick
            .ib
            .iter()
            .map(|p| {
                Labels::new()
                    .with("device", &p.device)
                    .with("port", &p.port.to_string())
            })
            .collect();
        text.family(IB_STATE, IB_STATE_HELP, Kind::Gauge);
        for (p, labels) in tick.ib.iter().zip(&port_labels) {
            text.sample(labels, &[("state", &p.state)], 1.0);
        }
        text.family(IB_INFO, IB_INFO_HELP, Kind::Gauge);
        for (i, p) in tick.ib.iter().enumerate() {
            // One series per device, from its first port.
            if tick.ib[..i].iter().any(|d| d.device == p.device) {
                continue;
            }
            let labels = Labels::new()
                .with("device", &p.device)
                .with("board_id", p.board_id.as_deref().unwrap_or_default())
                .with("firmware_version", p.fw_ver.as_deref().unwrap_or_default())
                .with("hca_type", p.hca_type.as_deref().unwrap_or_default());
            text.sample(&labels, &[], 1.0);
        }
        for m in IB_METRICS {
            text.family(m.name, m.help, m.kind);
            for (p, labels) in tick.ib.iter().zip(&port_labels) {
                if let Some(v) = (m.value)(p) {
                    text.sample(labels, &[], v);
                }
            }
        }

        text.family(AGENT_INFO, AGENT_INFO_HELP, Kind::Gauge);
        text.sample(&no_labels, &[("version", env!("CARGO_PKG_VERSION"))], 1.0);
        text.family(AGENT_TICKS, AGENT_TICKS_HELP, Kind::Counter);
        text.sample(&no_labels, &[], self.ticks as f64);
        if self.ticks > 0 {
            text.family(AGENT_LAST_TICK, AGENT_LAST_TICK_HELP, Kind::Gauge);
            text.sample(&no_labels, &[], tick.ts_us as f64 / 1e6);
            text.family(AGENT_TICK_DURATION, AGENT_TICK_DURATION_HELP, Kind::Gauge);
            text.sample(&no_labels, &[], tick.duration_s);
        }
    }
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
    // ryu's digits, without an allocation, where they are `Display`'s (up
    // to FLT_DIG, 6).
    let mut buffer = ryu::Buffer::new();
    match text::shortest_as_displayed(&mut buffer, v, 6) {
        Some(shortest) => shortest.parse().ok(),
        None => v.to_string().parse().ok(),
    }
}

/// A percentage as DCGM's ratio 0–1, to six decimals (finer than an `f32`
/// percentage holds, and 97.3 % reads 0.973, not 0.9729999999999999).
fn ratio(pct: f32) -> Option<f64> {
    decimal(pct).map(|p| (p * 1e4).round() / 1e6)
}

#[cfg(test)]
mod tests {
    use gputel_proto::{GpuEvent, ProfilingSource};

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
            enc_util_pct: Some(7),
            dec_util_pct: Some(23),
            pci_bus_id: Some(format!("00000000:1{gpu}:00.0")),
            fb_used_bytes: Some(42_949_672_960),
            // total - used - reserved.
            fb_free_bytes: Some(42_004_905_984),
            fb_total_bytes: Some(85_520_809_984),
            fb_reserved_bytes: Some(566_231_040),
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

    /// The agent's metrics on node gpu-node-017 with driver 550.54.15.
    fn node_017() -> Metrics {
        Metrics::new("gpu-node-017").with_driver_version(Some("550.54.15"))
    }

    /// Labels of h100(gpu) on node_017(), in dcgm-exporter's order.
    fn labels(gpu: u32) -> String {
        format!(
            "gpu=\"{gpu}\",UUID=\"GPU-0000000{gpu}-fake-4000-8000-00000000000{gpu}\",\
             pci_bus_id=\"00000000:1{gpu}:00.0\",device=\"nvidia{gpu}\",\
             modelName=\"NVIDIA H100 80GB HBM3\",hostname=\"gpu-node-017\",\
             DCGM_FI_DRIVER_VERSION=\"550.54.15\""
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
        metrics.render().lines().map(str::to_owned).collect()
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
    fn slow_readings_are_shown_until_the_next_slow_read_and_no_longer() {
        const SECOND: i64 = 1_000_000;
        let metrics = node_017().with_slow_reads(Duration::from_secs(10), Duration::from_secs(1));
        let tick = |at: i64, row: GpuSample| {
            let batch = Batch {
                seq: 1,
                gpu: vec![GpuSample {
                    ts_us: TS_US + at * SECOND,
                    ..row
                }],
                ..Batch::default()
            };
            metrics.record_at(&batch, TS_US + at * SECOND + 1000);
            let lines = rendered(&metrics);
            [
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
                "DCGM_FI_PROF_PCIE_TX_BYTES",
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                "DCGM_FI_DEV_POWER_USAGE",
            ]
            .map(|name| {
                let s = series(&lines, name);
                s.first()
                    .map(|l| l.rsplit_once(' ').expect("a value").1.to_owned())
            })
        };
        // What the sampler leaves out between two slow reads.
        let between = |power_mw| GpuSample {
            energy_mj: None,
            pcie_replay_count: None,
            pcie_tx_bytes_per_s: None,
            pcie_rx_bytes_per_s: None,
            gr_engine_active_pct: None,
            profiling_source: Some(ProfilingSource::Gpm.into()),
            power_mw: Some(power_mw),
            ..h100(0)
        };
        let held = |power: &str| {
            [
                Some("123456789".to_owned()),
                Some("5".to_owned()),
                Some("1000000".to_owned()),
                Some("0.985".to_owned()),
                Some(power.to_owned()),
            ]
        };
        assert_eq!(tick(0, h100(0)), held("512.345"));
        // Between slow reads: the last ones, beside this tick's power.
        assert_eq!(tick(1, between(400_000)), held("400"));
        assert_eq!(tick(9, between(401_000)), held("401"));
        // A new slow read replaces them.
        let fresh = GpuSample {
            energy_mj: Some(123_460_000),
            ..h100(0)
        };
        assert_eq!(tick(10, fresh)[0].as_deref(), Some("123460000"));
        // Past the slow interval and one tick (a slow read that failed),
        // they are not shown: a stale counter is no reading.
        assert_eq!(tick(20, between(402_000))[0].as_deref(), Some("123460000"));
        assert_eq!(
            tick(22, between(403_000)),
            [None, None, None, None, Some("403".to_owned())]
        );
        // GPM's graphics activity marks a slow-read row; DCGM's, at every
        // tick, does not: the energy is still held beside it.
        assert_eq!(tick(23, h100(0))[0].as_deref(), Some("123456789"));
        let dcgm = GpuSample {
            gr_engine_active_pct: Some(50.0),
            profiling_source: Some(ProfilingSource::Dcgm.into()),
            ..between(404_000)
        };
        assert_eq!(
            tick(24, dcgm),
            [
                Some("123456789".to_owned()),
                Some("5".to_owned()),
                Some("1000000".to_owned()),
                Some("0.5".to_owned()),
                Some("404".to_owned())
            ]
        );
    }

    #[test]
    fn gpu_rows_render_with_dcgm_names_labels_and_units() {
        let metrics = node_017();
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
            ("DCGM_FI_DEV_ENC_UTIL", "7"),
            ("DCGM_FI_DEV_DEC_UTIL", "23"),
            ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "4"),
            // Bytes to MiB, rounded down: 42004905984 B is 40059.0234375 MiB.
            ("DCGM_FI_DEV_FB_FREE", "40059"),
            ("DCGM_FI_DEV_FB_USED", "40960"),
            ("DCGM_FI_DEV_FB_RESERVED", "540"),
            ("DCGM_FI_DEV_FB_TOTAL", "81559"),
            ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "3"),
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "0"),
            ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "17"),
            ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "1"),
            ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "2"),
            ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "0"),
            ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "0"),
            ("DCGM_FI_DEV_ROW_REMAP_PENDING", "0"),
            // DCGM's KiB/s / 1000 of both directions: 590e9 B/s / 1024 / 1000
            // = 576171.875, truncated.
            ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "576171"),
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
            "# HELP DCGM_FI_DEV_ENC_UTIL Encoder utilization (in %).\n# TYPE DCGM_FI_DEV_ENC_UTIL gauge",
            "# HELP DCGM_FI_DEV_FB_RESERVED Framebuffer memory reserved (in MiB).\n# TYPE DCGM_FI_DEV_FB_RESERVED gauge",
            // dcgm-exporter's type for a rate, kept for its dashboards.
            "# HELP DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL Total number of NVLink bandwidth counters for all lanes.\n\
             # TYPE DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL counter",
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
        let metrics = node_017();
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
                // No PCI address known: an empty label, as dcgm-exporter prints it.
                "DCGM_FI_DEV_GPU_TEMP{gpu=\"1\",UUID=\"GPU-0000000a-fake-4000-8000-00000000000a\",\
                 pci_bus_id=\"\",device=\"nvidia1\",modelName=\"NVIDIA A100-SXM4-80GB\",\
                 hostname=\"gpu-node-017\",DCGM_FI_DRIVER_VERSION=\"550.54.15\"} 34"
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
        let metrics = node_017();
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
        // The last XID, its code and the catalogue's text for it.
        assert_eq!(
            series(&lines, "DCGM_FI_DEV_XID_ERRORS"),
            [format!(
                "DCGM_FI_DEV_XID_ERRORS{{{},err_code=\"79\",err_msg=\"GPU has fallen off the bus\"}} 79",
                labels(1)
            )]
        );
        let own = format!(
            "gpu=\"1\",UUID=\"{uuid}\",pci_bus_id=\"00000000:11:00.0\",device=\"nvidia1\",\
             hostname=\"gpu-node-017\""
        );
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
    fn xid_attributes_follow_dcgm_exporters_order_and_the_catalogue() {
        let metrics = node_017();
        let mut with_job = h100(0);
        with_job.job_id = Some("4242".into());
        metrics.record_at(
            &Batch {
                gpu: vec![with_job, h100(1)],
                // NVML's "unknown XID" on GPU 0; 48 on GPU 1; 13 on a GPU 2
                // that never had a row (lost before the first tick).
                event: vec![xid(0, 999), xid(1, 48), xid(2, 13)],
                ..Batch::default()
            },
            TS_US,
        );
        let lines = rendered(&metrics);
        assert_eq!(
            series(&lines, "DCGM_FI_DEV_XID_ERRORS"),
            [
                // err_code, err_msg, then hpc_job: attributes sorted by name.
                format!(
                    "DCGM_FI_DEV_XID_ERRORS{{{},err_code=\"999\",err_msg=\"Unknown Error\",hpc_job=\"4242\"}} 999",
                    labels(0)
                ),
                format!(
                    "DCGM_FI_DEV_XID_ERRORS{{{},err_code=\"48\",err_msg=\"Double Bit ECC Error\"}} 48",
                    labels(1)
                ),
                "DCGM_FI_DEV_XID_ERRORS{gpu=\"2\",UUID=\"GPU-00000002-fake-4000-8000-000000000002\",\
                 pci_bus_id=\"\",device=\"nvidia2\",modelName=\"\",hostname=\"gpu-node-017\",\
                 DCGM_FI_DRIVER_VERSION=\"550.54.15\",err_code=\"13\",err_msg=\"Graphics Engine Exception\"} 13"
                    .to_owned(),
            ]
        );
        // The job's label is on every series of its GPU, last.
        assert_eq!(
            series(&lines, "DCGM_FI_DEV_GPU_TEMP")[0],
            format!("DCGM_FI_DEV_GPU_TEMP{{{},hpc_job=\"4242\"}} 61", labels(0))
        );
    }

    #[test]
    fn a_pods_gpu_carries_dcgm_exporters_kubernetes_labels() {
        let metrics = node_017();
        let in_pod = |gpu, container: Option<&str>| GpuSample {
            pod_namespace: Some("train".into()),
            pod_name: Some("llama-0".into()),
            container: container.map(str::to_owned),
            ..h100(gpu)
        };
        let mut with_job = in_pod(1, None);
        with_job.job_id = Some("77".into());
        metrics.record_at(
            &Batch {
                gpu: vec![in_pod(0, Some("trainer")), with_job],
                event: vec![xid(0, 79)],
                ..Batch::default()
            },
            TS_US,
        );
        let lines = rendered(&metrics);
        assert_eq!(
            series(&lines, "DCGM_FI_DEV_GPU_TEMP"),
            [
                format!(
                    "DCGM_FI_DEV_GPU_TEMP{{{},container=\"trainer\",namespace=\"train\",pod=\"llama-0\"}} 61",
                    labels(0)
                ),
                format!(
                    "DCGM_FI_DEV_GPU_TEMP{{{},hpc_job=\"77\",namespace=\"train\",pod=\"llama-0\"}} 61",
                    labels(1)
                ),
            ]
        );
        assert_eq!(
            series(&lines, "DCGM_FI_DEV_XID_ERRORS"),
            [format!(
                "DCGM_FI_DEV_XID_ERRORS{{{},container=\"trainer\",err_code=\"79\",\
                 err_msg=\"GPU has fallen off the bus\",namespace=\"train\",pod=\"llama-0\"}} 79",
                labels(0)
            )]
        );
    }

    #[test]
    fn the_host_label_can_keep_its_old_capital_name() {
        let metrics = Metrics::new("gpu-node-017").with_hostname_label(HostnameLabel::Capital);
        metrics.record_at(
            &Batch {
                gpu: vec![h100(0)],
                event: vec![xid(0, 79)],
                ..Batch::default()
            },
            TS_US,
        );
        let lines = rendered(&metrics);
        // Without a driver version, no DCGM_FI_DRIVER_VERSION label.
        let ids = "gpu=\"0\",UUID=\"GPU-00000000-fake-4000-8000-000000000000\",\
                   pci_bus_id=\"00000000:10:00.0\",device=\"nvidia0\"";
        assert_eq!(
            series(&lines, "DCGM_FI_DEV_GPU_TEMP"),
            [format!(
                "DCGM_FI_DEV_GPU_TEMP{{{ids},modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"gpu-node-017\"}} 61"
            )]
        );
        assert_eq!(
            series(&lines, "gputel_xid_events_total"),
            [format!(
                "gputel_xid_events_total{{{ids},Hostname=\"gpu-node-017\",xid=\"79\"}} 1"
            )]
        );
        assert!(!lines.iter().any(|l| l.contains("hostname=")), "{lines:#?}");
    }

    #[test]
    fn host_and_infiniband_rows_render_under_gputel_names() {
        let metrics = node_017();
        let node = NodeSample {
            ts_us: TS_US,
            cpu_count: 224,
            cpu_user_jiffies: Some(416_699_676_365),
            cpu_system_jiffies: Some(57_332_035),
            cpu_iowait_jiffies: None,
            cpu_idle_jiffies: Some(146_625_695),
            cpu_steal_jiffies: Some(0),
            memory_total_kib: Some(2_113_389_424),
            memory_available_kib: Some(1_876_534_000),
            load1: Some(23.41),
            load5: Some(22.87),
            load15: None,
            jobs: Vec::new(),
            cpu_package_energy_uj: Some(240_422_366_267),
            dram_energy_uj: None,
            cpu_package_power_w: Some(151.25),
            dram_power_w: None,
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
            symbol_error: Some(0),
            link_downed: Some(1),
            state_id: Some(4),
            phys_state: Some("LinkUp".into()),
            phys_state_id: Some(5),
            unicast_xmit_packets: Some(61_239),
            vl15_dropped: Some(2),
            board_id: Some("MT_0000000838".into()),
            fw_ver: Some("28.39.1002".into()),
            hca_type: None,
            ..IbPortSample::default()
        };
        // A second port of the same device: one info series for both.
        let port2 = IbPortSample {
            port: 2,
            state: "DOWN".into(),
            state_id: Some(1),
            phys_state_id: Some(3),
            ts_us: TS_US,
            device: "mlx5_0".into(),
            board_id: Some("MT_0000000838".into()),
            fw_ver: Some("28.39.1002".into()),
            ..IbPortSample::default()
        };
        metrics.record_at(
            &Batch {
                node: vec![node],
                ib: vec![port, port2],
                ..Batch::default()
            },
            TS_US + 2500,
        );
        let lines = rendered(&metrics);
        let expect = |name: &str, want: &[&str]| assert_eq!(series(&lines, name), want, "{name}");
        expect("gputel_node_cpus", &["gputel_node_cpus 224"]);
        expect(
            "gputel_node_cpu_seconds_total",
            &[
                // Jiffies ÷ USER_HZ (100 on the architectures Linux tests run on).
                "gputel_node_cpu_seconds_total{mode=\"user\"} 4166996763.65",
                "gputel_node_cpu_seconds_total{mode=\"system\"} 573320.35",
                "gputel_node_cpu_seconds_total{mode=\"idle\"} 1466256.95",
                "gputel_node_cpu_seconds_total{mode=\"steal\"} 0",
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
        expect(
            "gputel_node_rapl_package_joules_total",
            &["gputel_node_rapl_package_joules_total 240422.366267"],
        );
        expect(
            "gputel_node_rapl_package_power_watts",
            &["gputel_node_rapl_package_power_watts 151.25"],
        );
        expect("gputel_node_rapl_dram_joules_total", &[]);
        expect("gputel_node_rapl_dram_power_watts", &[]);
        let port = "device=\"mlx5_0\",port=\"1\"";
        let port2 = "device=\"mlx5_0\",port=\"2\"";
        expect(
            "gputel_infiniband_port_state",
            &[
                &format!("gputel_infiniband_port_state{{{port},state=\"ACTIVE\"}} 1"),
                &format!("gputel_infiniband_port_state{{{port2},state=\"DOWN\"}} 1"),
            ],
        );
        expect(
            "gputel_infiniband_state_id",
            &[
                &format!("gputel_infiniband_state_id{{{port}}} 4"),
                &format!("gputel_infiniband_state_id{{{port2}}} 1"),
            ],
        );
        expect(
            "gputel_infiniband_physical_state_id",
            &[
                &format!("gputel_infiniband_physical_state_id{{{port}}} 5"),
                &format!("gputel_infiniband_physical_state_id{{{port2}}} 3"),
            ],
        );
        expect(
            "gputel_infiniband_info",
            &[
                "gputel_infiniband_info{device=\"mlx5_0\",board_id=\"MT_0000000838\",\
               firmware_version=\"28.39.1002\",hca_type=\"\"} 1",
            ],
        );
        expect(
            "gputel_infiniband_unicast_packets_transmitted_total",
            &[&format!(
                "gputel_infiniband_unicast_packets_transmitted_total{{{port}}} 61239"
            )],
        );
        expect(
            "gputel_infiniband_vl15_dropped_total",
            &[&format!("gputel_infiniband_vl15_dropped_total{{{port}}} 2")],
        );
        expect("gputel_infiniband_port_discards_received_total", &[]);
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
        // Rates are for the reader to derive (PromQL's rate()): no per-second gauges.
        assert!(
            !lines
                .iter()
                .any(|l| l.contains("port_data_transmitted_bytes_per_second")),
            "{lines:#?}"
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
        assert!(text.contains("# TYPE gputel_node_cpu_seconds_total counter"));
        // No GPU rows, no DCGM series.
        assert!(!text.contains("DCGM_"), "{text}");
    }

    #[test]
    fn before_the_first_tick_only_the_agent_reports() {
        let metrics = node_017();
        assert_eq!(
            metrics.render(),
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

    fn gunzip(bytes: &[u8]) -> Vec<u8> {
        use std::io::Read as _;
        let mut text = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .read_to_end(&mut text)
            .expect("a gzip stream");
        text
    }

    /// Scrapes between two ticks send the bytes the first one rendered,
    /// plain or compressed, without rendering again; the next tick's
    /// scrape renders its values.
    #[test]
    fn scrapes_within_a_tick_render_once_and_share_the_bytes() {
        let metrics = node_017();
        let batch = |ts_us: i64, temperature_c: u32| Batch {
            gpu: vec![GpuSample {
                ts_us,
                temperature_c: Some(temperature_c),
                ..h100(0)
            }],
            ..Batch::default()
        };
        metrics.record_at(&batch(TS_US, 61), TS_US);
        assert_eq!(metrics.renders(), 0, "recording renders nothing");

        let first = metrics.scrape(Encoding::Identity);
        let second = metrics.scrape(Encoding::Identity);
        assert_eq!(first.encoding, Encoding::Identity);
        assert_eq!(first.body, second.body);
        // The same buffer, not an equal copy.
        assert_eq!(first.body.as_ptr(), second.body.as_ptr());
        assert_eq!(metrics.renders(), 1);
        // What an uncached render of the same state gives.
        let text = metrics.render();
        assert_eq!(first.body, text.as_bytes());
        assert_eq!(metrics.renders(), 2);

        let gzip = metrics.scrape(Encoding::Gzip);
        let again = metrics.scrape(Encoding::Gzip);
        assert_eq!(gzip.encoding, Encoding::Gzip);
        assert_eq!(gzip.body.as_ptr(), again.body.as_ptr());
        assert_eq!(&gzip.body[..2], [0x1f, 0x8b], "a gzip member");
        assert_eq!(gunzip(&gzip.body), first.body);
        assert!(
            gzip.body.len() * 4 < first.body.len(),
            "{}",
            gzip.body.len()
        );
        assert_eq!(metrics.renders(), 2, "compressing renders nothing");

        // The next tick: new values, one new render.
        metrics.record_at(&batch(TS_US + 1_000_000, 75), TS_US + 1_000_000);
        let next = metrics.scrape(Encoding::Gzip);
        assert_eq!(metrics.renders(), 3);
        let next = String::from_utf8(gunzip(&next.body)).expect("UTF-8");
        let lines: Vec<String> = next.lines().map(str::to_owned).collect();
        assert_eq!(
            series(&lines, "DCGM_FI_DEV_GPU_TEMP"),
            [format!("DCGM_FI_DEV_GPU_TEMP{{{}}} 75", labels(0))]
        );
        assert_eq!(
            series(&lines, "gputel_agent_ticks_total"),
            ["gputel_agent_ticks_total 2"]
        );
        let plain = metrics.scrape(Encoding::Identity);
        assert_eq!(plain.body, next.as_bytes());
        assert_eq!(metrics.renders(), 3);
    }

    /// Before the first tick there is a page too, and it is cached until
    /// the first tick replaces it.
    #[test]
    fn the_page_before_the_first_tick_is_cached_until_the_first_tick() {
        let metrics = node_017();
        let empty = metrics.scrape(Encoding::Identity);
        metrics.scrape(Encoding::Identity);
        assert_eq!(metrics.renders(), 1);
        assert!(
            std::str::from_utf8(&empty.body)
                .expect("UTF-8")
                .contains("gputel_agent_ticks_total 0\n")
        );
        metrics.record_at(
            &Batch {
                gpu: vec![h100(0)],
                ..Batch::default()
            },
            TS_US,
        );
        let page = metrics.scrape(Encoding::Identity);
        assert_eq!(metrics.renders(), 2);
        let text = std::str::from_utf8(&page.body).expect("UTF-8");
        assert!(text.contains("gputel_agent_ticks_total 1\n"), "{text}");
        assert!(text.contains("DCGM_FI_DEV_GPU_TEMP{"), "{text}");
    }

    /// A scrape that holds the previous tick's page while a tick comes in
    /// keeps what it has; the page it rendered is not the new tick's.
    #[test]
    fn a_tick_replaces_the_cached_page() {
        let metrics = node_017();
        metrics.record_at(
            &Batch {
                gpu: vec![h100(0)],
                ..Batch::default()
            },
            TS_US,
        );
        let before = metrics.scrape(Encoding::Gzip);
        metrics.record_at(
            &Batch {
                gpu: vec![h100(0), h100(1)],
                ..Batch::default()
            },
            TS_US + 1_000_000,
        );
        let after = metrics.scrape(Encoding::Gzip);
        assert_ne!(before.body, after.body);
        let before = String::from_utf8(gunzip(&before.body)).expect("UTF-8");
        let after = String::from_utf8(gunzip(&after.body)).expect("UTF-8");
        assert_eq!(before.matches("DCGM_FI_DEV_GPU_TEMP{").count(), 1);
        assert_eq!(after.matches("DCGM_FI_DEV_GPU_TEMP{").count(), 2);
        assert_eq!(metrics.renders(), 2);
    }

    /// Every family at once: eight H100s (one with a job, one with a model
    /// name to escape, one split into a MIG device), a bare A100, XIDs and
    /// other events (on a GPU that left the rows, and on one that never had
    /// a row), the node and four IB ports, over two ticks.
    fn every_family() -> Metrics {
        let metrics = node_017();
        let gpus = |tick: u32| -> Vec<GpuSample> {
            let mut rows: Vec<GpuSample> = (0..8)
                .map(|gpu| {
                    let mut row = h100(gpu);
                    row.ts_us = TS_US + i64::from(tick) * 1_000_000;
                    row.temperature_c = Some(50 + gpu + tick);
                    row.power_mw = Some(400_000 + 1_117 * gpu + 13 * tick);
                    row.energy_mj = Some(123_456_789 + 400_000 * u64::from(tick));
                    row.sm_active_pct = Some(90.0 + gpu as f32 / 3.0);
                    row.pcie_tx_bytes_per_s = Some(1_000_000 + u64::from(gpu));
                    row
                })
                .collect();
            rows[2].job_id = Some("4242".into());
            rows[3].model = "a \"quoted\" \\ model\n".into();
            rows[7].mig_mode = Some(true);
            rows.push(GpuSample {
                ts_us: rows[7].ts_us,
                gpu: 7,
                uuid: rows[7].uuid.clone(),
                model: rows[7].model.clone(),
                pci_bus_id: rows[7].pci_bus_id.clone(),
                gpu_instance_id: Some(9),
                compute_instance_id: Some(0),
                mig_profile: Some("1g.10gb".into()),
                fb_used_bytes: Some(5 * MIB + 7),
                job_id: Some("77".into()),
                ..GpuSample::default()
            });
            if tick == 0 {
                rows.push(GpuSample {
                    ts_us: TS_US,
                    gpu: 8,
                    uuid: "GPU-a100".into(),
                    model: "NVIDIA A100-SXM4-80GB".into(),
                    temperature_c: Some(34),
                    ..GpuSample::default()
                });
            }
            rows
        };
        let node = NodeSample {
            ts_us: TS_US,
            cpu_count: 224,
            cpu_user_jiffies: Some(416_699_676_365),
            cpu_system_jiffies: Some(57_332_035),
            cpu_iowait_jiffies: Some(1_057_559),
            cpu_idle_jiffies: Some(146_625_695),
            cpu_steal_jiffies: Some(0),
            memory_total_kib: Some(2_113_389_424),
            memory_available_kib: Some(1_876_534_000),
            load1: Some(23.41),
            load5: Some(22.87),
            load15: Some(21.96),
            cpu_package_energy_uj: Some(240_422_366_267),
            dram_energy_uj: Some(1_234_567),
            cpu_package_power_w: Some(151.25),
            dram_power_w: Some(20.5),
            ..NodeSample::default()
        };
        let port = |device: &str, port: u32, state: &str| IbPortSample {
            ts_us: TS_US,
            device: device.into(),
            port,
            state: state.into(),
            rate_gbps: Some(400.0),
            xmit_bytes: Some(7_937_843_893_307_364 + u64::from(port)),
            rcv_bytes: Some(1_000),
            xmit_packets: Some(10),
            rcv_packets: Some(11),
            symbol_error: Some(0),
            link_downed: Some(1),
            state_id: Some(4),
            phys_state: Some("LinkUp".into()),
            phys_state_id: Some(5),
            unicast_xmit_packets: Some(61_239),
            vl15_dropped: Some(2),
            board_id: Some("MT_0000000838".into()),
            fw_ver: Some("28.39.1002".into()),
            hca_type: (device != "mlx5_1").then(|| "MT4129".into()),
            ..IbPortSample::default()
        };
        let ib = vec![
            port("mlx5_0", 1, "ACTIVE"),
            port("mlx5_0", 2, "DOWN"),
            port("mlx5_1", 1, "ACTIVE"),
            port("mlx5_2", 1, "INIT"),
        ];
        let event = |gpu: u32, uuid: &str, kind: EventKind, code: u64| GpuEvent {
            ts_us: TS_US,
            gpu,
            uuid: uuid.into(),
            kind: kind as i32,
            code,
            ..GpuEvent::default()
        };
        metrics.record_at(
            &Batch {
                gpu: gpus(0),
                node: vec![node.clone()],
                ib: ib.clone(),
                event: vec![
                    xid(1, 79),
                    xid(1, 48),
                    xid(2, 999),
                    event(8, "GPU-a100", EventKind::Xid, 13),
                    event(8, "GPU-a100", EventKind::GpuLost, 0),
                    event(12, "GPU-never-seen", EventKind::Xid, 31),
                    event(4, &h100(4).uuid, EventKind::ThermalThrottle, 0),
                ],
                ..Batch::default()
            },
            TS_US + 1500,
        );
        metrics.record_at(
            &Batch {
                gpu: gpus(1),
                node: vec![NodeSample {
                    ts_us: TS_US + 1_000_000,
                    ..node
                }],
                ib,
                event: vec![
                    xid(1, 79),
                    event(4, &h100(4).uuid, EventKind::PowerThrottle, 0),
                ],
                ..Batch::default()
            },
            TS_US + 1_002_500,
        );
        metrics
    }

    /// The page of [`every_family`], byte for byte as the prometheus
    /// crate's text encoder wrote it (`testdata/every_family.txt`, the
    /// agent's version replaced by VERSION), so a change of how pages are
    /// made cannot change what they say. `GPUTEL_WRITE_GOLDEN=1` rewrites
    /// the file (then build and run again).
    #[test]
    fn every_family_renders_as_the_golden_page() {
        let page = every_family().render().replace(
            concat!("version=\"", env!("CARGO_PKG_VERSION"), "\""),
            "version=\"VERSION\"",
        );
        if std::env::var_os("GPUTEL_WRITE_GOLDEN").is_some() {
            std::fs::write(
                concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/src/metrics/testdata/every_family.txt"
                ),
                &page,
            )
            .expect("write the golden page");
        }
        let golden = include_str!("testdata/every_family.txt");
        assert_eq!(page, golden);
        assert_eq!(page.matches("# TYPE ").count(), 67);
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
        let text = metrics.render();
        assert!(
            text.contains(r#"modelName="a \"quoted\" \\ model\n",hostname="n"} 61"#),
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
        // As `Display` prints them, whatever the digits: every percentage
        // in hundredths, and f32 bit patterns from a fixed xorshift sequence.
        let displayed = |v: f32| v.to_string().parse::<f64>().ok();
        for hundredths in 0..=10_000 {
            let pct = hundredths as f32 / 100.0;
            assert_eq!(decimal(pct), displayed(pct), "{pct}");
        }
        let mut state = 0x2545_f491_u32;
        for _ in 0..100_000 {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let v = f32::from_bits(state);
            if v.is_finite() {
                assert_eq!(decimal(v), displayed(v), "{v:e}");
            }
        }
    }

    /// A MIG device's series carry dcgm-exporter's GPU_I_PROFILE and
    /// GPU_I_ID after modelName; the GPU's own row keeps the physical
    /// series, so power is counted once per GPU.
    #[test]
    fn mig_devices_get_the_instance_labels_and_power_stays_on_the_gpu() {
        let metrics = node_017();
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
            pci_bus_id: gpu.pci_bus_id.clone(),
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
        let text = metrics.render();
        let fb = "DCGM_FI_DEV_FB_USED{gpu=\"0\",UUID=\"GPU-00000000-fake-4000-8000-000000000000\",\
                  pci_bus_id=\"00000000:10:00.0\",device=\"nvidia0\",\
                  modelName=\"NVIDIA H100 80GB HBM3\",GPU_I_PROFILE=\"1g.10gb\",GPU_I_ID=\"9\",\
                  hostname=\"gpu-node-017\",DCGM_FI_DRIVER_VERSION=\"550.54.15\",hpc_job=\"4242\"} 5\n";
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
