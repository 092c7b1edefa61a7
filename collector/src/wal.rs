//! The write-ahead log. Every accepted batch is appended here and made
//! durable (fsync) before it is acknowledged; a restart replays the log into
//! the write buffer, so a crash loses nothing that was acknowledged.
//!
//! Layout of `--wal-dir`:
//! - `wal-<segment>.log`: records `[len: u32 LE][xxh64 of payload: u64 LE][payload]`,
//!   the payload a protobuf `WalRecord`. A flush closes the current segment
//!   and starts the next; once the rows of the closed segments are in
//!   Parquet, the segments are deleted.
//! - `state.pb`: a protobuf `WalState` (the collector's id and each agent's
//!   durable sequence number), replaced atomically before segments are
//!   deleted, so sequence numbers outlive the records that carried them.
//!
//! A torn record at the end of the last segment (a crash mid-write) was never
//! acknowledged; replay stops there and truncates it. Damage anywhere else
//! (a record that fails its checksum with intact records after it: a bad
//! disk block, a stray write) is not a torn tail: its bytes are moved aside
//! to `quarantine/wal-<segment>-<offset>.bad`, logged as an error naming the
//! file and offset, and replay goes on with the next intact record, so one
//! damaged record costs that record only. `gputel-collector wal check` reports
//! such damage without touching the log.
//!
//! The state file is the collector's identity: its file names in the store
//! and the sequence numbers agents were told are durable. A log directory
//! with segments but no state file, or with an empty one, is refused at
//! start with what to do, never silently given a new identity.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use gputel_proto::{AlertRow, NodeEvent, WalRecord, WalState};
use gputel_runtime::framing;
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint};
use twox_hash::XxHash64;

/// Largest record accepted on replay; anything bigger is corruption. The
/// collector's `--max-message-bytes` is capped below it.
pub use gputel_runtime::framing::MAX_RECORD_BYTES;
const STATE_FILE: &str = "state.pb";
/// The largest segment number a log may hold: at one segment a second, 2^62
/// takes longer than the universe has existed.
const MAX_SEGMENT: u64 = 1 << 62;

/// Why the log could not be used.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("write-ahead log {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("write-ahead log {path} is corrupt at byte {offset}: {reason}")]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error(
        "{path} {what}, but its directory holds log segments: the collector's identity (its \
         file names in the store) and the sequence numbers agents were told are durable are \
         lost. Restore {path} from a backup of this collector; or, to start over under a new \
         identity (rows in the segments not yet in the store may then be stored twice, and \
         agents resend from their spools), move the wal-*.log files out of the directory and \
         remove {path}"
    )]
    StateLost { path: PathBuf, what: String },
    #[error(
        "the volume of the write-ahead log {dir} has {free} bytes free, under the \
         {min_free} (--wal-min-free-bytes) kept for writing Parquet and releasing log \
         segments; new batches wait until a flush frees room"
    )]
    LowSpace {
        dir: PathBuf,
        free: u64,
        min_free: u64,
    },
}

impl WalError {
    /// Whether the log refused a batch to keep room on its volume: a flush,
    /// not a retry of the same write, is what helps.
    pub fn is_low_space(&self) -> bool {
        matches!(self, WalError::LowSpace { .. })
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WalError + '_ {
    move |source| WalError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What the log held at start-up.
#[derive(Debug, Default)]
pub struct Replayed {
    /// Every record, in the order written.
    pub records: Vec<WalRecord>,
    /// Each record's [`batch_fingerprint`], of its batch's bytes as
    /// logged; None for records without a batch.
    pub fingerprints: Vec<Option<u64>>,
    /// The segments they came from; delete them once the records are stored.
    pub segments: Vec<u64>,
    /// Torn records dropped from the end of the last segment.
    pub torn_bytes: u64,
    /// Damaged stretches skipped (and quarantined) inside the log.
    pub damaged: Vec<Damaged>,
}

/// A stretch of a segment that holds no intact record, with intact records
/// (or the end of a closed segment) after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damaged {
    pub segment: u64,
    pub offset: u64,
    pub bytes: u64,
    pub reason: &'static str,
}

/// Where damaged bytes are kept, under the log directory.
const QUARANTINE_DIR: &str = "quarantine";

/// An open write-ahead log.
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    state: WalState,
    segment: u64,
    /// The current segment. Records are framed into `pending` and written
    /// together, one write per sync (group commit) rather than one per
    /// batch; a failed write is cut off, so it tears none of the records
    /// before it.
    file: File,
    /// A second handle on it, for syncing without the caller's lock.
    sync_handle: File,
    /// Bytes of whole records in the current segment.
    written: u64,
    /// Framed records appended but not yet written to the segment.
    pending: Vec<u8>,
    /// The last write of `pending` failed: it is retried before anything
    /// more is taken in, so the log refuses batches while it cannot write.
    write_failed: bool,
    /// Free bytes on the log's volume when last looked at, less what was
    /// written since: the watermark check costs no system call per batch.
    free_estimate: u64,
    /// Segments closed because a write failed; their records are in the
    /// buffer and must be released with it.
    closed_on_error: Vec<u64>,
    dirty: bool,
    /// Bytes kept free on the log's volume: batches that would leave less
    /// are refused (0: never).
    min_free: u64,
}

/// Appended records are written at the latest once they take this much,
/// even before the next sync asks for them.
const MAX_PENDING_BYTES: usize = 1 << 20;

impl Drop for Wal {
    /// Records appended since the last sync were never acknowledged, but
    /// are written anyway (not synced): a restart replays what it finds.
    fn drop(&mut self) {
        if !self.write_failed {
            let _ = self.write_pending();
        }
    }
}

/// Free and total bytes of the file system holding `dir`, as an unprivileged
/// writer sees them (blocks reserved for root are not free).
pub fn volume_space(dir: &Path) -> Result<(u64, u64), WalError> {
    let stat = rustix::fs::statvfs(dir).map_err(|e| io(dir)(e.into()))?;
    Ok((
        stat.f_bavail.saturating_mul(stat.f_frsize),
        stat.f_blocks.saturating_mul(stat.f_frsize),
    ))
}

/// The default of `--wal-min-free-bytes` on a volume of `total` bytes: 5 %
/// of it, at most [`MAX_DEFAULT_MIN_FREE`].
pub fn default_min_free_bytes(total: u64) -> u64 {
    (total / 20).min(MAX_DEFAULT_MIN_FREE)
}

/// A flush starts once the log holds this many times `--wal-min-free-bytes`
/// not yet flushed. The Parquet files of a flush take about a tenth of its
/// log bytes (measured on the load generator's rows), so they fit in the room
/// kept free even where the log could otherwise fill most of the volume
/// between two flushes.
pub const FLUSH_AT_MIN_FREE_TIMES: u64 = 2;

/// The default watermark's ceiling: room for the Parquet files of the rows a
/// collector holds at most by default (--max-unwritten-rows), several times
/// over, and for the state file a release writes.
pub const MAX_DEFAULT_MIN_FREE: u64 = 256 * 1024 * 1024;

impl Wal {
    /// Opens (or creates) the log in `dir`, replays what it holds, and starts
    /// a new segment for what comes next.
    pub fn open(dir: &Path) -> Result<(Wal, Replayed), WalError> {
        fs::create_dir_all(dir).map_err(io(dir))?;
        let state_path = dir.join(STATE_FILE);
        let mut segments = list_segments(dir)?;
        segments.sort_unstable();
        // Numbers grow by one a flush, so one near the top of the range is
        // damage; trusting it would overflow later, or delete the whole log.
        if let Some(&last) = segments.last().filter(|s| **s > MAX_SEGMENT) {
            return Err(WalError::Corrupt {
                path: segment_path(dir, last),
                offset: 0,
                reason: "its segment number is implausibly large; move the file out of the log directory".into(),
            });
        }
        let (state, new_identity) = read_state(&state_path, !segments.is_empty())?;
        if state.next_segment > MAX_SEGMENT || state.released_through > MAX_SEGMENT {
            return Err(WalError::Corrupt {
                path: state_path,
                offset: 0,
                reason: format!(
                    "segment numbers {} and {} are implausibly large; move the file out of the log directory",
                    state.next_segment, state.released_through
                ),
            });
        }
        // Released before a crash cut their deletion short: already stored.
        for segment in segments.iter().filter(|s| **s <= state.released_through) {
            let path = segment_path(dir, *segment);
            fs::remove_file(&path).map_err(io(&path))?;
        }
        segments.retain(|s| *s > state.released_through);
        let mut replayed = Replayed::default();
        for (i, &segment) in segments.iter().enumerate() {
            let last = i + 1 == segments.len();
            let path = segment_path(dir, segment);
            let bytes = fs::read(&path).map_err(io(&path))?;
            let scan = scan_segment(&bytes, &mut replayed.records, &mut replayed.fingerprints);
            for damage in &scan.damaged {
                quarantine(dir, segment, &bytes, damage)?;
                tracing::error!(
                    path = %path.display(),
                    offset = damage.offset,
                    bytes = damage.length,
                    reason = damage.reason,
                    "write-ahead log damaged: this stretch holds no intact record and is lost \
                     (copied to {QUARANTINE_DIR}/); the records after it are replayed"
                );
                replayed.damaged.push(Damaged {
                    segment,
                    offset: damage.offset,
                    bytes: damage.length,
                    reason: damage.reason,
                });
            }
            if let Some(tail) = &scan.tail {
                if last {
                    tracing::warn!(
                        path = %path.display(),
                        offset = tail.offset,
                        torn_bytes = tail.length,
                        reason = tail.reason,
                        "write-ahead log ends in a torn record (a crash mid-write); it was never acknowledged and is dropped"
                    );
                } else {
                    // Appends after a failed write go to a new segment, so a
                    // closed segment may end torn; its bytes are kept anyway.
                    quarantine(dir, segment, &bytes, tail)?;
                    tracing::error!(
                        path = %path.display(),
                        offset = tail.offset,
                        bytes = tail.length,
                        reason = tail.reason,
                        "closed log segment ends in a damaged record (copied to {QUARANTINE_DIR}/)"
                    );
                }
                let file = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(io(&path))?;
                file.set_len(tail.offset).map_err(io(&path))?;
                file.sync_all().map_err(io(&path))?;
                replayed.torn_bytes += tail.length;
            }
        }
        // An empty last segment (the one a previous run was writing, or a
        // torn record cut off) is written on, not followed by one more: a
        // collector restarted over and over (on a full disk, say) adds no
        // files. Never one whose number a file in the store may carry.
        let reuse = match segments.last() {
            Some(&last) if last + 1 >= state.next_segment => {
                let path = segment_path(dir, last);
                fs::metadata(&path).map_err(io(&path))?.len() == 0
            }
            _ => false,
        };
        let next = if reuse {
            segments.pop().unwrap_or(1)
        } else {
            segments
                .last()
                .map_or(1, |s| s + 1)
                .max(state.next_segment)
                .max(1)
        };
        replayed.segments = segments;
        let (file, sync_handle) = create_segment(dir, next)?;
        let mut wal = Wal {
            dir: dir.to_owned(),
            state,
            segment: next,
            file,
            sync_handle,
            written: 0,
            pending: Vec::new(),
            write_failed: false,
            free_estimate: 0,
            closed_on_error: Vec::new(),
            dirty: false,
            min_free: 0,
        };
        for record in &replayed.records {
            if let Some(batch) = &record.batch {
                wal.note_durable(&record.agent_id, batch.seq);
                wal.note_owner(&record.agent_id, &record.node);
            }
        }
        // A new identity is written at once: the collector id must not change
        // after this. An existing state file is left as it is (what replay
        // learnt is still in the segments, and the next release saves it), so
        // a collector starts on a full disk.
        if new_identity {
            wal.save_state()?;
        }
        Ok((wal, replayed))
    }

    /// The last segment whose rows are stored; every earlier one is too.
    pub fn released_through(&self) -> u64 {
        self.state.released_through
    }

    /// The log's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Identifies this collector's files in the store; stable across restarts.
    pub fn collector_id(&self) -> &str {
        &self.state.collector_id
    }

    /// Highest durable sequence per agent.
    pub fn durable(&self) -> &HashMap<String, u64> {
        &self.state.durable
    }

    /// The segment being written.
    pub fn segment(&self) -> u64 {
        self.segment
    }

    /// Whether the segment being written holds any record; one that holds
    /// none is not worth closing.
    pub fn holds_records(&self) -> bool {
        self.written > 0 || !self.pending.is_empty()
    }

    /// Whether the records written since the last flush took their buffer
    /// reach [`FLUSH_AT_MIN_FREE_TIMES`] the bytes kept free: flushed now,
    /// their Parquet files (a fraction of their size) fit in the room kept.
    pub fn wants_flush(&self) -> bool {
        self.min_free > 0
            && self.written + self.pending.len() as u64
                >= self.min_free.saturating_mul(FLUSH_AT_MIN_FREE_TIMES)
    }

    /// Keeps `bytes` free on the log's volume: from now on a batch that would
    /// leave less is refused with [`WalError::LowSpace`]. 0 turns it off.
    pub fn set_min_free_bytes(&mut self, bytes: u64) -> Result<(), WalError> {
        self.min_free = bytes;
        if bytes > 0 {
            self.free_estimate = volume_space(&self.dir)?.0;
        }
        Ok(())
    }

    /// Appends an agent's batch, given as its encoding (the bytes the agent
    /// sent, or [`Batch::encode_to_vec`]), as a record; durable only after
    /// the next sync, which the caller then reports with
    /// [`Wal::note_durable`].
    pub fn append_batch(
        &mut self,
        agent_id: &str,
        node: &str,
        batch: &[u8],
    ) -> Result<(), WalError> {
        let mut payload = Vec::with_capacity(batch.len() + agent_id.len() + node.len() + 16);
        for (tag, bytes) in [(1, agent_id.as_bytes()), (2, node.as_bytes()), (3, batch)] {
            encode_key(tag, WireType::LengthDelimited, &mut payload);
            encode_varint(bytes.len() as u64, &mut payload);
            payload.extend_from_slice(bytes);
        }
        if self.min_free > 0 {
            let needed = self.min_free.saturating_add(
                (self.pending.len() + payload.len() + framing::HEADER_BYTES) as u64,
            );
            // Looked at again only when the estimate says no: room may have
            // come back since (segments released, files moved away).
            if self.free_estimate < needed {
                self.free_estimate = volume_space(&self.dir)?.0;
                if self.free_estimate < needed {
                    return Err(WalError::LowSpace {
                        dir: self.dir.clone(),
                        free: self.free_estimate,
                        min_free: self.min_free,
                    });
                }
            }
        }
        self.append_payload(&payload)
    }

    /// Appends alert rows the collector raised itself as one record; durable
    /// after the next sync, replayed into the `alert` table like batches.
    pub fn append_alerts(&mut self, alerts: &[AlertRow]) -> Result<(), WalError> {
        let record = WalRecord {
            alerts: alerts.to_vec(),
            ..WalRecord::default()
        };
        self.append_payload(&record.encode_to_vec())
    }

    /// Appends node events the collector raised itself as one record;
    /// durable after the next sync, replayed into the `event` table.
    pub fn append_node_events(&mut self, events: &[NodeEvent]) -> Result<(), WalError> {
        let record = WalRecord {
            node_events: events.to_vec(),
            ..WalRecord::default()
        };
        self.append_payload(&record.encode_to_vec())
    }

    /// Frames a record into `pending`. The records before it are written
    /// first when the last write failed or they would take more than
    /// [`MAX_PENDING_BYTES`] with it; if that write fails, this record is
    /// refused and not logged (its batch is not taken in either).
    fn append_payload(&mut self, payload: &[u8]) -> Result<(), WalError> {
        if self.write_failed
            || self.pending.len() + framing::HEADER_BYTES + payload.len() > MAX_PENDING_BYTES
        {
            self.write_pending()?;
        }
        let start = self.pending.len();
        framing::frame_into(payload, &mut self.pending).map_err(|e| WalError::Corrupt {
            path: segment_path(&self.dir, self.segment),
            offset: self.written + start as u64,
            reason: e.to_string(),
        })
    }

    /// Writes the records appended since the last write, in one write.
    fn write_pending(&mut self) -> Result<(), WalError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let path = segment_path(&self.dir, self.segment);
        if let Err(e) = self.file.write_all(&self.pending) {
            self.write_failed = true;
            // Cut the partial write off, so no later record follows a torn
            // one; should that fail too, the records go to a fresh segment.
            if self.file.set_len(self.written).is_err() {
                // What the segment holds is synced first: it may be
                // acknowledged once its rows are stored.
                let closed = self
                    .sync_handle
                    .sync_data()
                    .map_err(io(&path))
                    .and_then(|()| self.rotate_unsynced());
                match closed {
                    Ok(closed) => self.closed_on_error.push(closed),
                    Err(rotate) => {
                        tracing::error!(error = %rotate, "cannot start a new log segment either");
                    }
                }
            }
            return Err(io(&path)(e));
        }
        let bytes = self.pending.len() as u64;
        self.written += bytes;
        self.free_estimate = self.free_estimate.saturating_sub(bytes);
        self.pending.clear();
        // A burst's buffer is not kept for ever.
        self.pending.shrink_to(MAX_PENDING_BYTES);
        self.write_failed = false;
        self.dirty = true;
        Ok(())
    }

    /// Makes every appended record durable.
    pub fn sync(&mut self) -> Result<(), WalError> {
        if let Some(handle) = self.prepare_sync()? {
            let path = segment_path(&self.dir, self.segment);
            handle.sync_data().map_err(io(&path))?;
        }
        Ok(())
    }

    /// A handle to fsync (outside any lock) that makes every record appended
    /// so far durable; None when nothing was appended since the last one.
    pub fn prepare_sync(&mut self) -> Result<Option<File>, WalError> {
        self.write_pending()?;
        // Not a reason to hold acks back: the next batch's check looks again.
        if self.min_free > 0
            && let Ok((free, _)) = volume_space(&self.dir)
        {
            self.free_estimate = free;
        }
        if !self.dirty {
            return Ok(None);
        }
        let path = segment_path(&self.dir, self.segment);
        let handle = self.sync_handle.try_clone().map_err(io(&path))?;
        self.dirty = false;
        Ok(Some(handle))
    }

    /// Syncs and closes the current segment and starts the next; returns the
    /// closed segment's number.
    pub fn rotate(&mut self) -> Result<u64, WalError> {
        self.sync()?;
        self.rotate_unsynced()
    }

    /// Closes the current segment without syncing it and starts the next.
    fn rotate_unsynced(&mut self) -> Result<u64, WalError> {
        let closed = self.segment;
        let (file, sync_handle) = create_segment(&self.dir, closed + 1)?;
        self.segment = closed + 1;
        self.file = file;
        self.sync_handle = sync_handle;
        self.written = 0;
        self.dirty = false;
        Ok(closed)
    }

    /// Saves the durable sequence numbers, then deletes the given closed
    /// segments: their rows are in the store.
    pub fn release(&mut self, segments: &[u64]) -> Result<(), WalError> {
        if let Some(&last) = segments.iter().filter(|s| **s < self.segment).max() {
            self.state.released_through = self.state.released_through.max(last);
        }
        self.save_state()?;
        for &segment in segments {
            if segment >= self.segment {
                continue;
            }
            let path = segment_path(&self.dir, segment);
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&path)(e)),
            }
        }
        Ok(())
    }

    /// Forgets an agent's durable sequence (it has been quiet for long); saved
    /// with the next state file.
    pub fn forget(&mut self, agent_id: &str) {
        self.state.durable.remove(agent_id);
        self.state.owners.remove(agent_id);
    }

    /// The node that owns each agent id (saved with the state file).
    pub fn owners(&self) -> &HashMap<String, String> {
        &self.state.owners
    }

    /// Records that `node` owns `agent_id`; saved with the next state file.
    pub fn note_owner(&mut self, agent_id: &str, node: &str) {
        if self.state.owners.get(agent_id).is_none_or(|n| n != node) {
            self.state
                .owners
                .insert(agent_id.to_owned(), node.to_owned());
        }
    }

    /// Segments closed after a failed write since the last call.
    pub fn take_closed_on_error(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.closed_on_error)
    }

    /// Records that `seq` of `agent_id` is synced: only synced sequences are
    /// saved in the state file.
    pub fn note_durable(&mut self, agent_id: &str, seq: u64) {
        let durable = self.state.durable.entry(agent_id.to_owned()).or_default();
        *durable = (*durable).max(seq);
    }

    fn save_state(&mut self) -> Result<(), WalError> {
        self.state.next_segment = self.segment + 1;
        let path = self.dir.join(STATE_FILE);
        let tmp = self.dir.join(format!("{STATE_FILE}.tmp"));
        let mut file = File::create(&tmp).map_err(io(&tmp))?;
        file.write_all(&self.state.encode_to_vec())
            .map_err(io(&tmp))?;
        file.sync_all().map_err(io(&tmp))?;
        fs::rename(&tmp, &path).map_err(io(&path))?;
        sync_dir(&self.dir)
    }
}

/// A batch's content as a number, to tell a resent batch from a different
/// one under the same sequence number: xxh64 of its protobuf encoding.
pub fn batch_fingerprint(encoded: &[u8]) -> u64 {
    XxHash64::oneshot(0, encoded)
}

fn segment_path(dir: &Path, segment: u64) -> PathBuf {
    dir.join(format!("wal-{segment:016}.log"))
}

fn list_segments(dir: &Path) -> Result<Vec<u64>, WalError> {
    let mut segments = Vec::new();
    for entry in fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let name = entry.file_name();
        let Some(number) = name
            .to_str()
            .and_then(|n| n.strip_prefix("wal-"))
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        segments.push(number);
    }
    Ok(segments)
}

fn create_segment(dir: &Path, segment: u64) -> Result<(File, File), WalError> {
    let path = segment_path(dir, segment);
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(io(&path))?;
    let sync_handle = file.try_clone().map_err(io(&path))?;
    sync_dir(dir)?;
    Ok((file, sync_handle))
}

fn sync_dir(dir: &Path) -> Result<(), WalError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// What `gputel-collector wal check` found: one line per segment, then a
/// summary; `damaged` says whether anything was lost.
#[derive(Debug, Default)]
pub struct CheckReport {
    pub lines: Vec<String>,
    pub damaged: bool,
}

/// Reads the log in `dir` without changing it (see [`CheckReport`]).
pub fn check(dir: &Path) -> Result<CheckReport, WalError> {
    let mut report = CheckReport::default();
    let mut segments = list_segments(dir)?;
    segments.sort_unstable();
    let state_path = dir.join(STATE_FILE);
    match read_state(&state_path, !segments.is_empty()) {
        Ok((state, _)) => report.lines.push(format!(
            "{}: collector {}, {} agents, segments up to {} released",
            state_path.display(),
            state.collector_id,
            state.durable.len(),
            state.released_through
        )),
        Err(e) => {
            report.damaged = true;
            report.lines.push(e.to_string());
        }
    }
    let (mut records, mut lost) = (0, 0);
    for (i, &segment) in segments.iter().enumerate() {
        let path = segment_path(dir, segment);
        let bytes = fs::read(&path).map_err(io(&path))?;
        let scan = scan_segment(&bytes, &mut Vec::new(), &mut Vec::new());
        records += scan.records;
        let mut line = format!(
            "{}: {} records, {} bytes",
            path.display(),
            scan.records,
            bytes.len()
        );
        for d in &scan.damaged {
            report.damaged = true;
            lost += d.length;
            line.push_str(&format!(
                "; damaged at byte {} ({} bytes: {}), intact records follow",
                d.offset, d.length, d.reason
            ));
        }
        if let Some(t) = &scan.tail {
            let last = i + 1 == segments.len();
            if !last {
                report.damaged = true;
                lost += t.length;
            }
            line.push_str(&format!(
                "; {} at byte {} ({} bytes: {})",
                if last {
                    "torn tail (never acknowledged)"
                } else {
                    "damaged end"
                },
                t.offset,
                t.length,
                t.reason
            ));
        }
        report.lines.push(line);
    }
    report.lines.push(format!(
        "{} segments, {records} intact records, {lost} damaged bytes{}",
        segments.len(),
        if report.damaged {
            "; the collector quarantines damaged stretches at start and replays the rest"
        } else {
            ""
        }
    ));
    Ok(report)
}

/// A stretch of a segment that is not an intact record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stretch {
    pub offset: u64,
    pub length: u64,
    pub reason: &'static str,
}

/// What one segment holds.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SegmentScan {
    /// Intact records read.
    pub records: usize,
    /// Damaged stretches with intact records after them.
    pub damaged: Vec<Stretch>,
    /// A damaged end: no intact record follows it.
    pub tail: Option<Stretch>,
}

/// Reads one segment's intact records into `out`, and the fingerprint of
/// each one's batch into `fingerprints`. At a record that is not intact,
/// looks for the next one that is: found, the stretch between is damage in
/// the middle; not found, it is the segment's tail.
pub fn scan_segment(
    bytes: &[u8],
    out: &mut Vec<WalRecord>,
    fingerprints: &mut Vec<Option<u64>>,
) -> SegmentScan {
    let mut scan = SegmentScan::default();
    let mut offset = 0usize;
    while offset < bytes.len() {
        let reason = match framing::next_record(&bytes[offset..]) {
            Ok(Some((payload, used))) => match WalRecord::decode(payload) {
                Ok(record) => {
                    // The batch's bytes as they were logged (field 3).
                    fingerprints.push(
                        record
                            .batch
                            .as_ref()
                            .and_then(|_| gputel_proto::wire::single_field(payload, 3))
                            .map(batch_fingerprint),
                    );
                    out.push(record);
                    scan.records += 1;
                    offset += used;
                    continue;
                }
                Err(_) => "record does not decode",
            },
            Ok(None) => break,
            Err(damage) => damage.reason(),
        };
        match next_intact(bytes, offset + 1) {
            Some(next) => {
                scan.damaged.push(Stretch {
                    offset: offset as u64,
                    length: (next - offset) as u64,
                    reason,
                });
                offset = next;
            }
            None => {
                scan.tail = Some(Stretch {
                    offset: offset as u64,
                    length: (bytes.len() - offset) as u64,
                    reason,
                });
                break;
            }
        }
    }
    scan
}

/// The first offset from `from` on where an intact record starts, if any.
///
/// Every record the collector writes is a `WalRecord` whose first byte is the
/// key of field 1 (`agent_id`, a batch's record), of field 4 (`alerts`) or
/// of field 5 (`node_events`),
/// so only offsets whose payload starts with one of those are hashed: the
/// search stays linear in practice however long the segment.
fn next_intact(bytes: &[u8], from: usize) -> Option<usize> {
    const AGENT_ID_KEY: u8 = 0x0a;
    const ALERTS_KEY: u8 = 0x22;
    const NODE_EVENTS_KEY: u8 = 0x2a;
    (from..bytes.len()).find(|&at| {
        let rest = &bytes[at..];
        let first = rest.get(framing::HEADER_BYTES);
        if !matches!(
            first,
            Some(&AGENT_ID_KEY) | Some(&ALERTS_KEY) | Some(&NODE_EVENTS_KEY)
        ) {
            return false;
        }
        let Some(len) = rest
            .first_chunk::<4>()
            .map(|l| u32::from_le_bytes(*l) as usize)
        else {
            return false;
        };
        if len == 0 || len > rest.len() - framing::HEADER_BYTES {
            return false;
        }
        matches!(framing::next_record(rest), Ok(Some((payload, _))) if WalRecord::decode(payload).is_ok())
    })
}

/// Copies a damaged stretch to `<dir>/quarantine/` before the log moves on.
fn quarantine(dir: &Path, segment: u64, bytes: &[u8], stretch: &Stretch) -> Result<(), WalError> {
    let qdir = dir.join(QUARANTINE_DIR);
    fs::create_dir_all(&qdir).map_err(io(&qdir))?;
    let path = qdir.join(format!("wal-{segment:016}-{:012}.bad", stretch.offset));
    let start = stretch.offset as usize;
    let end = start + stretch.length as usize;
    let mut file = File::create(&path).map_err(io(&path))?;
    file.write_all(&bytes[start..end]).map_err(io(&path))?;
    file.sync_all().map_err(io(&path))?;
    sync_dir(&qdir)
}

/// The state file, or a fresh identity where the log is new. A log that
/// holds segments but no (or an empty) state file has lost its identity:
/// refused, with what to do, rather than replayed under a new one, which
/// would store its rows a second time under other file names and forget the
/// sequence numbers agents were told are durable.
fn read_state(path: &Path, has_segments: bool) -> Result<(WalState, bool), WalError> {
    let lost = |what: &str| WalError::StateLost {
        path: path.to_owned(),
        what: what.to_owned(),
    };
    match fs::read(path) {
        Ok(bytes) => {
            let state = WalState::decode(bytes.as_slice()).map_err(|e| WalError::Corrupt {
                path: path.to_owned(),
                offset: 0,
                reason: e.to_string(),
            })?;
            if bytes.is_empty() || state.collector_id.is_empty() {
                return Err(lost("is empty"));
            }
            Ok((state, false))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if has_segments {
                return Err(lost("is missing"));
            }
            let state = WalState {
                collector_id: uuid::Uuid::new_v4().simple().to_string()[..12].to_owned(),
                durable: HashMap::new(),
                next_segment: 1,
                released_through: 0,
                owners: HashMap::new(),
            };
            Ok((state, true))
        }
        Err(e) => Err(io(path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gputel_proto::{Batch, NodeSample};

    fn record(agent: &str, seq: u64) -> WalRecord {
        WalRecord {
            agent_id: agent.into(),
            node: "n1".into(),
            batch: Some(Batch {
                seq,
                node: vec![NodeSample {
                    ts_us: 1_795_240_800_000_000 + seq as i64,
                    cpu_count: 8,
                    ..NodeSample::default()
                }],
                ..Batch::default()
            }),
            ..WalRecord::default()
        }
    }

    /// Appends as the collector does, through `append_batch`.
    fn append(wal: &mut Wal, record: &WalRecord) -> Result<(), WalError> {
        let batch = record.batch.as_ref().expect("test records carry a batch");
        wal.append_batch(&record.agent_id, &record.node, &batch.encode_to_vec())
            .map(|_| ())
    }

    fn seqs(records: &[WalRecord]) -> Vec<(String, u64)> {
        records
            .iter()
            .map(|r| (r.agent_id.clone(), r.batch.as_ref().map_or(0, |b| b.seq)))
            .collect()
    }

    #[test]
    fn records_survive_a_reopen_and_released_segments_are_gone() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, replayed) = Wal::open(dir.path()).unwrap();
        assert!(replayed.records.is_empty());
        let id = wal.collector_id().to_owned();
        append(&mut wal, &record("a", 1)).unwrap();
        append(&mut wal, &record("b", 7)).unwrap();
        wal.sync().unwrap();
        let closed = wal.rotate().unwrap();
        append(&mut wal, &record("a", 2)).unwrap();
        wal.sync().unwrap();
        drop(wal);

        let (mut wal, replayed) = Wal::open(dir.path()).unwrap();
        assert_eq!(wal.collector_id(), id);
        assert_eq!(
            seqs(&replayed.records),
            [("a".into(), 1), ("b".into(), 7), ("a".into(), 2)]
        );
        assert_eq!(wal.durable()["a"], 2);
        assert_eq!(wal.durable()["b"], 7);
        // The rows of every replayed segment are stored: release them all.
        assert!(replayed.segments.contains(&closed));
        wal.release(&replayed.segments).unwrap();
        drop(wal);

        let (wal, replayed) = Wal::open(dir.path()).unwrap();
        assert!(replayed.records.is_empty());
        // The sequence numbers outlive the released records, and segment
        // numbers (which name the Parquet files) are never reused.
        assert_eq!(wal.durable()["a"], 2);
        assert_eq!(wal.durable()["b"], 7);
        assert!(
            wal.segment() > closed + 1,
            "{} after {closed}",
            wal.segment()
        );
    }

    /// The node that owns an agent id outlives a restart: from the records
    /// replayed, then from the state file once they are released.
    #[test]
    fn owners_are_replayed_and_kept_after_release() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path()).unwrap();
        append(&mut wal, &record("a", 1)).unwrap();
        wal.note_owner("b", "n2");
        wal.sync().unwrap();
        drop(wal);

        // Not saved yet for "b" (no release, no record): only "a" is known.
        let (mut wal, replayed) = Wal::open(dir.path()).unwrap();
        assert_eq!(
            wal.owners().clone(),
            HashMap::from([("a".to_owned(), "n1".to_owned())])
        );
        wal.note_owner("b", "n2");
        wal.release(&replayed.segments).unwrap();
        drop(wal);

        let (mut wal, replayed) = Wal::open(dir.path()).unwrap();
        assert!(replayed.records.is_empty());
        assert_eq!(
            wal.owners().clone(),
            HashMap::from([
                ("a".to_owned(), "n1".to_owned()),
                ("b".to_owned(), "n2".to_owned())
            ])
        );
        wal.forget("a");
        assert_eq!(wal.owners().len(), 1);
    }

    /// A batch is logged as the bytes it was given (an agent's own encoding,
    /// unknown fields and all), and replay fingerprints those bytes, so a
    /// resend after a restart compares equal to what was logged.
    #[test]
    fn a_batch_is_logged_as_given_and_fingerprinted_as_logged() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path()).unwrap();
        let first = record("a", 3);
        let mut sent = first.batch.as_ref().unwrap().encode_to_vec();
        // Field 99, unknown to this version: kept in the log.
        sent.extend_from_slice(&[0x98, 0x06, 0x01]);
        wal.append_batch("a", "n1", &sent).unwrap();
        wal.sync().unwrap();
        drop(wal);
        let (_, replayed) = Wal::open(dir.path()).unwrap();
        assert_eq!(replayed.records.len(), 1);
        assert_eq!(replayed.records[0].batch, first.batch);
        assert_eq!(replayed.fingerprints, [Some(batch_fingerprint(&sent))]);
        assert_ne!(
            batch_fingerprint(&sent),
            batch_fingerprint(&first.batch.unwrap().encode_to_vec())
        );
    }

    /// Only what the caller reported synced is saved as durable: a record
    /// appended but not synced must not be announced to its agent.
    #[test]
    fn the_state_file_holds_only_synced_sequences() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path()).unwrap();
        append(&mut wal, &record("a", 1)).unwrap();
        wal.sync().unwrap();
        wal.note_durable("a", 1);
        let closed = wal.rotate().unwrap();
        append(&mut wal, &record("a", 2)).unwrap();
        assert_eq!(wal.durable()["a"], 1);
        wal.release(&[closed]).unwrap();
        let state =
            WalState::decode(fs::read(dir.path().join(STATE_FILE)).unwrap().as_slice()).unwrap();
        assert_eq!(state.durable["a"], 1);
    }

    /// A start changes nothing on disk that it need not: an existing state
    /// file is not rewritten (a full disk has no room for its copy), and an
    /// empty last segment is written on rather than followed by another, so
    /// a collector restarted again and again adds no files.
    #[test]
    fn a_start_writes_no_state_and_adds_no_empty_segment() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path()).unwrap();
        append(&mut wal, &record("a", 1)).unwrap();
        wal.sync().unwrap();
        drop(wal);
        let state = dir.path().join(STATE_FILE);
        let inode = fs::metadata(&state).unwrap().ino();
        let saved = fs::read(&state).unwrap();
        for start in 1..=3 {
            let (wal, replayed) = Wal::open(dir.path()).unwrap();
            assert_eq!(seqs(&replayed.records), [("a".into(), 1)], "start {start}");
            assert_eq!(replayed.segments, [1], "start {start}");
            assert_eq!(wal.segment(), 2, "start {start}");
            assert!(!wal.holds_records());
            drop(wal);
            assert_eq!(list_segments(dir.path()).unwrap().len(), 2, "start {start}");
            assert_eq!(fs::metadata(&state).unwrap().ino(), inode, "start {start}");
            assert_eq!(fs::read(&state).unwrap(), saved, "start {start}");
        }
        // Once released, numbers still only grow: the next segment is new.
        let (mut wal, replayed) = Wal::open(dir.path()).unwrap();
        wal.release(&replayed.segments).unwrap();
        append(&mut wal, &record("a", 2)).unwrap();
        let closed = wal.rotate().unwrap();
        assert_eq!((closed, wal.segment()), (2, 3));
    }

    /// A crash between saving the state and deleting the released segments
    /// must not replay them (their rows are stored; a replay under another
    /// file name would store them twice).
    #[test]
    fn released_segments_left_on_disk_are_not_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path()).unwrap();
        append(&mut wal, &record("a", 1)).unwrap();
        let first = wal.rotate().unwrap();
        let kept = fs::read(segment_path(dir.path(), first)).unwrap();
        wal.release(&[first]).unwrap();
        drop(wal);
        // As if the deletion had not happened.
        fs::write(segment_path(dir.path(), first), kept).unwrap();
        let (_, replayed) = Wal::open(dir.path()).unwrap();
        assert!(replayed.records.is_empty());
        assert!(!segment_path(dir.path(), first).exists());
    }

    /// Found by the `wal_replay` fuzz target: a segment numbered u64::MAX
    /// overflowed the next number. Such numbers are refused, and a state
    /// file claiming them deletes nothing.
    #[test]
    fn implausible_segment_numbers_are_refused_and_nothing_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let stray = segment_path(dir.path(), u64::MAX);
        fs::write(&stray, b"").unwrap();
        let e = Wal::open(dir.path()).expect_err("refused");
        assert!(e.to_string().contains("implausibly large"), "{e}");
        fs::remove_file(&stray).unwrap();

        let (mut wal, _) = Wal::open(dir.path()).unwrap();
        append(&mut wal, &record("a", 1)).unwrap();
        wal.sync().unwrap();
        let kept = segment_path(dir.path(), wal.segment());
        drop(wal);
        let damaged = WalState {
            collector_id: "c".into(),
            durable: HashMap::new(),
            next_segment: 2,
            released_through: u64::MAX,
            owners: HashMap::new(),
        };
        fs::write(dir.path().join(STATE_FILE), damaged.encode_to_vec()).unwrap();
        let e = Wal::open(dir.path()).expect_err("refused");
        assert!(e.to_string().contains("state.pb"), "{e}");
        assert!(kept.exists(), "the log was kept");
    }

    #[test]
    fn a_torn_tail_is_truncated_and_the_rest_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path()).unwrap();
        append(&mut wal, &record("a", 1)).unwrap();
        append(&mut wal, &record("a", 2)).unwrap();
        wal.sync().unwrap();
        let path = segment_path(dir.path(), wal.segment());
        drop(wal);
        // Cut the last record in half, as a crash mid-write would.
        let len = fs::metadata(&path).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 5)
            .unwrap();
        let (wal, replayed) = Wal::open(dir.path()).unwrap();
        assert_eq!(seqs(&replayed.records), [("a".into(), 1)]);
        assert!(replayed.torn_bytes > 0);
        assert_eq!(wal.durable()["a"], 1);
    }

    #[test]
    fn a_damaged_earlier_segment_keeps_what_precedes_the_damage() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path()).unwrap();
        append(&mut wal, &record("a", 1)).unwrap();
        let first = wal.rotate().unwrap();
        append(&mut wal, &record("a", 2)).unwrap();
        wal.sync().unwrap();
        drop(wal);
        let path = segment_path(dir.path(), first);
        let mut bytes = fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        fs::write(&path, bytes).unwrap();
        let (_, replayed) = Wal::open(dir.path()).unwrap();
        assert_eq!(seqs(&replayed.records), [("a".into(), 2)]);
        assert!(replayed.torn_bytes > 0);
    }

    /// Records are written together when a sync asks for them (one write
    /// per group, not per batch) and read back in order; a burst larger
    /// than the pending bound is written without waiting for the sync.
    #[test]
    fn appended_records_are_written_together_at_the_sync() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path()).unwrap();
        let path = segment_path(dir.path(), wal.segment());
        for seq in 1..=3 {
            append(&mut wal, &record("a", seq)).unwrap();
        }
        assert_eq!(fs::metadata(&path).unwrap().len(), 0);
        assert!(wal.holds_records());
        wal.sync().unwrap();
        let synced = fs::metadata(&path).unwrap().len();
        assert!(synced > 0);
        let mut records = Vec::new();
        let scan = scan_segment(&fs::read(&path).unwrap(), &mut records, &mut Vec::new());
        assert!(scan.damaged.is_empty() && scan.tail.is_none());
        assert_eq!(
            seqs(&records),
            [("a".into(), 1), ("a".into(), 2), ("a".into(), 3)]
        );

        // A record that would take the pending records past their bound
        // has them written first.
        let big = vec![7u8; MAX_PENDING_BYTES / 2];
        wal.append_batch("a", "n1", &big).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), synced);
        wal.append_batch("a", "n1", &big).unwrap();
        assert!(fs::metadata(&path).unwrap().len() > synced + big.len() as u64);
    }

    /// One record damaged in the middle of the log (four bytes flipped in
    /// record 51 of 100, as a bad block would) costs that record only: the
    /// 99 others are replayed, the damaged bytes are kept in quarantine, and
    /// the segment is not cut.
    #[test]
    fn damage_in_the_middle_costs_only_the_damaged_record() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path()).unwrap();
        let mut offsets = Vec::new();
        let path = segment_path(dir.path(), wal.segment());
        for seq in 1..=100 {
            offsets.push(fs::metadata(&path).unwrap().len());
            append(&mut wal, &record("a", seq)).unwrap();
            // Written at each sync: the file's length is the next offset.
            wal.sync().unwrap();
        }
        wal.sync().unwrap();
        let segment = wal.segment();
        drop(wal);
        let mut bytes = fs::read(&path).unwrap();
        let len = bytes.len() as u64;
        let at = offsets[50] as usize + framing::HEADER_BYTES + 3;
        for b in &mut bytes[at..at + 4] {
            *b ^= 0x5a;
        }
        fs::write(&path, &bytes).unwrap();

        let (wal, replayed) = Wal::open(dir.path()).unwrap();
        let want: Vec<(String, u64)> = (1..=100)
            .filter(|s| *s != 51)
            .map(|s| ("a".to_owned(), s))
            .collect();
        assert_eq!(seqs(&replayed.records), want);
        assert_eq!(
            replayed.damaged,
            [Damaged {
                segment,
                offset: offsets[50],
                bytes: offsets[51] - offsets[50],
                reason: "checksum mismatch",
            }]
        );
        assert_eq!(replayed.torn_bytes, 0);
        assert_eq!(fs::metadata(&path).unwrap().len(), len, "not truncated");
        let kept = fs::read(
            dir.path()
                .join(QUARANTINE_DIR)
                .join(format!("wal-{segment:016}-{:012}.bad", offsets[50])),
        )
        .unwrap();
        assert_eq!(kept, &bytes[offsets[50] as usize..offsets[51] as usize]);
        assert_eq!(wal.durable()["a"], 100);
    }

    /// The collector's own records (node events, alert rows) are replayed
    /// like batches, and found again after damage just before them.
    #[test]
    fn node_events_and_alert_rows_are_replayed_past_damage() {
        use gputel_proto::EventKind;
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path()).unwrap();
        let path = segment_path(dir.path(), wal.segment());
        append(&mut wal, &record("a", 1)).unwrap();
        wal.sync().unwrap();
        let damaged_at = fs::metadata(&path).unwrap().len() as usize;
        append(&mut wal, &record("a", 2)).unwrap();
        let silent = NodeEvent {
            ts_us: 1_795_240_830_000_000,
            node: "n1".into(),
            kind: EventKind::NodeSilent as i32,
            silent_ms: 30_000,
            detail: "nothing for 30 s".into(),
            job_id: None,
        };
        wal.append_node_events(std::slice::from_ref(&silent))
            .unwrap();
        let alert = AlertRow {
            ts_us: silent.ts_us,
            node: "n1".into(),
            rule: "NodeSilent".into(),
            status: "firing".into(),
            reason: None,
            ..AlertRow::default()
        };
        wal.append_alerts(std::slice::from_ref(&alert)).unwrap();
        wal.sync().unwrap();
        drop(wal);
        let mut bytes = fs::read(&path).unwrap();
        bytes[damaged_at + framing::HEADER_BYTES + 3] ^= 0x5a;
        fs::write(&path, &bytes).unwrap();

        let (_, replayed) = Wal::open(dir.path()).unwrap();
        assert_eq!(replayed.damaged.len(), 1);
        let records = &replayed.records;
        assert_eq!(records.len(), 3, "{records:?}");
        assert_eq!(seqs(&records[..1]), [("a".into(), 1)]);
        assert_eq!(records[1].node_events, [silent]);
        assert!(records[1].batch.is_none() && records[1].alerts.is_empty());
        assert_eq!(records[2].alerts, [alert]);
    }

    /// A log whose state file is gone or empty is refused: a new identity
    /// would store its rows again under other names and forget what agents
    /// were told is durable. A new, empty directory starts a new identity.
    #[test]
    fn a_lost_or_empty_state_file_is_refused_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path()).unwrap();
        append(&mut wal, &record("a", 1)).unwrap();
        wal.sync().unwrap();
        drop(wal);
        let state = dir.path().join(STATE_FILE);
        let saved = fs::read(&state).unwrap();

        fs::write(&state, b"").unwrap();
        let e = Wal::open(dir.path()).expect_err("an empty state file is refused");
        assert!(
            matches!(&e, WalError::StateLost { what, .. } if what == "is empty"),
            "{e}"
        );
        fs::remove_file(&state).unwrap();
        let e = Wal::open(dir.path()).expect_err("a missing state file is refused");
        let text = e.to_string();
        assert!(
            text.contains("state.pb is missing, but its directory holds log segments"),
            "{text}"
        );
        assert!(text.contains("Restore"), "{text}");

        // Nothing was replayed or deleted meanwhile: restored, all is there.
        fs::write(&state, saved).unwrap();
        let (_, replayed) = Wal::open(dir.path()).unwrap();
        assert_eq!(seqs(&replayed.records), [("a".into(), 1)]);

        let fresh = tempfile::tempdir().unwrap();
        let (wal, _) = Wal::open(fresh.path()).unwrap();
        assert_eq!(wal.collector_id().len(), 12);
    }
}
