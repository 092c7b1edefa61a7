//! The InfiniBand sampler over one port's sysfs files with arbitrary contents,
//! read twice so that rates are computed: state, rate, the legacy and 64-bit
//! traffic counters, the error counters and mlx5 hw_counters. Nothing panics,
//! and no rate comes out negative or not finite.
#![no_main]

use arbitrary::Arbitrary;
use gputel_agent::sampler::ib::IbSampler;
use gputel_agent::sampler::{Sampler, Tick};
use libfuzzer_sys::fuzz_target;

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

fuzz_target!(|port: Port| {
    let root = tempfile::tempdir_in(gputel_fuzz::scratch_dir()).expect("a scratch directory");
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
            for rate in [
                sample.xmit_bytes_per_s,
                sample.rcv_bytes_per_s,
                sample.xmit_packets_per_s,
                sample.rcv_packets_per_s,
            ]
            .into_iter()
            .flatten()
            {
                assert!(rate.is_finite() && rate >= 0.0, "rate {rate}");
            }
        }
        ts_us = ts_us.wrapping_add(port.step_us);
    }
});
