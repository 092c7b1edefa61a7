//! `Census::decoded_bytes_bound` holds for what prost really allocates:
//! every allocation made while decoding is counted (with malloc's overhead
//! per allocation) by a counting global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use gputel_proto::v1::{Batch, agent_message};
use gputel_proto::wire::census;
use gputel_proto::{AgentMessage, GpuEvent, GpuProcess, GpuSample, IbPortSample, NodeSample};
use prost::Message;

/// What glibc's malloc adds to a request at most (see `wire.rs`).
const OVERHEAD: u64 = 32;

struct Counting;

static LIVE: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size() as u64 + OVERHEAD, Ordering::SeqCst)
            + layout.size() as u64
            + OVERHEAD;
        PEAK.fetch_max(live, Ordering::SeqCst);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as u64 + OVERHEAD, Ordering::SeqCst);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Peak memory decoding `encoded` takes, the encoded bytes included, and the
/// census's bound for it.
fn decode_peak_and_bound(encoded: &[u8]) -> (u64, u64) {
    let bound = census(encoded).expect("census").decoded_bytes_bound();
    let before = LIVE.load(Ordering::SeqCst);
    PEAK.store(before, Ordering::SeqCst);
    let decoded = AgentMessage::decode(encoded).expect("decode");
    let peak = PEAK.load(Ordering::SeqCst) - before;
    drop(decoded);
    (peak + encoded.len() as u64, bound)
}

/// One test, so that nothing else allocates while a message is decoded.
#[test]
fn the_bound_holds() {
    empty_rows();
    one_byte_strings_everywhere();
    a_realistic_tick_and_a_batch_sent_twice_in_one_message();
    a_real_h200_agents_batches();
}

fn batch(batch: Batch) -> Vec<u8> {
    AgentMessage {
        kind: Some(agent_message::Kind::Batch(batch)),
    }
    .encode_to_vec()
}

fn assert_bounded(name: &str, encoded: &[u8]) {
    let (peak, bound) = decode_peak_and_bound(encoded);
    assert!(
        peak <= bound,
        "{name}: decoding {} bytes took {peak} bytes, above the bound {bound}",
        encoded.len()
    );
    // The bound is not so loose as to refuse ordinary batches.
    assert!(
        bound <= 4 * peak + 4096,
        "{name}: bound {bound} is far above the {peak} bytes decoding took"
    );
}

fn empty_rows() {
    for n in [1, 7, 1000, 100_000] {
        assert_bounded(
            "empty gpu rows",
            &batch(Batch {
                seq: 1,
                gpu: vec![GpuSample::default(); n],
                ..Default::default()
            }),
        );
        assert_bounded(
            "empty rows of every table",
            &batch(Batch {
                seq: 1,
                node: vec![NodeSample::default(); n],
                ib: vec![IbPortSample::default(); n],
                event: vec![GpuEvent::default(); n],
                gpu_process: vec![GpuProcess::default(); n],
                ..Default::default()
            }),
        );
    }
}

fn one_byte_strings_everywhere() {
    let s = || Some("x".to_owned());
    let gpu = GpuSample {
        uuid: "x".into(),
        model: "x".into(),
        job_id: s(),
        pod_uid: s(),
        pci_bus_id: s(),
        mig_profile: s(),
        mig_uuid: s(),
        ..Default::default()
    };
    let node = NodeSample {
        jobs: vec!["x".into(); 50],
        ..Default::default()
    };
    assert_bounded(
        "one-byte strings",
        &batch(Batch {
            seq: 9,
            gpu: vec![gpu; 20_000],
            node: vec![node; 2_000],
            ..Default::default()
        }),
    );
}

fn a_realistic_tick_and_a_batch_sent_twice_in_one_message() {
    let gpu = |i: u32| GpuSample {
        ts_us: 1_700_000_000_000_000,
        gpu: i,
        uuid: format!("GPU-{i:08x}-1111-2222-3333-444455556666"),
        model: "NVIDIA H100 80GB HBM3".into(),
        power_mw: Some(412_500),
        fb_used_bytes: Some(70_000_000_000),
        job_id: Some("123456".into()),
        ..Default::default()
    };
    let tick = Batch {
        seq: 3,
        gpu: (0..8).map(gpu).collect(),
        node: vec![NodeSample {
            ts_us: 1_700_000_000_000_000,
            jobs: vec!["123456".into()],
            ..Default::default()
        }],
        ..Default::default()
    };
    let once = batch(tick);
    assert_bounded("a tick of 8 GPUs", &once);
    // prost merges a batch field seen twice: both copies' rows are decoded.
    let twice = [once.clone(), once].concat();
    assert_eq!(census(&twice).expect("census").gpu, 16);
    assert_bounded("a batch field twice", &twice);
}

/// The batches a real agent sent on an H200 (its spool, recorded on the
/// lent machine: tests/fixtures/README.md, `h200-recording/agent-spool/`),
/// each in the message that carried it, byte for byte: the census counts the rows prost
/// decodes, and the bound holds.
fn a_real_h200_agents_batches() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/h200-recording/agent-spool/spool-00000000000000000001.log"
    );
    let spool = std::fs::read(path).expect("the recorded spool");
    let mut rest = spool.as_slice();
    let mut batches = 0;
    while !rest.is_empty() {
        let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        let payload = &rest[12..12 + len];
        rest = &rest[12 + len..];
        let decoded = Batch::decode(payload).expect("a recorded batch decodes");
        // The message as the agent sent it: the recorded batch as field 2.
        let mut message = vec![0x12];
        prost::encoding::encode_varint(len as u64, &mut message);
        message.extend_from_slice(payload);
        let counted = census(&message).expect("census");
        assert_eq!(counted.gpu, decoded.gpu.len() as u64);
        assert_eq!(counted.node, decoded.node.len() as u64);
        assert_eq!((decoded.gpu.len(), decoded.node.len()), (1, 1));
        assert_eq!(
            decoded.seq,
            batches + 1,
            "sequence numbers from 1, in order"
        );
        assert_bounded(&format!("recorded batch {}", decoded.seq), &message);
        batches += 1;
    }
    assert_eq!(batches, 100);
}
