//! Reading the files of an hour and merging them into one sorted file.

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

/// The batches of one file, or None when its schema is not the table's.
pub(super) fn decode(
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
pub(super) fn merge(
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
pub(super) async fn merge_off_runtime(
    table: Table,
    hour: &str,
    group: Vec<RecordBatch>,
    stems: Vec<String>,
) -> Result<Output, CompactError> {
    let hour = hour.to_owned();
    off_runtime(move || merge(table, &hour, group, &stems)).await
}
