//! Rate-limited logging of a failure that repeats: one line per distinct
//! cause per interval, with how often it happened meanwhile, so a loop that
//! retries every few seconds for an hour logs tens of lines, not thousands.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Distinct causes remembered at most; beyond it the oldest is forgotten
/// (and logged again at its next occurrence).
const MAX_CAUSES: usize = 16;

/// Decides which occurrences of a repeated failure are logged.
#[derive(Debug)]
pub struct LogThrottle {
    interval: Duration,
    causes: HashMap<String, Seen>,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    logged_at: Instant,
    /// Occurrences since the last line.
    unlogged: u64,
}

impl LogThrottle {
    /// Logs each cause at most once per `interval`.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            causes: HashMap::new(),
        }
    }

    /// Counts one occurrence of `cause` at `now`. Returns how many earlier
    /// occurrences went unlogged when this one is to be logged, None when it
    /// is to be counted only.
    pub fn occurred(&mut self, cause: &str, now: Instant) -> Option<u64> {
        if let Some(seen) = self.causes.get_mut(cause) {
            if now.saturating_duration_since(seen.logged_at) < self.interval {
                seen.unlogged += 1;
                return None;
            }
            let unlogged = seen.unlogged;
            *seen = Seen {
                logged_at: now,
                unlogged: 0,
            };
            return Some(unlogged);
        }
        if self.causes.len() >= MAX_CAUSES
            && let Some(oldest) = self
                .causes
                .iter()
                .min_by_key(|(_, seen)| seen.logged_at)
                .map(|(cause, _)| cause.clone())
        {
            self.causes.remove(&oldest);
        }
        self.causes.insert(
            cause.to_owned(),
            Seen {
                logged_at: now,
                unlogged: 0,
            },
        );
        Some(0)
    }

    /// The failure is over: forgets every cause and returns how many
    /// occurrences were not logged.
    pub fn recovered(&mut self) -> u64 {
        self.causes.drain().map(|(_, seen)| seen.unlogged).sum()
    }
}

/// The innermost cause of an error (what an operator can act on, such as
/// "No space left on device"), the same whichever file it happened to.
pub fn root_cause(e: &dyn std::error::Error) -> String {
    let mut cause = e;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_cause_per_interval_with_the_count_in_between() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut throttle = LogThrottle::new(Duration::from_secs(60));
        // A retry every 5 s for two minutes: three lines, at 0, 60 and 120 s,
        // the later two saying 11 retries went unlogged before them.
        let logged: Vec<(u64, u64)> = (0..=24)
            .filter_map(|i| {
                throttle
                    .occurred("disk full", at(i * 5))
                    .map(|n| (i * 5, n))
            })
            .collect();
        assert_eq!(logged, [(0, 0), (60, 11), (120, 11)]);
        // Another cause is logged at once, and counted on its own.
        assert_eq!(throttle.occurred("permission denied", at(121)), Some(0));
        assert_eq!(throttle.occurred("disk full", at(125)), None);
        assert_eq!(throttle.occurred("permission denied", at(126)), None);
        assert_eq!(throttle.recovered(), 2);
        // After a recovery the next failure is news again.
        assert_eq!(throttle.occurred("disk full", at(130)), Some(0));
    }

    #[test]
    fn causes_are_bounded() {
        let start = Instant::now();
        let mut throttle = LogThrottle::new(Duration::from_secs(60));
        for i in 0..100u64 {
            let now = start + Duration::from_millis(i);
            assert_eq!(throttle.occurred(&format!("cause {i}"), now), Some(0));
        }
        assert_eq!(throttle.causes.len(), MAX_CAUSES);
        // The newest are remembered, the oldest were forgotten.
        assert_eq!(throttle.occurred("cause 99", start), None);
        assert_eq!(throttle.occurred("cause 0", start), Some(0));
    }

    #[test]
    fn the_root_cause_is_the_innermost_error() {
        #[derive(Debug, thiserror::Error)]
        #[error("writing /store/gpu/x.parquet: {0}")]
        struct Outer(#[source] std::io::Error);
        let e = Outer(std::io::Error::from_raw_os_error(28));
        assert_eq!(root_cause(&e), "No space left on device (os error 28)");
    }
}
