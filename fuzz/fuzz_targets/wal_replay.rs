//! See `gputel_fuzz::wal_replay`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gputel_fuzz::wal_replay::run(data));
