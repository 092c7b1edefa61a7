//! See `gputel_fuzz::job_trace`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gputel_fuzz::job_trace::run(data));
