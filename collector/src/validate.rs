//! Validation of everything an agent sends. A batch that fails is refused as a
//! whole with a reason that names the offending row and field; nothing else on
//! the stream is affected.

//!
//! What each column accepts is declared with the table in `gputel_schemas`;
//! this module adds what concerns a batch as a whole.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::Hash;

use gputel_proto::{Batch, GpuSample, Hello, IbPortSample, NodeSample};
pub use gputel_schemas::column::{MAX_DETAIL_BYTES, MAX_FUTURE_US, MAX_VALUE_BYTES, MIN_TS_US};
use gputel_schemas::{
    ColumnError, EventRows, EventSource, GpuProcessRows, GpuRows, IbRows, NodeRows, RowContext,
    Table,
};

/// Most rows one batch may carry (all tables together).
pub const MAX_BATCH_ROWS: usize = 100_000;

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
        "{table} rows {first} and {second} repeat one key ({key}): a batch holds one row per {per} and tick"
    )]
    DuplicateKey {
        table: &'static str,
        first: usize,
        second: usize,
        key: String,
        per: &'static str,
    },
    #[error(transparent)]
    Column(#[from] ColumnError),
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
    // "." would be the empty name once canonical.
    identifier("node name", &canonical_node(&hello.node), 253).map_err(|_| {
        ValidationError::Identifier {
            what: "node name",
            value: hello.node.clone(),
            max: 253,
        }
    })?;
    identifier("agent id", &hello.agent_id, 128)?;
    Ok(())
}

/// A node name as the collector compares and stores it: DNS names are
/// case-insensitive and `node-a.` (fully qualified) is `node-a`, so
/// `NODE-A`, `node-a.` and `node-a` are one node, stored as `node-a`.
pub fn canonical_node(node: &str) -> String {
    node.strip_suffix('.').unwrap_or(node).to_ascii_lowercase()
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
    check_rows(Table::Gpu, &batch.gpu, now_us, GpuRows::check)?;
    check_rows(Table::Node, &batch.node, now_us, NodeRows::check)?;
    check_rows(Table::Ib, &batch.ib, now_us, IbRows::check)?;
    check_rows(Table::Event, &batch.event, now_us, |row, node, e| {
        EventRows::check(row, node, &EventSource::Gpu(e))
    })?;
    check_rows(
        Table::GpuProcess,
        &batch.gpu_process,
        now_us,
        GpuProcessRows::check,
    )?;
    unique_keys(Table::Gpu, &batch.gpu, "GPU or MIG device", gpu_key, |k| {
        let opt = |v: Option<u32>| v.map_or("null".to_owned(), |v| v.to_string());
        format!(
            "gpu {}, gpu_instance_id {}, compute_instance_id {}, ts {}",
            k.0,
            opt(k.1),
            opt(k.2),
            k.3
        )
    })?;
    unique_keys(Table::Node, &batch.node, "node", node_key, |ts| {
        format!("ts {ts}")
    })?;
    unique_keys(Table::Ib, &batch.ib, "InfiniBand port", ib_key, |k| {
        format!("device {}, port {}, ts {}", k.0, k.1, k.2)
    })?;
    Ok(ValidBatch(batch))
}

// A batch's rows all belong to its agent's node, so a row's key within a
// batch is its table's key (`Table::row_key`) without the node. Events and
// processes are not checked: two events may be the same in every column,
// and compaction decides what is a duplicate there.

/// A GPU row's key: a MIG device's rows share their GPU's index and tick
/// and differ in the instance ids.
fn gpu_key(s: &GpuSample) -> (u32, Option<u32>, Option<u32>, i64) {
    (s.gpu, s.gpu_instance_id, s.compute_instance_id, s.ts_us)
}

fn node_key(s: &NodeSample) -> i64 {
    s.ts_us
}

fn ib_key(s: &IbPortSample) -> (&str, u32, i64) {
    (s.device.as_str(), s.port, s.ts_us)
}

/// Tables of up to this many rows in a batch are checked for repeated keys
/// row against row: an agent's tick holds 8 GPUs, a node and a few ports,
/// where comparing each row with the ones before it costs less than hashing
/// every key into a map made for the batch. Larger tables (MIG devices, a
/// spool's replay) are hashed.
const PAIRWISE_MAX_ROWS: usize = 16;

/// Refuses a batch holding two rows of one table with the same key: an
/// agent samples each GPU, node and port once per tick, so a repeated key
/// is a broken or hostile sender, and storing both would count it twice.
/// The error names the first row that repeats a key and the row it repeats.
fn unique_keys<'a, S, K: Hash + Eq>(
    table: Table,
    rows: &'a [S],
    per: &'static str,
    key: impl Fn(&'a S) -> K,
    describe: impl Fn(&K) -> String,
) -> Result<(), ValidationError> {
    let repeated = |first: usize, second: usize, key: &K| ValidationError::DuplicateKey {
        table: table.name(),
        first,
        second,
        key: describe(key),
        per,
    };
    if rows.len() <= PAIRWISE_MAX_ROWS {
        for (second, s) in rows.iter().enumerate().skip(1) {
            let k = key(s);
            if let Some(first) = rows[..second].iter().position(|r| key(r) == k) {
                return Err(repeated(first, second, &k));
            }
        }
        return Ok(());
    }
    let mut seen = HashMap::with_capacity(rows.len());
    for (row, s) in rows.iter().enumerate() {
        match seen.entry(key(s)) {
            Entry::Vacant(v) => {
                v.insert(row);
            }
            Entry::Occupied(o) => return Err(repeated(*o.get(), row, o.key())),
        }
    }
    Ok(())
}

/// Checks each row with its table's declared column checks. The node name
/// was checked with the hello; it stands in as any valid name here.
fn check_rows<S>(
    table: Table,
    rows: &[S],
    now_us: i64,
    check: impl Fn(RowContext, &str, &S) -> Result<(), ColumnError>,
) -> Result<(), ColumnError> {
    rows.iter().enumerate().try_for_each(|(row, s)| {
        let context = RowContext {
            table: table.name(),
            row,
            now_us,
        };
        check(context, "node", s)
    })
}

/// Rows in a batch, all tables together.
pub fn row_count(batch: &Batch) -> usize {
    batch.gpu.len()
        + batch.node.len()
        + batch.ib.len()
        + batch.event.len()
        + batch.gpu_process.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gputel_proto::{EventKind, GpuSample, IbPortSample, NodeSample};

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
                cpu_user_jiffies: Some(12_500),
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

    #[test]
    fn node_names_are_canonical_in_lower_case_without_the_root_dot() {
        for name in ["node-a", "NODE-A", "node-a.", "Node-A."] {
            assert_eq!(canonical_node(name), "node-a", "{name}");
        }
        // Only one dot is the root's; "node-a.." stays distinct (and odd).
        assert_eq!(canonical_node("node-a.."), "node-a.");
        let hello = |node: &str| Hello {
            node: node.into(),
            agent_id: "a".into(),
            ..Hello::default()
        };
        assert_eq!(
            validate_hello(&hello(".")).unwrap_err().to_string(),
            "node name \".\" is invalid: use 1 to 253 characters of [A-Za-z0-9._-]"
        );
        assert!(validate_hello(&hello("NODE-A.")).is_ok());
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
            gpu_instance_id: None,
            compute_instance_id: None,
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
            gpu_instance_id: None,
            compute_instance_id: None,
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
            Err(ValidationError::Column(ColumnError::Timestamp {
                table: "node",
                row: 0,
                ..
            }))
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

    /// Shares, loads, link rates and powers cannot be negative: the refusal
    /// names the row and column, as for any other bad value.
    #[test]
    fn negative_shares_rates_and_loads_are_refused() {
        let mut b = batch();
        b.node.push(NodeSample {
            ts_us: NOW + 1_000_000,
            load5: Some(-0.5),
            ..b.node[0].clone()
        });
        assert_eq!(
            validate_batch(&b, NOW).unwrap_err().to_string(),
            "node row 1: load5 is negative"
        );

        let mut b = batch();
        b.node[0].load15 = Some(-1.0);
        assert_eq!(
            validate_batch(&b, NOW).unwrap_err().to_string(),
            "node row 0: load15 is negative"
        );

        let mut b = batch();
        b.ib[0].rate_gbps = Some(-400.0);
        assert_eq!(
            validate_batch(&b, NOW).unwrap_err().to_string(),
            "ib row 0: rate_gbps is negative"
        );

        let mut b = batch();
        b.gpu[0].tensor_active_pct = Some(-f32::MIN_POSITIVE);
        assert_eq!(
            validate_batch(&b, NOW).unwrap_err().to_string(),
            "gpu row 0: tensor_active_pct is negative"
        );

        // Zero, negative zero included, is a valid share and rate.
        let mut b = batch();
        b.node[0].load1 = Some(-0.0);
        b.ib[0].rate_gbps = Some(0.0);
        assert!(validate_batch(&b, NOW).is_ok());
    }

    /// Two rows of one GPU, node or port at one tick are refused with both
    /// row numbers and the key; MIG devices of one GPU are distinct rows.
    #[test]
    fn a_key_repeated_within_a_batch_is_refused() {
        let mut b = batch();
        let second = GpuSample {
            gpu: 1,
            uuid: "GPU-2".into(),
            ..b.gpu[0].clone()
        };
        b.gpu.push(second);
        b.gpu.push(GpuSample {
            temperature_c: Some(41),
            ..b.gpu[0].clone()
        });
        assert_eq!(
            validate_batch(&b, NOW).unwrap_err().to_string(),
            format!(
                "gpu rows 0 and 2 repeat one key (gpu 0, gpu_instance_id null, compute_instance_id null, ts {NOW}): a batch holds one row per GPU or MIG device and tick"
            )
        );

        // A GPU's row and its two MIG devices' rows share (gpu, ts).
        let mut b = batch();
        let mig = |gi: u32, ci: u32| GpuSample {
            gpu_instance_id: Some(gi),
            compute_instance_id: Some(ci),
            ..b.gpu[0].clone()
        };
        let (mig_a, mig_b) = (mig(1, 0), mig(2, 0));
        b.gpu.extend([mig_a.clone(), mig_b]);
        assert!(validate_batch(&b, NOW).is_ok());
        b.gpu.push(mig_a);
        assert_eq!(
            validate_batch(&b, NOW).unwrap_err().to_string(),
            format!(
                "gpu rows 1 and 3 repeat one key (gpu 0, gpu_instance_id 1, compute_instance_id 0, ts {NOW}): a batch holds one row per GPU or MIG device and tick"
            )
        );

        let mut b = batch();
        b.node.push(NodeSample {
            ts_us: NOW + 1_000_000,
            ..b.node[0].clone()
        });
        assert!(validate_batch(&b, NOW).is_ok());
        b.node.push(b.node[1].clone());
        assert_eq!(
            validate_batch(&b, NOW).unwrap_err().to_string(),
            format!(
                "node rows 1 and 2 repeat one key (ts {}): a batch holds one row per node and tick",
                NOW + 1_000_000
            )
        );

        let mut b = batch();
        let port = |device: &str, port: u32| IbPortSample {
            device: device.into(),
            port,
            ..b.ib[0].clone()
        };
        let ports = [port("mlx5_0", 2), port("mlx5_1", 1), port("mlx5_0", 1)];
        b.ib.extend(ports);
        assert_eq!(
            validate_batch(&b, NOW).unwrap_err(),
            ValidationError::DuplicateKey {
                table: "ib",
                first: 0,
                second: 3,
                key: format!("device mlx5_0, port 1, ts {NOW}"),
                per: "InfiniBand port",
            }
        );
        b.ib.pop();
        assert!(validate_batch(&b, NOW).is_ok());
    }

    #[test]
    fn a_repeated_key_is_found_alike_in_small_and_large_tables() {
        // Tables of up to PAIRWISE_MAX_ROWS rows are compared row against
        // row, larger ones hashed: both name the first row that repeats a
        // key and the earliest row it repeats, and pass distinct keys.
        for rows in [
            2,
            3,
            PAIRWISE_MAX_ROWS - 1,
            PAIRWISE_MAX_ROWS,
            PAIRWISE_MAX_ROWS + 1,
            64,
        ] {
            let mut b = batch();
            b.gpu = (0..rows)
                .map(|i| GpuSample {
                    gpu: (i / 7) as u32,
                    gpu_instance_id: Some((i % 7) as u32),
                    compute_instance_id: Some(0),
                    ..batch().gpu[0].clone()
                })
                .collect();
            assert!(validate_batch(&b, NOW).is_ok(), "{rows} distinct rows");
            // The last row takes the key of the row a third of the way in;
            // so does a row after it, which must not be the one named.
            let repeated = rows / 3;
            let last = rows - 1;
            if repeated == last {
                continue;
            }
            b.gpu[last] = b.gpu[repeated].clone();
            b.gpu.push(b.gpu[repeated].clone());
            match validate_batch(&b, NOW).unwrap_err() {
                ValidationError::DuplicateKey {
                    table,
                    first,
                    second,
                    ..
                } => {
                    assert_eq!(
                        (table, first, second),
                        ("gpu", repeated, last),
                        "{rows} rows"
                    );
                }
                other => panic!("{rows} rows: {other}"),
            }
        }
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
