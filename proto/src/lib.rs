//! The gputel wire protocol: messages and the gRPC service between agent and collector.
//!
//! Generated from `proto/gputel/v1/telemetry.proto`; see that file for the meaning of
//! every field.

/// Version 1 of the protocol.
#[allow(missing_debug_implementations, clippy::all, clippy::unwrap_used)]
pub mod v1 {
    tonic::include_proto!("gputel.v1");
    // The collector's server (`telemetry_server`), with the raw codec of
    // [`crate::wire`].
    include!(concat!(env!("OUT_DIR"), "/gputel.v1.Telemetry.rs"));
}

pub mod wire;

/// The kubelet's pod-resources API (`proto/kubelet/podresources/v1/api.proto`):
/// which pod and container each device on the node is allocated to.
#[allow(missing_debug_implementations, clippy::all, clippy::unwrap_used)]
pub mod podresources {
    include!(concat!(env!("OUT_DIR"), "/v1.rs"));
}

pub use v1::{
    AgentMessage, AlertRow, Batch, CollectorMessage, EventKind, GpuEvent, GpuProcess, GpuSample,
    Hello, IbPortSample, NodeEvent, NodeSample, ProfilingSource, WalRecord, WalState,
    agent_message, collector_message,
};

/// The bits of `GpuSample.clock_event_reasons` (NVML's
/// `nvmlClocksEventReason*`) that gputel names: the `gpu` table's
/// `throttle_*` columns, the agent's throttling events and the alert rules
/// all read them from here.
pub mod clock_event_reasons {
    /// Clocks are low because nothing runs.
    pub const GPU_IDLE: u64 = 0x1;
    /// Software power capping (the power limit).
    pub const SW_POWER_CAP: u64 = 0x4;
    /// Hardware slowdown (thermal or power brake, among others).
    pub const HW_SLOWDOWN: u64 = 0x8;
    /// Held back to stay in sync with other GPUs of a sync-boost group.
    pub const SYNC_BOOST: u64 = 0x10;
    /// Software thermal slowdown.
    pub const SW_THERMAL: u64 = 0x20;
    /// Hardware thermal slowdown.
    pub const HW_THERMAL: u64 = 0x40;
    /// Hardware power brake (an external power signal).
    pub const HW_POWER_BRAKE: u64 = 0x80;
    /// The reasons that make a thermal throttling episode.
    pub const THERMAL: u64 = SW_THERMAL | HW_THERMAL;
    /// The reasons that make a power throttling episode.
    pub const POWER: u64 = SW_POWER_CAP | HW_POWER_BRAKE;
    /// Every named reason by the suffix of its `gpu` table column
    /// (`throttle_<name>`), in bit order.
    pub const NAMED: [(&str, u64); 7] = [
        ("gpu_idle", GPU_IDLE),
        ("sw_power_cap", SW_POWER_CAP),
        ("hw_slowdown", HW_SLOWDOWN),
        ("sync_boost", SYNC_BOOST),
        ("sw_thermal", SW_THERMAL),
        ("hw_thermal", HW_THERMAL),
        ("hw_power_brake", HW_POWER_BRAKE),
    ];
}

/// Largest encoded message either side accepts by default (16 MiB).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

impl EventKind {
    /// The kind as it is stored and shown: "xid", "gpu_lost", "thermal_throttle",
    /// "power_throttle", "node_silent", "node_back".
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Unspecified => "unspecified",
            EventKind::Xid => "xid",
            EventKind::GpuLost => "gpu_lost",
            EventKind::ThermalThrottle => "thermal_throttle",
            EventKind::PowerThrottle => "power_throttle",
            EventKind::NodeSilent => "node_silent",
            EventKind::NodeBack => "node_back",
        }
    }

    /// Whether the kind is of a node as a whole (the collector's own node
    /// events), not of one GPU.
    pub fn is_node_wide(self) -> bool {
        matches!(self, EventKind::NodeSilent | EventKind::NodeBack)
    }
}

/// Serializes an `EventKind` field (an `i32` on the wire) by its name.
pub fn serialize_event_kind<S: serde::Serializer>(kind: &i32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(EventKind::try_from(*kind).map_or("unknown", EventKind::name))
}

impl ProfilingSource {
    /// The source as it is stored and shown: "gpm" or "dcgm".
    pub fn name(self) -> &'static str {
        match self {
            ProfilingSource::Unspecified => "unspecified",
            ProfilingSource::Gpm => "gpm",
            ProfilingSource::Dcgm => "dcgm",
        }
    }
}

/// Serializes an optional `ProfilingSource` field (an `i32` on the wire) by
/// its name, or null when unset.
pub fn serialize_profiling_source<S: serde::Serializer>(
    source: &Option<i32>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match source {
        Some(v) => {
            s.serialize_str(ProfilingSource::try_from(*v).map_or("unknown", ProfilingSource::name))
        }
        None => s.serialize_none(),
    }
}
