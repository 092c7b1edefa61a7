//! The flush loop: on a timer, when the buffer is full, and at shutdown, takes
//! the buffered rows, writes one file per table and partition, and then
//! releases the write-ahead log segments that held them.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use gputel_schemas::{Columns, PartitionPath};
use tokio::sync::watch;
use tracing::{error, info};

use crate::log_throttle::{LogThrottle, root_cause};
use crate::persist::{PersistError, encode_file, store_file};
use crate::store::Store;
use crate::wal::WalError;
use crate::write::WritePath;

/// Why a flush did not complete; it is retried.
#[derive(Debug, thiserror::Error)]
pub enum FlushError {
    #[error(transparent)]
    Persist(#[from] PersistError),
    #[error(transparent)]
    Wal(#[from] WalError),
    /// Rows that could not be encoded (see [`PendingFile::Unencodable`]).
    #[error("{error}; the rows stay in the write-ahead log for a restart to write")]
    Unencodable { error: String },
}

/// How often a failed write is retried while data waits (at most: a shorter
/// flush interval retries at that interval).
const RETRY_INTERVAL: Duration = Duration::from_secs(5);

/// A flush failing for one cause is logged once per this interval, with the
/// number of failures in between.
pub const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// Files to write, and the log segments they release once all are stored.
#[derive(Debug)]
struct FlushUnit {
    /// Written from the last: the largest table's files are at the end, so
    /// that its rows, freed as they are encoded, go first.
    files: Vec<(PartitionPath, PendingFile)>,
    segments: Vec<u64>,
}

/// A file of a flush: its rows until they are encoded, then its bytes
/// until they are stored. A store that fails keeps the file's bytes for
/// the retry, a fraction of its rows' memory, and they are not encoded
/// again.
#[derive(Debug)]
enum PendingFile {
    Rows(Box<dyn Columns>),
    Encoded {
        bytes: Bytes,
        rows: usize,
    },
    /// Rows that could not be encoded. Encoding them again would fail
    /// again, so the flush fails with `error` until a restart: the log
    /// segments keep the rows, and the units after this one wait, so none
    /// is released past it.
    Unencodable {
        error: String,
        rows: usize,
    },
}

impl PendingFile {
    fn rows(&self) -> usize {
        match self {
            PendingFile::Rows(rows) => rows.num_rows(),
            PendingFile::Encoded { rows, .. } | PendingFile::Unencodable { rows, .. } => *rows,
        }
    }
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
    shared: Arc<WritePath>,
    store: Store,
    queue: VecDeque<FlushUnit>,
    failures: LogThrottle,
    /// Failed flushes since the last one that succeeded.
    failed_in_a_row: u64,
}

impl Flusher {
    pub fn new(shared: Arc<WritePath>, store: Store) -> Self {
        Self {
            shared,
            store,
            queue: VecDeque::new(),
            failures: LogThrottle::new(FAILURE_LOG_INTERVAL),
            failed_in_a_row: 0,
        }
    }

    /// Takes what is buffered and writes every pending file, oldest first; a
    /// unit's log segments are released once all its files are stored.
    pub async fn flush(&mut self) -> Result<FlushReport, FlushError> {
        self.take_buffer()?;
        let mut report = FlushReport::default();
        while let Some(unit) = self.queue.front_mut() {
            while let Some((path, file)) = unit.files.last_mut() {
                let rows = file.rows();
                let unencodable = |error: String| PendingFile::Unencodable { error, rows };
                // Taken out while it is encoded, which frees the rows as it
                // goes; what stays is its bytes, or why it cannot have any.
                let bytes = match std::mem::replace(file, unencodable(String::new())) {
                    PendingFile::Rows(columns) => match encode_file(path, columns).await {
                        Ok(bytes) => bytes,
                        Err(e) => {
                            *file = unencodable(e.to_string());
                            return Err(e.into());
                        }
                    },
                    PendingFile::Encoded { bytes, .. } => bytes,
                    PendingFile::Unencodable { error, .. } => {
                        *file = unencodable(error.clone());
                        return Err(FlushError::Unencodable { error });
                    }
                };
                *file = PendingFile::Encoded {
                    bytes: bytes.clone(),
                    rows,
                };
                report.bytes += store_file(&self.store, path, bytes).await?;
                report.files += 1;
                report.rows += rows;
                unit.files.pop();
            }
            if let Some(unit) = self.queue.front() {
                self.shared.release(&unit.segments)?;
                self.queue.pop_front();
            }
        }
        if report.files > 0 {
            // The flush's rows and encoded files are freed: hand their
            // pages back now, before the next rows fault in pages of their
            // own beside them.
            crate::memory::return_freed_memory();
        }
        Ok(report)
    }

    /// Rows in files waiting to be written.
    fn pending_rows(&self) -> usize {
        self.queue
            .iter()
            .flat_map(|u| &u.files)
            .map(|(_, file)| file.rows())
            .sum()
    }

    /// Files waiting to be written.
    pub fn pending_files(&self) -> usize {
        self.queue.iter().map(|u| u.files.len()).sum()
    }

    fn take_buffer(&mut self) -> Result<(), FlushError> {
        let taken = self.shared.take()?;
        let mut buffer = taken.buffer;
        let batches = buffer.take();
        // File names come from the log segments, not the clock: a flush
        // repeated after a crash replaces its own earlier files.
        let files = batches
            .into_iter()
            .rev()
            .map(|(table, key, rows)| {
                let path = PartitionPath::new(table, key, &taken.stem).expect("valid file stem");
                (path, PendingFile::Rows(rows))
            })
            .collect::<Vec<_>>();
        if files.is_empty() && taken.segments.is_empty() {
            return Ok(());
        }
        self.queue.push_back(FlushUnit {
            files,
            segments: taken.segments,
        });
        // Count these rows as held from now on, not only once a write ends.
        self.shared.set_unwritten_rows(self.pending_rows());
        Ok(())
    }

    /// Flushes every `interval`, whenever the buffer fills, and once more when
    /// `stop` turns true; returns after that last flush.
    pub async fn run(mut self, interval: Duration, mut stop: watch::Receiver<bool>) {
        let mut timer = tokio::time::interval(interval);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        timer.tick().await;
        let mut failed = false;
        loop {
            let stopping = if failed {
                // A failed flush is retried on its own clock, not at every
                // refused batch's nudge, nor only at the next interval.
                let pause = RETRY_INTERVAL.min(interval);
                tokio::time::timeout(pause, stop.wait_for(|s| *s))
                    .await
                    .is_ok()
            } else {
                tokio::select! {
                    _ = timer.tick() => false,
                    _ = self.shared.flush_now.notified() => false,
                    _ = stop.wait_for(|s| *s) => true,
                }
            };
            if stopping {
                break;
            }
            failed = !self.flush_logged().await;
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
                "exiting with files unwritten; their rows stay in the write-ahead log and are written at the next start"
            );
        }
    }

    async fn flush_logged(&mut self) -> bool {
        let started = Instant::now();
        let result = self.flush().await;
        self.shared.set_unwritten_rows(self.pending_rows());
        match result {
            Ok(report) => {
                if self.failed_in_a_row > 0 {
                    let unlogged = self.failures.recovered();
                    info!(
                        failures = self.failed_in_a_row,
                        unlogged, "flushing works again"
                    );
                    self.failed_in_a_row = 0;
                }
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
                self.failed_in_a_row += 1;
                let cause = root_cause(&e);
                if let Some(unlogged) = self.failures.occurred(&cause, Instant::now()) {
                    error!(
                        error = %e,
                        pending_files = self.pending_files(),
                        failures = self.failed_in_a_row,
                        unlogged,
                        "flush failed; will retry (the rows are safe in the write-ahead log; \
                         this cause is logged once a minute while it lasts)"
                    );
                }
                false
            }
        }
    }
}
