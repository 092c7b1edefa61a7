//! gRPC ingest: one task per agent stream. Validates each batch, drops
//! sequences already received, appends the rest to the write buffer, and sends
//! acknowledgements once the persister reports them durable.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gputel_proto::v1::telemetry_server::Telemetry;
use gputel_proto::v1::{Ack, Reject, Welcome};
use gputel_proto::{AgentMessage, CollectorMessage, agent_message, collector_message};
use tokio::sync::{Notify, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

use crate::buffer::WriteBuffer;
use crate::clock::Clock;
use crate::validate::{validate_batch, validate_hello};

/// How long a new stream may take to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages queued towards one agent (acks, rejects) before new ones are
/// dropped; acks are cumulative, so a dropped one is covered by the next.
const OUTBOUND_QUEUE: usize = 256;

type Outbound = mpsc::Sender<Result<CollectorMessage, Status>>;

/// State shared by the stream tasks and the persister.
#[derive(Debug)]
pub struct Shared {
    state: Mutex<State>,
    /// Woken when the buffer holds `flush_rows` rows.
    pub flush_now: Notify,
    flush_rows: usize,
    draining: AtomicBool,
    clock: Clock,
    next_session: AtomicU64,
    /// Counters reported in logs.
    pub stats: Stats,
}

/// Running totals since start.
#[derive(Debug, Default)]
pub struct Stats {
    pub batches: AtomicU64,
    pub rows: AtomicU64,
    pub duplicates: AtomicU64,
    pub rejected: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    buffer: WriteBuffer,
    agents: HashMap<String, AgentState>,
    /// Highest sequence appended per agent since the persister last took the buffer.
    appended: HashMap<String, u64>,
}

#[derive(Debug, Default)]
struct AgentState {
    /// Highest sequence appended to the buffer.
    received: u64,
    /// Highest sequence written to the store.
    durable: u64,
    session: Option<(u64, Outbound)>,
}

/// What the persister takes in one go: the rows, and the acknowledgements it
/// may send once they are stored.
#[derive(Debug, Default)]
pub struct Taken {
    pub buffer: WriteBuffer,
    pub acks: HashMap<String, u64>,
}

impl Shared {
    pub fn new(flush_rows: usize, clock: Clock) -> Self {
        Self {
            state: Mutex::default(),
            flush_now: Notify::new(),
            flush_rows,
            draining: AtomicBool::new(false),
            clock,
            next_session: AtomicU64::new(1),
            stats: Stats::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind, still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the buffered rows and the acknowledgements they carry.
    pub fn take(&self) -> Taken {
        let mut state = self.lock();
        Taken {
            buffer: std::mem::take(&mut state.buffer),
            acks: std::mem::take(&mut state.appended),
        }
    }

    /// Rows buffered now.
    pub fn buffered_rows(&self) -> usize {
        self.lock().buffer.rows()
    }

    /// Records that these sequences are stored and tells connected agents.
    pub fn mark_durable(&self, acks: HashMap<String, u64>) {
        let mut state = self.lock();
        for (agent_id, seq) in acks {
            let Some(agent) = state.agents.get_mut(&agent_id) else {
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

    /// Stops accepting batches: they are left to the agents to resend.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
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
}

impl IngestService {
    /// `closing` turns true when every stream should end (after the last flush).
    pub fn new(shared: Arc<Shared>, closing: watch::Receiver<bool>) -> Self {
        Self { shared, closing }
    }
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
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE);
        let session = Session {
            shared: Arc::clone(&self.shared),
            tx,
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
        let durable = {
            let mut state = self.shared.lock();
            let agent = state.agents.entry(hello.agent_id.clone()).or_default();
            agent.session = Some((self.id, self.tx.clone()));
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
                })) => self.on_batch(&hello.node, &hello.agent_id, &batch).await,
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

    async fn on_batch(&self, node: &str, agent_id: &str, batch: &gputel_proto::Batch) {
        let shared = &self.shared;
        if shared.draining.load(Ordering::SeqCst) {
            return;
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
                return;
            }
        };
        let rows = batch.gpu.len() + batch.node.len() + batch.ib.len();
        let (duplicate_of_durable, full) = {
            let mut state = shared.lock();
            let state = &mut *state;
            let agent = state.agents.entry(agent_id.to_owned()).or_default();
            if batch.seq <= agent.received {
                let durable = (batch.seq <= agent.durable).then_some(agent.durable);
                (Some(durable), false)
            } else {
                agent.received = batch.seq;
                state.buffer.append(node, valid);
                state.appended.insert(agent_id.to_owned(), batch.seq);
                (None, state.buffer.rows() >= shared.flush_rows)
            }
        };
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
                shared.stats.batches.fetch_add(1, Ordering::Relaxed);
                shared.stats.rows.fetch_add(rows as u64, Ordering::Relaxed);
                if full {
                    shared.flush_now.notify_one();
                }
            }
        }
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
