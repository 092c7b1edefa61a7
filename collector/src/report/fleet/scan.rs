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
//! figures need. Each pass holds one hour of the table at a time (sorted by
//! device and time in memory, as flush files are not sorted), plus each
//! device's last row of the hour before.

use std::collections::{BTreeMap, HashMap};
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
use gputel_schemas::{PartitionKey, PartitionPath};
use object_store::{ObjectMeta, ObjectStore};

use super::super::ReportError;
use super::super::read::{ReadStats, all_rows_of, list};
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

/// The rows of one hour, keyed and sorted by device and time.
struct Hour {
    batches: Vec<Batch>,
    /// (device, ts, batch, row)
    order: Vec<(u32, i64, u32, u32)>,
}

impl Scan<'_> {
    /// The columns read for the keys: node, the spec's parts, ts.
    fn key_columns(&self) -> Vec<&'static str> {
        let mut columns = vec!["node"];
        columns.extend(self.spec.parts);
        columns.push("ts");
        columns
    }

    async fn hour(
        &self,
        files: &[ObjectMeta],
        extra: &[&str],
        names: &mut Names,
        devices: &mut Devices,
        stats: &mut ReadStats,
    ) -> Result<Hour, ReportError> {
        let mut columns = self.key_columns();
        columns.extend(extra);
        let batches = all_rows_of(self.store, files, &columns, stats).await?;
        let parts = self.spec.parts.len();
        let mut typed = Vec::with_capacity(batches.len());
        let mut order = Vec::new();
        for (b, batch) in batches.iter().enumerate() {
            let batch = Batch::new(batch, &columns);
            let node = batch.col(0);
            let ts = batch.col(parts + 1);
            // A dictionary's values are interned once per batch.
            let dict_ids: Option<Vec<u32>> = match node {
                Col::Dict(_, values) => Some(
                    (0..values.len())
                        .map(|i| names.id(values.value(i)))
                        .collect(),
                ),
                _ => None,
            };
            for row in 0..batch.rows {
                let Some(ts_us) = ts.int(row) else { continue };
                if !self.window.holds(ts_us) {
                    continue;
                }
                let node_id = match (&dict_ids, node) {
                    (Some(ids), Col::Dict(dict, _)) if dict.is_valid(row) => {
                        usize::try_from(dict.keys().value(row))
                            .ok()
                            .and_then(|k| ids.get(k).copied())
                    }
                    _ => node.text(row).map(|n| names.id(n)),
                };
                let Some(node_id) = node_id else { continue };
                let mut key = Key {
                    node: node_id,
                    parts: [None; 3],
                };
                for p in 0..parts {
                    let col = batch.col(p + 1);
                    key.parts[p] = match col {
                        Col::Str(_) | Col::Dict(..) => col.text(row).map(|t| names.id(t).into()),
                        _ => col.int(row),
                    };
                }
                let device = devices.device(key);
                order.push((
                    device,
                    ts_us,
                    u32::try_from(b).unwrap_or(u32::MAX),
                    u32::try_from(row).unwrap_or(u32::MAX),
                ));
            }
            typed.push(batch);
        }
        order.sort_unstable();
        Ok(Hour {
            batches: typed,
            order,
        })
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
            let hour = self.hour(files, &[], names, &mut devices, stats).await?;
            for &(device, ts_us, _, _) in &hour.order {
                let d = device as usize;
                if let Some(last) = devices.last_ts[d] {
                    *devices.gaps[d].entry(ts_us - last).or_default() += 1;
                }
                devices.last_ts[d] = Some(ts_us);
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
        columns: &[&str],
        names: &mut Names,
        devices: &mut Devices,
        intervals: &HashMap<u32, i64>,
        stats: &mut ReadStats,
        mut visit: impl FnMut(Row<'_>),
    ) -> Result<(), ReportError> {
        // Each device's row waiting for the next one's time: in this hour's
        // batches, or (the device missing from the hour after) a one-row
        // batch of its own.
        enum Pending {
            Here(i64, u32, u32),
            Kept(i64, Batch),
        }
        let cap = |devices: &Devices, d: usize| {
            devices.median_us.get(d).copied().flatten().map(|m| {
                // As the views: least(gap, 3 * median) in whole µs.
                (m as f64 * MAX_WEIGHT_INTERVALS) as i64
            })
        };
        let mut pending: Vec<Option<Pending>> = Vec::new();
        for files in self.hours.values() {
            let hour = self.hour(files, columns, names, devices, stats).await?;
            pending.resize_with(devices.len(), || None);
            for &(device, ts_us, b, row) in &hour.order {
                let d = device as usize;
                if let Some(previous) = pending[d].take() {
                    let (prev_ts, batch, prev_row) = match &previous {
                        Pending::Here(t, b, r) => (*t, &hour.batches[*b as usize], *r as usize),
                        Pending::Kept(t, batch) => (*t, batch, 0),
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
            // Rows still waiting are copied out of the hour's batches,
            // which are dropped.
            for p in pending.iter_mut() {
                if let Some(Pending::Here(ts, b, row)) = p {
                    let kept = keep_row(&hour.batches[*b as usize], *row as usize);
                    *p = Some(Pending::Kept(*ts, kept));
                }
            }
        }
        // Each device's last row weighs its median gap, or its node's interval.
        for (d, p) in pending.into_iter().enumerate() {
            let Some(Pending::Kept(ts_us, batch)) = p else {
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
                    row: 0,
                });
            }
        }
        Ok(())
    }
}

/// One row of a batch as a batch of its own.
fn keep_row(batch: &Batch, row: usize) -> Batch {
    let cols = batch
        .cols
        .iter()
        .map(|c| match c {
            Col::Missing => Col::Missing,
            Col::I32(a) => Col::I32(a.slice(row, 1)),
            Col::I64(a) => Col::I64(a.slice(row, 1)),
            Col::F32(a) => Col::F32(a.slice(row, 1)),
            Col::F64(a) => Col::F64(a.slice(row, 1)),
            Col::Ts(a) => Col::Ts(a.slice(row, 1)),
            Col::Str(a) => Col::Str(a.slice(row, 1)),
            Col::Dict(d, v) => Col::Dict(d.slice(row, 1), v.clone()),
        })
        .collect();
    Batch { cols, rows: 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

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
