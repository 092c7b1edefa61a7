//! gputel collector: receives agent streams over gRPC and writes
//! hive-partitioned Parquet through `object_store`.
//!
//! Data flow: [`ingest`] (validate, deduplicate) → [`buffer`] (Arrow builders
//! per table and partition) → [`flush`] (timer, size, shutdown) →
//! [`persist`] (sort, encode, put) → the store.

pub mod buffer;
pub mod clock;
pub mod config;
pub mod flush;
pub mod ingest;
pub mod persist;
pub mod store;
pub mod validate;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gputel_proto::v1::telemetry_server::TelemetryServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tracing::{info, warn};

use crate::clock::Clock;
use crate::config::Config;
use crate::flush::Flusher;
use crate::ingest::{IngestService, Shared};

/// How long streams get to close after the last flush before the server stops waiting.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Why the collector stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// Runs the collector until `shutdown` completes, then writes everything
/// buffered, acknowledges it, and closes the streams.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    let store = store::open(&config.store)?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| RunError::Bind {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| RunError::Bind {
        addr: config.listen,
        source,
    })?;
    let clock = Clock::System;
    let shared = Arc::new(Shared::new(config.flush_rows, clock.clone()));
    let (stop_flush, stop_flush_rx) = watch::channel(false);
    let (close_streams, close_streams_rx) = watch::channel(false);
    let flusher = Flusher::new(Arc::clone(&shared), store, clock);
    let flushing = tokio::spawn(flusher.run(config.flush_interval, stop_flush_rx));

    let service = TelemetryServer::new(IngestService::new(Arc::clone(&shared), close_streams_rx))
        .max_decoding_message_size(config.max_message_bytes);
    info!(%addr, store = %config.store, flush_interval = ?config.flush_interval, "listening on {addr}");

    let (server_stop, server_stop_rx) = watch::channel(false);
    let mut server_stop_rx2 = server_stop_rx.clone();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .add_service(service)
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async move {
                let _ = server_stop_rx2.wait_for(|s| *s).await;
            }),
    );
    drop(server_stop_rx);

    shutdown.await;
    info!("shutting down: writing buffered rows");
    let _ = stop_flush.send(true);
    if let Err(e) = flushing.await {
        warn!(error = %e, "flush task failed");
    }
    let _ = close_streams.send(true);
    let _ = server_stop.send(true);
    match tokio::time::timeout(CLOSE_GRACE, server).await {
        Ok(Ok(result)) => result?,
        Ok(Err(e)) => warn!(error = %e, "server task failed"),
        Err(_) => warn!("streams did not close within {CLOSE_GRACE:?}; stopping anyway"),
    }
    info!("stopped");
    Ok(())
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        ) {
            Ok(term) => term,
            Err(e) => {
                warn!(error = %e, "cannot watch SIGTERM; only Ctrl-C stops the collector cleanly");
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
