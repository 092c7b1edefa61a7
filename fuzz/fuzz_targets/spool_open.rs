//! See `gputel_fuzz::spool_open`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gputel_fuzz::spool_open::run(data));
