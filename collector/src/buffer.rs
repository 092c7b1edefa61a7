//! The in-memory write buffer: rows appended as they arrive, held per table and
//! partition in Arrow builders until the persister takes them.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::builder::{
    Float32Builder, Float64Builder, Int32Builder, Int64Builder, StringDictionaryBuilder,
    TimestampMicrosecondBuilder,
};
use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::ArrowError;
use gputel_proto::{GpuSample, IbPortSample, NodeSample};
use gputel_schemas::{PartitionKey, Table};

use crate::validate::ValidBatch;

/// Rows waiting to be written, by table and partition.
#[derive(Default)]
pub struct WriteBuffer {
    gpu: BTreeMap<PartitionKey, GpuRows>,
    node: BTreeMap<PartitionKey, NodeRows>,
    ib: BTreeMap<PartitionKey, IbRows>,
    rows: usize,
}

impl std::fmt::Debug for WriteBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteBuffer")
            .field(
                "partitions",
                &(self.gpu.len() + self.node.len() + self.ib.len()),
            )
            .field("rows", &self.rows)
            .finish()
    }
}

impl WriteBuffer {
    /// Appends every row of a validated batch from `node`.
    pub fn append(&mut self, node: &str, batch: ValidBatch<'_>) {
        let batch = batch.get();
        for s in &batch.gpu {
            self.gpu
                .entry(partition(s.ts_us))
                .or_default()
                .push(node, s);
        }
        for s in &batch.node {
            self.node
                .entry(partition(s.ts_us))
                .or_default()
                .push(node, s);
        }
        for s in &batch.ib {
            self.ib.entry(partition(s.ts_us)).or_default().push(node, s);
        }
        self.rows += batch.gpu.len() + batch.node.len() + batch.ib.len();
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
        Ok(out)
    }
}

fn partition(ts_us: i64) -> PartitionKey {
    PartitionKey::from_ts_us(ts_us).expect("ValidBatch guarantees every timestamp has a partition")
}

fn finish_all<R: Rows>(
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

type Dict = StringDictionaryBuilder<Int32Type>;

/// Arrow builders for one table: `finish` returns the columns in schema order.
trait Rows {
    fn finish(&mut self) -> Vec<ArrayRef>;
}

fn ts_builder() -> TimestampMicrosecondBuilder {
    TimestampMicrosecondBuilder::new().with_timezone("UTC")
}

/// Validation guarantees these fit; the conversions only keep types honest.
fn i32_of(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

struct GpuRows {
    ts: TimestampMicrosecondBuilder,
    node: Dict,
    gpu: Int32Builder,
    uuid: Dict,
    model: Dict,
    temperature_c: Int32Builder,
    memory_temperature_c: Int32Builder,
    power_mw: Int64Builder,
    energy_mj: Int64Builder,
    sm_clock_mhz: Int32Builder,
    memory_clock_mhz: Int32Builder,
    gpu_util_pct: Int32Builder,
    memory_copy_util_pct: Int32Builder,
    fb_used_bytes: Int64Builder,
    fb_free_bytes: Int64Builder,
    fb_total_bytes: Int64Builder,
}

impl Default for GpuRows {
    fn default() -> Self {
        Self {
            ts: ts_builder(),
            node: Dict::new(),
            gpu: Int32Builder::new(),
            uuid: Dict::new(),
            model: Dict::new(),
            temperature_c: Int32Builder::new(),
            memory_temperature_c: Int32Builder::new(),
            power_mw: Int64Builder::new(),
            energy_mj: Int64Builder::new(),
            sm_clock_mhz: Int32Builder::new(),
            memory_clock_mhz: Int32Builder::new(),
            gpu_util_pct: Int32Builder::new(),
            memory_copy_util_pct: Int32Builder::new(),
            fb_used_bytes: Int64Builder::new(),
            fb_free_bytes: Int64Builder::new(),
            fb_total_bytes: Int64Builder::new(),
        }
    }
}

impl GpuRows {
    fn push(&mut self, node: &str, s: &GpuSample) {
        self.ts.append_value(s.ts_us);
        self.node.append_value(node);
        self.gpu.append_value(i32_of(s.gpu));
        self.uuid.append_value(&s.uuid);
        self.model.append_value(&s.model);
        self.temperature_c
            .append_option(s.temperature_c.map(i32_of));
        self.memory_temperature_c
            .append_option(s.memory_temperature_c.map(i32_of));
        self.power_mw.append_option(s.power_mw.map(i64::from));
        self.energy_mj.append_option(s.energy_mj.map(i64_of));
        self.sm_clock_mhz.append_option(s.sm_clock_mhz.map(i32_of));
        self.memory_clock_mhz
            .append_option(s.memory_clock_mhz.map(i32_of));
        self.gpu_util_pct.append_option(s.gpu_util_pct.map(i32_of));
        self.memory_copy_util_pct
            .append_option(s.memory_copy_util_pct.map(i32_of));
        self.fb_used_bytes
            .append_option(s.fb_used_bytes.map(i64_of));
        self.fb_free_bytes
            .append_option(s.fb_free_bytes.map(i64_of));
        self.fb_total_bytes
            .append_option(s.fb_total_bytes.map(i64_of));
    }
}

impl Rows for GpuRows {
    fn finish(&mut self) -> Vec<ArrayRef> {
        vec![
            Arc::new(self.ts.finish()),
            Arc::new(self.node.finish()),
            Arc::new(self.gpu.finish()),
            Arc::new(self.uuid.finish()),
            Arc::new(self.model.finish()),
            Arc::new(self.temperature_c.finish()),
            Arc::new(self.memory_temperature_c.finish()),
            Arc::new(self.power_mw.finish()),
            Arc::new(self.energy_mj.finish()),
            Arc::new(self.sm_clock_mhz.finish()),
            Arc::new(self.memory_clock_mhz.finish()),
            Arc::new(self.gpu_util_pct.finish()),
            Arc::new(self.memory_copy_util_pct.finish()),
            Arc::new(self.fb_used_bytes.finish()),
            Arc::new(self.fb_free_bytes.finish()),
            Arc::new(self.fb_total_bytes.finish()),
        ]
    }
}

struct NodeRows {
    ts: TimestampMicrosecondBuilder,
    node: Dict,
    cpu_count: Int32Builder,
    cpu_user_pct: Float32Builder,
    cpu_system_pct: Float32Builder,
    cpu_iowait_pct: Float32Builder,
    cpu_idle_pct: Float32Builder,
    memory_total_bytes: Int64Builder,
    memory_used_bytes: Int64Builder,
    memory_available_bytes: Int64Builder,
    load1: Float32Builder,
    load5: Float32Builder,
    load15: Float32Builder,
}

impl Default for NodeRows {
    fn default() -> Self {
        Self {
            ts: ts_builder(),
            node: Dict::new(),
            cpu_count: Int32Builder::new(),
            cpu_user_pct: Float32Builder::new(),
            cpu_system_pct: Float32Builder::new(),
            cpu_iowait_pct: Float32Builder::new(),
            cpu_idle_pct: Float32Builder::new(),
            memory_total_bytes: Int64Builder::new(),
            memory_used_bytes: Int64Builder::new(),
            memory_available_bytes: Int64Builder::new(),
            load1: Float32Builder::new(),
            load5: Float32Builder::new(),
            load15: Float32Builder::new(),
        }
    }
}

impl NodeRows {
    fn push(&mut self, node: &str, s: &NodeSample) {
        self.ts.append_value(s.ts_us);
        self.node.append_value(node);
        self.cpu_count.append_value(i32_of(s.cpu_count));
        self.cpu_user_pct.append_option(s.cpu_user_pct);
        self.cpu_system_pct.append_option(s.cpu_system_pct);
        self.cpu_iowait_pct.append_option(s.cpu_iowait_pct);
        self.cpu_idle_pct.append_option(s.cpu_idle_pct);
        self.memory_total_bytes
            .append_option(s.memory_total_bytes.map(i64_of));
        self.memory_used_bytes
            .append_option(s.memory_used_bytes.map(i64_of));
        self.memory_available_bytes
            .append_option(s.memory_available_bytes.map(i64_of));
        self.load1.append_option(s.load1);
        self.load5.append_option(s.load5);
        self.load15.append_option(s.load15);
    }
}

impl Rows for NodeRows {
    fn finish(&mut self) -> Vec<ArrayRef> {
        vec![
            Arc::new(self.ts.finish()),
            Arc::new(self.node.finish()),
            Arc::new(self.cpu_count.finish()),
            Arc::new(self.cpu_user_pct.finish()),
            Arc::new(self.cpu_system_pct.finish()),
            Arc::new(self.cpu_iowait_pct.finish()),
            Arc::new(self.cpu_idle_pct.finish()),
            Arc::new(self.memory_total_bytes.finish()),
            Arc::new(self.memory_used_bytes.finish()),
            Arc::new(self.memory_available_bytes.finish()),
            Arc::new(self.load1.finish()),
            Arc::new(self.load5.finish()),
            Arc::new(self.load15.finish()),
        ]
    }
}

struct IbRows {
    ts: TimestampMicrosecondBuilder,
    node: Dict,
    device: Dict,
    port: Int32Builder,
    state: Dict,
    rate_gbps: Float64Builder,
    xmit_bytes: Int64Builder,
    rcv_bytes: Int64Builder,
    xmit_packets: Int64Builder,
    rcv_packets: Int64Builder,
    xmit_bytes_per_s: Float64Builder,
    rcv_bytes_per_s: Float64Builder,
    xmit_packets_per_s: Float64Builder,
    rcv_packets_per_s: Float64Builder,
}

impl Default for IbRows {
    fn default() -> Self {
        Self {
            ts: ts_builder(),
            node: Dict::new(),
            device: Dict::new(),
            port: Int32Builder::new(),
            state: Dict::new(),
            rate_gbps: Float64Builder::new(),
            xmit_bytes: Int64Builder::new(),
            rcv_bytes: Int64Builder::new(),
            xmit_packets: Int64Builder::new(),
            rcv_packets: Int64Builder::new(),
            xmit_bytes_per_s: Float64Builder::new(),
            rcv_bytes_per_s: Float64Builder::new(),
            xmit_packets_per_s: Float64Builder::new(),
            rcv_packets_per_s: Float64Builder::new(),
        }
    }
}

impl IbRows {
    fn push(&mut self, node: &str, s: &IbPortSample) {
        self.ts.append_value(s.ts_us);
        self.node.append_value(node);
        self.device.append_value(&s.device);
        self.port.append_value(i32_of(s.port));
        self.state.append_value(&s.state);
        self.rate_gbps.append_option(s.rate_gbps);
        self.xmit_bytes.append_option(s.xmit_bytes.map(i64_of));
        self.rcv_bytes.append_option(s.rcv_bytes.map(i64_of));
        self.xmit_packets.append_option(s.xmit_packets.map(i64_of));
        self.rcv_packets.append_option(s.rcv_packets.map(i64_of));
        self.xmit_bytes_per_s.append_option(s.xmit_bytes_per_s);
        self.rcv_bytes_per_s.append_option(s.rcv_bytes_per_s);
        self.xmit_packets_per_s.append_option(s.xmit_packets_per_s);
        self.rcv_packets_per_s.append_option(s.rcv_packets_per_s);
    }
}

impl Rows for IbRows {
    fn finish(&mut self) -> Vec<ArrayRef> {
        vec![
            Arc::new(self.ts.finish()),
            Arc::new(self.node.finish()),
            Arc::new(self.device.finish()),
            Arc::new(self.port.finish()),
            Arc::new(self.state.finish()),
            Arc::new(self.rate_gbps.finish()),
            Arc::new(self.xmit_bytes.finish()),
            Arc::new(self.rcv_bytes.finish()),
            Arc::new(self.xmit_packets.finish()),
            Arc::new(self.rcv_packets.finish()),
            Arc::new(self.xmit_bytes_per_s.finish()),
            Arc::new(self.rcv_bytes_per_s.finish()),
            Arc::new(self.xmit_packets_per_s.finish()),
            Arc::new(self.rcv_packets_per_s.finish()),
        ]
    }
}
