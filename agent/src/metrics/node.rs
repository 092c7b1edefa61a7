//! The host's series, under node_exporter-like names.

use gputel_proto::NodeSample;

use super::{Kind, RowMetric, decimal};

/// The host, under node_exporter-like names.
pub(super) const NODE_METRICS: &[RowMetric<NodeSample>] = &[
    RowMetric {
        name: "gputel_node_cpus",
        kind: Kind::Gauge,
        help: "Logical CPUs counted in /proc/stat.",
        value: |n| (n.cpu_count > 0).then_some(f64::from(n.cpu_count)),
    },
    RowMetric {
        name: "gputel_node_memory_total_bytes",
        kind: Kind::Gauge,
        help: "MemTotal of /proc/meminfo, in bytes.",
        value: |n| n.memory_total_kib.map(kib_to_bytes),
    },
    RowMetric {
        name: "gputel_node_memory_available_bytes",
        kind: Kind::Gauge,
        help: "MemAvailable of /proc/meminfo, in bytes (without MemAvailable: MemFree + Buffers + Cached + SReclaimable).",
        value: |n| n.memory_available_kib.map(kib_to_bytes),
    },
    RowMetric {
        name: "gputel_node_memory_used_bytes",
        kind: Kind::Gauge,
        help: "MemTotal - MemAvailable, in bytes (without MemAvailable: MemTotal - MemFree - Buffers - Cached - SReclaimable).",
        value: |n| {
            let used = n.memory_total_kib?.checked_sub(n.memory_available_kib?)?;
            Some(kib_to_bytes(used))
        },
    },
    RowMetric {
        name: "gputel_node_rapl_package_joules_total",
        kind: Kind::Counter,
        help: "RAPL energy of the CPU packages (package-N zones, summed), in joules; each zone wraps at its max_energy_range_uj.",
        value: |n| n.cpu_package_energy_uj.map(|v| v as f64 / 1e6),
    },
    RowMetric {
        name: "gputel_node_rapl_dram_joules_total",
        kind: Kind::Counter,
        help: "RAPL energy of the DRAM (dram zones, summed), in joules; each zone wraps at its max_energy_range_uj.",
        value: |n| n.dram_energy_uj.map(|v| v as f64 / 1e6),
    },
    RowMetric {
        name: "gputel_node_rapl_package_power_watts",
        kind: Kind::Gauge,
        help: "Average power of the CPU packages since the previous tick, in watts.",
        value: |n| n.cpu_package_power_w.filter(|v| v.is_finite()),
    },
    RowMetric {
        name: "gputel_node_rapl_dram_power_watts",
        kind: Kind::Gauge,
        help: "Average power of the DRAM since the previous tick, in watts.",
        value: |n| n.dram_power_w.filter(|v| v.is_finite()),
    },
    RowMetric {
        name: "gputel_node_load1",
        kind: Kind::Gauge,
        help: "1-minute load average.",
        value: |n| n.load1.and_then(decimal),
    },
    RowMetric {
        name: "gputel_node_load5",
        kind: Kind::Gauge,
        help: "5-minute load average.",
        value: |n| n.load5.and_then(decimal),
    },
    RowMetric {
        name: "gputel_node_load15",
        kind: Kind::Gauge,
        help: "15-minute load average.",
        value: |n| n.load15.and_then(decimal),
    },
];

/// CPU time, one series per mode, as node_exporter's `node_cpu_seconds_total`
/// (summed over the CPUs, and in the node row's five groups).
pub(super) const NODE_CPU: &str = "gputel_node_cpu_seconds_total";
pub(super) const NODE_CPU_HELP: &str = "Seconds all CPUs spent in each mode since boot (user: user + nice; system: system + irq + softirq).";
/// A CPU mode's counter, in jiffies (USER_HZ ticks), from a node row.
type CpuCounter = fn(&NodeSample) -> Option<u64>;
pub(super) const NODE_CPU_MODES: &[(&str, CpuCounter)] = &[
    ("user", |n| n.cpu_user_jiffies),
    ("system", |n| n.cpu_system_jiffies),
    ("iowait", |n| n.cpu_iowait_jiffies),
    ("idle", |n| n.cpu_idle_jiffies),
    ("steal", |n| n.cpu_steal_jiffies),
];

/// /proc/meminfo's KiB in bytes.
fn kib_to_bytes(kib: u64) -> f64 {
    kib as f64 * 1024.0
}
