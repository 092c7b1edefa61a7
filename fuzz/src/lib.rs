//! The fuzz targets' bodies, one module each, taking the fuzzer's bytes:
//! `fuzz_targets/` hands them libFuzzer's inputs, and the main workspace's
//! test suite replays the committed corpora through the same functions
//! (`tests/tests/fuzz_corpora.rs`), so every CI run checks them without
//! building the instrumented targets. Only crates the test suite also has
//! are used here (no libfuzzer-sys).

use std::path::{Path, PathBuf};

/// Where targets that write files make their scratch directories: tmpfs when
/// there is one, since the log and the spool fsync and the fuzzer runs them
/// many thousand times.
pub fn scratch_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_owned()
    } else {
        std::env::temp_dir()
    }
}

/// What the collector does with one message of an agent's stream, up to the
/// Arrow rows it buffers: decode, validate, append, build the record batches.
/// Whatever the bytes, nothing panics, and every batch that passes validation
/// builds its Arrow rows. The collector's census of the bytes (which bounds
/// the memory decoding takes) never counts fewer rows than prost decodes.
pub mod agent_message {
    use gputel_collector::buffer::WriteBuffer;
    use gputel_collector::validate::{validate_batch, validate_hello};
    use gputel_proto::AgentMessage;
    use gputel_proto::agent_message::Kind;
    use gputel_proto::wire::census;
    use prost::Message;

    /// 2026-11-21T00:00:00Z: the collector's clock, fixed so that runs repeat.
    const NOW_US: i64 = 1_795_219_200_000_000;

    pub fn run(data: &[u8]) {
        let census = census(data);
        let Ok(message) = AgentMessage::decode(data) else {
            return;
        };
        if let (Ok(census), Some(Kind::Batch(batch))) = (&census, &message.kind) {
            let decoded = [
                batch.gpu.len(),
                batch.node.len(),
                batch.ib.len(),
                batch.event.len(),
                batch.gpu_process.len(),
            ];
            let counted = [
                census.gpu,
                census.node,
                census.ib,
                census.event,
                census.gpu_process,
            ];
            for (decoded, counted) in decoded.into_iter().zip(counted) {
                assert!(
                    counted >= decoded as u64,
                    "census {counted} < decoded {decoded}"
                );
            }
            let strings: usize = batch.node.iter().map(|n| n.jobs.len()).sum();
            assert!(census.list_strings >= strings as u64);
        }
        match message.kind {
            Some(Kind::Hello(hello)) => {
                let _ = validate_hello(&hello);
            }
            Some(Kind::Batch(batch)) => {
                let Ok(valid) = validate_batch(&batch, NOW_US) else {
                    return;
                };
                let mut buffer = WriteBuffer::default();
                buffer.append("node-1", valid);
                let buffered = buffer.rows();
                let taken = buffer
                    .take_batches()
                    .expect("every validated row converts to Arrow");
                let built: usize = taken.iter().map(|(_, _, b)| b.num_rows()).sum();
                assert!(built >= buffered, "{buffered} rows buffered, {built} built");
            }
            None => {}
        }
    }
}

/// `import-jobs` on an arbitrary file in either format: parsing fails only on
/// a bad header, skips bad lines with their numbers, and never panics.
pub mod job_trace {
    use arbitrary::{Arbitrary, Unstructured};
    use chrono::FixedOffset;
    use gputel_collector::import::{Format, Trace};

    /// The bytes read as libFuzzer's typed targets read them.
    pub fn run(data: &[u8]) {
        let Ok(input) = <(bool, i16, &[u8])>::arbitrary_take_rest(Unstructured::new(data)) else {
            return;
        };
        let (acme, offset_minutes, bytes) = input;
        let format = if acme { Format::Acme } else { Format::Sacct };
        let Some(offset) = FixedOffset::east_opt(i32::from(offset_minutes % 1440) * 60) else {
            return;
        };
        if let Ok(trace) = Trace::parse(format, bytes, offset) {
            assert!(trace.jobs.len() <= trace.records);
            assert!(trace.skipped.iter().all(|s| s.line >= 1));
        }
    }
}

/// The host sampler's reads of /proc (stat, meminfo, loadavg, twice, so CPU
/// shares are computed) and job attribution's parsers for /proc/PID/cgroup and
/// /proc/PID/environ, over arbitrary file contents: truncated, binary, huge
/// numbers. Nothing panics, and what is reported stays within its range.
pub mod procfs {
    use arbitrary::{Arbitrary, Unstructured};
    use gputel_agent::jobs::{owner_from_cgroup, slurm_job_from_environ};
    use gputel_agent::sampler::node::NodeSampler;
    use gputel_agent::sampler::{Sampler, Tick};

    #[derive(Debug, Arbitrary)]
    struct Proc {
        stat: [Vec<u8>; 2],
        meminfo: Vec<u8>,
        loadavg: Vec<u8>,
        cgroup: String,
        environ: Vec<u8>,
    }
    /// The bytes read as libFuzzer's typed targets read them.
    pub fn run(data: &[u8]) {
        let Ok(input) = <Proc>::arbitrary_take_rest(Unstructured::new(data)) else {
            return;
        };
        let root = tempfile::tempdir_in(super::scratch_dir()).expect("a scratch directory");
        let write = |name: &str, bytes: &[u8]| {
            std::fs::write(root.path().join(name), bytes).expect("write a proc file");
        };
        write("meminfo", &input.meminfo);
        write("loadavg", &input.loadavg);
        let mut sampler = NodeSampler::new(root.path());
        for (n, stat) in input.stat.iter().enumerate() {
            write("stat", stat);
            let mut tick = Tick::new(n as i64 * 1_000_000);
            sampler.sample(&mut tick);
            let [sample] = tick.batch.node.as_slice() else {
                panic!("one node row per tick, got {}", tick.batch.node.len());
            };
            // A `stat` that parsed gives all five CPU counters, else none.
            let counters = [
                sample.cpu_user_jiffies,
                sample.cpu_system_jiffies,
                sample.cpu_iowait_jiffies,
                sample.cpu_idle_jiffies,
                sample.cpu_steal_jiffies,
            ];
            let present = counters.iter().filter(|c| c.is_some()).count();
            assert!(present == 0 || present == 5, "{counters:?}");
        }
        let _ = owner_from_cgroup(&input.cgroup);
        if let Some(job) = slurm_job_from_environ(&input.environ) {
            assert!(!job.is_empty());
        }
    }
}

/// The agent's start-up read of its spool, over whatever a power cut or a full
/// disk left there: an agent id file, an acknowledged position and segments
/// with any bytes and any first sequence numbers. Opening fails with an error
/// or yields a spool whose sequence numbers move forward, past what was
/// acknowledged; it never panics.
pub mod spool_open {
    use arbitrary::{Arbitrary, Unstructured};
    use gputel_agent::spool::Spool;

    #[derive(Debug, Arbitrary)]
    struct SpoolDir {
        agent_id: Option<Vec<u8>>,
        acked: Option<Vec<u8>>,
        segments: Vec<(u64, Vec<u8>)>,
    }

    /// The bytes read as libFuzzer's typed targets read them.
    pub fn run(data: &[u8]) {
        let Ok(dir) = <SpoolDir>::arbitrary_take_rest(Unstructured::new(data)) else {
            return;
        };
        let tmp = tempfile::tempdir_in(super::scratch_dir()).expect("a scratch directory");
        if let Some(id) = &dir.agent_id {
            std::fs::write(tmp.path().join("agent.id"), id).expect("write agent.id");
        }
        if let Some(acked) = &dir.acked {
            std::fs::write(tmp.path().join("acked"), acked).expect("write acked");
        }
        for (first_seq, bytes) in dir.segments.iter().take(4) {
            let name = format!("spool-{first_seq:020}.log");
            std::fs::write(tmp.path().join(name), bytes).expect("write a segment");
        }
        if let Ok(spool) = Spool::open(tmp.path(), 1 << 20) {
            assert!(!spool.agent_id().is_empty());
            if let Some(first) = spool.first_seq() {
                assert!(first <= spool.next_seq());
            }
            let acked = dir
                .acked
                .as_deref()
                .and_then(|a| std::str::from_utf8(a).ok())
                .and_then(|a| a.trim().parse::<u64>().ok())
                .filter(|&a| a < u64::MAX);
            if let Some(acked) = acked {
                assert!(spool.next_seq() > acked);
            }
        }
    }
}

/// The InfiniBand sampler over one port's sysfs files with arbitrary contents,
/// read twice so that rates are computed: state, rate, the legacy and 64-bit
/// traffic counters, the error counters and mlx5 hw_counters. Nothing panics,
/// and no rate comes out negative or not finite.
pub mod sysfs_ib {
    use arbitrary::{Arbitrary, Unstructured};
    use gputel_agent::sampler::ib::IbSampler;
    use gputel_agent::sampler::{Sampler, Tick};

    /// Files under ports/1/, in the order a tick's contents fill them.
    const FILES: [&str; 22] = [
        "state",
        "rate",
        "counters/port_xmit_data",
        "counters/port_rcv_data",
        "counters/port_xmit_packets",
        "counters/port_rcv_packets",
        "counters_ext/port_xmit_data_64",
        "counters_ext/port_rcv_data_64",
        "counters_ext/port_xmit_packets_64",
        "counters_ext/port_rcv_packets_64",
        "counters/symbol_error",
        "counters/link_downed",
        "counters/link_error_recovery",
        "counters/port_rcv_errors",
        "counters/port_xmit_discards",
        "counters/port_xmit_wait",
        "hw_counters/out_of_buffer",
        "hw_counters/out_of_sequence",
        "hw_counters/packet_seq_err",
        "hw_counters/local_ack_timeout_err",
        "hw_counters/rnr_nak_retry_err",
        "hw_counters/implied_nak_seq_err",
    ];

    #[derive(Debug, Arbitrary)]
    struct Port {
        /// Per tick, the files' contents; None leaves a file absent.
        ticks: [[Option<Vec<u8>>; FILES.len()]; 2],
        /// Microseconds between the two ticks, zero and negative included.
        step_us: i64,
    }
    /// The bytes read as libFuzzer's typed targets read them.
    pub fn run(data: &[u8]) {
        let Ok(port) = <Port>::arbitrary_take_rest(Unstructured::new(data)) else {
            return;
        };
        let root = tempfile::tempdir_in(super::scratch_dir()).expect("a scratch directory");
        let dir = root.path().join("class/infiniband/mlx5_0/ports/1");
        for sub in ["counters", "counters_ext", "hw_counters"] {
            std::fs::create_dir_all(dir.join(sub)).expect("create the port tree");
        }
        let mut sampler = IbSampler::new(root.path());
        let mut ts_us = 1_795_219_200_000_000_i64;
        for files in &port.ticks {
            for (name, contents) in FILES.iter().zip(files) {
                let path = dir.join(name);
                match contents {
                    Some(bytes) => std::fs::write(&path, bytes).expect("write a counter"),
                    None => {
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
            let mut tick = Tick::new(ts_us);
            sampler.sample(&mut tick);
            for sample in &tick.batch.ib {
                // The data counters count 4-byte words; the rows hold bytes.
                for bytes in [sample.xmit_bytes, sample.rcv_bytes].into_iter().flatten() {
                    assert_eq!(bytes % 4, 0, "{bytes} bytes");
                }
            }
            ts_us = ts_us.wrapping_add(port.step_us);
        }
    }
}

/// The collector's start-up replay of its write-ahead log, over whatever a
/// crash, a full disk or a hostile hand left in the WAL directory: a state
/// file and segments with any bytes and any segment numbers. Opening either
/// fails with an error or replays; it never panics.
pub mod wal_replay {
    use arbitrary::{Arbitrary, Unstructured};
    use gputel_collector::wal::Wal;

    #[derive(Debug, Arbitrary)]
    struct WalDir {
        state: Option<Vec<u8>>,
        segments: Vec<(u64, Vec<u8>)>,
    }
    /// The bytes read as libFuzzer's typed targets read them.
    pub fn run(data: &[u8]) {
        let Ok(dir) = <WalDir>::arbitrary_take_rest(Unstructured::new(data)) else {
            return;
        };
        let tmp = tempfile::tempdir_in(super::scratch_dir()).expect("a scratch directory");
        if let Some(state) = &dir.state {
            std::fs::write(tmp.path().join("state.pb"), state).expect("write state.pb");
        }
        for (segment, bytes) in dir.segments.iter().take(4) {
            let name = format!("wal-{segment:016}.log");
            std::fs::write(tmp.path().join(name), bytes).expect("write a segment");
        }
        if let Ok((wal, replayed)) = Wal::open(tmp.path()) {
            // A replayed log names a segment beyond everything it replayed.
            assert!(replayed.segments.iter().all(|s| *s < wal.segment()));
        }
    }
}
