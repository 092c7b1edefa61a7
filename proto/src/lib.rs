//! The gputel wire protocol: messages and the gRPC service between agent and collector.
//!
//! Generated from `proto/gputel/v1/telemetry.proto`; see that file for the meaning of
//! every field.

#![allow(missing_debug_implementations, clippy::all, clippy::unwrap_used)]

/// Version 1 of the protocol.
pub mod v1 {
    tonic::include_proto!("gputel.v1");
}

pub use v1::{
    AgentMessage, AlertRow, Batch, CollectorMessage, EventKind, GpuEvent, GpuProcess, GpuSample,
    Hello, IbPortSample, NodeSample, WalRecord, WalState, agent_message, collector_message,
};

/// Largest encoded message either side accepts by default (16 MiB).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

impl EventKind {
    /// The kind as it is stored and shown: "xid", "gpu_lost", "thermal_throttle",
    /// "power_throttle".
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Unspecified => "unspecified",
            EventKind::Xid => "xid",
            EventKind::GpuLost => "gpu_lost",
            EventKind::ThermalThrottle => "thermal_throttle",
            EventKind::PowerThrottle => "power_throttle",
        }
    }
}

/// Serializes an `EventKind` field (an `i32` on the wire) by its name.
pub fn serialize_event_kind<S: serde::Serializer>(kind: &i32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(EventKind::try_from(*kind).map_or("unknown", EventKind::name))
}
