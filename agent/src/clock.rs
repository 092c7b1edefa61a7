//! The wall clock, in the protocol's unit.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Wall-clock time in microseconds since the Unix epoch.
pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Microseconds on a monotonic clock, from the first call on: the time
/// between two readings of a counter as they were read, for rates that
/// should not stretch or shrink with how late the agent woke for a tick.
pub fn monotonic_us() -> i64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    i64::try_from(ORIGIN.get_or_init(Instant::now).elapsed().as_micros()).unwrap_or(i64::MAX)
}

/// The first multiple of `interval_us` strictly after `now_us`.
pub fn next_tick(now_us: i64, interval_us: i64) -> i64 {
    (now_us.div_euclid(interval_us) + 1) * interval_us
}

/// Readings taken once per interval at the sampling ticks: at the first
/// tick, then at the first tick at or after each multiple of the interval
/// (wall-clock aligned, so every agent of a fleet takes them at the same
/// ticks).
#[derive(Debug, Clone)]
pub struct Cadence {
    interval_us: i64,
    next_us: i64,
}

impl Cadence {
    /// Every `interval_us` (0 or less: at every tick).
    pub fn new(interval_us: i64) -> Self {
        Self {
            interval_us: interval_us.max(1),
            next_us: i64::MIN,
        }
    }

    /// Whether the tick at `ts_us` takes them; ticks come in increasing time.
    pub fn due(&mut self, ts_us: i64) -> bool {
        let due = ts_us >= self.next_us;
        if due {
            self.next_us = next_tick(ts_us, self.interval_us);
        }
        due
    }
}
