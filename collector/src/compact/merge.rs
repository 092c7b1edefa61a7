//! Reading the files of an hour and merging them into sorted files, a
//! bounded number of rows at a time.
//!
//! An hour is merged in [`Buckets`]: ranges of nodes (of job ids for the
//! `job` table) that hold at most [`CompactOptions::merge_rows`] of its rows.
//! A first reading of every file counts its rows per node ([`census`]); a
//! second sends each row to its bucket ([`Spill`]): kept in memory when the
//! hour is one bucket, else appended to the bucket's spill file. Then bucket
//! after bucket, in order, the rows are sorted, kept once per row key and
//! appended to the compacted files ([`Outputs`]), whose row groups are
//! spilled a column at a time and encoded a column at a time
//! ([`ColumnarFile`]). Each file is sorted by the table's sort key from its
//! first row to its last, every GPU's hour in one run, and compaction holds
//! one bucket's rows and one column's writer, whatever the size of the hour
//! or the fleet.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::sync::Arc;

use arrow_array::builder::{Int32Builder, StringBuilder, StringDictionaryBuilder};
use arrow_array::cast::AsArray;
use arrow_array::types::Int32Type;
use arrow_array::{Array, ArrayRef, DictionaryArray, UInt32Array};
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::{
    DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions, write_message,
};
use arrow_ord::ord::{DynComparator, make_comparator};
use arrow_schema::{DataType, Field, Schema, SchemaRef, SortOptions};
use arrow_select::take::{take, take_record_batch};
use gputel_schemas::column::Packed;
use gputel_schemas::{RowKey, SharedNulls};
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::file::properties::{WriterProperties, WriterPropertiesPtr};
use parquet::file::writer::SerializedFileWriter;

use crate::persist::{ColumnChunkWriter, ENCODE_SLICE_ROWS, rows_at};

use super::*;

pub(super) async fn read(store: &dyn ObjectStore, name: &str) -> Result<Bytes, CompactError> {
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

/// A reader of one file, or None when its schema is not the table's.
fn reader_of(
    table: Table,
    name: &str,
    bytes: Bytes,
) -> Result<Option<ParquetRecordBatchReaderBuilder<Bytes>>, CompactError> {
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|source| CompactError::Decode {
            path: name.to_owned(),
            source,
        })?;
    let expected = table.schema();
    let found = builder.schema();
    // A file written before the table's schema grew is read into it: a
    // column that became nullable (the event table's `gpu` and `uuid`, null
    // on node events) simply holds no nulls there, and nullable columns
    // added at the end since (the alert table's `reason`) are null.
    let written = found.fields().len();
    let same = written <= expected.fields().len()
        && found.fields().iter().zip(expected.fields()).all(|(a, b)| {
            a.name() == b.name()
                && a.data_type() == b.data_type()
                && (a.is_nullable() == b.is_nullable() || b.is_nullable())
        })
        && expected.fields()[written..].iter().all(|f| f.is_nullable());
    Ok(same.then_some(builder))
}

/// Which of the table's columns a file holds no value of, by its footer's
/// statistics: columns added to the table since the file was written, and
/// nullable value columns (not lists or maps) whose null count is the rows
/// of every row group. They are not decoded: the reader would turn each
/// null of a text column into an entry it hashes and compares.
fn null_columns(table: Table, builder: &ParquetRecordBatchReaderBuilder<Bytes>) -> Vec<bool> {
    let columns = table.schema().fields().len();
    let written = builder.schema().fields().len();
    let parquet = builder.parquet_schema();
    let metadata = builder.metadata();
    // The leaf of each top-level column that is a value, not a list or a
    // map (whose leaves count empty lists among their nulls).
    let mut leaf_of = vec![None; written];
    for leaf in 0..parquet.num_columns() {
        if let [_] = parquet.column(leaf).path().parts() {
            leaf_of[parquet.get_column_root_idx(leaf)] = Some(leaf);
        }
    }
    let schema = table.schema();
    let all_null = |leaf: usize| {
        metadata.row_groups().iter().all(|group| {
            group
                .column(leaf)
                .statistics()
                .and_then(|s| s.null_count_opt())
                .is_some_and(|nulls| nulls == group.num_rows() as u64)
        })
    };
    (0..columns)
        .map(|i| {
            i >= written || (schema.field(i).is_nullable() && leaf_of[i].is_some_and(all_null))
        })
        .collect()
}

/// What the first reading of a file learns: how many of its rows hold
/// each value of the table's first sort-key column, and which of the
/// table's columns it holds no value of.
#[derive(Debug, Default)]
pub(super) struct Census {
    pub keys: Vec<(Option<String>, usize)>,
    pub null: Vec<bool>,
}

/// A file's [`Census`], or None when its schema is not the table's. Only
/// the first sort-key column is decoded.
pub(super) fn census(
    table: Table,
    name: &str,
    bytes: Bytes,
) -> Result<Option<Census>, CompactError> {
    let err = |source| CompactError::Decode {
        path: name.to_owned(),
        source,
    };
    let Some(builder) = reader_of(table, name, bytes)? else {
        return Ok(None);
    };
    let null = null_columns(table, &builder);
    let key = builder
        .schema()
        .index_of(table.sort_key()[0])
        .map_err(|e| err(ParquetError::ArrowError(e.to_string())))?;
    let mask = ProjectionMask::roots(builder.parquet_schema(), [key]);
    let reader = builder
        .with_projection(mask)
        .with_batch_size(64 * 1024)
        .build()
        .map_err(err)?;
    let mut counts: BTreeMap<Option<String>, usize> = BTreeMap::new();
    for batch in reader {
        let batch = batch.map_err(|e| err(ParquetError::ArrowError(e.to_string())))?;
        let keys = Keys::of(batch.column(0).as_ref())
            .map_err(|e| err(ParquetError::ArrowError(e.to_string())))?;
        let mut per_value = vec![0usize; keys.distinct.len()];
        for &v in &keys.rows {
            per_value[v] += 1;
        }
        for (value, n) in keys.distinct.iter().zip(per_value) {
            if n > 0 {
                *counts.entry(value.map(str::to_owned)).or_default() += n;
            }
        }
    }
    Ok(Some(Census {
        keys: counts.into_iter().collect(),
        null,
    }))
}

/// The values of a string column (dictionary-encoded or not): its distinct
/// values (None: null) and, per row, the index of its value among them.
struct Keys<'a> {
    distinct: Vec<Option<&'a str>>,
    rows: Vec<usize>,
}

impl<'a> Keys<'a> {
    fn of(column: &'a dyn Array) -> Result<Self, ArrowError> {
        let nulls = column.logical_nulls();
        let valid = |i: usize| nulls.as_ref().is_none_or(|n| n.is_valid(i));
        let not_strings =
            || ArrowError::SchemaError(format!("a sort key of {} is not text", column.data_type()));
        if let Some(dict) = column.as_any_dictionary_opt() {
            let values = dict
                .values()
                .as_string_opt::<i32>()
                .ok_or_else(not_strings)?;
            let null = values.len();
            let mut distinct: Vec<Option<&str>> =
                (0..values.len()).map(|i| Some(values.value(i))).collect();
            distinct.push(None);
            let rows = dict
                .normalized_keys()
                .into_iter()
                .enumerate()
                .map(|(i, k)| if valid(i) { k } else { null })
                .collect();
            Ok(Self { distinct, rows })
        } else {
            let values = column.as_string_opt::<i32>().ok_or_else(not_strings)?;
            let distinct = (0..values.len())
                .map(|i| valid(i).then(|| values.value(i)))
                .collect();
            Ok(Self {
                distinct,
                rows: (0..values.len()).collect(),
            })
        }
    }
}

/// Decodes one file, its batches handed to `each` in order, in the table's
/// schema (columns added since the file was written null). Returns false,
/// having read nothing, when its schema is not the table's.
pub(super) fn decode(
    table: Table,
    name: &str,
    bytes: Bytes,
    mut each: impl FnMut(RecordBatch) -> Result<(), CompactError>,
) -> Result<bool, CompactError> {
    let err = |source| CompactError::Decode {
        path: name.to_owned(),
        source,
    };
    let Some(builder) = reader_of(table, name, bytes)? else {
        return Ok(false);
    };
    let expected = table.schema();
    let null = null_columns(table, &builder);
    let read: Vec<usize> = (0..null.len()).filter(|&i| !null[i]).collect();
    let mask = ProjectionMask::roots(builder.parquet_schema(), read.iter().copied());
    let reader = builder
        .with_projection(mask)
        .with_batch_size(DECODE_BATCH_ROWS)
        .build()
        .map_err(err)?;
    for batch in reader {
        let batch = batch.map_err(|e| err(ParquetError::ArrowError(e.to_string())))?;
        // The table's own schema (with its field metadata), the columns not
        // read null.
        let mut decoded = batch.columns().iter();
        let mut nulls = SharedNulls::default();
        let columns = expected
            .fields()
            .iter()
            .zip(&null)
            .map(|(field, &null)| match null {
                true => nulls.of(field.data_type(), batch.num_rows()),
                false => Arc::clone(decoded.next().expect("a column per one read")),
            })
            .collect();
        let batch = RecordBatch::try_new_with_options(
            expected.clone(),
            columns,
            &arrow_array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
        )
        .map_err(|e| err(ParquetError::ArrowError(e.to_string())))?;
        each(batch)?;
    }
    Ok(true)
}

/// Rows decoded at a time while an hour's rows are spread over buckets.
const DECODE_BATCH_ROWS: usize = 8192;

/// Consecutive ranges of the first sort-key column's values (the node; the
/// job id in `job`), each holding at most a given number of an hour's rows,
/// so that each range is sorted and written on its own and the hour's files
/// still hold its rows in the table's sort order. A value with more rows
/// than that is a bucket of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Buckets {
    /// The first value of each bucket, ascending (None, a null, first:
    /// nulls sort first).
    starts: Vec<Option<String>>,
    /// Rows of each bucket, as the census counted them.
    pub rows: Vec<usize>,
}

impl Buckets {
    pub fn plan(counts: &BTreeMap<Option<String>, usize>, max_rows: usize) -> Self {
        let mut starts = Vec::new();
        let mut rows: Vec<usize> = Vec::new();
        for (value, &n) in counts {
            match rows.last_mut() {
                Some(last) if *last + n <= max_rows => *last += n,
                _ => {
                    starts.push(value.clone());
                    rows.push(n);
                }
            }
        }
        if starts.is_empty() {
            starts.push(None);
            rows.push(0);
        }
        Self { starts, rows }
    }

    pub fn len(&self) -> usize {
        self.starts.len()
    }

    pub fn of(&self, value: Option<&str>) -> usize {
        self.starts
            .partition_point(|start| start.as_deref() <= value)
            .saturating_sub(1)
    }
}

/// An Arrow IPC stream spill file being appended to, its schema written
/// when it was created. The file is not buffered: each append is put
/// together in [`SpillWriting::message`] and written at once, where a
/// buffer per file would hold 8 KiB for each of a large fleet's thousands
/// of ranges (8.2 MB of the 26 MB heap at the spill of a 1000-node hour).
struct IpcSpill {
    file: File,
    tracker: DictionaryTracker,
}

/// What the spill files of one writer share: the IPC options, one
/// compression context, and the buffer a message is put together in.
struct SpillWriting {
    options: IpcWriteOptions,
    context: IpcWriteContext,
    message: Vec<u8>,
}

impl SpillWriting {
    /// Spill options: zstd level 1.
    fn new() -> Result<Self, ArrowError> {
        Ok(Self {
            options: IpcWriteOptions::default()
                .try_with_compression(Some(arrow_ipc::CompressionType::ZSTD))?
                .try_with_compression_level(Some(1))?,
            context: IpcWriteContext::default(),
            message: Vec::new(),
        })
    }

    /// Writes out what was put together in `message`.
    fn write_to(&mut self, file: &mut File) -> std::io::Result<()> {
        let written = file.write_all(&self.message);
        self.message.clear();
        written
    }
}

impl IpcSpill {
    fn create(path: &Path, schema: &Schema, with: &mut SpillWriting) -> Result<Self, ArrowError> {
        let mut file = File::create(path)?;
        let mut tracker = DictionaryTracker::new(false);
        let schema = IpcDataGenerator::default().schema_to_bytes_with_dictionary_tracker(
            schema,
            &mut tracker,
            &with.options,
        );
        write_message(&mut with.message, schema, &with.options)?;
        with.write_to(&mut file)?;
        Ok(Self { file, tracker })
    }

    fn append(&mut self, rows: &RecordBatch, with: &mut SpillWriting) -> Result<(), ArrowError> {
        let (dictionaries, batch) = IpcDataGenerator::default().encode(
            rows,
            &mut self.tracker,
            &with.options,
            &mut with.context,
        )?;
        for message in dictionaries.into_iter().chain([batch]) {
            write_message(&mut with.message, message, &with.options)?;
        }
        Ok(with.write_to(&mut self.file)?)
    }

    /// Ends the stream: a continuation marker and a message of length 0.
    fn end(mut self) -> std::io::Result<()> {
        self.file.write_all(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0])
    }
}

/// A field as spilled: a dictionary's as its values' type, since each
/// spilled slice would repeat its whole dictionary.
fn text_field(f: &Field) -> Field {
    match f.data_type() {
        DataType::Dictionary(_, value) => f.clone().with_data_type(value.as_ref().clone()),
        _ => f.clone(),
    }
}

/// A column as spilled: a dictionary's values row by row.
fn as_text(column: &ArrayRef) -> Result<ArrayRef, ArrowError> {
    match column.as_dictionary_opt::<Int32Type>() {
        Some(dict) => take(dict.values().as_ref(), dict.keys(), None),
        None => Ok(Arc::clone(column)),
    }
}

/// An hour's rows on their way to their buckets: in memory when the hour
/// is one bucket, else appended to one spill file per bucket (an Arrow IPC
/// stream, zstd level 1), in the order of the files they come from. The
/// files share one compression context and one buffer ([`SpillWriting`]):
/// a writer of its own per file would hold a zstd context and a buffer
/// each, thousands of them for a large fleet's hour.
pub(super) struct Spill {
    table: Table,
    key: usize,
    buckets: Buckets,
    dir: PathBuf,
    memory: Vec<RecordBatch>,
    files: Vec<Option<IpcSpill>>,
    writing: SpillWriting,
    /// The table's columns that no file of the hour holds a value of: not
    /// spilled.
    null: Vec<bool>,
    /// The spill files' schema: the other columns, dictionary-encoded ones
    /// as plain text, since each spilled slice of a file would repeat its
    /// whole dictionary.
    spilled: SchemaRef,
}

/// The spill file of a table's bucket in `dir`.
fn spill_path(dir: &Path, table: Table, bucket: usize) -> PathBuf {
    dir.join(format!("{}-{bucket}.arrows", table.name()))
}

/// One bucket's rows, in the order of the files they came from.
pub(super) enum BucketRows {
    Memory(Vec<RecordBatch>),
    /// A spill file, and the table's columns it leaves out (null).
    File(PathBuf, Arc<[bool]>),
    Empty,
}

impl Spill {
    /// `null`: the table's columns no file of the hour holds a value of.
    pub fn new(
        table: Table,
        buckets: Buckets,
        null: Vec<bool>,
        dir: &Path,
    ) -> Result<Self, ArrowError> {
        let schema = table.schema();
        let key = schema.index_of(table.sort_key()[0])?;
        let spilled = Arc::new(Schema::new_with_metadata(
            schema
                .fields()
                .iter()
                .zip(&null)
                .filter(|(_, null)| !**null)
                .map(|(f, _)| text_field(f))
                .collect::<Vec<_>>(),
            schema.metadata().clone(),
        ));
        let files = (0..buckets.len()).map(|_| None).collect();
        let writing = SpillWriting::new()?;
        Ok(Self {
            table,
            key,
            buckets,
            dir: dir.to_owned(),
            memory: Vec::new(),
            files,
            writing,
            null,
            spilled,
        })
    }

    fn spill_err(&self, source: ArrowError) -> CompactError {
        CompactError::Spill {
            dir: self.dir.clone(),
            source,
        }
    }

    /// Sends each row of `batch` to its bucket.
    pub fn add(&mut self, batch: RecordBatch) -> Result<(), CompactError> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        if self.buckets.len() == 1 {
            self.memory.push(batch);
            return Ok(());
        }
        let keys = Keys::of(batch.column(self.key).as_ref()).map_err(|e| self.spill_err(e))?;
        let bucket_of: Vec<usize> = keys.distinct.iter().map(|v| self.buckets.of(*v)).collect();
        let mut order: Vec<u32> = (0..batch.num_rows() as u32).collect();
        order.sort_by_key(|&i| bucket_of[keys.rows[i as usize]]);
        let mut start = 0;
        while start < order.len() {
            let bucket = bucket_of[keys.rows[order[start] as usize]];
            let end = start
                + order[start..].partition_point(|&i| bucket_of[keys.rows[i as usize]] == bucket);
            let rows = if end - start == batch.num_rows() {
                batch.clone()
            } else {
                take_record_batch(&batch, &UInt32Array::from(order[start..end].to_vec()))
                    .map_err(|e| self.spill_err(e))?
            };
            self.write(bucket, rows).map_err(|e| self.spill_err(e))?;
            start = end;
        }
        Ok(())
    }

    fn write(&mut self, bucket: usize, rows: RecordBatch) -> Result<(), ArrowError> {
        let columns = rows
            .columns()
            .iter()
            .zip(&self.null)
            .filter(|(_, null)| !**null)
            .map(|(c, _)| as_text(c))
            .collect::<Result<Vec<_>, _>>()?;
        let rows = RecordBatch::try_new(Arc::clone(&self.spilled), columns)?;
        let file = match &mut self.files[bucket] {
            Some(file) => file,
            None => self.files[bucket].insert(IpcSpill::create(
                &spill_path(&self.dir, self.table, bucket),
                &self.spilled,
                &mut self.writing,
            )?),
        };
        file.append(&rows, &mut self.writing)
    }

    /// Each bucket's rows, in bucket order.
    pub fn finish(self) -> Result<Vec<BucketRows>, CompactError> {
        if self.buckets.len() == 1 {
            return Ok(vec![BucketRows::Memory(self.memory)]);
        }
        let mut out = Vec::with_capacity(self.files.len());
        let null: Arc<[bool]> = self.null.into();
        for (bucket, file) in self.files.into_iter().enumerate() {
            match file {
                Some(file) => {
                    file.end().map_err(|e| CompactError::Spill {
                        dir: self.dir.clone(),
                        source: e.into(),
                    })?;
                    out.push(BucketRows::File(
                        spill_path(&self.dir, self.table, bucket),
                        Arc::clone(&null),
                    ));
                }
                None => out.push(BucketRows::Empty),
            }
        }
        Ok(out)
    }
}

impl BucketRows {
    /// The bucket's rows in the table's schema, a column at a time; a
    /// spill file is deleted once read.
    pub fn load(self, table: Table) -> Result<BucketColumns, CompactError> {
        let (path, null) = match self {
            BucketRows::Memory(batches) => {
                return Ok(BucketColumns::from_batches(table.schema(), batches));
            }
            BucketRows::Empty => {
                return Ok(BucketColumns::from_batches(table.schema(), Vec::new()));
            }
            BucketRows::File(path, null) => (path, null),
        };
        let err = |source| CompactError::Spill {
            dir: path.parent().map(Path::to_owned).unwrap_or_default(),
            source,
        };
        let mut columns = BucketColumns::from_batches(table.schema(), Vec::new());
        let reader = StreamReader::try_new(
            BufReader::new(File::open(&path).map_err(|e| err(e.into()))?),
            None,
        )
        .map_err(err)?;
        // The table's columns that were spilled, with their index. A column
        // no file of the hour holds a value of has no parts: it is null in
        // every row.
        let spilled: Vec<(usize, DataType)> = columns
            .schema
            .fields()
            .iter()
            .enumerate()
            .filter(|(i, _)| !null[*i])
            .map(|(i, f)| (i, f.data_type().clone()))
            .collect();
        for (i, data_type) in &spilled {
            if Packed::holds(data_type) {
                columns.packed[*i] = Some(Packed::default());
            }
        }
        let mut pending: Vec<RecordBatch> = Vec::with_capacity(PARTS_PER_CHUNK);
        let join = |pending: &mut Vec<RecordBatch>, columns: &mut BucketColumns| {
            for (at, (i, data_type)) in spilled.iter().enumerate() {
                if let Some(packed) = &mut columns.packed[*i] {
                    for batch in pending.iter() {
                        let packs = packed.extend_from(batch.column(at).as_ref());
                        debug_assert!(packs, "an integer column of the table");
                    }
                    continue;
                }
                let parts: Vec<&dyn Array> =
                    pending.iter().map(|b| b.column(at).as_ref()).collect();
                columns.parts[*i].push(match data_type {
                    DataType::Dictionary(_, _) => dictionary_of(&parts)?,
                    _ => arrow_select::concat::concat(&parts)?,
                });
            }
            columns.rows += pending.iter().map(RecordBatch::num_rows).sum::<usize>();
            pending.clear();
            Ok::<_, ArrowError>(())
        };
        for batch in reader {
            pending.push(batch.map_err(err)?);
            if pending.len() == PARTS_PER_CHUNK {
                join(&mut pending, &mut columns).map_err(err)?;
            }
        }
        if !pending.is_empty() {
            join(&mut pending, &mut columns).map_err(err)?;
        }
        std::fs::remove_file(&path).map_err(|e| err(e.into()))?;
        Ok(columns)
    }
}

/// Messages of a spill file read before their columns are joined into one
/// array each. A message is one flush file's rows of the bucket's nodes, a
/// few dozen rows a column in its own buffers and array structs: a `gpu`
/// bucket of an hour of 360 flushes, held as read, took about as much
/// again beside its values as the values themselves.
const PARTS_PER_CHUNK: usize = 32;

/// A bucket's rows, a column at a time: each column as the parts it was
/// read in (a spill file's joined [`PARTS_PER_CHUNK`] messages at a time),
/// or, read from a spill file, an integer or timestamp column packed
/// ([`Packed`]: each value as the varint of its difference from the one
/// before, the same GPU's or port's previous tick in a flushed file's
/// order, a byte or two where Arrow takes 4 or 8); made whole only while
/// it is sorted by, compared or written, and freed once written. Sorting
/// a bucket's rows needs its key columns whole; writing them, one column
/// at a time. Held as one concatenated batch, the bucket would be in
/// memory twice while it is concatenated, and whole until its last column
/// is written.
pub(super) struct BucketColumns {
    schema: SchemaRef,
    /// Each column's parts; none for a column null in every row, or packed.
    parts: Vec<Vec<ArrayRef>>,
    /// Integer and timestamp columns read from a spill file.
    packed: Vec<Option<Packed>>,
    /// Columns made whole and kept, for sorting or comparing rows.
    whole: Vec<Option<ArrayRef>>,
    rows: usize,
    nulls: SharedNulls,
}

impl BucketColumns {
    pub fn from_batches(schema: SchemaRef, batches: Vec<RecordBatch>) -> Self {
        let mut parts: Vec<Vec<ArrayRef>> = (0..schema.fields().len())
            .map(|_| Vec::with_capacity(batches.len()))
            .collect();
        let mut rows = 0;
        for batch in batches {
            rows += batch.num_rows();
            for (parts, column) in parts.iter_mut().zip(batch.columns()) {
                parts.push(Arc::clone(column));
            }
        }
        Self {
            whole: vec![None; parts.len()],
            packed: parts.iter().map(|_| None).collect(),
            schema,
            parts,
            rows,
            nulls: SharedNulls::default(),
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// Column `i` whole. A column null in every row is one array per data
    /// type and length, shared by every such column.
    pub fn column(&mut self, i: usize) -> Result<ArrayRef, ArrowError> {
        if let Some(whole) = &self.whole[i] {
            return Ok(Arc::clone(whole));
        }
        if let Some(packed) = &self.packed[i] {
            return Ok(packed.array_of(self.schema.field(i).data_type(), &mut self.nulls));
        }
        let parts = &self.parts[i];
        if parts.iter().all(|a| a.null_count() == a.len()) {
            return Ok(self.nulls.of(self.schema.field(i).data_type(), self.rows));
        }
        if let [part] = parts.as_slice() {
            return Ok(Arc::clone(part));
        }
        if let DataType::Dictionary(_, _) = self.schema.field(i).data_type() {
            return merged_dictionary(parts);
        }
        let parts: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
        arrow_select::concat::concat(&parts)
    }

    /// Column `i` whole, kept for later calls; its parts are freed.
    pub fn keep(&mut self, i: usize) -> Result<ArrayRef, ArrowError> {
        let whole = self.column(i)?;
        self.whole[i] = Some(Arc::clone(&whole));
        self.parts[i] = Vec::new();
        self.packed[i] = None;
        Ok(whole)
    }

    /// Frees column `i`: it is not asked for again.
    pub fn release(&mut self, i: usize) {
        self.whole[i] = None;
        self.parts[i] = Vec::new();
        self.packed[i] = None;
    }
}

/// Dictionary-encoded text parts as one array with one dictionary of their
/// distinct values. Arrow's `concat` appends the parts' dictionaries one
/// after the other (a bucket's hundreds of parts repeat the same few
/// nodes, models and jobs), and every spilled slice of the column would
/// carry that whole dictionary.
fn merged_dictionary(parts: &[ArrayRef]) -> Result<ArrayRef, ArrowError> {
    let not_text = || ArrowError::SchemaError("a dictionary column is not of text".into());
    let rows = parts.iter().map(|p| p.len()).sum();
    let mut keys = Int32Builder::with_capacity(rows);
    let mut values = StringBuilder::new();
    let mut index: HashMap<&str, i32> = HashMap::new();
    for part in parts {
        let dict = part.as_dictionary_opt::<Int32Type>().ok_or_else(not_text)?;
        let part_values = dict.values().as_string_opt::<i32>().ok_or_else(not_text)?;
        // The merged key of each of the part's values.
        let mut merged = Vec::with_capacity(part_values.len());
        for value in part_values.iter() {
            merged.push(match value {
                Some(value) => {
                    let next = i32::try_from(index.len())
                        .map_err(|_| ArrowError::ComputeError("too many distinct values".into()))?;
                    Some(*index.entry(value).or_insert_with(|| {
                        values.append_value(value);
                        next
                    }))
                }
                None => None,
            });
        }
        for key in dict.keys() {
            keys.append_option(key.and_then(|k| merged[k as usize]));
        }
    }
    let dict = DictionaryArray::try_new(keys.finish(), Arc::new(values.finish()))?;
    Ok(Arc::new(dict))
}

/// Text parts as one column dictionary-encoded again, as the table's schema
/// has it.
fn dictionary_of(parts: &[&dyn Array]) -> Result<ArrayRef, ArrowError> {
    let not_text = || ArrowError::SchemaError("a spilled dictionary column is not text".into());
    let rows: usize = parts.iter().map(|p| p.len()).sum();
    // A bucket is a few nodes' rows: few distinct values. The builder's
    // default capacity (1024 keys and values) would be held by each of
    // the bucket's chunks.
    let distinct = rows.min(16);
    let mut dict =
        StringDictionaryBuilder::<Int32Type>::with_capacity(rows, distinct, distinct * 32);
    for part in parts {
        dict.extend(part.as_string_opt::<i32>().ok_or_else(not_text)?.iter());
    }
    Ok(Arc::new(dict.finish()))
}

/// The compacted files of an hour, written one bucket at a time: each
/// bucket's rows are sorted, kept once per row key and appended to the
/// file the plan gives it, so that nothing holds more than a bucket's rows
/// and the page being written.
pub(super) struct Outputs {
    table: Table,
    dir: PathBuf,
    hour: String,
    /// The file of each bucket, and the rows each file is planned to hold.
    file_of: Vec<usize>,
    file_rows: Vec<usize>,
    names: Vec<String>,
    /// Where the file being written keeps its row group's columns.
    spill_dir: PathBuf,
    current: Option<(usize, ColumnarFile)>,
    pub done: Vec<Output>,
    pub duplicates: Duplicates,
}

impl Outputs {
    /// Buckets go to files in order, a file holding at most `max_file_rows`
    /// of the census's rows unless one bucket alone has more. Each file is
    /// named by the merged files (`stems`) and, when there are several, its
    /// place among them, so a repeated merge of the same files writes the
    /// same names.
    pub fn new(
        table: Table,
        dir: &Path,
        spill_dir: &Path,
        hour: &str,
        stems: &[String],
        buckets: &Buckets,
        max_file_rows: usize,
    ) -> Self {
        let mut file_of = Vec::with_capacity(buckets.len());
        let mut file_rows: Vec<usize> = Vec::new();
        for &rows in &buckets.rows {
            match file_rows.last_mut() {
                Some(last) if *last + rows <= max_file_rows || *last == 0 => *last += rows,
                _ => file_rows.push(rows),
            }
            file_of.push(file_rows.len() - 1);
        }
        let joined = stems.join("/");
        let count = file_rows.len();
        let names = (0..count)
            .map(|index| {
                let named = if count > 1 {
                    format!("{joined}#{index}/{count}")
                } else {
                    joined.clone()
                };
                format!(
                    "{COMPACTED_PREFIX}{:016x}",
                    XxHash64::oneshot(0, named.as_bytes())
                )
            })
            .collect();
        Self {
            table,
            dir: dir.to_owned(),
            hour: hour.to_owned(),
            file_of,
            file_rows,
            names,
            spill_dir: spill_dir.to_owned(),
            current: None,
            done: Vec::new(),
            duplicates: Duplicates::default(),
        }
    }

    fn path(&self, file: usize) -> PathBuf {
        self.dir.join(format!("{}.parquet", self.names[file]))
    }

    fn encode_err(&self, file: usize, source: ParquetError) -> CompactError {
        CompactError::Persist(PersistError::Encode {
            path: self.path(file).display().to_string(),
            source,
        })
    }

    /// Sorts `bucket`'s rows, keeps one per key and appends them to its file.
    pub fn merge(&mut self, bucket: usize, mut rows: BucketColumns) -> Result<(), CompactError> {
        let hour = self.hour.clone();
        let merge_err = |source| CompactError::Merge {
            hour: hour.clone(),
            source,
        };
        if rows.rows() == 0 {
            return Ok(());
        }
        let (keep, duplicates) = sort_unique(self.table, &mut rows).map_err(merge_err)?;
        self.duplicates.removed += duplicates.removed;
        self.duplicates.differing += duplicates.differing;
        let file = self.file_of[bucket];
        if self.current.as_ref().is_none_or(|(f, _)| *f != file) {
            self.close()?;
            let props = compacted_properties(self.table, self.file_rows[file]);
            let writer = ColumnarFile::create(&self.path(file), self.table, props, &self.spill_dir)
                .map_err(|e| self.encode_err(file, e))?;
            self.current = Some((file, writer));
        }
        let (_, writer) = self.current.as_mut().expect("opened above");
        let appended = writer.append(&mut rows, &keep);
        appended.map_err(|e| self.encode_err(file, e))
    }

    /// Ends the file being written: its footer, flushed and synced.
    fn close(&mut self) -> Result<(), CompactError> {
        let Some((file, mut writer)) = self.current.take() else {
            return Ok(());
        };
        let path = self.path(file);
        writer.finish().map_err(|e| self.encode_err(file, e))?;
        let sink = writer.file.inner_mut();
        sink.flush()
            .and_then(|()| sink.get_ref().sync_all())
            .map_err(|e| self.encode_err(file, ParquetError::External(Box::new(e))))?;
        let bytes = sink
            .get_ref()
            .metadata()
            .map(|m| m.len())
            .map_err(|e| self.encode_err(file, ParquetError::External(Box::new(e))))?;
        self.done.push(Output {
            stem: self.names[file].clone(),
            path,
            bytes,
        });
        Ok(())
    }

    pub fn finish(mut self) -> Result<(Vec<Output>, Duplicates), CompactError> {
        self.close()?;
        Ok((self.done, self.duplicates))
    }
}

/// A compacted file written a column at a time. A bucket's rows go to
/// their row group's spill files, one per column (Arrow IPC, zstd level 1,
/// a text column as a dictionary of the bucket's distinct values,
/// [`merged_dictionary`]; a column's rows of a bucket one message, since
/// arrow-ipc makes a zstd context for every message it reads); once
/// the group has its rows, each column is encoded from its spill file by a
/// writer of its own, which is closed into the group before the next is
/// made. Parquet's `ArrowWriter` would keep every column's unfinished page,
/// encoder and zstd context for as long as the group lasts (up to 1 M rows;
/// benches/README.md, "Capacity"); the file is the one it makes of the same
/// rows, byte for byte.
struct ColumnarFile {
    file: SerializedFileWriter<BufWriter<File>>,
    schema: SchemaRef,
    props: WriterPropertiesPtr,
    group_rows: usize,
    /// Rows in the current group's spill files.
    pending: usize,
    dir: PathBuf,
    /// Each column's spill file for the current group, opened by its first rows.
    columns: Vec<Option<IpcSpill>>,
    /// The spill files' schemas: the column alone.
    spilled: Vec<SchemaRef>,
    writing: SpillWriting,
    /// The lengths of the slices the current group's rows are written in.
    slices: Vec<usize>,
}

/// The spill file of a compacted file's column in `dir`.
fn column_spill_path(dir: &Path, column: usize) -> PathBuf {
    dir.join(format!("column-{column}.arrows"))
}

/// An I/O or Arrow error as the Parquet writer's.
fn external(e: impl std::error::Error + Send + Sync + 'static) -> ParquetError {
    ParquetError::External(Box::new(e))
}

impl ColumnarFile {
    fn create(
        path: &Path,
        table: Table,
        props: WriterProperties,
        dir: &Path,
    ) -> Result<Self, ParquetError> {
        let created = File::create(path).map_err(external)?;
        let schema = table.schema();
        let (file, _) =
            ArrowWriter::try_new(BufWriter::new(created), Arc::clone(&schema), Some(props))?
                .into_serialized_writer()?;
        let props = Arc::clone(file.properties());
        let group_rows = props.max_row_group_row_count().unwrap_or(usize::MAX).max(1);
        let spilled = schema
            .fields()
            .iter()
            .map(|f| Arc::new(Schema::new(vec![Arc::clone(f)])))
            .collect();
        let writing = SpillWriting::new().map_err(external)?;
        Ok(Self {
            file,
            columns: (0..schema.fields().len()).map(|_| None).collect(),
            schema,
            props,
            group_rows,
            pending: 0,
            dir: dir.to_owned(),
            spilled,
            writing,
            slices: Vec::new(),
        })
    }

    /// Appends `batch`'s rows in the order of `indices`: each column's rows
    /// of the current row group are one message of its spill file, and the
    /// group is written once it is whole. The slices the column writers are
    /// later given are the `ArrowWriter`'s: [`ENCODE_SLICE_ROWS`] from the
    /// first of `indices`, cut where a row group ends. Each column is made
    /// whole in turn (again for the next group when the rows span two) and
    /// freed once its last rows are spilled.
    fn append(
        &mut self,
        columns: &mut BucketColumns,
        indices: &UInt32Array,
    ) -> Result<(), ParquetError> {
        let mut start = 0;
        while start < indices.len() {
            let len = (indices.len() - start).min(self.group_rows - self.pending);
            let last = start + len == indices.len();
            let rows = indices.slice(start, len);
            let mut nulls = SharedNulls::default();
            for i in 0..self.schema.fields().len() {
                let column = columns.column(i).map_err(external)?;
                let values = rows_at(&column, &rows, &mut nulls).map_err(external)?;
                drop(column);
                if last {
                    columns.release(i);
                }
                self.spill(i, values).map_err(external)?;
            }
            let mut at = start;
            while at < start + len {
                let slice_end = (at / ENCODE_SLICE_ROWS + 1) * ENCODE_SLICE_ROWS;
                let end = slice_end.min(start + len);
                self.slices.push(end - at);
                at = end;
            }
            self.pending += len;
            start += len;
            if self.pending == self.group_rows {
                self.write_group()?;
            }
        }
        Ok(())
    }

    fn spill(&mut self, column: usize, values: ArrayRef) -> Result<(), ArrowError> {
        let rows = RecordBatch::try_new(Arc::clone(&self.spilled[column]), vec![values])?;
        let file = match &mut self.columns[column] {
            Some(file) => file,
            None => self.columns[column].insert(IpcSpill::create(
                &column_spill_path(&self.dir, column),
                &self.spilled[column],
                &mut self.writing,
            )?),
        };
        file.append(&rows, &mut self.writing)
    }

    /// Encodes the current row group from its spill files, a column at a
    /// time, and deletes them.
    fn write_group(&mut self) -> Result<(), ParquetError> {
        let group_index = self.file.flushed_row_groups().len();
        let mut row_group = self.file.next_row_group()?;
        for (i, field) in self.schema.fields().iter().enumerate() {
            let path = column_spill_path(&self.dir, i);
            let Some(spill) = self.columns[i].take() else {
                return Err(ParquetError::General(format!(
                    "column {} has no rows for its row group",
                    field.name()
                )));
            };
            spill.end().map_err(external)?;
            let reader =
                StreamReader::try_new(BufReader::new(File::open(&path).map_err(external)?), None)
                    .map_err(external)?;
            let mut chunk = ColumnChunkWriter::new(field, &self.props, group_index)?;
            let mut slices = self.slices.iter();
            for batch in reader {
                let column = Arc::clone(batch.map_err(external)?.column(0));
                let mut at = 0;
                while at < column.len() {
                    let len = *slices.next().ok_or_else(|| {
                        ParquetError::General(format!("more rows of {} than spilled", field.name()))
                    })?;
                    chunk.write(&column.slice(at, len))?;
                    at += len;
                }
            }
            chunk.close_into(&mut row_group)?;
            std::fs::remove_file(&path).map_err(external)?;
            // The column's pages and its read messages are freed: handed
            // back before the next column is encoded, as after a range
            // (otherwise up to 20 MB of a 1 M-row group's freed pages stay
            // resident for a second; benches/README.md, "2026-11-28, day").
            crate::memory::return_freed_memory();
        }
        row_group.close()?;
        self.pending = 0;
        self.slices.clear();
        Ok(())
    }

    /// Writes the last row group and the footer.
    fn finish(&mut self) -> Result<(), ParquetError> {
        if self.pending > 0 {
            self.write_group()?;
        }
        self.file.finish().map(|_| ())
    }
}

/// Rows a merge left out because another row had their key.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Duplicates {
    /// Rows dropped.
    pub removed: usize,
    /// Of those, rows whose other columns differed from the row kept.
    pub differing: usize,
}

/// The positions of the columns rows are sorted and compared by: the table's
/// sort key, then the rest of its row key (every other column for
/// [`RowKey::WholeRow`]).
fn key_columns(table: Table, schema: &Schema) -> Result<Vec<usize>, ArrowError> {
    let mut key = Vec::new();
    let rest: Vec<usize> = match table.row_key() {
        RowKey::Columns(names) => names
            .iter()
            .map(|name| schema.index_of(name))
            .collect::<Result<_, _>>()?,
        RowKey::WholeRow => (0..schema.fields().len()).collect(),
    };
    for name in table.sort_key() {
        key.push(schema.index_of(name)?);
    }
    for i in rest {
        if !key.contains(&i) {
            key.push(i);
        }
    }
    Ok(key)
}

/// The rows of a bucket to keep, in the table's sort order: one row per
/// row key, the last one in the bucket, which holds the merged files in
/// name order, so the row of the file whose name sorts last wins, the same
/// one in every run. The key columns are kept whole for the bucket's
/// writing; the others are made whole only when a key repeats.
pub(super) fn sort_unique(
    table: Table,
    rows: &mut BucketColumns,
) -> Result<(UInt32Array, Duplicates), ArrowError> {
    let schema = Arc::clone(rows.schema());
    let key = key_columns(table, &schema)?;
    // Equal keys stay in batch order.
    let key_values: Vec<ArrayRef> = key
        .iter()
        .map(|&i| rows.keep(i))
        .collect::<Result<_, _>>()?;
    let sorted = crate::sort::sorted_indices(&key_values)?;
    let order = sorted.values();

    let comparators = |columns: &[ArrayRef]| {
        columns
            .iter()
            .map(|column| make_comparator(column.as_ref(), column.as_ref(), SortOptions::default()))
            .collect::<Result<Vec<DynComparator>, ArrowError>>()
    };
    let same = |compare: &[DynComparator], a: u32, b: u32| {
        compare.iter().all(|c| c(a as usize, b as usize).is_eq())
    };
    let by_key = comparators(&key_values)?;
    // The other columns, made whole and compared only when a key repeats.
    let mut by_value: Option<Vec<DynComparator>> = None;
    let mut duplicates = Duplicates::default();
    let mut keep: Vec<u32> = Vec::with_capacity(order.len());
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len() && same(&by_key, order[start], order[end]) {
            end += 1;
        }
        let kept = order[end - 1];
        keep.push(kept);
        if end - start > 1 {
            let by_value = match &mut by_value {
                Some(c) => c,
                None => {
                    let values = (0..schema.fields().len())
                        .filter(|i| !key.contains(i))
                        .map(|i| rows.keep(i))
                        .collect::<Result<Vec<_>, _>>()?;
                    by_value.insert(comparators(&values)?)
                }
            };
            for &dropped in &order[start..end - 1] {
                duplicates.removed += 1;
                if !same(by_value, dropped, kept) {
                    duplicates.differing += 1;
                }
            }
        }
        start = end;
    }
    Ok((UInt32Array::from(keep), duplicates))
}

#[cfg(test)]
mod tests {
    use arrow_array::types::{Int64Type, TimestampMicrosecondType};
    use gputel_proto::{EventKind, GpuEvent, GpuSample};
    use gputel_schemas::{EventRows, EventSource, GpuRows};

    use super::*;

    const T0: i64 = 1_795_240_800_000_000;
    const S: i64 = 1_000_000;

    impl BucketColumns {
        /// Every column whole, as one batch.
        fn into_batch(mut self) -> RecordBatch {
            let columns = (0..self.schema.fields().len())
                .map(|i| self.column(i).unwrap())
                .collect();
            RecordBatch::try_new(Arc::clone(&self.schema), columns).unwrap()
        }
    }

    fn gpu(gpu: u32, ts_us: i64, mig: Option<u32>, temperature_c: u32) -> GpuSample {
        GpuSample {
            ts_us,
            gpu,
            uuid: format!("GPU-{gpu}"),
            model: "NVIDIA A100-SXM4-80GB".into(),
            temperature_c: Some(temperature_c),
            gpu_instance_id: mig,
            compute_instance_id: mig.map(|_| 0),
            ..Default::default()
        }
    }

    /// Two files' gpu rows, the second repeating some of the first: an exact
    /// copy, a row with another temperature, and a MIG device's row. The
    /// GPU's row and its two MIG devices' rows at one tick are three keys.
    #[test]
    fn one_row_per_key_is_kept_the_last_files_and_mig_rows_stay_apart() {
        let first = [
            gpu(0, T0, None, 40),
            gpu(0, T0 + S, None, 41),
            gpu(1, T0, None, 50),
            gpu(0, T0, Some(1), 40),
            gpu(0, T0, Some(2), 40),
        ];
        let second = [
            gpu(0, T0 + S, None, 41),
            gpu(1, T0, None, 55),
            gpu(0, T0, Some(1), 40),
            gpu(0, T0 + 2 * S, None, 42),
        ];
        let mut rows = GpuRows::default();
        for s in first.iter().chain(&second) {
            rows.push("n1", s);
        }
        let batch = RecordBatch::try_new(Table::Gpu.schema(), rows.finish()).unwrap();
        assert_eq!(batch.num_rows(), 9);

        // The two files' rows as two parts, as a bucket reads them.
        let mut parts =
            BucketColumns::from_batches(batch.schema(), vec![batch.slice(0, 5), batch.slice(5, 4)]);
        let (keep, duplicates) = sort_unique(Table::Gpu, &mut parts).unwrap();
        let unique = take_record_batch(&batch, &keep).unwrap();
        assert_eq!(
            duplicates,
            Duplicates {
                removed: 3,
                differing: 1
            }
        );
        let i32s = |name: &str| -> Vec<Option<i32>> {
            let column = unique.column_by_name(name).unwrap();
            column.as_primitive::<Int32Type>().iter().collect()
        };
        let ts: Vec<i64> = unique
            .column_by_name("ts")
            .unwrap()
            .as_primitive::<TimestampMicrosecondType>()
            .values()
            .iter()
            .map(|t| (t - T0) / S)
            .collect();
        // Sorted by (node, gpu, ts), a GPU's own row (null ids) first.
        assert_eq!(ts, [0, 0, 0, 1, 2, 0]);
        assert_eq!(i32s("gpu"), [0, 0, 0, 0, 0, 1].map(Some));
        assert_eq!(
            i32s("gpu_instance_id"),
            [None, Some(1), Some(2), None, None, None]
        );
        // GPU 1 at T0 is the second file's row.
        assert_eq!(i32s("temperature_c"), [40, 40, 40, 41, 42, 55].map(Some));
    }

    /// Events have no key short of the whole row: identical rows are one,
    /// rows differing in any column stay.
    #[test]
    fn events_are_duplicates_only_when_every_column_is_equal() {
        let xid = |code: u64| GpuEvent {
            ts_us: T0,
            gpu: 3,
            uuid: "GPU-3".into(),
            kind: EventKind::Xid as i32,
            code,
            detail: "Graphics Engine Exception".into(),
            ..Default::default()
        };
        let mut rows = EventRows::default();
        for e in [xid(13), xid(31), xid(13), xid(13)] {
            rows.push("n1", &EventSource::Gpu(&e));
        }
        let batch = RecordBatch::try_new(Table::Event.schema(), rows.finish()).unwrap();
        let mut parts = BucketColumns::from_batches(batch.schema(), vec![batch.clone()]);
        let (keep, duplicates) = sort_unique(Table::Event, &mut parts).unwrap();
        let unique = take_record_batch(&batch, &keep).unwrap();
        assert_eq!(
            duplicates,
            Duplicates {
                removed: 2,
                differing: 0
            }
        );
        let codes: Vec<i64> = unique
            .column_by_name("code")
            .unwrap()
            .as_primitive::<Int64Type>()
            .values()
            .to_vec();
        assert_eq!(codes, [13, 31]);
    }

    /// Buckets are consecutive ranges of nodes of at most the given rows;
    /// a node with more is one of its own, and a node no census counted
    /// falls in the range it sorts into.
    #[test]
    fn buckets_are_ranges_of_nodes_of_bounded_rows() {
        let counts: BTreeMap<Option<String>, usize> = [
            (None, 1),
            (Some("a".to_owned()), 40),
            (Some("b".to_owned()), 50),
            (Some("c".to_owned()), 20),
            (Some("d".to_owned()), 300),
            (Some("e".to_owned()), 10),
        ]
        .into_iter()
        .collect();
        let buckets = Buckets::plan(&counts, 100);
        assert_eq!(buckets.rows, [91, 20, 300, 10]);
        let values = [
            None,
            Some("a"),
            Some("b"),
            Some("bb"),
            Some("c"),
            Some("cz"),
            Some("d"),
            Some("e"),
            Some("z"),
        ];
        assert_eq!(values.map(|v| buckets.of(v)), [0, 0, 0, 0, 1, 1, 2, 3, 3]);
        let one = Buckets::plan(&counts, 1000);
        assert_eq!((one.len(), one.of(Some("zz"))), (1, 0));
        assert_eq!(Buckets::plan(&BTreeMap::new(), 10).rows, [0]);
    }

    fn gpu_batch(node_ticks: &[(&str, i64)]) -> RecordBatch {
        let mut rows = GpuRows::default();
        for &(node, t) in node_ticks {
            rows.push(node, &gpu(0, T0 + t * S, None, 40 + t as u32));
        }
        RecordBatch::try_new(Table::Gpu.schema(), rows.finish()).unwrap()
    }

    /// (node, tick) of each row of `batch`.
    fn node_ticks(batch: &RecordBatch) -> Vec<(String, i64)> {
        let node = batch.column_by_name("node").unwrap();
        let keys = Keys::of(node.as_ref()).unwrap();
        let ts = batch
            .column_by_name("ts")
            .unwrap()
            .as_primitive::<TimestampMicrosecondType>();
        keys.rows
            .iter()
            .enumerate()
            .map(|(i, &k)| (keys.distinct[k].unwrap().to_owned(), (ts.value(i) - T0) / S))
            .collect()
    }

    /// A census of nodes n1, n2 and n3 of `rows` rows each.
    fn three_nodes_of(rows: usize) -> BTreeMap<Option<String>, usize> {
        ["n1", "n2", "n3"]
            .map(|n| (Some(n.to_owned()), rows))
            .into_iter()
            .collect()
    }

    fn owned(v: &[(&str, i64)]) -> Vec<(String, i64)> {
        v.iter().map(|&(n, t)| (n.to_owned(), t)).collect()
    }

    /// Rows spilled to several buckets come back to the right bucket, in
    /// the order they were added, in the table's schema with its
    /// dictionary-encoded node column; each spill file is deleted once read.
    #[test]
    fn spilled_rows_come_back_whole_in_their_bucket() {
        let dir = tempfile::tempdir().unwrap();
        let counts = three_nodes_of(4);
        let buckets = Buckets::plan(&counts, 5);
        assert_eq!(buckets.len(), 3);
        // Columns no file holds a value of are not spilled, and come back null.
        let mut null = vec![false; Table::Gpu.schema().fields().len()];
        let power = Table::Gpu.schema().index_of("power_mw").unwrap();
        null[power] = true;
        let mut spill = Spill::new(Table::Gpu, buckets, null, dir.path()).unwrap();
        spill
            .add(gpu_batch(&[("n3", 0), ("n1", 0), ("n2", 0), ("n1", 1)]))
            .unwrap();
        spill.add(gpu_batch(&[("n1", 2), ("n3", 1)])).unwrap();
        let rows = spill.finish().unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 3);
        let mut got = Vec::new();
        for bucket in rows {
            let columns = bucket.load(Table::Gpu).unwrap();
            // The null column holds nothing, not a null array per part.
            assert!(columns.parts[power].is_empty());
            let batch = columns.into_batch();
            assert_eq!(batch.schema(), Table::Gpu.schema());
            assert_eq!(batch.column(power).null_count(), batch.num_rows());
            got.push(node_ticks(&batch));
        }
        assert_eq!(
            got,
            [
                owned(&[("n1", 0), ("n1", 1), ("n1", 2)]),
                owned(&[("n2", 0)]),
                owned(&[("n3", 0), ("n3", 1)]),
            ]
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// A bucket spilled in more messages than are joined at once comes back
    /// with every row in the order added, its columns in a few arrays
    /// rather than one per message, and the same values and dictionary as
    /// the rows it was given.
    #[test]
    fn a_bucket_spilled_in_many_messages_comes_back_in_a_few_arrays_a_column() {
        let dir = tempfile::tempdir().unwrap();
        let messages = 2 * PARTS_PER_CHUNK + 5;
        let counts: BTreeMap<Option<String>, usize> = [("n1", 2 * messages), ("n2", messages)]
            .map(|(n, rows)| (Some(n.to_owned()), rows))
            .into_iter()
            .collect();
        let buckets = Buckets::plan(&counts, 2 * messages);
        assert_eq!(buckets.len(), 2);
        let null = vec![false; Table::Gpu.schema().fields().len()];
        let mut spill = Spill::new(Table::Gpu, buckets, null, dir.path()).unwrap();
        for t in 0..messages as i64 {
            // n1 at two ticks, n2 at one: one message of each bucket a batch.
            spill
                .add(gpu_batch(&[("n1", 2 * t), ("n2", t), ("n1", 2 * t + 1)]))
                .unwrap();
        }
        let mut buckets = spill.finish().unwrap().into_iter();
        let first = buckets.next().unwrap().load(Table::Gpu).unwrap();
        let uuid = Table::Gpu.schema().index_of("uuid").unwrap();
        let temperature = Table::Gpu.schema().index_of("temperature_c").unwrap();
        assert_eq!(first.rows(), 2 * messages);
        // Integers packed as read, at a byte a value here (a GPU's next
        // tick, one degree warmer); text in a few arrays.
        assert!(first.parts[temperature].is_empty());
        let packed = first.packed[temperature].as_ref().expect("packed");
        assert_eq!(packed.packed_bytes(), 2 * messages);
        assert_eq!(first.parts[uuid].len(), messages.div_ceil(PARTS_PER_CHUNK));
        let batch = first.into_batch();
        assert_eq!(batch.schema(), Table::Gpu.schema());
        let want: Vec<(String, i64)> = (0..2 * messages as i64)
            .map(|t| ("n1".to_owned(), t))
            .collect();
        assert_eq!(node_ticks(&batch), want);
        let temperatures = batch.column(temperature).as_primitive::<Int32Type>();
        let want: Vec<i32> = (0..2 * messages as i32).map(|t| 40 + t).collect();
        assert_eq!(temperatures.values().to_vec(), want);
        // One dictionary of the bucket's distinct values, not one a chunk.
        let uuids = batch.column(uuid).as_dictionary::<Int32Type>();
        assert_eq!(uuids.values().len(), 1);
        assert_eq!(uuids.values().as_string::<i32>().value(0), "GPU-0");

        let second = buckets
            .next()
            .unwrap()
            .load(Table::Gpu)
            .unwrap()
            .into_batch();
        let want: Vec<(String, i64)> = (0..messages as i64).map(|t| ("n2".to_owned(), t)).collect();
        assert_eq!(node_ticks(&second), want);
        assert!(buckets.next().is_none());
    }

    /// A compacted file written a column at a time is the file parquet's
    /// `ArrowWriter` makes of the same rows in the same order, byte for
    /// byte: over several row groups, one of them cut inside a slice, with
    /// dictionaries and nulls. Its column spill files are deleted.
    #[test]
    fn a_file_written_a_column_at_a_time_is_the_arrow_writers() {
        let dir = tempfile::tempdir().unwrap();
        let spill = tempfile::tempdir().unwrap();
        // Three buckets of 12 000 rows, in groups of 10 000.
        let props = crate::persist::compacted_properties(Table::Gpu, 36_000)
            .into_builder()
            .set_max_row_group_row_count(Some(10_000))
            .build();
        let bucket = |node: &str, temperature: u32| {
            let mut rows = GpuRows::default();
            for t in (0..6000).rev() {
                for g in 0..2 {
                    let mut sample = gpu(g, T0 + t * S, None, temperature + (t % 13) as u32);
                    sample.power_mw = (t % 5 != 0).then_some(100_000 + t as u32);
                    sample.job_id = (t > 3000).then(|| format!("job-{}", t / 1000));
                    rows.push(node, &sample);
                }
            }
            RecordBatch::try_new(Table::Gpu.schema(), rows.finish()).unwrap()
        };
        let path = dir.path().join("c.parquet");
        let mut columnar =
            ColumnarFile::create(&path, Table::Gpu, props.clone(), spill.path()).unwrap();
        let mut reference =
            ArrowWriter::try_new(Vec::new(), Table::Gpu.schema(), Some(props)).unwrap();
        for (node, temperature) in [("n1", 40), ("n2", 50), ("n3", 60)] {
            let rows = bucket(node, temperature);
            // The bucket in parts, as read from its spill file.
            let mut parts = BucketColumns::from_batches(
                rows.schema(),
                vec![rows.slice(0, 5000), rows.slice(5000, 7000)],
            );
            let (keep, _) = sort_unique(Table::Gpu, &mut parts).unwrap();
            columnar.append(&mut parts, &keep).unwrap();
            crate::persist::write_in_order(&mut reference, &rows, &keep, ParquetError::from, |e| e)
                .unwrap();
        }
        columnar.finish().unwrap();
        columnar.file.inner_mut().flush().unwrap();
        drop(columnar);
        let expected = reference.into_inner().unwrap();
        let written = std::fs::read(&path).unwrap();
        assert_eq!(written.len(), expected.len());
        assert!(written == expected, "the files differ");
        let reader = ParquetRecordBatchReaderBuilder::try_new(Bytes::from(written)).unwrap();
        let groups: Vec<i64> = reader
            .metadata()
            .row_groups()
            .iter()
            .map(|g| g.num_rows())
            .collect();
        assert_eq!(groups, [10_000, 10_000, 10_000, 6_000]);
        let batches: Vec<RecordBatch> = reader.build().unwrap().map(Result::unwrap).collect();
        let power = batches[0].column_by_name("power_mw").unwrap();
        assert!(power.null_count() > 0 && power.null_count() < power.len());
        assert_eq!(std::fs::read_dir(spill.path()).unwrap().count(), 0);
    }

    /// A bucket's columns that none of its rows holds a value of are one
    /// array per data type, shared, null in every row: a sparse table's
    /// bucket costs the width of the columns with values. A column with
    /// values in some parts only is concatenated as it was.
    #[test]
    fn columns_without_a_value_share_one_array_per_type() {
        let batch = |samples: &[GpuSample]| {
            let mut rows = GpuRows::default();
            for sample in samples {
                rows.push("n1", sample);
            }
            RecordBatch::try_new(Table::Gpu.schema(), rows.finish()).unwrap()
        };
        let parts = vec![
            batch(&[gpu(0, T0, None, 40), gpu(0, T0 + S, None, 41)]),
            batch(&[gpu(0, T0, Some(1), 42)]),
        ];
        let all = BucketColumns::from_batches(Table::Gpu.schema(), parts).into_batch();
        let column = |name: &str| all.column_by_name(name).unwrap();
        for name in ["power_mw", "power_limit_mw", "power_avg_mw"] {
            assert_eq!(column(name).data_type(), &DataType::Int64);
            assert_eq!((column(name).len(), column(name).null_count()), (3, 3));
        }
        assert!(Arc::ptr_eq(column("power_mw"), column("power_limit_mw")));
        assert!(Arc::ptr_eq(column("power_mw"), column("power_avg_mw")));
        // Another type, another array.
        let active = column("sm_active_pct");
        assert_eq!(
            (active.data_type(), active.null_count()),
            (&DataType::Float32, 3)
        );
        assert!(!Arc::ptr_eq(column("power_mw"), active));
        let instance = column("gpu_instance_id").as_primitive::<Int32Type>();
        assert_eq!(instance.iter().collect::<Vec<_>>(), [None, None, Some(1)]);
        let temperature = column("temperature_c").as_primitive::<Int32Type>();
        assert_eq!(
            temperature.iter().collect::<Vec<_>>(),
            [Some(40), Some(41), Some(42)]
        );
    }

    /// Dictionary parts become one column with one dictionary of their
    /// distinct values, the same text row by row, nulls kept.
    #[test]
    fn dictionary_parts_merge_into_one_dictionary_of_distinct_values() {
        let part = |values: &[Option<&str>]| -> ArrayRef {
            let text = arrow_array::StringArray::from(values.to_vec());
            dictionary_of(&[&text]).unwrap()
        };
        let parts = [
            part(&[Some("n1"), Some("n2"), None, Some("n1")]),
            part(&[Some("n2"), Some("n3")]),
            part(&[None, Some("n1")]),
        ];
        let merged = merged_dictionary(&parts).unwrap();
        let dict = merged.as_dictionary::<Int32Type>();
        assert_eq!(dict.values().len(), 3);
        let text = as_text(&merged).unwrap();
        let rows: Vec<Option<&str>> = text.as_string::<i32>().iter().collect();
        assert_eq!(
            rows,
            [
                Some("n1"),
                Some("n2"),
                None,
                Some("n1"),
                Some("n2"),
                Some("n3"),
                None,
                Some("n1")
            ]
        );
    }

    /// Buckets written one after the other make files sorted from their
    /// first row to their last, a new file where the next bucket would take
    /// one past its rows, and names that depend only on the merged files.
    #[test]
    fn outputs_are_sorted_files_of_whole_buckets() {
        let dir = tempfile::tempdir().unwrap();
        let counts = three_nodes_of(3);
        let buckets = Buckets::plan(&counts, 3);
        let stems = ["a-1".to_owned(), "b-1".to_owned()];
        let spill = tempfile::tempdir().unwrap();
        let outputs_of = || {
            Outputs::new(
                Table::Gpu,
                dir.path(),
                spill.path(),
                "gpu/h",
                &stems,
                &buckets,
                6,
            )
        };
        let mut outputs = outputs_of();
        // Each bucket's rows out of order, and one of them twice.
        let first = vec![
            gpu_batch(&[("n1", 2), ("n1", 0)]),
            gpu_batch(&[("n1", 1), ("n1", 0)]),
        ];
        let bucket = |batches| BucketColumns::from_batches(Table::Gpu.schema(), batches);
        outputs.merge(0, bucket(first)).unwrap();
        outputs
            .merge(1, bucket(vec![gpu_batch(&[("n2", 1), ("n2", 0)])]))
            .unwrap();
        outputs
            .merge(2, bucket(vec![gpu_batch(&[("n3", 0)])]))
            .unwrap();
        let (files, duplicates) = outputs.finish().unwrap();
        assert_eq!(
            duplicates,
            Duplicates {
                removed: 1,
                differing: 0
            }
        );
        let again = outputs_of();
        let stems_out: Vec<String> = files.iter().map(|f| f.stem.clone()).collect();
        assert_eq!(again.names, stems_out);
        assert_eq!(files.len(), 2);
        assert_ne!(files[0].stem, files[1].stem);
        let mut read = Vec::new();
        for file in &files {
            let bytes = Bytes::from(std::fs::read(&file.path).unwrap());
            assert_eq!(file.bytes, bytes.len() as u64);
            let batches = decoded(Table::Gpu, "out.parquet", bytes).unwrap();
            read.push(batches.iter().flat_map(node_ticks).collect::<Vec<_>>());
        }
        assert_eq!(
            read,
            [
                owned(&[("n1", 0), ("n1", 1), ("n1", 2), ("n2", 0), ("n2", 1)]),
                owned(&[("n3", 0)]),
            ]
        );
    }

    /// Columns null in every row of a file are known by its footer and not
    /// decoded; a list column whose lists are all empty is not null.
    #[test]
    fn columns_null_in_every_row_are_known_by_the_footer() {
        let encode = |table: Table, batch: &RecordBatch| {
            let mut bytes = Vec::new();
            let props = crate::persist::writer_properties(table);
            let mut writer = ArrowWriter::try_new(&mut bytes, table.schema(), Some(props)).unwrap();
            writer.write(batch).unwrap();
            writer.close().unwrap();
            ParquetRecordBatchReaderBuilder::try_new(Bytes::from(bytes)).unwrap()
        };
        let schema = Table::Gpu.schema();
        let null = null_columns(
            Table::Gpu,
            &encode(Table::Gpu, &gpu_batch(&[("n1", 0), ("n1", 1)])),
        );
        let at = |name: &str| null[schema.index_of(name).unwrap()];
        assert!(at("power_mw") && at("job_id") && at("gpu_instance_id"));
        assert!(!at("temperature_c") && !at("node") && !at("ts") && !at("uuid"));

        let mut rows = gputel_schemas::NodeRows::default();
        rows.push(
            "n1",
            &gputel_proto::NodeSample {
                ts_us: T0,
                ..Default::default()
            },
        );
        let node = RecordBatch::try_new(Table::Node.schema(), rows.finish()).unwrap();
        let null = null_columns(Table::Node, &encode(Table::Node, &node));
        assert!(!null[Table::Node.schema().index_of("jobs").unwrap()]);
    }

    fn decoded(table: Table, name: &str, bytes: Bytes) -> Option<Vec<RecordBatch>> {
        let mut batches = Vec::new();
        decode(table, name, bytes, |b| {
            batches.push(b);
            Ok(())
        })
        .unwrap()
        .then_some(batches)
    }

    /// Files written before the schema grew are read into it for
    /// compaction: an event file from before node events (`gpu` and `uuid`
    /// not nullable), an alert file from before `reason` (null there); a
    /// file with a nullable column the table requires is not.
    #[test]
    fn files_written_before_the_schema_grew_are_read() {
        use arrow_schema::{Field, Schema};
        use parquet::arrow::ArrowWriter;

        let encode = |schema: Arc<Schema>, batch: &RecordBatch| {
            let batch = RecordBatch::try_new(schema.clone(), batch.columns().to_vec()).unwrap();
            let mut bytes = Vec::new();
            let mut writer = ArrowWriter::try_new(&mut bytes, schema, None).unwrap();
            writer.write(&batch).unwrap();
            writer.close().unwrap();
            Bytes::from(bytes)
        };
        let xid = GpuEvent {
            ts_us: T0,
            gpu: 3,
            uuid: "GPU-3".into(),
            kind: EventKind::Xid as i32,
            code: 79,
            ..Default::default()
        };
        let mut rows = EventRows::default();
        rows.push("n1", &EventSource::Gpu(&xid));
        let batch = RecordBatch::try_new(Table::Event.schema(), rows.finish()).unwrap();
        let narrowed = |field: &Field| match field.name().as_str() {
            "gpu" | "uuid" => field.clone().with_nullable(false),
            _ => field.clone(),
        };
        let older: Vec<Field> = Table::Event
            .schema()
            .fields()
            .iter()
            .map(|f| narrowed(f))
            .collect();
        let read = decoded(
            Table::Event,
            "older.parquet",
            encode(Arc::new(Schema::new(older)), &batch),
        )
        .expect("an older event file is read");
        assert_eq!(read.iter().map(RecordBatch::num_rows).sum::<usize>(), 1);
        assert_eq!(read[0].schema(), Table::Event.schema());

        // An alert file from before the `reason` column: read, reason null.
        let alert = gputel_proto::AlertRow {
            ts_us: T0,
            node: "n1".into(),
            gpu: Some(1),
            rule: "GpuHot".into(),
            severity: "critical".into(),
            status: "resolved".into(),
            metric: "temperature_c".into(),
            starts_at_us: T0 - S,
            ..Default::default()
        };
        let mut alert_rows = gputel_schemas::AlertRows::default();
        alert_rows.push("n1", &alert);
        let alert_batch = RecordBatch::try_new(Table::Alert.schema(), alert_rows.finish()).unwrap();
        let schema = Table::Alert.schema();
        let before_reason = Arc::new(Schema::new(
            schema.fields()[..schema.fields().len() - 1].to_vec(),
        ));
        let columns = alert_batch.columns()[..schema.fields().len() - 1].to_vec();
        let older = RecordBatch::try_new(before_reason.clone(), columns).unwrap();
        let read = decoded(Table::Alert, "alert.parquet", encode(before_reason, &older))
            .expect("an alert file from before `reason` is read");
        assert_eq!(read[0].schema(), Table::Alert.schema());
        let reason = read[0].column_by_name("reason").unwrap();
        assert_eq!((reason.len(), reason.null_count()), (1, 1));

        // The other way round (a nullable column the table requires) is not.
        let mut gpu_rows = GpuRows::default();
        gpu_rows.push("n1", &gpu(0, T0, None, 40));
        let gpu_batch = RecordBatch::try_new(Table::Gpu.schema(), gpu_rows.finish()).unwrap();
        let widened: Vec<Field> = Table::Gpu
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        let bytes = encode(Arc::new(Schema::new(widened)), &gpu_batch);
        assert!(decoded(Table::Gpu, "wider.parquet", bytes).is_none());
    }
}
