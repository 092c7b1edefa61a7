//! Compaction and retention: the store's maintenance, run by the serving
//! collector on a timer and by `gputel-collector compact`, through one code
//! path ([`maintain`]), by one process per store at a time: the holder of
//! the store's compaction lease ([`Lease`]).
//!
//! Compaction merges the small files of a closed hour of one table into few
//! large, sorted ones (`c-<hash of the merged names>.parquet`) and leaves a
//! marker `<stem>.compacted` per merged file, holding a hash of its bytes: a
//! flush that writes those very bytes again (a retried upload, a replay) is
//! then skipped by the store instead of storing its rows twice. A merge
//! keeps one row per key ([`gputel_schemas::RowKey`]): rows stored twice
//! (an agent that failed over between collectors, a node clock stepped
//! back) are stored once from then on, the row of the file whose name sorts
//! last where the two differ.
//!
//! Publishing is atomic on a local store: the new hour directory (compacted
//! files, markers, and hard links to whatever else the hour holds) is built
//! under `<store>/.compacting/` and exchanged with the live one in one
//! `renameat2(RENAME_EXCHANGE)`, under the store's exclusive lock, which
//! flushes take shared. S3 has no multi-object atomic operation: there the
//! compacted files are uploaded first and the merged ones deleted after, so a
//! listing in between sees some rows twice (never misses one).

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use bytes::Bytes;
use chrono::{DateTime, NaiveDate};
use futures::{StreamExt, TryStreamExt};
use gputel_schemas::{PartitionKey, PartitionPath, Table};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::errors::ParquetError;
use tracing::{info, warn};
use twox_hash::XxHash64;

use crate::memory::{apart, return_freed_memory};
use crate::persist::{
    MAX_COMPACTED_FILE_ROWS, MAX_MERGE_ROWS, PersistError, compacted_properties, off_runtime,
    put_file,
};
use crate::store::{self, Store};

pub use crate::marker::{MARKER_EXTENSION, marker_path};
use crate::marker::{hash_hex, merged_into};

/// Stem prefix of compacted files.
pub const COMPACTED_PREFIX: &str = "c-";
/// Directory under a local store's root where new hour directories are
/// built and old ones wait for deletion; no table's glob reaches it.
pub const STAGING_DIR: &str = ".compacting";
const HOUR_US: i64 = 3_600_000_000;
const DAY_US: i64 = 24 * HOUR_US;

/// Why maintenance stopped; it is tried again at the next round.
#[derive(Debug, thiserror::Error)]
pub enum CompactError {
    #[error("cannot list {prefix} in the store: {source}")]
    List {
        prefix: String,
        #[source]
        source: object_store::Error,
    },
    #[error("cannot read {path} from the store: {source}")]
    Read {
        path: String,
        #[source]
        source: object_store::Error,
    },
    #[error(
        "cannot decode {path} as Parquet: {source}; move it out of the store to compact its hour"
    )]
    Decode {
        path: String,
        #[source]
        source: ParquetError,
    },
    #[error("cannot merge the rows of {hour}: {source}")]
    Merge {
        hour: String,
        #[source]
        source: ArrowError,
    },
    #[error(transparent)]
    Persist(#[from] PersistError),
    #[error("cannot publish the compacted {hour} in {root}: {source}")]
    Swap {
        hour: String,
        root: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot delete {path} from the store: {source}")]
    Delete {
        path: String,
        #[source]
        source: object_store::Error,
    },
    #[error("cannot delete {path}: {source}")]
    DeleteDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error("cannot spill rows being compacted to {dir}: {source}")]
    Spill {
        dir: PathBuf,
        #[source]
        source: ArrowError,
    },
    #[error("cannot make a directory for compaction's spill files under {dir}: {source}")]
    SpillDir {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Which hours compaction considers.
#[derive(Debug, Clone)]
pub struct CompactOptions {
    /// Tables to compact.
    pub tables: Vec<Table>,
    /// An hour is closed, and compacted, once it ended at least this long ago.
    pub min_age: Duration,
    /// Only hours starting at or after this time (µs since the epoch).
    pub since_us: Option<i64>,
    /// Only hours starting before this time (µs since the epoch).
    pub before_us: Option<i64>,
    /// `(collector id, last released log segment)` of the collector running
    /// this: its files whose rows its log still holds are left alone, as a
    /// replay could write them again with more rows.
    pub unreleased_of: Option<(String, u64)>,
    /// Most rows in one compacted file ([`MAX_COMPACTED_FILE_ROWS`]); an
    /// hour with more becomes several, split between nodes.
    pub max_file_rows: usize,
    /// Most rows sorted in memory at once ([`MAX_MERGE_ROWS`]): an hour with
    /// more is merged a range of nodes at a time, its rows spilled to disk
    /// per range in between.
    pub merge_rows: usize,
    /// Where the spill files go when the store is not a local directory (a
    /// local store's go under its staging directory); the system's
    /// temporary directory when None.
    pub spill_dir: Option<PathBuf>,
}

impl Default for CompactOptions {
    fn default() -> Self {
        Self {
            tables: Table::ALL.to_vec(),
            min_age: Duration::from_secs(10 * 60),
            since_us: None,
            before_us: None,
            unreleased_of: None,
            max_file_rows: MAX_COMPACTED_FILE_ROWS,
            merge_rows: MAX_MERGE_ROWS,
            spill_dir: None,
        }
    }
}

/// What compaction did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CompactReport {
    /// Hours compacted.
    pub hours: usize,
    /// Hours left as they are: a file changed while merging (the next round
    /// tries again), or one holds another schema than the table's (left
    /// until it is moved out; logged).
    pub hours_skipped: usize,
    pub files_in: usize,
    pub files_out: usize,
    /// Rows read from the merged files.
    pub rows: usize,
    /// Rows left out because another row had the same key (the table's
    /// [`gputel_schemas::RowKey`]); the compacted files hold `rows` minus these.
    pub duplicates: usize,
    /// Of those, rows whose values differed from the row kept.
    pub duplicates_differing: usize,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

mod lease;
mod merge;
mod publish;
mod retention;

pub use lease::{LEASE_PATH, LOCAL_LEASE_FILE, Lease, LeaseError, LeaseRecord, holder_name};

use merge::*;
use publish::*;
pub use retention::{Retention, RetentionReport, apply_retention};

/// One round of maintenance: retention, then compaction, under the store's
/// compaction lease (renewed first). Shared by the background job and
/// `gputel-collector compact`.
pub async fn maintain(
    store: &Store,
    now_us: i64,
    compact_options: Option<&CompactOptions>,
    retention: &Retention,
    lease: &mut Lease,
) -> Result<(CompactReport, RetentionReport), CompactError> {
    lease.renew().await?;
    let deleted = apply_retention(store, now_us, retention).await?;
    let compacted = match compact_options {
        Some(options) => compact(store, now_us, options, lease).await?,
        None => CompactReport::default(),
    };
    Ok((compacted, deleted))
}

/// One file to merge.
#[derive(Debug)]
struct Source {
    path: PartitionPath,
    size: u64,
    /// (inode, size, mtime ns) of a local file when it was read.
    identity: Option<Identity>,
    hash: String,
}

/// One compacted file, written and synced.
#[derive(Debug)]
struct Output {
    stem: String,
    path: PathBuf,
    bytes: u64,
}

/// (inode, size, mtime in ns) of a local file: changes when it is replaced.
type Identity = (u64, u64, i64);

fn local_identity(path: &Path) -> io::Result<Identity> {
    let meta = std::fs::metadata(path)?;
    Ok((
        meta.ino(),
        meta.len(),
        meta.mtime() * 1_000_000_000 + meta.mtime_nsec(),
    ))
}

/// Lists the `key=value` children of `prefix` (directories of a local store).
async fn children(store: &dyn ObjectStore, prefix: &str) -> Result<Vec<String>, CompactError> {
    let listed = store
        .list_with_delimiter(Some(&ObjectPath::from(prefix)))
        .await
        .map_err(|source| CompactError::List {
            prefix: prefix.to_owned(),
            source,
        })?;
    Ok(listed
        .common_prefixes
        .into_iter()
        .filter_map(|p| p.filename().map(str::to_owned))
        .collect())
}

fn date_start_us(dir: &str) -> Option<i64> {
    let date = NaiveDate::parse_from_str(dir.strip_prefix("date=")?, "%Y-%m-%d").ok()?;
    Some(date.and_hms_opt(0, 0, 0)?.and_utc().timestamp_micros())
}

fn hour_of(dir: &str) -> Option<i64> {
    let hour: i64 = dir.strip_prefix("hour=")?.parse().ok()?;
    (0..24).contains(&hour).then_some(hour)
}

/// Prefix of the directories a merge writes its spill files and new files
/// in, deleted when it ends.
const MERGE_PREFIX: &str = "gputel-merge-";

/// Where merges make their directories: a local store's staging directory,
/// else `options.spill_dir` or the system's temporary directory.
fn spill_parent(store: &Store, options: &CompactOptions) -> PathBuf {
    match &store.local {
        Some(root) => root.join(STAGING_DIR),
        None => options.spill_dir.clone().unwrap_or_else(std::env::temp_dir),
    }
}

/// Raises this process's limit of open files to the most it may have
/// (systemd's default hard limit is 524 288, the soft one 1024): a merge
/// keeps one spill file open per range of nodes, and a serving collector a
/// socket per agent. Returns the limit now in force.
pub fn raise_open_files_limit() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_some() && limit.current != limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            return limit.maximum.unwrap_or(u64::MAX);
        }
    }
    limit.current.unwrap_or(u64::MAX)
}

/// A quarter of the open files this process may have. Ranges of nodes of
/// at most rows / this many rows are at most half the limit (any two
/// consecutive ranges together hold more than one may), so a merge keeps
/// at most half its open files in spill files, and sockets, the log and the
/// store the rest.
fn max_spill_files() -> usize {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let current = limit.current.unwrap_or(u64::MAX);
    usize::try_from(current / 4).unwrap_or(usize::MAX).max(16)
}

/// Deletes what merges cut short (a crash, a kill) left in `parent`. Only
/// where this compactor is the only one: a store's staging directory (under
/// its lease) or a spill directory of its own, never the shared temporary
/// directory.
fn remove_merge_leftovers(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(MERGE_PREFIX)
        {
            let path = entry.path();
            match std::fs::remove_dir_all(&path) {
                Ok(()) => {
                    info!(dir = %path.display(), "deleted what an interrupted compaction left")
                }
                Err(e) => {
                    warn!(dir = %path.display(), error = %e, "cannot delete what an interrupted compaction left")
                }
            }
        }
    }
}

/// Compacts every closed hour with more than one file. `lease` is renewed
/// before each hour is published: a compactor that lost it stops there.
pub async fn compact(
    store: &Store,
    now_us: i64,
    options: &CompactOptions,
    lease: &mut Lease,
) -> Result<CompactReport, CompactError> {
    if store.local.is_some() || options.spill_dir.is_some() {
        let parent = spill_parent(store, options);
        // A failure is logged inside; compaction goes on regardless.
        let _ = tokio::task::spawn_blocking(move || remove_merge_leftovers(&parent)).await;
    }
    let mut report = CompactReport::default();
    let closed_before = now_us.saturating_sub(options.min_age.as_micros() as i64);
    for &table in &options.tables {
        for date in children(store.objects.as_ref(), table.name()).await? {
            let Some(day) = date_start_us(&date) else {
                continue;
            };
            if day >= closed_before
                || options.before_us.is_some_and(|b| day >= b)
                || options.since_us.is_some_and(|s| day + DAY_US <= s)
            {
                continue;
            }
            let prefix = format!("{}/{date}", table.name());
            for hour in children(store.objects.as_ref(), &prefix).await? {
                let Some(h) = hour_of(&hour) else {
                    continue;
                };
                let start = day + h * HOUR_US;
                if start + HOUR_US > closed_before
                    || options.before_us.is_some_and(|b| start >= b)
                    || options.since_us.is_some_and(|s| start < s)
                {
                    continue;
                }
                let key = PartitionKey::from_ts_us(start).expect("a listed hour is representable");
                compact_hour(store, table, key, options, lease, &mut report).await?;
            }
        }
    }
    if report.hours > 0 || report.hours_skipped > 0 {
        info!(
            hours = report.hours,
            skipped = report.hours_skipped,
            files_in = report.files_in,
            files_out = report.files_out,
            rows = report.rows,
            duplicates = report.duplicates,
            differing = report.duplicates_differing,
            bytes_in = report.bytes_in,
            bytes_out = report.bytes_out,
            "compacted"
        );
    }
    Ok(report)
}

/// Whether an hour's files are the output of one merge: an hour of more
/// rows than a file holds ([`CompactOptions::max_file_rows`]) is compacted
/// into several files, and merging them again would only write them again,
/// every round, for every such hour the store keeps. Each file is a merge's
/// output and none is marked as merged into another (what a publish cut
/// short leaves on an object store, which the merge then deletes); a file
/// flushed into the hour later is not an output, so the hour is merged again.
fn already_compacted(files: &[(PartitionPath, u64)], names: &HashSet<String>) -> bool {
    files.iter().all(|(path, _)| {
        path.stem().starts_with(COMPACTED_PREFIX)
            && !names.contains(&format!("{}.{MARKER_EXTENSION}", path.stem()))
    })
}

/// Whether a volume with `free` of `total` bytes has room to merge an hour
/// of `hour_bytes`: about twice them, beside the free space the log keeps
/// by default ([`crate::wal::default_min_free_bytes`]).
fn room_to_merge(free: u64, total: u64, hour_bytes: u64) -> bool {
    free.saturating_sub(hour_bytes.saturating_mul(2)) >= crate::wal::default_min_free_bytes(total)
}

/// Whether a file's rows may still be written again by the running
/// collector's log replay.
fn unreleased(stem: &str, unreleased_of: &Option<(String, u64)>) -> bool {
    let Some((id, released_through)) = unreleased_of else {
        return false;
    };
    let Some((collector, first)) = stem.rsplit_once('-') else {
        return false;
    };
    collector == id && first.parse::<u64>().is_ok_and(|f| f > *released_through)
}

/// Compaction's CPU-bound work, off the runtime's worker threads
/// ([`off_runtime`]) and in memory apart from the write path's ([`apart`]).
async fn off_runtime_apart<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    off_runtime(move || apart(work)).await
}

async fn compact_hour(
    store: &Store,
    table: Table,
    key: PartitionKey,
    options: &CompactOptions,
    lease: &mut Lease,
    report: &mut CompactReport,
) -> Result<(), CompactError> {
    let hour = format!("{}/{key}", table.name());
    let listed: Vec<_> = store
        .objects
        .list(Some(&ObjectPath::from(hour.as_str())))
        .try_collect()
        .await
        .map_err(|source| CompactError::List {
            prefix: hour.clone(),
            source,
        })?;
    let names: HashSet<String> = listed
        .iter()
        .filter_map(|m| m.location.filename().map(str::to_owned))
        .collect();
    let mut files: Vec<(PartitionPath, u64)> = listed
        .into_iter()
        .filter_map(|meta| {
            let path = PartitionPath::parse(meta.location.as_ref()).ok()?;
            (!unreleased(path.stem(), &options.unreleased_of)).then_some((path, meta.size))
        })
        .collect();
    if files.len() < 2 || already_compacted(&files, &names) {
        return Ok(());
    }
    files.sort_by(|a, b| a.0.stem().cmp(b.0.stem()));

    // First reading: each file's hash and its rows per node; its bytes are
    // not kept (an hour of a large fleet is gigabytes of them).
    let mut inputs: Vec<Source> = Vec::new();
    // Files already merged into an existing output by an interrupted
    // compaction (S3): deleted, not merged again.
    let mut leftovers: Vec<Source> = Vec::new();
    let mut counts: BTreeMap<Option<String>, usize> = BTreeMap::new();
    // The table's columns no file holds a value of: not spilled.
    let mut null = vec![true; table.schema().fields().len()];
    for (path, size) in files {
        let name = path.to_string();
        let identity = match &store.local {
            Some(root) => match local_identity(&root.join(&name)) {
                Ok(identity) => Some(identity),
                // Gone since the listing: the next round sees the hour as it is then.
                Err(_) => {
                    report.hours_skipped += 1;
                    return Ok(());
                }
            },
            None => None,
        };
        let bytes = read(store.objects.as_ref(), &name).await?;
        let source = Source {
            hash: hash_hex(&bytes),
            size: size.max(bytes.len() as u64),
            path,
            identity,
        };
        let marker_name = format!("{}.{MARKER_EXTENSION}", source.path.stem());
        if names.contains(&marker_name) {
            let marker = read(store.objects.as_ref(), marker_path(&source.path).as_ref()).await?;
            if let Some(output) = merged_into(&marker, &source.hash)
                && names.contains(&format!("{output}.parquet"))
            {
                leftovers.push(source);
                continue;
            }
        }
        let census = off_runtime_apart(move || census(table, &name, bytes)).await?;
        let Some(census) = census else {
            warn!(file = %source.path, "schema differs from the table's; hour {hour} left as it is");
            report.hours_skipped += 1;
            return Ok(());
        };
        for (value, n) in census.keys {
            *counts.entry(value).or_default() += n;
        }
        for (all, file) in null.iter_mut().zip(census.null) {
            *all &= file;
        }
        inputs.push(source);
    }
    if inputs.len() < 2 && leftovers.is_empty() {
        return Ok(());
    }
    // Rows read from the merged files: every row has a first sort-key value.
    let rows: usize = counts.values().sum();

    // The new hour's files are written where they are published from: a
    // local store's staging directory (exchanged with the hour), else a
    // temporary one; spill files in a temporary directory beside them.
    let spill_parent = spill_parent(store, options);
    let work = |parent: &Path| {
        tempfile::Builder::new()
            .prefix(MERGE_PREFIX)
            .tempdir_in(parent)
            .map_err(|source| CompactError::SpillDir {
                dir: parent.to_owned(),
                source,
            })
    };
    // Spill files and new files take up to about 1.7 times the hour's
    // bytes (benches/README.md, "Capacity"); an hour that would leave the
    // volume with less free than the log keeps by default waits for room,
    // rather than fill the disk flushes or the log also write to.
    let hour_bytes: u64 = inputs.iter().map(|s| s.size).sum();
    std::fs::create_dir_all(&spill_parent).map_err(|source| CompactError::SpillDir {
        dir: spill_parent.clone(),
        source,
    })?;
    if let Ok((free, total)) = crate::wal::volume_space(&spill_parent)
        && !room_to_merge(free, total, hour_bytes)
    {
        warn!(
            dir = %spill_parent.display(),
            hour_bytes,
            free,
            "too little free space to compact {hour} (its merge needs about twice the hour's \
             bytes, beside the free space the log keeps by default); left to a later round"
        );
        report.hours_skipped += 1;
        return Ok(());
    }
    let spill_dir = work(&spill_parent)?;
    let out_dir = work(&spill_parent)?;

    // Ranges of at most `merge_rows` rows, unless that would take more
    // spill files than may be open at once: then larger ones.
    let merge_rows = options
        .merge_rows
        .max(rows.div_ceil(max_spill_files()))
        .max(1);
    let buckets = Buckets::plan(&counts, merge_rows);
    let stems: Vec<String> = inputs.iter().map(|s| s.path.stem().to_owned()).collect();
    let mut outputs = Outputs::new(
        table,
        out_dir.path(),
        spill_dir.path(),
        &hour,
        &stems,
        &buckets,
        options.max_file_rows.max(1),
    );
    // Second reading: each row to its range of nodes. A file that changed
    // since the first (another hash) leaves the hour to the next round.
    if !inputs.is_empty() {
        let mut spill = Spill::new(table, buckets, null, spill_dir.path()).map_err(|source| {
            CompactError::Spill {
                dir: spill_dir.path().to_owned(),
                source,
            }
        })?;
        for source in &inputs {
            let name = source.path.to_string();
            let bytes = read(store.objects.as_ref(), &name).await?;
            if hash_hex(&bytes) != source.hash {
                info!(file = %name, "changed while being compacted; hour {hour} left to the next round");
                report.hours_skipped += 1;
                return Ok(());
            }
            spill = off_runtime_apart(move || {
                decode(table, &name, bytes, |batch| spill.add(batch))?;
                Ok::<_, CompactError>(spill)
            })
            .await?;
        }
        let buckets = off_runtime_apart(move || spill.finish()).await?;
        for (index, rows) in buckets.into_iter().enumerate() {
            outputs = off_runtime_apart(move || {
                outputs.merge(index, rows.load(table)?)?;
                // The range's rows are freed; the next range takes as much.
                return_freed_memory();
                Ok::<_, CompactError>(outputs)
            })
            .await?;
        }
    }
    let (outputs, duplicates) = off_runtime_apart(move || outputs.finish()).await?;
    drop(spill_dir);

    // Each merged file's marker: its hash and the compacted file holding
    // the last of its rows, published last.
    let last = outputs.last().map(|o| o.stem.clone()).unwrap_or_default();
    let markers: Vec<(PartitionPath, String)> = inputs
        .iter()
        .map(|s| (s.path.clone(), format!("{} {last}", s.hash)))
        .collect();
    let sources = inputs;

    // Merging took a while: publish only while still the store's compactor.
    lease.renew().await?;
    let bytes_out: u64 = outputs.iter().map(|o| o.bytes).sum();
    let files_out = outputs.len();
    let files_in = sources.len() + leftovers.len();
    let bytes_in =
        sources.iter().map(|s| s.size).sum::<u64>() + leftovers.iter().map(|s| s.size).sum::<u64>();
    let published = match &store.local {
        Some(root) => {
            let root = root.clone();
            let rel = hour.clone();
            let removed: Vec<(String, Option<Identity>)> = sources
                .iter()
                .chain(&leftovers)
                .map(|s| (s.path.stem().to_owned(), s.identity))
                .collect();
            let markers: Vec<(String, String)> = markers
                .iter()
                .map(|(p, m)| (p.stem().to_owned(), m.clone()))
                .collect();
            let staging = out_dir.path().to_owned();
            tokio::task::spawn_blocking(move || {
                swap_local(&root, &rel, &removed, &markers, &staging)
            })
            .await
            .map_err(|e| io::Error::other(e.to_string()))
            .and_then(|r| r)
            .map_err(|source| CompactError::Swap {
                hour: hour.clone(),
                root: store.local.clone().unwrap_or_default(),
                source,
            })?
        }
        None => {
            let removed: Vec<&PartitionPath> = sources
                .iter()
                .map(|s| &s.path)
                .chain(leftovers.iter().map(|s| &s.path))
                .collect();
            publish_objects(
                store.objects.as_ref(),
                table,
                key,
                &markers,
                outputs,
                &removed,
            )
            .await?;
            true
        }
    };
    if published {
        if duplicates.differing > 0 {
            warn!(
                hour = %hour,
                differing = duplicates.differing,
                "rows with the same key and different values; kept the row of the file whose name sorts last"
            );
        }
        report.hours += 1;
        report.duplicates += duplicates.removed;
        report.duplicates_differing += duplicates.differing;
        report.files_in += files_in;
        report.files_out += files_out;
        report.rows += rows;
        report.bytes_in += bytes_in;
        report.bytes_out += bytes_out;
    } else {
        report.hours_skipped += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_values_parse() {
        let r = Retention::parse(&["30d", "gpu=90d", "node=12h"]).unwrap();
        assert_eq!(r.default, Some(Duration::from_secs(30 * 86400)));
        assert_eq!(r.age(Table::Gpu), Some(Duration::from_secs(90 * 86400)));
        assert_eq!(r.age(Table::Node), Some(Duration::from_secs(12 * 3600)));
        assert_eq!(r.age(Table::Ib), Some(Duration::from_secs(30 * 86400)));
        assert_eq!(Retention::parse(&["gpu=90d"]).unwrap().age(Table::Ib), None);
        for bad in ["cpu=1d", "gpu=", "gpu=10s", "forever"] {
            assert!(Retention::parse(&[bad]).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn retention_deletes_whole_days_older_than_each_tables_age() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        for part in [
            "gpu/date=2026-01-01/hour=23",
            "gpu/date=2026-01-05/hour=00",
            "node/date=2026-01-01/hour=00",
        ] {
            std::fs::create_dir_all(root.join(part)).unwrap();
            std::fs::write(root.join(part).join("x-1.parquet"), b"x").unwrap();
        }
        let store = store::open_store(root.to_str().unwrap(), &Default::default()).unwrap();
        // 2026-01-09T00:00Z, from the injected clock.
        let clock = crate::clock::Clock::Manual(std::sync::Arc::new(
            std::sync::atomic::AtomicI64::new(1_767_916_800_000_000),
        ));
        let retention = Retention::parse(&["gpu=7d"]).unwrap();
        let report = apply_retention(&store, clock.now_us(), &retention)
            .await
            .unwrap();
        // 01-01 ended on 01-02, more than 7 days before; 01-05 did not.
        assert_eq!(report, RetentionReport { partitions: 1 });
        assert!(!root.join("gpu/date=2026-01-01").exists());
        assert!(
            root.join("gpu/date=2026-01-05/hour=00/x-1.parquet")
                .exists()
        );
        assert!(
            root.join("node/date=2026-01-01/hour=00/x-1.parquet")
                .exists()
        );
        let report = apply_retention(&store, clock.now_us(), &Retention::parse(&["1d"]).unwrap())
            .await
            .unwrap();
        assert_eq!(report.partitions, 2);
        assert!(!root.join("node/date=2026-01-01").exists());
    }

    #[test]
    fn an_hour_is_merged_only_with_room_for_twice_its_bytes_and_the_logs_reserve() {
        const GB: u64 = 1 << 30;
        // 5 % of a 4 GiB volume, 205 MiB, is kept; 256 MiB of larger ones.
        assert!(room_to_merge(GB, 4 * GB, 300 << 20));
        assert!(!room_to_merge(GB, 4 * GB, 450 << 20));
        assert!(room_to_merge(10 * GB, 1000 * GB, 4 * GB + (1 << 20)));
        assert!(!room_to_merge(10 * GB, 1000 * GB, 5 * GB - (100 << 20)));
        assert!(!room_to_merge(0, GB, 0));
    }

    #[test]
    fn the_open_files_limit_is_raised_to_the_hard_one() {
        use rustix::process::{Resource, getrlimit};
        let now = raise_open_files_limit();
        let limit = getrlimit(Resource::Nofile);
        assert_eq!(limit.current, limit.maximum);
        assert_eq!(now, limit.current.unwrap_or(u64::MAX));
        assert!(max_spill_files() as u64 >= (now / 4).min(usize::MAX as u64));
    }

    #[test]
    fn only_this_collectors_unreleased_files_are_held_back() {
        let of = Some(("abc".to_owned(), 41));
        assert!(unreleased("abc-0000000000000042", &of));
        assert!(!unreleased("abc-0000000000000041", &of));
        assert!(!unreleased("xyz-0000000000000042", &of));
        assert!(!unreleased("c-00ff", &of));
        assert!(!unreleased("abc-0000000000000042", &None));
    }
}
