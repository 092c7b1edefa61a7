//! Validation of everything an agent sends. A batch that fails is refused as a
//! whole with a reason that names the offending row and field; nothing else on
//! the stream is affected.

use gputel_proto::{Batch, EventKind, Hello};

/// Most rows one batch may carry (all tables together).
pub const MAX_BATCH_ROWS: usize = 100_000;
/// Longest string value accepted in a row (UUIDs, model names, port states).
pub const MAX_VALUE_BYTES: usize = 256;
/// Longest event detail accepted.
pub const MAX_DETAIL_BYTES: usize = 1024;
/// Earliest accepted sample time: 2000-01-01T00:00:00Z. Older means a dead RTC.
pub const MIN_TS_US: i64 = 946_684_800_000_000;
/// How far ahead of the collector's clock a sample may be: one day.
pub const MAX_FUTURE_US: i64 = 24 * 3600 * 1_000_000;

/// Why a hello or a batch was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("{what} {value:?} is invalid: use 1 to {max} characters of [A-Za-z0-9._-]")]
    Identifier {
        what: &'static str,
        value: String,
        max: usize,
    },
    #[error("batch sequence number must be at least 1")]
    ZeroSeq,
    #[error("batch has {rows} rows, more than the limit of {MAX_BATCH_ROWS}")]
    TooManyRows { rows: usize },
    #[error(
        "{table} row {row}: timestamp {ts_us} µs is outside the accepted window (2000-01-01 to one day after the collector's clock); check the node's clock"
    )]
    Timestamp {
        table: &'static str,
        row: usize,
        ts_us: i64,
    },
    #[error("{table} row {row}: {field} is longer than {max} bytes")]
    TooLong {
        table: &'static str,
        row: usize,
        field: &'static str,
        max: usize,
    },
    #[error("{table} row {row}: {field} is {reason}")]
    Field {
        table: &'static str,
        row: usize,
        field: &'static str,
        reason: &'static str,
    },
}

/// A batch that passed [`validate_batch`]: every timestamp is in the accepted
/// window and every value fits its column.
#[derive(Debug, Clone, Copy)]
pub struct ValidBatch<'a>(&'a Batch);

impl<'a> ValidBatch<'a> {
    /// The validated batch.
    pub fn get(self) -> &'a Batch {
        self.0
    }
}

/// Checks a hello's node name and agent id: they become row values and,
/// later, parts of paths, so only a conservative character set is accepted.
pub fn validate_hello(hello: &Hello) -> Result<(), ValidationError> {
    identifier("node name", &hello.node, 253)?;
    identifier("agent id", &hello.agent_id, 128)?;
    Ok(())
}

fn identifier(what: &'static str, value: &str, max: usize) -> Result<(), ValidationError> {
    let ok = !value.is_empty()
        && value.len() <= max
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ValidationError::Identifier {
            what,
            value: value.chars().take(max + 1).collect(),
            max,
        })
    }
}

/// Checks a batch against the limits above, with `now_us` as the collector's clock.
pub fn validate_batch(batch: &Batch, now_us: i64) -> Result<ValidBatch<'_>, ValidationError> {
    if batch.seq == 0 {
        return Err(ValidationError::ZeroSeq);
    }
    let rows = row_count(batch);
    if rows > MAX_BATCH_ROWS {
        return Err(ValidationError::TooManyRows { rows });
    }
    let check = RowCheck { now_us };
    for (row, s) in batch.gpu.iter().enumerate() {
        let c = check.row("gpu", row, s.ts_us)?;
        c.int32("gpu", Some(s.gpu))?;
        c.text("uuid", &s.uuid)?;
        c.text("model", &s.model)?;
        c.int32("xid_count", Some(s.xid_count))?;
        c.int32("job_count", Some(s.job_count))?;
        c.opt_text("job_id", s.job_id.as_deref())?;
        c.opt_text("pod_uid", s.pod_uid.as_deref())?;
        for (field, v) in [
            ("temperature_c", s.temperature_c),
            ("memory_temperature_c", s.memory_temperature_c),
            ("sm_clock_mhz", s.sm_clock_mhz),
            ("memory_clock_mhz", s.memory_clock_mhz),
            ("gpu_util_pct", s.gpu_util_pct),
            ("memory_copy_util_pct", s.memory_copy_util_pct),
            ("remapped_rows_corrected", s.remapped_rows_corrected),
            ("remapped_rows_uncorrected", s.remapped_rows_uncorrected),
        ] {
            c.int32(field, v)?;
        }
        for (field, v) in [
            ("energy_mj", s.energy_mj),
            ("fb_used_bytes", s.fb_used_bytes),
            ("fb_free_bytes", s.fb_free_bytes),
            ("fb_total_bytes", s.fb_total_bytes),
            ("clock_event_reasons", s.clock_event_reasons),
            ("ecc_corrected_volatile", s.ecc_corrected_volatile),
            ("ecc_uncorrected_volatile", s.ecc_uncorrected_volatile),
            ("ecc_corrected_aggregate", s.ecc_corrected_aggregate),
            ("ecc_uncorrected_aggregate", s.ecc_uncorrected_aggregate),
            ("retired_pages_sbe", s.retired_pages_sbe),
            ("retired_pages_dbe", s.retired_pages_dbe),
            ("pcie_replay_count", s.pcie_replay_count),
            ("pcie_tx_bytes_per_s", s.pcie_tx_bytes_per_s),
            ("pcie_rx_bytes_per_s", s.pcie_rx_bytes_per_s),
            ("nvlink_tx_bytes_per_s", s.nvlink_tx_bytes_per_s),
            ("nvlink_rx_bytes_per_s", s.nvlink_rx_bytes_per_s),
        ] {
            c.int64(field, v)?;
        }
        for (field, v) in [
            ("sm_active_pct", s.sm_active_pct),
            ("sm_occupancy_pct", s.sm_occupancy_pct),
            ("tensor_active_pct", s.tensor_active_pct),
            ("dram_active_pct", s.dram_active_pct),
        ] {
            c.finite(field, v.map(f64::from))?;
        }
    }
    for (row, s) in batch.node.iter().enumerate() {
        let c = check.row("node", row, s.ts_us)?;
        c.int32("cpu_count", Some(s.cpu_count))?;
        for job in &s.jobs {
            c.text("jobs", job)?;
        }
        for (field, v) in [
            ("cpu_user_pct", s.cpu_user_pct),
            ("cpu_system_pct", s.cpu_system_pct),
            ("cpu_iowait_pct", s.cpu_iowait_pct),
            ("cpu_idle_pct", s.cpu_idle_pct),
            ("load1", s.load1),
            ("load5", s.load5),
            ("load15", s.load15),
        ] {
            c.finite(field, v.map(f64::from))?;
        }
        for (field, v) in [
            ("memory_total_bytes", s.memory_total_bytes),
            ("memory_used_bytes", s.memory_used_bytes),
            ("memory_available_bytes", s.memory_available_bytes),
        ] {
            c.int64(field, v)?;
        }
    }
    for (row, s) in batch.ib.iter().enumerate() {
        let c = check.row("ib", row, s.ts_us)?;
        c.text("device", &s.device)?;
        c.text("state", &s.state)?;
        c.int32("port", Some(s.port))?;
        for (field, v) in [
            ("rate_gbps", s.rate_gbps),
            ("xmit_bytes_per_s", s.xmit_bytes_per_s),
            ("rcv_bytes_per_s", s.rcv_bytes_per_s),
            ("xmit_packets_per_s", s.xmit_packets_per_s),
            ("rcv_packets_per_s", s.rcv_packets_per_s),
        ] {
            c.finite(field, v)?;
        }
        for (field, v) in [
            ("xmit_bytes", s.xmit_bytes),
            ("rcv_bytes", s.rcv_bytes),
            ("xmit_packets", s.xmit_packets),
            ("rcv_packets", s.rcv_packets),
            ("symbol_error", s.symbol_error),
            ("link_downed", s.link_downed),
            ("link_error_recovery", s.link_error_recovery),
            ("port_rcv_errors", s.port_rcv_errors),
            ("port_xmit_discards", s.port_xmit_discards),
            ("port_xmit_wait", s.port_xmit_wait),
            ("hw_out_of_buffer", s.hw_out_of_buffer),
            ("hw_out_of_sequence", s.hw_out_of_sequence),
            ("hw_packet_seq_err", s.hw_packet_seq_err),
            ("hw_local_ack_timeout_err", s.hw_local_ack_timeout_err),
            ("hw_rnr_nak_retry_err", s.hw_rnr_nak_retry_err),
            ("hw_implied_nak_seq_err", s.hw_implied_nak_seq_err),
        ] {
            c.int64(field, v)?;
        }
    }
    for (row, s) in batch.event.iter().enumerate() {
        let c = check.row("event", row, s.ts_us)?;
        c.int32("gpu", Some(s.gpu))?;
        c.text("uuid", &s.uuid)?;
        c.int64("code", Some(s.code))?;
        c.text_up_to("detail", &s.detail, MAX_DETAIL_BYTES)?;
        c.opt_text("job_id", s.job_id.as_deref())?;
        if !matches!(
            EventKind::try_from(s.kind),
            Ok(EventKind::Xid
                | EventKind::GpuLost
                | EventKind::ThermalThrottle
                | EventKind::PowerThrottle)
        ) {
            return Err(c.fail("kind", "not a known event kind"));
        }
    }
    for (row, s) in batch.gpu_process.iter().enumerate() {
        let c = check.row("gpu_process", row, s.ts_us)?;
        c.int32("gpu", Some(s.gpu))?;
        c.int32("pid", Some(s.pid))?;
        c.text("uuid", &s.uuid)?;
        c.text("command", &s.command)?;
        c.opt_text("job_id", s.job_id.as_deref())?;
        c.opt_text("pod_uid", s.pod_uid.as_deref())?;
        c.int64("used_memory_bytes", s.used_memory_bytes)?;
    }
    Ok(ValidBatch(batch))
}

/// Rows in a batch, all tables together.
pub fn row_count(batch: &Batch) -> usize {
    batch.gpu.len()
        + batch.node.len()
        + batch.ib.len()
        + batch.event.len()
        + batch.gpu_process.len()
}

#[derive(Debug, Clone, Copy)]
struct RowCheck {
    now_us: i64,
}

impl RowCheck {
    fn row(self, table: &'static str, row: usize, ts_us: i64) -> Result<Row, ValidationError> {
        if ts_us < MIN_TS_US || ts_us > self.now_us.saturating_add(MAX_FUTURE_US) {
            return Err(ValidationError::Timestamp { table, row, ts_us });
        }
        Ok(Row { table, row })
    }
}

/// One row being checked, for error messages.
#[derive(Debug, Clone, Copy)]
struct Row {
    table: &'static str,
    row: usize,
}

impl Row {
    fn fail(self, field: &'static str, reason: &'static str) -> ValidationError {
        ValidationError::Field {
            table: self.table,
            row: self.row,
            field,
            reason,
        }
    }

    fn int32(self, field: &'static str, v: Option<u32>) -> Result<(), ValidationError> {
        match v {
            Some(v) if v > i32::MAX as u32 => Err(self.fail(field, "larger than 2^31-1")),
            _ => Ok(()),
        }
    }

    fn int64(self, field: &'static str, v: Option<u64>) -> Result<(), ValidationError> {
        match v {
            Some(v) if v > i64::MAX as u64 => Err(self.fail(field, "larger than 2^63-1")),
            _ => Ok(()),
        }
    }

    fn finite(self, field: &'static str, v: Option<f64>) -> Result<(), ValidationError> {
        match v {
            Some(v) if !v.is_finite() => Err(self.fail(field, "not a finite number")),
            _ => Ok(()),
        }
    }

    fn opt_text(self, field: &'static str, v: Option<&str>) -> Result<(), ValidationError> {
        v.map_or(Ok(()), |v| self.text(field, v))
    }

    fn text(self, field: &'static str, v: &str) -> Result<(), ValidationError> {
        self.text_up_to(field, v, MAX_VALUE_BYTES)
    }

    fn text_up_to(self, field: &'static str, v: &str, max: usize) -> Result<(), ValidationError> {
        if v.len() > max {
            Err(ValidationError::TooLong {
                table: self.table,
                row: self.row,
                field,
                max,
            })
        } else if v.chars().any(char::is_control) {
            Err(self.fail(field, "holding control characters"))
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gputel_proto::{GpuSample, IbPortSample, NodeSample};

    const NOW: i64 = 1_795_240_800_000_000;

    fn batch() -> Batch {
        Batch {
            seq: 1,
            gpu: vec![GpuSample {
                ts_us: NOW,
                gpu: 0,
                uuid: "GPU-1".into(),
                model: "NVIDIA H100 80GB HBM3".into(),
                temperature_c: Some(40),
                ..Default::default()
            }],
            node: vec![NodeSample {
                ts_us: NOW,
                cpu_count: 8,
                cpu_user_pct: Some(12.5),
                ..Default::default()
            }],
            ib: vec![IbPortSample {
                ts_us: NOW,
                device: "mlx5_0".into(),
                port: 1,
                state: "ACTIVE".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// The seeds of the `agent_message` fuzz target: a hello, and the batch
    /// above with an event and a process, encoded as an agent sends them.
    /// `GPUTEL_UPDATE_GOLDEN=1` rewrites them.
    #[test]
    fn the_fuzz_seeds_are_a_hello_and_a_plausible_batch() {
        use gputel_proto::agent_message::Kind;
        use gputel_proto::{AgentMessage, GpuEvent, GpuProcess};
        use prost::Message;

        let hello = Hello {
            node: "gpu-node-017".into(),
            agent_id: "9d1c0b6e-4a51-4c1e-8c55-3f1d7e2a0b17".into(),
            agent_version: "0.1.0".into(),
            boot_id: "0f3c2a9e-6d1b-4f5e-9a7c-2b8d4e6f1a3c".into(),
        };
        assert!(validate_hello(&hello).is_ok());
        let mut full = batch();
        full.gpu[0].job_id = Some("4242".into());
        full.event.push(GpuEvent {
            ts_us: NOW,
            gpu: 0,
            uuid: "GPU-1".into(),
            kind: EventKind::Xid as i32,
            code: 79,
            detail: "GPU has fallen off the bus".into(),
            job_id: Some("4242".into()),
        });
        full.gpu_process.push(GpuProcess {
            ts_us: NOW,
            gpu: 0,
            uuid: "GPU-1".into(),
            pid: 4242,
            used_memory_bytes: Some(1 << 30),
            command: "python".into(),
            job_id: Some("4242".into()),
            pod_uid: None,
        });
        assert!(validate_batch(&full, NOW).is_ok());

        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/agent_message");
        let update = std::env::var_os("GPUTEL_UPDATE_GOLDEN").is_some();
        for (name, kind) in [
            ("hello.pb", Kind::Hello(hello)),
            ("batch.pb", Kind::Batch(full)),
        ] {
            let bytes = AgentMessage { kind: Some(kind) }.encode_to_vec();
            let path = dir.join(name);
            if update {
                std::fs::write(&path, &bytes).expect("write a seed");
            }
            let seed = std::fs::read(&path).expect("read a seed");
            assert!(
                seed == bytes,
                "{} differs from the message it seeds; rerun with GPUTEL_UPDATE_GOLDEN=1",
                path.display()
            );
        }
    }

    #[test]
    fn a_plausible_batch_passes() {
        assert!(validate_batch(&batch(), NOW).is_ok());
    }

    #[test]
    fn each_bad_value_is_named() {
        let mut b = batch();
        b.seq = 0;
        assert_eq!(
            validate_batch(&b, NOW).unwrap_err(),
            ValidationError::ZeroSeq
        );

        let mut b = batch();
        b.gpu[0].ts_us = NOW + MAX_FUTURE_US + 1;
        assert_eq!(
            validate_batch(&b, NOW).unwrap_err().to_string(),
            format!(
                "gpu row 0: timestamp {} µs is outside the accepted window (2000-01-01 to one day after the collector's clock); check the node's clock",
                NOW + MAX_FUTURE_US + 1
            )
        );

        let mut b = batch();
        b.node[0].ts_us = MIN_TS_US - 1;
        assert!(matches!(
            validate_batch(&b, NOW),
            Err(ValidationError::Timestamp {
                table: "node",
                row: 0,
                ..
            })
        ));

        let mut b = batch();
        b.gpu[0].temperature_c = Some(u32::MAX);
        assert_eq!(
            validate_batch(&b, NOW).unwrap_err().to_string(),
            "gpu row 0: temperature_c is larger than 2^31-1"
        );

        let mut b = batch();
        b.node[0].load1 = Some(f32::NAN);
        assert_eq!(
            validate_batch(&b, NOW).unwrap_err().to_string(),
            "node row 0: load1 is not a finite number"
        );

        let mut b = batch();
        b.ib[0].state = "A\nB".into();
        assert_eq!(
            validate_batch(&b, NOW).unwrap_err().to_string(),
            "ib row 0: state is holding control characters"
        );

        let mut b = batch();
        b.gpu = vec![b.gpu[0].clone(); MAX_BATCH_ROWS];
        assert_eq!(
            validate_batch(&b, NOW).unwrap_err(),
            ValidationError::TooManyRows {
                rows: MAX_BATCH_ROWS + 2
            }
        );
    }

    #[test]
    fn hostile_node_names_are_refused() {
        let hello = |node: &str| Hello {
            node: node.into(),
            agent_id: "a1".into(),
            ..Default::default()
        };
        assert!(validate_hello(&hello("gpu-node-017.cluster")).is_ok());
        for bad in ["", "../etc", "a/b", "nul\0x", "x y", &"n".repeat(254)] {
            assert!(validate_hello(&hello(bad)).is_err(), "{bad:?}");
        }
    }
}
