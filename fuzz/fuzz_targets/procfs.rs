//! See `gputel_fuzz::procfs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gputel_fuzz::procfs::run(data));
