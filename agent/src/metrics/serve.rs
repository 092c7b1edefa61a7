//! The HTTP side: binding the port and answering scrapes.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tracing::{info, warn};

use super::{CONTENT_TYPE, Metrics, PATH};

/// Why the metrics endpoint cannot start.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen for /metrics on {addr}: {source}; choose another --metrics-listen address")]
pub struct BindError {
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Binds the endpoint's socket, before anything else starts, so a taken
/// port stops the agent at once with a clear message.
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, BindError> {
    let listener =
        std::net::TcpListener::bind(addr).map_err(|source| BindError { addr, source })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| BindError { addr, source })?;
    Ok(listener)
}

/// Serves `GET /metrics` on `listener` until `shutdown` completes; requests
/// in progress then finish, idle connections close. Logs
/// "metrics listening on ADDR" once it accepts connections.
pub async fn serve(
    listener: std::net::TcpListener,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let addr = listener.local_addr()?;
    let app = Router::new().route(PATH, get(scrape)).with_state(metrics);
    info!(%addr, "metrics listening on {addr}");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn scrape(axum::extract::State(metrics): axum::extract::State<Arc<Metrics>>) -> Response {
    match metrics.render() {
        Ok(body) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response(),
        Err(e) => {
            warn!(error = %e, "cannot render /metrics");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot render metrics: {e}\n"),
            )
                .into_response()
        }
    }
}
