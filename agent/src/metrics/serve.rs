//! The HTTP side: binding the port and answering scrapes.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tracing::info;

use super::{CONTENT_TYPE, Encoding, Metrics, PATH};

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

/// Answers a scrape with the last tick's page, gzip-compressed when the
/// request's `Accept-Encoding` allows it.
async fn scrape(State(metrics): State<Arc<Metrics>>, request: HeaderMap) -> Response {
    let encoding = if request
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .any(|v| v.to_str().is_ok_and(accepts_gzip))
    {
        Encoding::Gzip
    } else {
        Encoding::Identity
    };
    let page = metrics.scrape(encoding);
    let mut headers = HeaderMap::with_capacity(3);
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
    // Caches between scraper and agent must not serve one encoding to a
    // client that asked for the other.
    headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    if page.encoding == Encoding::Gzip {
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    (headers, page.body).into_response()
}

/// Whether an `Accept-Encoding` value (RFC 9110, section 12.5.3) admits
/// gzip: `gzip` or `x-gzip` with a weight above 0, or, when neither is
/// named, `*` with a weight above 0. A weight that does not parse counts as
/// 0, so a request that cannot be read gets the plain text, which every
/// client takes.
pub fn accepts_gzip(value: &str) -> bool {
    let mut named: Option<f32> = None;
    let mut any: Option<f32> = None;
    for coding in value.split(',') {
        let mut parts = coding.split(';');
        let name = parts.next().unwrap_or_default().trim();
        if name.is_empty() {
            continue;
        }
        let mut weight = 1.0;
        for param in parts {
            if let Some((key, q)) = param.split_once('=')
                && key.trim().eq_ignore_ascii_case("q")
            {
                weight = q
                    .trim()
                    .parse::<f32>()
                    .ok()
                    .filter(|q| q.is_finite())
                    .unwrap_or(0.0);
            }
        }
        if name.eq_ignore_ascii_case("gzip") || name.eq_ignore_ascii_case("x-gzip") {
            named = Some(named.map_or(weight, |w| w.max(weight)));
        } else if name == "*" {
            any = Some(any.map_or(weight, |w| w.max(weight)));
        }
    }
    named.or(any).is_some_and(|w| w > 0.0)
}

#[cfg(test)]
mod tests {
    use super::accepts_gzip;

    #[test]
    fn accept_encoding_admits_gzip_only_with_a_positive_weight() {
        for (value, gzip) in [
            // Prometheus' own request.
            ("gzip", true),
            ("gzip, deflate, br", true),
            ("deflate, gzip;q=1.0, *;q=0.5", true),
            ("GZIP", true),
            ("x-gzip", true),
            ("gzip;q=0.001", true),
            (" gzip ; q = 0.5 ", true),
            ("*", true),
            ("br;q=1, *;q=0.1", true),
            ("", false),
            ("identity", false),
            ("deflate, br", false),
            ("gzip;q=0", false),
            ("gzip;q=0.000", false),
            ("gzip; Q=0", false),
            // Named with weight 0: the wildcard does not bring it back.
            ("gzip;q=0, *", false),
            ("*;q=0", false),
            ("identity, *;q=0", false),
            // A weight that does not parse: plain text.
            ("gzip;q=high", false),
            ("gzip;q=NaN", false),
            // Named twice: the higher weight.
            ("gzip;q=0, x-gzip;q=0.5", true),
            ("gzipx", false),
        ] {
            assert_eq!(accepts_gzip(value), gzip, "{value:?}");
        }
    }
}
