//! Reading one job's rows from the store: only the files of the job's
//! hours, only the row groups whose bloom filter on `job_id` may hold the
//! job, only the columns a figure needs, and only the rows whose `job_id`
//! is the job's (a row filter evaluated while decoding).

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType,
};
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch};
use arrow_schema::{DataType, TimeUnit};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::arrow_reader::{ArrowPredicateFn, RowFilter};
use parquet::arrow::async_reader::{AsyncFileReader, ParquetRecordBatchStreamBuilder};
use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use serde::Serialize;

use super::ReportError;

/// How the `job_id` column names the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// The column is the job id (gpu, event, job, scheduler_job).
    Exact,
    /// The column is the job id or a comma-separated list holding it (the
    /// alert table's node rules); bloom filters cannot tell, so no row group
    /// is skipped by them.
    Listed,
}

impl Match {
    fn holds(self, value: &str, job: &str) -> bool {
        match self {
            Match::Exact => value == job,
            Match::Listed => value.split(',').any(|v| v == job),
        }
    }
}

/// What the report read from the store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReadStats {
    /// Files listed in the partitions looked at.
    pub files: u64,
    /// Row groups in those files, and those read (not skipped by a bloom filter).
    pub row_groups: u64,
    pub row_groups_read: u64,
    /// Bytes of those files, and bytes actually fetched (footers, bloom
    /// filters and column chunks).
    pub file_bytes: u64,
    pub bytes_read: u64,
    /// Requests for data (ranges), not counting listings.
    pub requests: u64,
}

impl ReadStats {
    /// One file of `bytes` looked at: `row_groups` of it, `read` of them read.
    pub fn add_file(&mut self, bytes: u64, row_groups: u64, read: u64) {
        self.files += 1;
        self.file_bytes += bytes;
        self.row_groups += row_groups;
        self.row_groups_read += read;
    }
}

/// Counts what is fetched through it.
#[derive(Debug, Default)]
struct Counters {
    bytes: AtomicU64,
    requests: AtomicU64,
}

/// An object store that counts the bytes and requests of its reads: the
/// report states what it cost.
#[derive(Debug)]
pub struct Counting {
    inner: Arc<dyn ObjectStore>,
    counters: Arc<Counters>,
}

impl Counting {
    pub fn new(inner: Arc<dyn ObjectStore>) -> Self {
        Self {
            inner,
            counters: Arc::default(),
        }
    }

    /// Bytes and requests so far.
    pub fn read(&self) -> (u64, u64) {
        (
            self.counters.bytes.load(Ordering::Relaxed),
            self.counters.requests.load(Ordering::Relaxed),
        )
    }
}

impl fmt::Display for Counting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

#[async_trait::async_trait]
impl ObjectStore for Counting {
    async fn put_opts(
        &self,
        location: &ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjectPath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let result = self.inner.get_opts(location, options).await?;
        self.counters
            .bytes
            .fetch_add(result.range.end - result.range.start, Ordering::Relaxed);
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        Ok(result)
    }

    async fn get_ranges(
        &self,
        location: &ObjectPath,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        let bytes = self.inner.get_ranges(location, ranges).await?;
        let total: usize = bytes.iter().map(Bytes::len).sum();
        self.counters
            .bytes
            .fetch_add(total as u64, Ordering::Relaxed);
        self.counters
            .requests
            .fetch_add(ranges.len() as u64, Ordering::Relaxed);
        Ok(bytes)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<ObjectPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjectPath>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &ObjectPath,
        to: &ObjectPath,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &ObjectPath,
        to: &ObjectPath,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

/// One Parquet file of the store, read by ranges: the footer, then what
/// the reader asks for.
struct StoreFile {
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    size: u64,
}

impl AsyncFileReader for StoreFile {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        Box::pin(async move {
            self.store
                .get_range(&self.path, range)
                .await
                .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))
        })
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        Box::pin(async move {
            self.store
                .get_ranges(&self.path, &ranges)
                .await
                .map_err(|e| parquet::errors::ParquetError::External(Box::new(e)))
        })
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        Box::pin(async move {
            let size = self.size;
            let metadata = ParquetMetaDataReader::new()
                .load_and_finish(self, size)
                .await?;
            Ok(Arc::new(metadata))
        })
    }
}

/// Every file under `prefix` (a table, or one hour of it); none when the
/// prefix does not exist.
pub async fn list(store: &dyn ObjectStore, prefix: &str) -> Result<Vec<ObjectMeta>, ReportError> {
    let prefix = ObjectPath::from(prefix);
    let mut files: Vec<ObjectMeta> =
        store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|source| ReportError::List {
                prefix: prefix.to_string(),
                source,
            })?;
    files.sort_by(|a, b| a.location.cmp(&b.location));
    Ok(files)
}

/// Whether anything is stored under `prefix`.
pub async fn exists(store: &dyn ObjectStore, prefix: &str) -> Result<bool, ReportError> {
    let prefix = ObjectPath::from(prefix);
    let listed = store
        .list_with_delimiter(Some(&prefix))
        .await
        .map_err(|source| ReportError::List {
            prefix: prefix.to_string(),
            source,
        })?;
    Ok(!listed.objects.is_empty() || !listed.common_prefixes.is_empty())
}

/// A reader of one file of the store (its footer read), and how to name
/// the file in a decoding error.
async fn open(
    store: Arc<dyn ObjectStore>,
    file: &ObjectMeta,
) -> Result<
    (
        ParquetRecordBatchStreamBuilder<StoreFile>,
        impl Fn(parquet::errors::ParquetError) -> ReportError + use<>,
    ),
    ReportError,
> {
    let path = file.location.to_string();
    let decode = move |source| ReportError::Decode {
        path: path.clone(),
        source,
    };
    let reader = StoreFile {
        store,
        path: file.location.clone(),
        size: file.size,
    };
    let builder = ParquetRecordBatchStreamBuilder::new(reader)
        .await
        .map_err(&decode)?;
    Ok((builder, decode))
}

/// What one file gave.
#[derive(Debug, Default)]
pub struct FileRows {
    pub batches: Vec<RecordBatch>,
    pub row_groups: u64,
    pub row_groups_read: u64,
}

/// The job's rows of one Parquet file, with `columns` (those the file has)
/// and `job_id`; the row groups and rows read are added to `stats`.
pub async fn job_rows(
    store: Arc<dyn ObjectStore>,
    file: &ObjectMeta,
    job: &str,
    matching: Match,
    columns: &[&str],
) -> Result<FileRows, ReportError> {
    let (mut builder, decode) = open(store, file).await?;
    let schema = builder.parquet_schema().clone();
    let Some(job_column) = schema.columns().iter().position(|c| c.name() == "job_id") else {
        return Ok(FileRows::default());
    };
    let row_groups = builder.metadata().num_row_groups();
    let mut wanted = Vec::new();
    for row_group in 0..row_groups {
        if matching == Match::Exact
            && let Some(bloom) = builder
                .get_row_group_column_bloom_filter(row_group, job_column)
                .await
                .map_err(&decode)?
            && !bloom.check(job)
        {
            continue;
        }
        wanted.push(row_group);
    }
    let read = wanted.len() as u64;
    if wanted.is_empty() {
        return Ok(FileRows {
            row_groups: row_groups as u64,
            ..FileRows::default()
        });
    }
    let job_owned = job.to_owned();
    let predicate = ArrowPredicateFn::new(
        ProjectionMask::leaves(&schema, [job_column]),
        move |batch: RecordBatch| Ok(matches(batch.column(0), |v| matching.holds(v, &job_owned))),
    );
    let projection = ProjectionMask::columns(&schema, columns.iter().copied().chain(["job_id"]));
    let batches: Vec<RecordBatch> = builder
        .with_row_groups(wanted)
        .with_projection(projection)
        .with_row_filter(RowFilter::new(vec![Box::new(predicate)]))
        .build()
        .map_err(&decode)?
        .try_collect()
        .await
        .map_err(&decode)?;
    Ok(FileRows {
        batches,
        row_groups: row_groups as u64,
        row_groups_read: read,
    })
}

/// Every row of one Parquet file, with `columns` (those the file has; a
/// column a file predates is absent from its batches).
pub async fn all_rows(
    store: Arc<dyn ObjectStore>,
    file: &ObjectMeta,
    columns: &[&str],
) -> Result<FileRows, ReportError> {
    let stream = stream_rows(store, file, columns, 8192).await?;
    Ok(FileRows {
        batches: stream.batches.try_collect().await?,
        row_groups: stream.row_groups,
        row_groups_read: stream.row_groups,
    })
}

/// A file's rows with the columns asked for, a batch at a time.
pub struct RowStream {
    pub path: String,
    /// Whether every row group of the file declares its rows sorted by
    /// `node` first, ascending (gputel sorts every file it writes by its
    /// table's sort key and says so); a reader checks that it holds.
    pub sorted_by_node: bool,
    pub row_groups: u64,
    pub batches: BoxStream<'static, Result<RecordBatch, ReportError>>,
}

/// Opens one Parquet file for reading `columns` (those the file has) in
/// batches of `batch_size` rows, telling whether it is sorted by node.
pub async fn stream_rows(
    store: Arc<dyn ObjectStore>,
    file: &ObjectMeta,
    columns: &[&str],
    batch_size: usize,
) -> Result<RowStream, ReportError> {
    let (builder, decode) = open(store, file).await?;
    let schema = builder.parquet_schema();
    let node_leaf = schema
        .columns()
        .iter()
        .position(|c| c.path().string() == "node");
    let metadata = builder.metadata();
    let sorted_by_node = node_leaf.is_some_and(|leaf| {
        metadata.row_groups().iter().all(|group| {
            group
                .sorting_columns()
                .and_then(|order| order.first())
                .is_some_and(|by| usize::try_from(by.column_idx) == Ok(leaf) && !by.descending)
        })
    });
    let row_groups = metadata.num_row_groups() as u64;
    let projection = ProjectionMask::columns(schema, columns.iter().copied());
    let batches = builder
        .with_projection(projection)
        .with_batch_size(batch_size)
        .build()
        .map_err(&decode)?
        .map_err(decode)
        .boxed();
    Ok(RowStream {
        path: file.location.to_string(),
        sorted_by_node,
        row_groups,
        batches,
    })
}

/// Reads whole `files` a few at a time, in order; counts into `stats`.
pub async fn all_rows_of(
    store: &Arc<dyn ObjectStore>,
    files: &[ObjectMeta],
    columns: &[&str],
    stats: &mut ReadStats,
) -> Result<Vec<RecordBatch>, ReportError> {
    const AT_ONCE: usize = 4;
    let read: Vec<(u64, FileRows)> = futures::stream::iter(files.iter().cloned())
        .map(|file| {
            let store = Arc::clone(store);
            async move {
                let rows = all_rows(store, &file, columns).await?;
                Ok::<_, ReportError>((file.size, rows))
            }
        })
        .buffered(AT_ONCE)
        .try_collect()
        .await?;
    let mut out = Vec::new();
    for (size, rows) in read {
        stats.add_file(size, rows.row_groups, rows.row_groups_read);
        out.extend(rows.batches);
    }
    Ok(out)
}

/// Reads `files` a few at a time (S3 answers in tens of milliseconds per
/// request), keeping the job's rows; counts into `stats`.
pub async fn job_rows_of(
    store: &Arc<dyn ObjectStore>,
    files: &[ObjectMeta],
    job: &str,
    matching: Match,
    columns: &[&str],
    stats: &mut ReadStats,
) -> Result<Vec<(ObjectMeta, Vec<RecordBatch>)>, ReportError> {
    const AT_ONCE: usize = 8;
    let read: Vec<(ObjectMeta, FileRows)> = futures::stream::iter(files.iter().cloned())
        .map(|file| {
            let store = Arc::clone(store);
            async move {
                let rows = job_rows(store, &file, job, matching, columns).await?;
                Ok::<_, ReportError>((file, rows))
            }
        })
        .buffered(AT_ONCE)
        .try_collect()
        .await?;
    let mut out = Vec::with_capacity(read.len());
    for (file, rows) in read {
        stats.add_file(file.size, rows.row_groups, rows.row_groups_read);
        out.push((file, rows.batches));
    }
    Ok(out)
}

/// Which rows of a string column (plain or dictionary) satisfy `want`; a
/// dictionary's values are tested once each.
fn matches(column: &ArrayRef, want: impl Fn(&str) -> bool) -> BooleanArray {
    if let Some(dict) = column.as_dictionary_opt::<Int32Type>()
        && let Some(values) = dict.values().as_string_opt::<i32>()
    {
        let hit: Vec<bool> = values.iter().map(|v| v.is_some_and(&want)).collect();
        return dict
            .keys()
            .iter()
            .map(|k| {
                Some(k.is_some_and(|k| usize::try_from(k).is_ok_and(|k| hit.get(k) == Some(&true))))
            })
            .collect();
    }
    if let Some(strings) = column.as_string_opt::<i32>() {
        return strings.iter().map(|v| Some(v.is_some_and(&want))).collect();
    }
    BooleanArray::from(vec![false; column.len()])
}

/// The columns of a batch by name; a column a file predates is absent.
pub struct Columns<'a> {
    batch: &'a RecordBatch,
}

impl<'a> Columns<'a> {
    pub fn new(batch: &'a RecordBatch) -> Self {
        Self { batch }
    }

    fn get(&self, name: &str, row: usize) -> Option<&'a ArrayRef> {
        self.batch.column_by_name(name).filter(|c| c.is_valid(row))
    }

    /// An integer or µs timestamp column's value.
    pub fn int(&self, name: &str, row: usize) -> Option<i64> {
        let column = self.get(name, row)?;
        match column.data_type() {
            DataType::Int32 => Some(column.as_primitive::<Int32Type>().value(row).into()),
            DataType::Int64 => Some(column.as_primitive::<Int64Type>().value(row)),
            DataType::Timestamp(TimeUnit::Microsecond, _) => {
                Some(column.as_primitive::<TimestampMicrosecondType>().value(row))
            }
            _ => None,
        }
    }

    /// A number column's value as a float.
    pub fn float(&self, name: &str, row: usize) -> Option<f64> {
        let column = self.get(name, row)?;
        match column.data_type() {
            DataType::Float32 => Some(column.as_primitive::<Float32Type>().value(row).into()),
            DataType::Float64 => Some(column.as_primitive::<Float64Type>().value(row)),
            _ => self.int(name, row).map(|v| v as f64),
        }
    }

    /// A string column's value (plain or dictionary-encoded).
    pub fn text(&self, name: &str, row: usize) -> Option<String> {
        let column = self.get(name, row)?;
        if let Some(strings) = column.as_string_opt::<i32>() {
            return Some(strings.value(row).to_owned());
        }
        let dict = column.as_dictionary_opt::<Int32Type>()?;
        let values = dict.values().as_string_opt::<i32>()?;
        let key = usize::try_from(dict.keys().value(row)).ok()?;
        (key < values.len()).then(|| values.value(key).to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::builder::StringDictionaryBuilder;
    use arrow_array::{DictionaryArray, StringArray};

    #[test]
    fn job_ids_match_plain_dictionary_and_listed() {
        let plain: ArrayRef = Arc::new(StringArray::from(vec![Some("42"), None, Some("420")]));
        let got = matches(&plain, |v| Match::Exact.holds(v, "42"));
        assert_eq!(got, BooleanArray::from(vec![true, false, false]));
        let mut dict = StringDictionaryBuilder::<Int32Type>::new();
        dict.append_value("7,42");
        dict.append_null();
        dict.append_value("42");
        dict.append_value("7");
        let dict: DictionaryArray<Int32Type> = dict.finish();
        let dict: ArrayRef = Arc::new(dict);
        let listed = matches(&dict, |v| Match::Listed.holds(v, "42"));
        assert_eq!(listed, BooleanArray::from(vec![true, false, true, false]));
        let exact = matches(&dict, |v| Match::Exact.holds(v, "42"));
        assert_eq!(exact, BooleanArray::from(vec![false, false, true, false]));
    }
}
