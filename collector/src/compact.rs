//! Compaction and retention: the store's maintenance, run by the serving
//! collector on a timer and by `gputel-collector compact`, through one code
//! path ([`maintain`]).
//!
//! Compaction merges the small files of a closed hour of one table into few
//! large, sorted ones (`c-<hash of the merged names>.parquet`) and leaves a
//! marker `<stem>.compacted` per merged file, holding a hash of its bytes: a
//! flush that writes those very bytes again (a retried upload, a replay) is
//! then skipped by the store instead of storing its rows twice.
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
use std::mem::take;
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

use crate::persist::{
    MAX_COMPACTED_FILE_ROWS, PersistError, compacted_properties, encode_with, off_runtime,
    put_file, sort_rows,
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
}

impl Default for CompactOptions {
    fn default() -> Self {
        Self {
            tables: Table::ALL.to_vec(),
            min_age: Duration::from_secs(10 * 60),
            since_us: None,
            before_us: None,
            unreleased_of: None,
        }
    }
}

/// What compaction did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CompactReport {
    /// Hours compacted.
    pub hours: usize,
    /// Hours left for the next round because a file changed while merging.
    pub hours_skipped: usize,
    pub files_in: usize,
    pub files_out: usize,
    pub rows: usize,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// How long each table's partitions are kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retention {
    /// For tables without their own age; None keeps them forever.
    pub default: Option<Duration>,
    pub tables: BTreeMap<Table, Duration>,
}

impl Retention {
    /// Parses `--retention` values: `AGE` (every table) or `TABLE=AGE`.
    pub fn parse<S: AsRef<str>>(values: &[S]) -> Result<Retention, String> {
        let mut retention = Retention::default();
        for value in values {
            let value = value.as_ref();
            let (table, age) = match value.split_once('=') {
                Some((name, age)) => {
                    let table = Table::ALL
                        .into_iter()
                        .find(|t| t.name() == name)
                        .ok_or_else(|| {
                            format!(
                                "retention {value:?}: no table {name:?}; tables: {}",
                                Table::ALL.map(|t| t.name()).join(", ")
                            )
                        })?;
                    (Some(table), age)
                }
                None => (None, value),
            };
            let age = humantime::parse_duration(age)
                .map_err(|e| format!("retention {value:?}: {e} (e.g. 90d, 12h)"))?;
            if age < Duration::from_secs(3600) {
                return Err(format!("retention {value:?}: keep data at least 1h"));
            }
            match table {
                Some(table) => {
                    retention.tables.insert(table, age);
                }
                None => retention.default = Some(age),
            }
        }
        Ok(retention)
    }

    /// How long `table` is kept; None: forever.
    pub fn age(&self, table: Table) -> Option<Duration> {
        self.tables.get(&table).copied().or(self.default)
    }

    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.tables.is_empty()
    }
}

/// What retention deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RetentionReport {
    /// `date=` partitions deleted.
    pub partitions: usize,
}

/// One round of maintenance: retention, then compaction. Shared by the
/// background job and `gputel-collector compact`.
pub async fn maintain(
    store: &Store,
    now_us: i64,
    compact_options: Option<&CompactOptions>,
    retention: &Retention,
) -> Result<(CompactReport, RetentionReport), CompactError> {
    let deleted = apply_retention(store, now_us, retention).await?;
    let compacted = match compact_options {
        Some(options) => compact(store, now_us, options).await?,
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

/// One compacted file.
#[derive(Debug)]
struct Output {
    stem: String,
    bytes: Bytes,
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

/// Compacts every closed hour with more than one file.
pub async fn compact(
    store: &Store,
    now_us: i64,
    options: &CompactOptions,
) -> Result<CompactReport, CompactError> {
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
                compact_hour(store, table, key, options, &mut report).await?;
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
            bytes_in = report.bytes_in,
            bytes_out = report.bytes_out,
            "compacted"
        );
    }
    Ok(report)
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

async fn compact_hour(
    store: &Store,
    table: Table,
    key: PartitionKey,
    options: &CompactOptions,
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
    if files.len() < 2 {
        return Ok(());
    }
    files.sort_by(|a, b| a.0.stem().cmp(b.0.stem()));

    // Merged files, each with the index of the output that holds its rows.
    let mut sources: Vec<(Source, usize)> = Vec::new();
    // Files already merged into an existing output by an interrupted
    // compaction (S3): deleted, not merged again.
    let mut leftovers: Vec<Source> = Vec::new();
    let mut outputs = Vec::new();
    let mut group: Vec<RecordBatch> = Vec::new();
    let mut group_stems: Vec<String> = Vec::new();
    let mut group_rows = 0;
    let mut rows = 0;
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
        let decoded = {
            let name = name.clone();
            off_runtime(move || decode(table, &name, bytes)).await?
        };
        let Some(batches) = decoded else {
            warn!(file = %name, "schema differs from the table's; hour {hour} left as it is");
            report.hours_skipped += 1;
            return Ok(());
        };
        let file_rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
        if group_rows > 0 && group_rows + file_rows > MAX_COMPACTED_FILE_ROWS {
            let (batches, stems) = (take(&mut group), take(&mut group_stems));
            outputs.push(merge_off_runtime(table, &hour, batches, stems).await?);
            group_rows = 0;
        }
        group.extend(batches);
        group_stems.push(source.path.stem().to_owned());
        group_rows += file_rows;
        rows += file_rows;
        sources.push((source, outputs.len()));
    }
    if !group.is_empty() {
        outputs.push(merge_off_runtime(table, &hour, group, group_stems).await?);
    }
    if sources.len() < 2 && leftovers.is_empty() {
        return Ok(());
    }
    // Each merged file's marker: its hash and the compacted file holding it.
    let markers: Vec<(PartitionPath, String)> = sources
        .iter()
        .map(|(s, i)| (s.path.clone(), format!("{} {}", s.hash, outputs[*i].stem)))
        .collect();

    let bytes_out: u64 = outputs.iter().map(|o| o.bytes.len() as u64).sum();
    let files_out = outputs.len();
    let files_in = sources.len() + leftovers.len();
    let bytes_in = sources.iter().map(|(s, _)| s.size).sum::<u64>()
        + leftovers.iter().map(|s| s.size).sum::<u64>();
    let published = match &store.local {
        Some(root) => {
            let root = root.clone();
            let rel = hour.clone();
            let removed: Vec<(String, Option<Identity>)> = sources
                .iter()
                .map(|(s, _)| s)
                .chain(&leftovers)
                .map(|s| (s.path.stem().to_owned(), s.identity))
                .collect();
            let markers: Vec<(String, String)> = markers
                .iter()
                .map(|(p, m)| (p.stem().to_owned(), m.clone()))
                .collect();
            tokio::task::spawn_blocking(move || {
                swap_local(&root, &rel, &removed, &markers, outputs)
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
                .map(|(s, _)| &s.path)
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
        report.hours += 1;
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

async fn read(store: &dyn ObjectStore, name: &str) -> Result<Bytes, CompactError> {
    let err = |source| CompactError::Read {
        path: name.to_owned(),
        source,
    };
    store
        .get(&ObjectPath::from(name))
        .await
        .map_err(err)?
        .bytes()
        .await
        .map_err(err)
}

/// The batches of one file, or None when its schema is not the table's.
fn decode(
    table: Table,
    name: &str,
    bytes: Bytes,
) -> Result<Option<Vec<RecordBatch>>, CompactError> {
    let err = |source| CompactError::Decode {
        path: name.to_owned(),
        source,
    };
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(err)?;
    let expected = table.schema();
    let found = builder.schema();
    let same = found.fields().len() == expected.fields().len()
        && found.fields().iter().zip(expected.fields()).all(|(a, b)| {
            a.name() == b.name()
                && a.data_type() == b.data_type()
                && a.is_nullable() == b.is_nullable()
        });
    if !same {
        return Ok(None);
    }
    let reader = builder.with_batch_size(64 * 1024).build().map_err(err)?;
    let batches = reader
        .collect::<Result<Vec<_>, ArrowError>>()
        .map_err(|e| err(ParquetError::ArrowError(e.to_string())))?;
    // The table's own schema (with its field metadata) for concatenation.
    batches
        .into_iter()
        .map(|b| RecordBatch::try_new(expected.clone(), b.columns().to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
        .map_err(|e| err(ParquetError::ArrowError(e.to_string())))
}

/// Merges a group of files' rows into one sorted, encoded file.
fn merge(
    table: Table,
    hour: &str,
    group: Vec<RecordBatch>,
    stems: &[String],
) -> Result<Output, CompactError> {
    let merge_err = |source| CompactError::Merge {
        hour: hour.to_owned(),
        source,
    };
    let schema = table.schema();
    let all = arrow_select::concat::concat_batches(&schema, group.iter()).map_err(merge_err)?;
    drop(group);
    let sorted = sort_rows(table, &all).map_err(merge_err)?;
    drop(all);
    let name = format!("{hour}/compacted");
    let bytes = encode_with(
        schema,
        compacted_properties(table, sorted.num_rows()),
        &sorted,
    )
    .map_err(|source| PersistError::Encode { path: name, source })?;
    let stem = format!(
        "{COMPACTED_PREFIX}{:016x}",
        XxHash64::oneshot(0, stems.join("/").as_bytes())
    );
    Ok(Output { stem, bytes })
}

/// [`merge`] on the blocking threads: sorting and encoding up to
/// [`MAX_COMPACTED_FILE_ROWS`] rows takes seconds.
async fn merge_off_runtime(
    table: Table,
    hour: &str,
    group: Vec<RecordBatch>,
    stems: Vec<String>,
) -> Result<Output, CompactError> {
    let hour = hour.to_owned();
    off_runtime(move || merge(table, &hour, group, &stems)).await
}

/// S3 and other object stores: markers first, then the compacted files,
/// then the merged files are deleted. Between the uploads and the deletions
/// a listing sees the merged rows twice, never none. A round cut short is
/// finished by the next one: a merged file whose marker names a compacted
/// file that exists is deleted, not merged again.
async fn publish_objects(
    store: &dyn ObjectStore,
    table: Table,
    key: PartitionKey,
    markers: &[(PartitionPath, String)],
    outputs: Vec<Output>,
    removed: &[&PartitionPath],
) -> Result<(), CompactError> {
    for (path, marker) in markers {
        put_file(
            store,
            marker_path(path).to_string(),
            Bytes::from(marker.clone()),
        )
        .await?;
    }
    for output in outputs {
        let path = PartitionPath::new(table, key, &output.stem).expect("compacted stems are valid");
        put_file(store, path.to_string(), output.bytes).await?;
    }
    for path in removed {
        let path = path.to_string();
        match store.delete(&ObjectPath::from(path.as_str())).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(source) => return Err(CompactError::Delete { path, source }),
        }
    }
    Ok(())
}

fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

fn sync_dir(path: &Path) -> io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

/// A new, empty directory under the store's staging directory.
fn staging_dir(root: &Path) -> io::Result<PathBuf> {
    let parent = root.join(STAGING_DIR);
    std::fs::create_dir_all(&parent)?;
    let dir = parent.join(uuid::Uuid::new_v4().simple().to_string());
    std::fs::create_dir(&dir)?;
    Ok(dir)
}

/// Local store: builds the new hour directory and exchanges it with the live
/// one. Returns false (and changes nothing) when a merged file changed since
/// it was read.
fn swap_local(
    root: &Path,
    hour: &str,
    removed: &[(String, Option<Identity>)],
    markers: &[(String, String)],
    outputs: Vec<Output>,
) -> io::Result<bool> {
    let live = root.join(hour);
    let staging = staging_dir(root)?;
    let built = (|| {
        for output in &outputs {
            write_synced(
                &staging.join(format!("{}.parquet", output.stem)),
                &output.bytes,
            )?;
        }
        for (stem, marker) in markers {
            write_synced(
                &staging.join(format!("{stem}.{MARKER_EXTENSION}")),
                marker.as_bytes(),
            )?;
        }
        Ok::<_, io::Error>(())
    })();
    if let Err(e) = built {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    let merged: HashSet<String> = removed
        .iter()
        .map(|(s, _)| format!("{s}.parquet"))
        .collect();
    let swapped = {
        let _lock = store::lock(root, true)?;
        (|| {
            for (stem, identity) in removed {
                let now = local_identity(&live.join(format!("{stem}.parquet"))).ok();
                if now != *identity {
                    return Ok(false);
                }
            }
            // Whatever else the hour holds (files flushed since the listing,
            // earlier markers) moves along; abandoned uploads ('#') do not.
            for entry in std::fs::read_dir(&live)? {
                let name = entry?.file_name();
                let Some(name) = name.to_str() else { continue };
                if merged.contains(name) || name.contains('#') || staging.join(name).exists() {
                    continue;
                }
                std::fs::hard_link(live.join(name), staging.join(name))?;
            }
            sync_dir(&staging)?;
            rustix::fs::renameat_with(
                rustix::fs::CWD,
                &live,
                rustix::fs::CWD,
                &staging,
                rustix::fs::RenameFlags::EXCHANGE,
            )?;
            if let Some(parent) = live.parent() {
                sync_dir(parent)?;
            }
            Ok::<_, io::Error>(true)
        })()
    };
    // After the exchange `staging` holds the old hour; before it, the unused new one.
    let removed = std::fs::remove_dir_all(&staging);
    let swapped = swapped?;
    removed?;
    Ok(swapped)
}

/// Deletes every `date=` partition older than its table's retention: a
/// partition goes once its whole day is older than the age.
pub async fn apply_retention(
    store: &Store,
    now_us: i64,
    retention: &Retention,
) -> Result<RetentionReport, CompactError> {
    let mut report = RetentionReport::default();
    for table in Table::ALL {
        let Some(age) = retention.age(table) else {
            continue;
        };
        let cutoff = now_us.saturating_sub(age.as_micros() as i64);
        for date in children(store.objects.as_ref(), table.name()).await? {
            let Some(day) = date_start_us(&date) else {
                continue;
            };
            if day + DAY_US > cutoff {
                continue;
            }
            let prefix = format!("{}/{date}", table.name());
            match &store.local {
                Some(root) => {
                    let root = root.clone();
                    let rel = prefix.clone();
                    tokio::task::spawn_blocking(move || delete_local(&root, &rel))
                        .await
                        .map_err(|e| io::Error::other(e.to_string()))
                        .and_then(|r| r)
                        .map_err(|source| CompactError::DeleteDir {
                            path: store.local.clone().unwrap_or_default().join(&prefix),
                            source,
                        })?;
                }
                None => delete_objects(store.objects.as_ref(), &prefix).await?,
            }
            info!(
                partition = %prefix,
                retention = %humantime::format_duration(age),
                day = %DateTime::from_timestamp_micros(day).map(|d| d.date_naive().to_string()).unwrap_or_default(),
                "deleted a partition past its retention"
            );
            report.partitions += 1;
        }
    }
    Ok(report)
}

/// Local store: the partition leaves the table in one rename, then is deleted.
fn delete_local(root: &Path, partition: &str) -> io::Result<()> {
    let staging = staging_dir(root)?;
    let doomed = staging.join("partition");
    {
        let _lock = store::lock(root, true)?;
        std::fs::rename(root.join(partition), &doomed)?;
    }
    std::fs::remove_dir_all(&staging)
}

async fn delete_objects(store: &dyn ObjectStore, prefix: &str) -> Result<(), CompactError> {
    let locations = store
        .list(Some(&ObjectPath::from(prefix)))
        .map_ok(|meta| meta.location)
        .boxed();
    store
        .delete_stream(locations)
        .try_collect::<Vec<_>>()
        .await
        .map_err(|source| CompactError::Delete {
            path: prefix.to_owned(),
            source,
        })?;
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
    fn only_this_collectors_unreleased_files_are_held_back() {
        let of = Some(("abc".to_owned(), 41));
        assert!(unreleased("abc-0000000000000042", &of));
        assert!(!unreleased("abc-0000000000000041", &of));
        assert!(!unreleased("xyz-0000000000000042", &of));
        assert!(!unreleased("c-00ff", &of));
        assert!(!unreleased("abc-0000000000000042", &None));
    }
}
