//! InfiniBand ports, under node_exporter's infiniband collector's names.

use gputel_proto::IbPortSample;

use super::{Kind, RowMetric};

/// InfiniBand ports, under node_exporter's infiniband collector's names.
pub(super) const IB_METRICS: &[RowMetric<IbPortSample>] = &[
    RowMetric {
        name: "gputel_infiniband_state_id",
        kind: Kind::Gauge,
        help: "State of the port (1 down, 2 init, 3 armed, 4 active, 5 active defer).",
        value: |p| p.state_id.map(f64::from),
    },
    RowMetric {
        name: "gputel_infiniband_physical_state_id",
        kind: Kind::Gauge,
        help: "Physical state of the port (2 polling, 3 disabled, 5 link up, ...).",
        value: |p| p.phys_state_id.map(f64::from),
    },
    RowMetric {
        name: "gputel_infiniband_rate_bytes_per_second",
        kind: Kind::Gauge,
        help: "Link rate of the port, in bytes per second.",
        value: |p| p.rate_gbps.filter(|r| r.is_finite()).map(|r| r * 1e9 / 8.0),
    },
    RowMetric {
        name: "gputel_infiniband_port_data_transmitted_bytes_total",
        kind: Kind::Counter,
        help: "Data transmitted on the port, in bytes (4-byte words x 4; counters/port_xmit_data or counters_ext/port_xmit_data_64).",
        value: |p| p.xmit_bytes.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_port_data_received_bytes_total",
        kind: Kind::Counter,
        help: "Data received on the port, in bytes (4-byte words x 4; counters/port_rcv_data or counters_ext/port_rcv_data_64).",
        value: |p| p.rcv_bytes.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_port_packets_transmitted_total",
        kind: Kind::Counter,
        help: "Packets transmitted on the port.",
        value: |p| p.xmit_packets.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_port_packets_received_total",
        kind: Kind::Counter,
        help: "Packets received on the port.",
        value: |p| p.rcv_packets.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_unicast_packets_transmitted_total",
        kind: Kind::Counter,
        help: "Unicast packets transmitted on the port.",
        value: |p| p.unicast_xmit_packets.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_unicast_packets_received_total",
        kind: Kind::Counter,
        help: "Unicast packets received on the port.",
        value: |p| p.unicast_rcv_packets.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_multicast_packets_transmitted_total",
        kind: Kind::Counter,
        help: "Multicast packets transmitted on the port.",
        value: |p| p.multicast_xmit_packets.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_multicast_packets_received_total",
        kind: Kind::Counter,
        help: "Multicast packets received on the port.",
        value: |p| p.multicast_rcv_packets.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_symbol_error_total",
        kind: Kind::Counter,
        help: "Minor link errors detected on one or more physical lanes (counters/symbol_error).",
        value: |p| p.symbol_error.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_link_downed_total",
        kind: Kind::Counter,
        help: "Times the link failed to recover from errors and went down (counters/link_downed).",
        value: |p| p.link_downed.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_link_error_recovery_total",
        kind: Kind::Counter,
        help: "Times the link recovered from errors (counters/link_error_recovery).",
        value: |p| p.link_error_recovery.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_port_errors_received_total",
        kind: Kind::Counter,
        help: "Packets received with errors (counters/port_rcv_errors).",
        value: |p| p.port_rcv_errors.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_port_discards_transmitted_total",
        kind: Kind::Counter,
        help: "Outbound packets discarded (counters/port_xmit_discards).",
        value: |p| p.port_xmit_discards.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_port_transmit_wait_total",
        kind: Kind::Counter,
        help: "Ticks the port had data to send but no flow-control credits (counters/port_xmit_wait).",
        value: |p| p.port_xmit_wait.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_port_discards_received_total",
        kind: Kind::Counter,
        help: "Inbound packets discarded (counters/port_rcv_discards).",
        value: |p| p.port_rcv_discards.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_port_constraint_errors_received_total",
        kind: Kind::Counter,
        help: "Packets not received for partition or rate constraints (counters/port_rcv_constraint_errors).",
        value: |p| p.port_rcv_constraint_errors.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_port_constraint_errors_transmitted_total",
        kind: Kind::Counter,
        help: "Packets not transmitted for partition or rate constraints (counters/port_xmit_constraint_errors).",
        value: |p| p.port_xmit_constraint_errors.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_port_receive_remote_physical_errors_total",
        kind: Kind::Counter,
        help: "Packets received marked with the EBP delimiter (counters/port_rcv_remote_physical_errors).",
        value: |p| p.port_rcv_remote_physical_errors.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_port_receive_switch_relay_errors_total",
        kind: Kind::Counter,
        help: "Packets a switch could not relay (counters/port_rcv_switch_relay_errors).",
        value: |p| p.port_rcv_switch_relay_errors.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_local_link_integrity_errors_total",
        kind: Kind::Counter,
        help: "Times the local physical errors exceeded their threshold (counters/local_link_integrity_errors).",
        value: |p| p.local_link_integrity_errors.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_excessive_buffer_overrun_errors_total",
        kind: Kind::Counter,
        help: "Times consecutive flow-control overruns exceeded their threshold (counters/excessive_buffer_overrun_errors).",
        value: |p| p.excessive_buffer_overrun_errors.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_vl15_dropped_total",
        kind: Kind::Counter,
        help: "Subnet-management packets dropped for lack of buffers (counters/VL15_dropped).",
        value: |p| p.vl15_dropped.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_hw_out_of_buffer_total",
        kind: Kind::Counter,
        help: "Packets dropped for lack of receive buffers (hw_counters/out_of_buffer).",
        value: |p| p.hw_out_of_buffer.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_hw_out_of_sequence_total",
        kind: Kind::Counter,
        help: "Out-of-sequence packets received (hw_counters/out_of_sequence).",
        value: |p| p.hw_out_of_sequence.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_hw_packet_seq_err_total",
        kind: Kind::Counter,
        help: "NAKs for packet sequence errors received (hw_counters/packet_seq_err).",
        value: |p| p.hw_packet_seq_err.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_hw_local_ack_timeout_err_total",
        kind: Kind::Counter,
        help: "Transport retransmissions after an ACK timeout (hw_counters/local_ack_timeout_err).",
        value: |p| p.hw_local_ack_timeout_err.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_hw_rnr_nak_retry_err_total",
        kind: Kind::Counter,
        help: "Receiver-not-ready NAK retries exceeded (hw_counters/rnr_nak_retry_err).",
        value: |p| p.hw_rnr_nak_retry_err.map(|v| v as f64),
    },
    RowMetric {
        name: "gputel_infiniband_hw_implied_nak_seq_err_total",
        kind: Kind::Counter,
        help: "Implied NAK sequence errors (hw_counters/implied_nak_seq_err).",
        value: |p| p.hw_implied_nak_seq_err.map(|v| v as f64),
    },
];

/// The port's state as a label, so one series says it.
pub(super) const IB_STATE: &str = "gputel_infiniband_port_state";
pub(super) const IB_STATE_HELP: &str =
    "Always 1; the state label is the port's state (ACTIVE, DOWN, ...).";

/// The device's identity, one series per device, as node_exporter's
/// `node_infiniband_info` (an absent file is an empty label).
pub(super) const IB_INFO: &str = "gputel_infiniband_info";
pub(super) const IB_INFO_HELP: &str =
    "Always 1; the labels are the device's board id, firmware version and HCA type.";
