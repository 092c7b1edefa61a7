//! dcgm-exporter's per-GPU series and the XID and event counters.

use gputel_proto::GpuSample;

use super::{Kind, RowMetric, flag, mib, milli, ratio};

/// dcgm-exporter's per-GPU metrics, with its names, types and units
/// (`etc/default-counters.csv`, `etc/dcp-metrics-included.csv`).
pub(super) const GPU_METRICS: &[RowMetric<GpuSample>] = &[
    RowMetric {
        name: "DCGM_FI_DEV_SM_CLOCK",
        kind: Kind::Gauge,
        help: "SM clock frequency (in MHz).",
        value: |g| g.sm_clock_mhz.map(f64::from),
    },
    RowMetric {
        name: "DCGM_FI_DEV_MEM_CLOCK",
        kind: Kind::Gauge,
        help: "Memory clock frequency (in MHz).",
        value: |g| g.memory_clock_mhz.map(f64::from),
    },
    RowMetric {
        name: "DCGM_FI_DEV_MEMORY_TEMP",
        kind: Kind::Gauge,
        help: "Memory temperature (in C).",
        value: |g| g.memory_temperature_c.map(f64::from),
    },
    RowMetric {
        name: "DCGM_FI_DEV_GPU_TEMP",
        kind: Kind::Gauge,
        help: "GPU temperature (in C).",
        value: |g| g.temperature_c.map(f64::from),
    },
    RowMetric {
        name: "DCGM_FI_DEV_POWER_USAGE",
        kind: Kind::Gauge,
        help: "Power draw (in W).",
        value: |g| g.power_mw.map(milli),
    },
    RowMetric {
        name: "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        kind: Kind::Gauge,
        help: "Power management limit (in W).",
        value: |g| g.power_limit_mw.map(milli),
    },
    RowMetric {
        name: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        kind: Kind::Counter,
        help: "Total energy consumption since boot (in mJ).",
        value: |g| g.energy_mj.map(|v| v as f64),
    },
    RowMetric {
        name: "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        kind: Kind::Counter,
        help: "Total number of PCIe retries.",
        value: |g| g.pcie_replay_count.map(|v| v as f64),
    },
    RowMetric {
        name: "DCGM_FI_DEV_GPU_UTIL",
        kind: Kind::Gauge,
        help: "GPU utilization (in %).",
        value: |g| g.gpu_util_pct.map(f64::from),
    },
    RowMetric {
        name: "DCGM_FI_DEV_MEM_COPY_UTIL",
        kind: Kind::Gauge,
        help: "Memory utilization (in %).",
        value: |g| g.memory_copy_util_pct.map(f64::from),
    },
    RowMetric {
        name: "DCGM_FI_DEV_ENC_UTIL",
        kind: Kind::Gauge,
        help: "Encoder utilization (in %).",
        value: |g| g.enc_util_pct.map(f64::from),
    },
    RowMetric {
        name: "DCGM_FI_DEV_DEC_UTIL",
        kind: Kind::Gauge,
        help: "Decoder utilization (in %).",
        value: |g| g.dec_util_pct.map(f64::from),
    },
    RowMetric {
        name: "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        kind: Kind::Gauge,
        help: "Current clock throttle reasons (bitmask of nvmlClocksEventReason* bits).",
        value: |g| g.clock_event_reasons.map(|v| v as f64),
    },
    RowMetric {
        name: "DCGM_FI_DEV_FB_FREE",
        kind: Kind::Gauge,
        help: "Framebuffer memory free (in MiB).",
        value: |g| g.fb_free_bytes.map(mib),
    },
    RowMetric {
        name: "DCGM_FI_DEV_FB_USED",
        kind: Kind::Gauge,
        help: "Framebuffer memory used (in MiB).",
        value: |g| g.fb_used_bytes.map(mib),
    },
    RowMetric {
        name: "DCGM_FI_DEV_FB_RESERVED",
        kind: Kind::Gauge,
        help: "Framebuffer memory reserved (in MiB).",
        value: |g| g.fb_reserved_bytes.map(mib),
    },
    RowMetric {
        name: "DCGM_FI_DEV_FB_TOTAL",
        kind: Kind::Gauge,
        help: "Framebuffer memory total (in MiB).",
        value: |g| g.fb_total_bytes.map(mib),
    },
    RowMetric {
        name: "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        kind: Kind::Counter,
        help: "Total number of single-bit volatile ECC errors.",
        value: |g| g.ecc_corrected_volatile.map(|v| v as f64),
    },
    RowMetric {
        name: "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        kind: Kind::Counter,
        help: "Total number of double-bit volatile ECC errors.",
        value: |g| g.ecc_uncorrected_volatile.map(|v| v as f64),
    },
    RowMetric {
        name: "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        kind: Kind::Counter,
        help: "Total number of single-bit persistent ECC errors.",
        value: |g| g.ecc_corrected_aggregate.map(|v| v as f64),
    },
    RowMetric {
        name: "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        kind: Kind::Counter,
        help: "Total number of double-bit persistent ECC errors.",
        value: |g| g.ecc_uncorrected_aggregate.map(|v| v as f64),
    },
    RowMetric {
        name: "DCGM_FI_DEV_RETIRED_SBE",
        kind: Kind::Counter,
        help: "Total number of retired pages due to single-bit errors.",
        value: |g| g.retired_pages_sbe.map(|v| v as f64),
    },
    RowMetric {
        name: "DCGM_FI_DEV_RETIRED_DBE",
        kind: Kind::Counter,
        help: "Total number of retired pages due to double-bit errors.",
        value: |g| g.retired_pages_dbe.map(|v| v as f64),
    },
    RowMetric {
        name: "DCGM_FI_DEV_RETIRED_PENDING",
        kind: Kind::Counter,
        help: "Total number of pages pending retirement.",
        value: |g| g.retired_pages_pending.map(flag),
    },
    RowMetric {
        name: "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        kind: Kind::Counter,
        help: "Number of remapped rows for uncorrectable errors",
        value: |g| g.remapped_rows_uncorrected.map(f64::from),
    },
    RowMetric {
        name: "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        kind: Kind::Counter,
        help: "Number of remapped rows for correctable errors",
        value: |g| g.remapped_rows_corrected.map(f64::from),
    },
    RowMetric {
        name: "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        kind: Kind::Gauge,
        help: "Whether remapping of rows has failed",
        value: |g| g.remapped_rows_failure.map(flag),
    },
    RowMetric {
        name: "DCGM_FI_DEV_ROW_REMAP_PENDING",
        kind: Kind::Gauge,
        help: "Whether remapping of rows is pending (a GPU reset applies it)",
        value: |g| g.remapped_rows_pending.map(flag),
    },
    // dcgm-exporter declares this MB/s rate a counter; its type and help
    // are copied as they are, because dashboards and recording rules were
    // written against them.
    RowMetric {
        name: "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        kind: Kind::Counter,
        help: "Total number of NVLink bandwidth counters for all lanes.",
        value: |g| nvlink_bandwidth_total(g).map(|v| v as f64),
    },
    RowMetric {
        name: "DCGM_FI_PROF_SM_ACTIVE",
        kind: Kind::Gauge,
        help: "The ratio of cycles an SM has at least 1 warp assigned.",
        value: |g| g.sm_active_pct.and_then(ratio),
    },
    RowMetric {
        name: "DCGM_FI_PROF_SM_OCCUPANCY",
        kind: Kind::Gauge,
        help: "The ratio of number of warps resident on an SM.",
        value: |g| g.sm_occupancy_pct.and_then(ratio),
    },
    RowMetric {
        name: "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        kind: Kind::Gauge,
        help: "Ratio of cycles the tensor (HMMA) pipe is active.",
        value: |g| g.tensor_active_pct.and_then(ratio),
    },
    RowMetric {
        name: "DCGM_FI_PROF_DRAM_ACTIVE",
        kind: Kind::Gauge,
        help: "Ratio of cycles the device memory interface is active sending or receiving data.",
        value: |g| g.dram_active_pct.and_then(ratio),
    },
    RowMetric {
        name: "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        kind: Kind::Gauge,
        help: "Ratio of time the graphics engine is active.",
        value: |g| g.gr_engine_active_pct.and_then(ratio),
    },
    RowMetric {
        name: "DCGM_FI_PROF_PCIE_TX_BYTES",
        kind: Kind::Gauge,
        help: "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
        value: |g| g.pcie_tx_bytes_per_s.map(|v| v as f64),
    },
    RowMetric {
        name: "DCGM_FI_PROF_PCIE_RX_BYTES",
        kind: Kind::Gauge,
        help: "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
        value: |g| g.pcie_rx_bytes_per_s.map(|v| v as f64),
    },
    RowMetric {
        name: "DCGM_FI_PROF_NVLINK_TX_BYTES",
        kind: Kind::Gauge,
        help: "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
        value: |g| g.nvlink_tx_bytes_per_s.map(|v| v as f64),
    },
    RowMetric {
        name: "DCGM_FI_PROF_NVLINK_RX_BYTES",
        kind: Kind::Gauge,
        help: "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
        value: |g| g.nvlink_rx_bytes_per_s.map(|v| v as f64),
    },
];

/// DCGM's NVLink bandwidth (field 449): the increase of NVML's KiB counters
/// of both directions per second, divided by 1000 (DCGM calls it MB/s; it is
/// KiB/s ÷ 1000), truncated. None unless both directions were read.
fn nvlink_bandwidth_total(g: &GpuSample) -> Option<u64> {
    let bytes_per_s = g
        .nvlink_tx_bytes_per_s?
        .checked_add(g.nvlink_rx_bytes_per_s?)?;
    Some(bytes_per_s / 1024 / 1000)
}

/// The last XID per GPU, as DCGM keeps it: it stays until another XID comes.
pub(super) const XID_LAST: &str = "DCGM_FI_DEV_XID_ERRORS";
pub(super) const XID_LAST_HELP: &str = "Value of the last XID error encountered.";
pub(super) const XID_EVENTS: &str = "gputel_xid_events_total";
pub(super) const XID_EVENTS_HELP: &str = "XID errors reported by the driver, per GPU and XID.";
pub(super) const GPU_EVENTS: &str = "gputel_gpu_events_total";
pub(super) const GPU_EVENTS_HELP: &str =
    "GPU events (xid, gpu_lost, thermal_throttle, power_throttle), per GPU and kind.";
