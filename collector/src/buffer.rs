//! The in-memory write buffer: rows appended as they arrive, held per table and
//! partition in column builders (integers packed, see
//! `gputel_schemas::column::Packed`) until a flush takes them and makes
//! them Arrow columns one at a time as it encodes them.

use std::collections::BTreeMap;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use gputel_proto::{
    AlertRow, GpuEvent, GpuProcess, GpuSample, IbPortSample, NodeEvent, NodeSample,
};
use gputel_schemas::{
    AlertRows, Columns, EventRows, EventSource, GpuProcessRows, GpuRows, HourCache, IbRows,
    JobRows, JobSpan, NodeRows, PartitionKey, Table,
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
    jobs: BTreeMap<PartitionKey, JobsSeen>,
    alert: BTreeMap<PartitionKey, AlertRows>,
    rows: usize,
    /// Rows of the big tables appended so far.
    appended: Sizes,
    /// Room the first partition of each big table starts with: the rows the
    /// buffer before this one took, so that filling it copies nothing.
    room: Sizes,
}

/// Rows of the `gpu`, `node` and `ib` tables.
#[derive(Debug, Default, Clone, Copy)]
struct Sizes {
    gpu: usize,
    node: usize,
    ib: usize,
}

/// What was seen of each job on each GPU of each node: job id, then node,
/// then GPU, so that a row finds its entry by borrowed strings and only a
/// job or node seen for the first time in the partition is copied.
type JobsSeen = BTreeMap<String, BTreeMap<String, BTreeMap<u32, Seen>>>;

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
        let hours = &mut HourCache::default();
        append_all(&mut self.gpu, self.room.gpu, hours, node, &batch.gpu, |s| {
            s.ts_us
        });
        self.note_jobs(node, &batch.gpu, hours);
        append_all(
            &mut self.node,
            self.room.node,
            hours,
            node,
            &batch.node,
            |s| s.ts_us,
        );
        append_all(&mut self.ib, self.room.ib, hours, node, &batch.ib, |s| {
            s.ts_us
        });
        append_all(&mut self.event, 0, hours, node, &batch.event, |s| s.ts_us);
        append_all(
            &mut self.gpu_process,
            0,
            hours,
            node,
            &batch.gpu_process,
            |s| s.ts_us,
        );
        self.rows += crate::validate::row_count(batch);
        self.appended.gpu += batch.gpu.len();
        self.appended.node += batch.node.len();
        self.appended.ib += batch.ib.len();
    }

    /// Notes on which GPU each job was seen and when, for the `job` table.
    /// A run of samples of one job in one hour (a node's GPUs in a tick, as
    /// a batch holds them) looks its job and node up once.
    fn note_jobs(&mut self, node: &str, samples: &[GpuSample], hours: &mut HourCache) {
        let mut rest = samples;
        while let Some(first) = rest.first() {
            let Some(job_id) = first.job_id.as_deref() else {
                rest = &rest[1..];
                continue;
            };
            let key = hours
                .key(first.ts_us)
                .expect("ValidBatch guarantees every timestamp has a partition");
            let same = rest
                .iter()
                .take_while(|s| {
                    s.job_id.as_deref() == Some(job_id) && hours.key(s.ts_us) == Ok(key)
                })
                .count();
            let (run, after) = rest.split_at(same);
            rest = after;
            let nodes = entry_by_str(self.jobs.entry(key).or_default(), job_id);
            let gpus = entry_by_str(nodes, node);
            for s in run {
                gpus.entry(s.gpu)
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

    /// An empty buffer with room for as many rows of each big table as this
    /// one took, and a quarter more.
    pub fn successor(&self) -> WriteBuffer {
        // A quarter more, as the next flush may come a little later: growing
        // a full buffer copies all of it.
        let more = |rows: usize| rows + rows / 4;
        WriteBuffer {
            room: Sizes {
                gpu: more(self.appended.gpu),
                node: more(self.appended.node),
                ib: more(self.appended.ib),
            },
            ..WriteBuffer::default()
        }
    }

    /// Rows held, all tables together.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Takes everything held, the rows of each table and partition as
    /// columns still to be made, leaving the buffer empty.
    pub fn take(&mut self) -> Vec<(Table, PartitionKey, Box<dyn Columns>)> {
        self.rows = 0;
        let mut out = Vec::new();
        take_all(Table::Gpu, &mut self.gpu, &mut out);
        take_all(Table::Node, &mut self.node, &mut out);
        take_all(Table::Ib, &mut self.ib, &mut out);
        take_all(Table::Event, &mut self.event, &mut out);
        take_all(Table::GpuProcess, &mut self.gpu_process, &mut out);
        take_all(Table::Alert, &mut self.alert, &mut out);
        for (key, jobs) in std::mem::take(&mut self.jobs) {
            let mut rows = JobRows::default();
            for (job_id, nodes) in &jobs {
                for (node, gpus) in nodes {
                    for (&gpu, seen) in gpus {
                        let span = JobSpan {
                            job_id,
                            gpu,
                            first_us: seen.first_us,
                            last_us: seen.last_us,
                            samples: seen.samples,
                        };
                        rows.push(node, &span);
                    }
                }
            }
            out.push((Table::Job, key, Box::new(rows)));
        }
        out
    }

    /// Takes everything held as one record batch per table and partition,
    /// every column made at once, leaving the buffer empty: for tests and
    /// benchmarks (a flush takes [`WriteBuffer::take`] and makes the
    /// columns one at a time).
    pub fn take_batches(&mut self) -> Result<Vec<(Table, PartitionKey, RecordBatch)>, ArrowError> {
        self.take()
            .into_iter()
            .map(|(table, key, mut rows)| {
                let batch = gputel_schemas::take_batch(rows.as_mut(), table.schema())?;
                Ok((table, key, batch))
            })
            .collect()
    }
}

/// The value under `key`, inserted empty if absent; `key` is copied only
/// then.
fn entry_by_str<'m, V: Default>(map: &'m mut BTreeMap<String, V>, key: &str) -> &'m mut V {
    if !map.contains_key(key) {
        map.insert(key.to_owned(), V::default());
    }
    map.get_mut(key).expect("inserted above")
}

/// Appends rows to their partitions; the first partition made starts with
/// room for `room` rows, later ones (the next hour's) grow as they fill.
fn append_all<S, R: Rows<S>>(
    partitions: &mut BTreeMap<PartitionKey, R>,
    room: usize,
    hours: &mut HourCache,
    node: &str,
    samples: &[S],
    ts_us: impl Fn(&S) -> i64,
) {
    for s in samples {
        let key = hours
            .key(ts_us(s))
            .expect("ValidBatch guarantees every timestamp has a partition");
        let room = if partitions.is_empty() { room } else { 0 };
        partitions
            .entry(key)
            .or_insert_with(|| R::with_capacity(room))
            .push(node, s);
    }
}

fn take_all<S, R: Rows<S>>(
    table: Table,
    partitions: &mut BTreeMap<PartitionKey, R>,
    out: &mut Vec<(Table, PartitionKey, Box<dyn Columns>)>,
) {
    for (key, rows) in std::mem::take(partitions) {
        out.push((table, key, Box::new(rows)));
    }
}

/// A table's row builder (declared in `gputel_schemas`) for rows of `S`.
trait Rows<S>: Columns + 'static {
    fn with_capacity(rows: usize) -> Self;
    fn push(&mut self, node: &str, sample: &S);
}

macro_rules! rows_of {
    ($($rows:ty => $sample:ty),* $(,)?) => {$(
        impl Rows<$sample> for $rows {
            fn with_capacity(rows: usize) -> Self {
                <$rows>::with_capacity(rows)
            }
            fn push(&mut self, node: &str, sample: &$sample) {
                <$rows>::push(self, node, sample);
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
    fn with_capacity(rows: usize) -> Self {
        EventRows::with_capacity(rows)
    }
    fn push(&mut self, node: &str, event: &GpuEvent) {
        EventRows::push(self, node, &EventSource::Gpu(event));
    }
}

#[cfg(test)]
mod tests {
    use gputel_proto::Batch;

    use super::*;
    use crate::validate::validate_batch;

    /// Rows of 8 GPUs and a node every second for `ticks` seconds from
    /// 10:59:00, so the last minute falls in the next hour's partition.
    fn fill(buffer: &mut WriteBuffer, ticks: i64) {
        let start_us = 1_795_172_340_000_000; // 2026-11-20T10:59:00Z
        for t in 0..ticks {
            let ts_us = start_us + t * 1_000_000;
            let batch = Batch {
                seq: t as u64 + 1,
                gpu: (0..8)
                    .map(|gpu| GpuSample {
                        ts_us,
                        gpu,
                        uuid: format!("GPU-{gpu}"),
                        gpu_util_pct: Some((t as u32 + gpu) % 101),
                        ..Default::default()
                    })
                    .collect(),
                node: vec![NodeSample {
                    ts_us,
                    ..Default::default()
                }],
                ..Default::default()
            };
            let valid = validate_batch(&batch, ts_us).expect("valid");
            buffer.append("node-a", valid);
        }
    }

    /// The `job` rows: which job ran on which GPU, from when to when in
    /// each hour, with runs of one job, GPUs of none and an hour's end
    /// within one batch.
    #[test]
    fn job_spans_are_noted_per_hour_gpu_and_job() {
        use arrow_array::cast::AsArray;
        use arrow_array::types::{Int32Type, Int64Type, TimestampMicrosecondType};

        let t0 = 1_795_175_999_000_000; // 2026-11-20T11:59:59Z
        let (t1, t2) = (t0 + 1_000_000, t0 + 2_000_000); // the next hour
        let samples = |ts_us: i64, jobs: [Option<&str>; 5]| -> Vec<GpuSample> {
            (0..5)
                .map(|gpu| GpuSample {
                    ts_us,
                    gpu,
                    uuid: format!("GPU-{gpu}"),
                    job_id: jobs[gpu as usize].map(str::to_owned),
                    ..Default::default()
                })
                .collect()
        };
        let (a, b) = (Some("job-a"), Some("job-b"));
        let mut buffer = WriteBuffer::default();
        let batches = [
            [
                samples(t0, [a, a, None, b, a]),
                samples(t1, [a, a, a, None, b]),
            ]
            .concat(),
            [samples(t2, [a, a, a, None, b]), samples(t2 + 1, [None; 5])].concat(),
        ];
        for (seq, gpu) in batches.into_iter().enumerate() {
            let batch = Batch {
                seq: seq as u64 + 1,
                gpu,
                ..Default::default()
            };
            buffer.append("node-a", validate_batch(&batch, t2).expect("valid"));
        }

        let mut spans = Vec::new();
        for (table, key, rows) in buffer.take_batches().expect("take") {
            if table != Table::Job {
                continue;
            }
            let text = |name: &str| {
                let dict = rows
                    .column_by_name(name)
                    .unwrap()
                    .as_dictionary::<Int32Type>();
                let values = dict.values().as_string::<i32>().clone();
                dict.keys()
                    .values()
                    .iter()
                    .map(move |&k| values.value(k as usize).to_owned())
                    .collect::<Vec<_>>()
            };
            let (jobs, nodes) = (text("job_id"), text("node"));
            let gpus = rows
                .column_by_name("gpu")
                .unwrap()
                .as_primitive::<Int32Type>();
            let first = rows.column_by_name("ts").unwrap();
            let first = first.as_primitive::<TimestampMicrosecondType>();
            let last = rows.column_by_name("last_ts").unwrap();
            let last = last.as_primitive::<TimestampMicrosecondType>();
            let count = rows
                .column_by_name("samples")
                .unwrap()
                .as_primitive::<Int64Type>();
            for i in 0..rows.num_rows() {
                spans.push((
                    key.hour(),
                    jobs[i].clone(),
                    nodes[i].clone(),
                    gpus.value(i),
                    first.value(i),
                    last.value(i),
                    count.value(i),
                ));
            }
        }
        spans.sort();
        let span = |hour, job: &str, gpu, first, last, samples| {
            (
                hour,
                job.to_owned(),
                "node-a".to_owned(),
                gpu,
                first,
                last,
                samples,
            )
        };
        assert_eq!(
            spans,
            [
                span(11, "job-a", 0, t0, t0, 1),
                span(11, "job-a", 1, t0, t0, 1),
                span(11, "job-a", 4, t0, t0, 1),
                span(11, "job-b", 3, t0, t0, 1),
                span(12, "job-a", 0, t1, t2, 2),
                span(12, "job-a", 1, t1, t2, 2),
                span(12, "job-a", 2, t1, t2, 2),
                span(12, "job-b", 4, t1, t2, 2),
            ]
        );
    }

    /// The buffer after a flush starts with room for the rows the one
    /// before took, and holds exactly what it is given, in both partitions.
    #[test]
    fn a_successor_sized_like_its_predecessor_takes_the_same_rows() {
        let mut first = WriteBuffer::default();
        fill(&mut first, 120);
        let mut second = first.successor();
        assert_eq!((second.room.gpu, second.room.node), (1200, 150));
        let taken = first.take_batches().expect("take");
        fill(&mut second, 120);
        assert_eq!(second.rows(), 1080);
        let again = second.take_batches().expect("take");
        let hours: Vec<_> = taken
            .iter()
            .map(|(t, k, b)| (*t, *k, b.num_rows()))
            .collect();
        assert_eq!(
            hours
                .iter()
                .filter(|(t, ..)| *t == Table::Gpu)
                .map(|h| h.2)
                .collect::<Vec<_>>(),
            [480, 480]
        );
        assert_eq!(taken, again);
    }
}
