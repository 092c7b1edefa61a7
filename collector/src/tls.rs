//! Mutual TLS for the agents' streams: the rustls server configuration from
//! PEM files, and the accept loop. The loop performs each handshake itself
//! (tonic's own TLS drops a failed one with a debug line and no address), so
//! a failed handshake, an agent with a certificate the CA did not sign or a
//! scanner, is logged with the peer's address and the reason, at most
//! [`LOGGED_PER_WINDOW`] lines a minute.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;
use tracing::{debug, warn};

use crate::config::TlsFiles;

/// How long a client may take to complete its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Failed handshakes logged one by one per window; the rest are counted and
/// reported when the next window opens.
pub const LOGGED_PER_WINDOW: u32 = 10;
const LOG_WINDOW: Duration = Duration::from_secs(60);
/// Connections whose handshake is done, waiting for the gRPC server.
const ACCEPTED_QUEUE: usize = 64;

/// Why the TLS settings could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read TLS file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("TLS file {path}: {reason}; give PEM files (certificate chain, private key, CA)")]
    Pem { path: PathBuf, reason: String },
    #[error("TLS settings refused: {0}")]
    Config(String),
}

/// The server side of mutual TLS: `files.cert`/`files.key` presented to
/// agents, client certificates required and checked against `files.client_ca`.
pub fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            path: path.to_owned(),
            source,
        })
    };
    let pem = |path: &Path, reason: String| TlsError::Pem {
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(&read(&files.cert)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(&files.cert, e.to_string()))?;
    if certs.is_empty() {
        return Err(pem(&files.cert, "no certificate in it".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(&read(&files.key)?)
        .map_err(|e| pem(&files.key, e.to_string()))?;
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(&read(&files.client_ca)?) {
        let ca = ca.map_err(|e| pem(&files.client_ca, e.to_string()))?;
        roots
            .add(ca)
            .map_err(|e| pem(&files.client_ca, e.to_string()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    // gRPC is HTTP/2 only.
    config.alpn_protocols = vec![b"h2".to_vec()];
    // No session resumption: an agent never resumes (tonic makes a new
    // client configuration, with an empty session cache, for each
    // connection), so the two tickets rustls sends after each handshake,
    // and the 256 sessions it keeps with their client certificates, would
    // cost every handshake and the heap for nothing; and every connection's
    // certificate is checked against the CA anew.
    config.send_tls13_tickets = 0;
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    Ok(Arc::new(config))
}

/// Connections on `listener` after a successful handshake, for the gRPC
/// server. The accept loop stops when the stream is dropped.
pub fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
) -> ReceiverStream<Result<Accepted, io::Error>> {
    let (tx, rx) = mpsc::channel(ACCEPTED_QUEUE);
    let acceptor = TlsAcceptor::from(config);
    let failures = Arc::new(Mutex::new(FailureLog::new(Instant::now())));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = tx.closed() => return,
            };
            let (tcp, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: wait, not spin.
                    debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx, failures) = (acceptor.clone(), tx.clone(), Arc::clone(&failures));
            tokio::spawn(async move {
                let reason =
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send(Ok(Accepted(Box::new(stream)))).await;
                            return;
                        }
                        Ok(Err(e)) => e.to_string(),
                        Err(_) => format!("no handshake within {HANDSHAKE_TIMEOUT:?}"),
                    };
                let mut log = failures.lock().unwrap_or_else(|e| e.into_inner());
                log.failed(peer, &reason, Instant::now());
            });
        }
    });
    ReceiverStream::new(rx)
}

/// A connection whose handshake is done, boxed. rustls' connection makes a
/// TLS stream 1.2 KB where a TCP stream is 32 bytes, and tonic's task for
/// a connection holds its stream twice over (the argument it was started
/// with and the connection made of it), inline, for as long as the agent
/// streams: boxed, the stream is held once.
#[derive(Debug)]
pub struct Accepted(Box<TlsStream<TcpStream>>);

impl AsyncRead for Accepted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Accepted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

impl Connected for Accepted {
    type ConnectInfo = <TlsStream<TcpStream> as Connected>::ConnectInfo;

    /// The TLS stream's: the peer's address and certificate chain.
    fn connect_info(&self) -> Self::ConnectInfo {
        self.0.connect_info()
    }
}

/// Rate-limits the log lines of failed handshakes.
#[derive(Debug)]
struct FailureLog {
    window_start: Instant,
    logged: u32,
    suppressed: u64,
}

impl FailureLog {
    fn new(now: Instant) -> Self {
        Self {
            window_start: now,
            logged: 0,
            suppressed: 0,
        }
    }

    /// Logs a failed handshake, or counts it when the window's lines are
    /// used up; returns whether it was logged.
    fn failed(&mut self, peer: SocketAddr, reason: &str, now: Instant) -> bool {
        if now.duration_since(self.window_start) >= LOG_WINDOW {
            if self.suppressed > 0 {
                warn!(
                    failed = self.suppressed,
                    "more TLS handshakes failed in the last minute than were logged"
                );
            }
            *self = Self::new(now);
        }
        if self.logged < LOGGED_PER_WINDOW {
            self.logged += 1;
            warn!(%peer, reason, "TLS handshake failed; connection closed");
            true
        } else {
            self.suppressed += 1;
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_handshakes_are_logged_ten_a_minute_then_counted() {
        let start = Instant::now();
        let peer: SocketAddr = "192.0.2.7:40000".parse().unwrap();
        let mut log = FailureLog::new(start);
        let logged: Vec<bool> = (0..12)
            .map(|i| log.failed(peer, "bad certificate", start + Duration::from_secs(i)))
            .collect();
        assert_eq!(logged.iter().filter(|l| **l).count(), 10);
        assert_eq!(logged[10..], [false, false]);
        assert_eq!(log.suppressed, 2);
        // A minute after the window opened, lines are logged again.
        assert!(log.failed(peer, "bad certificate", start + LOG_WINDOW));
        assert_eq!((log.logged, log.suppressed), (1, 0));
    }
}
