//! The collector's clock, injected so validation and file naming are testable.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// Wall-clock time in microseconds since the Unix epoch.
#[derive(Debug, Clone, Default)]
pub enum Clock {
    /// The system's real-time clock.
    #[default]
    System,
    /// A clock that tests set by hand.
    Manual(Arc<AtomicI64>),
}

impl Clock {
    pub fn now_us(&self) -> i64 {
        match self {
            Clock::System => chrono::Utc::now().timestamp_micros(),
            Clock::Manual(us) => us.load(Ordering::SeqCst),
        }
    }
}
