//! A table of the store read hour by hour, each device's rows in time order,
//! each row with its time weight: the rule of the job report and of the
//! `*_weighted` views (schemas/sql/views.sql). A row stands for the gap to its
//! device's next row, at most 3 × the device's median gap; the device's last
//! row for its median gap; a device seen once for its node's sampling
//! interval (the most common gap between the node's `node` rows), or for
//! nothing when the table has no such fallback.
//!
//! The median is over the device's whole series, so a table is read twice:
//! once for the devices' times only (the gaps), then with the columns the
//! figures need. Every file gputel writes is sorted by node, so an hour's
//! files are merged node by node, a batch of each at a time, and only a few
//! nodes' rows ([`CHUNK_ROWS`]) are sorted by device and time at once: the
//! rows of a compacted hour (one file) are never all in memory. Each open
//! file holds its current row group as fetched, so an hour of many flush
//! files costs about its compressed bytes of the columns read, until
//! compaction makes it one file. A file that does not say it is sorted
//! (another writer's) is read whole and sorted by node first.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType,
};
use arrow_array::{
    Array, DictionaryArray, Float32Array, Float64Array, Int32Array, Int64Array, RecordBatch,
    StringArray, TimestampMicrosecondArray,
};
use arrow_schema::{DataType, TimeUnit};
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use gputel_schemas::{PartitionKey, PartitionPath};
use object_store::{ObjectMeta, ObjectStore};

use super::super::ReportError;
use super::super::read::{ReadStats, RowStream, list, stream_rows};
use crate::report::summary::MAX_WEIGHT_INTERVALS;

/// Which rows a report looks at: hours that overlap, then rows within.
#[derive(Debug, Clone, Copy, Default)]
pub struct Window {
    pub from_us: Option<i64>,
    pub to_us: Option<i64>,
}

impl Window {
    pub fn covers_hour(&self, hour: PartitionKey) -> bool {
        let Some(start) = hour
            .date()
            .and_hms_opt(u32::from(hour.hour()), 0, 0)
            .map(|t| t.and_utc().timestamp_micros())
        else {
            return false;
        };
        let end = start + 3_600_000_000;
        self.from_us.is_none_or(|from| end > from) && self.to_us.is_none_or(|to| start <= to)
    }

    pub fn holds(&self, ts_us: i64) -> bool {
        self.from_us.is_none_or(|from| ts_us >= from) && self.to_us.is_none_or(|to| ts_us <= to)
    }
}

/// The files of a table by hour, in time order, within `window`.
pub async fn hours(
    store: &dyn ObjectStore,
    table: &str,
    window: Window,
) -> Result<BTreeMap<PartitionKey, Vec<ObjectMeta>>, ReportError> {
    let mut hours: BTreeMap<PartitionKey, Vec<ObjectMeta>> = BTreeMap::new();
    for file in list(store, table).await? {
        if !file.location.as_ref().ends_with(".parquet") {
            continue;
        }
        let Ok(path) = PartitionPath::parse(file.location.as_ref()) else {
            continue;
        };
        if window.covers_hour(path.key()) {
            hours.entry(path.key()).or_default().push(file);
        }
    }
    // In name order, whatever order the store lists them in: the sums (and
    // so the last digits of every figure) do not depend on the listing.
    for files in hours.values_mut() {
        files.sort_by(|a, b| a.location.cmp(&b.location));
    }
    Ok(hours)
}

/// Interned strings (node names, HCA names, job ids): a row's key is numbers.
#[derive(Debug, Default)]
pub struct Names {
    ids: HashMap<String, u32>,
    names: Vec<String>,
}

impl Names {
    pub fn id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        self.ids.insert(name.to_owned(), id);
        self.names.push(name.to_owned());
        id
    }

    pub fn get(&self, name: &str) -> Option<u32> {
        self.ids.get(name).copied()
    }

    pub fn name(&self, id: u32) -> &str {
        self.names.get(id as usize).map_or("", String::as_str)
    }
}

/// One column of a batch, typed once per batch.
pub enum Col {
    Missing,
    I32(Int32Array),
    I64(Int64Array),
    F32(Float32Array),
    F64(Float64Array),
    Ts(TimestampMicrosecondArray),
    Str(StringArray),
    Dict(DictionaryArray<Int32Type>, StringArray),
}

impl Col {
    pub fn of(batch: &RecordBatch, name: &str) -> Col {
        let Some(column) = batch.column_by_name(name) else {
            return Col::Missing;
        };
        match column.data_type() {
            DataType::Int32 => Col::I32(column.as_primitive::<Int32Type>().clone()),
            DataType::Int64 => Col::I64(column.as_primitive::<Int64Type>().clone()),
            DataType::Float32 => Col::F32(column.as_primitive::<Float32Type>().clone()),
            DataType::Float64 => Col::F64(column.as_primitive::<Float64Type>().clone()),
            DataType::Timestamp(TimeUnit::Microsecond, _) => {
                Col::Ts(column.as_primitive::<TimestampMicrosecondType>().clone())
            }
            DataType::Utf8 => Col::Str(column.as_string::<i32>().clone()),
            DataType::Dictionary(_, _) => match column.as_dictionary_opt::<Int32Type>() {
                Some(dict) => match dict.values().as_string_opt::<i32>() {
                    Some(values) => Col::Dict(dict.clone(), values.clone()),
                    None => Col::Missing,
                },
                None => Col::Missing,
            },
            _ => Col::Missing,
        }
    }

    /// An integer (or µs timestamp) value.
    pub fn int(&self, row: usize) -> Option<i64> {
        match self {
            Col::I32(a) => a.is_valid(row).then(|| a.value(row).into()),
            Col::I64(a) => a.is_valid(row).then(|| a.value(row)),
            Col::Ts(a) => a.is_valid(row).then(|| a.value(row)),
            _ => None,
        }
    }

    /// A counter's value: an integer that cannot be negative.
    pub fn counter(&self, row: usize) -> Option<u64> {
        self.int(row).and_then(|v| u64::try_from(v).ok())
    }

    /// A number as a float.
    pub fn num(&self, row: usize) -> Option<f64> {
        match self {
            Col::F32(a) => a.is_valid(row).then(|| a.value(row).into()),
            Col::F64(a) => a.is_valid(row).then(|| a.value(row)),
            _ => self.int(row).map(|v| v as f64),
        }
    }

    pub fn text(&self, row: usize) -> Option<&str> {
        match self {
            Col::Str(a) => a.is_valid(row).then(|| a.value(row)),
            Col::Dict(dict, values) => {
                if !dict.is_valid(row) {
                    return None;
                }
                let key = usize::try_from(dict.keys().value(row)).ok()?;
                (key < values.len() && values.is_valid(key)).then(|| values.value(key))
            }
            _ => None,
        }
    }
}

/// A batch with its columns typed, in the order they were asked for.
pub struct Batch {
    cols: Vec<Col>,
    rows: usize,
}

impl Batch {
    fn new(batch: &RecordBatch, names: &[&str]) -> Batch {
        Batch {
            cols: names.iter().map(|n| Col::of(batch, n)).collect(),
            rows: batch.num_rows(),
        }
    }

    pub fn col(&self, i: usize) -> &Col {
        &self.cols[i]
    }
}

/// What identifies a device in a table: `node`, then up to three more
/// columns (integers, or strings interned into numbers).
#[derive(Debug, Clone, Copy)]
pub struct DeviceSpec {
    pub parts: &'static [&'static str],
    /// Whether a device seen once weighs its node's sampling interval
    /// (`gpu`, `ib`) or nothing (`node`, like the node_weighted view).
    pub node_fallback: bool,
}

pub const GPU: DeviceSpec = DeviceSpec {
    parts: &["gpu", "gpu_instance_id", "compute_instance_id"],
    node_fallback: true,
};
pub const NODE: DeviceSpec = DeviceSpec {
    parts: &[],
    node_fallback: false,
};
pub const IB: DeviceSpec = DeviceSpec {
    parts: &["device", "port"],
    node_fallback: true,
};

/// A device's key: its node's id and its other key columns (None: null).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub node: u32,
    pub parts: [Option<i64>; 3],
}

/// The devices of a table and what pass 1 learnt of them.
#[derive(Debug, Default)]
pub struct Devices {
    index: HashMap<Key, u32>,
    pub keys: Vec<Key>,
    /// Each device's gaps between consecutive rows, µs → how many (agents
    /// tick on multiples of their interval, so a device has few distinct gaps).
    gaps: Vec<BTreeMap<i64, u64>>,
    last_ts: Vec<Option<i64>>,
    /// Each device's median gap (None: seen once), after [`Devices::finish`].
    pub median_us: Vec<Option<i64>>,
}

impl Devices {
    fn device(&mut self, key: Key) -> u32 {
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        let i = u32::try_from(self.keys.len()).unwrap_or(u32::MAX);
        self.index.insert(key, i);
        self.keys.push(key);
        self.gaps.push(BTreeMap::new());
        self.last_ts.push(None);
        i
    }

    fn finish(&mut self) {
        self.median_us = self.gaps.iter().map(median).collect();
        self.gaps = Vec::new();
        self.last_ts = Vec::new();
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// The most common gap of each node's devices (the node table's
    /// devices are its nodes: this is the `sample_interval` view); ties go
    /// to the shorter gap.
    pub fn mode_by_node(gaps: &[BTreeMap<i64, u64>], keys: &[Key]) -> HashMap<u32, i64> {
        let mut out = HashMap::new();
        for (key, gaps) in keys.iter().zip(gaps) {
            let best = gaps
                .iter()
                .filter(|(gap, _)| **gap > 0)
                .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)));
            if let Some((&gap, _)) = best {
                out.insert(key.node, gap);
            }
        }
        out
    }
}

/// The lower middle of the gaps (as the job report's median_gap_us).
fn median(gaps: &BTreeMap<i64, u64>) -> Option<i64> {
    let n: u64 = gaps.values().sum();
    if n == 0 {
        return None;
    }
    let want = (n - 1) / 2;
    let mut seen = 0;
    for (&gap, &count) in gaps {
        seen += count;
        if seen > want {
            return Some(gap);
        }
    }
    None
}

/// A table's reader: its hours, its devices, and the columns asked of it.
pub struct Scan<'a> {
    pub store: &'a Arc<dyn ObjectStore>,
    pub spec: DeviceSpec,
    pub hours: &'a BTreeMap<PartitionKey, Vec<ObjectMeta>>,
    pub window: Window,
}

/// One row handed to a visitor: its device, time, weight and batch.
pub struct Row<'b> {
    pub device: u32,
    pub key: Key,
    pub ts_us: i64,
    pub weight_us: i64,
    pub batch: &'b Batch,
    pub row: usize,
}

/// Rows of one or more whole nodes of an hour, sorted by device and time.
#[derive(Default)]
struct Chunk {
    batches: Vec<Arc<Batch>>,
    /// (device, ts, batch, row)
    order: Vec<(u32, i64, u32, u32)>,
}

/// Rows a chunk gathers (whole nodes) before it is sorted and handed on.
pub const CHUNK_ROWS: usize = 1 << 16;
/// Rows decoded at a time over all of an hour's files together.
const HOUR_BATCH_ROWS: usize = 1 << 16;
/// A row's node when it has none.
const NO_NODE: u32 = u32::MAX;

/// One file of an hour, read a batch at a time, node by node.
struct Source {
    path: String,
    batches: BoxStream<'static, Result<RecordBatch, ReportError>>,
    /// The batch in hand, each row's node id, and the next row.
    current: Option<(Arc<Batch>, Vec<u32>)>,
    at: usize,
    /// The node taken last: the next must sort after it.
    last: Option<u32>,
}

impl Source {
    /// The next row's node, reading the next batch when this one is done.
    async fn peek(
        &mut self,
        columns: &[&str],
        names: &mut Names,
    ) -> Result<Option<u32>, ReportError> {
        loop {
            if let Some((_, nodes)) = &self.current {
                while self.at < nodes.len() && nodes[self.at] == NO_NODE {
                    self.at += 1;
                }
                if let Some(&node) = nodes.get(self.at) {
                    return Ok(Some(node));
                }
            }
            let Some(batch) = self.batches.next().await else {
                self.current = None;
                return Ok(None);
            };
            let batch = Batch::new(&batch?, columns);
            let nodes = node_ids(&batch, names);
            self.current = Some((Arc::new(batch), nodes));
            self.at = 0;
        }
    }

    /// The rows of `node` at the head of the batch in hand (after a
    /// [`Source::peek`] that said `node`).
    fn take(
        &mut self,
        node: u32,
        names: &Names,
    ) -> Result<(Arc<Batch>, Range<usize>), ReportError> {
        if let Some(last) = self.last.filter(|&l| l != node)
            && names.name(node) < names.name(last)
        {
            return Err(ReportError::Unsorted {
                path: self.path.clone(),
                node: names.name(node).to_owned(),
                after: names.name(last).to_owned(),
            });
        }
        self.last = Some(node);
        let (batch, nodes) = self.current.as_ref().expect("peeked");
        let start = self.at;
        while self.at < nodes.len() && nodes[self.at] == node {
            self.at += 1;
        }
        Ok((Arc::clone(batch), start..self.at))
    }
}

/// Each row's node id (NO_NODE: null); a dictionary's values are interned
/// once per batch.
fn node_ids(batch: &Batch, names: &mut Names) -> Vec<u32> {
    let node = batch.col(0);
    match node {
        Col::Dict(dict, values) => {
            let ids: Vec<u32> = (0..values.len())
                .map(|i| names.id(values.value(i)))
                .collect();
            (0..batch.rows)
                .map(|row| {
                    dict.is_valid(row)
                        .then(|| usize::try_from(dict.keys().value(row)).ok())
                        .flatten()
                        .and_then(|k| ids.get(k).copied())
                        .unwrap_or(NO_NODE)
                })
                .collect()
        }
        _ => (0..batch.rows)
            .map(|row| node.text(row).map_or(NO_NODE, |n| names.id(n)))
            .collect(),
    }
}

/// An hour's files merged node by node, in name order.
struct HourReader {
    columns: Vec<&'static str>,
    sources: Vec<Source>,
}

impl HourReader {
    /// The next few whole nodes' rows within the window, sorted by device and
    /// time; None when every file is done.
    async fn next_chunk(
        &mut self,
        scan: &Scan<'_>,
        names: &mut Names,
        devices: &mut Devices,
    ) -> Result<Option<Chunk>, ReportError> {
        let parts = scan.spec.parts.len();
        let mut chunk = Chunk::default();
        let mut done = false;
        // Rows taken, in the window or not: what the chunk's batches hold.
        let mut taken = 0;
        while taken < CHUNK_ROWS {
            // The node of every file's next row that sorts first.
            let mut next: Option<u32> = None;
            for source in &mut self.sources {
                if let Some(node) = source.peek(&self.columns, names).await?
                    && next.is_none_or(|n| names.name(node) < names.name(n))
                {
                    next = Some(node);
                }
            }
            let Some(node) = next else {
                done = true;
                break;
            };
            for source in &mut self.sources {
                while source.peek(&self.columns, names).await? == Some(node) {
                    let (batch, rows) = source.take(node, names)?;
                    taken += rows.len();
                    if !chunk.batches.last().is_some_and(|b| Arc::ptr_eq(b, &batch)) {
                        chunk.batches.push(batch);
                    }
                    let b = chunk.batches.len() - 1;
                    let batch = &chunk.batches[b];
                    let ts = batch.col(parts + 1);
                    for row in rows {
                        let Some(ts_us) = ts.int(row) else { continue };
                        if !scan.window.holds(ts_us) {
                            continue;
                        }
                        let mut key = Key {
                            node,
                            parts: [None; 3],
                        };
                        for p in 0..parts {
                            let col = batch.col(p + 1);
                            key.parts[p] = match col {
                                Col::Str(_) | Col::Dict(..) => {
                                    col.text(row).map(|t| names.id(t).into())
                                }
                                _ => col.int(row),
                            };
                        }
                        chunk.order.push((
                            devices.device(key),
                            ts_us,
                            u32::try_from(b).unwrap_or(u32::MAX),
                            u32::try_from(row).unwrap_or(u32::MAX),
                        ));
                    }
                }
            }
        }
        if done && chunk.order.is_empty() {
            return Ok(None);
        }
        chunk.order.sort_unstable();
        Ok(Some(chunk))
    }
}

impl Scan<'_> {
    /// The columns read for the keys: node, the spec's parts, ts.
    fn key_columns(&self) -> Vec<&'static str> {
        let mut columns = vec!["node"];
        columns.extend(self.spec.parts);
        columns.push("ts");
        columns
    }

    /// Opens an hour's files (a few at a time: S3 answers each request in
    /// tens of milliseconds) for the key columns and `extra`.
    async fn hour(
        &self,
        files: &[ObjectMeta],
        extra: &[&'static str],
        stats: &mut ReadStats,
    ) -> Result<HourReader, ReportError> {
        const AT_ONCE: usize = 8;
        let mut columns = self.key_columns();
        columns.extend(extra);
        let batch_size = (HOUR_BATCH_ROWS / files.len().max(1)).clamp(256, 8192);
        let opened: Vec<RowStream> = futures::stream::iter(files.iter().cloned())
            .map(|file| {
                let store = Arc::clone(self.store);
                let columns = columns.clone();
                async move { stream_rows(store, &file, &columns, batch_size).await }
            })
            .buffered(AT_ONCE)
            .try_collect()
            .await?;
        let mut sources = Vec::with_capacity(opened.len());
        for (file, stream) in files.iter().zip(opened) {
            stats.add_file(file.size, stream.row_groups, stream.row_groups);
            let batches = if stream.sorted_by_node {
                stream.batches
            } else {
                sorted_by_node(&stream.path, stream.batches).await?
            };
            sources.push(Source {
                path: stream.path,
                batches,
                current: None,
                at: 0,
                last: None,
            });
        }
        Ok(HourReader { columns, sources })
    }

    /// Pass 1: the devices and their median gaps; with them, each node's
    /// most common gap when `modes` is asked (the node table).
    pub async fn devices(
        &self,
        names: &mut Names,
        stats: &mut ReadStats,
        modes: bool,
    ) -> Result<(Devices, HashMap<u32, i64>), ReportError> {
        let mut devices = Devices::default();
        for files in self.hours.values() {
            let mut hour = self.hour(files, &[], stats).await?;
            while let Some(chunk) = hour.next_chunk(self, names, &mut devices).await? {
                for &(device, ts_us, _, _) in &chunk.order {
                    let d = device as usize;
                    if let Some(last) = devices.last_ts[d] {
                        *devices.gaps[d].entry(ts_us - last).or_default() += 1;
                    }
                    devices.last_ts[d] = Some(ts_us);
                }
            }
        }
        let modes = if modes {
            Devices::mode_by_node(&devices.gaps, &devices.keys)
        } else {
            HashMap::new()
        };
        devices.finish();
        Ok((devices, modes))
    }

    /// Pass 2: every row of `devices` with its weight and the `columns`
    /// asked for (in that order, after the key columns: [`Scan::first`]),
    /// device by device within an hour, hours in order. `intervals` is each
    /// node's sampling interval, for devices seen once.
    pub async fn weighted(
        &self,
        columns: &[&'static str],
        names: &mut Names,
        devices: &mut Devices,
        intervals: &HashMap<u32, i64>,
        stats: &mut ReadStats,
        mut visit: impl FnMut(Row<'_>),
    ) -> Result<(), ReportError> {
        // Each device's row waiting for the next one's time: in the chunk's
        // batches, or, copied out of them, in a batch of the chunk's last rows.
        enum Pending {
            Here(i64, u32, u32),
            Kept(i64, Arc<Batch>, u32),
        }
        let cap = |devices: &Devices, d: usize| {
            devices.median_us.get(d).copied().flatten().map(|m| {
                // As the views: least(gap, 3 * median) in whole µs.
                (m as f64 * MAX_WEIGHT_INTERVALS) as i64
            })
        };
        let mut pending: Vec<Option<Pending>> = Vec::new();
        for files in self.hours.values() {
            let mut hour = self.hour(files, columns, stats).await?;
            while let Some(chunk) = hour.next_chunk(self, names, devices).await? {
                pending.resize_with(devices.len(), || None);
                for &(device, ts_us, b, row) in &chunk.order {
                    let d = device as usize;
                    if let Some(previous) = pending[d].take() {
                        let (prev_ts, batch, prev_row) = match &previous {
                            Pending::Here(t, b, r) => {
                                (*t, &*chunk.batches[*b as usize], *r as usize)
                            }
                            Pending::Kept(t, batch, r) => (*t, &**batch, *r as usize),
                        };
                        let gap = ts_us - prev_ts;
                        let weight_us = cap(devices, d).map_or(gap, |c| gap.min(c));
                        visit(Row {
                            device,
                            key: devices.keys[d],
                            ts_us: prev_ts,
                            weight_us,
                            batch,
                            row: prev_row,
                        });
                    }
                    pending[d] = Some(Pending::Here(ts_us, b, row));
                }
                // The chunk's devices' last rows are copied out of its batches,
                // which are dropped: the devices' next rows are in a later hour.
                let mut waiting = Vec::new();
                for &(device, ..) in &chunk.order {
                    if let Some(Pending::Here(ts, b, row)) = pending[device as usize] {
                        waiting.push((device, ts, (b, row)));
                        pending[device as usize] = None;
                    }
                }
                let rows: Vec<(u32, u32)> = waiting.iter().map(|w| w.2).collect();
                let kept = Arc::new(keep_rows(&chunk.batches, &rows));
                for (i, (device, ts, _)) in waiting.into_iter().enumerate() {
                    let i = u32::try_from(i).unwrap_or(u32::MAX);
                    pending[device as usize] = Some(Pending::Kept(ts, Arc::clone(&kept), i));
                }
            }
        }
        // Each device's last row weighs its median gap, or its node's interval.
        for (d, p) in pending.into_iter().enumerate() {
            let Some(Pending::Kept(ts_us, batch, row)) = p else {
                continue;
            };
            let weight = devices.median_us[d].or_else(|| {
                self.spec
                    .node_fallback
                    .then(|| intervals.get(&devices.keys[d].node).copied())
                    .flatten()
            });
            if let Some(weight_us) = weight {
                visit(Row {
                    device: u32::try_from(d).unwrap_or(u32::MAX),
                    key: devices.keys[d],
                    ts_us,
                    weight_us,
                    batch: &batch,
                    row: row as usize,
                });
            }
        }
        Ok(())
    }
}

/// The rows of a file that does not say it is sorted (another writer's,
/// e.g. DuckDB's COPY), read whole and sorted by node: one batch.
async fn sorted_by_node(
    path: &str,
    batches: BoxStream<'static, Result<RecordBatch, ReportError>>,
) -> Result<BoxStream<'static, Result<RecordBatch, ReportError>>, ReportError> {
    let batches: Vec<RecordBatch> = batches.try_collect().await?;
    let Some(first) = batches.first() else {
        return Ok(futures::stream::empty().boxed());
    };
    let unsorted = |source: arrow_schema::ArrowError| ReportError::Decode {
        path: path.to_owned(),
        source: source.into(),
    };
    let whole =
        arrow_select::concat::concat_batches(&first.schema(), &batches).map_err(unsorted)?;
    drop(batches);
    let sorted = match whole.column_by_name("node") {
        Some(node) => {
            let order = arrow_ord::sort::sort_to_indices(node, None, None).map_err(unsorted)?;
            arrow_select::take::take_record_batch(&whole, &order).map_err(unsorted)?
        }
        None => whole,
    };
    Ok(futures::stream::iter([Ok(sorted)]).boxed())
}

/// The rows (batch, row) of `batches` copied into one batch of their own,
/// column by column: a slice would keep its whole batch alive, and every
/// device's last row of an hour would keep its batch until the next hour.
fn keep_rows(batches: &[Arc<Batch>], rows: &[(u32, u32)]) -> Batch {
    let width = batches.first().map_or(0, |b| b.cols.len());
    let cols = (0..width)
        .map(|c| {
            let at = |&(b, r): &(u32, u32)| (batches[b as usize].col(c), r as usize);
            let int = |p| {
                let (col, r) = at(p);
                col.int(r)
            };
            let num = |p| {
                let (col, r) = at(p);
                col.num(r)
            };
            // The column's type: that of the first batch that has it.
            match batches
                .iter()
                .map(|b| b.col(c))
                .find(|col| !matches!(col, Col::Missing))
            {
                None | Some(Col::Missing) => Col::Missing,
                Some(Col::I32(_)) => Col::I32(
                    rows.iter()
                        .map(|p| int(p).and_then(|v| i32::try_from(v).ok()))
                        .collect(),
                ),
                Some(Col::I64(_)) => Col::I64(rows.iter().map(int).collect()),
                Some(Col::Ts(_)) => Col::Ts(rows.iter().map(int).collect()),
                Some(Col::F32(_)) => {
                    Col::F32(rows.iter().map(|p| num(p).map(|v| v as f32)).collect())
                }
                Some(Col::F64(_)) => Col::F64(rows.iter().map(num).collect()),
                Some(Col::Str(_) | Col::Dict(..)) => Col::Str(
                    rows.iter()
                        .map(|p| {
                            let (col, r) = at(p);
                            col.text(r)
                        })
                        .collect(),
                ),
            }
        })
        .collect();
    Batch {
        cols,
        rows: rows.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::builder::StringDictionaryBuilder;
    use arrow_array::{ArrayRef, new_null_array};
    use gputel_schemas::Table;
    use object_store::memory::InMemory;
    use object_store::path::Path as ObjectPath;
    use object_store::{ObjectStoreExt, PutPayload};

    const NODES: usize = 40;
    const GPUS: i32 = 2;
    const SECONDS: i64 = 1800;
    /// 2026-11-02T08:00:00Z.
    const HOUR_US: i64 = 1_793_606_400_000_000;

    /// The utilization a GPU reports at second `s`.
    fn util(node: usize, gpu: i32, s: i64) -> i32 {
        ((node as i64 * 7 + i64::from(gpu) * 13 + s * 3) % 101) as i32
    }

    /// gpu rows of every node and GPU at seconds `s` with `s % 2 == parity`
    /// (None: all), with every other column null, or zero where it may not be.
    fn gpu_rows(parity: Option<i64>) -> RecordBatch {
        let mut rows = Vec::new();
        for node in 0..NODES {
            for gpu in 0..GPUS {
                for s in (0..SECONDS).filter(|s| parity.is_none_or(|p| s % 2 == p)) {
                    rows.push((node, gpu, s));
                }
            }
        }
        let n = rows.len();
        let schema = Table::Gpu.schema();
        let dict = |values: Vec<String>| -> ArrayRef {
            let mut b = StringDictionaryBuilder::<Int32Type>::new();
            for v in values {
                b.append_value(v);
            }
            Arc::new(b.finish())
        };
        let columns: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .map(|f| match f.name().as_str() {
                "ts" => Arc::new(
                    TimestampMicrosecondArray::from_iter_values(
                        rows.iter().map(|r| HOUR_US + r.2 * 1_000_000),
                    )
                    .with_timezone("UTC"),
                ) as ArrayRef,
                "node" => dict(rows.iter().map(|r| format!("n{:02}", r.0)).collect()),
                "uuid" | "model" => dict(vec![String::new(); n]),
                "gpu" => Arc::new(Int32Array::from_iter_values(rows.iter().map(|r| r.1))),
                "gpu_util_pct" => Arc::new(Int32Array::from_iter_values(
                    rows.iter().map(|r| util(r.0, r.1, r.2)),
                )),
                _ if !f.is_nullable() => Arc::new(Int32Array::from(vec![0; n])),
                _ => new_null_array(f.data_type(), n),
            })
            .collect();
        RecordBatch::try_new(schema, columns).expect("gpu rows")
    }

    async fn put(store: &InMemory, name: &str, bytes: bytes::Bytes) {
        let path = ObjectPath::from(format!("gpu/date=2026-11-02/hour=08/{name}.parquet"));
        store
            .put(&path, PutPayload::from(bytes))
            .await
            .expect("put");
    }

    /// gputel's way: sorted by the table's key, which the file declares.
    fn sorted_file(batch: &RecordBatch) -> bytes::Bytes {
        let sorted = crate::persist::sort_rows(Table::Gpu, batch).expect("sort");
        crate::persist::encode(Table::Gpu, Table::Gpu.schema(), &sorted).expect("encode")
    }

    /// Another writer's: rows as given, no sort order declared.
    fn plain_file(batch: &RecordBatch) -> bytes::Bytes {
        let mut out = Vec::new();
        let mut w =
            parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), None).expect("writer");
        w.write(batch).expect("write");
        w.close().expect("close");
        out.into()
    }

    /// Every device's rows in the order the scan hands them over, with
    /// their weights; checks each device's are in time order.
    async fn scan_all(
        store: InMemory,
    ) -> Result<BTreeMap<(String, i64), (u64, f64, f64)>, ReportError> {
        let store: Arc<dyn ObjectStore> = Arc::new(store);
        let window = Window::default();
        let hours = hours(store.as_ref(), "gpu", window).await?;
        let scan = Scan {
            store: &store,
            spec: GPU,
            hours: &hours,
            window,
        };
        let (mut names, mut stats) = (Names::default(), ReadStats::default());
        let (mut devices, _) = scan.devices(&mut names, &mut stats, false).await?;
        let mut last: HashMap<u32, i64> = HashMap::new();
        // Per device: rows, seconds, sum of utilization × seconds.
        let mut out = BTreeMap::new();
        scan.weighted(
            &["gpu_util_pct"],
            &mut names,
            &mut devices,
            &HashMap::new(),
            &mut stats,
            |r| {
                let before = last.insert(r.device, r.ts_us);
                assert!(
                    before.is_none_or(|b| b < r.ts_us),
                    "device {} out of order",
                    r.device
                );
                let w = r.weight_us as f64 / 1e6;
                let e: &mut (u64, f64, f64) = out.entry(r.key).or_default();
                e.0 += 1;
                e.1 += w;
                e.2 += w * r.batch.col(5).num(r.row).expect("util");
            },
        )
        .await?;
        Ok(out
            .into_iter()
            .map(|(k, v): (Key, _)| ((names.name(k.node).to_owned(), k.parts[0].expect("gpu")), v))
            .collect())
    }

    fn expected() -> BTreeMap<(String, i64), (u64, f64, f64)> {
        let mut out = BTreeMap::new();
        for node in 0..NODES {
            for gpu in 0..GPUS {
                // Every second 1 s apart; the last weighs the median gap, 1 s.
                let sum: i64 = (0..SECONDS).map(|s| i64::from(util(node, gpu, s))).sum();
                let key = (format!("n{node:02}"), i64::from(gpu));
                out.insert(key, (SECONDS as u64, SECONDS as f64, sum as f64));
            }
        }
        out
    }

    #[test]
    fn kept_rows_hold_their_values_not_their_batches() {
        let columns = ["node", "gpu", "ts", "gpu_util_pct", "power_mw"];
        let a = Arc::new(Batch::new(&gpu_rows(Some(0)), &columns));
        let b = Arc::new(Batch::new(&gpu_rows(Some(1)), &columns));
        let kept = keep_rows(&[Arc::clone(&a), Arc::clone(&b)], &[(1, 5), (0, 777)]);
        assert_eq!(kept.rows, 2);
        for (i, col) in kept.cols.iter().enumerate() {
            let bytes = match col {
                Col::I32(a) => a.get_array_memory_size(),
                Col::Ts(a) => a.get_array_memory_size(),
                Col::Str(a) => a.get_array_memory_size(),
                Col::I64(a) => a.get_array_memory_size(),
                _ => 0,
            };
            assert!(
                bytes < 4096,
                "column {i} of the kept rows holds {bytes} bytes"
            );
        }
        for (k, (batch, row)) in [(0, (&b, 5)), (1, (&a, 777))] {
            assert_eq!(kept.col(0).text(k), batch.col(0).text(row));
            for c in 1..4 {
                assert_eq!(kept.col(c).int(k), batch.col(c).int(row), "column {c}");
            }
            assert_eq!(kept.col(4).int(k), None);
        }
    }

    #[tokio::test]
    async fn files_interleaved_in_time_merge_node_by_node_in_bounded_chunks() {
        // Two sorted files, the even and the odd seconds: every device's
        // rows alternate between them, 144,000 rows each (several batches
        // of each file, several chunks).
        let store = InMemory::new();
        put(&store, "even", sorted_file(&gpu_rows(Some(0)))).await;
        put(&store, "odd", sorted_file(&gpu_rows(Some(1)))).await;
        assert!(2 * NODES * GPUS as usize * SECONDS as usize / 2 > 2 * CHUNK_ROWS);
        assert_eq!(scan_all(store).await.expect("scan"), expected());
    }

    #[tokio::test]
    async fn a_file_without_a_sort_order_is_sorted_whole() {
        let rows = gpu_rows(None);
        // Reversed: the last node and second first.
        let reversed =
            arrow_array::UInt64Array::from_iter_values((0..rows.num_rows() as u64).rev());
        let rows = arrow_select::take::take_record_batch(&rows, &reversed).expect("take");
        let store = InMemory::new();
        put(&store, "duckdb", plain_file(&rows)).await;
        assert_eq!(scan_all(store).await.expect("scan"), expected());
    }

    #[tokio::test]
    async fn a_file_that_says_it_is_sorted_and_is_not_is_an_error() {
        let rows = gpu_rows(Some(0));
        let reversed =
            arrow_array::UInt64Array::from_iter_values((0..rows.num_rows() as u64).rev());
        let rows = arrow_select::take::take_record_batch(&rows, &reversed).expect("take");
        let props = crate::persist::writer_properties(Table::Gpu);
        let bytes = crate::persist::encode_with(Table::Gpu.schema(), props, &rows).expect("encode");
        let store = InMemory::new();
        put(&store, "liar", bytes).await;
        match scan_all(store).await {
            Err(ReportError::Unsorted { path, node, after }) => {
                assert!(path.ends_with("liar.parquet"), "{path}");
                assert!(node < after, "{node} after {after}");
            }
            other => panic!(
                "expected an Unsorted error, got {:?}",
                other.map(|m| m.len())
            ),
        }
    }

    #[test]
    fn median_is_the_lower_middle_of_the_gaps() {
        let gaps = |pairs: &[(i64, u64)]| pairs.iter().copied().collect::<BTreeMap<_, _>>();
        assert_eq!(median(&gaps(&[])), None);
        assert_eq!(median(&gaps(&[(5, 1)])), Some(5));
        assert_eq!(median(&gaps(&[(1, 1), (9, 1)])), Some(1));
        assert_eq!(median(&gaps(&[(1, 1), (2, 1), (9, 1)])), Some(2));
        assert_eq!(
            median(&gaps(&[(1_000_000, 3599), (60_000_000, 1)])),
            Some(1_000_000)
        );
    }

    #[test]
    fn the_mode_of_a_node_prefers_the_commoner_then_the_shorter_gap() {
        let keys = [
            Key {
                node: 0,
                parts: [None; 3],
            },
            Key {
                node: 1,
                parts: [None; 3],
            },
        ];
        let gaps = [
            [(15, 3), (30, 5)].into_iter().collect(),
            [(0, 9), (15, 2), (30, 2)].into_iter().collect(),
        ];
        let modes = Devices::mode_by_node(&gaps, &keys);
        assert_eq!(modes.get(&0), Some(&30));
        assert_eq!(modes.get(&1), Some(&15));
    }
}
