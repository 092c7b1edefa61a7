//! Stored size, not timed. DESIGN.md's target: ≤ 1 byte per metric value on
//! realistic data. Prints, per table, the Parquet bytes per metric value of
//! one hour of 16 simulated nodes (8 GPUs, 4 IB ports each) at 1 Hz:
//!
//! - `hourly`: the whole hour in one file per table, written with the
//!   settings `gputel-collector compact` uses (equal row groups);
//! - `per flush`: one file per table every 10 s (the default flush
//!   interval), as the collector writes them before compaction;
//! - the hourly files again with [`Values::Noise`]: every value random
//!   noise over its range, the worst case.
//!
//! A metric value is one non-null value of a numeric column of a stored row
//! that is not a key column (time, node, GPU index, UUID, model, IB device,
//! port): 12 per `gpu` row and the energy counter in every tenth (read at
//! the agent's slow-read ticks), 11 per `node` row, 5 per `ib` row. The
//! bytes are whole files (keys, bloom filters, page indexes and footers included);
//! "metric cols" counts only the compressed column chunks of metric columns.
//! Then the bytes per column type (timestamp, integer, float, boolean,
//! dictionary string) and per column, and the hourly total under other
//! writer settings (zstd levels, per-type encodings), to show what each
//! setting of `collector/src/persist.rs` buys.
//!
//! Under `cargo test --benches` it runs on 2 nodes for 2 minutes instead.

use std::collections::BTreeMap;

use arrow_array::RecordBatch;
use arrow_schema::{DataType, Schema};
use bytes::Bytes;
use gputel_benches::{
    AgentBatch, Values, bench_mode, buffer_and_take, metric_columns, metric_values, simulate,
    simulate_values,
};
use gputel_collector::persist::{compacted_properties, encode_with, sort_and_encode, sort_rows};
use gputel_schemas::{BatchColumns, Table};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::file::properties::{
    DEFAULT_DATA_PAGE_ROW_COUNT_LIMIT, DEFAULT_PAGE_SIZE, WriterPropertiesBuilder,
};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::schema::types::ColumnPath;

/// The default flush interval (`--flush-interval 10s`), in ticks of 1 s.
const FLUSH_TICKS: usize = 10;

/// What the files of one table add up to.
#[derive(Debug, Default, Clone)]
struct Size {
    files: usize,
    rows: usize,
    values: u64,
    file_bytes: u64,
    metric_col_bytes: u64,
    key_col_bytes: u64,
    bloom_bytes: u64,
    /// Compressed bytes per column name.
    columns: BTreeMap<String, u64>,
    /// Non-null values per column name.
    col_values: BTreeMap<String, u64>,
}

/// Which writer settings a file is written with.
#[derive(Debug, Clone, Copy)]
enum Settings {
    /// The collector's flushes: `persist::sort_and_encode`.
    Flush,
    /// `gputel-collector compact`: `persist::compacted_properties`.
    Compacted,
    /// The compacted settings, changed by a variant.
    Variant(Variant),
}

impl Settings {
    /// `batch` as one file written with these settings: a flush's through
    /// the flush's own code (its columns without a value uncompressed), the
    /// others by parquet's `ArrowWriter` from the sorted rows.
    fn encode(self, table: Table, batch: &RecordBatch) -> Bytes {
        let compacted = || compacted_properties(table, batch.num_rows());
        let props = match self {
            Settings::Flush => {
                return sort_and_encode(table, &mut BatchColumns::from(batch.clone()), "flush")
                    .expect("encode Parquet");
            }
            Settings::Compacted => compacted(),
            Settings::Variant(v) => (v.change)(compacted().into_builder(), &table.schema()).build(),
        };
        let sorted = sort_rows(table, batch).expect("sort key columns exist");
        encode_with(table.schema(), props, &sorted).expect("encode Parquet")
    }
}

/// Other writer settings, tried on the hourly files.
#[derive(Debug, Clone, Copy)]
struct Variant {
    name: &'static str,
    change: fn(WriterPropertiesBuilder, &Schema) -> WriterPropertiesBuilder,
}

fn zstd(b: WriterPropertiesBuilder, level: i32) -> WriterPropertiesBuilder {
    b.set_compression(Compression::ZSTD(
        ZstdLevel::try_new(level).expect("valid zstd level"),
    ))
}

/// Changes every column of `schema` whose type `pick` accepts.
fn per_column(
    mut b: WriterPropertiesBuilder,
    schema: &Schema,
    pick: fn(&DataType) -> bool,
    change: fn(WriterPropertiesBuilder, ColumnPath) -> WriterPropertiesBuilder,
) -> WriterPropertiesBuilder {
    for f in schema.fields() {
        if pick(f.data_type()) {
            b = change(b, ColumnPath::from(f.name().as_str()));
        }
    }
    b
}

fn is_int(t: &DataType) -> bool {
    matches!(t, DataType::Int32 | DataType::Int64)
}

fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float32 | DataType::Float64)
}

const VARIANTS: &[Variant] = &[
    Variant {
        name: "zstd level 1",
        change: |b, _| zstd(b, 1),
    },
    Variant {
        name: "zstd level 9",
        change: |b, _| zstd(b, 9),
    },
    Variant {
        name: "zstd level 19",
        change: |b, _| zstd(b, 19),
    },
    Variant {
        name: "data pages v2 (null flags stored uncompressed)",
        change: |b, _| b.set_writer_version(parquet::file::properties::WriterVersion::PARQUET_2_0),
    },
    Variant {
        name: "one page per column chunk (compacted files before 2026-11-25, night)",
        change: |b, _| {
            b.set_data_page_row_count_limit(gputel_collector::persist::MAX_ROW_GROUP_ROWS)
        },
    },
    Variant {
        name: "pages of 20 000 rows (the writer's default)",
        change: |b, _| {
            b.set_data_page_row_count_limit(DEFAULT_DATA_PAGE_ROW_COUNT_LIMIT)
                .set_data_page_size_limit(DEFAULT_PAGE_SIZE)
        },
    },
    Variant {
        name: "floats PLAIN instead of BYTE_STREAM_SPLIT",
        change: |b, s| {
            per_column(b, s, is_float, |b, c| {
                b.set_column_encoding(c, Encoding::PLAIN)
            })
        },
    },
    Variant {
        name: "integers PLAIN instead of DELTA_BINARY_PACKED",
        change: |b, s| {
            per_column(b, s, is_int, |b, c| {
                b.set_column_encoding(c, Encoding::PLAIN)
            })
        },
    },
    Variant {
        name: "integers BYTE_STREAM_SPLIT",
        change: |b, s| {
            per_column(b, s, is_int, |b, c| {
                b.set_column_encoding(c, Encoding::BYTE_STREAM_SPLIT)
            })
        },
    },
    Variant {
        name: "integers dictionary (fallback DELTA_BINARY_PACKED)",
        change: |b, s| {
            per_column(b, s, is_int, |b, c| {
                b.set_column_dictionary_enabled(c, true)
            })
        },
    },
    Variant {
        name: "floats dictionary (fallback BYTE_STREAM_SPLIT)",
        change: |b, s| {
            per_column(b, s, is_float, |b, c| {
                b.set_column_dictionary_enabled(c, true)
            })
        },
    },
];

/// The column types the bytes are grouped by.
fn type_class(t: &DataType) -> &'static str {
    match t {
        DataType::Timestamp(_, _) => "timestamp",
        DataType::Int32 | DataType::Int64 => "integer",
        DataType::Float32 | DataType::Float64 => "float",
        DataType::Boolean => "boolean",
        DataType::Dictionary(_, _) => "dictionary string",
        _ => "other",
    }
}

impl Size {
    fn add(&mut self, table: Table, batch: &RecordBatch, settings: Settings) {
        let bytes = settings.encode(table, batch);
        self.files += 1;
        self.rows += batch.num_rows();
        self.values += metric_values(table, batch);
        for (f, col) in batch.schema().fields().iter().zip(batch.columns()) {
            *self.col_values.entry(f.name().clone()).or_default() +=
                (col.len() - col.null_count()) as u64;
        }
        self.file_bytes += bytes.len() as u64;
        let schema = table.schema();
        let metric: Vec<&str> = metric_columns(table)
            .into_iter()
            .map(|i| schema.field(i).name().as_str())
            .collect();
        let reader = SerializedFileReader::new(Bytes::clone(&bytes)).expect("read back the footer");
        for rg in reader.metadata().row_groups() {
            for col in rg.columns() {
                let name = col.column_path().string();
                let size = col.compressed_size() as u64;
                if metric.contains(&name.as_str()) {
                    self.metric_col_bytes += size;
                } else {
                    self.key_col_bytes += size;
                }
                self.bloom_bytes += col.bloom_filter_length().unwrap_or(0) as u64;
                *self.columns.entry(name).or_default() += size;
            }
        }
    }

    /// Footers, page indexes and magic: the file less its column chunks and bloom filters.
    fn other_bytes(&self) -> u64 {
        self.file_bytes
            .saturating_sub(self.metric_col_bytes + self.key_col_bytes + self.bloom_bytes)
    }

    fn per_value(&self, bytes: u64) -> f64 {
        bytes as f64 / self.values.max(1) as f64
    }
}

fn sizes(chunks: &[&[AgentBatch]], settings: Settings) -> BTreeMap<Table, Size> {
    let mut out: BTreeMap<Table, Size> = BTreeMap::new();
    for chunk in chunks {
        for (table, _, batch) in buffer_and_take(chunk) {
            out.entry(table).or_default().add(table, &batch, settings);
        }
    }
    out
}

fn total(sizes: &BTreeMap<Table, Size>) -> (u64, u64) {
    sizes
        .values()
        .fold((0, 0), |(b, v), s| (b + s.file_bytes, v + s.values))
}

/// Bytes per column type: per metric value for metric columns (over the
/// values of that type), and the share of the file each type takes.
fn print_types(title: &str, sizes: &BTreeMap<Table, Size>) {
    println!("\n{title}: compressed bytes per column type");
    println!(
        "{:<6} {:<22} {:>7} {:>11} {:>11} {:>13} {:>8}",
        "table", "columns", "count", "bytes", "values", "bytes/value", "of file"
    );
    for (table, s) in sizes {
        let schema = table.schema();
        let metric = metric_columns(*table);
        // "metric TYPE" or "other TYPE" -> (columns, bytes, metric values)
        let mut by_type: BTreeMap<String, (usize, u64, u64)> = BTreeMap::new();
        for (i, f) in schema.fields().iter().enumerate() {
            let Some(&bytes) = s.columns.get(f.name()) else {
                continue;
            };
            let is_metric = metric.contains(&i);
            let kind = if is_metric { "metric" } else { "other" };
            let e = by_type
                .entry(format!("{kind} {}", type_class(f.data_type())))
                .or_default();
            e.0 += 1;
            e.1 += bytes;
            if is_metric {
                e.2 += s.col_values.get(f.name()).copied().unwrap_or(0);
            }
        }
        for (class, (cols, bytes, values)) in by_type {
            let per_value = if values > 0 {
                format!("{:.3}", bytes as f64 / values as f64)
            } else {
                "-".to_owned()
            };
            println!(
                "{:<6} {:<22} {:>7} {:>11} {:>11} {:>13} {:>7.1}%",
                table.name(),
                class,
                cols,
                bytes,
                values,
                per_value,
                100.0 * bytes as f64 / s.file_bytes.max(1) as f64
            );
        }
    }
    println!(
        "(metric: the metric columns of that type, bytes per metric value in them; other: key \
         and non-metric columns, e.g. ts, node, gpu, job_id, the port state)"
    );
}

fn print_table(title: &str, sizes: &BTreeMap<Table, Size>) {
    println!("\n{title}");
    println!(
        "{:<6} {:>5} {:>9} {:>10} {:>11} {:>11} {:>12} {:>10} {:>10} {:>10}",
        "table",
        "files",
        "rows",
        "values",
        "file bytes",
        "bytes/value",
        "metric cols",
        "keys",
        "bloom",
        "other"
    );
    let mut total = Size::default();
    for (table, s) in sizes {
        println!(
            "{:<6} {:>5} {:>9} {:>10} {:>11} {:>11.3} {:>12.3} {:>10} {:>10} {:>10}",
            table.name(),
            s.files,
            s.rows,
            s.values,
            s.file_bytes,
            s.per_value(s.file_bytes),
            s.per_value(s.metric_col_bytes),
            s.key_col_bytes,
            s.bloom_bytes,
            s.other_bytes(),
        );
        total.files += s.files;
        total.rows += s.rows;
        total.values += s.values;
        total.file_bytes += s.file_bytes;
        total.metric_col_bytes += s.metric_col_bytes;
        total.key_col_bytes += s.key_col_bytes;
        total.bloom_bytes += s.bloom_bytes;
    }
    println!(
        "{:<6} {:>5} {:>9} {:>10} {:>11} {:>11.3} {:>12.3} {:>10} {:>10} {:>10}",
        "all",
        total.files,
        total.rows,
        total.values,
        total.file_bytes,
        total.per_value(total.file_bytes),
        total.per_value(total.metric_col_bytes),
        total.key_col_bytes,
        total.bloom_bytes,
        total.other_bytes(),
    );
    println!(
        "(bytes/value: whole files, per metric value; metric cols: the metric columns' chunks, \
         per metric value; keys, bloom, other: bytes in key columns' chunks, in bloom filters, \
         and in the rest: footers, page indexes)"
    );
}

fn print_columns(sizes: &BTreeMap<Table, Size>) {
    println!(
        "\nhourly files, compressed bytes per column (per value for metric columns, - where \
         they hold none; per row for keys)"
    );
    for (table, s) in sizes {
        let schema = table.schema();
        let metric: Vec<&str> = metric_columns(*table)
            .into_iter()
            .map(|i| schema.field(i).name().as_str())
            .collect();
        let line: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| {
                let bytes = s.columns.get(f.name()).copied().unwrap_or(0) as f64;
                if metric.contains(&f.name().as_str()) {
                    match s.col_values.get(f.name()).copied().unwrap_or(0) {
                        0 => format!("{} -", f.name()),
                        values => format!("{} {:.3}", f.name(), bytes / values as f64),
                    }
                } else {
                    format!("{}* {:.3}", f.name(), bytes / s.rows.max(1) as f64)
                }
            })
            .collect();
        println!("{:<5} {}", table.name(), line.join(", "));
    }
    println!("(* key column)");
}

/// What the data looks like, so a reader can judge whether it is realistic.
fn print_summary(batches: &[AgentBatch]) {
    let gpus: Vec<_> = batches.iter().flat_map(|b| &b.batch.gpu).collect();
    let stats = |f: &dyn Fn(&gputel_proto::GpuSample) -> Option<f64>| {
        let v: Vec<f64> = gpus.iter().filter_map(|g| f(g)).collect();
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        (lo, v.iter().sum::<f64>() / v.len().max(1) as f64, hi)
    };
    let (t_lo, t_mean, t_hi) = stats(&|g| g.temperature_c.map(f64::from));
    let (p_lo, p_mean, p_hi) = stats(&|g| g.power_mw.map(|p| f64::from(p) / 1000.0));
    let (u_lo, u_mean, u_hi) = stats(&|g| g.gpu_util_pct.map(f64::from));
    let (c_lo, _, c_hi) = stats(&|g| g.sm_clock_mhz.map(f64::from));
    // Rates and shares from the first and last counters of each port and node.
    let mut ports: BTreeMap<(&str, &str), [(i64, u64); 2]> = BTreeMap::new();
    let mut hosts: BTreeMap<&str, [(u64, u64); 2]> = BTreeMap::new();
    for b in batches {
        for p in &b.batch.ib {
            if let Some(v) = p.xmit_bytes {
                let e = ports
                    .entry((&b.node, &p.device))
                    .or_insert([(p.ts_us, v); 2]);
                e[1] = (p.ts_us, v);
            }
        }
        for n in &b.batch.node {
            let cpu = gputel_schemas::derive::CpuJiffies::of_row(n);
            if let Some((user, total)) = cpu.and_then(|c| Some((c.user, c.total()?))) {
                let e = hosts.entry(&b.node).or_insert([(user, total); 2]);
                e[1] = (user, total);
            }
        }
    }
    let port_rates: Vec<f64> = ports
        .values()
        .filter(|[a, b]| b.0 > a.0)
        .map(|[a, b]| (b.1 - a.1) as f64 / ((b.0 - a.0) as f64 / 1e6))
        .collect();
    let ib_mean = port_rates.iter().sum::<f64>() / port_rates.len().max(1) as f64 / 1e9;
    let (user, total) = hosts
        .values()
        .fold((0, 0), |(u, t), [a, b]| (u + b.0 - a.0, t + b.1 - a.1));
    let cpu_mean = 100.0 * user as f64 / total.max(1) as f64;
    println!(
        "data (min/mean/max): GPU temperature {t_lo:.0}/{t_mean:.1}/{t_hi:.0} °C, \
         power {p_lo:.0}/{p_mean:.0}/{p_hi:.0} W, utilization {u_lo:.0}/{u_mean:.0}/{u_hi:.0} %, \
         SM clock {c_lo:.0}–{c_hi:.0} MHz; IB transmit mean {ib_mean:.1} GB/s per port; \
         CPU user mean {cpu_mean:.1} %"
    );
}

fn main() {
    let (nodes, seconds) = if bench_mode() { (16, 3600) } else { (2, 120) };
    let batches = simulate(nodes, seconds);
    println!(
        "stored size: {nodes} simulated nodes × {seconds} s at 1 Hz, 8 GPUs and 4 IB ports per node"
    );
    print_summary(&batches);
    let hourly = sizes(&[&batches], Settings::Compacted);
    print_table("hourly: one file per table, as compacted", &hourly);
    print_types("hourly", &hourly);
    print_columns(&hourly);
    let flushes: Vec<&[AgentBatch]> = batches.chunks(nodes * FLUSH_TICKS).collect();
    let flushed = sizes(&flushes, Settings::Flush);
    let title = format!(
        "per flush: one file per table every {FLUSH_TICKS} s ({} flushes)",
        flushes.len()
    );
    print_table(&title, &flushed);
    print_types("per flush", &flushed);

    println!("\nhourly files under other writer settings (all tables)");
    let (base_bytes, values) = total(&hourly);
    println!("{:<52} {:>11} {:>11}", "settings", "bytes", "bytes/value");
    println!(
        "{:<52} {:>11} {:>11.3}",
        "the collector's (compacted)",
        base_bytes,
        base_bytes as f64 / values.max(1) as f64
    );
    for v in VARIANTS {
        let (bytes, values) = total(&sizes(&[&batches], Settings::Variant(*v)));
        println!(
            "{:<52} {:>11} {:>11.3}",
            v.name,
            bytes,
            bytes as f64 / values.max(1) as f64
        );
    }

    // The worst case: the same rows and keys, every value random noise.
    let noise = simulate_values(nodes, seconds, Values::Noise);
    let noisy = sizes(&[&noise], Settings::Compacted);
    print_table(
        "hourly, values of random noise (gputel-loadgen --values noise): one file per table, as compacted",
        &noisy,
    );
    print_types("hourly, noise", &noisy);
}
