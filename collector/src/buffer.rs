//! The in-memory write buffer: rows appended as they arrive, held per table and
//! partition in Arrow builders until the persister takes them.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::builder::{
    ArrayBuilder, BooleanBuilder, Float32Builder, Float64Builder, Int32Builder, Int64Builder,
    ListBuilder, StringBuilder, StringDictionaryBuilder, TimestampMicrosecondBuilder,
};
use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{ArrowError, DataType, Field};
use gputel_proto::{AlertRow, GpuEvent, GpuProcess, GpuSample, IbPortSample, NodeSample};
use gputel_schemas::{PartitionKey, Table};

use crate::validate::ValidBatch;

/// Rows waiting to be written, by table and partition.
#[derive(Default)]
pub struct WriteBuffer {
    gpu: BTreeMap<PartitionKey, GpuRows>,
    node: BTreeMap<PartitionKey, NodeRows>,
    ib: BTreeMap<PartitionKey, IbRows>,
    event: BTreeMap<PartitionKey, EventRows>,
    gpu_process: BTreeMap<PartitionKey, GpuProcessRows>,
    /// What was seen of each job on each GPU, per partition, for the `job` table.
    jobs: BTreeMap<PartitionKey, BTreeMap<JobOnGpu, Seen>>,
    alert: BTreeMap<PartitionKey, AlertRows>,
    rows: usize,
}

/// A job on one GPU of one node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct JobOnGpu {
    job_id: String,
    node: String,
    gpu: u32,
}

/// When a job was seen on a GPU, and how often.
#[derive(Debug, Clone, Copy)]
struct Seen {
    first_us: i64,
    last_us: i64,
    samples: i64,
}

impl std::fmt::Debug for WriteBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let partitions = self.gpu.len()
            + self.node.len()
            + self.ib.len()
            + self.event.len()
            + self.gpu_process.len()
            + self.jobs.len()
            + self.alert.len();
        f.debug_struct("WriteBuffer")
            .field("partitions", &partitions)
            .field("rows", &self.rows)
            .finish()
    }
}

impl WriteBuffer {
    /// Appends every row of a validated batch from `node`.
    pub fn append(&mut self, node: &str, batch: ValidBatch<'_>) {
        let batch = batch.get();
        append_all(&mut self.gpu, node, &batch.gpu, |s| s.ts_us);
        for s in &batch.gpu {
            if let Some(job_id) = &s.job_id {
                let key = PartitionKey::from_ts_us(s.ts_us)
                    .expect("ValidBatch guarantees every timestamp has a partition");
                let job = JobOnGpu {
                    job_id: job_id.clone(),
                    node: node.to_owned(),
                    gpu: s.gpu,
                };
                self.jobs
                    .entry(key)
                    .or_default()
                    .entry(job)
                    .and_modify(|seen| {
                        seen.first_us = seen.first_us.min(s.ts_us);
                        seen.last_us = seen.last_us.max(s.ts_us);
                        seen.samples += 1;
                    })
                    .or_insert(Seen {
                        first_us: s.ts_us,
                        last_us: s.ts_us,
                        samples: 1,
                    });
            }
        }
        append_all(&mut self.node, node, &batch.node, |s| s.ts_us);
        append_all(&mut self.ib, node, &batch.ib, |s| s.ts_us);
        append_all(&mut self.event, node, &batch.event, |s| s.ts_us);
        append_all(&mut self.gpu_process, node, &batch.gpu_process, |s| s.ts_us);
        self.rows += crate::validate::row_count(batch);
    }

    /// Appends alert firings and resolutions (the node is in each row).
    pub fn append_alerts(&mut self, rows: &[AlertRow]) {
        for row in rows {
            // Sample times passed validation; a row outside the calendar
            // would have no partition, so it is dropped rather than panic.
            let Ok(key) = PartitionKey::from_ts_us(row.ts_us) else {
                continue;
            };
            self.alert.entry(key).or_default().push(&row.node, row);
            self.rows += 1;
        }
    }

    /// Rows held, all tables together.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Takes everything held as one record batch per table and partition,
    /// leaving the buffer empty.
    pub fn take(&mut self) -> Result<Vec<(Table, PartitionKey, RecordBatch)>, ArrowError> {
        self.rows = 0;
        let mut out = Vec::new();
        finish_all(Table::Gpu, &mut self.gpu, &mut out)?;
        finish_all(Table::Node, &mut self.node, &mut out)?;
        finish_all(Table::Ib, &mut self.ib, &mut out)?;
        finish_all(Table::Event, &mut self.event, &mut out)?;
        finish_all(Table::GpuProcess, &mut self.gpu_process, &mut out)?;
        finish_all(Table::Alert, &mut self.alert, &mut out)?;
        for (key, jobs) in std::mem::take(&mut self.jobs) {
            let mut rows = JobRows::default();
            for (job, seen) in &jobs {
                rows.push(job, seen);
            }
            out.push((
                Table::Job,
                key,
                RecordBatch::try_new(Table::Job.schema(), rows.finish())?,
            ));
        }
        Ok(out)
    }
}

fn append_all<S, R: Rows<S> + Default>(
    partitions: &mut BTreeMap<PartitionKey, R>,
    node: &str,
    samples: &[S],
    ts_us: impl Fn(&S) -> i64,
) {
    for s in samples {
        let key = PartitionKey::from_ts_us(ts_us(s))
            .expect("ValidBatch guarantees every timestamp has a partition");
        partitions.entry(key).or_default().push(node, s);
    }
}

fn finish_all<S, R: Rows<S>>(
    table: Table,
    partitions: &mut BTreeMap<PartitionKey, R>,
    out: &mut Vec<(Table, PartitionKey, RecordBatch)>,
) -> Result<(), ArrowError> {
    for (key, mut rows) in std::mem::take(partitions) {
        out.push((
            table,
            key,
            RecordBatch::try_new(table.schema(), rows.finish())?,
        ));
    }
    Ok(())
}

/// Arrow builders for one table's rows of protocol samples `S`.
trait Rows<S> {
    fn push(&mut self, node: &str, sample: &S);
    /// The columns, in schema order.
    fn finish(&mut self) -> Vec<ArrayRef>;
}

/// A column builder that takes values of type `V`.
trait Put<V> {
    fn put(&mut self, value: V);
}

/// Timestamps in microseconds, UTC.
struct Ts(TimestampMicrosecondBuilder);

impl Default for Ts {
    fn default() -> Self {
        Ts(TimestampMicrosecondBuilder::new().with_timezone("UTC"))
    }
}

impl Put<i64> for Ts {
    fn put(&mut self, value: i64) {
        self.0.append_value(value);
    }
}

type Dict = StringDictionaryBuilder<Int32Type>;

impl Put<&str> for Dict {
    fn put(&mut self, value: &str) {
        self.append_value(value);
    }
}

impl Put<Option<&str>> for Dict {
    fn put(&mut self, value: Option<&str>) {
        self.append_option(value);
    }
}

/// A list of strings whose items are never null, as the schemas declare.
struct StrList(ListBuilder<StringBuilder>);

impl Default for StrList {
    fn default() -> Self {
        StrList(
            ListBuilder::new(StringBuilder::new())
                .with_field(Field::new_list_field(DataType::Utf8, false)),
        )
    }
}

impl Put<&[String]> for StrList {
    fn put(&mut self, value: &[String]) {
        for item in value {
            self.0.values().append_value(item);
        }
        self.0.append(true);
    }
}

impl FinishColumn for StrList {
    fn finish_column(&mut self) -> ArrayRef {
        Arc::new(self.0.finish())
    }
}

impl Put<&str> for StringBuilder {
    fn put(&mut self, value: &str) {
        self.append_value(value);
    }
}

macro_rules! put_option {
    ($($builder:ty => $native:ty),* $(,)?) => {$(
        impl Put<Option<$native>> for $builder {
            fn put(&mut self, value: Option<$native>) {
                self.append_option(value);
            }
        }
    )*};
}

put_option!(
    Int32Builder => i32,
    Int64Builder => i64,
    Float32Builder => f32,
    Float64Builder => f64,
    BooleanBuilder => bool,
);

/// Finishes any column builder into an array.
trait FinishColumn {
    fn finish_column(&mut self) -> ArrayRef;
}

impl<B: ArrayBuilder> FinishColumn for B {
    fn finish_column(&mut self) -> ArrayRef {
        ArrayBuilder::finish(self)
    }
}

impl FinishColumn for Ts {
    fn finish_column(&mut self) -> ArrayRef {
        Arc::new(self.0.finish())
    }
}

/// Declares a table's builders: one `column: Builder = value` per column, in
/// the schema's order, with `$node` and `$s` naming the node and the sample.
macro_rules! table_rows {
    ($rows:ident for $sample:ty, |$node:ident, $s:ident| { $($col:ident: $builder:ty = $value:expr),* $(,)? }) => {
        #[derive(Default)]
        struct $rows {
            $($col: $builder,)*
        }

        impl Rows<$sample> for $rows {
            fn push(&mut self, $node: &str, $s: &$sample) {
                $(self.$col.put($value);)*
            }

            fn finish(&mut self) -> Vec<ArrayRef> {
                vec![$(self.$col.finish_column(),)*]
            }
        }
    };
}

/// Validation guarantees these fit; the conversions only keep types honest.
fn i32_of(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Whether bit `mask` is set in an optional bitmask.
fn flag(bits: Option<u64>, mask: u64) -> Option<bool> {
    bits.map(|b| b & mask != 0)
}

/// nvmlClocksEventReason* bits.
mod reason {
    pub const GPU_IDLE: u64 = 0x1;
    pub const SW_POWER_CAP: u64 = 0x4;
    pub const HW_SLOWDOWN: u64 = 0x8;
    pub const SYNC_BOOST: u64 = 0x10;
    pub const SW_THERMAL: u64 = 0x20;
    pub const HW_THERMAL: u64 = 0x40;
    pub const HW_POWER_BRAKE: u64 = 0x80;
}

table_rows!(GpuRows for GpuSample, |node, s| {
    ts: Ts = s.ts_us,
    node: Dict = node,
    gpu: Int32Builder = Some(i32_of(s.gpu)),
    uuid: Dict = s.uuid.as_str(),
    model: Dict = s.model.as_str(),
    temperature_c: Int32Builder = s.temperature_c.map(i32_of),
    memory_temperature_c: Int32Builder = s.memory_temperature_c.map(i32_of),
    power_mw: Int64Builder = s.power_mw.map(i64::from),
    energy_mj: Int64Builder = s.energy_mj.map(i64_of),
    sm_clock_mhz: Int32Builder = s.sm_clock_mhz.map(i32_of),
    memory_clock_mhz: Int32Builder = s.memory_clock_mhz.map(i32_of),
    gpu_util_pct: Int32Builder = s.gpu_util_pct.map(i32_of),
    memory_copy_util_pct: Int32Builder = s.memory_copy_util_pct.map(i32_of),
    fb_used_bytes: Int64Builder = s.fb_used_bytes.map(i64_of),
    fb_free_bytes: Int64Builder = s.fb_free_bytes.map(i64_of),
    fb_total_bytes: Int64Builder = s.fb_total_bytes.map(i64_of),
    sm_active_pct: Float32Builder = s.sm_active_pct,
    sm_occupancy_pct: Float32Builder = s.sm_occupancy_pct,
    tensor_active_pct: Float32Builder = s.tensor_active_pct,
    dram_active_pct: Float32Builder = s.dram_active_pct,
    power_limit_mw: Int64Builder = s.power_limit_mw.map(i64::from),
    power_avg_mw: Int64Builder = s.power_avg_mw.map(i64::from),
    clock_event_reasons: Int64Builder = s.clock_event_reasons.map(i64_of),
    throttle_gpu_idle: BooleanBuilder = flag(s.clock_event_reasons, reason::GPU_IDLE),
    throttle_sw_power_cap: BooleanBuilder = flag(s.clock_event_reasons, reason::SW_POWER_CAP),
    throttle_hw_slowdown: BooleanBuilder = flag(s.clock_event_reasons, reason::HW_SLOWDOWN),
    throttle_sync_boost: BooleanBuilder = flag(s.clock_event_reasons, reason::SYNC_BOOST),
    throttle_sw_thermal: BooleanBuilder = flag(s.clock_event_reasons, reason::SW_THERMAL),
    throttle_hw_thermal: BooleanBuilder = flag(s.clock_event_reasons, reason::HW_THERMAL),
    throttle_hw_power_brake: BooleanBuilder = flag(s.clock_event_reasons, reason::HW_POWER_BRAKE),
    ecc_corrected_volatile: Int64Builder = s.ecc_corrected_volatile.map(i64_of),
    ecc_uncorrected_volatile: Int64Builder = s.ecc_uncorrected_volatile.map(i64_of),
    ecc_corrected_aggregate: Int64Builder = s.ecc_corrected_aggregate.map(i64_of),
    ecc_uncorrected_aggregate: Int64Builder = s.ecc_uncorrected_aggregate.map(i64_of),
    retired_pages_sbe: Int64Builder = s.retired_pages_sbe.map(i64_of),
    retired_pages_dbe: Int64Builder = s.retired_pages_dbe.map(i64_of),
    retired_pages_pending: BooleanBuilder = s.retired_pages_pending,
    remapped_rows_corrected: Int32Builder = s.remapped_rows_corrected.map(i32_of),
    remapped_rows_uncorrected: Int32Builder = s.remapped_rows_uncorrected.map(i32_of),
    remapped_rows_pending: BooleanBuilder = s.remapped_rows_pending,
    remapped_rows_failure: BooleanBuilder = s.remapped_rows_failure,
    pcie_replay_count: Int64Builder = s.pcie_replay_count.map(i64_of),
    pcie_tx_bytes_per_s: Int64Builder = s.pcie_tx_bytes_per_s.map(i64_of),
    pcie_rx_bytes_per_s: Int64Builder = s.pcie_rx_bytes_per_s.map(i64_of),
    nvlink_tx_bytes_per_s: Int64Builder = s.nvlink_tx_bytes_per_s.map(i64_of),
    nvlink_rx_bytes_per_s: Int64Builder = s.nvlink_rx_bytes_per_s.map(i64_of),
    xid_count: Int32Builder = Some(i32_of(s.xid_count)),
    job_id: Dict = s.job_id.as_deref(),
    pod_uid: Dict = s.pod_uid.as_deref(),
    job_count: Int32Builder = Some(i32_of(s.job_count)),
});

table_rows!(NodeRows for NodeSample, |node, s| {
    ts: Ts = s.ts_us,
    node: Dict = node,
    cpu_count: Int32Builder = Some(i32_of(s.cpu_count)),
    cpu_user_pct: Float32Builder = s.cpu_user_pct,
    cpu_system_pct: Float32Builder = s.cpu_system_pct,
    cpu_iowait_pct: Float32Builder = s.cpu_iowait_pct,
    cpu_idle_pct: Float32Builder = s.cpu_idle_pct,
    memory_total_bytes: Int64Builder = s.memory_total_bytes.map(i64_of),
    memory_used_bytes: Int64Builder = s.memory_used_bytes.map(i64_of),
    memory_available_bytes: Int64Builder = s.memory_available_bytes.map(i64_of),
    load1: Float32Builder = s.load1,
    load5: Float32Builder = s.load5,
    load15: Float32Builder = s.load15,
    jobs: StrList = s.jobs.as_slice(),
});

table_rows!(IbRows for IbPortSample, |node, s| {
    ts: Ts = s.ts_us,
    node: Dict = node,
    device: Dict = s.device.as_str(),
    port: Int32Builder = Some(i32_of(s.port)),
    state: Dict = s.state.as_str(),
    rate_gbps: Float64Builder = s.rate_gbps,
    xmit_bytes: Int64Builder = s.xmit_bytes.map(i64_of),
    rcv_bytes: Int64Builder = s.rcv_bytes.map(i64_of),
    xmit_packets: Int64Builder = s.xmit_packets.map(i64_of),
    rcv_packets: Int64Builder = s.rcv_packets.map(i64_of),
    xmit_bytes_per_s: Float64Builder = s.xmit_bytes_per_s,
    rcv_bytes_per_s: Float64Builder = s.rcv_bytes_per_s,
    xmit_packets_per_s: Float64Builder = s.xmit_packets_per_s,
    rcv_packets_per_s: Float64Builder = s.rcv_packets_per_s,
    symbol_error: Int64Builder = s.symbol_error.map(i64_of),
    link_downed: Int64Builder = s.link_downed.map(i64_of),
    link_error_recovery: Int64Builder = s.link_error_recovery.map(i64_of),
    port_rcv_errors: Int64Builder = s.port_rcv_errors.map(i64_of),
    port_xmit_discards: Int64Builder = s.port_xmit_discards.map(i64_of),
    port_xmit_wait: Int64Builder = s.port_xmit_wait.map(i64_of),
    hw_out_of_buffer: Int64Builder = s.hw_out_of_buffer.map(i64_of),
    hw_out_of_sequence: Int64Builder = s.hw_out_of_sequence.map(i64_of),
    hw_packet_seq_err: Int64Builder = s.hw_packet_seq_err.map(i64_of),
    hw_local_ack_timeout_err: Int64Builder = s.hw_local_ack_timeout_err.map(i64_of),
    hw_rnr_nak_retry_err: Int64Builder = s.hw_rnr_nak_retry_err.map(i64_of),
    hw_implied_nak_seq_err: Int64Builder = s.hw_implied_nak_seq_err.map(i64_of),
});

table_rows!(EventRows for GpuEvent, |node, s| {
    ts: Ts = s.ts_us,
    node: Dict = node,
    gpu: Int32Builder = Some(i32_of(s.gpu)),
    uuid: Dict = s.uuid.as_str(),
    kind: Dict = s.kind().name(),
    code: Int64Builder = Some(i64_of(s.code)),
    detail: StringBuilder = s.detail.as_str(),
    job_id: Dict = s.job_id.as_deref(),
});

table_rows!(GpuProcessRows for GpuProcess, |node, s| {
    ts: Ts = s.ts_us,
    node: Dict = node,
    gpu: Int32Builder = Some(i32_of(s.gpu)),
    uuid: Dict = s.uuid.as_str(),
    pid: Int32Builder = Some(i32_of(s.pid)),
    used_memory_bytes: Int64Builder = s.used_memory_bytes.map(i64_of),
    command: Dict = s.command.as_str(),
    job_id: Dict = s.job_id.as_deref(),
    pod_uid: Dict = s.pod_uid.as_deref(),
});

table_rows!(AlertRows for AlertRow, |node, s| {
    ts: Ts = s.ts_us,
    node: Dict = node,
    gpu: Int32Builder = s.gpu.map(i32_of),
    uuid: Dict = s.uuid.as_deref(),
    model: Dict = s.model.as_deref(),
    job_id: Dict = s.job_id.as_deref(),
    rule: Dict = s.rule.as_str(),
    severity: Dict = s.severity.as_str(),
    status: Dict = s.status.as_str(),
    metric: Dict = s.metric.as_str(),
    value: Float64Builder = s.value,
    threshold: Float64Builder = s.threshold,
    starts_at: Ts = s.starts_at_us,
});

/// Job rows: one per (job, node, GPU) seen in a partition.
#[derive(Default)]
struct JobRows {
    job_id: Dict,
    node: Dict,
    gpu: Int32Builder,
    ts: Ts,
    last_ts: Ts,
    samples: Int64Builder,
}

impl JobRows {
    fn push(&mut self, job: &JobOnGpu, seen: &Seen) {
        self.job_id.put(job.job_id.as_str());
        self.node.put(job.node.as_str());
        self.gpu.put(Some(i32_of(job.gpu)));
        self.ts.put(seen.first_us);
        self.last_ts.put(seen.last_us);
        self.samples.put(Some(seen.samples));
    }

    fn finish(&mut self) -> Vec<ArrayRef> {
        vec![
            self.job_id.finish_column(),
            self.node.finish_column(),
            self.gpu.finish_column(),
            self.ts.finish_column(),
            self.last_ts.finish_column(),
            self.samples.finish_column(),
        ]
    }
}
