//! Stored size, not timed. DESIGN.md's target: ≤ 1 byte per metric value on
//! realistic data. Prints, per table, the Parquet bytes per metric value of
//! one hour of 16 simulated nodes (8 GPUs, 4 IB ports each) at 1 Hz:
//!
//! - `hourly`: the whole hour in one file per table, as hourly compaction
//!   would leave it;
//! - `per flush`: one file per table every 60 s (the default flush
//!   interval), as the collector writes them before compaction.
//!
//! A metric value is one non-null value of a numeric column of a stored row
//! that is not a key column (time, node, GPU index, UUID, model, IB device,
//! port): 11 per `gpu` row, 11 per `node` row, 9 per `ib` row. The bytes are
//! whole files (keys, bloom filters, page indexes and footers included);
//! "metric cols" counts only the compressed column chunks of metric columns.
//!
//! Under `cargo test --benches` it runs on 2 nodes for 2 minutes instead.

use std::collections::BTreeMap;

use arrow_array::RecordBatch;
use bytes::Bytes;
use gputel_benches::{
    AgentBatch, bench_mode, buffer_and_take, metric_columns, metric_values, simulate,
};
use gputel_collector::persist::{encode, sort_rows};
use gputel_schemas::Table;
use parquet::file::reader::{FileReader, SerializedFileReader};

/// The default flush interval, in ticks of 1 s.
const FLUSH_TICKS: usize = 60;

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
}

impl Size {
    fn add(&mut self, table: Table, batch: &RecordBatch) {
        let sorted = sort_rows(table, batch).expect("sort key columns exist");
        let bytes = encode(table, table.schema(), &sorted).expect("encode Parquet");
        self.files += 1;
        self.rows += batch.num_rows();
        self.values += metric_values(table, batch);
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

fn sizes(chunks: &[&[AgentBatch]]) -> BTreeMap<Table, Size> {
    let mut out: BTreeMap<Table, Size> = BTreeMap::new();
    for chunk in chunks {
        for (table, _, batch) in buffer_and_take(chunk) {
            out.entry(table).or_default().add(table, &batch);
        }
    }
    out
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
        "\nhourly files, compressed bytes per column (per value for metric columns, per row for keys)"
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
                let bytes = s.columns.get(f.name()).copied().unwrap_or(0);
                let per_row = bytes as f64 / s.rows.max(1) as f64;
                let mark = if metric.contains(&f.name().as_str()) {
                    ""
                } else {
                    "*"
                };
                format!("{}{mark} {per_row:.3}", f.name())
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
    let ib: Vec<f64> = batches
        .iter()
        .flat_map(|b| &b.batch.ib)
        .filter_map(|p| p.xmit_bytes_per_s)
        .collect();
    let ib_mean = ib.iter().sum::<f64>() / ib.len().max(1) as f64 / 1e9;
    let cpu: Vec<f64> = batches
        .iter()
        .flat_map(|b| &b.batch.node)
        .filter_map(|n| n.cpu_user_pct.map(f64::from))
        .collect();
    let cpu_mean = cpu.iter().sum::<f64>() / cpu.len().max(1) as f64;
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
    let hourly = sizes(&[&batches]);
    print_table("hourly: one file per table", &hourly);
    print_columns(&hourly);
    let flushes: Vec<&[AgentBatch]> = batches.chunks(nodes * FLUSH_TICKS).collect();
    print_table(
        &format!(
            "per flush: one file per table every {FLUSH_TICKS} s ({} flushes)",
            flushes.len()
        ),
        &sizes(&flushes),
    );
}
