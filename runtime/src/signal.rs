//! The signals that stop a program cleanly.

use std::future::Future;

/// Completes on SIGTERM or SIGINT. The handlers are installed by this call,
/// not when the future is first polled, so a signal that arrives while the
/// program is still starting (replaying its log, binding its port) stops it
/// cleanly instead of killing it. Call within a tokio runtime.
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}
