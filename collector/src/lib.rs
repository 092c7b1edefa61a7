//! gputel collector: receives agent streams over gRPC and writes
//! hive-partitioned Parquet through `object_store`.
//!
//! Data flow: [`ingest`] (gRPC sessions, validation) → [`write`] (dedupe,
//! write-ahead log, acks once synced) → [`buffer`] (Arrow builders per table
//! and partition) → [`flush`] (timer, size, shutdown) →
//! [`persist`] (sort, encode, put) → the store. [`import`] writes a
//! scheduler's job trace to the same store (`gputel-collector import-jobs`).
//! [`systemd`] tells the service manager when the collector is ready and
//! pets its watchdog while the loops make progress.
//! [`alert`] evaluates alert rules on the accepted batches; [`silence`]
//! notices nodes that stop sending.

pub mod alert;
pub mod buffer;
pub mod clock;
pub mod compact;
pub mod config;
pub mod flush;
pub mod frames;
pub mod import;
pub mod ingest;
pub mod log_throttle;
pub mod marker;
pub mod memory;
pub mod peers;
pub mod persist;
pub mod report;
pub mod silence;
pub mod sort;
pub mod state_file;
pub mod store;
pub mod systemd;
pub mod tls;
pub mod validate;
pub mod wal;
pub mod write;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gputel_proto::v1::telemetry_server::TelemetryServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tracing::{debug, info, warn};

use crate::clock::Clock;
use crate::config::Config;
use crate::flush::Flusher;
use crate::ingest::IngestService;
use crate::peers::Peers;
use crate::write::WritePath;

/// How long streams get to close after the last flush before the server stops waiting.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Why the collector stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Wal(#[from] wal::WalError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    #[error(transparent)]
    Alert(#[from] alert::AlertError),
    #[error(transparent)]
    NodeState(#[from] silence::StateError),
}

/// Runs the collector until `shutdown` completes, then writes everything
/// buffered, acknowledges it, and closes the streams.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), RunError> {
    let store = store::open_store(&config.store, &config.s3)?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| RunError::Bind {
            addr: config.listen,
            source,
        })?;
    let tls = match &config.tls {
        Some(files) => Some(tls::server_config(files)?),
        None if config.listen.ip().is_loopback() => {
            warn!(
                listen = %config.listen,
                "serving without TLS (--plaintext) on loopback only: other machines cannot \
                 connect, and any local client can write as any node (give --listen to serve \
                 other machines, preferably with mutual TLS)"
            );
            None
        }
        None => {
            warn!(
                listen = %config.listen,
                "serving without TLS (--plaintext) on a network address: any client that \
                 reaches it can write as any node"
            );
            None
        }
    };
    // Rules are read before the server starts (a bad file stops the start),
    // and ingest queues batches for them from the first stream on.
    let alerts = match config.alerts {
        Some(alerts) => Some(alert::Alerting::prepare(alerts)?),
        None => None,
    };
    let options = ServeOptions {
        flush_interval: config.flush_interval,
        flush_rows: config.flush_rows,
        memory: config.memory,
        max_agent_rows_per_s: config.max_agent_rows_per_s,
        max_message_bytes: config.max_message_bytes,
        tls,
        alert_sink: alerts.as_ref().map(alert::PreparedAlerting::sink),
        node_silence: Some(config.node_silence_after),
    };
    let (mut wal, replayed) = wal::Wal::open(&config.wal_dir)?;
    let (free, total) = wal::volume_space(&config.wal_dir)?;
    let min_free = config
        .wal_min_free_bytes
        .unwrap_or_else(|| wal::default_min_free_bytes(total));
    wal.set_min_free_bytes(min_free)?;
    if free < min_free {
        warn!(
            wal = %config.wal_dir.display(),
            free_bytes = free,
            min_free_bytes = min_free,
            "the write-ahead log's volume is already short of room: every batch is refused \
             (agents keep theirs in their spool) until min_free_bytes is free; free some room \
             or lower --wal-min-free-bytes"
        );
    } else {
        info!(
            wal = %config.wal_dir.display(),
            free_bytes = free,
            min_free_bytes = min_free,
            "write-ahead log volume: batches are refused while less than min_free_bytes is free"
        );
    }
    if !replayed.records.is_empty() {
        info!(
            batches = replayed.records.len(),
            wal = %config.wal_dir.display(),
            "replaying the write-ahead log"
        );
    }
    let serving = serve(
        listener,
        store.clone(),
        Clock::System,
        options,
        wal,
        replayed,
    )
    .await?;
    let alerting = start_alerting(alerts, serving.shared());
    let addr = serving.local_addr();
    info!(%addr, store = %config.store, flush_interval = ?config.flush_interval, "listening on {addr}");
    let (stop_maintenance, maintenance_stop) = watch::channel(false);
    let maintenance = config.compact_interval.map(|interval| {
        tokio::spawn(maintain(
            store,
            Arc::clone(serving.shared()),
            interval,
            config.flush_interval,
            config.retention.clone(),
            config.wal_dir.join(compact::STAGING_DIR),
            maintenance_stop,
        ))
    });
    // The log is replayed and written out, and the port is bound.
    systemd::ready(&format!("listening on {addr}; writing to {}", config.store));
    tokio::select! {
        () = shutdown => {}
        () = systemd::watchdog(&serving, config.flush_interval) => {}
    }
    if let Some(task) = maintenance {
        // Stops a round where it is and gives the compaction lease up.
        let _ = stop_maintenance.send(true);
        let _ = task.await;
    }
    info!("shutting down: writing buffered rows");
    systemd::stopping("stopping: writing buffered rows");
    alerting.stop().await;
    serving.shutdown().await?;
    info!("stopped");
    Ok(())
}

/// The background maintenance: every `interval`, retention, then compaction
/// of hours closed for `flush_interval` plus [`COMPACT_GRACE`], leaving
/// alone this collector's files that its log has not released; only while
/// this collector holds the store's compaction lease ([`compact::Lease`],
/// kept from round to round and renewed at each, given up at `stop`).
/// Compaction's spill files go under `spill_dir` when the store is not a
/// local directory.
async fn maintain(
    store: store::Store,
    shared: Arc<WritePath>,
    interval: Duration,
    flush_interval: Duration,
    retention: compact::Retention,
    spill_dir: PathBuf,
    mut stop: watch::Receiver<bool>,
) {
    let (collector_id, _) = shared.log_position();
    let holder = compact::holder_name(&format!("collector {collector_id}"));
    let ttl = interval * LEASE_ROUNDS;
    let mut held: Option<compact::Lease> = None;
    let mut timer = tokio::time::interval(interval);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = timer.tick() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let mut lease = match held.take() {
            Some(lease) => lease,
            None => match compact::Lease::acquire(&store, &holder, ttl, Clock::System).await {
                Ok(lease) => {
                    info!(holder, ttl = ?ttl, "took the compaction lease: this collector maintains the store");
                    lease
                }
                Err(e) if e.is_held() => {
                    debug!(reason = %e, "not compacting");
                    continue;
                }
                Err(e) => {
                    warn!(error = %e, "cannot take the compaction lease; retried in {interval:?}");
                    continue;
                }
            },
        };
        let options = compact::CompactOptions {
            min_age: flush_interval + COMPACT_GRACE,
            unreleased_of: Some(shared.log_position()),
            spill_dir: Some(spill_dir.clone()),
            ..compact::CompactOptions::default()
        };
        let now_us = Clock::System.now_us();
        let _compacting = shared.compacting();
        let round = compact::maintain(&store, now_us, Some(&options), &retention, &mut lease);
        let result = tokio::select! {
            result = round => result,
            _ = stop.wait_for(|s| *s) => {
                held = Some(lease);
                break;
            }
        };
        match result {
            Ok(_) => held = Some(lease),
            Err(compact::CompactError::Lease(e)) => {
                info!(reason = %e, "no longer the store's compactor");
            }
            Err(e) => {
                warn!(error = %e, "compaction or retention failed; retried in {interval:?}");
                held = Some(lease);
            }
        }
    }
    if let Some(lease) = held
        && let Err(e) = lease.release().await
    {
        warn!(error = %e, "cannot give the compaction lease up; it runs out by itself");
    }
}

/// A compaction lease lasts this many maintenance intervals: it outlives the
/// pause between two rounds of its holder, and a peer takes it over within
/// that many intervals of the holder's end.
pub const LEASE_ROUNDS: u32 = 3;

/// Alerting, if there are rules, and its SIGHUP reloads, stopped together.
#[derive(Debug)]
pub struct RunningAlerts {
    alerting: Option<Arc<alert::Alerting>>,
    stop_reload: watch::Sender<bool>,
    reload: JoinHandle<()>,
}

impl RunningAlerts {
    /// Stops the reloads, then evaluates what is queued and saves the state.
    pub async fn stop(self) {
        let _ = self.stop_reload.send(true);
        let _ = self.reload.await;
        let Some(alerting) = self.alerting else {
            return;
        };
        match Arc::try_unwrap(alerting) {
            Ok(alerting) => alerting.stop().await,
            Err(_) => {
                warn!("alerting still in use at shutdown; its state was saved at the last change")
            }
        }
    }
}

/// How long after its end, beyond one flush interval, an hour is compacted:
/// time for agents' late batches to arrive.
pub const COMPACT_GRACE: Duration = Duration::from_secs(5 * 60);

/// Starts the alert rules, if any, on `shared`'s accepted batches, reloaded
/// at SIGHUP. SIGHUP is watched from this call on even without rules, so
/// that a reload never ends the collector.
pub fn start_alerting(
    prepared: Option<alert::PreparedAlerting>,
    shared: &Arc<WritePath>,
) -> RunningAlerts {
    let alerting = prepared.map(|prepared| Arc::new(prepared.start(Arc::clone(shared))));
    let (stop_reload, stop_rx) = watch::channel(false);
    let reload = tokio::spawn(alert::reload_on_sighup(alerting.clone(), stop_rx));
    RunningAlerts {
        alerting,
        stop_reload,
        reload,
    }
}

/// The settings [`serve`] needs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub flush_interval: Duration,
    pub flush_rows: usize,
    /// The memory budget's shares, `max_unwritten_rows` among them.
    pub memory: memory::MemoryPlan,
    /// Average rows per second one agent may send (over a 10 s burst).
    pub max_agent_rows_per_s: u64,
    pub max_message_bytes: usize,
    /// Mutual TLS ([`tls::server_config`]); every agent must then show a
    /// certificate naming its node.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Where accepted batches and node changes go for the alert rules (see
    /// [`alert`]).
    pub alert_sink: Option<write::AlertSink>,
    /// Watch the nodes for silence, with this least silence
    /// (`--node-silence-after`); None: nodes are not watched.
    pub node_silence: Option<Duration>,
}

/// Starts the log syncer, the flush loop and the gRPC server on `listener`.
/// What the log replayed is written to the store before the server starts.
pub async fn serve(
    listener: TcpListener,
    store: store::Store,
    clock: Clock,
    options: ServeOptions,
    wal: wal::Wal,
    replayed: wal::Replayed,
) -> Result<Serving, RunError> {
    let addr = listener.local_addr().map_err(|source| RunError::Bind {
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })?;
    let replaying = !replayed.records.is_empty();
    let nodes_file = wal.dir().join(silence::STATE_FILE);
    let replayed_node_events: Vec<gputel_proto::NodeEvent> = replayed
        .records
        .iter()
        .flat_map(|r| r.node_events.iter().cloned())
        .collect();
    let shared = Arc::new(WritePath::new(
        options.flush_rows,
        &options.memory,
        options.max_agent_rows_per_s,
        clock,
        wal,
        replayed,
    ));
    if let Some(silence_after) = options.node_silence {
        let saved = silence::load(&nodes_file)?;
        let now_us = shared.clock().now_us();
        let mut watch = silence::NodeWatch::restore(silence_after, saved, now_us);
        watch.replay(&replayed_node_events);
        if !watch.nodes().is_empty() {
            info!(
                nodes = watch.nodes().len(),
                silent = watch.silences().len(),
                file = %nodes_file.display(),
                grace = ?silence::START_GRACE,
                "node watch restored: nodes known before get a grace to reconnect"
            );
        }
        shared.watch_node_silence(watch, nodes_file);
    }
    if let Some(sink) = options.alert_sink {
        shared.set_alert_sink(sink);
    }
    let (stop_flush, stop_flush_rx) = watch::channel(false);
    let (close_streams, close_streams_rx) = watch::channel(false);
    let objects = Arc::clone(&store.objects);
    let mut flusher = Flusher::new(Arc::clone(&shared), store);
    if replaying {
        // Before any agent connects, so the replayed rows get their own files.
        if let Err(e) = flusher.flush().await {
            warn!(error = %e, "replayed rows not written yet; the flush loop retries");
        }
    }
    let syncing = tokio::spawn(Arc::clone(&shared).run_syncer(close_streams_rx.clone()));
    // Collectors sharing the store tell each other which nodes they stream.
    let peers = Arc::new(Peers::new(
        objects,
        &shared.log_position().0,
        shared.clock().clone(),
    ));
    let publishing =
        tokio::spawn(Arc::clone(&peers).run(Arc::clone(&shared), stop_flush_rx.clone()));
    let watching =
        tokio::spawn(Arc::clone(&shared).run_node_watch(stop_flush_rx.clone(), Arc::clone(&peers)));
    let flushing = tokio::spawn(flusher.run(options.flush_interval, stop_flush_rx));

    let require_identity = options.tls.is_some();
    let service = TelemetryServer::new(IngestService::new(
        Arc::clone(&shared),
        close_streams_rx,
        require_identity,
        Arc::new(ingest::InFlight::new(
            options.memory.in_flight_bytes,
            options.memory.per_message_bytes,
        )),
    ))
    .max_decoding_message_size(options.max_message_bytes);
    let (server_stop, mut server_stop_rx) = watch::channel(false);
    let router = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        // Each message's header apart from its body, so that tonic's buffer
        // of each stream stays at one message (see `frames`).
        .layer(tower::util::MapRequestLayer::new(
            |request: http::Request<tonic::body::Body>| {
                request.map(|body| tonic::body::Body::new(frames::MessageParts::new(body)))
            },
        ))
        .add_service(service);
    let stopped = async move {
        let _ = server_stop_rx.wait_for(|s| *s).await;
    };
    // Under TLS the handshakes are ours, so that failed ones are logged.
    let server = match options.tls {
        Some(config) => tokio::spawn(
            router.serve_with_incoming_shutdown(tls::incoming(listener, config), stopped),
        ),
        None => tokio::spawn(
            router.serve_with_incoming_shutdown(TcpListenerStream::new(listener), stopped),
        ),
    };
    Ok(Serving {
        addr,
        shared,
        stop_flush,
        close_streams,
        server_stop,
        flushing: Some(flushing),
        watching: Some(watching),
        publishing: Some(publishing),
        syncing,
        server,
    })
}

/// A serving collector. Shutting it down is ordered so that nothing received
/// is lost: stop taking batches, write what is buffered, acknowledge it, then
/// close the streams (agents resend whatever was not acknowledged).
#[derive(Debug)]
pub struct Serving {
    addr: SocketAddr,
    shared: Arc<WritePath>,
    stop_flush: watch::Sender<bool>,
    close_streams: watch::Sender<bool>,
    server_stop: watch::Sender<bool>,
    flushing: Option<JoinHandle<()>>,
    /// The node watch (see [`silence`]); saves its state when stopped.
    watching: Option<JoinHandle<()>>,
    /// This collector's node list in the store (see [`peers`]); cleared
    /// when stopped.
    publishing: Option<JoinHandle<()>>,
    syncing: JoinHandle<()>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Serving {
    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// State shared by the streams and the flush loop.
    pub fn shared(&self) -> &Arc<WritePath> {
        &self.shared
    }

    /// Whether the gRPC server task is still running.
    pub fn is_serving(&self) -> bool {
        !self.server.is_finished()
    }

    /// Stops taking batches, writes what is buffered and sends its
    /// acknowledgements; the streams stay open.
    pub async fn finish_writing(&mut self) {
        let _ = self.stop_flush.send(true);
        if let Some(flushing) = self.flushing.take()
            && let Err(e) = flushing.await
        {
            warn!(error = %e, "flush task failed");
        }
        if let Some(watching) = self.watching.take()
            && let Err(e) = watching.await
        {
            warn!(error = %e, "node watch failed");
        }
        if let Some(publishing) = self.publishing.take()
            && let Err(e) = publishing.await
        {
            warn!(error = %e, "node list task failed");
        }
    }

    /// Finishes writing, then closes the streams and stops the server.
    pub async fn shutdown(mut self) -> Result<(), RunError> {
        self.finish_writing().await;
        let _ = self.close_streams.send(true);
        let _ = self.server_stop.send(true);
        let _ = self.syncing.await;
        match tokio::time::timeout(CLOSE_GRACE, self.server).await {
            Ok(Ok(result)) => result?,
            Ok(Err(e)) => warn!(error = %e, "server task failed"),
            Err(_) => warn!("streams did not close within {CLOSE_GRACE:?}; stopping anyway"),
        }
        Ok(())
    }
}
