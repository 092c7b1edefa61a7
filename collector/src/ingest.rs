//! gRPC ingest: one task per agent stream. Validates each batch, drops
//! sequences already received, appends the rest to the write-ahead log and
//! the write buffer, and acknowledges them once the log is synced to disk.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use gputel_proto::v1::telemetry_server::Telemetry;
use gputel_proto::v1::{Ack, Reject, Welcome};
use gputel_proto::{AgentMessage, CollectorMessage, agent_message, collector_message};
use tokio::sync::{Notify, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status, Streaming};
use tracing::{debug, error, info, warn};

use crate::alert::eval::AlertInput;
use crate::buffer::WriteBuffer;
use crate::clock::Clock;
use crate::systemd::Heartbeat;
use crate::validate::{validate_batch, validate_hello};
use crate::wal::{Replayed, Wal, WalError};

/// How long a new stream may take to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages queued towards one agent (acks, rejects) before new ones are
/// dropped; acks are cumulative, so a dropped one is covered by the next.
const OUTBOUND_QUEUE: usize = 256;

type Outbound = mpsc::Sender<Result<CollectorMessage, Status>>;

/// State shared by the stream tasks, the log syncer and the persister.
#[derive(Debug)]
pub struct Shared {
    state: Mutex<State>,
    /// Woken when the buffer holds `flush_rows` rows.
    pub flush_now: Notify,
    /// Woken when records wait for an fsync.
    sync_wanted: Notify,
    flush_rows: usize,
    max_unwritten_rows: usize,
    max_agent_rows_per_s: u64,
    /// Rows taken from the buffer whose files are not written yet.
    unwritten_rows: AtomicUsize,
    draining: AtomicBool,
    clock: Clock,
    next_session: AtomicU64,
    /// Where accepted batches go for alert rules, when alerting is on.
    alert_sink: OnceLock<mpsc::Sender<AlertInput>>,
    /// Counters reported in logs.
    pub stats: Stats,
    /// Beats each time the flush loop takes the buffer; the watchdog reads it.
    pub taken: Heartbeat,
}

/// Running totals since start.
#[derive(Debug, Default)]
pub struct Stats {
    pub batches: AtomicU64,
    pub rows: AtomicU64,
    pub duplicates: AtomicU64,
    pub rejected: AtomicU64,
    pub replayed: AtomicU64,
    /// Batches the alert rules did not see because their queue was full.
    pub alert_inputs_dropped: AtomicU64,
}

#[derive(Debug)]
struct State {
    buffer: WriteBuffer,
    agents: HashMap<String, AgentState>,
    wal: Wal,
    /// Appended to the log, not yet synced: the highest sequence per agent.
    unsynced: HashMap<String, u64>,
    /// Closed log segments whose rows are in the buffer.
    segments: Vec<u64>,
}

#[derive(Debug, Default)]
struct AgentState {
    /// Highest sequence appended to the log and the buffer.
    received: u64,
    /// Highest sequence synced to the log, and so acknowledged.
    durable: u64,
    session: Option<(u64, Outbound)>,
    /// When the agent last connected or sent, by the collector's clock.
    last_seen_us: i64,
    /// Rows the agent may still send now (a token bucket), and when it was
    /// last refilled.
    allowance: f64,
    refilled_us: i64,
}

/// Seconds of an agent's rate it may send at once.
const RATE_BURST_S: f64 = 10.0;

impl AgentState {
    /// Takes `rows` from the agent's allowance, refilled at `rate` rows/s up
    /// to [`RATE_BURST_S`] seconds' worth; false when it has not enough.
    fn take_allowance(&mut self, rows: usize, rate: u64, now_us: i64) -> bool {
        let burst = rate as f64 * RATE_BURST_S;
        if self.refilled_us == 0 {
            self.allowance = burst;
        } else {
            let elapsed_s = (now_us - self.refilled_us).max(0) as f64 / 1e6;
            self.allowance = (self.allowance + elapsed_s * rate as f64).min(burst);
        }
        self.refilled_us = now_us;
        if self.allowance >= rows as f64 {
            self.allowance -= rows as f64;
            true
        } else {
            false
        }
    }
}

/// How long an agent id is remembered after its last batch. Agents without a
/// spool take a new id at every start, so the map would otherwise only grow;
/// an agent with a spool that comes back later resends only what was never
/// acknowledged, which is new to the collector anyway.
const AGENT_RETENTION_US: i64 = 7 * 24 * 3600 * 1_000_000;

/// What the persister takes in one go: the rows, the log segments that hold
/// them (to release once the rows are stored), and the name their files get.
#[derive(Debug)]
pub struct Taken {
    pub buffer: WriteBuffer,
    pub segments: Vec<u64>,
    /// `<collector id>-<first segment>`: the same rows always get the same
    /// file names, so a flush repeated after a crash replaces its own files.
    pub stem: String,
}

/// Why a batch could not be taken in.
#[derive(Debug, thiserror::Error)]
#[error("the collector cannot write its log: {0}; retry later")]
pub struct LogUnavailable(#[from] WalError);

impl Shared {
    /// The shared state over an opened log, with what it replayed already in
    /// the buffer.
    pub fn new(
        flush_rows: usize,
        max_unwritten_rows: usize,
        max_agent_rows_per_s: u64,
        clock: Clock,
        wal: Wal,
        replayed: Replayed,
    ) -> Self {
        let agents = wal
            .durable()
            .iter()
            .map(|(id, &seq)| {
                let agent = AgentState {
                    received: seq,
                    durable: seq,
                    session: None,
                    // Remembered for a full retention period after a restart.
                    last_seen_us: clock.now_us(),
                    ..AgentState::default()
                };
                (id.clone(), agent)
            })
            .collect();
        let stats = Stats::default();
        let mut buffer = WriteBuffer::default();
        let now_us = clock.now_us();
        for record in &replayed.records {
            buffer.append_alerts(&record.alerts);
            let Some(batch) = &record.batch else {
                continue;
            };
            // Validated when it arrived; the clock window may have moved since.
            match validate_batch(batch, now_us.max(max_ts(batch))) {
                Ok(valid) => {
                    buffer.append(&record.node, valid);
                    stats.replayed.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    warn!(agent_id = %record.agent_id, seq = batch.seq, error = %e, "logged batch no longer valid; skipped")
                }
            }
        }
        let mut segments = replayed.segments;
        segments.sort_unstable();
        Self {
            state: Mutex::new(State {
                buffer,
                agents,
                wal,
                unsynced: HashMap::new(),
                segments,
            }),
            flush_now: Notify::new(),
            sync_wanted: Notify::new(),
            flush_rows,
            max_unwritten_rows,
            max_agent_rows_per_s,
            unwritten_rows: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            clock,
            next_session: AtomicU64::new(1),
            alert_sink: OnceLock::new(),
            stats,
            taken: Heartbeat::new(),
        }
    }

    /// From now on, every accepted batch (never a duplicate) is also handed
    /// to `sink` for the alert rules. Set once.
    pub fn set_alert_sink(&self, sink: mpsc::Sender<AlertInput>) {
        if self.alert_sink.set(sink).is_err() {
            warn!("alert rules were already connected; the second connection is ignored");
        }
    }

    /// Logs alert rows and buffers them for the `alert` table: written by the
    /// next flush, and replayed after a crash like batches.
    pub fn append_alerts(&self, rows: &[gputel_proto::AlertRow]) -> Result<(), LogUnavailable> {
        if rows.is_empty() {
            return Ok(());
        }
        {
            let mut state = self.lock();
            state.wal.append_alerts(rows)?;
            state.buffer.append_alerts(rows);
        }
        self.sync_wanted.notify_one();
        Ok(())
    }

    /// Hands an accepted batch to the alert rules without waiting: when their
    /// queue is full the batch is counted and skipped, never the ack delayed.
    fn to_alerts(&self, node: &str, batch: &gputel_proto::Batch) {
        let Some(sink) = self.alert_sink.get() else {
            return;
        };
        if batch.gpu.is_empty() && batch.event.is_empty() {
            return;
        }
        if sink.try_send(AlertInput::from_batch(node, batch)).is_err() {
            let dropped = self
                .stats
                .alert_inputs_dropped
                .fetch_add(1, Ordering::Relaxed)
                + 1;
            if dropped.is_power_of_two() {
                warn!(
                    node,
                    dropped, "alert rules are behind: batches skipped by them so far"
                );
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind, still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the buffered rows. Closes the current log segment first (which
    /// syncs it, so what waited for a sync is acknowledged here).
    pub fn take(&self) -> Result<Taken, WalError> {
        self.taken.beat();
        let mut guard = self.lock();
        let state = &mut *guard;
        let closed = state.wal.rotate()?;
        let synced = std::mem::take(&mut state.unsynced);
        acknowledge(&mut state.agents, &mut state.wal, synced);
        let cutoff = self.clock.now_us().saturating_sub(AGENT_RETENTION_US);
        let forgotten: Vec<String> = state
            .agents
            .iter()
            .filter(|(_, a)| a.session.is_none() && a.last_seen_us < cutoff)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &forgotten {
            state.agents.remove(id);
            state.wal.forget(id);
        }
        state.segments.extend(state.wal.take_closed_on_error());
        state.segments.push(closed);
        let segments = std::mem::take(&mut state.segments);
        let first = segments.iter().min().copied().unwrap_or(closed);
        Ok(Taken {
            buffer: std::mem::take(&mut state.buffer),
            stem: format!("{}-{first:016}", state.wal.collector_id()),
            segments,
        })
    }

    /// The rows of these segments are stored: drop them from the log.
    pub fn release(&self, segments: &[u64]) -> Result<(), WalError> {
        self.lock().wal.release(segments)
    }

    /// This collector's id and the last log segment whose rows are stored:
    /// its files named after later segments may still be written again.
    pub fn log_position(&self) -> (String, u64) {
        let state = self.lock();
        (
            state.wal.collector_id().to_owned(),
            state.wal.released_through(),
        )
    }

    /// Rows buffered now.
    pub fn buffered_rows(&self) -> usize {
        self.lock().buffer.rows()
    }

    /// Whether an agent id has a stream open now.
    pub fn has_session(&self, agent_id: &str) -> bool {
        self.lock()
            .agents
            .get(agent_id)
            .is_some_and(|a| a.session.is_some())
    }

    /// The flush loop reports the rows it holds whose files are not written.
    pub fn set_unwritten_rows(&self, rows: usize) {
        self.unwritten_rows.store(rows, Ordering::Relaxed);
    }

    /// Syncs the log whenever records wait for it and acknowledges them:
    /// one fsync covers every record appended before it (group commit).
    pub async fn run_syncer(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = self.sync_wanted.notified() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let prepared = {
                let mut guard = self.lock();
                let state = &mut *guard;
                state
                    .wal
                    .prepare_sync()
                    .map(|handle| (handle, std::mem::take(&mut state.unsynced)))
            };
            let (handle, synced) = match prepared {
                Ok(prepared) => prepared,
                Err(e) => {
                    error!(error = %e, "cannot write the log; nothing is acknowledged until it works");
                    tokio::time::sleep(SYNC_RETRY).await;
                    self.sync_wanted.notify_one();
                    continue;
                }
            };
            let result = match handle {
                Some(file) => tokio::task::spawn_blocking(move || file.sync_data())
                    .await
                    .unwrap_or_else(|e| Err(std::io::Error::other(e))),
                None => Ok(()),
            };
            {
                let mut guard = self.lock();
                let state = &mut *guard;
                match result {
                    Ok(()) => acknowledge(&mut state.agents, &mut state.wal, synced),
                    Err(e) => {
                        // After a failed fsync the kernel may have dropped the
                        // dirty pages and a retry can "succeed" without them,
                        // so nothing synced since the last success can be
                        // trusted. Stop: at restart the log replays what is
                        // really on disk, and agents resend the rest, which
                        // was never acknowledged.
                        error!(error = %e, "cannot sync the write-ahead log; stopping so that nothing unsynced is acknowledged");
                        std::process::exit(EXIT_LOG_SYNC_FAILED);
                    }
                }
            }
        }
    }

    /// Stops accepting batches: they are left to the agents to resend.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }
}

/// The collector's exit status when the log cannot be synced (EX_IOERR).
const EXIT_LOG_SYNC_FAILED: i32 = 74;

/// How long to wait before retrying a failed log write or sync.
const SYNC_RETRY: Duration = Duration::from_millis(200);

fn max_ts(batch: &gputel_proto::Batch) -> i64 {
    batch
        .gpu
        .iter()
        .map(|s| s.ts_us)
        .chain(batch.node.iter().map(|s| s.ts_us))
        .chain(batch.ib.iter().map(|s| s.ts_us))
        .chain(batch.event.iter().map(|s| s.ts_us))
        .chain(batch.gpu_process.iter().map(|s| s.ts_us))
        .max()
        .unwrap_or(0)
}

/// Marks these sequences durable (in memory and for the log's state file)
/// and tells the connected agents.
fn acknowledge(
    agents: &mut HashMap<String, AgentState>,
    wal: &mut Wal,
    synced: HashMap<String, u64>,
) {
    for (agent_id, seq) in synced {
        wal.note_durable(&agent_id, seq);
        let Some(agent) = agents.get_mut(&agent_id) else {
            continue;
        };
        agent.durable = agent.durable.max(seq);
        if let Some((_, tx)) = &agent.session {
            let ack = message(collector_message::Kind::Ack(Ack { seq: agent.durable }));
            if tx.try_send(Ok(ack)).is_err() {
                debug!(agent_id, "ack not queued; the next one covers it");
            }
        }
    }
}

fn message(kind: collector_message::Kind) -> CollectorMessage {
    CollectorMessage { kind: Some(kind) }
}

/// The gRPC service.
#[derive(Debug, Clone)]
pub struct IngestService {
    shared: Arc<Shared>,
    closing: watch::Receiver<bool>,
    require_identity: bool,
}

impl IngestService {
    /// `closing` turns true when every stream should end (after the last
    /// flush). With `require_identity` (mutual TLS), a stream may only write
    /// as the node its client certificate names.
    pub fn new(
        shared: Arc<Shared>,
        closing: watch::Receiver<bool>,
        require_identity: bool,
    ) -> Self {
        Self {
            shared,
            closing,
            require_identity,
        }
    }
}

/// Whether a DER certificate is valid for `node` as a DNS name (its SAN, as
/// TLS server names are checked).
fn certificate_names(der: &[u8], node: &str) -> bool {
    let der = rustls_pki_types::CertificateDer::from(der);
    let Ok(cert) = webpki::EndEntityCert::try_from(&der) else {
        return false;
    };
    let Ok(name) = rustls_pki_types::ServerName::try_from(node) else {
        return false;
    };
    cert.verify_is_valid_for_subject_name(&name).is_ok()
}

#[tonic::async_trait]
impl Telemetry for IngestService {
    type StreamStream = ReceiverStream<Result<CollectorMessage, Status>>;

    async fn stream(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        let peer = request
            .remote_addr()
            .map_or_else(|| "unknown peer".to_owned(), |a| a.to_string());
        let certificate = if self.require_identity {
            match request
                .peer_certs()
                .and_then(|certs| certs.first().cloned())
            {
                Some(cert) => Some(cert.to_vec()),
                None => {
                    return Err(Status::unauthenticated("a client certificate is required"));
                }
            }
        } else {
            None
        };
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE);
        let session = Session {
            shared: Arc::clone(&self.shared),
            tx,
            certificate,
            peer,
            id: self.shared.next_session.fetch_add(1, Ordering::Relaxed),
        };
        tokio::spawn(session.run(inbound, self.closing.clone()));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

struct Session {
    shared: Arc<Shared>,
    tx: Outbound,
    /// The client's certificate (DER) under mutual TLS.
    certificate: Option<Vec<u8>>,
    peer: String,
    id: u64,
}

impl Session {
    async fn run(self, mut inbound: Streaming<AgentMessage>, mut closing: watch::Receiver<bool>) {
        let hello = match tokio::time::timeout(HELLO_TIMEOUT, inbound.message()).await {
            Ok(Ok(Some(AgentMessage {
                kind: Some(agent_message::Kind::Hello(hello)),
            }))) => hello,
            Ok(Ok(None)) => return,
            Ok(Err(status)) => return self.end_with(status).await,
            Ok(Ok(Some(_))) => {
                return self
                    .fail(Status::failed_precondition(
                        "the first message on a stream must be a hello",
                    ))
                    .await;
            }
            Err(_) => {
                return self
                    .fail(Status::deadline_exceeded("no hello within 10 s"))
                    .await;
            }
        };
        if let Err(e) = validate_hello(&hello) {
            return self.fail(Status::invalid_argument(e.to_string())).await;
        }
        if let Some(der) = &self.certificate
            && !certificate_names(der, &hello.node)
        {
            return self
                .fail(Status::permission_denied(format!(
                    "this client's certificate does not name node {:?}; a node writes only as itself",
                    hello.node
                )))
                .await;
        }
        let durable = {
            let mut state = self.shared.lock();
            let agent = state.agents.entry(hello.agent_id.clone()).or_default();
            agent.session = Some((self.id, self.tx.clone()));
            agent.last_seen_us = self.shared.clock.now_us();
            agent.durable
        };
        info!(peer = %self.peer, node = %hello.node, agent_id = %hello.agent_id, version = %hello.agent_version, durable_seq = durable, "agent connected");
        let welcome = message(collector_message::Kind::Welcome(Welcome {
            durable_seq: durable,
            collector_version: env!("CARGO_PKG_VERSION").to_owned(),
        }));
        if self.tx.send(Ok(welcome)).await.is_err() {
            return;
        }
        loop {
            let next = tokio::select! {
                next = inbound.message() => next,
                _ = closing.wait_for(|closing| *closing) => break,
            };
            match next {
                Ok(Some(AgentMessage {
                    kind: Some(agent_message::Kind::Batch(batch)),
                })) => {
                    if let Err(status) = self.on_batch(&hello.node, &hello.agent_id, &batch).await {
                        self.fail(status).await;
                        break;
                    }
                }
                Ok(Some(_)) => {
                    self.fail(Status::failed_precondition(
                        "only batches may follow the hello",
                    ))
                    .await;
                    break;
                }
                Ok(None) => break,
                Err(status) => {
                    self.end_with(status).await;
                    break;
                }
            }
        }
        let mut state = self.shared.lock();
        if let Some(agent) = state.agents.get_mut(&hello.agent_id)
            && agent.session.as_ref().is_some_and(|(id, _)| *id == self.id)
        {
            agent.session = None;
        }
        drop(state);
        info!(peer = %self.peer, node = %hello.node, agent_id = %hello.agent_id, "agent disconnected");
    }

    async fn on_batch(
        &self,
        node: &str,
        agent_id: &str,
        batch: &gputel_proto::Batch,
    ) -> Result<(), Status> {
        let shared = &self.shared;
        if shared.draining.load(Ordering::SeqCst) {
            return Ok(());
        }
        let valid = match validate_batch(batch, shared.clock.now_us()) {
            Ok(valid) => valid,
            Err(e) => {
                shared.stats.rejected.fetch_add(1, Ordering::Relaxed);
                warn!(node, agent_id, seq = batch.seq, error = %e, "batch rejected");
                let reject = message(collector_message::Kind::Reject(Reject {
                    seq: batch.seq,
                    reason: e.to_string(),
                }));
                let _ = self.tx.send(Ok(reject)).await;
                return Ok(());
            }
        };
        let rows = crate::validate::row_count(batch);
        let (duplicate_of_durable, full) = {
            let mut guard = shared.lock();
            let state = &mut *guard;
            let agent = state.agents.entry(agent_id.to_owned()).or_default();
            let now_us = shared.clock.now_us();
            agent.last_seen_us = now_us;
            if batch.seq > agent.received
                && !agent.take_allowance(rows, shared.max_agent_rows_per_s, now_us)
            {
                drop(guard);
                warn!(node, agent_id, "agent over its rate: batch refused");
                // The agent keeps the batch and retries after a backoff.
                return Err(Status::resource_exhausted(format!(
                    "agent {agent_id} sends more than {} rows/s; retry later",
                    shared.max_agent_rows_per_s
                )));
            }
            if batch.seq <= agent.received {
                let durable = (batch.seq <= agent.durable).then_some(agent.durable);
                (Some(durable), false)
            } else if state.buffer.rows() + shared.unwritten_rows.load(Ordering::Relaxed)
                >= shared.max_unwritten_rows
            {
                drop(guard);
                shared.flush_now.notify_one();
                warn!(
                    node,
                    agent_id, "store behind: batch refused until it catches up"
                );
                // The agent keeps the batch and retries after a backoff.
                return Err(Status::resource_exhausted(format!(
                    "the collector holds {} rows not yet written to the store; retry later",
                    shared.max_unwritten_rows
                )));
            } else {
                if let Err(e) = state.wal.append_batch(agent_id, node, batch) {
                    drop(guard);
                    let e = LogUnavailable(e);
                    error!(node, agent_id, seq = batch.seq, error = %e, "batch not taken in");
                    // Ending the stream makes the agent resend from its last
                    // acknowledged batch, once the log works again.
                    return Err(Status::unavailable(e.to_string()));
                }
                agent.received = batch.seq;
                state.buffer.append(node, valid);
                state.unsynced.insert(agent_id.to_owned(), batch.seq);
                (None, state.buffer.rows() >= shared.flush_rows)
            }
        };
        if duplicate_of_durable.is_none() {
            shared.sync_wanted.notify_one();
        }
        match duplicate_of_durable {
            Some(durable) => {
                shared.stats.duplicates.fetch_add(1, Ordering::Relaxed);
                debug!(node, agent_id, seq = batch.seq, "duplicate batch dropped");
                if let Some(seq) = durable {
                    let ack = message(collector_message::Kind::Ack(Ack { seq }));
                    let _ = self.tx.send(Ok(ack)).await;
                }
            }
            None => {
                shared.to_alerts(node, batch);
                shared.stats.batches.fetch_add(1, Ordering::Relaxed);
                shared.stats.rows.fetch_add(rows as u64, Ordering::Relaxed);
                if full {
                    shared.flush_now.notify_one();
                }
            }
        }
        Ok(())
    }

    /// A message could not be received. A message that could not be decoded
    /// (too large, malformed) is the agent's to hear about; a connection that
    /// went away is not worth more than a debug line.
    async fn end_with(&self, status: Status) {
        match status.code() {
            Code::OutOfRange | Code::Internal | Code::InvalidArgument | Code::ResourceExhausted => {
                self.fail(status).await;
            }
            _ => debug!(peer = %self.peer, %status, "stream ended"),
        }
    }

    async fn fail(&self, status: Status) {
        warn!(peer = %self.peer, status = %status.message(), "stream refused");
        let _ = self.tx.send(Err(status)).await;
    }
}
