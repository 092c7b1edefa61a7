//! gRPC ingest: one task per agent stream. Checks the hello and the
//! client's certificate, validates each batch, hands it to the write path,
//! and sends the agent its welcome, acks and rejects.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use gputel_proto::v1::telemetry_server::Telemetry;
use gputel_proto::v1::{Ack, Hello, Reject, Welcome};
use gputel_proto::wire::{Census, Kind, RawAgentMessage, census};
use gputel_proto::{AgentMessage, CollectorMessage, agent_message, collector_message};
use prost::Message as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tonic::{Code, Request, Response, Status, Streaming};
use tracing::{debug, error, info, warn};

use crate::log_throttle::{LogThrottle, root_cause};
use crate::silence::StreamEnd;
use crate::validate::{canonical_node, validate_batch, validate_hello};
use crate::write::{Accepted, AckSink, Refused, WritePath};

/// How long a new stream may take to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages queued towards one agent (acks, rejects) before new ones are
/// dropped; acks are cumulative, so a dropped one is covered by the next.
const OUTBOUND_QUEUE: usize = 256;
/// While batches are refused for want of room (rate, store, log), one line
/// per cause per this interval, with a count: every agent retries, so one
/// line per refused batch would be thousands a minute.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// What a stream's task queues for its agent: an ack, nearly every
/// message, as its sequence number, anything else boxed. tokio's channel
/// takes its slots 32 at a time for each stream, so a slot's size is paid
/// for every agent connected: 16 bytes here, 40 for the message itself.
#[derive(Debug)]
enum Outgoing {
    Ack(u64),
    Other(Box<Result<CollectorMessage, Status>>),
}

impl Outgoing {
    fn message(message: Result<CollectorMessage, Status>) -> Self {
        Outgoing::Other(Box::new(message))
    }
}

type Outbound = mpsc::Sender<Outgoing>;

/// The stream of messages to one agent, as tonic sends them.
#[derive(Debug)]
pub struct Outbox(mpsc::Receiver<Outgoing>);

impl tokio_stream::Stream for Outbox {
    type Item = Result<CollectorMessage, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|next| {
            next.map(|outgoing| match outgoing {
                Outgoing::Ack(seq) => Ok(message(collector_message::Kind::Ack(Ack { seq }))),
                Outgoing::Other(other) => *other,
            })
        })
    }
}

/// Acks go straight into the stream's queue, never waiting.
#[derive(Debug)]
struct StreamAcks(Outbound);

impl AckSink for StreamAcks {
    fn ack(&self, seq: u64) -> bool {
        self.0.try_send(Outgoing::Ack(seq)).is_ok()
    }
}

fn message(kind: collector_message::Kind) -> CollectorMessage {
    CollectorMessage { kind: Some(kind) }
}

/// Memory for messages being decoded and taken in, shared by every stream.
///
/// A message's [`Census`] bounds what decoding it takes before anything is
/// allocated. A message above the per-message share is refused; otherwise
/// its stream waits until the share is free, and HTTP/2 flow control holds
/// the agent back meanwhile. The share is given back once the batch is in
/// the write buffer, which `--max-unwritten-rows` bounds in turn.
#[derive(Debug)]
pub struct InFlight {
    /// Free memory, in KiB.
    free_kib: Arc<Semaphore>,
    total_bytes: u64,
    per_message_bytes: u64,
}

impl InFlight {
    /// `total_bytes` for every stream together, at most `per_message_bytes`
    /// for one message (so for one stream, which decodes one at a time).
    pub fn new(total_bytes: u64, per_message_bytes: u64) -> Self {
        let per_message_bytes = per_message_bytes.min(total_bytes);
        Self {
            free_kib: Arc::new(Semaphore::new(kib(total_bytes) as usize)),
            total_bytes,
            per_message_bytes,
        }
    }

    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    pub fn per_message_bytes(&self) -> u64 {
        self.per_message_bytes
    }
}

fn kib(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX)
}

/// The gRPC service.
#[derive(Debug, Clone)]
pub struct IngestService {
    shared: Arc<WritePath>,
    closing: watch::Receiver<bool>,
    require_identity: bool,
    refusals: Arc<Mutex<LogThrottle>>,
    in_flight: Arc<InFlight>,
}

impl IngestService {
    /// `closing` turns true when every stream should end (after the last
    /// flush). With `require_identity` (mutual TLS), a stream may only write
    /// as the node its client certificate names.
    pub fn new(
        shared: Arc<WritePath>,
        closing: watch::Receiver<bool>,
        require_identity: bool,
        in_flight: Arc<InFlight>,
    ) -> Self {
        Self {
            shared,
            closing,
            require_identity,
            refusals: Arc::new(Mutex::new(LogThrottle::new(REFUSAL_LOG_INTERVAL))),
            in_flight,
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
    type StreamStream = Outbox;

    async fn stream(
        &self,
        request: Request<Streaming<RawAgentMessage>>,
    ) -> Result<Response<Self::StreamStream>, Status> {
        let peer = request
            .remote_addr()
            .map_or_else(|| "unknown peer".to_owned(), |a| a.to_string());
        // tonic's own copy, held only until the hello is checked.
        let certificate = if self.require_identity {
            match request.peer_certs().filter(|certs| !certs.is_empty()) {
                Some(certs) => Some(certs),
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
            peer,
            id: self.shared.new_session_id(),
            refusals: Arc::clone(&self.refusals),
            in_flight: Arc::clone(&self.in_flight),
        };
        tokio::spawn(session.run(inbound, self.closing.clone(), certificate));
        Ok(Response::new(Outbox(rx)))
    }
}

struct Session {
    shared: Arc<WritePath>,
    tx: Outbound,
    peer: String,
    id: u64,
    /// Shared by every session: refusals are logged per cause, not per batch.
    refusals: Arc<Mutex<LogThrottle>>,
    in_flight: Arc<InFlight>,
}

/// What a stream does after a message.
enum Step {
    /// Carries on, after sending the agent this, if anything.
    Next(Option<Outgoing>),
    /// Ends, telling the agent why.
    Fail(Status),
    /// Ends, with the status of a receive that failed, if one did.
    End(StreamEnd, Option<Status>),
}

/// What came off a stream.
enum Received {
    /// A decoded message, a batch's bytes as sent (see [`decode`]), and
    /// the memory granted to the message until it is dropped.
    Message(AgentMessage, Option<Bytes>, OwnedSemaphorePermit),
    /// A message larger, decoded, than one message may be.
    TooLarge(Census),
    /// The agent ended its stream.
    Closed,
    /// The collector is closing.
    End,
    Failed(Status),
}

/// The client's certificate chain under mutual TLS, as tonic holds it.
type PeerCerts = Arc<Vec<rustls_pki_types::CertificateDer<'static>>>;

impl Session {
    /// The stream's task, one per agent for as long as it streams. A plain
    /// fn that returns the future, so that its arguments are held once (an
    /// async fn holds them twice), with the hello's part in a future of its
    /// own that ends with it: what the task keeps for the stream's life is
    /// what the loop needs.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn holds its arguments twice, in every agent's task"
    )]
    fn run(
        self,
        mut inbound: Streaming<RawAgentMessage>,
        mut closing: watch::Receiver<bool>,
        certificate: Option<PeerCerts>,
    ) -> impl Future<Output = ()> + Send {
        async move {
            let greeted = Box::pin(self.greet(&mut inbound, &mut closing, certificate));
            let Some(Hello { node, agent_id, .. }) = greeted.await else {
                return;
            };
            self.serve(&node, &agent_id, &mut inbound, &mut closing)
                .await;
        }
    }

    /// Takes the stream's hello, checks it and the client's certificate,
    /// connects the agent and welcomes it; None when the stream ends there
    /// instead.
    async fn greet(
        &self,
        inbound: &mut Streaming<RawAgentMessage>,
        closing: &mut watch::Receiver<bool>,
        certificate: Option<PeerCerts>,
    ) -> Option<Hello> {
        let first = self.receive(inbound, closing);
        let mut hello = match tokio::time::timeout(HELLO_TIMEOUT, first).await {
            Ok(Received::Message(
                AgentMessage {
                    kind: Some(agent_message::Kind::Hello(hello)),
                },
                _raw,
                _memory,
            )) => hello,
            Ok(Received::End | Received::Closed) => return None,
            Ok(Received::Failed(status)) => {
                self.end_with(status).await;
                return None;
            }
            Ok(Received::TooLarge(census)) => {
                let reason = self.too_large(&census);
                self.fail(Status::invalid_argument(reason)).await;
                return None;
            }
            Ok(Received::Message(..)) => {
                self.fail(Status::failed_precondition(
                    "the first message on a stream must be a hello",
                ))
                .await;
                return None;
            }
            Err(_) => {
                self.fail(Status::deadline_exceeded("no hello within 10 s"))
                    .await;
                return None;
            }
        };
        if let Err(e) = validate_hello(&hello) {
            self.fail(Status::invalid_argument(e.to_string())).await;
            return None;
        }
        // One node, one name: NODE-A and node-a. are node-a, in the
        // certificate check, the agent id's owner and every stored row.
        let sent_node = std::mem::take(&mut hello.node);
        hello.node = canonical_node(&sent_node);
        if let Some(certs) = certificate
            && !certs
                .first()
                .is_some_and(|der| certificate_names(der, &hello.node))
        {
            self.fail(Status::permission_denied(format!(
                "this client's certificate does not name node {:?}; a node writes only as itself",
                hello.node
            )))
            .await;
            return None;
        }
        let durable = match self.shared.connect(
            &hello.node,
            &hello.agent_id,
            self.id,
            Arc::new(StreamAcks(self.tx.clone())),
        ) {
            Ok(durable) => durable,
            Err(e) => {
                self.fail(Status::permission_denied(e.to_string())).await;
                return None;
            }
        };
        if sent_node == hello.node {
            info!(peer = %self.peer, node = %hello.node, agent_id = %hello.agent_id, version = %hello.agent_version, durable_seq = durable, "agent connected");
        } else {
            info!(peer = %self.peer, node = %hello.node, sent_node = %sent_node, agent_id = %hello.agent_id, version = %hello.agent_version, durable_seq = durable, "agent connected (node name stored in canonical form)");
        }
        let welcome = message(collector_message::Kind::Welcome(Welcome {
            durable_seq: durable,
            collector_version: env!("CARGO_PKG_VERSION").to_owned(),
        }));
        self.send(Outgoing::message(Ok(welcome)))
            .await
            .then_some(hello)
    }

    /// Takes the batches that follow the hello until the stream ends.
    async fn serve(
        &self,
        node: &str,
        agent_id: &str,
        inbound: &mut Streaming<RawAgentMessage>,
        closing: &mut watch::Receiver<bool>,
    ) {
        self.shared.stream_opened(node);
        let end = loop {
            let received = self.receive(inbound, closing).await;
            match self.step(node, agent_id, received) {
                Step::Next(None) => {}
                Step::Next(Some(reply)) => {
                    self.send(reply).await;
                }
                Step::Fail(status) => {
                    self.fail(status).await;
                    break StreamEnd::Lost;
                }
                Step::End(end, failed) => {
                    if let Some(status) = failed {
                        self.end_with(status).await;
                    }
                    break end;
                }
            }
        };
        self.shared.stream_closed(node, end);
        self.shared.disconnect(agent_id, self.id);
        info!(peer = %self.peer, node, agent_id, "agent disconnected");
    }

    /// What the stream does after a message. Worked out without waiting,
    /// so that the message and its memory are dropped before anything is
    /// sent.
    fn step(&self, node: &str, agent_id: &str, received: Received) -> Step {
        match received {
            Received::Message(
                AgentMessage {
                    kind: Some(agent_message::Kind::Batch(batch)),
                },
                encoded,
                _memory,
            ) => {
                // The batch's bytes as sent, logged as they came.
                match self.on_batch(node, agent_id, &batch, encoded.as_deref()) {
                    Ok(reply) => Step::Next(reply),
                    Err(status) => Step::Fail(status),
                }
            }
            Received::Message(..) => Step::Fail(Status::failed_precondition(
                "only batches may follow the hello",
            )),
            Received::TooLarge(census) => {
                self.shared.heard(node, None);
                let reason = self.too_large(&census);
                match census.kind {
                    Kind::Batch { seq } => {
                        Step::Next(Some(self.rejection(node, agent_id, seq, reason)))
                    }
                    Kind::Hello | Kind::Empty => Step::Fail(Status::invalid_argument(reason)),
                }
            }
            // Only an agent that ends its stream itself stopped cleanly.
            Received::Closed => Step::End(StreamEnd::Closed, None),
            Received::End => Step::End(StreamEnd::Lost, None),
            Received::Failed(status) => Step::End(StreamEnd::Lost, Some(status)),
        }
    }

    /// The next message off the stream: counted, given its memory (waiting
    /// for it while other streams hold it), then decoded.
    async fn receive(
        &self,
        inbound: &mut Streaming<RawAgentMessage>,
        closing: &mut watch::Receiver<bool>,
    ) -> Received {
        let raw = tokio::select! {
            next = inbound.message() => match next {
                Ok(Some(RawAgentMessage(raw))) => raw,
                Ok(None) => return Received::Closed,
                Err(status) => return Received::Failed(status),
            },
            _ = closing.wait_for(|closing| *closing) => return Received::End,
        };
        let census = match census(&raw) {
            Ok(census) => census,
            Err(e) => return Received::Failed(Status::invalid_argument(e.to_string())),
        };
        let bound = census.decoded_bytes_bound();
        if bound > self.in_flight.per_message_bytes {
            return Received::TooLarge(census);
        }
        let free = &self.in_flight.free_kib;
        let memory = match Arc::clone(free).try_acquire_many_owned(kib(bound)) {
            Ok(memory) => memory,
            Err(_) => {
                if let Some(unlogged) = self.refusal_news("in-flight memory budget") {
                    warn!(
                        peer = %self.peer,
                        budget_bytes = self.in_flight.total_bytes,
                        unlogged,
                        "in-flight memory budget taken: streams wait for it before decoding"
                    );
                }
                // Boxed, as rare waits are (see `send`).
                let waited = Box::pin(async {
                    tokio::select! {
                        memory = Arc::clone(free).acquire_many_owned(kib(bound)) => memory.ok(),
                        _ = closing.wait_for(|closing| *closing) => None,
                    }
                });
                match waited.await {
                    Some(memory) => memory,
                    None => return Received::End,
                }
            }
        };
        match decode(&raw, &census) {
            Ok((message, encoded)) => Received::Message(message, encoded, memory),
            Err(e) => Received::Failed(Status::invalid_argument(format!("malformed message: {e}"))),
        }
    }

    /// Why a message is refused for its decoded size.
    fn too_large(&self, census: &Census) -> String {
        format!(
            "message of {} bytes with {} rows would take up to {} MiB decoded, above the {} MiB \
             one message may take; send fewer rows per batch",
            census.bytes,
            census.rows(),
            census.decoded_bytes_bound().div_ceil(1 << 20),
            self.in_flight.per_message_bytes >> 20,
        )
    }

    /// Takes a batch in; what to send the agent for it (acks come from the
    /// write path once the batch is durable), or why the stream ends.
    fn on_batch(
        &self,
        node: &str,
        agent_id: &str,
        batch: &gputel_proto::Batch,
        encoded: Option<&[u8]>,
    ) -> Result<Option<Outgoing>, Status> {
        let shared = &self.shared;
        if shared.is_draining() {
            return Ok(None);
        }
        let valid = validate_batch(batch, shared.clock().now_us());
        // Heard from, whatever becomes of the batch; a valid one also tells
        // the node's interval.
        shared.heard(node, valid.as_ref().ok().map(|v| v.get()));
        let valid = match valid {
            Ok(valid) => valid,
            Err(e) => {
                return Ok(Some(self.rejection(
                    node,
                    agent_id,
                    batch.seq,
                    e.to_string(),
                )));
            }
        };
        match shared.accept(node, agent_id, valid, encoded) {
            Ok(Accepted::New) => Ok(None),
            Ok(Accepted::Duplicate(durable)) => {
                debug!(node, agent_id, seq = batch.seq, "duplicate batch dropped");
                Ok(durable.map(Outgoing::Ack))
            }
            Err(Refused::Sequence(e)) => Ok(Some(self.rejection(
                node,
                agent_id,
                batch.seq,
                e.to_string(),
            ))),
            // The agent keeps the batch and retries after a backoff.
            Err(e @ Refused::OverRate { .. }) => {
                if let Some(unlogged) = self.refusal_news("over its rate") {
                    warn!(
                        node,
                        agent_id, unlogged, "agent over its rate: batch refused"
                    );
                }
                Err(Status::resource_exhausted(e.to_string()))
            }
            Err(e @ Refused::StoreBehind { .. }) => {
                if let Some(unlogged) = self.refusal_news("store behind") {
                    warn!(
                        node,
                        agent_id, unlogged, "store behind: batch refused until it catches up"
                    );
                }
                Err(Status::resource_exhausted(e.to_string()))
            }
            // Ending the stream makes the agent resend from its last
            // acknowledged batch, once the log works again.
            Err(Refused::Log(e)) => {
                let cause = if e.is_low_space() {
                    "free space below the watermark".to_owned()
                } else {
                    root_cause(&e)
                };
                if let Some(unlogged) = self.refusal_news(&cause) {
                    error!(node, agent_id, seq = batch.seq, unlogged, error = %e, "batch not taken in; further refusals for this cause are counted, logged once a minute");
                }
                Err(Status::unavailable(e.to_string()))
            }
        }
    }

    /// Whether a refusal for `cause` is to be logged now, and how many went
    /// unlogged since the last line for it.
    fn refusal_news(&self, cause: &str) -> Option<u64> {
        self.refusals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .occurred(cause, Instant::now())
    }

    /// Refuses one batch for good: the agent drops it and logs the reason;
    /// the stream carries on. Returns the message that tells the agent.
    fn rejection(&self, node: &str, agent_id: &str, seq: u64, reason: String) -> Outgoing {
        self.shared.count_rejected();
        warn!(node, agent_id, seq, reason, "batch rejected");
        Outgoing::message(Ok(message(collector_message::Kind::Reject(Reject {
            seq,
            reason,
        }))))
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
        self.send(Outgoing::message(Err(status))).await;
    }

    /// Queues a message for the agent, waiting while its queue is full;
    /// false once the agent's side is gone. The wait is boxed: it is rare (a
    /// welcome, a reject, a stream's last status), and inline it would take
    /// room in every stream's task for the stream's whole life.
    async fn send(&self, outgoing: Outgoing) -> bool {
        Box::pin(self.tx.send(outgoing)).await.is_ok()
    }
}

/// Decodes a message its census counted, with the bytes of its batch as
/// sent when the batch is the message's one field 2 (the collector logs
/// those instead of encoding the decoded batch again). Such a batch is
/// decoded into vectors sized by the census, so that its rows are not moved
/// as the vectors grow (a `GpuSample` is about 1 KiB: eight of them were
/// four allocations and seven rows copied); anything else as prost decodes
/// it. Both give the same message.
pub fn decode(
    raw: &Bytes,
    census: &Census,
) -> Result<(AgentMessage, Option<Bytes>), prost::DecodeError> {
    let batch_bytes = match census.kind {
        Kind::Batch { .. } => gputel_proto::wire::single_field(raw, 2),
        Kind::Hello | Kind::Empty => None,
    };
    let Some(batch_bytes) = batch_bytes.map(|b| raw.slice_ref(b)) else {
        return Ok((AgentMessage::decode(raw.clone())?, None));
    };
    let capacity = |rows: u64| usize::try_from(rows).unwrap_or(0);
    let mut batch = gputel_proto::Batch {
        gpu: Vec::with_capacity(capacity(census.gpu)),
        node: Vec::with_capacity(capacity(census.node)),
        ib: Vec::with_capacity(capacity(census.ib)),
        event: Vec::with_capacity(capacity(census.event)),
        gpu_process: Vec::with_capacity(capacity(census.gpu_process)),
        ..Default::default()
    };
    batch.merge(batch_bytes.clone())?;
    let message = AgentMessage {
        kind: Some(agent_message::Kind::Batch(batch)),
    };
    Ok((message, Some(batch_bytes)))
}

#[cfg(test)]
mod tests {
    use gputel_proto::v1::Hello;
    use gputel_proto::{Batch, GpuSample, IbPortSample, NodeSample};

    use super::*;

    fn gpu(i: u32) -> GpuSample {
        GpuSample {
            ts_us: 1_795_240_800_000_000 + i64::from(i),
            gpu: i,
            uuid: format!("GPU-{i}"),
            model: "NVIDIA H100 80GB HBM3".to_owned(),
            job_id: i.is_multiple_of(2).then(|| format!("{}", 1000 + i)),
            ..Default::default()
        }
    }

    fn batch(seq: u64, gpus: u32) -> Batch {
        Batch {
            seq,
            gpu: (0..gpus).map(gpu).collect(),
            node: vec![NodeSample {
                ts_us: 1_795_240_800_000_000,
                jobs: vec!["1000".to_owned(), "1002".to_owned()],
                ..Default::default()
            }],
            ib: vec![IbPortSample::default(); 3],
            ..Default::default()
        }
    }

    fn encoded(kind: agent_message::Kind) -> Vec<u8> {
        AgentMessage { kind: Some(kind) }.encode_to_vec()
    }

    #[test]
    fn a_batch_decodes_into_vectors_of_its_census_size_as_prost_decodes_it() {
        let hello = encoded(agent_message::Kind::Hello(Hello {
            node: "node-1".to_owned(),
            ..Default::default()
        }));
        let one = encoded(agent_message::Kind::Batch(batch(7, 8)));
        let other = encoded(agent_message::Kind::Batch(batch(8, 3)));
        let messages: Vec<Vec<u8>> = vec![
            one.clone(),
            // The batch field twice: prost merges both.
            [one.clone(), other.clone()].concat(),
            // A hello, then a batch: the last of the oneof wins.
            [hello.clone(), one.clone()].concat(),
            [one.clone(), hello.clone()].concat(),
            hello,
            encoded(agent_message::Kind::Batch(Batch::default())),
            Vec::new(),
        ];
        for message in messages {
            let raw = Bytes::from(message);
            let census = census(&raw).expect("census");
            let (ours, encoded) = decode(&raw, &census).expect("decodes");
            assert_eq!(ours, AgentMessage::decode(raw.clone()).expect("decodes"));
            assert_eq!(
                encoded.as_deref(),
                gputel_proto::wire::single_field(&raw, 2)
                    .filter(|_| matches!(ours.kind, Some(agent_message::Kind::Batch(_))))
            );
        }
        let raw = Bytes::from(one);
        let (decoded, encoded) = decode(&raw, &census(&raw).expect("census")).expect("decodes");
        assert_eq!(
            encoded.as_deref(),
            gputel_proto::wire::single_field(&raw, 2)
        );
        let Some(agent_message::Kind::Batch(decoded)) = decoded.kind else {
            panic!("a batch");
        };
        assert_eq!(decoded.gpu.capacity(), 8);
        assert_eq!(decoded.ib.capacity(), 3);
        assert_eq!(decoded.node.capacity(), 1);
    }

    #[test]
    fn a_malformed_batch_is_an_error_either_way() {
        let mut message = encoded(agent_message::Kind::Batch(batch(7, 2)));
        // Invalid UTF-8 in the first GPU's uuid: the census walks it, prost
        // refuses it.
        let at = message
            .windows(5)
            .position(|w| w == b"GPU-0")
            .expect("uuid bytes");
        message[at] = 0xff;
        let raw = Bytes::from(message);
        let census = census(&raw).expect("census");
        assert!(decode(&raw, &census).is_err());
        assert!(AgentMessage::decode(raw).is_err());
    }

    #[tokio::test]
    async fn the_outbox_sends_what_was_queued_in_order_acks_as_messages() {
        // A slot of the stream's queue holds an ack's number or a pointer.
        assert_eq!(std::mem::size_of::<Outgoing>(), 16);
        let (tx, rx) = mpsc::channel(8);
        let reject = message(collector_message::Kind::Reject(Reject {
            seq: 8,
            reason: "too old".to_owned(),
        }));
        for outgoing in [
            Outgoing::Ack(7),
            Outgoing::message(Ok(reject.clone())),
            Outgoing::Ack(9),
            Outgoing::message(Err(Status::invalid_argument("malformed message"))),
        ] {
            tx.send(outgoing).await.expect("queued");
        }
        drop(tx);
        let sent: Vec<_> = tokio_stream::StreamExt::collect(Outbox(rx)).await;
        let ack = |seq| message(collector_message::Kind::Ack(Ack { seq }));
        assert_eq!(sent.len(), 4);
        assert_eq!(sent[0].as_ref().ok(), Some(&ack(7)));
        assert_eq!(sent[1].as_ref().ok(), Some(&reject));
        assert_eq!(sent[2].as_ref().ok(), Some(&ack(9)));
        let status = sent[3].as_ref().expect_err("the last is a status");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "malformed message");
    }
}
