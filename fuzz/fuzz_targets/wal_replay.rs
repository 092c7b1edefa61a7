//! The collector's start-up replay of its write-ahead log, over whatever a
//! crash, a full disk or a hostile hand left in the WAL directory: a state
//! file and segments with any bytes and any segment numbers. Opening either
//! fails with an error or replays; it never panics.
#![no_main]

use arbitrary::Arbitrary;
use gputel_collector::wal::Wal;
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
struct WalDir {
    state: Option<Vec<u8>>,
    segments: Vec<(u64, Vec<u8>)>,
}

fuzz_target!(|dir: WalDir| {
    let tmp = tempfile::tempdir_in(gputel_fuzz::scratch_dir()).expect("a scratch directory");
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
});
