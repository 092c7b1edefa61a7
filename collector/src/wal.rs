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
//! acknowledged; replay stops there and truncates it.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use gputel_proto::{AlertRow, Batch, WalRecord, WalState};
use gputel_runtime::framing;
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint};

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
    /// The segments they came from; delete them once the records are stored.
    pub segments: Vec<u64>,
    /// Torn records dropped from the end of the last segment.
    pub torn_bytes: u64,
}

/// An open write-ahead log.
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    state: WalState,
    segment: u64,
    /// The current segment, appended with one write per record, so a failed
    /// write can only tear that record.
    file: File,
    /// A second handle on it, for syncing without the caller's lock.
    sync_handle: File,
    /// Bytes of whole records in the current segment.
    written: u64,
    /// Segments closed because a write failed; their records are in the
    /// buffer and must be released with it.
    closed_on_error: Vec<u64>,
    dirty: bool,
}

impl Wal {
    /// Opens (or creates) the log in `dir`, replays what it holds, and starts
    /// a new segment for what comes next.
    pub fn open(dir: &Path) -> Result<(Wal, Replayed), WalError> {
        fs::create_dir_all(dir).map_err(io(dir))?;
        let state_path = dir.join(STATE_FILE);
        let state = match fs::read(&state_path) {
            Ok(bytes) => WalState::decode(bytes.as_slice()).map_err(|e| WalError::Corrupt {
                path: state_path.clone(),
                offset: 0,
                reason: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => WalState {
                collector_id: uuid::Uuid::new_v4().simple().to_string()[..12].to_owned(),
                durable: HashMap::new(),
                next_segment: 1,
                released_through: 0,
            },
            Err(e) => return Err(io(&state_path)(e)),
        };
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
            let torn = read_segment(&segment_path(dir, segment), last, &mut replayed.records)?;
            replayed.torn_bytes += torn;
        }
        replayed.segments = segments.clone();
        let next = segments
            .last()
            .map_or(1, |s| s + 1)
            .max(state.next_segment)
            .max(1);
        let (file, sync_handle) = create_segment(dir, next)?;
        let mut wal = Wal {
            dir: dir.to_owned(),
            state,
            segment: next,
            file,
            sync_handle,
            written: 0,
            closed_on_error: Vec::new(),
            dirty: false,
        };
        for record in &replayed.records {
            if let Some(batch) = &record.batch {
                wal.note_durable(&record.agent_id, batch.seq);
            }
        }
        // Write the state now: the collector id must not change after this.
        wal.save_state()?;
        Ok((wal, replayed))
    }

    /// The last segment whose rows are stored; every earlier one is too.
    pub fn released_through(&self) -> u64 {
        self.state.released_through
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

    /// Appends an agent's batch as a record (without copying the batch);
    /// durable only after the next sync, which the caller then reports with
    /// [`Wal::note_durable`].
    pub fn append_batch(
        &mut self,
        agent_id: &str,
        node: &str,
        batch: &Batch,
    ) -> Result<(), WalError> {
        let mut payload =
            Vec::with_capacity(batch.encoded_len() + agent_id.len() + node.len() + 16);
        for (tag, bytes) in [(1, agent_id.as_bytes()), (2, node.as_bytes())] {
            encode_key(tag, WireType::LengthDelimited, &mut payload);
            encode_varint(bytes.len() as u64, &mut payload);
            payload.extend_from_slice(bytes);
        }
        prost::encoding::message::encode(3, batch, &mut payload);
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

    fn append_payload(&mut self, payload: &[u8]) -> Result<(), WalError> {
        let path = segment_path(&self.dir, self.segment);
        let framed = framing::frame(payload).map_err(|e| WalError::Corrupt {
            path: path.clone(),
            offset: 0,
            reason: e.to_string(),
        })?;
        if let Err(e) = self.file.write_all(&framed) {
            // Cut the partial record off, so no later record follows a torn
            // one; should that fail too, later records go to a fresh segment.
            if self.file.set_len(self.written).is_err() {
                match self.rotate() {
                    Ok(closed) => self.closed_on_error.push(closed),
                    Err(rotate) => {
                        tracing::error!(error = %rotate, "cannot start a new log segment either");
                    }
                }
            }
            return Err(io(&path)(e));
        }
        self.written += framed.len() as u64;
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
        let closed = self.segment;
        let (file, sync_handle) = create_segment(&self.dir, closed + 1)?;
        self.segment = closed + 1;
        self.file = file;
        self.sync_handle = sync_handle;
        self.written = 0;
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

/// Reads one segment's records. A torn tail (short header, short payload,
/// bad checksum) is truncated and its length returned.
fn read_segment(path: &Path, last: bool, out: &mut Vec<WalRecord>) -> Result<u64, WalError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(io(path))?;
    let mut offset = 0usize;
    while offset < bytes.len() {
        let rest = &bytes[offset..];
        let problem = match framing::next_record(rest) {
            Ok(Some((payload, used))) => match WalRecord::decode(payload) {
                Ok(record) => {
                    out.push(record);
                    offset += used;
                    None
                }
                Err(_) => Some("record does not decode"),
            },
            Ok(None) => None,
            Err(damage) => Some(damage.reason()),
        };
        if let Some(reason) = problem {
            if !last {
                // Appends after a failed write go to a new segment, so a
                // torn record ends its segment; anything else is damage.
                tracing::error!(path = %path.display(), offset, reason, "log segment damaged; the records from here to its end are lost");
            }
            let torn_bytes = (bytes.len() - offset) as u64;
            let file = OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(io(path))?;
            file.set_len(offset as u64).map_err(io(path))?;
            file.sync_all().map_err(io(path))?;
            tracing::warn!(
                path = %path.display(),
                offset,
                torn_bytes,
                reason,
                "write-ahead log ends in a torn record (a crash mid-write); it was never acknowledged and is dropped"
            );
            return Ok(torn_bytes);
        }
    }
    Ok(0)
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
        wal.append_batch(&record.agent_id, &record.node, batch)
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
}
