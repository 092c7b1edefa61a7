//! The agent's start-up read of its spool, over whatever a power cut or a full
//! disk left there: an agent id file and segments with any bytes and any first
//! sequence numbers. Opening fails with an error or yields a spool whose
//! sequence numbers move forward; it never panics.
#![no_main]

use arbitrary::Arbitrary;
use gputel_agent::spool::Spool;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct SpoolDir {
    agent_id: Option<Vec<u8>>,
    segments: Vec<(u64, Vec<u8>)>,
}

fuzz_target!(|dir: SpoolDir| {
    let tmp = tempfile::tempdir_in(gputel_fuzz::scratch_dir()).expect("a scratch directory");
    if let Some(id) = &dir.agent_id {
        std::fs::write(tmp.path().join("agent.id"), id).expect("write agent.id");
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
    }
});
