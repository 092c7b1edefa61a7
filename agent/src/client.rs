//! The gRPC side: one bidirectional stream to the collector. Batches stay in a
//! bounded in-memory queue until an acknowledgement covers them, and are
//! resent after every reconnect.

use std::collections::VecDeque;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use gputel_proto::v1::telemetry_client::TelemetryClient;
use gputel_proto::{AgentMessage, Batch, Hello, agent_message, collector_message};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;
use tracing::{debug, error, info, warn};

/// Messages handed to the gRPC transport ahead of the network.
const SEND_WINDOW: usize = 32;
/// How long a connection attempt, or the collector's welcome, may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Who this agent is, for the hello.
#[derive(Debug, Clone)]
pub struct Identity {
    pub node: String,
    pub agent_id: String,
    pub boot_id: String,
}

/// What the stream did over its life.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// Batches handed over by the sampler.
    pub produced: u64,
    /// Batches the collector acknowledged as durable.
    pub acknowledged: u64,
    /// Batches the collector refused as invalid.
    pub rejected: u64,
    /// Batches dropped because the queue was full while the collector was away.
    pub dropped: u64,
    /// Batches still unacknowledged when the agent stopped.
    pub unacknowledged: u64,
    /// Rows in acknowledged batches, per table.
    pub acknowledged_rows: TableRows,
}

/// Row counts per table.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TableRows {
    pub gpu: u64,
    pub node: u64,
    pub ib: u64,
}

/// Why a connection ended.
#[derive(Debug, thiserror::Error)]
enum StreamError {
    #[error("cannot connect: {0}")]
    Connect(#[from] tonic::transport::Error),
    #[error("collector refused the stream: {0}")]
    Status(#[from] tonic::Status),
    #[error("no welcome from the collector within {CONNECT_TIMEOUT:?}")]
    WelcomeTimeout,
    #[error("collector closed the stream")]
    Closed,
    #[error("collector sent {0} where a welcome was expected")]
    Protocol(&'static str),
}

/// Streams batches from `batches` to the collector at `endpoint` until the
/// channel closes and everything is acknowledged (or `drain_timeout` passes).
pub async fn run(
    endpoint: Endpoint,
    identity: Identity,
    mut batches: mpsc::Receiver<Batch>,
    max_pending: usize,
    drain_timeout: Duration,
) -> Delivery {
    let mut queue = Queue::new(max_pending);
    let mut backoff = new_backoff();
    let mut drain_deadline: Option<Instant> = None;
    loop {
        match connect(&endpoint, &identity).await {
            Ok((tx, responses, durable)) => {
                backoff = new_backoff();
                queue.acknowledge(durable);
                info!(collector = %endpoint.uri(), durable_seq = durable, pending = queue.len(), "connected");
                let ended = stream(
                    tx,
                    responses,
                    &mut batches,
                    &mut queue,
                    &mut drain_deadline,
                    drain_timeout,
                )
                .await;
                match ended {
                    Ended::Done => break,
                    Ended::Lost(e) => {
                        warn!(collector = %endpoint.uri(), error = %e, pending = queue.len(), "stream lost; reconnecting")
                    }
                }
            }
            Err(e) => {
                warn!(collector = %endpoint.uri(), error = %e, pending = queue.len(), "collector unreachable")
            }
        }
        let delay = backoff.next().unwrap_or(Duration::from_secs(30));
        let wake = Instant::now() + delay;
        // While waiting, keep taking batches so the sampler never blocks.
        loop {
            if drain_deadline.is_some_and(|d| Instant::now() >= d) {
                queue.delivery.unacknowledged = queue.len() as u64;
                return queue.delivery;
            }
            let until = drain_deadline.map_or(wake, |d| d.min(wake));
            tokio::select! {
                batch = batches.recv(), if drain_deadline.is_none() => match batch {
                    Some(batch) => {
                        queue.push(batch);
                    }
                    None => {
                        if queue.is_empty() {
                            return queue.delivery;
                        }
                        drain_deadline = Some(Instant::now() + drain_timeout);
                    }
                },
                _ = tokio::time::sleep_until(until) => {
                    if Instant::now() >= wake {
                        break;
                    }
                }
            }
        }
    }
    queue.delivery.unacknowledged = queue.len() as u64;
    queue.delivery
}

fn new_backoff() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(30))
        .with_jitter()
        .without_max_times()
        .build()
}

type Responses = tonic::Streaming<gputel_proto::CollectorMessage>;

async fn connect(
    endpoint: &Endpoint,
    identity: &Identity,
) -> Result<(mpsc::Sender<AgentMessage>, Responses, u64), StreamError> {
    let channel = endpoint.connect().await?;
    let mut client = TelemetryClient::new(channel)
        .max_decoding_message_size(gputel_proto::DEFAULT_MAX_MESSAGE_BYTES);
    let (tx, rx) = mpsc::channel(SEND_WINDOW);
    let hello = AgentMessage {
        kind: Some(agent_message::Kind::Hello(Hello {
            node: identity.node.clone(),
            agent_id: identity.agent_id.clone(),
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            boot_id: identity.boot_id.clone(),
        })),
    };
    tx.send(hello).await.map_err(|_| StreamError::Closed)?;
    let mut responses = client.stream(ReceiverStream::new(rx)).await?.into_inner();
    let first = tokio::time::timeout(CONNECT_TIMEOUT, responses.message())
        .await
        .map_err(|_| StreamError::WelcomeTimeout)??;
    match first.and_then(|m| m.kind) {
        Some(collector_message::Kind::Welcome(w)) => Ok((tx, responses, w.durable_seq)),
        Some(collector_message::Kind::Ack(_)) => Err(StreamError::Protocol("an ack")),
        Some(collector_message::Kind::Reject(_)) => Err(StreamError::Protocol("a reject")),
        None => Err(StreamError::Closed),
    }
}

enum Ended {
    /// Input closed and everything acknowledged, or the drain deadline passed.
    Done,
    Lost(StreamError),
}

async fn stream(
    tx: mpsc::Sender<AgentMessage>,
    mut responses: Responses,
    batches: &mut mpsc::Receiver<Batch>,
    queue: &mut Queue,
    drain_deadline: &mut Option<Instant>,
    drain_timeout: Duration,
) -> Ended {
    // Everything in the queue is unsent on this new stream.
    let mut next_send = 0usize;
    loop {
        if drain_deadline.is_some() && queue.is_empty() {
            return Ended::Done;
        }
        let has_unsent = next_send < queue.len();
        let deadline = drain_deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            permit = tx.reserve(), if has_unsent => {
                let Ok(permit) = permit else { return Ended::Lost(StreamError::Closed) };
                if let Some(batch) = queue.get(next_send) {
                    permit.send(AgentMessage { kind: Some(agent_message::Kind::Batch(batch.clone())) });
                    next_send += 1;
                }
            }
            batch = batches.recv(), if drain_deadline.is_none() => match batch {
                Some(batch) => {
                    if queue.push(batch) {
                        // The oldest batch was evicted from in front of the send position.
                        next_send = next_send.saturating_sub(1);
                    }
                }
                None => *drain_deadline = Some(Instant::now() + drain_timeout),
            },
            message = responses.message() => match message {
                Ok(Some(message)) => match message.kind {
                    Some(collector_message::Kind::Ack(ack)) => {
                        let removed = queue.acknowledge(ack.seq);
                        next_send = next_send.saturating_sub(removed);
                    }
                    Some(collector_message::Kind::Reject(reject)) => {
                        error!(seq = reject.seq, reason = %reject.reason, "collector rejected a batch; it is dropped");
                        if let Some(pos) = queue.reject(reject.seq)
                            && pos < next_send
                        {
                            next_send -= 1;
                        }
                    }
                    Some(collector_message::Kind::Welcome(_)) | None => {
                        debug!("unexpected message from the collector ignored");
                    }
                },
                Ok(None) => return Ended::Lost(StreamError::Closed),
                Err(status) => return Ended::Lost(StreamError::Status(status)),
            },
            _ = tokio::time::sleep_until(deadline), if drain_deadline.is_some() => {
                warn!(unacknowledged = queue.len(), "drain timeout passed with batches unacknowledged");
                return Ended::Done;
            }
        }
    }
}

/// Unacknowledged batches in sequence order, bounded.
#[derive(Debug)]
struct Queue {
    batches: VecDeque<Batch>,
    max: usize,
    delivery: Delivery,
}

impl Queue {
    fn new(max: usize) -> Self {
        Self {
            batches: VecDeque::new(),
            max,
            delivery: Delivery::default(),
        }
    }

    fn len(&self) -> usize {
        self.batches.len()
    }

    fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    fn get(&self, i: usize) -> Option<&Batch> {
        self.batches.get(i)
    }

    /// Adds a batch; returns true if the oldest was dropped to make room.
    fn push(&mut self, batch: Batch) -> bool {
        self.delivery.produced += 1;
        self.batches.push_back(batch);
        if self.batches.len() > self.max {
            if let Some(old) = self.batches.pop_front() {
                self.delivery.dropped += 1;
                warn!(
                    seq = old.seq,
                    dropped_total = self.delivery.dropped,
                    "pending queue full: oldest batch dropped"
                );
            }
            return true;
        }
        false
    }

    /// Drops every batch with seq <= `seq`; returns how many.
    fn acknowledge(&mut self, seq: u64) -> usize {
        let before = self.batches.len();
        while self.batches.front().is_some_and(|b| b.seq <= seq) {
            let Some(batch) = self.batches.pop_front() else {
                break;
            };
            let rows = &mut self.delivery.acknowledged_rows;
            rows.gpu += batch.gpu.len() as u64;
            rows.node += batch.node.len() as u64;
            rows.ib += batch.ib.len() as u64;
        }
        let removed = before - self.batches.len();
        self.delivery.acknowledged += removed as u64;
        removed
    }

    /// Drops the batch `seq`; returns its position.
    fn reject(&mut self, seq: u64) -> Option<usize> {
        let pos = self.batches.iter().position(|b| b.seq == seq)?;
        self.batches.remove(pos);
        self.delivery.rejected += 1;
        Some(pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(seq: u64) -> Batch {
        Batch {
            seq,
            ..Default::default()
        }
    }

    #[test]
    fn queue_drops_oldest_when_full_and_counts_it() {
        let mut q = Queue::new(2);
        assert!(!q.push(batch(1)));
        assert!(!q.push(batch(2)));
        assert!(q.push(batch(3)));
        assert_eq!(q.batches.iter().map(|b| b.seq).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(q.delivery.dropped, 1);
        assert_eq!(q.delivery.produced, 3);
    }

    #[test]
    fn acks_are_cumulative_and_rejects_remove_one() {
        let mut q = Queue::new(10);
        for seq in 1..=5 {
            q.push(batch(seq));
        }
        assert_eq!(q.acknowledge(2), 2);
        assert_eq!(q.acknowledge(2), 0);
        assert_eq!(q.reject(4), Some(1));
        assert_eq!(q.batches.iter().map(|b| b.seq).collect::<Vec<_>>(), [3, 5]);
        assert_eq!(q.acknowledge(5), 2);
        assert_eq!(
            q.delivery,
            Delivery {
                produced: 5,
                acknowledged: 4,
                rejected: 1,
                dropped: 0,
                unacknowledged: 0,
                acknowledged_rows: TableRows::default(),
            }
        );
    }
}
