//! The collector under systemd: readiness (once the write-ahead log is
//! replayed and the port is bound), status lines and stopping come from
//! `gputel_runtime::notify`; the watchdog is petted only while the
//! collector's loops make progress, so that a collector wedged on a hung
//! disk or store gets restarted.

use std::sync::Arc;
use std::time::Duration;

pub use gputel_runtime::notify::{Heartbeat, ready, stopping, watchdog_timeout};
use tracing::info;

use crate::Serving;

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
    let mut lock_probe: Option<tokio::task::JoinHandle<()>> = None;
    gputel_runtime::notify::pet_while_healthy(timeout, "collector", || {
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
        problem
    })
    .await;
}
