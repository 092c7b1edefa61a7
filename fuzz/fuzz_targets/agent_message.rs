//! See `gputel_fuzz::agent_message`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gputel_fuzz::agent_message::run(data));
