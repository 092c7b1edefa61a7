//! The in-memory write buffer: rows appended as they arrive, held per table and
//! partition in Arrow builders until the persister takes them.

use std::collections::BTreeMap;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::ArrowError;
use gputel_proto::{
    AlertRow, GpuEvent, GpuProcess, GpuSample, IbPortSample, NodeEvent, NodeSample,
};
use gputel_schemas::{
    AlertRows, EventRows, EventSource, GpuProcessRows, GpuRows, IbRows, JobRows, JobSpan, NodeRows,
    PartitionKey, Table,
};

use crate::validate::ValidBatch;

/// Rows waiting to be written, by table and partition.
#[derive(Default)]
pub struct WriteBuffer {
    gpu: BTreeMap<PartitionKey, GpuRows>,
    node: BTreeMap<PartitionKey, NodeRows>,
    ib: BTreeMap<PartitionKey, IbRows>,
    event: BTreeMap<PartitionKey, EventRows>,
    gpu_process: BTreeMap<PartitionKey, GpuProcessRows>,
    /// What was seen of each job on each GPU, per partition, for the `job` table.
    jobs: BTreeMap<PartitionKey, BTreeMap<JobOnGpu, Seen>>,
    alert: BTreeMap<PartitionKey, AlertRows>,
    rows: usize,
}

/// A job on one GPU of one node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct JobOnGpu {
    job_id: String,
    node: String,
    gpu: u32,
}

/// When a job was seen on a GPU, and how often.
#[derive(Debug, Clone, Copy)]
struct Seen {
    first_us: i64,
    last_us: i64,
    samples: i64,
}

impl std::fmt::Debug for WriteBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let partitions = self.gpu.len()
            + self.node.len()
            + self.ib.len()
            + self.event.len()
            + self.gpu_process.len()
            + self.jobs.len()
            + self.alert.len();
        f.debug_struct("WriteBuffer")
            .field("partitions", &partitions)
            .field("rows", &self.rows)
            .finish()
    }
}

impl WriteBuffer {
    /// Appends every row of a validated batch from `node`.
    pub fn append(&mut self, node: &str, batch: ValidBatch<'_>) {
        let batch = batch.get();
        append_all(&mut self.gpu, node, &batch.gpu, |s| s.ts_us);
        for s in &batch.gpu {
            if let Some(job_id) = &s.job_id {
                let key = PartitionKey::from_ts_us(s.ts_us)
                    .expect("ValidBatch guarantees every timestamp has a partition");
                let job = JobOnGpu {
                    job_id: job_id.clone(),
                    node: node.to_owned(),
                    gpu: s.gpu,
                };
                self.jobs
                    .entry(key)
                    .or_default()
                    .entry(job)
                    .and_modify(|seen| {
                        seen.first_us = seen.first_us.min(s.ts_us);
                        seen.last_us = seen.last_us.max(s.ts_us);
                        seen.samples += 1;
                    })
                    .or_insert(Seen {
                        first_us: s.ts_us,
                        last_us: s.ts_us,
                        samples: 1,
                    });
            }
        }
        append_all(&mut self.node, node, &batch.node, |s| s.ts_us);
        append_all(&mut self.ib, node, &batch.ib, |s| s.ts_us);
        append_all(&mut self.event, node, &batch.event, |s| s.ts_us);
        append_all(&mut self.gpu_process, node, &batch.gpu_process, |s| s.ts_us);
        self.rows += crate::validate::row_count(batch);
    }

    /// Appends alert firings and resolutions (the node is in each row).
    pub fn append_alerts(&mut self, rows: &[AlertRow]) {
        for row in rows {
            // Sample times passed validation; a row outside the calendar
            // would have no partition, so it is dropped rather than panic.
            let Ok(key) = PartitionKey::from_ts_us(row.ts_us) else {
                continue;
            };
            self.alert.entry(key).or_default().push(&row.node, row);
            self.rows += 1;
        }
    }

    /// Appends node events the collector raised (the node is in each).
    pub fn append_node_events(&mut self, events: &[NodeEvent]) {
        for event in events {
            // The collector's clock, within the calendar; a row outside it
            // would have no partition, so it is dropped rather than panic.
            let Ok(key) = PartitionKey::from_ts_us(event.ts_us) else {
                continue;
            };
            self.event
                .entry(key)
                .or_default()
                .push(&event.node, &EventSource::Node(event));
            self.rows += 1;
        }
    }

    /// Rows held, all tables together.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Takes everything held as one record batch per table and partition,
    /// leaving the buffer empty.
    pub fn take(&mut self) -> Result<Vec<(Table, PartitionKey, RecordBatch)>, ArrowError> {
        self.rows = 0;
        let mut out = Vec::new();
        finish_all(Table::Gpu, &mut self.gpu, &mut out)?;
        finish_all(Table::Node, &mut self.node, &mut out)?;
        finish_all(Table::Ib, &mut self.ib, &mut out)?;
        finish_all(Table::Event, &mut self.event, &mut out)?;
        finish_all(Table::GpuProcess, &mut self.gpu_process, &mut out)?;
        finish_all(Table::Alert, &mut self.alert, &mut out)?;
        for (key, jobs) in std::mem::take(&mut self.jobs) {
            let mut rows = JobRows::default();
            for (job, seen) in &jobs {
                let span = JobSpan {
                    job_id: &job.job_id,
                    gpu: job.gpu,
                    first_us: seen.first_us,
                    last_us: seen.last_us,
                    samples: seen.samples,
                };
                rows.push(&job.node, &span);
            }
            out.push((
                Table::Job,
                key,
                RecordBatch::try_new(Table::Job.schema(), rows.finish())?,
            ));
        }
        Ok(out)
    }
}

fn append_all<S, R: Rows<S> + Default>(
    partitions: &mut BTreeMap<PartitionKey, R>,
    node: &str,
    samples: &[S],
    ts_us: impl Fn(&S) -> i64,
) {
    for s in samples {
        let key = PartitionKey::from_ts_us(ts_us(s))
            .expect("ValidBatch guarantees every timestamp has a partition");
        partitions.entry(key).or_default().push(node, s);
    }
}

fn finish_all<S, R: Rows<S>>(
    table: Table,
    partitions: &mut BTreeMap<PartitionKey, R>,
    out: &mut Vec<(Table, PartitionKey, RecordBatch)>,
) -> Result<(), ArrowError> {
    for (key, mut rows) in std::mem::take(partitions) {
        out.push((
            table,
            key,
            RecordBatch::try_new(table.schema(), rows.finish())?,
        ));
    }
    Ok(())
}

/// A table's row builder (declared in `gputel_schemas`) for rows of `S`.
trait Rows<S> {
    fn push(&mut self, node: &str, sample: &S);
    /// The columns, in schema order.
    fn finish(&mut self) -> Vec<ArrayRef>;
}

macro_rules! rows_of {
    ($($rows:ty => $sample:ty),* $(,)?) => {$(
        impl Rows<$sample> for $rows {
            fn push(&mut self, node: &str, sample: &$sample) {
                <$rows>::push(self, node, sample);
            }
            fn finish(&mut self) -> Vec<ArrayRef> {
                <$rows>::finish(self)
            }
        }
    )*};
}

rows_of!(
    GpuRows => GpuSample,
    NodeRows => NodeSample,
    IbRows => IbPortSample,
    GpuProcessRows => GpuProcess,
    AlertRows => AlertRow,
);

/// An agent's events are GPU events.
impl Rows<GpuEvent> for EventRows {
    fn push(&mut self, node: &str, event: &GpuEvent) {
        EventRows::push(self, node, &EventSource::Gpu(event));
    }
    fn finish(&mut self) -> Vec<ArrayRef> {
        EventRows::finish(self)
    }
}
