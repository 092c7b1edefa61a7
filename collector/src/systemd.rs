//! systemd's notification protocol: readiness once the write-ahead log is
//! replayed and the port is bound, status lines, stopping, and a watchdog
//! petted only while the collector's loops make progress, so that a collector
//! wedged on a hung disk or store gets restarted.
//!
//! Started by anything but systemd (no `NOTIFY_SOCKET`), every call here does
//! nothing.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sd_notify::NotifyState;
use tracing::{debug, error, info};

use crate::Serving;

/// Tells systemd the collector is up, with a status line for `systemctl status`.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Tells systemd the collector is shutting down on purpose.
pub fn stopping(status: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

fn send(states: &[NotifyState]) {
    // A service manager that went away cannot be told anything; the
    // collector's work does not depend on it.
    if let Err(e) = sd_notify::notify(states) {
        debug!(error = %e, "cannot notify systemd");
    }
}

/// The watchdog timeout systemd set for this process (`WatchdogSec=`), if
/// any; none without a socket to pet it through.
pub fn watchdog_timeout() -> Option<Duration> {
    std::env::var_os("NOTIFY_SOCKET")?;
    sd_notify::watchdog_enabled().filter(|t| !t.is_zero())
}

/// When a loop last completed a turn, on a monotonic clock (the collector's
/// injected clock may be a test's fake one).
#[derive(Debug)]
pub struct Heartbeat {
    /// Microseconds since [`base`].
    last_us: AtomicU64,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Self::new()
    }
}

impl Heartbeat {
    /// A heartbeat that beat now.
    pub fn new() -> Self {
        Self {
            last_us: AtomicU64::new(monotonic_us()),
        }
    }

    /// The loop completed a turn.
    pub fn beat(&self) {
        self.last_us.store(monotonic_us(), Ordering::Relaxed);
    }

    /// Time since the last beat.
    pub fn age(&self) -> Duration {
        Duration::from_micros(monotonic_us().saturating_sub(self.last_us.load(Ordering::Relaxed)))
    }
}

/// The instant monotonic times here count from.
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn monotonic_us() -> u64 {
    u64::try_from(base().elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// Pets systemd's watchdog every half timeout while the collector is
/// healthy; without a watchdog, never completes and does nothing.
///
/// Healthy means: this task runs (the runtime schedules tasks), the gRPC
/// server task is still running, the state every stream and the flush loop
/// share can be locked within half a timeout (a log write hung in the kernel
/// holds it), and the flush loop took the buffer within one flush interval
/// plus a timeout (a store request that never returns stops it). A store
/// that fails is not a reason to restart: the flush loop retries it and keeps
/// beating.
pub async fn watchdog(serving: &Serving, flush_interval: Duration) {
    let Some(timeout) = watchdog_timeout() else {
        return std::future::pending().await;
    };
    info!(
        ?timeout,
        "petting the systemd watchdog while the collector makes progress"
    );
    let mut every = tokio::time::interval(timeout / 2);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut lock_probe: Option<tokio::task::JoinHandle<()>> = None;
    let mut failing: Option<String> = None;
    loop {
        every.tick().await;
        let mut problem = None;
        if !serving.is_serving() {
            problem = Some("the gRPC server task has ended".to_owned());
        }
        // The previous probe had half a timeout to take the lock.
        match &lock_probe {
            Some(probe) if !probe.is_finished() => {
                problem = Some(format!(
                    "the shared ingest state has stayed locked for over {:.1?} \
                     (a write-ahead log write that does not return?)",
                    timeout / 2
                ));
            }
            _ => {
                let shared = Arc::clone(serving.shared());
                lock_probe = Some(tokio::task::spawn_blocking(move || {
                    shared.buffered_rows();
                }));
            }
        }
        let since_flush = serving.shared().taken.age();
        if since_flush > flush_interval + timeout {
            problem = Some(format!(
                "the flush loop has not taken the buffer for {since_flush:.1?} \
                 (flush interval {flush_interval:?}; a store write that does not return?)"
            ));
        }
        match problem {
            Some(problem) => {
                if failing.as_ref() != Some(&problem) {
                    error!(
                        "{problem}; the systemd watchdog is no longer petted, so systemd restarts the collector"
                    );
                    failing = Some(problem);
                }
            }
            None => {
                if failing.take().is_some() {
                    info!("the collector made progress again; petting the watchdog");
                }
                send(&[NotifyState::Watchdog]);
            }
        }
    }
}
