use std::path::PathBuf;
use std::sync::{Arc, LazyLock};

use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};

/// Column names shared by several tables.
pub mod col {
    pub const TS: &str = "ts";
    pub const NODE: &str = "node";
    pub const GPU: &str = "gpu";
    pub const DEVICE: &str = "device";
    pub const PORT: &str = "port";
    pub const PID: &str = "pid";
    pub const JOB_ID: &str = "job_id";
}

/// A table the collector writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// One row per GPU per tick.
    Gpu,
    /// One row per node per tick.
    Node,
    /// One row per InfiniBand port per tick.
    Ib,
    /// One row per GPU event: XID, GPU lost, start of throttling.
    Event,
    /// One row per compute process per GPU per process refresh.
    GpuProcess,
    /// What the collector observed of each job: one row per (job, node, GPU)
    /// per written file, with the first and last sample time.
    Job,
    /// One row per alert firing or resolution raised by the collector's rules.
    Alert,
}

impl Table {
    /// Every table, in a stable order.
    pub const ALL: [Table; 7] = [
        Table::Gpu,
        Table::Node,
        Table::Ib,
        Table::Event,
        Table::GpuProcess,
        Table::Job,
        Table::Alert,
    ];

    /// The table's name: its directory under the store and its golden file's stem.
    pub fn name(self) -> &'static str {
        match self {
            Table::Gpu => "gpu",
            Table::Node => "node",
            Table::Ib => "ib",
            Table::Event => "event",
            Table::GpuProcess => "gpu_process",
            Table::Job => "job",
            Table::Alert => "alert",
        }
    }

    /// The table's Arrow schema. Partition columns (`date`, `hour`) are not in
    /// the files: readers derive them from the path.
    pub fn schema(self) -> SchemaRef {
        match self {
            Table::Gpu => GPU.clone(),
            Table::Node => NODE.clone(),
            Table::Ib => IB.clone(),
            Table::Event => EVENT.clone(),
            Table::GpuProcess => GPU_PROCESS.clone(),
            Table::Job => JOB.clone(),
            Table::Alert => ALERT.clone(),
        }
    }

    /// Columns the rows of a file are sorted by: node, then device, then time.
    pub fn sort_key(self) -> &'static [&'static str] {
        match self {
            Table::Gpu | Table::Event | Table::Alert => &[col::NODE, col::GPU, col::TS],
            Table::GpuProcess => &[col::NODE, col::GPU, col::PID, col::TS],
            Table::Job => &[col::JOB_ID, col::NODE, col::GPU, col::TS],
            Table::Node => &[col::NODE, col::TS],
            Table::Ib => &[col::NODE, col::DEVICE, col::PORT, col::TS],
        }
    }

    /// String columns worth a bloom filter: the ones queries filter on by equality.
    pub fn bloom_filter_columns(self) -> &'static [&'static str] {
        match self {
            Table::Node | Table::Ib => &[col::NODE],
            Table::Gpu | Table::Event | Table::GpuProcess | Table::Job | Table::Alert => {
                &[col::NODE, col::JOB_ID]
            }
        }
    }
}

impl std::fmt::Display for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn ts() -> Field {
    Field::new(
        col::TS,
        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        false,
    )
}

fn dict_str(name: &str, nullable: bool) -> Field {
    Field::new_dictionary(name, DataType::Int32, DataType::Utf8, nullable)
}

fn opt(name: &str, data_type: DataType) -> Field {
    Field::new(name, data_type, true)
}

static GPU: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        ts(),
        dict_str(col::NODE, false),
        Field::new(col::GPU, DataType::Int32, false),
        dict_str("uuid", false),
        dict_str("model", false),
        opt("temperature_c", DataType::Int32),
        opt("memory_temperature_c", DataType::Int32),
        opt("power_mw", DataType::Int64),
        opt("energy_mj", DataType::Int64),
        opt("sm_clock_mhz", DataType::Int32),
        opt("memory_clock_mhz", DataType::Int32),
        opt("gpu_util_pct", DataType::Int32),
        opt("memory_copy_util_pct", DataType::Int32),
        opt("fb_used_bytes", DataType::Int64),
        opt("fb_free_bytes", DataType::Int64),
        opt("fb_total_bytes", DataType::Int64),
        opt("sm_active_pct", DataType::Float32),
        opt("sm_occupancy_pct", DataType::Float32),
        opt("tensor_active_pct", DataType::Float32),
        opt("dram_active_pct", DataType::Float32),
        opt("power_limit_mw", DataType::Int64),
        opt("power_avg_mw", DataType::Int64),
        opt("clock_event_reasons", DataType::Int64),
        opt("throttle_gpu_idle", DataType::Boolean),
        opt("throttle_sw_power_cap", DataType::Boolean),
        opt("throttle_hw_slowdown", DataType::Boolean),
        opt("throttle_sync_boost", DataType::Boolean),
        opt("throttle_sw_thermal", DataType::Boolean),
        opt("throttle_hw_thermal", DataType::Boolean),
        opt("throttle_hw_power_brake", DataType::Boolean),
        opt("ecc_corrected_volatile", DataType::Int64),
        opt("ecc_uncorrected_volatile", DataType::Int64),
        opt("ecc_corrected_aggregate", DataType::Int64),
        opt("ecc_uncorrected_aggregate", DataType::Int64),
        opt("retired_pages_sbe", DataType::Int64),
        opt("retired_pages_dbe", DataType::Int64),
        opt("retired_pages_pending", DataType::Boolean),
        opt("remapped_rows_corrected", DataType::Int32),
        opt("remapped_rows_uncorrected", DataType::Int32),
        opt("remapped_rows_pending", DataType::Boolean),
        opt("remapped_rows_failure", DataType::Boolean),
        opt("pcie_replay_count", DataType::Int64),
        opt("pcie_tx_bytes_per_s", DataType::Int64),
        opt("pcie_rx_bytes_per_s", DataType::Int64),
        opt("nvlink_tx_bytes_per_s", DataType::Int64),
        opt("nvlink_rx_bytes_per_s", DataType::Int64),
        Field::new("xid_count", DataType::Int32, false),
        dict_str(col::JOB_ID, true),
        dict_str("pod_uid", true),
        Field::new("job_count", DataType::Int32, false),
    ]))
});

static NODE: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        ts(),
        dict_str(col::NODE, false),
        Field::new("cpu_count", DataType::Int32, false),
        opt("cpu_user_pct", DataType::Float32),
        opt("cpu_system_pct", DataType::Float32),
        opt("cpu_iowait_pct", DataType::Float32),
        opt("cpu_idle_pct", DataType::Float32),
        opt("memory_total_bytes", DataType::Int64),
        opt("memory_used_bytes", DataType::Int64),
        opt("memory_available_bytes", DataType::Int64),
        opt("load1", DataType::Float32),
        opt("load5", DataType::Float32),
        opt("load15", DataType::Float32),
        Field::new(
            "jobs",
            DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, false))),
            false,
        ),
    ]))
});

static IB: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        ts(),
        dict_str(col::NODE, false),
        dict_str(col::DEVICE, false),
        Field::new(col::PORT, DataType::Int32, false),
        dict_str("state", false),
        opt("rate_gbps", DataType::Float64),
        opt("xmit_bytes", DataType::Int64),
        opt("rcv_bytes", DataType::Int64),
        opt("xmit_packets", DataType::Int64),
        opt("rcv_packets", DataType::Int64),
        opt("xmit_bytes_per_s", DataType::Float64),
        opt("rcv_bytes_per_s", DataType::Float64),
        opt("xmit_packets_per_s", DataType::Float64),
        opt("rcv_packets_per_s", DataType::Float64),
        opt("symbol_error", DataType::Int64),
        opt("link_downed", DataType::Int64),
        opt("link_error_recovery", DataType::Int64),
        opt("port_rcv_errors", DataType::Int64),
        opt("port_xmit_discards", DataType::Int64),
        opt("port_xmit_wait", DataType::Int64),
        opt("hw_out_of_buffer", DataType::Int64),
        opt("hw_out_of_sequence", DataType::Int64),
        opt("hw_packet_seq_err", DataType::Int64),
        opt("hw_local_ack_timeout_err", DataType::Int64),
        opt("hw_rnr_nak_retry_err", DataType::Int64),
        opt("hw_implied_nak_seq_err", DataType::Int64),
    ]))
});

static EVENT: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        ts(),
        dict_str(col::NODE, false),
        Field::new(col::GPU, DataType::Int32, false),
        dict_str("uuid", false),
        dict_str("kind", false),
        Field::new("code", DataType::Int64, false),
        Field::new("detail", DataType::Utf8, false),
        dict_str(col::JOB_ID, true),
    ]))
});

static GPU_PROCESS: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        ts(),
        dict_str(col::NODE, false),
        Field::new(col::GPU, DataType::Int32, false),
        dict_str("uuid", false),
        Field::new(col::PID, DataType::Int32, false),
        opt("used_memory_bytes", DataType::Int64),
        dict_str("command", false),
        dict_str(col::JOB_ID, true),
        dict_str("pod_uid", true),
    ]))
});

static JOB: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        dict_str(col::JOB_ID, false),
        dict_str(col::NODE, false),
        Field::new(col::GPU, DataType::Int32, false),
        // First sample of the job on this GPU in the file; the partition's time.
        ts(),
        Field::new(
            "last_ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("samples", DataType::Int64, false),
    ]))
});

static ALERT: LazyLock<SchemaRef> = LazyLock::new(|| {
    let micros = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    Arc::new(Schema::new(vec![
        // Sample time of the transition: the sample that completed `for`
        // (firing) or the clear condition (resolved).
        ts(),
        dict_str(col::NODE, false),
        // Null for node-wide rules (node power).
        opt(col::GPU, DataType::Int32),
        dict_str("uuid", true),
        dict_str("model", true),
        dict_str(col::JOB_ID, true),
        dict_str("rule", false),
        dict_str("severity", false),
        dict_str("status", false),
        dict_str("metric", false),
        opt("value", DataType::Float64),
        opt("threshold", DataType::Float64),
        Field::new("starts_at", micros, false),
    ]))
});

/// A schema as stable text, one column a line: `name: type[ not null]`.
/// This is the format of the golden files.
pub fn describe_schema(schema: &Schema) -> String {
    let mut out = String::new();
    for field in schema.fields() {
        out.push_str(field.name());
        out.push_str(": ");
        out.push_str(&field.data_type().to_string());
        if !field.is_nullable() {
            out.push_str(" not null");
        }
        out.push('\n');
    }
    out
}

/// Where a table's golden schema file lives in the source tree.
pub fn golden_path(table: Table) -> PathBuf {
    golden_file(table.name())
}

/// The golden schema file of the table named `name`.
fn golden_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("golden")
        .join(format!("{name}.schema"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compares every table's schema, `scheduler_job`'s included, with its
    /// golden file. To accept an intended change, run with
    /// `GPUTEL_UPDATE_GOLDEN=1` and review the diff.
    #[test]
    fn schemas_match_golden_files() {
        let update = std::env::var_os("GPUTEL_UPDATE_GOLDEN").is_some();
        let tables = Table::ALL
            .into_iter()
            .map(|t| (t.name(), t.schema()))
            .chain([(
                crate::scheduler_job::NAME,
                crate::scheduler_job::scheduler_job_schema(),
            )]);
        for (table, schema) in tables {
            let path = golden_file(table);
            let actual = describe_schema(&schema);
            if update {
                std::fs::write(&path, &actual).expect("write golden file");
                continue;
            }
            let expected = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(
                actual,
                expected,
                "schema of table `{table}` differs from {}; if intended, rerun with GPUTEL_UPDATE_GOLDEN=1",
                path.display()
            );
        }
    }

    #[test]
    fn sort_keys_and_bloom_columns_exist_in_schemas() {
        for table in Table::ALL {
            let schema = table.schema();
            for name in table.sort_key().iter().chain(table.bloom_filter_columns()) {
                assert!(
                    schema.field_with_name(name).is_ok(),
                    "{table}: no column {name}"
                );
            }
            assert_eq!(table.sort_key().last(), Some(&col::TS), "{table}");
        }
    }
}
