//! The flush loop: on a timer, when the buffer is full, and at shutdown, takes
//! the buffered rows, writes one file per table and partition, and only then
//! acknowledges the batches those rows came from.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use chrono::DateTime;
use gputel_schemas::PartitionPath;
use object_store::ObjectStore;
use tokio::sync::watch;
use tracing::{error, info};

use crate::clock::Clock;
use crate::ingest::Shared;
use crate::persist::{PersistError, write_file};

/// How often a failed write is retried while data waits.
const RETRY_INTERVAL: Duration = Duration::from_secs(5);

/// Files to write, and the acknowledgements they release once all are stored.
#[derive(Debug)]
struct FlushUnit {
    files: Vec<(PartitionPath, RecordBatch)>,
    acks: HashMap<String, u64>,
}

/// What one flush did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FlushReport {
    pub files: usize,
    pub rows: usize,
    pub bytes: u64,
}

/// Owns the object store and the queue of files not yet written.
#[derive(Debug)]
pub struct Flusher {
    shared: Arc<Shared>,
    store: Arc<dyn ObjectStore>,
    clock: Clock,
    /// Distinguishes this process's files from other collectors' in one store.
    instance: String,
    next_unit: u64,
    queue: VecDeque<FlushUnit>,
}

impl Flusher {
    pub fn new(shared: Arc<Shared>, store: Arc<dyn ObjectStore>, clock: Clock) -> Self {
        let instance = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        Self {
            shared,
            store,
            clock,
            instance,
            next_unit: 1,
            queue: VecDeque::new(),
        }
    }

    /// Takes what is buffered and writes every pending file, oldest first.
    /// Acknowledgements go out strictly in order: a unit's only after every
    /// earlier unit is stored, since acks are cumulative.
    pub async fn flush(&mut self) -> Result<FlushReport, PersistError> {
        self.take_buffer();
        let mut report = FlushReport::default();
        while let Some(unit) = self.queue.front_mut() {
            while let Some((path, batch)) = unit.files.last() {
                let bytes = write_file(self.store.as_ref(), path, batch).await?;
                report.files += 1;
                report.rows += batch.num_rows();
                report.bytes += bytes;
                unit.files.pop();
            }
            if let Some(unit) = self.queue.pop_front() {
                self.shared.mark_durable(unit.acks);
            }
        }
        Ok(report)
    }

    /// Files waiting to be written.
    pub fn pending_files(&self) -> usize {
        self.queue.iter().map(|u| u.files.len()).sum()
    }

    fn take_buffer(&mut self) {
        let taken = self.shared.take();
        if taken.acks.is_empty() {
            return;
        }
        let mut buffer = taken.buffer;
        // File names are fixed here, before any write is tried, so a retried
        // write replaces its own earlier attempt and cannot duplicate rows.
        let stamp = DateTime::from_timestamp_micros(self.clock.now_us())
            .unwrap_or_default()
            .format("%Y%m%dT%H%M%SZ");
        let stem = format!("{stamp}-{}-{:06}", self.instance, self.next_unit);
        self.next_unit += 1;
        let batches = match buffer.take() {
            Ok(batches) => batches,
            Err(e) => {
                // Builders that match their schema cannot fail to assemble; if
                // they ever do, these batches are not acknowledged.
                error!(error = %e, "rows could not be assembled into Arrow batches; their batches stay unacknowledged");
                return;
            }
        };
        let files = batches
            .into_iter()
            .map(|(table, key, batch)| {
                // The stem is built from hex digits, digits and dashes.
                let path = PartitionPath::new(table, key, &stem).expect("valid file stem");
                (path, batch)
            })
            .collect();
        self.queue.push_back(FlushUnit {
            files,
            acks: taken.acks,
        });
    }

    /// Flushes every `interval`, whenever the buffer fills, and once more when
    /// `stop` turns true; returns after that last flush.
    pub async fn run(mut self, interval: Duration, mut stop: watch::Receiver<bool>) {
        let mut timer = tokio::time::interval(interval);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        timer.tick().await;
        loop {
            let stopping = tokio::select! {
                _ = timer.tick() => false,
                _ = self.shared.flush_now.notified() => false,
                _ = stop.wait_for(|s| *s) => true,
            };
            if stopping {
                break;
            }
            self.flush_logged().await;
        }
        self.shared.start_draining();
        // Last flush: retry for a while rather than exit with rows unwritten.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.flush_logged().await && Instant::now() < deadline {
            tokio::time::sleep(RETRY_INTERVAL).await;
        }
        let unwritten = self.pending_files();
        if unwritten > 0 {
            error!(
                files = unwritten,
                "exiting with files unwritten; their batches were never acknowledged, so agents resend them"
            );
        }
    }

    async fn flush_logged(&mut self) -> bool {
        let started = Instant::now();
        match self.flush().await {
            Ok(report) => {
                if report.files > 0 {
                    let stats = &self.shared.stats;
                    info!(
                        files = report.files,
                        rows = report.rows,
                        bytes = report.bytes,
                        ms = started.elapsed().as_millis() as u64,
                        total_batches = stats.batches.load(Ordering::Relaxed),
                        total_rows = stats.rows.load(Ordering::Relaxed),
                        duplicates = stats.duplicates.load(Ordering::Relaxed),
                        rejected = stats.rejected.load(Ordering::Relaxed),
                        "flushed"
                    );
                }
                true
            }
            Err(e) => {
                error!(error = %e, pending_files = self.pending_files(), "flush failed; will retry, nothing is acknowledged until it succeeds");
                false
            }
        }
    }
}
