//! `import-jobs` on an arbitrary file in either format: parsing fails only on
//! a bad header, skips bad lines with their numbers, and never panics.
#![no_main]

use chrono::FixedOffset;
use gputel_collector::import::{Format, Trace};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (bool, i16, &[u8])| {
    let (acme, offset_minutes, bytes) = input;
    let format = if acme { Format::Acme } else { Format::Sacct };
    let Some(offset) = FixedOffset::east_opt(i32::from(offset_minutes % 1440) * 60) else {
        return;
    };
    if let Ok(trace) = Trace::parse(format, bytes, offset) {
        assert!(trace.jobs.len() <= trace.records);
        assert!(trace.skipped.iter().all(|s| s.line >= 1));
    }
});
