//! The agent's start-up read of its spool, over whatever a power cut or a full
//! disk left there: an agent id file, an acknowledged position and segments
//! with any bytes and any first sequence numbers. Opening fails with an error
//! or yields a spool whose sequence numbers move forward, past what was
//! acknowledged; it never panics.
#![no_main]

use arbitrary::Arbitrary;
use gputel_agent::spool::Spool;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct SpoolDir {
    agent_id: Option<Vec<u8>>,
    acked: Option<Vec<u8>>,
    segments: Vec<(u64, Vec<u8>)>,
}

fuzz_target!(|dir: SpoolDir| {
    let tmp = tempfile::tempdir_in(gputel_fuzz::scratch_dir()).expect("a scratch directory");
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
});
