//! See `gputel_fuzz::sysfs_ib`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| gputel_fuzz::sysfs_ib::run(data));
