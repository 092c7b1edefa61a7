use std::path::PathBuf;
use std::sync::{Arc, LazyLock};

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{ArrowError, Field, Schema, SchemaRef};
use gputel_proto::clock_event_reasons as reason;
use gputel_proto::{
    AlertRow, GpuEvent, GpuProcess, GpuSample, IbPortSample, NodeEvent, NodeSample,
};

use crate::column::{
    ColumnError, ColumnKind, EventKindName, EventScope, I64, Label, LabelList, LabelMap, OptBool,
    OptF64, OptLabel, OptNonNegF32, OptNonNegF64, OptProfilingSourceName, OptU32, OptU32Wide,
    OptU64, OtherTimestamp, RowContext, SharedNulls, Text, Timestamp, U32, U64, flag,
};

/// Column names shared by several tables.
pub mod col {
    pub const TS: &str = "ts";
    pub const NODE: &str = "node";
    pub const GPU: &str = "gpu";
    pub const DEVICE: &str = "device";
    pub const PORT: &str = "port";
    pub const PID: &str = "pid";
    pub const JOB_ID: &str = "job_id";
    pub const GPU_INSTANCE_ID: &str = "gpu_instance_id";
    pub const COMPUTE_INSTANCE_ID: &str = "compute_instance_id";
}

/// Which rows of a table are one and the same: compaction keeps one row per
/// key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKey {
    /// Rows equal in these columns are one sample; the other columns are
    /// its values.
    Columns(&'static [&'static str]),
    /// Only rows equal in every column are the same row: the table may hold
    /// several distinct rows for one device and time.
    WholeRow,
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
    /// One row per event: a GPU's (XID, GPU lost, start of throttling) or a
    /// node's (silent, back).
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

    /// Which rows are the same row. A MIG device's `gpu` rows share their
    /// GPU's (node, gpu, ts) and differ in the instance ids, as do a
    /// process's rows on two MIG devices. Events, job spans and alerts have
    /// no key short of the whole row: two XIDs of one code on one GPU at one
    /// time are two rows as far as anyone can tell, and a job's spans add up
    /// across files.
    pub fn row_key(self) -> RowKey {
        use col::*;
        match self {
            Table::Gpu => RowKey::Columns(&[NODE, GPU, TS, GPU_INSTANCE_ID, COMPUTE_INSTANCE_ID]),
            Table::GpuProcess => {
                RowKey::Columns(&[NODE, GPU, PID, TS, GPU_INSTANCE_ID, COMPUTE_INSTANCE_ID])
            }
            Table::Node => RowKey::Columns(&[NODE, TS]),
            Table::Ib => RowKey::Columns(&[NODE, DEVICE, PORT, TS]),
            Table::Event | Table::Job | Table::Alert => RowKey::WholeRow,
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

/// Declares a table once: one `column: Kind = value` line per column, in the
/// schema's order, with `$node` and `$s` naming the row's node and its source
/// (a protocol message, or what the collector derived). From that one list
/// come the Arrow fields, the check every row passes before it is stored, and
/// the builder that appends rows and finishes them into columns.
macro_rules! table {
    ($(#[$doc:meta])* $rows:ident for $source:ty, |$node:ident, $s:ident| {
        $($col:ident: $kind:ty = $value:expr),* $(,)?
    }) => {
        $(#[$doc])*
        #[derive(Default)]
        pub struct $rows {
            $($col: <$kind as ColumnKind>::Builder,)*
            /// Rows appended since the columns were last finished.
            appended: usize,
        }

        impl std::fmt::Debug for $rows {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(stringify!($rows))
            }
        }

        impl $rows {
            /// The table's Arrow fields, in column order.
            pub fn fields() -> Vec<Field> {
                vec![$(<$kind as ColumnKind>::field(stringify!($col)),)*]
            }

            /// Checks every value of one row; the error names the row and column.
            pub fn check(row: RowContext, $node: &str, $s: &$source) -> Result<(), ColumnError> {
                $(<$kind as ColumnKind>::check(row, stringify!($col), $value)?;)*
                Ok(())
            }

            /// An empty builder with room for `rows` rows.
            pub fn with_capacity(rows: usize) -> Self {
                Self {
                    $($col: <$kind as ColumnKind>::builder(rows),)*
                    appended: 0,
                }
            }

            /// Appends one row that passed [`Self::check`].
            pub fn push(&mut self, $node: &str, $s: &$source) {
                $(<$kind as ColumnKind>::put(&mut self.$col, $value);)*
                self.appended += 1;
            }

            /// The rows appended so far, as columns in schema order; starts over.
            /// Columns without a value share one all-null array per type.
            pub fn finish(&mut self) -> Vec<ArrayRef> {
                let mut nulls = SharedNulls::default();
                self.appended = 0;
                vec![$(<$kind as ColumnKind>::finish(&mut self.$col, &mut nulls),)*]
            }
        }

        impl Columns for $rows {
            fn num_rows(&self) -> usize {
                self.appended
            }

            #[allow(unused_assignments)]
            fn take_column(&mut self, index: usize, nulls: &mut SharedNulls) -> ArrayRef {
                let mut at = 0;
                $(
                    if at == index {
                        return <$kind as ColumnKind>::finish(&mut self.$col, nulls);
                    }
                    at += 1;
                )*
                panic!("{} has no column {index}", stringify!($rows))
            }
        }
    };
}

/// A table's rows as columns taken one at a time: the write buffer's rows,
/// whose columns become Arrow arrays only as a flush encodes them, one
/// after the other, or a record batch's ([`BatchColumns`]).
pub trait Columns: Send + std::fmt::Debug {
    /// Rows in each column.
    fn num_rows(&self) -> usize;
    /// Column `index`, in schema order, as an array; each column is taken
    /// once, and the rows no longer hold it after. A column without a value
    /// may be `nulls`'s all-null array of its type, shared with others.
    fn take_column(&mut self, index: usize, nulls: &mut SharedNulls) -> ArrayRef;
}

/// A record batch's columns, each given up as it is taken.
#[derive(Debug)]
pub struct BatchColumns {
    rows: usize,
    columns: Vec<Option<ArrayRef>>,
}

impl From<RecordBatch> for BatchColumns {
    fn from(batch: RecordBatch) -> Self {
        let rows = batch.num_rows();
        let columns = batch.into_parts().1.into_iter().map(Some).collect();
        Self { rows, columns }
    }
}

impl Columns for BatchColumns {
    fn num_rows(&self) -> usize {
        self.rows
    }

    fn take_column(&mut self, index: usize, _: &mut SharedNulls) -> ArrayRef {
        self.columns[index]
            .take()
            .expect("each column is taken once")
    }
}

/// Every column of `rows` as a record batch of `schema`.
pub fn take_batch(rows: &mut dyn Columns, schema: SchemaRef) -> Result<RecordBatch, ArrowError> {
    let mut nulls = SharedNulls::default();
    let columns = (0..schema.fields().len())
        .map(|index| rows.take_column(index, &mut nulls))
        .collect();
    RecordBatch::try_new(schema, columns)
}

table!(
    /// `gpu`: one row per GPU per tick.
    GpuRows for GpuSample, |node, s| {
        ts: Timestamp = s.ts_us,
        node: Label = node,
        gpu: U32 = s.gpu,
        uuid: Label = s.uuid.as_str(),
        model: Label = s.model.as_str(),
        pci_bus_id: OptLabel = s.pci_bus_id.as_deref(),
        temperature_c: OptU32 = s.temperature_c,
        memory_temperature_c: OptU32 = s.memory_temperature_c,
        power_mw: OptU32Wide = s.power_mw,
        energy_mj: OptU64 = s.energy_mj,
        sm_clock_mhz: OptU32 = s.sm_clock_mhz,
        memory_clock_mhz: OptU32 = s.memory_clock_mhz,
        gpu_util_pct: OptU32 = s.gpu_util_pct,
        memory_copy_util_pct: OptU32 = s.memory_copy_util_pct,
        enc_util_pct: OptU32 = s.enc_util_pct,
        dec_util_pct: OptU32 = s.dec_util_pct,
        fb_used_bytes: OptU64 = s.fb_used_bytes,
        fb_free_bytes: OptU64 = s.fb_free_bytes,
        fb_total_bytes: OptU64 = s.fb_total_bytes,
        fb_reserved_bytes: OptU64 = s.fb_reserved_bytes,
        sm_active_pct: OptNonNegF32 = s.sm_active_pct,
        sm_occupancy_pct: OptNonNegF32 = s.sm_occupancy_pct,
        tensor_active_pct: OptNonNegF32 = s.tensor_active_pct,
        dram_active_pct: OptNonNegF32 = s.dram_active_pct,
        gr_engine_active_pct: OptNonNegF32 = s.gr_engine_active_pct,
        profiling_source: OptProfilingSourceName = s.profiling_source,
        power_limit_mw: OptU32Wide = s.power_limit_mw,
        power_avg_mw: OptU32Wide = s.power_avg_mw,
        clock_event_reasons: OptU64 = s.clock_event_reasons,
        throttle_gpu_idle: OptBool = flag(s.clock_event_reasons, reason::GPU_IDLE),
        throttle_sw_power_cap: OptBool = flag(s.clock_event_reasons, reason::SW_POWER_CAP),
        throttle_hw_slowdown: OptBool = flag(s.clock_event_reasons, reason::HW_SLOWDOWN),
        throttle_sync_boost: OptBool = flag(s.clock_event_reasons, reason::SYNC_BOOST),
        throttle_sw_thermal: OptBool = flag(s.clock_event_reasons, reason::SW_THERMAL),
        throttle_hw_thermal: OptBool = flag(s.clock_event_reasons, reason::HW_THERMAL),
        throttle_hw_power_brake: OptBool = flag(s.clock_event_reasons, reason::HW_POWER_BRAKE),
        ecc_corrected_volatile: OptU64 = s.ecc_corrected_volatile,
        ecc_uncorrected_volatile: OptU64 = s.ecc_uncorrected_volatile,
        ecc_corrected_aggregate: OptU64 = s.ecc_corrected_aggregate,
        ecc_uncorrected_aggregate: OptU64 = s.ecc_uncorrected_aggregate,
        retired_pages_sbe: OptU64 = s.retired_pages_sbe,
        retired_pages_dbe: OptU64 = s.retired_pages_dbe,
        retired_pages_pending: OptBool = s.retired_pages_pending,
        remapped_rows_corrected: OptU32 = s.remapped_rows_corrected,
        remapped_rows_uncorrected: OptU32 = s.remapped_rows_uncorrected,
        remapped_rows_pending: OptBool = s.remapped_rows_pending,
        remapped_rows_failure: OptBool = s.remapped_rows_failure,
        pcie_replay_count: OptU64 = s.pcie_replay_count,
        pcie_tx_bytes_per_s: OptU64 = s.pcie_tx_bytes_per_s,
        pcie_rx_bytes_per_s: OptU64 = s.pcie_rx_bytes_per_s,
        nvlink_tx_bytes_per_s: OptU64 = s.nvlink_tx_bytes_per_s,
        nvlink_rx_bytes_per_s: OptU64 = s.nvlink_rx_bytes_per_s,
        xid_count: U32 = s.xid_count,
        job_id: OptLabel = s.job_id.as_deref(),
        pod_uid: OptLabel = s.pod_uid.as_deref(),
        job_count: U32 = s.job_count,
        gpu_instance_id: OptU32 = s.gpu_instance_id,
        compute_instance_id: OptU32 = s.compute_instance_id,
        mig_profile: OptLabel = s.mig_profile.as_deref(),
        mig_uuid: OptLabel = s.mig_uuid.as_deref(),
        mig_mode: OptBool = s.mig_mode,
        pcie_link_gen: OptU32 = s.pcie_link_gen,
        pcie_link_gen_max: OptU32 = s.pcie_link_gen_max,
        pcie_link_width: OptU32 = s.pcie_link_width,
        pcie_link_width_max: OptU32 = s.pcie_link_width_max,
        fan_speed_pct: OptU32 = s.fan_speed_pct,
        performance_state: OptU32 = s.performance_state,
        pod_namespace: OptLabel = s.pod_namespace.as_deref(),
        pod_name: OptLabel = s.pod_name.as_deref(),
        container: OptLabel = s.container.as_deref(),
        pod_labels: LabelMap = &s.pod_labels,
    }
);

table!(
    /// `node`: one row per node per tick.
    NodeRows for NodeSample, |node, s| {
        ts: Timestamp = s.ts_us,
        node: Label = node,
        cpu_count: U32 = s.cpu_count,
        cpu_user_jiffies: OptU64 = s.cpu_user_jiffies,
        cpu_system_jiffies: OptU64 = s.cpu_system_jiffies,
        cpu_iowait_jiffies: OptU64 = s.cpu_iowait_jiffies,
        cpu_idle_jiffies: OptU64 = s.cpu_idle_jiffies,
        cpu_steal_jiffies: OptU64 = s.cpu_steal_jiffies,
        memory_total_kib: OptU64 = s.memory_total_kib,
        memory_available_kib: OptU64 = s.memory_available_kib,
        load1: OptNonNegF32 = s.load1,
        load5: OptNonNegF32 = s.load5,
        load15: OptNonNegF32 = s.load15,
        jobs: LabelList = s.jobs.as_slice(),
        cpu_package_energy_uj: OptU64 = s.cpu_package_energy_uj,
        dram_energy_uj: OptU64 = s.dram_energy_uj,
        cpu_package_power_w: OptNonNegF64 = s.cpu_package_power_w,
        dram_power_w: OptNonNegF64 = s.dram_power_w,
    }
);

table!(
    /// `ib`: one row per InfiniBand port per tick.
    IbRows for IbPortSample, |node, s| {
        ts: Timestamp = s.ts_us,
        node: Label = node,
        device: Label = s.device.as_str(),
        port: U32 = s.port,
        state: Label = s.state.as_str(),
        phys_state: OptLabel = s.phys_state.as_deref(),
        link_layer: OptLabel = s.link_layer.as_deref(),
        rate_gbps: OptNonNegF64 = s.rate_gbps,
        xmit_bytes: OptU64 = s.xmit_bytes,
        rcv_bytes: OptU64 = s.rcv_bytes,
        xmit_packets: OptU64 = s.xmit_packets,
        rcv_packets: OptU64 = s.rcv_packets,
        unicast_xmit_packets: OptU64 = s.unicast_xmit_packets,
        unicast_rcv_packets: OptU64 = s.unicast_rcv_packets,
        multicast_xmit_packets: OptU64 = s.multicast_xmit_packets,
        multicast_rcv_packets: OptU64 = s.multicast_rcv_packets,
        symbol_error: OptU64 = s.symbol_error,
        link_downed: OptU64 = s.link_downed,
        link_error_recovery: OptU64 = s.link_error_recovery,
        port_rcv_errors: OptU64 = s.port_rcv_errors,
        port_xmit_discards: OptU64 = s.port_xmit_discards,
        port_xmit_wait: OptU64 = s.port_xmit_wait,
        port_rcv_discards: OptU64 = s.port_rcv_discards,
        port_rcv_constraint_errors: OptU64 = s.port_rcv_constraint_errors,
        port_xmit_constraint_errors: OptU64 = s.port_xmit_constraint_errors,
        port_rcv_remote_physical_errors: OptU64 = s.port_rcv_remote_physical_errors,
        port_rcv_switch_relay_errors: OptU64 = s.port_rcv_switch_relay_errors,
        local_link_integrity_errors: OptU64 = s.local_link_integrity_errors,
        excessive_buffer_overrun_errors: OptU64 = s.excessive_buffer_overrun_errors,
        vl15_dropped: OptU64 = s.vl15_dropped,
        hw_out_of_buffer: OptU64 = s.hw_out_of_buffer,
        hw_out_of_sequence: OptU64 = s.hw_out_of_sequence,
        hw_packet_seq_err: OptU64 = s.hw_packet_seq_err,
        hw_local_ack_timeout_err: OptU64 = s.hw_local_ack_timeout_err,
        hw_rnr_nak_retry_err: OptU64 = s.hw_rnr_nak_retry_err,
        hw_implied_nak_seq_err: OptU64 = s.hw_implied_nak_seq_err,
        // The device's identity: one value per file, so the dictionary holds one entry.
        board_id: OptLabel = s.board_id.as_deref(),
        fw_ver: OptLabel = s.fw_ver.as_deref(),
        hca_type: OptLabel = s.hca_type.as_deref(),
        node_guid: OptLabel = s.node_guid.as_deref(),
    }
);

/// The source of an `event` row: an agent's GPU event, or a node event the
/// collector raised itself, which has no GPU (`gpu`, `uuid` and the MIG
/// instance are null).
#[derive(Debug, Clone, Copy)]
pub enum EventSource<'a> {
    Gpu(&'a GpuEvent),
    Node(&'a NodeEvent),
}

impl<'a> EventSource<'a> {
    pub fn ts_us(self) -> i64 {
        match self {
            EventSource::Gpu(e) => e.ts_us,
            EventSource::Node(e) => e.ts_us,
        }
    }

    fn gpu(self) -> Option<u32> {
        match self {
            EventSource::Gpu(e) => Some(e.gpu),
            EventSource::Node(_) => None,
        }
    }

    fn uuid(self) -> Option<&'a str> {
        match self {
            EventSource::Gpu(e) => Some(&e.uuid),
            EventSource::Node(_) => None,
        }
    }

    fn kind(self) -> (i32, EventScope) {
        match self {
            EventSource::Gpu(e) => (e.kind, EventScope::Gpu),
            EventSource::Node(e) => (e.kind, EventScope::Node),
        }
    }

    /// The XID, the reason bits, or a node's silence in milliseconds.
    fn code(self) -> u64 {
        match self {
            EventSource::Gpu(e) => e.code,
            EventSource::Node(e) => e.silent_ms,
        }
    }

    fn detail(self) -> &'a str {
        match self {
            EventSource::Gpu(e) => &e.detail,
            EventSource::Node(e) => &e.detail,
        }
    }

    fn job_id(self) -> Option<&'a str> {
        match self {
            EventSource::Gpu(e) => e.job_id.as_deref(),
            EventSource::Node(e) => e.job_id.as_deref(),
        }
    }

    fn instance_ids(self) -> (Option<u32>, Option<u32>) {
        match self {
            EventSource::Gpu(e) => (e.gpu_instance_id, e.compute_instance_id),
            EventSource::Node(_) => (None, None),
        }
    }
}

table!(
    /// `event`: one row per GPU event or node event.
    EventRows for EventSource<'_>, |node, s| {
        ts: Timestamp = s.ts_us(),
        node: Label = node,
        // Null for node events.
        gpu: OptU32 = s.gpu(),
        uuid: OptLabel = s.uuid(),
        kind: EventKindName = s.kind(),
        code: U64 = s.code(),
        detail: Text = s.detail(),
        job_id: OptLabel = s.job_id(),
        gpu_instance_id: OptU32 = s.instance_ids().0,
        compute_instance_id: OptU32 = s.instance_ids().1,
    }
);

table!(
    /// `gpu_process`: one row per compute process per GPU per process refresh.
    GpuProcessRows for GpuProcess, |node, s| {
        ts: Timestamp = s.ts_us,
        node: Label = node,
        gpu: U32 = s.gpu,
        uuid: Label = s.uuid.as_str(),
        pid: U32 = s.pid,
        used_memory_bytes: OptU64 = s.used_memory_bytes,
        command: Label = s.command.as_str(),
        job_id: OptLabel = s.job_id.as_deref(),
        pod_uid: OptLabel = s.pod_uid.as_deref(),
        gpu_instance_id: OptU32 = s.gpu_instance_id,
        compute_instance_id: OptU32 = s.compute_instance_id,
    }
);

/// What the collector saw of one job on one GPU of one node within one
/// partition: the source of a `job` row.
#[derive(Debug, Clone, Copy)]
pub struct JobSpan<'a> {
    pub job_id: &'a str,
    pub gpu: u32,
    /// The first and last sample time, µs.
    pub first_us: i64,
    pub last_us: i64,
    pub samples: i64,
}

table!(
    /// `job`: one row per (job, node, GPU) per written file.
    JobRows for JobSpan<'_>, |node, s| {
        job_id: Label = s.job_id,
        node: Label = node,
        gpu: U32 = s.gpu,
        // First sample of the job on this GPU in the file; the partition's time.
        ts: OtherTimestamp = s.first_us,
        last_ts: OtherTimestamp = s.last_us,
        samples: I64 = s.samples,
    }
);

table!(
    /// `alert`: one row per firing or resolution of an alert rule.
    AlertRows for AlertRow, |node, s| {
        // Sample time of the transition: the sample that completed `for`
        // (firing) or the clear condition (resolved).
        ts: Timestamp = s.ts_us,
        node: Label = node,
        // Null for node-wide rules (node power, node silence).
        gpu: OptU32 = s.gpu,
        uuid: OptLabel = s.uuid.as_deref(),
        model: OptLabel = s.model.as_deref(),
        job_id: OptLabel = s.job_id.as_deref(),
        rule: Label = s.rule.as_str(),
        severity: Label = s.severity.as_str(),
        status: Label = s.status.as_str(),
        metric: Label = s.metric.as_str(),
        value: OptF64 = s.value,
        threshold: OptF64 = s.threshold,
        starts_at: OtherTimestamp = s.starts_at_us,
        // Why it resolved, when not by its own clear condition.
        reason: OptLabel = s.reason.as_deref(),
    }
);

fn schema_of(fields: Vec<Field>) -> SchemaRef {
    Arc::new(Schema::new(fields))
}

static GPU: LazyLock<SchemaRef> = LazyLock::new(|| schema_of(GpuRows::fields()));
static NODE: LazyLock<SchemaRef> = LazyLock::new(|| schema_of(NodeRows::fields()));
static IB: LazyLock<SchemaRef> = LazyLock::new(|| schema_of(IbRows::fields()));
static EVENT: LazyLock<SchemaRef> = LazyLock::new(|| schema_of(EventRows::fields()));
static GPU_PROCESS: LazyLock<SchemaRef> = LazyLock::new(|| schema_of(GpuProcessRows::fields()));
static JOB: LazyLock<SchemaRef> = LazyLock::new(|| schema_of(JobRows::fields()));
static ALERT: LazyLock<SchemaRef> = LazyLock::new(|| schema_of(AlertRows::fields()));

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
    use gputel_proto::EventKind;

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

    /// The builder a declaration makes fits the schema it makes, values land
    /// in their own columns, and the derived throttle flags split the bits.
    #[test]
    fn declared_rows_build_the_declared_schema() {
        use arrow_array::cast::AsArray;
        use arrow_array::types::Int32Type;
        use arrow_array::{Array, RecordBatch};

        let sample = GpuSample {
            ts_us: 1_795_240_800_000_000,
            gpu: 3,
            uuid: "GPU-3".into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            temperature_c: Some(71),
            clock_event_reasons: Some(reason::HW_THERMAL | reason::GPU_IDLE),
            job_id: Some("4242".into()),
            sm_active_pct: Some(62.5),
            profiling_source: Some(gputel_proto::ProfilingSource::Dcgm.into()),
            ..Default::default()
        };
        let mut rows = GpuRows::default();
        rows.push("gpu-node-017", &sample);
        rows.push(
            "gpu-node-017",
            &GpuSample {
                gpu: 4,
                sm_active_pct: None,
                profiling_source: None,
                ..sample.clone()
            },
        );
        let batch = RecordBatch::try_new(Table::Gpu.schema(), rows.finish())
            .expect("builders match the schema");
        assert_eq!(batch.num_rows(), 2);
        let column = |name: &str| batch.column_by_name(name).expect(name).clone();
        assert_eq!(column("gpu").as_primitive::<Int32Type>().values(), &[3, 4]);
        assert_eq!(
            column("temperature_c").as_primitive::<Int32Type>().value(0),
            71
        );
        assert!(column("memory_temperature_c").is_null(0));
        let flag = |name: &str| column(name).as_boolean().value(0);
        assert!(flag("throttle_hw_thermal") && flag("throttle_gpu_idle"));
        assert!(!flag("throttle_sw_thermal") && !flag("throttle_sw_power_cap"));
        // The profiling source by its name, null on the row without activity.
        let source = column("profiling_source");
        let source = source.as_dictionary::<Int32Type>();
        let names = source.values().as_string::<i32>();
        assert_eq!(names.value(source.keys().value(0) as usize), "dcgm");
        assert!(source.is_null(1));
        // A finished builder starts over.
        assert!(rows.finish().iter().all(|c| c.is_empty()));
    }

    /// Each declared column checks its own values, and the message names the
    /// table, the row and the column.
    #[test]
    fn declared_checks_name_row_and_column() {
        let now_us = 1_795_240_800_000_000;
        let row = RowContext {
            table: "gpu",
            row: 7,
            now_us,
        };
        let good = GpuSample {
            ts_us: now_us,
            uuid: "GPU-1".into(),
            model: "NVIDIA A100-SXM4-80GB".into(),
            ..Default::default()
        };
        assert_eq!(GpuRows::check(row, "n1", &good), Ok(()));
        let fails = |bad: GpuSample| {
            GpuRows::check(row, "n1", &bad)
                .expect_err("refused")
                .to_string()
        };
        assert_eq!(
            fails(GpuSample {
                sm_active_pct: Some(f32::INFINITY),
                ..good.clone()
            }),
            "gpu row 7: sm_active_pct is not a finite number"
        );
        assert_eq!(
            fails(GpuSample {
                ecc_corrected_volatile: Some(u64::MAX),
                ..good.clone()
            }),
            "gpu row 7: ecc_corrected_volatile is larger than 2^63-1"
        );
        assert_eq!(
            fails(GpuSample {
                job_id: Some("x".repeat(257)),
                ..good.clone()
            }),
            "gpu row 7: job_id is longer than 256 bytes"
        );
        let event = GpuEvent {
            ts_us: now_us,
            uuid: "GPU-1".into(),
            kind: 0,
            ..Default::default()
        };
        let event_row = RowContext {
            table: "event",
            ..row
        };
        let event_fails = |source: EventSource<'_>| {
            EventRows::check(event_row, "n1", &source)
                .expect_err("refused")
                .to_string()
        };
        assert_eq!(
            event_fails(EventSource::Gpu(&event)),
            "event row 7: kind is not a known event kind"
        );
        for (source, want) in [(None, Ok(())), (Some(1), Ok(())), (Some(2), Ok(()))] {
            let row_ok = GpuSample {
                profiling_source: source,
                ..good.clone()
            };
            assert_eq!(GpuRows::check(row, "n1", &row_ok), want, "{source:?}");
        }
        for unknown in [0, 3] {
            assert_eq!(
                fails(GpuSample {
                    profiling_source: Some(unknown),
                    ..good.clone()
                }),
                "gpu row 7: profiling_source is not a known profiling source"
            );
        }
        // Node kinds are the collector's: an agent's GPU event cannot carry
        // one, and a node event carries nothing else.
        let agent_says_silent = GpuEvent {
            kind: EventKind::NodeSilent as i32,
            ..event.clone()
        };
        assert_eq!(
            event_fails(EventSource::Gpu(&agent_says_silent)),
            "event row 7: kind is a node event kind, which only the collector raises; \
             an agent sends GPU events"
        );
        let node_event = NodeEvent {
            ts_us: now_us,
            node: "n1".into(),
            kind: EventKind::NodeBack as i32,
            ..Default::default()
        };
        assert_eq!(
            EventRows::check(event_row, "n1", &EventSource::Node(&node_event)),
            Ok(())
        );
        let node_xid = NodeEvent {
            kind: EventKind::Xid as i32,
            ..node_event
        };
        assert_eq!(
            event_fails(EventSource::Node(&node_xid)),
            "event row 7: kind is a GPU event kind on a node event"
        );
    }

    /// A node event's row has no GPU: `gpu`, `uuid` and the instance ids
    /// are null, and its silence is the code.
    #[test]
    fn node_events_are_rows_without_a_gpu() {
        use arrow_array::cast::AsArray;
        use arrow_array::types::{Int32Type, Int64Type};
        use arrow_array::{Array, RecordBatch};

        let xid = GpuEvent {
            ts_us: 1_795_240_800_000_000,
            gpu: 2,
            uuid: "GPU-2".into(),
            kind: EventKind::Xid as i32,
            code: 79,
            ..Default::default()
        };
        let silent = NodeEvent {
            ts_us: 1_795_240_830_000_000,
            node: "gpu-node-017".into(),
            kind: EventKind::NodeSilent as i32,
            silent_ms: 30_000,
            detail: "nothing for 30 s".into(),
            job_id: Some("4242".into()),
        };
        let mut rows = EventRows::default();
        rows.push("gpu-node-017", &EventSource::Gpu(&xid));
        rows.push("gpu-node-017", &EventSource::Node(&silent));
        let batch = RecordBatch::try_new(Table::Event.schema(), rows.finish())
            .expect("builders match the schema");
        let column = |name: &str| batch.column_by_name(name).expect(name).clone();
        let gpu = column("gpu");
        assert_eq!(gpu.as_primitive::<Int32Type>().value(0), 2);
        assert!(gpu.is_null(1));
        assert!(column("uuid").is_null(1) && !column("uuid").is_null(0));
        assert!(column("gpu_instance_id").is_null(1));
        assert_eq!(
            column("code").as_primitive::<Int64Type>().values(),
            &[79, 30_000]
        );
        let kind = column("kind");
        let kind = kind.as_dictionary::<Int32Type>();
        let names = kind.values().as_string::<i32>();
        let name = |row: usize| names.value(kind.keys().value(row) as usize);
        assert_eq!((name(0), name(1)), ("xid", "node_silent"));
    }

    /// Every float column of the tables agents write is a share, load, rate
    /// or power: each refuses a negative value by its kind. The list must
    /// name every float column, so a new one is declared with a kind on purpose.
    #[test]
    fn float_columns_of_agent_tables_refuse_negative_values() {
        use arrow_schema::DataType;
        /// A column's name and its field in the protocol row.
        type Column<S, V> = (&'static str, fn(&mut S) -> &mut Option<V>);

        let now_us = 1_795_240_800_000_000;
        let row = |table| RowContext {
            table,
            row: 3,
            now_us,
        };
        let gpu = GpuSample {
            ts_us: now_us,
            uuid: "GPU-1".into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            ..Default::default()
        };
        let node = NodeSample {
            ts_us: now_us,
            ..Default::default()
        };
        let ib = IbPortSample {
            ts_us: now_us,
            device: "mlx5_0".into(),
            port: 1,
            state: "ACTIVE".into(),
            ..Default::default()
        };
        let mut refused: Vec<(&str, String)> = Vec::new();
        let gpu_columns: [Column<GpuSample, f32>; 5] = [
            ("sm_active_pct", |s| &mut s.sm_active_pct),
            ("sm_occupancy_pct", |s| &mut s.sm_occupancy_pct),
            ("tensor_active_pct", |s| &mut s.tensor_active_pct),
            ("dram_active_pct", |s| &mut s.dram_active_pct),
            ("gr_engine_active_pct", |s| &mut s.gr_engine_active_pct),
        ];
        for (name, field) in gpu_columns {
            let mut bad = gpu.clone();
            *field(&mut bad) = Some(-1.0);
            let err = GpuRows::check(row("gpu"), "n1", &bad).expect_err(name);
            refused.push(("gpu", err.to_string()));
        }
        let node_f32: [Column<NodeSample, f32>; 3] = [
            ("load1", |s| &mut s.load1),
            ("load5", |s| &mut s.load5),
            ("load15", |s| &mut s.load15),
        ];
        for (name, field) in node_f32 {
            let mut bad = node.clone();
            *field(&mut bad) = Some(-0.25);
            let err = NodeRows::check(row("node"), "n1", &bad).expect_err(name);
            refused.push(("node", err.to_string()));
        }
        let node_f64: [Column<NodeSample, f64>; 2] = [
            ("cpu_package_power_w", |s| &mut s.cpu_package_power_w),
            ("dram_power_w", |s| &mut s.dram_power_w),
        ];
        for (name, field) in node_f64 {
            let mut bad = node.clone();
            *field(&mut bad) = Some(-12.5);
            let err = NodeRows::check(row("node"), "n1", &bad).expect_err(name);
            refused.push(("node", err.to_string()));
        }
        let ib_columns: [Column<IbPortSample, f64>; 1] = [("rate_gbps", |s| &mut s.rate_gbps)];
        for (name, field) in ib_columns {
            let mut bad = ib.clone();
            *field(&mut bad) = Some(-1e9);
            let err = IbRows::check(row("ib"), "n1", &bad).expect_err(name);
            refused.push(("ib", err.to_string()));
        }

        // The float columns the schemas declare, as messages the checks give.
        let expected: Vec<(&str, String)> = [Table::Gpu, Table::Node, Table::Ib]
            .into_iter()
            .flat_map(|table| {
                table
                    .schema()
                    .fields()
                    .iter()
                    .filter(|f| matches!(f.data_type(), DataType::Float32 | DataType::Float64))
                    .map(|f| {
                        (
                            table.name(),
                            format!("{table} row 3: {} is negative", f.name()),
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(expected.len(), 11);
        assert_eq!(refused, expected);
        // The same rows with zero in those columns pass.
        assert_eq!(GpuRows::check(row("gpu"), "n1", &gpu), Ok(()));
        assert_eq!(NodeRows::check(row("node"), "n1", &node), Ok(()));
        assert_eq!(IbRows::check(row("ib"), "n1", &ib), Ok(()));
    }

    #[test]
    fn sort_keys_row_keys_and_bloom_columns_exist_in_schemas() {
        for table in Table::ALL {
            let schema = table.schema();
            for name in table.sort_key().iter().chain(table.bloom_filter_columns()) {
                assert!(
                    schema.field_with_name(name).is_ok(),
                    "{table}: no column {name}"
                );
            }
            assert_eq!(table.sort_key().last(), Some(&col::TS), "{table}");
            if let RowKey::Columns(key) = table.row_key() {
                for name in key {
                    assert!(
                        schema.field_with_name(name).is_ok(),
                        "{table}: no column {name}"
                    );
                }
                // Rows sorted by the sort key then the rest of the key have
                // their duplicates next to each other.
                for name in table.sort_key() {
                    assert!(key.contains(name), "{table}: {name} not in the row key");
                }
            }
        }
    }
}
