//! systemd's notification protocol: readiness, status lines, stopping, and a
//! watchdog petted only while the program's own health check passes, so that
//! a program stuck in a driver call, a hung disk or a store request that
//! never returns gets restarted.
//!
//! Started by anything but systemd (no `NOTIFY_SOCKET`), every call here does
//! nothing.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sd_notify::NotifyState;
use tracing::{debug, error, info};

/// Tells systemd the program is up, with a status line for `systemctl status`.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// Replaces the status line `systemctl status` shows.
pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

/// Tells systemd the program is shutting down on purpose.
pub fn stopping(status: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

fn send(states: &[NotifyState]) {
    // A service manager that went away cannot be told anything; the
    // program's work does not depend on it.
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

/// Pets the watchdog every half `timeout` while `problem` finds none; never
/// returns. A problem is logged once when it appears, with what follows from
/// it, and once when it clears; `program` names the program in those lines.
///
/// Runs as a task, so a runtime that stops running tasks stops the pets too.
pub async fn pet_while_healthy(
    timeout: Duration,
    program: &str,
    mut problem: impl FnMut() -> Option<String>,
) {
    let mut every = tokio::time::interval(timeout / 2);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing: Option<String> = None;
    loop {
        every.tick().await;
        match problem() {
            Some(problem) => {
                if failing.as_ref() != Some(&problem) {
                    error!(
                        "{problem}; the systemd watchdog is no longer petted, so systemd restarts the {program}"
                    );
                    failing = Some(problem);
                }
            }
            None => {
                if failing.take().is_some() {
                    info!("the {program} made progress again; petting the watchdog");
                }
                send(&[NotifyState::Watchdog]);
            }
        }
    }
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

/// When a loop last completed a turn, on a monotonic clock (a program's
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

    #[test]
    fn a_heartbeat_ages_until_it_beats() {
        let beat = Heartbeat::new();
        std::thread::sleep(Duration::from_millis(5));
        assert!(beat.age() >= Duration::from_millis(5));
        beat.beat();
        assert!(beat.age() < Duration::from_millis(5));
    }
}
