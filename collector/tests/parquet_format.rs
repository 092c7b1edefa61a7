//! The files the collector writes, read back with the `parquet` crate: path
//! layout, sort order, physical layout (encodings, compression, statistics,
//! bloom filters, sorting metadata) and exact values, nulls included.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Field};
use gputel_collector::buffer::WriteBuffer;
use gputel_collector::persist::{self, write_file};
use gputel_collector::validate::validate_batch;
use gputel_proto::{Batch, GpuSample, IbPortSample, NodeSample};
use gputel_schemas::{PartitionPath, Table};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::{CompressionCodec, Encoding, LogicalType, TimeUnit};
use parquet::file::metadata::SortingColumn;
use parquet::file::properties::ReaderProperties;
use parquet::file::reader::FileReader;
use parquet::file::serialized_reader::{ReadOptionsBuilder, SerializedFileReader};
use parquet::file::statistics::Statistics;

/// 2026-11-21T05:59:55Z
const H5A: i64 = 1_795_240_795_000_000;
/// 2026-11-21T05:59:59.999999Z, the last microsecond of hour 05.
const H5B: i64 = 1_795_240_799_999_999;
/// 2026-11-21T06:00:00Z, the first microsecond of hour 06.
const H6A: i64 = 1_795_240_800_000_000;
/// 2026-11-21T06:00:05Z
const H6B: i64 = 1_795_240_805_000_000;
/// The collector's clock for validation.
const NOW: i64 = H6B + 60_000_000;

const STEM: &str = "20261121T060105Z-test-000001";

// Rows are identified by an id that every value of the row derives from, so a
// row that moved, lost a value or swapped a value with another row shows up.

/// A GPU row; id 3 is a GPU whose optional readings are all unset.
fn gpu(id: u32, gpu: u32, ts_us: i64) -> GpuSample {
    let set = id != 3;
    GpuSample {
        ts_us,
        gpu,
        uuid: format!("GPU-{id:04}"),
        model: if gpu == 0 {
            "NVIDIA H100 80GB HBM3".into()
        } else {
            "NVIDIA A100-SXM4-80GB".into()
        },
        temperature_c: set.then_some(40 + id),
        memory_temperature_c: set.then_some(50 + id),
        power_mw: set.then_some(300_000 + id),
        // Above 2^32: must survive as a 64-bit integer.
        energy_mj: set.then_some(9_000_000_000_000 + u64::from(id)),
        sm_clock_mhz: set.then_some(1_980 - id),
        memory_clock_mhz: set.then_some(2_619),
        // Zero is a value, not an absence.
        gpu_util_pct: set.then_some(if id == 1 { 0 } else { id }),
        memory_copy_util_pct: set.then_some(id * 2),
        fb_used_bytes: set.then_some(u64::from(id) << 30),
        fb_free_bytes: set.then_some((80 - u64::from(id)) << 30),
        fb_total_bytes: set.then_some(80 << 30),
        // A pod's labels on two rows, one of them empty: a map or null.
        pod_labels: match id {
            5 => [("team", "pretrain"), ("app", "llama")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .into(),
            7 => [("team".to_owned(), String::new())].into(),
            _ => Default::default(),
        },
        ..GpuSample::default()
    }
}

/// A map column's rows: the entries in key order, or None for a null map.
fn maps(batch: &RecordBatch, name: &str) -> Vec<Option<Vec<(String, String)>>> {
    let col = batch.column_by_name(name).expect(name).as_map();
    (0..col.len())
        .map(|row| {
            col.is_valid(row).then(|| {
                let entries = col.value(row);
                let keys = entries.column(0).as_string::<i32>();
                let values = entries.column(1).as_string::<i32>();
                (0..entries.len())
                    .map(|i| (keys.value(i).to_owned(), values.value(i).to_owned()))
                    .collect()
            })
        })
        .collect()
}

/// A node row; id 22 could read neither `stat` nor `loadavg`.
fn node(id: u32, ts_us: i64) -> NodeSample {
    let unread = id == 22;
    let pct = |v: f32| if unread { None } else { Some(v) };
    let jiffies = |v: u64| if unread { None } else { Some(v) };
    NodeSample {
        ts_us,
        cpu_count: 64 + id,
        cpu_user_jiffies: jiffies(u64::from(id) * 1_000_003),
        cpu_system_jiffies: jiffies(u64::from(id) * 100_003),
        cpu_iowait_jiffies: jiffies(0),
        cpu_idle_jiffies: jiffies(u64::from(id) << 33),
        cpu_steal_jiffies: jiffies(u64::from(id)),
        memory_total_kib: Some(2_u64 << 30),
        memory_available_kib: Some((2_u64 << 30) - (u64::from(id) << 20)),
        load1: pct(id as f32 / 4.0),
        load5: pct(id as f32 / 8.0),
        load15: None,
        jobs: Vec::new(),
        ..NodeSample::default()
    }
}

/// An IB port row; id 32 is a port that is down.
fn ib(id: u32, device: &str, port: u32, ts_us: i64) -> IbPortSample {
    let up = id != 32;
    IbPortSample {
        ts_us,
        device: device.into(),
        port,
        state: if up { "ACTIVE" } else { "DOWN" }.into(),
        rate_gbps: up.then_some(400.0),
        xmit_bytes: up.then_some(u64::from(id) * 1_000_000_007),
        rcv_bytes: up.then_some(u64::from(id) * 2_000_000_011),
        xmit_packets: up.then_some(u64::from(id) * 1_000),
        rcv_packets: up.then_some(u64::from(id) * 2_000),
        ..IbPortSample::default()
    }
}

/// Two nodes' batches, each out of order, spanning the 05→06 hour boundary.
/// node-b is appended first so that, in every partition, its strings get the
/// lower dictionary keys: sorting by key instead of by value would show.
fn batches() -> Vec<(&'static str, Batch)> {
    vec![
        (
            "node-b",
            Batch {
                seq: 1,
                gpu: vec![
                    gpu(1, 1, H6B),
                    gpu(2, 1, H5B),
                    gpu(3, 0, H6A),
                    gpu(4, 0, H5A),
                    gpu(5, 1, H6A),
                    gpu(6, 0, H5B),
                ],
                node: vec![node(20, H6A), node(21, H5A)],
                ib: vec![
                    ib(33, "mlx5_1", 1, H6A),
                    ib(34, "mlx5_0", 2, H6A),
                    ib(35, "mlx5_0", 1, H6A),
                ],
                ..Batch::default()
            },
        ),
        (
            "node-a",
            Batch {
                seq: 1,
                gpu: vec![gpu(7, 0, H6B), gpu(8, 1, H5A), gpu(9, 0, H6A)],
                node: vec![node(22, H5B)],
                ib: vec![
                    ib(30, "mlx5_0", 1, H6B),
                    ib(31, "mlx5_0", 1, H6A),
                    ib(32, "mlx5_1", 1, H6A),
                ],
                ..Batch::default()
            },
        ),
    ]
}

/// Writes `batches()` into a fresh store through the write buffer and the
/// persister, as one flush does.
async fn write_store(dir: &Path) {
    let store = gputel_collector::store::open_store(
        dir.to_str().expect("utf-8 temp path"),
        &Default::default(),
    )
    .expect("open store");
    let inputs = batches();
    let mut buffer = WriteBuffer::default();
    for (node, batch) in &inputs {
        buffer.append(
            node,
            validate_batch(batch, NOW).expect("test rows are valid"),
        );
    }
    assert_eq!(buffer.rows(), 9 + 3 + 6);
    for (table, key, batch) in buffer.take_batches().expect("buffer assembles") {
        let path = PartitionPath::new(table, key, STEM).expect("valid stem");
        write_file(&store, &path, batch).await.expect("write file");
    }
    assert_eq!(buffer.rows(), 0);
}

/// Every file under `dir`, as `/`-separated paths relative to it.
fn files_under(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("read dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).expect("under root");
                let parts: Vec<_> = rel.iter().map(|p| p.to_string_lossy()).collect();
                out.push(parts.join("/"));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn read_batch(path: &Path) -> RecordBatch {
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(path).expect("open"))
        .expect("parquet footer")
        .build()
        .expect("reader");
    let batches: Vec<RecordBatch> = reader.collect::<Result<_, _>>().expect("decode");
    let schema = batches.first().expect("at least one batch").schema();
    arrow_select::concat::concat_batches(&schema, &batches).expect("concat")
}

fn strings(batch: &RecordBatch, name: &str) -> Vec<String> {
    let col = batch.column_by_name(name).expect(name);
    let dict = col.as_dictionary::<Int32Type>();
    let values = dict.values().as_string::<i32>();
    assert_eq!(dict.null_count(), 0, "{name}");
    dict.keys()
        .values()
        .iter()
        .map(|k| values.value(usize::try_from(*k).expect("key")).to_owned())
        .collect()
}

fn i32s(batch: &RecordBatch, name: &str) -> Vec<Option<i32>> {
    let col = batch.column_by_name(name).expect(name);
    col.as_primitive::<Int32Type>().iter().collect()
}

fn i64s(batch: &RecordBatch, name: &str) -> Vec<Option<i64>> {
    let col = batch.column_by_name(name).expect(name);
    col.as_primitive::<Int64Type>().iter().collect()
}

fn f32s(batch: &RecordBatch, name: &str) -> Vec<Option<f32>> {
    let col = batch.column_by_name(name).expect(name);
    col.as_primitive::<Float32Type>().iter().collect()
}

fn f64s(batch: &RecordBatch, name: &str) -> Vec<Option<f64>> {
    let col = batch.column_by_name(name).expect(name);
    col.as_primitive::<Float64Type>().iter().collect()
}

fn timestamps(batch: &RecordBatch) -> Vec<i64> {
    let col = batch.column_by_name("ts").expect("ts");
    let ts = col.as_primitive::<TimestampMicrosecondType>();
    assert_eq!(ts.null_count(), 0);
    ts.values().to_vec()
}

fn path_of(table: &str, hour: &str) -> String {
    format!("{table}/date=2026-11-21/hour={hour}/{STEM}.parquet")
}

#[tokio::test]
async fn files_land_in_exactly_the_expected_partitions_and_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_store(dir.path()).await;
    // Only the five files, under their hive paths, and the store's lock
    // file; no staging or temporary file is left behind by the atomic write.
    assert_eq!(
        files_under(dir.path()),
        vec![
            gputel_collector::store::LOCK_FILE.to_owned(),
            path_of("gpu", "05"),
            path_of("gpu", "06"),
            path_of("ib", "06"),
            path_of("node", "05"),
            path_of("node", "06"),
        ]
    );
    for file in files_under(dir.path()).into_iter().skip(1) {
        let parsed = PartitionPath::parse(&file).expect("path parses");
        assert_eq!(parsed.to_string(), file);
        assert_eq!(parsed.stem(), STEM);
    }
}

#[tokio::test]
async fn gpu_rows_round_trip_sorted_by_node_gpu_ts_with_nulls_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_store(dir.path()).await;

    /// One file's rows in the expected order.
    struct Want {
        hour: &'static str,
        ids: &'static [u32],
        nodes: &'static [&'static str],
        gpus: &'static [i32],
        ts: &'static [i64],
    }
    let expected = [
        Want {
            hour: "05",
            ids: &[8, 4, 6, 2],
            nodes: &["node-a", "node-b", "node-b", "node-b"],
            gpus: &[1, 0, 0, 1],
            ts: &[H5A, H5A, H5B, H5B],
        },
        Want {
            hour: "06",
            ids: &[9, 7, 3, 5, 1],
            nodes: &["node-a", "node-a", "node-b", "node-b", "node-b"],
            gpus: &[0, 0, 0, 1, 1],
            ts: &[H6A, H6B, H6A, H6A, H6B],
        },
    ];
    for Want {
        hour,
        ids,
        nodes,
        gpus,
        ts,
    } in expected
    {
        let batch = read_batch(&dir.path().join(path_of("gpu", hour)));
        assert_eq!(batch.schema(), Table::Gpu.schema(), "hour {hour}");
        assert_eq!(timestamps(&batch), ts, "hour {hour}");
        assert_eq!(strings(&batch, "node"), nodes, "hour {hour}");
        assert_eq!(
            i32s(&batch, "gpu"),
            gpus.iter().map(|g| Some(*g)).collect::<Vec<_>>()
        );
        // Every other value derives from the row's id.
        let want: Vec<GpuSample> = ids
            .iter()
            .zip(gpus)
            .zip(ts)
            .map(|((id, g), ts)| gpu(*id, u32::try_from(*g).expect("gpu"), *ts))
            .collect();
        let col32 = |f: fn(&GpuSample) -> Option<u32>| -> Vec<Option<i32>> {
            want.iter()
                .map(|s| f(s).map(|v| i32::try_from(v).expect("fits")))
                .collect()
        };
        let col64 = |f: fn(&GpuSample) -> Option<u64>| -> Vec<Option<i64>> {
            want.iter()
                .map(|s| f(s).map(|v| i64::try_from(v).expect("fits")))
                .collect()
        };
        assert_eq!(
            strings(&batch, "uuid"),
            ids.iter()
                .map(|id| format!("GPU-{id:04}"))
                .collect::<Vec<_>>()
        );
        assert_eq!(
            strings(&batch, "model"),
            want.iter().map(|s| s.model.clone()).collect::<Vec<_>>()
        );
        assert_eq!(
            maps(&batch, "pod_labels"),
            want.iter()
                .map(|s| {
                    let entries: Vec<(String, String)> = s.pod_labels.clone().into_iter().collect();
                    (!entries.is_empty()).then_some(entries)
                })
                .collect::<Vec<_>>(),
            "hour {hour}"
        );
        assert_eq!(i32s(&batch, "temperature_c"), col32(|s| s.temperature_c));
        assert_eq!(
            i32s(&batch, "memory_temperature_c"),
            col32(|s| s.memory_temperature_c)
        );
        assert_eq!(
            i64s(&batch, "power_mw"),
            want.iter()
                .map(|s| s.power_mw.map(i64::from))
                .collect::<Vec<_>>()
        );
        assert_eq!(i64s(&batch, "energy_mj"), col64(|s| s.energy_mj));
        assert_eq!(i32s(&batch, "sm_clock_mhz"), col32(|s| s.sm_clock_mhz));
        assert_eq!(
            i32s(&batch, "memory_clock_mhz"),
            col32(|s| s.memory_clock_mhz)
        );
        assert_eq!(i32s(&batch, "gpu_util_pct"), col32(|s| s.gpu_util_pct));
        assert_eq!(
            i32s(&batch, "memory_copy_util_pct"),
            col32(|s| s.memory_copy_util_pct)
        );
        assert_eq!(i64s(&batch, "fb_used_bytes"), col64(|s| s.fb_used_bytes));
        assert_eq!(i64s(&batch, "fb_free_bytes"), col64(|s| s.fb_free_bytes));
        assert_eq!(i64s(&batch, "fb_total_bytes"), col64(|s| s.fb_total_bytes));
    }

    // Spot checks written out literally, so the helpers above cannot hide a
    // shared mistake: row id 3 (hour 06, third row) has every reading unset
    // and reads back as nulls, not zeros; row id 1 reports 0 % utilisation.
    let h6 = read_batch(&dir.path().join(path_of("gpu", "06")));
    assert_eq!(
        i32s(&h6, "temperature_c"),
        vec![Some(49), Some(47), None, Some(45), Some(41)]
    );
    assert_eq!(
        i64s(&h6, "power_mw"),
        vec![
            Some(300_009),
            Some(300_007),
            None,
            Some(300_005),
            Some(300_001)
        ]
    );
    assert_eq!(
        i64s(&h6, "energy_mj"),
        vec![
            Some(9_000_000_000_009),
            Some(9_000_000_000_007),
            None,
            Some(9_000_000_000_005),
            Some(9_000_000_000_001)
        ]
    );
    assert_eq!(
        i32s(&h6, "gpu_util_pct"),
        vec![Some(9), Some(7), None, Some(5), Some(0)]
    );
    assert_eq!(
        i64s(&h6, "fb_total_bytes"),
        vec![
            Some(85_899_345_920),
            Some(85_899_345_920),
            None,
            Some(85_899_345_920),
            Some(85_899_345_920)
        ]
    );
    for column in ["memory_temperature_c", "sm_clock_mhz", "memory_clock_mhz"] {
        assert_eq!(i32s(&h6, column)[2], None, "{column}");
    }
}

#[tokio::test]
async fn node_rows_round_trip_sorted_by_node_ts_with_nulls_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_store(dir.path()).await;

    let h5 = read_batch(&dir.path().join(path_of("node", "05")));
    assert_eq!(h5.schema(), Table::Node.schema());
    assert_eq!(timestamps(&h5), vec![H5B, H5A]);
    assert_eq!(strings(&h5, "node"), vec!["node-a", "node-b"]);
    assert_eq!(i32s(&h5, "cpu_count"), vec![Some(86), Some(85)]);
    // node-a's row read neither stat nor loadavg: absent, not 0.
    assert_eq!(i64s(&h5, "cpu_user_jiffies"), vec![None, Some(21_000_063)]);
    assert_eq!(i64s(&h5, "cpu_system_jiffies"), vec![None, Some(2_100_063)]);
    assert_eq!(i64s(&h5, "cpu_iowait_jiffies"), vec![None, Some(0)]);
    assert_eq!(i64s(&h5, "cpu_idle_jiffies"), vec![None, Some(21 << 33)]);
    assert_eq!(i64s(&h5, "cpu_steal_jiffies"), vec![None, Some(21)]);
    assert_eq!(
        i64s(&h5, "memory_total_kib"),
        vec![Some(2_147_483_648), Some(2_147_483_648)]
    );
    assert_eq!(
        i64s(&h5, "memory_available_kib"),
        vec![
            Some(2_147_483_648 - (22 << 20)),
            Some(2_147_483_648 - (21 << 20))
        ]
    );
    assert_eq!(f32s(&h5, "load1"), vec![None, Some(5.25)]);
    assert_eq!(f32s(&h5, "load5"), vec![None, Some(2.625)]);
    assert_eq!(f32s(&h5, "load15"), vec![None, None]);

    let h6 = read_batch(&dir.path().join(path_of("node", "06")));
    assert_eq!(timestamps(&h6), vec![H6A]);
    assert_eq!(strings(&h6, "node"), vec!["node-b"]);
    assert_eq!(i32s(&h6, "cpu_count"), vec![Some(84)]);
    assert_eq!(i64s(&h6, "cpu_user_jiffies"), vec![Some(20_000_060)]);
    assert_eq!(i64s(&h6, "cpu_idle_jiffies"), vec![Some(20 << 33)]);
    assert_eq!(f32s(&h6, "load1"), vec![Some(5.0)]);
    assert_eq!(f32s(&h6, "load15"), vec![None]);
}

#[tokio::test]
async fn ib_rows_round_trip_sorted_by_node_device_port_ts_with_nulls_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_store(dir.path()).await;

    let b = read_batch(&dir.path().join(path_of("ib", "06")));
    assert_eq!(b.schema(), Table::Ib.schema());
    // ids in order: 31, 30, 32, 35, 34, 33
    assert_eq!(timestamps(&b), vec![H6A, H6B, H6A, H6A, H6A, H6A]);
    assert_eq!(
        strings(&b, "node"),
        vec!["node-a", "node-a", "node-a", "node-b", "node-b", "node-b"]
    );
    assert_eq!(
        strings(&b, "device"),
        vec!["mlx5_0", "mlx5_0", "mlx5_1", "mlx5_0", "mlx5_0", "mlx5_1"]
    );
    assert_eq!(
        i32s(&b, "port"),
        vec![Some(1), Some(1), Some(1), Some(1), Some(2), Some(1)]
    );
    assert_eq!(
        strings(&b, "state"),
        vec!["ACTIVE", "ACTIVE", "DOWN", "ACTIVE", "ACTIVE", "ACTIVE"]
    );
    assert_eq!(
        f64s(&b, "rate_gbps"),
        vec![
            Some(400.0),
            Some(400.0),
            None,
            Some(400.0),
            Some(400.0),
            Some(400.0)
        ]
    );
    assert_eq!(
        i64s(&b, "xmit_bytes"),
        vec![
            Some(31_000_000_217),
            Some(30_000_000_210),
            None,
            Some(35_000_000_245),
            Some(34_000_000_238),
            Some(33_000_000_231)
        ]
    );
    assert_eq!(
        i64s(&b, "rcv_bytes"),
        vec![
            Some(62_000_000_341),
            Some(60_000_000_330),
            None,
            Some(70_000_000_385),
            Some(68_000_000_374),
            Some(66_000_000_363)
        ]
    );
    assert_eq!(
        i64s(&b, "xmit_packets"),
        vec![
            Some(31_000),
            Some(30_000),
            None,
            Some(35_000),
            Some(34_000),
            Some(33_000)
        ]
    );
    assert_eq!(
        i64s(&b, "rcv_packets"),
        vec![
            Some(62_000),
            Some(60_000),
            None,
            Some(70_000),
            Some(68_000),
            Some(66_000)
        ]
    );
    // Rates are the views' to derive; the table holds counters only.
    assert!(
        b.schema()
            .fields()
            .iter()
            .all(|f| !f.name().ends_with("_per_s"))
    );
}

/// The encoding a column's data pages must use, from its Arrow type (and
/// its name, for the floats written plain).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Delta,
    ByteStreamSplit,
    Plain,
    Dictionary,
    Rle,
}

fn expected_encoding(field: &Field) -> Expect {
    if persist::DICTIONARY_INTEGER_COLUMNS.contains(&field.name().as_str()) {
        return Expect::Dictionary;
    }
    match field.data_type() {
        DataType::Int32 | DataType::Int64 | DataType::Timestamp(_, _) => Expect::Delta,
        // The load averages: two decimals, few values, whole under zstd.
        DataType::Float32 if field.name().starts_with("load") => Expect::Plain,
        DataType::Float32 | DataType::Float64 => Expect::ByteStreamSplit,
        DataType::Boolean => Expect::Rle,
        DataType::Dictionary(_, value) if **value == DataType::Utf8 => Expect::Dictionary,
        // Lists of strings (node.jobs): the strings are dictionary-encoded.
        DataType::List(item) if *item.data_type() == DataType::Utf8 => Expect::Dictionary,
        // Maps of strings to strings (gpu.pod_labels): keys and values are
        // dictionary-encoded.
        DataType::Map(_, _) => Expect::Dictionary,
        other => panic!("no encoding expectation for column type {other}; add one"),
    }
}

#[tokio::test]
async fn physical_layout_matches_the_design() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_store(dir.path()).await;

    /// What each file holds: rows, the nodes present, and the ts range.
    struct Facts {
        table: Table,
        hour: &'static str,
        rows: i64,
        nodes: &'static [&'static str],
        ts_min: i64,
        ts_max: i64,
    }
    let facts = |table, hour, rows, nodes, ts_min, ts_max| Facts {
        table,
        hour,
        rows,
        nodes,
        ts_min,
        ts_max,
    };
    let files = [
        facts(Table::Gpu, "05", 4, &["node-a", "node-b"], H5A, H5B),
        facts(Table::Gpu, "06", 5, &["node-a", "node-b"], H6A, H6B),
        facts(Table::Node, "05", 2, &["node-a", "node-b"], H5A, H5B),
        facts(Table::Node, "06", 1, &["node-b"], H6A, H6A),
        facts(Table::Ib, "06", 6, &["node-a", "node-b"], H6A, H6B),
    ];
    let sort_key_indices: BTreeMap<Table, Vec<i32>> = BTreeMap::from([
        (Table::Gpu, vec![1, 2, 0]),
        (Table::Node, vec![1, 0]),
        (Table::Ib, vec![1, 2, 3, 0]),
    ]);
    assert_eq!(Table::Gpu.bloom_filter_columns(), &["node", "job_id"]);

    for Facts {
        table,
        hour,
        rows,
        nodes,
        ts_min,
        ts_max,
    } in files
    {
        let name = path_of(table.name(), hour);
        let reader = SerializedFileReader::new_with_options(
            File::open(dir.path().join(&name)).expect("open"),
            ReadOptionsBuilder::new()
                .with_reader_properties(
                    ReaderProperties::builder()
                        .set_read_bloom_filter(true)
                        .build(),
                )
                .build(),
        )
        .expect("parquet footer");
        let meta = reader.metadata();
        assert_eq!(meta.file_metadata().num_rows(), rows, "{name}");
        assert_eq!(meta.num_row_groups(), 1, "{name}");
        let descr = meta.file_metadata().schema_descr();

        // ts: TIMESTAMP(MICROS, isAdjustedToUTC=true), so DuckDB reads TIMESTAMPTZ.
        assert_eq!(descr.column(0).name(), "ts");
        assert_eq!(
            descr.column(0).logical_type_ref(),
            Some(&LogicalType::timestamp(true, TimeUnit::MICROS)),
            "{name}"
        );

        let group = meta.row_group(0);
        assert_eq!(group.num_rows(), rows, "{name}");
        let want_sorting: Vec<SortingColumn> = sort_key_indices[&table]
            .iter()
            .map(|&column_idx| SortingColumn {
                column_idx,
                descending: false,
                nulls_first: false,
            })
            .collect();
        assert_eq!(group.sorting_columns(), Some(&want_sorting), "{name}");

        let schema = table.schema();
        // Each field's Parquet leaf columns, in order: one, or a map's key
        // and value.
        let leaves: Vec<(usize, &arrow_schema::FieldRef)> = schema
            .fields()
            .iter()
            .flat_map(|field| {
                let n = if matches!(field.data_type(), DataType::Map(_, _)) {
                    2
                } else {
                    1
                };
                std::iter::repeat_n(field, n)
            })
            .enumerate()
            .collect();
        assert_eq!(group.num_columns(), leaves.len(), "{name}");
        let group_reader = reader.get_row_group(0).expect("row group");
        for (idx, field) in leaves {
            let chunk = group.column(idx);
            let what = format!("{name} column {}", chunk.column_path());
            // A list column's one leaf is `<name>.list.item`.
            assert_eq!(chunk.column_path().parts()[0], *field.name(), "{what}");
            // A column without a value in a flush file is a few bytes of
            // levels, stored uncompressed; the others zstd. (A list's leaf
            // counts an empty list as a null, so for lists the statistics
            // only say when uncompressed is allowed.)
            let nulls = chunk.statistics().and_then(|s| s.null_count_opt());
            let empty = nulls == Some(chunk.num_values() as u64);
            let codec = chunk.compression_codec();
            if field.data_type().is_nested() {
                assert!(
                    codec == CompressionCodec::ZSTD || empty,
                    "{what}: {codec:?} with {nulls:?} nulls"
                );
            } else if empty {
                assert_eq!(codec, CompressionCodec::UNCOMPRESSED, "{what}: empty");
            } else {
                assert_eq!(codec, CompressionCodec::ZSTD, "{what}: {nulls:?} nulls");
            }
            let pages = chunk
                .page_encoding_stats_mask()
                .unwrap_or_else(|| panic!("{what}: no page encoding stats"));
            let encodings: Vec<Encoding> = chunk.encodings().collect();
            match expected_encoding(field) {
                Expect::Delta => {
                    assert!(
                        pages.is_only(Encoding::DELTA_BINARY_PACKED),
                        "{what}: {encodings:?}"
                    );
                    assert_eq!(chunk.dictionary_page_offset(), None, "{what}");
                    assert!(
                        !encodings.contains(&Encoding::RLE_DICTIONARY)
                            && !encodings.contains(&Encoding::PLAIN_DICTIONARY),
                        "{what}: {encodings:?}"
                    );
                }
                Expect::ByteStreamSplit => {
                    assert!(
                        pages.is_only(Encoding::BYTE_STREAM_SPLIT),
                        "{what}: {encodings:?}"
                    );
                    assert_eq!(chunk.dictionary_page_offset(), None, "{what}");
                }
                Expect::Plain => {
                    assert!(pages.is_only(Encoding::PLAIN), "{what}: {encodings:?}");
                    assert_eq!(chunk.dictionary_page_offset(), None, "{what}");
                }
                Expect::Rle => {
                    assert!(pages.is_only(Encoding::RLE), "{what}: {encodings:?}");
                    assert_eq!(chunk.dictionary_page_offset(), None, "{what}");
                }
                Expect::Dictionary => {
                    assert!(
                        pages.is_only(Encoding::RLE_DICTIONARY),
                        "{what}: {encodings:?}"
                    );
                    assert!(chunk.dictionary_page_offset().is_some(), "{what}");
                }
            }
            let bloom = table
                .bloom_filter_columns()
                .contains(&field.name().as_str());
            assert_eq!(
                group_reader.get_column_bloom_filter(idx).is_some(),
                bloom,
                "{what}: bloom filter"
            );
        }

        // Statistics on ts let readers skip row groups and pages by time.
        match group.column(0).statistics() {
            Some(Statistics::Int64(s)) => {
                assert_eq!(s.min_opt(), Some(&ts_min), "{name}");
                assert_eq!(s.max_opt(), Some(&ts_max), "{name}");
                assert_eq!(s.null_count_opt(), Some(0), "{name}");
            }
            other => panic!("{name}: ts statistics are {other:?}"),
        }

        // The bloom filter on node answers for the nodes in the file. The
        // hash is deterministic, so the absent name is a stable negative.
        let filter = group_reader
            .get_column_bloom_filter(1)
            .unwrap_or_else(|| panic!("{name}: no bloom filter on node"));
        for node in ["node-a", "node-b"] {
            assert_eq!(filter.check(node), nodes.contains(&node), "{name}: {node}");
        }
        assert!(!filter.check("gpu-node-017"), "{name}");
    }
}

/// Rows in every Parquet file of one table's hour directory.
fn rows_in(dir: &Path, table: &str, hour: &str) -> (usize, i64) {
    let hour_dir = dir.join(table).join("date=2026-11-21").join(hour);
    let mut files = 0;
    let mut rows = 0;
    for entry in std::fs::read_dir(&hour_dir).expect("hour directory") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "parquet") {
            let reader = SerializedFileReader::new(File::open(&path).expect("open"))
                .expect("a Parquet file");
            files += 1;
            rows += reader.metadata().file_metadata().num_rows();
        }
    }
    (files, rows)
}

/// A flush retried or replayed after compaction merged its file writes
/// nothing (the same bytes are in the compacted file); the same file name
/// with other rows is written, since those rows are new.
#[tokio::test]
async fn a_flush_repeated_after_compaction_writes_nothing_twice() {
    use gputel_collector::compact::{self, CompactOptions};
    use gputel_collector::persist::write_file;

    let dir = tempfile::tempdir().expect("tempdir");
    let store = gputel_collector::store::open_store(
        dir.path().to_str().expect("utf-8 temp path"),
        &Default::default(),
    )
    .expect("open store");
    let gpu_batch = |ids: std::ops::Range<u32>| {
        let mut buffer = WriteBuffer::default();
        let batch = Batch {
            seq: 1,
            gpu: ids.map(|id| gpu(id, id % 2, H6A + i64::from(id))).collect(),
            ..Default::default()
        };
        buffer.append("n1", validate_batch(&batch, NOW).expect("valid"));
        buffer
            .take_batches()
            .expect("buffer assembles")
            .into_iter()
            .find(|(table, _, _)| *table == Table::Gpu)
            .expect("gpu rows")
    };
    let (_, key, first) = gpu_batch(0..4);
    let (_, _, second) = gpu_batch(4..10);
    let first_path = PartitionPath::new(Table::Gpu, key, "c1-0000000000000001").expect("stem");
    let second_path = PartitionPath::new(Table::Gpu, key, "c1-0000000000000002").expect("stem");
    assert!(
        write_file(&store, &first_path, first.clone())
            .await
            .expect("write")
            > 0
    );
    assert!(
        write_file(&store, &second_path, second.clone())
            .await
            .expect("write")
            > 0
    );
    assert_eq!(rows_in(dir.path(), "gpu", "hour=06"), (2, 10));

    let options = CompactOptions {
        tables: vec![Table::Gpu],
        min_age: std::time::Duration::ZERO,
        ..CompactOptions::default()
    };
    let mut lease = lease(&store).await;
    let report = compact::compact(&store, NOW + 3_600_000_000, &options, &mut lease)
        .await
        .expect("compaction");
    assert_eq!((report.hours, report.files_in, report.rows), (1, 2, 10));
    assert_eq!(rows_in(dir.path(), "gpu", "hour=06"), (1, 10));

    // The same bytes again: already merged, not written.
    assert_eq!(
        write_file(&store, &first_path, first.clone())
            .await
            .expect("write"),
        0
    );
    assert_eq!(rows_in(dir.path(), "gpu", "hour=06"), (1, 10));

    // The same name with other rows: written.
    let (_, _, other) = gpu_batch(10..12);
    assert!(
        write_file(&store, &first_path, other.clone())
            .await
            .expect("write")
            > 0
    );
    assert_eq!(rows_in(dir.path(), "gpu", "hour=06"), (2, 12));
}

/// An hour with more rows than compaction sorts at once is merged a range
/// of nodes at a time, its rows spilled per range in between, into several
/// files: each sorted by (node, gpu, ts) from its first row to its last,
/// each node's hour in one file, one row per key, even for keys repeated
/// across files far apart in the listing, and no spill file left behind.
#[tokio::test]
async fn an_hour_too_large_to_sort_at_once_loses_every_duplicate() {
    use gputel_collector::compact::{self, CompactOptions};

    let dir = tempfile::tempdir().expect("tempdir");
    let store = gputel_collector::store::open_store(
        dir.path().to_str().expect("utf-8 temp path"),
        &Default::default(),
    )
    .expect("open store");
    const NODES: [&str; 6] = ["n1", "n2", "n3", "n4", "n5", "n6"];
    // Ticks 20 s apart over the whole of hour 06, on 2 GPUs of each node.
    let tick = |t: i64| H6A + t * 20_000_000;
    let gpu_rows = |ticks: std::ops::Range<i64>, temperature: u32| {
        let mut buffer = WriteBuffer::default();
        for (n, node) in NODES.iter().enumerate() {
            let batch = Batch {
                seq: 1,
                gpu: ticks
                    .clone()
                    .flat_map(|t| {
                        (0..2).map(move |g| GpuSample {
                            temperature_c: Some(temperature + n as u32),
                            ..gpu(g, g, tick(t))
                        })
                    })
                    .collect(),
                ..Default::default()
            };
            buffer.append(
                node,
                validate_batch(&batch, NOW + 3_600_000_000).expect("valid"),
            );
        }
        buffer
            .take_batches()
            .expect("buffer assembles")
            .into_iter()
            .find(|(table, _, _)| *table == Table::Gpu)
            .expect("gpu rows")
    };
    // Three collectors' files: the whole hour, its second half again, and
    // its first 30 ticks a third time; per node 360 + 180 + 60 rows, 360
    // keys.
    let inputs = [
        ("a1-0000000000000001", 0..180, 40),
        ("b2-0000000000000001", 90..180, 50),
        ("c3-0000000000000001", 0..30, 60),
    ];
    for (stem, ticks, temperature) in inputs.clone() {
        let (_, key, rows) = gpu_rows(ticks, temperature);
        let path = PartitionPath::new(Table::Gpu, key, stem).expect("stem");
        write_file(&store, &path, rows).await.expect("write");
    }
    assert_eq!(rows_in(dir.path(), "gpu", "hour=06"), (3, 3600));

    let hour_dir = dir.path().join("gpu/date=2026-11-21/hour=06");
    let mode = |path: &std::path::Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).expect("stat").permissions().mode()
    };
    // A store kept from other users, readable by a group.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&hour_dir, std::fs::Permissions::from_mode(0o750)).expect("chmod");
    }
    let hour_mode = mode(&hour_dir);

    // What a merge cut short by a crash left is deleted by the next.
    let stale = dir.path().join(".compacting/gputel-merge-stale");
    std::fs::create_dir_all(&stale).expect("mkdir");
    std::fs::write(stale.join("gpu-0.arrows"), b"spilled").expect("write");

    // A node's 600 rows a range, two nodes' a file.
    let options = CompactOptions {
        tables: vec![Table::Gpu],
        min_age: std::time::Duration::ZERO,
        merge_rows: 700,
        max_file_rows: 1300,
        ..CompactOptions::default()
    };
    // Each range's freed memory is handed back before the next is loaded
    // (other tests of this file may compact meanwhile: at least once a range).
    static RETURNED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    gputel_collector::memory::set_return_freed(|| {
        RETURNED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    let returned_before = RETURNED.load(std::sync::atomic::Ordering::SeqCst);
    // Each file's census and reading and each range's merge run apart
    // from the write path's memory.
    static APART: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    gputel_collector::memory::set_apart(|work| {
        APART.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        work();
    });
    let apart_before = APART.load(std::sync::atomic::Ordering::SeqCst);
    let mut lease = lease(&store).await;
    let report = compact::compact(&store, NOW + 7_200_000_000, &options, &mut lease)
        .await
        .expect("compaction");
    let returned = RETURNED.load(std::sync::atomic::Ordering::SeqCst) - returned_before;
    assert!(
        returned >= 6,
        "freed memory handed back {returned} times for 6 ranges"
    );
    let apart = APART.load(std::sync::atomic::Ordering::SeqCst) - apart_before;
    assert!(
        apart >= 3 + 3 + 6,
        "work run apart {apart} times for 3 files read twice and 6 ranges"
    );
    assert_eq!(
        (report.hours, report.files_in, report.rows, report.files_out),
        (1, 3, 3600, 3)
    );
    assert_eq!(report.duplicates, 6 * 240);
    assert_eq!(rows_in(dir.path(), "gpu", "hour=06"), (3, 2160));
    // The new hour directory is as readable as the old one was, no more.
    assert_eq!(mode(&hour_dir), hour_mode);

    // Every key once, the file whose name sorts last winning it (the
    // third collector's for ticks 0-29, the second's for 90-179).
    let mut keys = BTreeMap::new();
    let mut nodes_of_files = Vec::new();
    for entry in std::fs::read_dir(dir.path().join("gpu/date=2026-11-21/hour=06")).expect("hour") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "parquet") {
            continue;
        }
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(&path).expect("open"))
            .expect("reader")
            .build()
            .expect("reader");
        let mut rows = Vec::new();
        for batch in reader {
            let batch = batch.expect("batch");
            let node = node_names(&batch);
            let ts = batch["ts"].as_primitive::<TimestampMicrosecondType>();
            let gpu = batch["gpu"].as_primitive::<Int32Type>();
            let temperature = batch["temperature_c"].as_primitive::<Int32Type>();
            for (i, node) in node.into_iter().enumerate() {
                let t = (ts.value(i) - H6A) / 20_000_000;
                rows.push((node.clone(), gpu.value(i), t));
                let previous = keys.insert((node, t, gpu.value(i)), temperature.value(i));
                assert_eq!(previous, None, "tick {t} gpu {} twice", gpu.value(i));
            }
        }
        assert!(rows.is_sorted(), "{} is not sorted", path.display());
        let mut nodes: Vec<String> = rows.into_iter().map(|(n, _, _)| n).collect();
        nodes.dedup();
        nodes_of_files.push(nodes);
    }
    nodes_of_files.sort();
    assert_eq!(
        nodes_of_files,
        [["n1", "n2"], ["n3", "n4"], ["n5", "n6"]].map(|f| f.map(str::to_owned))
    );
    assert_eq!(keys.len(), 6 * 360);
    for ((node, t, _), temperature) in keys {
        let n: u32 = node[1..].parse::<u32>().expect("node number") - 1;
        let expected = match t {
            0..30 => 60,
            90..180 => 50,
            _ => 40,
        };
        assert_eq!(temperature as u32, expected + n, "{node} tick {t}");
    }
    let staging = dir.path().join(".compacting");
    let left: Vec<_> = std::fs::read_dir(&staging)
        .map(|d| d.map(|e| e.expect("entry").path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in {}: {left:?}", staging.display());

    // The next round leaves the hour of three compacted files as it is.
    let listing = || {
        use std::os::unix::fs::MetadataExt;
        let mut entries: Vec<(String, u64)> = std::fs::read_dir(&hour_dir)
            .expect("hour")
            .map(|e| {
                let e = e.expect("entry");
                let name = e.file_name().to_string_lossy().into_owned();
                (name, e.metadata().expect("stat").ino())
            })
            .collect();
        entries.sort();
        entries
    };
    let compacted = listing();
    let again = compact::compact(&store, NOW + 7_200_000_000, &options, &mut lease)
        .await
        .expect("compaction");
    assert_eq!((again.hours, again.files_in, again.rows), (0, 0, 0));
    assert_eq!(listing(), compacted);

    // A file flushed into it later merges it again, with its compacted files.
    let (_, key, rows) = gpu_rows(100..101, 70);
    let path = PartitionPath::new(Table::Gpu, key, "d4-0000000000000001").expect("stem");
    write_file(&store, &path, rows).await.expect("write");
    let late = compact::compact(&store, NOW + 7_200_000_000, &options, &mut lease)
        .await
        .expect("compaction");
    assert_eq!(
        (
            late.hours,
            late.files_in,
            late.rows,
            late.duplicates,
            late.files_out
        ),
        (1, 4, 2160 + 12, 12, 2)
    );
    // The census counts 362 rows a node now: three nodes a file.
    assert_eq!(rows_in(dir.path(), "gpu", "hour=06"), (2, 2160));
    let again = compact::compact(&store, NOW + 7_200_000_000, &options, &mut lease)
        .await
        .expect("compaction");
    assert_eq!((again.hours, again.files_in), (0, 0));

    // The binary, with its allocator's arena for compaction, merges the
    // same three files into one of the hour's 2160 keys.
    let other = tempfile::tempdir().expect("tempdir");
    let other_store = gputel_collector::store::open_store(
        other.path().to_str().expect("utf-8 temp path"),
        &Default::default(),
    )
    .expect("open store");
    for (stem, ticks, temperature) in inputs {
        let (_, key, rows) = gpu_rows(ticks, temperature);
        let path = PartitionPath::new(Table::Gpu, key, stem).expect("stem");
        write_file(&other_store, &path, rows).await.expect("write");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gputel-collector"))
        .args(["compact", "--table", "gpu", "--store"])
        .arg(other.path())
        .output()
        .expect("run gputel-collector compact");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with("compacted 1 hours (3 files, 3600 rows"),
        "{stdout}"
    );
    assert_eq!(rows_in(other.path(), "gpu", "hour=06"), (1, 2160));
}

/// The `node` column of a batch, as text.
fn node_names(batch: &RecordBatch) -> Vec<String> {
    let node = batch["node"].as_dictionary::<Int32Type>();
    let values = node.values().as_string::<i32>();
    node.keys()
        .values()
        .iter()
        .map(|&k| values.value(k as usize).to_owned())
        .collect()
}

/// The store's compaction lease, for a test's own compaction.
async fn lease(store: &gputel_collector::store::Store) -> gputel_collector::compact::Lease {
    gputel_collector::compact::Lease::acquire(
        store,
        "test",
        std::time::Duration::from_secs(60),
        Default::default(),
    )
    .await
    .expect("the lease of a store nobody else compacts")
}
