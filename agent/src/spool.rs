//! The agent's on-disk spool: every batch is written here before it is sent,
//! and deleted once the collector has acknowledged it, so batches outlive a
//! collector outage of hours and an agent restart.
//!
//! Layout of `--spool-dir`:
//! - `agent.id`: the agent's id, fixed at first start, so sequence numbers
//!   continue across restarts and the collector can drop what it already has.
//! - `spool-<first seq>.log`: consecutive batches, each framed as
//!   `[len: u32 LE][xxh64 of payload: u64 LE][payload]` (a protobuf `Batch`).
//! - `acked`: the highest sequence number the collector acknowledged, so that
//!   a start after a clean stop knows the batches still on disk (the segment
//!   being written is kept until the next one begins) are delivered, and
//!   sequence numbers continue past it whatever segments are left.
//!
//! Memory stays bounded: the spool keeps only segment metadata; the sender
//! reads batches back from disk as it resends them. Past `max_bytes` the
//! oldest segment is deleted and its batches counted as dropped.
//! Every batch is synced to disk before it is sent (one fsync a tick), so a
//! sequence number the collector has acknowledged is never handed out again,
//! even after a power cut or a kernel panic on the node.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use gputel_proto::Batch;
use gputel_runtime::framing;
use prost::Message;

const AGENT_ID_FILE: &str = "agent.id";
const ACKED_FILE: &str = "acked";

/// Why the spool could not be used.
#[derive(Debug, thiserror::Error)]
#[error("spool {path}: {source}")]
pub struct SpoolError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

fn err(path: &Path) -> impl FnOnce(std::io::Error) -> SpoolError + '_ {
    move |source| SpoolError {
        path: path.to_owned(),
        source,
    }
}

/// One segment file: the sequence numbers it holds.
#[derive(Debug, Clone)]
struct Segment {
    /// The sequence its file is named after: its first batch's.
    first_seq: u64,
    /// The last batch written to it; `first_seq - 1` while empty.
    last_seq: u64,
    batches: u64,
    bytes: u64,
}

/// An open spool.
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    agent_id: String,
    segments: VecDeque<Segment>,
    file: File,
    segment_bytes: u64,
    max_bytes: u64,
    /// Highest acknowledged sequence: batches up to it may still sit in the
    /// oldest segment, which is deleted once all of it is acknowledged.
    acked: u64,
    /// Batches deleted unsent because the spool was full.
    pub dropped: u64,
}

impl Spool {
    /// Opens (or creates) the spool in `dir`, keeping at most `max_bytes`.
    pub fn open(dir: &Path, max_bytes: u64) -> Result<Spool, SpoolError> {
        fs::create_dir_all(dir).map_err(err(dir))?;
        let id_path = dir.join(AGENT_ID_FILE);
        let agent_id = match fs::read_to_string(&id_path) {
            Ok(id) if !id.trim().is_empty() => id.trim().to_owned(),
            _ => {
                let id = uuid::Uuid::new_v4().to_string();
                File::create(&id_path)
                    .and_then(|mut f| {
                        f.write_all(format!("{id}\n").as_bytes())?;
                        f.sync_all()
                    })
                    .and_then(|()| File::open(dir)?.sync_all())
                    .map_err(err(&id_path))?;
                id
            }
        };
        let mut segments = Vec::new();
        for entry in fs::read_dir(dir).map_err(err(dir))? {
            let entry = entry.map_err(err(dir))?;
            let Some(first_seq) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("spool-"))
                .and_then(|n| n.strip_suffix(".log"))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            // Sequence numbers start at 1: no segment of this spool is named 0.
            if first_seq == 0 {
                tracing::warn!(path = %entry.path().display(), "not a spool segment (sequence 0); left alone");
                continue;
            }
            let path = entry.path();
            let batches = read_segment(&path)?;
            let bytes = fs::metadata(&path).map_err(err(&path))?.len();
            segments.push(Segment {
                first_seq,
                last_seq: batches
                    .last()
                    .map_or(first_seq.saturating_sub(1), |b| b.seq),
                batches: batches.len() as u64,
                bytes,
            });
        }
        segments.sort_by_key(|s| s.first_seq);
        let acked = read_acked(dir);
        let mut segments: VecDeque<Segment> = segments.into();
        // Write to a fresh segment: the last one may end in a torn batch. A
        // last segment without a whole batch is emptied and written again
        // instead, so one file is never listed twice.
        let reuse = segments.back().is_some_and(|s| s.batches == 0);
        let after_segments = if reuse {
            segments.back().map_or(1, |s| s.first_seq)
        } else {
            match segments.back() {
                None => 1,
                Some(s) => s.last_seq.checked_add(1).ok_or_else(|| {
                    let path = segment_path(dir, s.first_seq);
                    err(&path)(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "its last batch has the largest sequence number there is; the spool is damaged: move it away",
                    ))
                })?,
            }
        };
        // Never a number the collector has acknowledged, even where the
        // segments that held it are gone.
        let next = after_segments.max(acked + 1);
        if reuse && let Some(empty) = segments.pop_back() {
            let path = segment_path(dir, empty.first_seq);
            if empty.first_seq == next {
                OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .and_then(|f| f.set_len(0))
                    .map_err(err(&path))?;
            } else {
                fs::remove_file(&path).map_err(err(&path))?;
            }
        }
        let file = create_segment(dir, next)?;
        segments.push_back(Segment {
            first_seq: next,
            last_seq: next - 1,
            batches: 0,
            bytes: 0,
        });
        let mut spool = Spool {
            dir: dir.to_owned(),
            agent_id,
            segments,
            file,
            segment_bytes: (max_bytes / 16).clamp(4 * 1024, 16 * 1024 * 1024),
            max_bytes,
            acked,
            dropped: 0,
        };
        // What the last run had delivered is gone for good.
        spool.delete_acknowledged_segments()?;
        Ok(spool)
    }

    /// The agent id kept in the spool.
    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    /// The sequence number the next batch gets.
    pub fn next_seq(&self) -> u64 {
        self.segments.back().map_or(1, |s| s.last_seq + 1)
    }

    /// Batches spooled and not yet acknowledged (sequence numbers in the
    /// spool are consecutive).
    pub fn len(&self) -> u64 {
        self.len_before(u64::MAX)
    }

    /// Batches spooled and not yet acknowledged with a sequence number
    /// below `seq`: those of earlier runs, for `seq` = this run's first.
    pub fn len_before(&self, seq: u64) -> u64 {
        let Some(first) = self.first_seq() else {
            return 0;
        };
        let last = (self.next_seq() - 1).min(seq.saturating_sub(1));
        last.saturating_sub(self.acked.max(first - 1))
    }

    /// Whether nothing waits for an acknowledgement.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The lowest sequence still spooled.
    pub fn first_seq(&self) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| s.batches > 0)
            .map(|s| s.first_seq)
    }

    /// Writes a batch (its seq must be [`Spool::next_seq`]). Returns how many
    /// older batches were dropped to stay under the size cap.
    pub fn append(&mut self, batch: &Batch) -> Result<u64, SpoolError> {
        let current = self.segments.back().map_or(1, |s| s.first_seq);
        let path = segment_path(&self.dir, current);
        let framed = framing::frame(&batch.encode_to_vec())
            .map_err(|e| err(&path)(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
        if let Err(e) = self
            .file
            .write_all(&framed)
            .and_then(|()| self.file.sync_data())
        {
            // Cut a partial write off, so later batches never follow a torn one.
            let written = self.segments.back().map_or(0, |s| s.bytes);
            let _ = self.file.set_len(written);
            return Err(err(&path)(e));
        }
        if let Some(segment) = self.segments.back_mut() {
            segment.last_seq = batch.seq;
            segment.batches += 1;
            segment.bytes += framed.len() as u64;
            if segment.bytes >= self.segment_bytes {
                self.rotate()?;
            }
        }
        Ok(self.enforce_cap())
    }

    fn rotate(&mut self) -> Result<(), SpoolError> {
        let next = self.next_seq();
        let path = segment_path(&self.dir, next);
        self.file.sync_data().map_err(err(&path))?;
        self.file = create_segment(&self.dir, next)?;
        self.segments.push_back(Segment {
            first_seq: next,
            last_seq: next - 1,
            batches: 0,
            bytes: 0,
        });
        Ok(())
    }

    /// Deletes the oldest closed segments while over the cap.
    fn enforce_cap(&mut self) -> u64 {
        let mut dropped = 0;
        while self.segments.len() > 1
            && self.segments.iter().map(|s| s.bytes).sum::<u64>() > self.max_bytes
        {
            if let Some(old) = self.segments.pop_front() {
                let _ = fs::remove_file(segment_path(&self.dir, old.first_seq));
                dropped += old.batches;
            }
        }
        self.dropped += dropped;
        dropped
    }

    /// Everything up to `seq` is acknowledged: records it, and deletes the
    /// segments it covers.
    pub fn acknowledge(&mut self, seq: u64) -> Result<(), SpoolError> {
        if seq > self.acked {
            self.acked = seq;
            write_acked(&self.dir, seq)?;
        }
        self.delete_acknowledged_segments()
    }

    /// Deletes the segments, but the one being written, whose batches are
    /// all acknowledged.
    fn delete_acknowledged_segments(&mut self) -> Result<(), SpoolError> {
        let seq = self.acked;
        while self.segments.len() > 1 && self.segments.front().is_some_and(|s| s.last_seq <= seq) {
            if let Some(old) = self.segments.pop_front() {
                let path = segment_path(&self.dir, old.first_seq);
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(err(&path)(e)),
                }
            }
        }
        Ok(())
    }

    /// The spooled batches with sequence `from` or later, in order, read
    /// from disk one segment at a time; at most `limit` of them.
    pub fn read_from(&self, from: u64, limit: usize) -> Result<Vec<Batch>, SpoolError> {
        let from = from.max(self.acked + 1);
        let mut out = Vec::new();
        for segment in &self.segments {
            if segment.batches == 0 || segment.last_seq < from {
                continue;
            }
            let path = segment_path(&self.dir, segment.first_seq);
            for batch in read_segment(&path)? {
                if batch.seq >= from {
                    out.push(batch);
                    if out.len() >= limit {
                        return Ok(out);
                    }
                }
            }
        }
        Ok(out)
    }
}

/// The acknowledged position kept in `dir`; 0 when there is none (a spool
/// of an older version, or a new one) or it cannot be used.
fn read_acked(dir: &Path) -> u64 {
    let path = dir.join(ACKED_FILE);
    let Ok(text) = fs::read_to_string(&path) else {
        return 0;
    };
    match text.trim().parse::<u64>() {
        // No batch could follow the largest number.
        Ok(seq) if seq < u64::MAX => seq,
        _ => {
            tracing::warn!(path = %path.display(), "not an acknowledged sequence number; ignored (batches still spooled are sent again, and the collector drops what it has)");
            0
        }
    }
}

/// Replaces the acknowledged position in one rename. It is not synced: a
/// position lost in a power cut only makes the next start resend what the
/// collector already has, which it drops, while a sync per acknowledgement
/// would double the agent's disk writes.
fn write_acked(dir: &Path, seq: u64) -> Result<(), SpoolError> {
    let tmp = dir.join(format!("{ACKED_FILE}.tmp"));
    fs::write(&tmp, format!("{seq}\n")).map_err(err(&tmp))?;
    let path = dir.join(ACKED_FILE);
    fs::rename(&tmp, &path).map_err(err(&path))
}

fn segment_path(dir: &Path, first_seq: u64) -> PathBuf {
    dir.join(format!("spool-{first_seq:020}.log"))
}

fn create_segment(dir: &Path, first_seq: u64) -> Result<File, SpoolError> {
    let path = segment_path(dir, first_seq);
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(err(&path))?;
    // The new name must outlive a power cut as well as its contents.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err(dir))?;
    Ok(file)
}

/// A segment's batches; a torn or damaged tail (a crash mid-write) ends it.
fn read_segment(path: &Path) -> Result<Vec<Batch>, SpoolError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(err(path))?;
    let mut out = Vec::new();
    let mut rest = bytes.as_slice();
    while let Ok(Some((payload, used))) = framing::next_record(rest) {
        let Ok(batch) = Batch::decode(payload) else {
            break;
        };
        out.push(batch);
        rest = &rest[used..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gputel_proto::NodeSample;

    fn batch(seq: u64) -> Batch {
        Batch {
            seq,
            node: vec![NodeSample {
                ts_us: seq as i64,
                cpu_count: 8,
                load1: Some(1.5),
                ..NodeSample::default()
            }],
            ..Batch::default()
        }
    }

    fn seqs(batches: &[Batch]) -> Vec<u64> {
        batches.iter().map(|b| b.seq).collect()
    }

    #[test]
    fn batches_outlive_a_restart_with_the_same_agent_id_and_next_seq() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
        let id = spool.agent_id().to_owned();
        assert_eq!(spool.next_seq(), 1);
        for seq in 1..=5 {
            spool.append(&batch(seq)).unwrap();
        }
        spool.acknowledge(2).unwrap();
        drop(spool);

        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(spool.agent_id(), id);
        assert_eq!(spool.next_seq(), 6);
        // One segment holds 1..5: acking 2 deleted nothing yet; the sender
        // starts from the collector's durable seq + 1.
        assert_eq!(seqs(&spool.read_from(3, 100).unwrap()), [3, 4, 5]);
        assert_eq!(spool.read_from(3, 2).unwrap().len(), 2);
    }

    /// Found by the `spool_open` fuzz target: a segment named after
    /// sequence 0 made the next sequence underflow.
    #[test]
    fn a_segment_named_zero_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let stray = dir.path().join(format!("spool-{:020}.log", 0));
        std::fs::write(&stray, b"").unwrap();
        let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(spool.next_seq(), 1);
        spool.append(&batch(1)).unwrap();
        assert_eq!(seqs(&spool.read_from(1, 10).unwrap()), [1]);
        assert!(stray.exists());
    }

    #[test]
    fn acknowledged_segments_are_deleted_and_numbers_continue() {
        let dir = tempfile::tempdir().unwrap();
        // One batch a segment.
        let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
        spool.segment_bytes = 1;
        for seq in 1..=4 {
            spool.append(&batch(seq)).unwrap();
        }
        assert_eq!(spool.len(), 4);
        spool.acknowledge(4).unwrap();
        assert_eq!(spool.len(), 0);
        assert!(spool.is_empty());
        drop(spool);
        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(spool.next_seq(), 5);
        assert!(spool.is_empty());
    }

    #[test]
    fn a_start_after_everything_was_acknowledged_has_nothing_pending() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
        for seq in 1..=5 {
            spool.append(&batch(seq)).unwrap();
        }
        spool.acknowledge(5).unwrap();
        // The segment being written stays on disk, acknowledged.
        assert!(segment_path(dir.path(), 1).exists());
        drop(spool);

        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(spool.len(), 0);
        assert_eq!(spool.first_seq(), None);
        assert_eq!(spool.next_seq(), 6);
        assert!(spool.read_from(0, 10).unwrap().is_empty());
        assert!(!segment_path(dir.path(), 1).exists());
        assert_eq!(
            fs::read_to_string(dir.path().join(ACKED_FILE)).unwrap(),
            "5\n"
        );
    }

    #[test]
    fn a_partly_acknowledged_spool_resends_only_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
        for seq in 1..=5 {
            spool.append(&batch(seq)).unwrap();
        }
        spool.acknowledge(3).unwrap();
        drop(spool);

        let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(spool.len(), 2);
        assert_eq!(seqs(&spool.read_from(0, 10).unwrap()), [4, 5]);
        // This run's batches start at 6; 4 and 5 are an earlier run's.
        spool.append(&batch(6)).unwrap();
        assert_eq!(spool.len(), 3);
        assert_eq!(spool.len_before(6), 2);
        spool.acknowledge(4).unwrap();
        assert_eq!(spool.len_before(6), 1);
        assert_eq!(spool.len(), 2);
    }

    #[test]
    fn numbers_continue_past_the_acknowledged_position_without_segments() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(ACKED_FILE), "41\n").unwrap();
        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(spool.next_seq(), 42);
        assert!(spool.is_empty());
        fs::write(dir.path().join(ACKED_FILE), "garbage").unwrap();
        drop(spool);
        // A damaged position is ignored: the segments say where to go on.
        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(spool.next_seq(), 42);
    }

    #[test]
    fn a_full_spool_drops_the_oldest_and_counts_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path(), 100).unwrap();
        spool.segment_bytes = 1;
        let mut dropped = 0;
        for seq in 1..=10 {
            dropped += spool.append(&batch(seq)).unwrap();
        }
        assert!(dropped > 0);
        assert_eq!(spool.dropped, dropped);
        assert_eq!(spool.len() + dropped, 10);
        // What is left is the newest, in order.
        let left = seqs(&spool.read_from(0, 100).unwrap());
        assert_eq!(left.last(), Some(&10));
        assert_eq!(left.first(), Some(&(dropped + 1)));
    }

    #[test]
    fn a_torn_tail_ends_the_segment() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
        spool.append(&batch(1)).unwrap();
        spool.append(&batch(2)).unwrap();
        drop(spool);
        let path = segment_path(dir.path(), 1);
        let len = fs::metadata(&path).unwrap().len();
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 3)
            .unwrap();
        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(seqs(&spool.read_from(0, 10).unwrap()), [1]);
        assert_eq!(spool.next_seq(), 2);
    }
}

#[cfg(test)]
mod restart_tests {
    use super::*;

    /// Two restarts with nothing written in between: the empty last segment
    /// is reused, never listed twice, and acknowledging never deletes the
    /// segment being written.
    #[test]
    fn restarts_without_batches_keep_one_current_segment() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
        for seq in 1..=3 {
            spool
                .append(&Batch {
                    seq,
                    ..Batch::default()
                })
                .unwrap();
        }
        drop(spool);
        drop(Spool::open(dir.path(), 1 << 20).unwrap());
        let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(spool.next_seq(), 4);
        spool.acknowledge(3).unwrap();
        spool
            .append(&Batch {
                seq: 4,
                ..Batch::default()
            })
            .unwrap();
        drop(spool);
        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(spool.next_seq(), 5);
        assert_eq!(spool.read_from(0, 10).unwrap().len(), 1);
    }
}
