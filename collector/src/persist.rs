//! The persister: turns record batches into Parquet files in the object store.
//! Every writer setting lives here, once.

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, UInt32Array};
use arrow_schema::{ArrowError, DataType, FieldRef, Schema, SchemaRef};
use arrow_select::take::{take, take_record_batch};
use bytes::Bytes;
use gputel_schemas::{BatchColumns, Columns, PartitionPath, SharedNulls, Table};

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parquet::arrow::ArrowSchemaConverter;
use parquet::arrow::ArrowWriter;
use parquet::arrow::arrow_writer::{ArrowColumnWriter, ArrowRowGroupWriterFactory, compute_leaves};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::metadata::SortingColumn;
use parquet::file::properties::{
    EnabledStatistics, WriterProperties, WriterPropertiesPtr, WriterVersion,
};
use parquet::file::writer::{SerializedFileWriter, SerializedRowGroupWriter};
use parquet::schema::types::ColumnPath;

use crate::marker;
use crate::store::Store;

/// zstd level of compacted files, which stay: level 3, most of zstd's ratio
/// on telemetry at a small CPU cost.
pub const ZSTD_LEVEL: i32 = 3;
/// zstd level of flush files, which compaction replaces: level 1. The files
/// are as small as at level 3 (0.3 % larger: their footers and page indexes
/// weigh more than their pages), and each column's compressor holds smaller
/// tables while a flush is encoded (7 MB less at the peak for 1000 agents;
/// benches/README.md, "Collector memory at a fleet's pace").
pub const FLUSH_ZSTD_LEVEL: i32 = 1;
/// Rows per row group. DuckDB parallelises per row group and wants 100k+ rows.
pub const MAX_ROW_GROUP_ROWS: usize = 1 << 20;
/// Data pages v1: a page's null flags are compressed with its values (v2
/// stores them uncompressed, a bit a row, which in a column null in nine
/// rows of ten, as the energy counter read every 10 s, was half its bytes).
/// Both are read by every Parquet reader.
pub const WRITER_VERSION: WriterVersion = WriterVersion::PARQUET_1_0;
/// Statistics per page, so readers can skip pages by time and node.
pub const STATISTICS: EnabledStatistics = EnabledStatistics::Page;
/// Integer and timestamp columns: slowly changing, so deltas pack tightly.
pub const INTEGER_ENCODING: Encoding = Encoding::DELTA_BINARY_PACKED;
/// Floating-point columns: byte-stream split makes them compress under zstd.
pub const FLOAT_ENCODING: Encoding = Encoding::BYTE_STREAM_SPLIT;
/// Float columns written PLAIN instead: the load averages, which the kernel
/// prints with two decimals, so a few values recur and zstd finds them whole
/// (0.41-0.44 bytes a value in an hourly file against 0.63-0.68 split).
/// Measured floats with full mantissas (GPM activity, RAPL watts) compress
/// 14-20 % smaller split (the real H200's GPM readings).
pub const PLAIN_FLOAT_COLUMNS: [&str; 3] = ["load1", "load5", "load15"];
/// Integer columns with few distinct values that stay for a phase of a
/// job, written with a dictionary (falling back to [`INTEGER_ENCODING`]
/// should a chunk hold too many values): GPU utilization and copy-engine
/// utilization (0-100) and the SM clock (a handful of clocks). Chosen by
/// measurement: run-length coded dictionary indices took the simulated
/// hour's `gpu_util_pct` from 0.392 to 0.276 bytes a value (its values
/// cost less than its differences, `entropy-floor.sh`) and `sm_clock_mhz`
/// from 0.039 to 0.016, the whole hour 1.3 % smaller; the temperatures and
/// the CPU jiffies grew under a dictionary (benches/README.md, "Stored
/// size").
pub const DICTIONARY_INTEGER_COLUMNS: [&str; 3] =
    ["gpu_util_pct", "memory_copy_util_pct", "sm_clock_mhz"];
/// Boolean columns: run-length encoded bits (flags rarely change).
pub const BOOLEAN_ENCODING: Encoding = Encoding::RLE;
/// False-positive rate of the bloom filters on string key columns.
pub const BLOOM_FILTER_FPP: f64 = 0.01;
/// Distinct values a bloom filter is first sized for (the nodes of a
/// 500 000-GPU fleet, or the job ids of a row group) before it is folded
/// down to what it holds. The writer's default, 1 M, allocates and clears
/// 2 MiB per filter and row group at this rate, 8 MiB for a flush.
pub const BLOOM_FILTER_MAX_NDV: u64 = 65_536;
/// Fewest rows a compacted row group should hold (DuckDB's parallel unit):
/// compaction splits a file into equal row groups of at most
/// [`MAX_ROW_GROUP_ROWS`], so this holds whenever the hour has this many rows.
pub const MIN_COMPACTED_ROW_GROUP_ROWS: usize = 100_000;
/// Most bytes of a compacted file's data page before compression: more
/// than [`COMPACTED_PAGE_ROWS`] 8-byte values, so rows alone end a page.
pub const COMPACTED_PAGE_BYTES: usize = 16 << 20;
/// Rows in a compacted file's data page. A column's writer holds its page
/// unfinished until the page ends (dictionary indices, values, null flags:
/// up to about 1 MB a column), and compaction writes one column at a time.
/// Pages this long compress within 1 % of one page per column chunk
/// (benches/README.md, "Stored size").
pub const COMPACTED_PAGE_ROWS: usize = 1 << 17;
/// Most rows compaction sorts in memory at once: a range of nodes (of job
/// ids for the `job` table) whose rows an hour's files hold at most this
/// many of (`compact::merge`): one node's `gpu` hour at 1 Hz (8 GPUs,
/// 28 800 rows). A decoded `gpu` row with every field is about 0.5 KB, and
/// a range is held a column at a time. 2^16 took about 5 MB more at the
/// peak of a 1000-agent collector compacting an hour, for 10-15 % less of
/// compaction's CPU; 2^17, 22-38 MB more for 9 % less (benches/README.md,
/// "Collector memory at a fleet's pace" and "Capacity").
pub const MAX_MERGE_ROWS: usize = 1 << 15;
/// Most rows in one compacted file; an hour with more becomes several,
/// split between nodes. Object stores receive a file in one upload, read
/// back into memory: at 2 M rows a file is 10-20 MB, still two of DuckDB's
/// 1 M-row groups.
pub const MAX_COMPACTED_FILE_ROWS: usize = 2 << 20;

/// Why a file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("cannot sort rows for {path}: {source}")]
    Sort {
        path: String,
        #[source]
        source: ArrowError,
    },
    #[error("cannot encode {path} as Parquet: {source}")]
    Encode {
        path: String,
        #[source]
        source: ParquetError,
    },
    #[error("cannot write {path} to the store: {source}")]
    Store {
        path: String,
        #[source]
        source: object_store::Error,
    },
}

/// Writer properties of a table's files, as [`properties`] makes them: its
/// sort key and bloom filters, zstd at [`ZSTD_LEVEL`].
fn table_properties(table: Table) -> WriterProperties {
    properties(
        &table.schema(),
        table.sort_key(),
        table.bloom_filter_columns(),
    )
}

/// Writer properties of a table's flush files: the table's, zstd at
/// [`FLUSH_ZSTD_LEVEL`].
pub fn writer_properties(table: Table) -> WriterProperties {
    table_properties(table)
        .into_builder()
        .set_compression(zstd(FLUSH_ZSTD_LEVEL))
        .build()
}

fn zstd(level: i32) -> Compression {
    Compression::ZSTD(ZstdLevel::try_new(level).expect("a valid zstd level"))
}

/// Writer properties for any schema: the settings above, an encoding per
/// column type (strings keep the writer's dictionary encoding), `sort_key`
/// recorded as the files' sort order, bloom filters on `bloom_filter_columns`.
pub fn properties(
    schema: &Schema,
    sort_key: &[&str],
    bloom_filter_columns: &[&str],
) -> WriterProperties {
    let sorting = sort_key
        .iter()
        .filter_map(|name| schema.index_of(name).ok())
        .map(|idx| SortingColumn {
            column_idx: idx as i32,
            descending: false,
            nulls_first: false,
        })
        .collect();
    let mut props = WriterProperties::builder()
        .set_writer_version(WRITER_VERSION)
        .set_compression(zstd(ZSTD_LEVEL))
        .set_max_row_group_row_count(Some(MAX_ROW_GROUP_ROWS))
        .set_statistics_enabled(STATISTICS)
        .set_sorting_columns(Some(sorting))
        .set_created_by(format!("gputel-collector {}", env!("CARGO_PKG_VERSION")));
    for field in schema.fields() {
        let col = ColumnPath::from(field.name().as_str());
        let encoding = match field.data_type() {
            DataType::Int32 | DataType::Int64 | DataType::Timestamp(_, _) => INTEGER_ENCODING,
            DataType::Float32 | DataType::Float64
                if PLAIN_FLOAT_COLUMNS.contains(&field.name().as_str()) =>
            {
                Encoding::PLAIN
            }
            DataType::Float32 | DataType::Float64 => FLOAT_ENCODING,
            DataType::Boolean => BOOLEAN_ENCODING,
            _ => continue,
        };
        let dictionary = DICTIONARY_INTEGER_COLUMNS.contains(&field.name().as_str());
        props = props
            .set_column_dictionary_enabled(col.clone(), dictionary)
            .set_column_encoding(col, encoding);
    }
    for name in bloom_filter_columns {
        let col = ColumnPath::from(*name);
        props = props
            .set_column_bloom_filter_enabled(col.clone(), true)
            .set_column_bloom_filter_fpp(col.clone(), BLOOM_FILTER_FPP)
            .set_column_bloom_filter_max_ndv(col, BLOOM_FILTER_MAX_NDV);
    }
    props.build()
}

/// Rows per row group for a file of `rows` rows: equal groups of at most
/// [`MAX_ROW_GROUP_ROWS`], so no group is a small remainder.
pub fn even_row_group_rows(rows: usize) -> usize {
    let groups = rows.div_ceil(MAX_ROW_GROUP_ROWS).max(1);
    rows.div_ceil(groups).max(1)
}

/// Writer properties of a compacted file of `rows` rows: the table's, with
/// equal row groups and data pages of [`COMPACTED_PAGE_ROWS`].
///
/// A page starts a fresh delta block and a fresh zstd frame, so the
/// writer's default of 20 000 rows a page cut each compressor's view of an
/// hour into slices; long pages make the hour 3 % smaller
/// (benches/README.md, "Stored size"). Compacted files are pruned by row
/// group (node and time are sorted, so each group spans few nodes) and read
/// a column chunk at a time, so the finer page index bought little.
pub fn compacted_properties(table: Table, rows: usize) -> WriterProperties {
    let group_rows = even_row_group_rows(rows);
    table_properties(table)
        .into_builder()
        .set_max_row_group_row_count(Some(group_rows))
        .set_data_page_row_count_limit(group_rows.min(COMPACTED_PAGE_ROWS))
        .set_data_page_size_limit(COMPACTED_PAGE_BYTES)
        .build()
}

/// Sorts a table's rows by its sort key.
pub fn sort_rows(table: Table, batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    take_record_batch(batch, &sort_indices(table, batch)?)
}

/// The order of a table's rows by its sort key, as indices into `batch`
/// (rows with equal keys in batch order).
fn sort_indices(table: Table, batch: &RecordBatch) -> Result<UInt32Array, ArrowError> {
    sort_indices_by(table, |i| Arc::clone(batch.column(i)))
}

/// The order of a table's rows by its sort key, its key columns given by
/// `column` (by index in the table's schema).
fn sort_indices_by(
    table: Table,
    mut column: impl FnMut(usize) -> ArrayRef,
) -> Result<UInt32Array, ArrowError> {
    let schema = table.schema();
    let keys = table
        .sort_key()
        .iter()
        .map(|name| Ok(column(schema.index_of(name)?)))
        .collect::<Result<Vec<_>, ArrowError>>()?;
    crate::sort::sorted_indices(&keys)
}

/// Rows taken at a time while a file is encoded in sorted order.
pub(crate) const ENCODE_SLICE_ROWS: usize = 8192;

/// Writes `batch`'s rows in the order of `indices` through parquet's
/// `ArrowWriter`, taking [`ENCODE_SLICE_ROWS`] at a time: the file that
/// [`encode_in_order`] and compaction's writer make a column at a time,
/// which the tests compare them with.
#[cfg(test)]
pub(crate) fn write_in_order<W: std::io::Write + Send, E>(
    writer: &mut ArrowWriter<W>,
    batch: &RecordBatch,
    indices: &UInt32Array,
    take_error: impl Fn(ArrowError) -> E,
    write_error: impl Fn(ParquetError) -> E,
) -> Result<(), E> {
    let mut start = 0;
    while start < indices.len() {
        let len = ENCODE_SLICE_ROWS.min(indices.len() - start);
        let rows = take_record_batch(batch, &indices.slice(start, len)).map_err(&take_error)?;
        writer.write(&rows).map_err(&write_error)?;
        start += len;
    }
    Ok(())
}

/// Sorts a flush's rows by the table's sort key and encodes them as one
/// Parquet file, a column at a time (see `encode_in_order`): each column
/// becomes an Arrow array when its turn comes, and is freed once encoded.
/// `name` is the file's path, for errors.
pub fn sort_and_encode(
    table: Table,
    rows: &mut dyn Columns,
    name: &str,
) -> Result<Bytes, PersistError> {
    let sort_error = |source| PersistError::Sort {
        path: name.to_owned(),
        source,
    };
    let encode_error = |source| PersistError::Encode {
        path: name.to_owned(),
        source,
    };
    let schema = table.schema();
    let mut columns = FileColumns::new(rows, schema.fields().len());
    let indices = sort_indices_by(table, |i| columns.get(i)).map_err(sort_error)?;
    encode_in_order(
        writer_properties(table),
        &schema,
        &mut columns,
        &indices,
        sort_error,
        encode_error,
    )
}

/// A file's columns as its encoding takes them: each made an array the
/// first time it is asked for (the sort key's, to sort by, before the
/// others), and held until [`FileColumns::release`].
pub(crate) struct FileColumns<'a> {
    rows: &'a mut dyn Columns,
    held: Vec<Option<ArrayRef>>,
    nulls: SharedNulls,
}

impl<'a> FileColumns<'a> {
    pub(crate) fn new(rows: &'a mut dyn Columns, columns: usize) -> Self {
        Self {
            rows,
            held: vec![None; columns],
            nulls: SharedNulls::default(),
        }
    }

    fn num_rows(&self) -> usize {
        self.rows.num_rows()
    }

    fn get(&mut self, index: usize) -> ArrayRef {
        let Self { rows, held, nulls } = self;
        Arc::clone(held[index].get_or_insert_with(|| rows.take_column(index, nulls)))
    }

    /// Lets column `index` go: freed, unless another column shares it (an
    /// all-null one).
    fn release(&mut self, index: usize) {
        self.held[index] = None;
    }
}

/// Encodes `columns`' rows in the order of `indices` as one Parquet file
/// of `schema`: the file parquet's [`ArrowWriter`] makes of the rows in
/// that order when its row groups are whole slices (a flush's one group)
/// and its properties leave the columns without a value uncompressed (see
/// below), byte for byte, but made a column at a time. Each column's rows are
/// reordered [`ENCODE_SLICE_ROWS`] at a time into that column's writer,
/// whose chunk then goes into the row group before the next column's
/// writer is made. So one column's pages, compressor and encoder state are
/// held at a time, where the `ArrowWriter` holds every column's until the
/// group ends (a flush of 40 000 GPU rows: 6 MB against 14 MB above the
/// rows, benches/README.md), and the reordered rows are never held whole.
/// Row groups are cut by row count only: `props` sets no byte limit and no
/// content-defined chunking.
///
/// Each column is let go once its last group is encoded, so what a file
/// holds is its sort key, its rows still packed and the one column being
/// encoded: the memory a column frees is what the next one is made in.
///
/// A column without a value in the file (a field the agents do not send)
/// is written uncompressed: its pages are a few bytes of levels, which
/// zstd would only wrap in a larger frame, and its writer then makes no
/// zstd contexts (parquet's codec makes a compressor and a decompressor
/// for every column chunk, and each asks the CPU for its features, which
/// traps to the hypervisor on a virtual machine).
pub(crate) fn encode_in_order<E>(
    props: WriterProperties,
    schema: &SchemaRef,
    columns: &mut FileColumns<'_>,
    indices: &UInt32Array,
    take_error: impl Fn(ArrowError) -> E,
    write_error: impl Fn(ParquetError) -> E,
) -> Result<Bytes, E> {
    debug_assert!(
        props.max_row_group_bytes().is_none() && props.content_defined_chunking().is_none(),
        "row groups cut by size are the ArrowWriter's"
    );
    let group_rows = props.max_row_group_row_count().unwrap_or(usize::MAX).max(1);
    let (mut file, _) = in_memory_writer(Arc::clone(schema), props, columns.num_rows())
        .and_then(ArrowWriter::into_serialized_writer)
        .map_err(&write_error)?;
    let props = Arc::clone(file.properties());
    let mut uncompressed: Option<WriterPropertiesPtr> = None;
    let mut nulls = SharedNulls::default();
    let mut group_start = 0;
    while group_start < indices.len() {
        let group = indices.slice(group_start, group_rows.min(indices.len() - group_start));
        let last_group = group_start + group.len() == indices.len();
        let group_index = file.flushed_row_groups().len();
        let mut row_group = file.next_row_group().map_err(&write_error)?;
        for (index, field) in schema.fields().iter().enumerate() {
            let column = columns.get(index);
            let chunk_props = if column.null_count() == column.len() {
                uncompressed.get_or_insert_with(|| {
                    let props = props.as_ref().clone().into_builder();
                    Arc::new(props.set_compression(Compression::UNCOMPRESSED).build())
                })
            } else {
                &props
            };
            let mut chunk =
                ColumnChunkWriter::new(field, chunk_props, group_index).map_err(&write_error)?;
            let mut start = 0;
            while start < group.len() {
                let len = ENCODE_SLICE_ROWS.min(group.len() - start);
                let rows =
                    rows_at(&column, &group.slice(start, len), &mut nulls).map_err(&take_error)?;
                chunk.write(&rows).map_err(&write_error)?;
                start += len;
            }
            chunk.close_into(&mut row_group).map_err(&write_error)?;
            if last_group {
                drop(column);
                columns.release(index);
            }
        }
        row_group.close().map_err(&write_error)?;
        group_start += group.len();
    }
    file.into_inner().map(Bytes::from).map_err(&write_error)
}

/// `column`'s rows at `indices`; a column that holds no value gives the
/// all-null array of `nulls` for that many rows, rather than being taken
/// row by row.
pub(crate) fn rows_at(
    column: &ArrayRef,
    indices: &UInt32Array,
    nulls: &mut SharedNulls,
) -> Result<ArrayRef, ArrowError> {
    if column.null_count() == column.len() {
        Ok(nulls.of(column.data_type(), indices.len()))
    } else {
        take(column.as_ref(), indices, None)
    }
}

/// One column's chunk of a row group being encoded on its own: its writers
/// (one per leaf) are made from a schema of that column alone, since
/// parquet makes a row group's writers all at once, each with its
/// compressor.
pub(crate) struct ColumnChunkWriter {
    field: FieldRef,
    writers: Vec<ArrowColumnWriter>,
}

impl ColumnChunkWriter {
    /// The writers of `field`'s chunk in row group `row_group` of a file
    /// with `props`.
    pub(crate) fn new(
        field: &FieldRef,
        props: &WriterPropertiesPtr,
        row_group: usize,
    ) -> Result<Self, ParquetError> {
        let schema = Arc::new(Schema::new(vec![Arc::clone(field)]));
        let descr = ArrowSchemaConverter::new()
            .with_coerce_types(props.coerce_types())
            .convert(&schema)?;
        let file =
            SerializedFileWriter::new(std::io::sink(), descr.root_schema_ptr(), Arc::clone(props))?;
        let writers =
            ArrowRowGroupWriterFactory::new(&file, schema).create_column_writers(row_group)?;
        Ok(Self {
            field: Arc::clone(field),
            writers,
        })
    }

    /// Encodes the next of the chunk's rows.
    pub(crate) fn write(&mut self, rows: &ArrayRef) -> Result<(), ParquetError> {
        let leaves = compute_leaves(&self.field, rows)?;
        debug_assert_eq!(leaves.len(), self.writers.len(), "a writer per leaf");
        for (writer, leaf) in self.writers.iter_mut().zip(&leaves) {
            writer.write(leaf)?;
        }
        Ok(())
    }

    /// Closes the chunk into `row_group`, whose next column it is.
    pub(crate) fn close_into<W: std::io::Write + Send>(
        self,
        row_group: &mut SerializedRowGroupWriter<'_, W>,
    ) -> Result<(), ParquetError> {
        for writer in self.writers {
            writer.close()?.append_to_row_group(row_group)?;
        }
        Ok(())
    }
}

/// Room a file's buffer starts with per row: more than a flush file takes
/// compressed (about 30 bytes a GPU row with every field); room not
/// written to is not resident.
const FILE_ROOM_BYTES_PER_ROW: usize = 64;

/// A Parquet writer into memory for `rows` rows, its buffer sized for them.
fn in_memory_writer(
    schema: Arc<Schema>,
    props: WriterProperties,
    rows: usize,
) -> Result<ArrowWriter<Vec<u8>>, ParquetError> {
    let buf = Vec::with_capacity(rows * FILE_ROOM_BYTES_PER_ROW + 4096);
    ArrowWriter::try_new(buf, schema, Some(props))
}

/// The complete file: the writer's pages and its footer.
fn finish(writer: ArrowWriter<Vec<u8>>) -> Result<Bytes, ParquetError> {
    writer.into_inner().map(Bytes::from)
}

/// Encodes one record batch (already sorted) as a complete Parquet file.
pub fn encode(
    table: Table,
    schema: Arc<Schema>,
    batch: &RecordBatch,
) -> Result<Bytes, ParquetError> {
    encode_with(schema, writer_properties(table), batch)
}

/// Encodes one record batch as a complete Parquet file with `props`.
pub fn encode_with(
    schema: Arc<Schema>,
    props: WriterProperties,
    batch: &RecordBatch,
) -> Result<Bytes, ParquetError> {
    let mut writer = in_memory_writer(schema, props, batch.num_rows())?;
    writer.write(batch)?;
    finish(writer)
}

/// Sorts, encodes and stores one file: [`encode_file`], then [`store_file`].
pub async fn write_file(
    store: &Store,
    path: &PartitionPath,
    batch: RecordBatch,
) -> Result<u64, PersistError> {
    let bytes = encode_file(path, Box::new(BatchColumns::from(batch))).await?;
    store_file(store, path, bytes).await
}

/// Sorts and encodes one flush file off the runtime, making its columns
/// and freeing them one at a time (see [`encode_in_order`]).
pub async fn encode_file(
    path: &PartitionPath,
    mut rows: Box<dyn Columns>,
) -> Result<Bytes, PersistError> {
    let table = path.table();
    let name = path.to_string();
    off_runtime(move || sort_and_encode(table, rows.as_mut(), &name)).await
}

/// Stores one encoded file. The object store makes the file visible
/// atomically: a local store writes a staging file and renames it, S3
/// publishes an object only when its upload completes.
///
/// A file whose very bytes a compaction already merged (a flush retried or
/// replayed after it) is not written again, since its rows would then be
/// stored twice; 0 bytes are reported for it. The check and the put hold a
/// local store's lock together, so no compaction swaps the hour between them.
pub async fn store_file(
    store: &Store,
    path: &PartitionPath,
    bytes: Bytes,
) -> Result<u64, PersistError> {
    let name = path.to_string();
    let _lock = store.write_lock().await.map_err(|e| PersistError::Store {
        path: name.clone(),
        source: object_store::Error::Generic {
            store: "LocalFileSystem",
            source: format!("cannot lock the store to write {name}: {e}").into(),
        },
    })?;
    if marker::already_compacted(store.objects.as_ref(), path, &bytes)
        .await
        .map_err(|source| PersistError::Store {
            path: name.clone(),
            source,
        })?
    {
        return Ok(0);
    }
    put_file(store.objects.as_ref(), name, bytes).await
}

/// Runs CPU-bound work (sorting, Parquet encoding and decoding) on tokio's
/// blocking threads, so the tasks that serve agents and pet the watchdog
/// keep their worker threads meanwhile. A panic in `work` resumes here.
pub async fn off_runtime<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(value) => value,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => panic!("blocking work cancelled at shutdown: {e}"),
        },
    }
}

/// Stores one encoded file under `path` (relative to the store's root),
/// replacing any earlier file of that name; returns its size.
pub async fn put_file(
    store: &dyn ObjectStore,
    path: String,
    bytes: Bytes,
) -> Result<u64, PersistError> {
    let len = bytes.len() as u64;
    store
        .put(&Path::from(path.as_str()), PutPayload::from(bytes))
        .await
        .map_err(|source| PersistError::Store { path, source })?;
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::builder::StringDictionaryBuilder;
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int32Type, TimestampMicrosecondType};
    use arrow_array::{ArrayRef, Int32Array, TimestampMicrosecondArray, new_null_array};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    /// Flush files at level 1, the compacted files that stay at level 3,
    /// with the table's other settings alike.
    #[test]
    fn flush_files_are_compressed_lighter_than_compacted_ones() {
        let col = ColumnPath::from("power_mw");
        let flush = writer_properties(Table::Gpu);
        let compacted = compacted_properties(Table::Gpu, 10);
        assert_eq!(flush.compression(&col), zstd(1));
        assert_eq!(compacted.compression(&col), zstd(3));
        assert_eq!(flush.encoding(&col), compacted.encoding(&col));
        assert_eq!(flush.sorting_columns(), compacted.sorting_columns());
        assert_eq!(compacted.max_row_group_row_count(), Some(10));
    }

    /// GPU rows in the order an ingest buffer holds them (tick by tick, the
    /// nodes interleaved), with utilization telling the rows apart.
    fn unsorted_gpu_rows(nodes: i32, gpus: i32, seconds: i64) -> RecordBatch {
        let mut rows = Vec::new();
        for s in 0..seconds {
            for node in (0..nodes).rev() {
                for gpu in 0..gpus {
                    rows.push((node, gpu, s));
                }
            }
        }
        let n = rows.len();
        let mut nodes = StringDictionaryBuilder::<Int32Type>::new();
        let mut uuids = StringDictionaryBuilder::<Int32Type>::new();
        for r in &rows {
            nodes.append_value(format!("node-{:03}", r.0));
            uuids.append_value(format!("GPU-{}-{}", r.0, r.1));
        }
        let (nodes, uuids): (ArrayRef, ArrayRef) =
            (Arc::new(nodes.finish()), Arc::new(uuids.finish()));
        let schema = Table::Gpu.schema();
        let columns = schema
            .fields()
            .iter()
            .map(|f| match f.name().as_str() {
                "ts" => Arc::new(
                    TimestampMicrosecondArray::from_iter_values(
                        rows.iter().map(|r| 1_700_000_000_000_000 + r.2 * 1_000_000),
                    )
                    .with_timezone("UTC"),
                ) as ArrayRef,
                "node" => Arc::clone(&nodes),
                "uuid" | "model" => Arc::clone(&uuids),
                "gpu" => Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.1))),
                "gpu_util_pct" => Arc::new(Int32Array::from_iter_values(
                    rows.iter().map(|r| (r.0 * 7 + r.1 * 3 + r.2 as i32) % 101),
                )),
                _ if !f.is_nullable() => Arc::new(Int32Array::from(vec![0; n])),
                _ => new_null_array(f.data_type(), n),
            })
            .collect();
        RecordBatch::try_new(schema, columns).expect("gpu rows")
    }

    #[test]
    fn a_flush_encoded_by_slices_is_the_file_of_its_sorted_rows() {
        // 24 000 rows: two whole slices and a partial one.
        let batch = unsorted_gpu_rows(25, 8, 120);
        assert!(batch.num_rows() > 2 * ENCODE_SLICE_ROWS);
        let by_slices = encode_batch(Table::Gpu, &batch, "gpu/x.parquet").expect("encode");
        let sorted = sort_rows(Table::Gpu, &batch).expect("sort");
        let whole = encode(Table::Gpu, Table::Gpu.schema(), &sorted).expect("encode");
        let read_back = |bytes: Bytes| {
            let footer = ParquetRecordBatchReaderBuilder::try_new(bytes.clone()).expect("footer");
            assert_eq!(footer.metadata().num_row_groups(), 1);
            read_rows(bytes)
        };
        let read = read_back(by_slices);
        // The same rows as sorting and encoding the whole flush at once
        // (not byte for byte: the writer saw other batch boundaries).
        assert!(
            read == read_back(whole),
            "rows differ from the whole-batch encoding"
        );
        assert_eq!(read.num_rows(), batch.num_rows());
        // Node by node, GPU by GPU, in time order: the first rows are
        // node-000's GPU 0, then its GPU 1 from its first tick.
        let column = |name: &str| read.column_by_name(name).expect("column");
        let ts = column("ts").as_primitive::<TimestampMicrosecondType>();
        let gpu = column("gpu").as_primitive::<Int32Type>();
        let util = column("gpu_util_pct").as_primitive::<Int32Type>();
        assert_eq!(ts.value(119) - ts.value(0), 119_000_000);
        assert_eq!((gpu.value(119), gpu.value(120)), (0, 1));
        assert_eq!(ts.value(120), ts.value(0));
        assert_eq!((util.value(0), util.value(1), util.value(120)), (0, 1, 3));
    }

    /// A flush's rows as the write buffer assembles them: several nodes out
    /// of order, GPU rows with jobs, pods and their labels on some and
    /// floats, nulls and strings of every kind, node and port rows.
    fn buffered_rows(nodes: u32, ticks: i64) -> Vec<(Table, RecordBatch)> {
        use std::collections::BTreeMap;

        use gputel_proto::{Batch, GpuSample, IbPortSample, NodeSample};

        use crate::buffer::WriteBuffer;
        use crate::validate::validate_batch;

        let start_us = 1_795_172_400_000_000; // 2026-11-20T11:00:00Z
        let mut buffer = WriteBuffer::default();
        for t in 0..ticks {
            let ts_us = start_us + t * 1_000_000;
            for node in (0..nodes).rev() {
                let k = t as u32 * 31 + node * 7;
                let batch = Batch {
                    seq: t as u64 + 1,
                    gpu: (0..8)
                        .map(|gpu| GpuSample {
                            ts_us,
                            gpu,
                            uuid: format!("GPU-{node}-{gpu}"),
                            model: "NVIDIA H100 80GB HBM3".into(),
                            temperature_c: Some(30 + (k + gpu) % 50),
                            power_mw: (!k.is_multiple_of(5))
                                .then_some(70_000 + (k * gpu) % 600_000),
                            energy_mj: Some(u64::from(k) * 1000 + u64::from(gpu)),
                            gpu_util_pct: Some((k + gpu) % 101),
                            sm_active_pct: (gpu % 2 == 0).then_some((k % 1000) as f32 / 10.0),
                            fb_used_bytes: Some(u64::from(k % 80) << 30),
                            job_id: (node % 3 != 0).then(|| format!("{}", 1000 + node % 4)),
                            pod_namespace: (node % 3 == 0).then(|| "train".to_owned()),
                            pod_name: (node % 3 == 0).then(|| format!("llm-{node}")),
                            pod_labels: if node % 3 == 0 && gpu < 4 {
                                BTreeMap::from([
                                    ("team".to_owned(), format!("t{}", node % 2)),
                                    ("app".to_owned(), "llm".to_owned()),
                                ])
                            } else {
                                BTreeMap::new()
                            },
                            ..Default::default()
                        })
                        .collect(),
                    node: vec![NodeSample {
                        ts_us,
                        cpu_count: 224,
                        memory_total_kib: Some(2_113_000_000),
                        memory_available_kib: Some(1_900_000_000 - u64::from(k) * 17),
                        load1: Some((k % 300) as f32 / 10.0),
                        jobs: vec![format!("{}", 1000 + node % 4)],
                        ..Default::default()
                    }],
                    ib: (1..=4)
                        .map(|port| IbPortSample {
                            ts_us,
                            device: format!("mlx5_{port}"),
                            port: 1,
                            state: if k.is_multiple_of(97) {
                                "DOWN"
                            } else {
                                "ACTIVE"
                            }
                            .into(),
                            rate_gbps: Some(400.0),
                            xmit_bytes: (port != 4).then_some(u64::from(k) << 20),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                };
                let valid = validate_batch(&batch, ts_us).expect("valid batch");
                buffer.append(&format!("node-{node:02}"), valid);
            }
        }
        buffer
            .take_batches()
            .expect("assembled")
            .into_iter()
            .map(|(table, _, batch)| (table, batch))
            .collect()
    }

    /// [`sort_and_encode`] of a record batch's rows.
    fn encode_batch(table: Table, batch: &RecordBatch, name: &str) -> Result<Bytes, PersistError> {
        sort_and_encode(table, &mut BatchColumns::from(batch.clone()), name)
    }

    /// [`encode_in_order`] of a record batch's rows.
    fn encode_batch_in_order(
        props: WriterProperties,
        batch: &RecordBatch,
        indices: &UInt32Array,
    ) -> Result<Bytes, ParquetError> {
        let mut rows = BatchColumns::from(batch.clone());
        let mut columns = FileColumns::new(&mut rows, batch.num_columns());
        encode_in_order(
            props,
            &batch.schema(),
            &mut columns,
            indices,
            ParquetError::from,
            |e| e,
        )
    }

    /// Every row of a Parquet file, in one batch.
    fn read_rows(bytes: Bytes) -> RecordBatch {
        let batches: Vec<RecordBatch> = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .expect("footer")
            .build()
            .expect("reader")
            .collect::<Result<_, _>>()
            .expect("rows");
        arrow_select::concat::concat_batches(&batches[0].schema(), &batches).expect("concat")
    }

    /// The file `ArrowWriter` makes of `batch`'s rows in the order of
    /// `indices`, a slice of rows at a time: the reference for
    /// [`encode_in_order`].
    fn written_in_order(
        props: WriterProperties,
        batch: &RecordBatch,
        indices: &UInt32Array,
    ) -> Bytes {
        let props = empty_columns_uncompressed(props, batch);
        let mut writer = in_memory_writer(batch.schema(), props, batch.num_rows()).expect("writer");
        write_in_order(&mut writer, batch, indices, ParquetError::from, |e| e).expect("write");
        finish(writer).expect("finish")
    }

    /// `props` with every leaf of a column of `batch` that holds no value
    /// uncompressed, as [`encode_in_order`] writes them.
    fn empty_columns_uncompressed(
        props: WriterProperties,
        batch: &RecordBatch,
    ) -> WriterProperties {
        let descr = ArrowSchemaConverter::new()
            .convert(&batch.schema())
            .expect("schema");
        let mut props = props.into_builder();
        for leaf in 0..descr.num_columns() {
            let column = batch.column(descr.get_column_root_idx(leaf));
            if column.null_count() == column.len() {
                let path = descr.column(leaf).path().clone();
                props = props.set_column_compression(path, Compression::UNCOMPRESSED);
            }
        }
        props.build()
    }

    #[test]
    fn a_flush_encoded_a_column_at_a_time_is_the_arrow_writers_file_byte_for_byte() {
        // 30 ticks of 120 nodes: 28 800 GPU rows, three whole slices and a
        // part of one; 14 400 port rows.
        let tables = buffered_rows(120, 30);
        assert!(
            tables
                .iter()
                .any(|(t, b)| *t == Table::Gpu && b.num_rows() == 28_800)
        );
        assert!(
            tables
                .iter()
                .any(|(t, b)| *t == Table::Ib && b.num_rows() > ENCODE_SLICE_ROWS)
        );
        for (table, batch) in &tables {
            let indices = sort_indices(*table, batch).expect("sort");
            let reference = written_in_order(writer_properties(*table), batch, &indices);
            let encoded = encode_batch(*table, batch, "x.parquet").expect("encode");
            assert!(
                encoded == reference,
                "{table}: {} bytes against the ArrowWriter's {}",
                encoded.len(),
                reference.len()
            );
        }
        // What was encoded is every row, sorted, labels and lists included.
        let (_, gpu) = tables
            .iter()
            .find(|(t, _)| *t == Table::Gpu)
            .expect("gpu rows");
        // A column without a value is stored uncompressed, one with values
        // with zstd.
        let footer = parquet::file::metadata::ParquetMetaDataReader::new()
            .parse_and_finish(&encode_batch(Table::Gpu, gpu, "gpu.parquet").expect("encode"))
            .expect("footer");
        let codec = |name: &str| {
            let group = footer.row_group(0);
            let chunk = group
                .columns()
                .iter()
                .find(|c| c.column_path().string() == name);
            chunk.expect(name).compression()
        };
        let schema = gpu.schema();
        let (empty, full): (Vec<_>, Vec<_>) = schema
            .fields()
            .iter()
            .zip(gpu.columns())
            .filter(|(f, _)| !f.data_type().is_nested())
            .partition(|(_, c)| c.null_count() == c.len());
        assert!(
            !empty.is_empty(),
            "the simulated rows leave some fields out"
        );
        for (field, _) in empty {
            assert_eq!(
                codec(field.name()),
                Compression::UNCOMPRESSED,
                "{}",
                field.name()
            );
        }
        for (field, _) in full {
            assert_eq!(
                codec(field.name()),
                zstd(FLUSH_ZSTD_LEVEL),
                "{}",
                field.name()
            );
        }
        let sorted = sort_rows(Table::Gpu, gpu).expect("sort");
        let read = read_rows(encode_batch(Table::Gpu, gpu, "gpu.parquet").expect("encode"));
        assert_eq!(read.num_rows(), 28_800);
        for name in [
            "node",
            "gpu",
            "ts",
            "power_mw",
            "sm_active_pct",
            "job_id",
            "pod_labels",
        ] {
            let (a, b) = (
                read.column_by_name(name).expect(name),
                sorted.column_by_name(name).expect(name),
            );
            assert!(b.null_count() < b.len(), "column {name} has values");
            assert_eq!(a.as_ref(), b.as_ref(), "column {name}");
        }
    }

    #[test]
    fn rows_beyond_a_row_group_go_to_the_next_one() {
        let tables = buffered_rows(40, 60);
        let (_, gpu) = tables
            .into_iter()
            .find(|(t, _)| *t == Table::Gpu)
            .expect("gpu rows");
        assert_eq!(gpu.num_rows(), 19_200);
        let props = || {
            writer_properties(Table::Gpu)
                .into_builder()
                .set_max_row_group_row_count(Some(10_000))
                .build()
        };
        let indices = sort_indices(Table::Gpu, &gpu).expect("sort");
        let bytes = encode_batch_in_order(props(), &gpu, &indices).expect("encode");
        let groups: Vec<i64> = parquet::file::metadata::ParquetMetaDataReader::new()
            .parse_and_finish(&bytes)
            .expect("footer")
            .row_groups()
            .iter()
            .map(|g| g.num_rows())
            .collect();
        assert_eq!(groups, [10_000, 9_200]);
        // The rows the ArrowWriter's file holds (its pages may be cut
        // elsewhere, as it splits its slices at the group's end).
        let read = read_rows(bytes);
        let reference = read_rows(written_in_order(props(), &gpu, &indices));
        assert!(read == reference, "rows differ from the ArrowWriter's");
    }

    #[test]
    fn no_rows_make_the_arrow_writers_empty_file() {
        let batch = RecordBatch::new_empty(Table::Gpu.schema());
        let indices = UInt32Array::from(Vec::<u32>::new());
        let props = || writer_properties(Table::Gpu);
        let encoded = encode_batch_in_order(props(), &batch, &indices).expect("encode");
        assert!(encoded == written_in_order(props(), &batch, &indices));
        let reader = ParquetRecordBatchReaderBuilder::try_new(encoded).expect("footer");
        assert_eq!(reader.metadata().file_metadata().num_rows(), 0);
    }

    /// Data pages of the `gpu_util_pct` chunk of each row group (rows, page
    /// type), after the dictionary page the column starts with.
    fn util_pages(bytes: &Bytes) -> Vec<Vec<(usize, parquet::basic::PageType)>> {
        use parquet::basic::PageType;
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let reader = SerializedFileReader::new(Bytes::clone(bytes)).expect("footer");
        let schema = Table::Gpu.schema();
        let idx = schema.index_of("gpu_util_pct").expect("column");
        (0..reader.num_row_groups())
            .map(|g| {
                let group = reader.get_row_group(g).expect("row group");
                group
                    .get_column_page_reader(idx)
                    .expect("pages")
                    .map(|page| {
                        let page = page.expect("page");
                        (page.num_values() as usize, page.page_type())
                    })
                    .skip_while(|(_, kind)| *kind == PageType::DICTIONARY_PAGE)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn compacted_pages_are_long_v1_pages_and_a_flush_has_short_ones() {
        use parquet::basic::PageType;
        let sorted = sort_rows(Table::Gpu, &unsorted_gpu_rows(150, 8, 120)).expect("sort");
        let rows = sorted.num_rows();
        assert_eq!(rows, 144_000);
        let compacted = encode_with(
            Table::Gpu.schema(),
            compacted_properties(Table::Gpu, rows),
            &sorted,
        )
        .expect("encode");
        assert_eq!(
            util_pages(&compacted),
            [[
                (COMPACTED_PAGE_ROWS, PageType::DATA_PAGE),
                (rows - COMPACTED_PAGE_ROWS, PageType::DATA_PAGE)
            ]]
        );
        // The flush writer keeps the default page size: 20 000 rows.
        let flush = encode(Table::Gpu, Table::Gpu.schema(), &sorted).expect("encode");
        let mut pages = vec![(20_000, PageType::DATA_PAGE); 7];
        pages.push((rows - 140_000, PageType::DATA_PAGE));
        assert_eq!(util_pages(&flush), [pages]);
    }
}
