//! The agent under systemd: readiness and status lines come from
//! `gputel_runtime::notify`; the watchdog is petted only while the sampling
//! loop makes progress, so that a sampler stuck in a driver call gets the
//! agent restarted.

use std::time::Duration;

pub use gputel_runtime::notify::{Progress, ready, status, stopping, watchdog_timeout};

/// Pets the watchdog every half `timeout` while the sampling loop is waiting
/// or has been on its current tick for less than `timeout`; never returns.
///
/// Runs on the network side's runtime, so a runtime that stops running tasks
/// stops the pets too. Once the pets stop, systemd kills and restarts the
/// agent between 1.5 and 2 timeouts after the tick began.
pub async fn pet_watchdog(sampling: &Progress, timeout: Duration) {
    gputel_runtime::notify::pet_while_healthy(timeout, "agent", || {
        // The same words for the whole stall, so it is logged once.
        sampling
            .busy_for()
            .filter(|busy| *busy >= timeout)
            .map(|_| {
                format!(
                    "the sampling loop has been stuck on one tick for over {timeout:.1?} \
                 (a driver call that does not return?)"
                )
            })
    })
    .await;
}
