//! The scheduler trace, one record per job: as imported (`import-jobs`),
//! the scheduler_job_latest view of schemas/sql/views.sql; or as parsed
//! from a file for one report (`report --jobs`), each job as its import
//! would store it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use object_store::ObjectStore;

use super::super::ReportError;
use super::super::read::{ReadStats, all_rows_of, list};
use super::TraceShare;
use super::scan::Col;
use crate::import::Trace;

/// One job of the trace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TraceJob {
    pub source: Option<String>,
    pub job_type: Option<String>,
    pub state: Option<String>,
    pub duration_s: Option<f64>,
    pub queue_s: Option<f64>,
    pub gpus: Option<i64>,
    pub gpu_time_s: Option<f64>,
}

const COLUMNS: [&str; 9] = [
    "job_id",
    "source",
    "job_type",
    "state",
    "duration_s",
    "queue_s",
    "gpus",
    "gpu_time_s",
    "imported_at",
];

/// Every job of the trace by id: the latest import of it (then the first
/// source by name, then the file whose name sorts last), as the views pick.
pub async fn latest(
    store: &Arc<dyn ObjectStore>,
    stats: &mut ReadStats,
) -> Result<HashMap<String, TraceJob>, ReportError> {
    let mut files = list(store.as_ref(), gputel_schemas::scheduler_job::NAME).await?;
    files.retain(|f| f.location.as_ref().ends_with(".parquet"));
    // Later files first: of equal keys, the first seen is kept.
    files.sort_by(|a, b| b.location.filename().cmp(&a.location.filename()));
    let mut out: HashMap<String, (i64, Option<String>, TraceJob)> = HashMap::new();
    for file in files {
        let batches = all_rows_of(store, std::slice::from_ref(&file), &COLUMNS, stats).await?;
        for batch in &batches {
            let c: Vec<Col> = COLUMNS.iter().map(|n| Col::of(batch, n)).collect();
            for row in 0..batch.num_rows() {
                let Some(job_id) = c[0].text(row) else {
                    continue;
                };
                let text = |i: usize| c[i].text(row).map(str::to_owned);
                let imported = c[8].int(row).unwrap_or(i64::MIN);
                let job = TraceJob {
                    source: text(1),
                    job_type: text(2),
                    state: text(3),
                    duration_s: c[4].num(row),
                    queue_s: c[5].num(row),
                    gpus: c[6].int(row),
                    gpu_time_s: c[7].num(row),
                };
                let better = match out.get(job_id) {
                    None => true,
                    Some((at, source, _)) => {
                        imported > *at || (imported == *at && job.source < *source)
                    }
                };
                if better {
                    out.insert(job_id.to_owned(), (imported, job.source.clone(), job));
                }
            }
        }
    }
    Ok(out.into_iter().map(|(id, (_, _, job))| (id, job)).collect())
}

/// Every job of a parsed trace by id, with the values its import would
/// store (the `source` column is the format's name).
pub fn of_file(trace: &Trace) -> HashMap<String, TraceJob> {
    trace
        .jobs
        .iter()
        .map(|job| {
            let record = TraceJob {
                source: Some(trace.format.name().to_owned()),
                job_type: job.job_type.clone(),
                state: job.state.clone(),
                duration_s: job.duration_s.map(|s| s as f64),
                queue_s: job.queue_s.map(|s| s as f64),
                gpus: job.gpus.map(i64::from),
                gpu_time_s: job.gpu_time_s.map(|s| s as f64),
            };
            (job.job_id.clone(), record)
        })
        .collect()
}

/// gpu_time_share.sql's 'trace' scope: GPU jobs only (gpus > 0), a job's
/// GPU time its gpu_time_s, else gpus × duration_s, else 0; TIMEOUT and
/// NODE_FAIL folded into FAILED, as the study does. By job type, then by
/// state, the largest GPU time first.
pub fn shares(trace: &HashMap<String, TraceJob>) -> Vec<TraceShare> {
    let mut groups: BTreeMap<(&'static str, String), (usize, f64)> = BTreeMap::new();
    let mut total = 0.0;
    for job in trace.values().filter(|j| j.gpus.is_some_and(|g| g > 0)) {
        let gpu_s = job
            .gpu_time_s
            .or_else(|| Some(job.gpus? as f64 * job.duration_s?))
            .unwrap_or(0.0);
        total += gpu_s;
        let job_type = job.job_type.clone().unwrap_or_else(|| "(untyped)".into());
        let state = match job.state.as_deref() {
            Some("TIMEOUT" | "NODE_FAIL") => "FAILED".to_owned(),
            Some(s) => s.to_owned(),
            None => "(unknown)".to_owned(),
        };
        for key in [("job_type", job_type), ("state", state)] {
            let g = groups.entry(key).or_default();
            g.0 += 1;
            g.1 += gpu_s;
        }
    }
    let mut out: Vec<TraceShare> = groups
        .into_iter()
        .map(|((dimension, value), (jobs, gpu_time_s))| TraceShare {
            dimension,
            value,
            jobs,
            gpu_time_s,
            share: (total > 0.0).then(|| gpu_time_s / total),
        })
        .collect();
    out.sort_by(|a, b| {
        (a.dimension != "job_type")
            .cmp(&(b.dimension != "job_type"))
            .then(b.gpu_time_s.total_cmp(&a.gpu_time_s))
            .then_with(|| a.value.cmp(&b.value))
    });
    out
}
