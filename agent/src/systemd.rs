//! systemd's notification protocol: readiness, status lines, stopping, and a
//! watchdog petted only while the sampling loop makes progress, so that a
//! sampler stuck in a driver call gets the agent restarted.
//!
//! Started by anything but systemd (no `NOTIFY_SOCKET`), every call here does
//! nothing.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sd_notify::NotifyState;
use tracing::{debug, error, info};

/// Tells systemd the agent is up, with a status line for `systemctl status`.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Replaces the status line `systemctl status` shows.
pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

/// Tells systemd the agent is shutting down on purpose.
pub fn stopping(status: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

fn send(states: &[NotifyState]) {
    // A service manager that went away cannot be told anything; the agent's
    // work does not depend on it.
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

/// Whether a loop is working on something or waiting for its next turn, and
/// since when. Waiting is never a stall (an agent may sample once an hour);
/// working for longer than the watchdog timeout is.
#[derive(Debug, Default)]
pub struct Progress {
    /// Microseconds since [`base`] plus one when the current work began; 0
    /// while waiting.
    busy_since: AtomicU64,
}

impl Progress {
    /// A loop that is waiting.
    pub fn new() -> Self {
        Self::default()
    }

    /// The loop starts a piece of work (a tick).
    pub fn busy(&self) {
        self.busy_since.store(monotonic_us() + 1, Ordering::Relaxed);
    }

    /// The loop is waiting for its next piece of work.
    pub fn idle(&self) {
        self.busy_since.store(0, Ordering::Relaxed);
    }

    /// How long the current piece of work has taken; `None` while waiting.
    pub fn busy_for(&self) -> Option<Duration> {
        match self.busy_since.load(Ordering::Relaxed) {
            0 => None,
            since => Some(Duration::from_micros(
                monotonic_us().saturating_sub(since - 1),
            )),
        }
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

/// Pets the watchdog every half `timeout` while the sampling loop is waiting
/// or has been on its current tick for less than `timeout`; never returns.
///
/// Runs on the network side's runtime, so a runtime that stops running tasks
/// stops the pets too. Once the pets stop, systemd kills and restarts the
/// agent between 1.5 and 2 timeouts after the tick began.
pub async fn pet_watchdog(sampling: &Progress, timeout: Duration) {
    let mut every = tokio::time::interval(timeout / 2);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stalled = false;
    loop {
        every.tick().await;
        match sampling.busy_for() {
            Some(busy) if busy >= timeout => {
                if !stalled {
                    error!(
                        busy_s = busy.as_secs_f64(),
                        "the sampling loop has been stuck on one tick for {busy:.1?} \
                         (a driver call that does not return?); the systemd watchdog is \
                         no longer petted, so systemd restarts the agent"
                    );
                    stalled = true;
                }
            }
            _ => {
                if stalled {
                    info!("the sampling loop made progress again; petting the watchdog");
                    stalled = false;
                }
                send(&[NotifyState::Watchdog]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_loop_is_never_busy_and_a_working_one_counts_from_its_start() {
        let progress = Progress::new();
        assert_eq!(progress.busy_for(), None);
        progress.busy();
        let first = progress.busy_for().expect("busy");
        std::thread::sleep(Duration::from_millis(5));
        let later = progress.busy_for().expect("still busy");
        assert!(
            later >= first + Duration::from_millis(5),
            "{first:?} {later:?}"
        );
        progress.idle();
        assert_eq!(progress.busy_for(), None);
    }
}
