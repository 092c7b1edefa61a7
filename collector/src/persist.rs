//! The persister: turns record batches into Parquet files in the object store.
//! Every writer setting lives here, once.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_ord::sort::{SortColumn, lexsort_to_indices};
use arrow_schema::{ArrowError, DataType, Schema};
use arrow_select::take::take_record_batch;
use bytes::Bytes;
use gputel_schemas::{PartitionPath, Table};

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::metadata::SortingColumn;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::schema::types::ColumnPath;

use crate::marker;
use crate::store::Store;

/// zstd level 3: most of zstd's ratio on telemetry at a small CPU cost.
pub const ZSTD_LEVEL: i32 = 3;
/// Rows per row group. DuckDB parallelises per row group and wants 100k+ rows.
pub const MAX_ROW_GROUP_ROWS: usize = 1 << 20;
/// Statistics per page, so readers can skip pages by time and node.
pub const STATISTICS: EnabledStatistics = EnabledStatistics::Page;
/// Integer and timestamp columns: slowly changing, so deltas pack tightly.
pub const INTEGER_ENCODING: Encoding = Encoding::DELTA_BINARY_PACKED;
/// Floating-point columns: byte-stream split makes them compress under zstd.
pub const FLOAT_ENCODING: Encoding = Encoding::BYTE_STREAM_SPLIT;
/// Boolean columns: run-length encoded bits (flags rarely change).
pub const BOOLEAN_ENCODING: Encoding = Encoding::RLE;
/// False-positive rate of the bloom filters on string key columns.
pub const BLOOM_FILTER_FPP: f64 = 0.01;
/// Fewest rows a compacted row group should hold (DuckDB's parallel unit):
/// compaction splits a file into equal row groups of at most
/// [`MAX_ROW_GROUP_ROWS`], so this holds whenever the hour has this many rows.
pub const MIN_COMPACTED_ROW_GROUP_ROWS: usize = 100_000;
/// Most rows in one compacted file, which compaction sorts in memory; an
/// hour with more becomes several files.
pub const MAX_COMPACTED_FILE_ROWS: usize = 8 << 20;

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

/// Writer properties for a table: encodings chosen per column type.
pub fn writer_properties(table: Table) -> WriterProperties {
    properties(
        &table.schema(),
        table.sort_key(),
        table.bloom_filter_columns(),
    )
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
        .set_writer_version(WriterVersion::PARQUET_2_0)
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(ZSTD_LEVEL).expect("ZSTD_LEVEL is a valid zstd level"),
        ))
        .set_max_row_group_row_count(Some(MAX_ROW_GROUP_ROWS))
        .set_statistics_enabled(STATISTICS)
        .set_sorting_columns(Some(sorting))
        .set_created_by(format!("gputel-collector {}", env!("CARGO_PKG_VERSION")));
    for field in schema.fields() {
        let col = ColumnPath::from(field.name().as_str());
        let encoding = match field.data_type() {
            DataType::Int32 | DataType::Int64 | DataType::Timestamp(_, _) => INTEGER_ENCODING,
            DataType::Float32 | DataType::Float64 => FLOAT_ENCODING,
            DataType::Boolean => BOOLEAN_ENCODING,
            _ => continue,
        };
        props = props
            .set_column_dictionary_enabled(col.clone(), false)
            .set_column_encoding(col, encoding);
    }
    for name in bloom_filter_columns {
        let col = ColumnPath::from(*name);
        props = props
            .set_column_bloom_filter_enabled(col.clone(), true)
            .set_column_bloom_filter_fpp(col, BLOOM_FILTER_FPP);
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
/// equal row groups.
pub fn compacted_properties(table: Table, rows: usize) -> WriterProperties {
    writer_properties(table)
        .into_builder()
        .set_max_row_group_row_count(Some(even_row_group_rows(rows)))
        .build()
}

/// Sorts a table's rows by its sort key.
pub fn sort_rows(table: Table, batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    let columns = table
        .sort_key()
        .iter()
        .map(|name| {
            Ok(SortColumn {
                values: Arc::clone(batch.column(batch.schema().index_of(name)?)),
                options: None,
            })
        })
        .collect::<Result<Vec<_>, ArrowError>>()?;
    let indices = lexsort_to_indices(&columns, None)?;
    take_record_batch(batch, &indices)
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
    let mut buf = Vec::with_capacity(batch.get_array_memory_size() / 4 + 4096);
    let mut writer = ArrowWriter::try_new(&mut buf, schema, Some(props))?;
    writer.write(batch)?;
    writer.close()?;
    Ok(Bytes::from(buf))
}

/// Sorts, encodes and stores one file. The object store makes the file
/// visible atomically: a local store writes a staging file and renames it, S3
/// publishes an object only when its upload completes.
///
/// A file whose very bytes a compaction already merged (a flush retried or
/// replayed after it) is not written again, since its rows would then be
/// stored twice; 0 bytes are reported for it. The check and the put hold a
/// local store's lock together, so no compaction swaps the hour between them.
pub async fn write_file(
    store: &Store,
    path: &PartitionPath,
    batch: &RecordBatch,
) -> Result<u64, PersistError> {
    let table = path.table();
    let name = path.to_string();
    let batch = batch.clone();
    let bytes = off_runtime({
        let name = name.clone();
        move || {
            let sorted = sort_rows(table, &batch).map_err(|source| PersistError::Sort {
                path: name.clone(),
                source,
            })?;
            encode(table, table.schema(), &sorted)
                .map_err(|source| PersistError::Encode { path: name, source })
        }
    })
    .await?;
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
