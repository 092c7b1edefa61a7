//! gRPC ingest: one task per agent stream. Checks the hello and the
//! client's certificate, validates each batch, hands it to the write path,
//! and sends the agent its welcome, acks and rejects.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use gputel_proto::v1::telemetry_server::Telemetry;
use gputel_proto::v1::{Ack, Reject, Welcome};
use gputel_proto::wire::{Census, Kind, RawAgentMessage, census};
use gputel_proto::{AgentMessage, CollectorMessage, agent_message, collector_message};
use prost::Message as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
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

type Outbound = mpsc::Sender<Result<CollectorMessage, Status>>;

/// Acks go straight into the stream's queue, never waiting.
#[derive(Debug)]
struct StreamAcks(Outbound);

impl AckSink for StreamAcks {
    fn ack(&self, seq: u64) -> bool {
        let ack = message(collector_message::Kind::Ack(Ack { seq }));
        self.0.try_send(Ok(ack)).is_ok()
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
    type StreamStream = ReceiverStream<Result<CollectorMessage, Status>>;

    async fn stream(
        &self,
        request: Request<Streaming<RawAgentMessage>>,
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
            id: self.shared.new_session_id(),
            refusals: Arc::clone(&self.refusals),
            in_flight: Arc::clone(&self.in_flight),
        };
        tokio::spawn(session.run(inbound, self.closing.clone()));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

struct Session {
    shared: Arc<WritePath>,
    tx: Outbound,
    /// The client's certificate (DER) under mutual TLS.
    certificate: Option<Vec<u8>>,
    peer: String,
    id: u64,
    /// Shared by every session: refusals are logged per cause, not per batch.
    refusals: Arc<Mutex<LogThrottle>>,
    in_flight: Arc<InFlight>,
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

impl Session {
    async fn run(
        self,
        mut inbound: Streaming<RawAgentMessage>,
        mut closing: watch::Receiver<bool>,
    ) {
        let first = self.receive(&mut inbound, &mut closing);
        let mut hello = match tokio::time::timeout(HELLO_TIMEOUT, first).await {
            Ok(Received::Message(
                AgentMessage {
                    kind: Some(agent_message::Kind::Hello(hello)),
                },
                _raw,
                _memory,
            )) => hello,
            Ok(Received::End | Received::Closed) => return,
            Ok(Received::Failed(status)) => return self.end_with(status).await,
            Ok(Received::TooLarge(census)) => {
                let reason = self.too_large(&census);
                return self.fail(Status::invalid_argument(reason)).await;
            }
            Ok(Received::Message(..)) => {
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
        // One node, one name: NODE-A and node-a. are node-a, in the
        // certificate check, the agent id's owner and every stored row.
        let sent_node = std::mem::take(&mut hello.node);
        hello.node = canonical_node(&sent_node);
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
        let durable = match self.shared.connect(
            &hello.node,
            &hello.agent_id,
            self.id,
            Arc::new(StreamAcks(self.tx.clone())),
        ) {
            Ok(durable) => durable,
            Err(e) => return self.fail(Status::permission_denied(e.to_string())).await,
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
        if self.tx.send(Ok(welcome)).await.is_err() {
            return;
        }
        self.shared.stream_opened(&hello.node);
        // Only an agent that ends its stream itself stopped cleanly.
        let mut end = StreamEnd::Lost;
        loop {
            match self.receive(&mut inbound, &mut closing).await {
                Received::Message(
                    AgentMessage {
                        kind: Some(agent_message::Kind::Batch(batch)),
                    },
                    encoded,
                    _memory,
                ) => {
                    // The batch's bytes as sent, logged as they came.
                    if let Err(status) = self
                        .on_batch(&hello.node, &hello.agent_id, &batch, encoded.as_deref())
                        .await
                    {
                        self.fail(status).await;
                        break;
                    }
                }
                Received::Message(..) => {
                    self.fail(Status::failed_precondition(
                        "only batches may follow the hello",
                    ))
                    .await;
                    break;
                }
                Received::TooLarge(census) => {
                    self.shared.heard(&hello.node, None);
                    let reason = self.too_large(&census);
                    match census.kind {
                        Kind::Batch { seq } => {
                            self.reject(&hello.node, &hello.agent_id, seq, reason).await;
                        }
                        Kind::Hello | Kind::Empty => {
                            self.fail(Status::invalid_argument(reason)).await;
                            break;
                        }
                    }
                }
                Received::Closed => {
                    end = StreamEnd::Closed;
                    break;
                }
                Received::End => break,
                Received::Failed(status) => {
                    self.end_with(status).await;
                    break;
                }
            }
        }
        self.shared.stream_closed(&hello.node, end);
        self.shared.disconnect(&hello.agent_id, self.id);
        info!(peer = %self.peer, node = %hello.node, agent_id = %hello.agent_id, "agent disconnected");
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
        let free = Arc::clone(&self.in_flight.free_kib);
        let memory = match free.clone().try_acquire_many_owned(kib(bound)) {
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
                tokio::select! {
                    memory = free.acquire_many_owned(kib(bound)) => match memory {
                        Ok(memory) => memory,
                        Err(_) => return Received::End,
                    },
                    _ = closing.wait_for(|closing| *closing) => return Received::End,
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

    async fn on_batch(
        &self,
        node: &str,
        agent_id: &str,
        batch: &gputel_proto::Batch,
        encoded: Option<&[u8]>,
    ) -> Result<(), Status> {
        let shared = &self.shared;
        if shared.is_draining() {
            return Ok(());
        }
        let valid = validate_batch(batch, shared.clock().now_us());
        // Heard from, whatever becomes of the batch; a valid one also tells
        // the node's interval.
        shared.heard(node, valid.as_ref().ok().map(|v| v.get()));
        let valid = match valid {
            Ok(valid) => valid,
            Err(e) => {
                self.reject(node, agent_id, batch.seq, e.to_string()).await;
                return Ok(());
            }
        };
        match shared.accept(node, agent_id, valid, encoded) {
            Ok(Accepted::New) => {}
            Ok(Accepted::Duplicate(durable)) => {
                debug!(node, agent_id, seq = batch.seq, "duplicate batch dropped");
                if let Some(seq) = durable {
                    let ack = message(collector_message::Kind::Ack(Ack { seq }));
                    let _ = self.tx.send(Ok(ack)).await;
                }
            }
            Err(Refused::Sequence(e)) => {
                self.reject(node, agent_id, batch.seq, e.to_string()).await
            }
            // The agent keeps the batch and retries after a backoff.
            Err(e @ Refused::OverRate { .. }) => {
                if let Some(unlogged) = self.refusal_news("over its rate") {
                    warn!(
                        node,
                        agent_id, unlogged, "agent over its rate: batch refused"
                    );
                }
                return Err(Status::resource_exhausted(e.to_string()));
            }
            Err(e @ Refused::StoreBehind { .. }) => {
                if let Some(unlogged) = self.refusal_news("store behind") {
                    warn!(
                        node,
                        agent_id, unlogged, "store behind: batch refused until it catches up"
                    );
                }
                return Err(Status::resource_exhausted(e.to_string()));
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
                return Err(Status::unavailable(e.to_string()));
            }
        }
        Ok(())
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
    /// the stream carries on.
    async fn reject(&self, node: &str, agent_id: &str, seq: u64, reason: String) {
        self.shared.count_rejected();
        warn!(node, agent_id, seq, reason, "batch rejected");
        let reject = message(collector_message::Kind::Reject(Reject { seq, reason }));
        let _ = self.tx.send(Ok(reject)).await;
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
}
