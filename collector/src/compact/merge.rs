//! Reading the files of an hour and merging them into one sorted file.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::TimestampMicrosecondType;
use arrow_array::{Array, BooleanArray, UInt32Array};
use arrow_ord::ord::{DynComparator, make_comparator};
use arrow_ord::sort::{SortColumn, lexsort_to_indices};
use arrow_schema::{Schema, SortOptions};
use arrow_select::filter::filter_record_batch;
use arrow_select::take::take_record_batch;
use gputel_schemas::RowKey;

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

/// The rows of one file by its footer, or None when its schema is not the
/// table's.
pub(super) fn rows_of(
    table: Table,
    name: &str,
    bytes: Bytes,
) -> Result<Option<usize>, CompactError> {
    Ok(reader_of(table, name, bytes)?
        .map(|builder| usize::try_from(builder.metadata().file_metadata().num_rows()).unwrap_or(0)))
}

/// The batches of one file, or None when its schema is not the table's.
/// With `slice`, only its rows in that part of the hour.
pub(super) fn decode(
    table: Table,
    name: &str,
    bytes: Bytes,
    slice: Option<Slice>,
) -> Result<Option<Vec<RecordBatch>>, CompactError> {
    let err = |source| CompactError::Decode {
        path: name.to_owned(),
        source,
    };
    let Some(builder) = reader_of(table, name, bytes)? else {
        return Ok(None);
    };
    let expected = table.schema();
    let written = builder.schema().fields().len();
    // Only the row groups whose times can fall in the slice: a file flushed
    // by a serving collector spans its flush interval, so each part of a
    // large hour decodes about its own share of the files, not all of them.
    let builder = match slice {
        Some(slice) => {
            let groups = slice.row_groups_of(builder.metadata(), builder.parquet_schema());
            builder.with_row_groups(groups)
        }
        None => builder,
    };
    let reader = builder.with_batch_size(64 * 1024).build().map_err(err)?;
    let mut batches = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| err(ParquetError::ArrowError(e.to_string())))?;
        // The table's own schema (with its field metadata) for concatenation,
        // columns added since the file was written null.
        let mut columns = batch.columns().to_vec();
        for added in &expected.fields()[written..] {
            columns.push(arrow_array::new_null_array(
                added.data_type(),
                batch.num_rows(),
            ));
        }
        let batch = RecordBatch::try_new(expected.clone(), columns)
            .and_then(|batch| match slice {
                Some(slice) => slice.rows_of(&batch),
                None => Ok(batch),
            })
            .map_err(|e| err(ParquetError::ArrowError(e.to_string())))?;
        batches.push(batch);
    }
    Ok(Some(batches))
}

/// One of `count` equal parts of the hour, by each row's `ts`. An hour with
/// more rows than one compacted file may hold is merged part by part: every
/// table's row key holds `ts`, so rows with one key always fall in one part
/// and every duplicate is removed, however many files the hour becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slice {
    pub index: usize,
    pub count: usize,
}

impl Slice {
    const HOUR_US: i64 = 3_600_000_000;

    /// The part of the hour `ts_us` falls in.
    fn of(ts_us: i64, count: usize) -> usize {
        let into_hour = ts_us.rem_euclid(Self::HOUR_US) as i128;
        (into_hour * count as i128 / Self::HOUR_US as i128) as usize
    }

    /// The row groups of a file that may hold rows of this part: those
    /// whose `ts` statistics overlap it, and those without statistics.
    fn row_groups_of(
        self,
        metadata: &parquet::file::metadata::ParquetMetaData,
        schema: &parquet::schema::types::SchemaDescriptor,
    ) -> Vec<usize> {
        let ts = schema
            .columns()
            .iter()
            .position(|c| c.path().parts() == [gputel_schemas::col::TS]);
        (0..metadata.num_row_groups())
            .filter(|&i| {
                let stats = ts.and_then(|ts| metadata.row_group(i).column(ts).statistics());
                let Some(parquet::file::statistics::Statistics::Int64(v)) = stats else {
                    return true;
                };
                let (Some(&min), Some(&max)) = (v.min_opt(), v.max_opt()) else {
                    return true;
                };
                (Self::of(min, self.count)..=Self::of(max, self.count)).contains(&self.index)
                    // A group reaching into another hour (never written so)
                    // is read whole.
                    || max - min >= Self::HOUR_US
            })
            .collect()
    }

    fn rows_of(self, batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
        let ts = batch
            .column_by_name(gputel_schemas::col::TS)
            .and_then(|c| c.as_primitive_opt::<TimestampMicrosecondType>())
            .ok_or_else(|| ArrowError::SchemaError("no microsecond ts column".into()))?;
        let mask: BooleanArray = ts
            .iter()
            .map(|ts| Some(ts.map_or(0, |ts| Self::of(ts, self.count)) == self.index))
            .collect();
        filter_record_batch(batch, &mask)
    }
}

/// Merges a group of files' rows into one sorted, encoded file.
pub(super) fn merge(
    table: Table,
    hour: &str,
    group: Vec<RecordBatch>,
    stems: &[String],
    slice: Option<Slice>,
) -> Result<Output, CompactError> {
    let merge_err = |source| CompactError::Merge {
        hour: hour.to_owned(),
        source,
    };
    let schema = table.schema();
    let all = arrow_select::concat::concat_batches(&schema, group.iter()).map_err(merge_err)?;
    drop(group);
    let (sorted, duplicates) = sort_unique(table, &all).map_err(merge_err)?;
    drop(all);
    let name = format!("{hour}/compacted");
    let bytes = encode_with(
        schema,
        compacted_properties(table, sorted.num_rows()),
        &sorted,
    )
    .map_err(|source| PersistError::Encode { path: name, source })?;
    let mut named = stems.join("/");
    if let Some(Slice { index, count }) = slice {
        named.push_str(&format!("#{index}/{count}"));
    }
    let stem = format!(
        "{COMPACTED_PREFIX}{:016x}",
        XxHash64::oneshot(0, named.as_bytes())
    );
    Ok(Output {
        stem,
        bytes,
        duplicates,
    })
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

/// Sorts the rows of `batch` by the table's sort key and keeps one row per
/// row key: the last one in `batch`, which holds the merged files in name
/// order, so the row of the file whose name sorts last wins, the same one
/// in every run. The rows stay sorted by the sort key.
pub(super) fn sort_unique(
    table: Table,
    batch: &RecordBatch,
) -> Result<(RecordBatch, Duplicates), ArrowError> {
    let rows = u32::try_from(batch.num_rows()).map_err(|_| {
        ArrowError::ComputeError(format!("{} rows are too many to sort", batch.num_rows()))
    })?;
    let schema = batch.schema();
    let key = key_columns(table, &schema)?;
    // The position breaks ties, so that equal keys are in batch order.
    let mut sort_columns: Vec<SortColumn> = key
        .iter()
        .map(|&i| SortColumn {
            values: Arc::clone(batch.column(i)),
            options: None,
        })
        .collect();
    sort_columns.push(SortColumn {
        values: Arc::new(UInt32Array::from_iter_values(0..rows)),
        options: None,
    });
    let sorted = lexsort_to_indices(&sort_columns, None)?;
    drop(sort_columns);
    let order = sorted.values();

    let comparators = |columns: &mut dyn Iterator<Item = usize>| {
        columns
            .map(|i| {
                let column: &dyn Array = batch.column(i).as_ref();
                make_comparator(column, column, SortOptions::default())
            })
            .collect::<Result<Vec<DynComparator>, ArrowError>>()
    };
    let same = |compare: &[DynComparator], a: u32, b: u32| {
        compare.iter().all(|c| c(a as usize, b as usize).is_eq())
    };
    let by_key = comparators(&mut key.iter().copied())?;
    // The other columns, compared only when a key repeats.
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
                None => by_value.insert(comparators(
                    &mut (0..schema.fields().len()).filter(|i| !key.contains(i)),
                )?),
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
    drop(sorted);
    let unique = take_record_batch(batch, &UInt32Array::from(keep))?;
    Ok((unique, duplicates))
}

/// [`merge`] on the blocking threads: sorting and encoding up to
/// [`MAX_COMPACTED_FILE_ROWS`] rows takes seconds.
pub(super) async fn merge_off_runtime(
    table: Table,
    hour: &str,
    group: Vec<RecordBatch>,
    stems: Vec<String>,
    slice: Option<Slice>,
) -> Result<Output, CompactError> {
    let hour = hour.to_owned();
    off_runtime(move || merge(table, &hour, group, &stems, slice)).await
}

#[cfg(test)]
mod tests {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Int32Type, Int64Type, TimestampMicrosecondType};
    use gputel_proto::{EventKind, GpuEvent, GpuSample};
    use gputel_schemas::{EventRows, EventSource, GpuRows};

    use super::*;

    const T0: i64 = 1_795_240_800_000_000;
    const S: i64 = 1_000_000;

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

        let (unique, duplicates) = sort_unique(Table::Gpu, &batch).unwrap();
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
        let (unique, duplicates) = sort_unique(Table::Event, &batch).unwrap();
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

    /// Files written before the schema grew are read into it for
    /// compaction: an event file from before node events (`gpu` and `uuid`
    /// not nullable), an alert file from before `reason` (null there); a
    /// file with a nullable column the table requires is not.
    /// A part of a sliced hour decodes only the row groups whose times can
    /// fall in it, and still gets every one of its rows.
    #[test]
    fn a_slice_reads_only_the_row_groups_of_its_part_of_the_hour() {
        use parquet::arrow::ArrowWriter;
        use parquet::file::properties::WriterProperties;

        // The hour of T0, in four quarters; one row group per quarter-hour
        // minute, as four 10 s flushes would be, and a fifth spanning two
        // quarters.
        let hour_start = T0 - T0.rem_euclid(Slice::HOUR_US);
        let quarter = Slice::HOUR_US / 4;
        let groups: [&[i64]; 5] = [
            &[hour_start, hour_start + 10 * S],
            &[hour_start + quarter + S],
            &[hour_start + 2 * quarter + 5 * S],
            &[hour_start + 3 * quarter + 9 * S],
            &[hour_start + quarter - S, hour_start + quarter],
        ];
        let mut bytes = Vec::new();
        let props = WriterProperties::builder().build();
        let mut writer =
            ArrowWriter::try_new(&mut bytes, Table::Gpu.schema(), Some(props)).unwrap();
        for times in groups {
            let mut rows = GpuRows::default();
            for &ts in times {
                rows.push("n1", &gpu(0, ts, None, 40));
            }
            let batch = RecordBatch::try_new(Table::Gpu.schema(), rows.finish()).unwrap();
            writer.write(&batch).unwrap();
            writer.flush().unwrap();
        }
        writer.close().unwrap();
        let bytes = Bytes::from(bytes);

        let builder = ParquetRecordBatchReaderBuilder::try_new(bytes.clone()).unwrap();
        assert_eq!(builder.metadata().num_row_groups(), 5);
        let groups_of = |index| {
            Slice { index, count: 4 }.row_groups_of(builder.metadata(), builder.parquet_schema())
        };
        assert_eq!(
            (0..4).map(groups_of).collect::<Vec<_>>(),
            [vec![0, 4], vec![1, 4], vec![2], vec![3]]
        );
        // Every row lands in exactly one part, whatever groups were skipped.
        let mut per_part = Vec::new();
        for index in 0..4 {
            let read = decode(
                Table::Gpu,
                "f.parquet",
                bytes.clone(),
                Some(Slice { index, count: 4 }),
            )
            .unwrap()
            .expect("the table's schema");
            per_part.push(read.iter().map(RecordBatch::num_rows).sum::<usize>());
        }
        assert_eq!(per_part, [3, 2, 1, 1]);
    }

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
        let read = decode(
            Table::Event,
            "older.parquet",
            encode(Arc::new(Schema::new(older)), &batch),
            None,
        )
        .unwrap()
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
        let read = decode(
            Table::Alert,
            "alert.parquet",
            encode(before_reason, &older),
            None,
        )
        .unwrap()
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
        assert!(
            decode(Table::Gpu, "wider.parquet", bytes, None)
                .unwrap()
                .is_none()
        );
    }
}
