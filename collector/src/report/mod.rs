//! `gputel-collector job JOBID`: one job's efficiency report, read in
//! process from the store.
//!
//! The `job` table says in which hours the job was seen (one row per job,
//! node and GPU per file, so its files are small); only those hours of
//! `gpu`, `event` and `alert` are then listed and read, and of each file
//! only the row groups whose bloom filter on `job_id` may hold the job, the
//! columns a figure needs, and the job's rows. Figures are time-weighted
//! (see [`summary`]), so fleets mixing 1 s and 15 s agents add up right.

pub mod fleet;
mod read;
pub mod render;
pub mod summary;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use gputel_schemas::{PartitionKey, PartitionPath, Table};
use object_store::ObjectStore;
use serde::Serialize;

pub use read::ReadStats;
use read::{Columns, Counting, Match, exists, job_rows_of, list};
use summary::{Device, DeviceInfo, GpuFigures, Hint, Sample, Totals, XidCounts};

/// Why a report could not be made (as opposed to a job the store lacks).
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot list {prefix} in the store: {source}")]
    List {
        prefix: String,
        #[source]
        source: object_store::Error,
    },
    #[error("cannot read {path} as Parquet: {source}")]
    Decode {
        path: String,
        #[source]
        source: parquet::errors::ParquetError,
    },
    #[error("{path} says its rows are sorted by node, but {node:?} comes after {after:?}")]
    Unsorted {
        path: String,
        node: String,
        after: String,
    },
}

/// Which job, and optionally which stretch of time to look in.
#[derive(Debug, Clone)]
pub struct Query {
    pub job_id: String,
    /// Only hours that end after `from_us` and start at or before `to_us`.
    pub from_us: Option<i64>,
    pub to_us: Option<i64>,
}

impl Query {
    fn covers(&self, hour: PartitionKey) -> bool {
        fleet::Window {
            from_us: self.from_us,
            to_us: self.to_us,
        }
        .covers_hour(hour)
    }
}

/// What a report found.
#[derive(Debug)]
pub enum Outcome {
    Report(Box<JobReport>),
    /// Nothing to report: why, in words, with what the store holds.
    NotFound(String),
}

/// The scheduler's record of the job (`import-jobs`), the latest imported.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SchedulerJob {
    pub source: Option<String>,
    pub user: Option<String>,
    pub queue: Option<String>,
    pub state: Option<String>,
    pub job_type: Option<String>,
    pub start_time: Option<String>,
    pub end_time: Option<String>,
    pub gpus: Option<i64>,
    #[serde(skip)]
    imported_at_us: i64,
}

/// An event on one of the job's GPUs (XID, throttling, GPU lost).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    pub ts: String,
    pub node: String,
    pub gpu: Option<i64>,
    pub kind: String,
    pub code: i64,
    pub detail: String,
}

/// An alert that fired or resolved on the job's GPUs or nodes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Alert {
    pub ts: String,
    pub node: String,
    pub gpu: Option<i64>,
    pub rule: String,
    pub severity: String,
    pub status: String,
    pub value: Option<f64>,
}

/// The report: `--json` prints it as is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobReport {
    pub job_id: String,
    /// First and last sample of the job on any GPU.
    pub first_ts: String,
    pub last_ts: String,
    pub duration_s: f64,
    #[serde(flatten)]
    pub totals: Totals,
    pub scheduler: Option<SchedulerJob>,
    #[serde(rename = "gpu_figures")]
    pub gpus: Vec<GpuFigures>,
    pub events: Vec<Event>,
    pub alerts: Vec<Alert>,
    pub hints: Vec<Hint>,
    /// What was read from the store to make the report.
    pub read: ReadStats,
}

/// RFC 3339 in UTC, to the millisecond.
pub fn rfc3339(us: i64) -> String {
    DateTime::<Utc>::from_timestamp_micros(us)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

const GPU_COLUMNS: [&str; 16] = [
    "ts",
    "node",
    "gpu",
    "uuid",
    "model",
    "gpu_util_pct",
    "sm_active_pct",
    "fb_used_bytes",
    "fb_total_bytes",
    "power_mw",
    "temperature_c",
    "memory_temperature_c",
    "clock_event_reasons",
    "gpu_instance_id",
    "compute_instance_id",
    "mig_profile",
];

/// Makes the report of `query.job_id` from `store` (named `store_name` in messages).
pub async fn report(
    store: Arc<dyn ObjectStore>,
    store_name: &str,
    query: &Query,
) -> Result<Outcome, ReportError> {
    let counting = Arc::new(Counting::new(store));
    let store: Arc<dyn ObjectStore> = counting.clone();
    let job = query.job_id.as_str();
    let mut stats = ReadStats::default();

    // The job's hours, from the job table.
    let job_files: Vec<_> = list(store.as_ref(), Table::Job.name())
        .await?
        .into_iter()
        .filter(|f| hour_of(f).is_some_and(|h| query.covers(h)))
        .collect();
    if job_files.is_empty() {
        return Ok(Outcome::NotFound(
            empty_store(store.as_ref(), store_name, query).await?,
        ));
    }
    let spans = job_rows_of(
        &store,
        &job_files,
        job,
        Match::Exact,
        &["ts", "last_ts"],
        &mut stats,
    )
    .await?;
    let hours: BTreeSet<PartitionKey> = spans
        .iter()
        .filter(|(_, batches)| batches.iter().any(|b| b.num_rows() > 0))
        .filter_map(|(file, _)| hour_of(file))
        .collect();
    if hours.is_empty() {
        let listed: BTreeSet<PartitionKey> = job_files.iter().filter_map(hour_of).collect();
        let range = match (listed.first(), listed.last()) {
            (Some(first), Some(last)) => {
                format!(" ({} to {} UTC)", hour_text(*first), hour_text(*last))
            }
            _ => String::new(),
        };
        return Ok(Outcome::NotFound(format!(
            "job {job} is not in {store_name}: none of its GPU samples is in the {} hours of \
             job records{}{range}. Check the job id (as the scheduler prints it, e.g. 4242 \
             or 4242_7) and --from/--to.",
            listed.len(),
            bounds(query),
        )));
    }

    // The job's GPU rows, events and alerts in those hours.
    let mut gpu_files = Vec::new();
    let mut event_files = Vec::new();
    let mut alert_files = Vec::new();
    for hour in &hours {
        gpu_files.extend(list(store.as_ref(), &format!("gpu/{hour}")).await?);
        event_files.extend(list(store.as_ref(), &format!("event/{hour}")).await?);
        alert_files.extend(list(store.as_ref(), &format!("alert/{hour}")).await?);
    }
    gpu_files.retain(|f| hour_of(f).is_some());
    event_files.retain(|f| hour_of(f).is_some());
    alert_files.retain(|f| hour_of(f).is_some());
    let gpu_rows = job_rows_of(
        &store,
        &gpu_files,
        job,
        Match::Exact,
        &GPU_COLUMNS,
        &mut stats,
    )
    .await?;
    let (samples, info) = samples_of(gpu_rows.iter().flat_map(|(_, b)| b));
    if samples.is_empty() {
        let first = hours.first().copied().map(hour_text).unwrap_or_default();
        let last = hours.last().copied().map(hour_text).unwrap_or_default();
        return Ok(Outcome::NotFound(format!(
            "job {job} was seen in {store_name} ({first} to {last} UTC) but the store holds \
             none of its gpu rows: those hours' gpu files were deleted (retention) or are \
             not written yet (the collector flushes every --flush-interval)."
        )));
    }
    let event_rows = job_rows_of(
        &store,
        &event_files,
        job,
        Match::Exact,
        &["ts", "node", "gpu", "kind", "code", "detail"],
        &mut stats,
    )
    .await?;
    let alert_rows = job_rows_of(
        &store,
        &alert_files,
        job,
        Match::Listed,
        &["ts", "node", "gpu", "rule", "severity", "status", "value"],
        &mut stats,
    )
    .await?;
    let scheduler = scheduler_job(&store, job, &mut stats).await?;

    let gpus = summary::figures(samples, &info);
    let events = events_of(event_rows.iter().flat_map(|(_, b)| b));
    let alerts = alerts_of(alert_rows.iter().flat_map(|(_, b)| b));
    let mut xids = XidCounts::new();
    for e in events.iter().filter(|e| e.kind == "xid") {
        *xids.entry(e.code).or_default() += 1;
    }
    let hints = summary::hints(&gpus, &xids);
    let first = gpus.iter().map(|g| g.first_ts_us).min().unwrap_or_default();
    let last = gpus.iter().map(|g| g.last_ts_us).max().unwrap_or_default();
    (stats.bytes_read, stats.requests) = counting.read();
    Ok(Outcome::Report(Box::new(JobReport {
        job_id: job.to_owned(),
        first_ts: rfc3339(first),
        last_ts: rfc3339(last),
        duration_s: (last - first) as f64 / 1e6,
        totals: summary::totals(&gpus),
        scheduler,
        gpus,
        events,
        alerts,
        hints,
        read: stats,
    })))
}

fn hour_of(file: &object_store::ObjectMeta) -> Option<PartitionKey> {
    PartitionPath::parse(file.location.as_ref())
        .ok()
        .map(|p| p.key())
}

fn hour_text(hour: PartitionKey) -> String {
    format!("{} {:02}:00", hour.date(), hour.hour())
}

fn bounds(query: &Query) -> String {
    match (query.from_us, query.to_us) {
        (None, None) => String::new(),
        (from, to) => format!(
            " between {} and {}",
            from.map_or("the start".into(), rfc3339),
            to.map_or("the end".into(), rfc3339)
        ),
    }
}

/// The message for a store without job records (in the bounds).
async fn empty_store(
    store: &dyn ObjectStore,
    store_name: &str,
    query: &Query,
) -> Result<String, ReportError> {
    let job = &query.job_id;
    Ok(if exists(store, Table::Job.name()).await? {
        format!(
            "job {job} is not in {store_name}: it holds no job records{}; drop --from/--to \
             or widen them.",
            bounds(query)
        )
    } else if exists(store, Table::Gpu.name()).await? {
        format!(
            "job {job} is not in {store_name}: it holds GPU samples but no job was ever seen \
             on a GPU (no job table). Jobs are found through the Slurm job-mapping directory, \
             GPU processes' cgroups or SLURM_JOB_ID (see the README, Jobs)."
        )
    } else {
        format!(
            "{store_name} holds no telemetry (no gpu or job table): no collector has written \
             there yet, or --store names another place."
        )
    })
}

/// The samples of each device, and what each device is.
fn samples_of<'a>(
    batches: impl Iterator<Item = &'a arrow_array::RecordBatch>,
) -> (BTreeMap<Device, Vec<Sample>>, BTreeMap<Device, DeviceInfo>) {
    let mut samples: BTreeMap<Device, Vec<Sample>> = BTreeMap::new();
    let mut info: BTreeMap<Device, DeviceInfo> = BTreeMap::new();
    for batch in batches {
        let c = Columns::new(batch);
        for row in 0..batch.num_rows() {
            let (Some(ts_us), Some(node), Some(gpu)) = (
                c.int("ts", row),
                c.text("node", row),
                c.int("gpu", row).and_then(|g| u32::try_from(g).ok()),
            ) else {
                continue;
            };
            let instance = |name| c.int(name, row).and_then(|v| u32::try_from(v).ok());
            let device = Device {
                node,
                gpu,
                gpu_instance_id: instance("gpu_instance_id"),
                compute_instance_id: instance("compute_instance_id"),
            };
            info.entry(device.clone()).or_insert_with(|| DeviceInfo {
                uuid: c.text("uuid", row),
                model: c.text("model", row),
                mig_profile: c.text("mig_profile", row),
            });
            samples.entry(device).or_default().push(Sample {
                ts_us,
                gpu_util_pct: c.float("gpu_util_pct", row),
                sm_active_pct: c.float("sm_active_pct", row),
                fb_used_bytes: c.int("fb_used_bytes", row),
                fb_total_bytes: c.int("fb_total_bytes", row),
                power_mw: c.int("power_mw", row),
                temperature_c: c
                    .int("temperature_c", row)
                    .and_then(|v| i32::try_from(v).ok()),
                memory_temperature_c: c
                    .int("memory_temperature_c", row)
                    .and_then(|v| i32::try_from(v).ok()),
                clock_event_reasons: c.int("clock_event_reasons", row),
            });
        }
    }
    (samples, info)
}

fn events_of<'a>(batches: impl Iterator<Item = &'a arrow_array::RecordBatch>) -> Vec<Event> {
    let mut rows = Vec::new();
    for batch in batches {
        let c = Columns::new(batch);
        for row in 0..batch.num_rows() {
            rows.push((
                c.int("ts", row).unwrap_or_default(),
                Event {
                    ts: String::new(),
                    node: c.text("node", row).unwrap_or_default(),
                    gpu: c.int("gpu", row),
                    kind: c.text("kind", row).unwrap_or_default(),
                    code: c.int("code", row).unwrap_or_default(),
                    detail: c.text("detail", row).unwrap_or_default(),
                },
            ));
        }
    }
    // A flush file and the compacted file of its hour may both be listed
    // (S3, mid-compaction): an event equal in every column is one event.
    rows.sort_by(|a, b| {
        (a.0, &a.1.node, a.1.gpu, &a.1.kind, a.1.code, &a.1.detail).cmp(&(
            b.0,
            &b.1.node,
            b.1.gpu,
            &b.1.kind,
            b.1.code,
            &b.1.detail,
        ))
    });
    rows.dedup();
    rows.into_iter()
        .map(|(ts, mut e)| {
            e.ts = rfc3339(ts);
            e
        })
        .collect()
}

fn alerts_of<'a>(batches: impl Iterator<Item = &'a arrow_array::RecordBatch>) -> Vec<Alert> {
    let mut rows = Vec::new();
    for batch in batches {
        let c = Columns::new(batch);
        for row in 0..batch.num_rows() {
            let ts = c.int("ts", row).unwrap_or_default();
            rows.push((
                ts,
                Alert {
                    ts: rfc3339(ts),
                    node: c.text("node", row).unwrap_or_default(),
                    gpu: c.int("gpu", row),
                    rule: c.text("rule", row).unwrap_or_default(),
                    severity: c.text("severity", row).unwrap_or_default(),
                    status: c.text("status", row).unwrap_or_default(),
                    value: c.float("value", row),
                },
            ));
        }
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.node.cmp(&b.1.node)));
    rows.dedup();
    rows.into_iter().map(|(_, a)| a).collect()
}

/// The job's latest imported scheduler record, if any trace was imported.
async fn scheduler_job(
    store: &Arc<dyn ObjectStore>,
    job: &str,
    stats: &mut ReadStats,
) -> Result<Option<SchedulerJob>, ReportError> {
    let files = list(store.as_ref(), gputel_schemas::scheduler_job::NAME).await?;
    let files: Vec<_> = files
        .into_iter()
        .filter(|f| f.location.as_ref().ends_with(".parquet"))
        .collect();
    let rows = job_rows_of(
        store,
        &files,
        job,
        Match::Exact,
        &[
            "source",
            "user",
            "queue",
            "state",
            "job_type",
            "start_time",
            "end_time",
            "gpus",
            "imported_at",
        ],
        stats,
    )
    .await?;
    let mut latest: Option<SchedulerJob> = None;
    for batch in rows.iter().flat_map(|(_, b)| b) {
        let c = Columns::new(batch);
        for row in 0..batch.num_rows() {
            let record = SchedulerJob {
                source: c.text("source", row),
                user: c.text("user", row),
                queue: c.text("queue", row),
                state: c.text("state", row),
                job_type: c.text("job_type", row),
                start_time: c.int("start_time", row).map(rfc3339),
                end_time: c.int("end_time", row).map(rfc3339),
                gpus: c.int("gpus", row),
                imported_at_us: c.int("imported_at", row).unwrap_or_default(),
            };
            if latest
                .as_ref()
                .is_none_or(|l| record.imported_at_us >= l.imported_at_us)
            {
                latest = Some(record);
            }
        }
    }
    Ok(latest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_and_to_keep_the_hours_that_overlap_them() {
        let hour = PartitionKey::from_ts_us(1_795_240_800_000_000).unwrap(); // 06:00
        let at = |us: i64| Some(1_795_240_800_000_000 + us);
        let query = |from_us, to_us| Query {
            job_id: "1".into(),
            from_us,
            to_us,
        };
        assert!(query(None, None).covers(hour));
        assert!(query(at(3_599_999_999), None).covers(hour));
        assert!(!query(at(3_600_000_000), None).covers(hour));
        assert!(query(None, at(0)).covers(hour));
        assert!(!query(None, at(-1)).covers(hour));
    }
}
