//! The wall clock, in the protocol's unit.

use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock time in microseconds since the Unix epoch.
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// The first multiple of `interval_us` strictly after `now_us`.
pub fn next_tick(now_us: i64, interval_us: i64) -> i64 {
    (now_us.div_euclid(interval_us) + 1) * interval_us
}
