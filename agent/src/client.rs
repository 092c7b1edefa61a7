//! The gRPC side: one bidirectional stream to a collector. Batches stay in a
//! bounded in-memory queue until an acknowledgement covers them, and are
//! resent after every reconnect, to the same collector or, after a failover
//! ([`Collectors`]), to another.

use std::collections::VecDeque;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use gputel_proto::v1::telemetry_client::TelemetryClient;
use gputel_proto::{AgentMessage, Batch, Hello, agent_message, collector_message};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, error, info, warn};

use crate::collectors::Collectors;
use crate::spool::Spool;

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

/// What the stream did over its life. The counts are of this run's
/// batches, but for `earlier`; `rejected` and `dropped` count what this run
/// rejected and dropped.
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
    /// Batches an earlier run left unacknowledged in the spool.
    pub earlier: Earlier,
}

/// What became of the batches an earlier run left in the spool.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Earlier {
    /// How many there were at the start.
    pub pending: u64,
    /// Those the collector acknowledged in this run.
    pub acknowledged: u64,
    /// Those still unacknowledged when the agent stopped.
    pub unacknowledged: u64,
}

/// Row counts per table.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TableRows {
    pub gpu: u64,
    pub node: u64,
    pub ib: u64,
}

/// How long to wait after a permanent refusal, at first and at most: the
/// collector said no (a node name its certificate does not carry, an agent
/// id another node owns), so retrying at once cannot help, but an operator
/// may fix it (a new certificate, another --spool-dir) without restarting us.
const REFUSED_MIN_DELAY: Duration = Duration::from_secs(5);
const REFUSED_MAX_DELAY: Duration = Duration::from_secs(600);

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

impl StreamError {
    /// The collector's refusal of this agent as it is (its identity or its
    /// hello): retrying the same hello gets the same answer.
    fn refusal(&self) -> Option<&tonic::Status> {
        match self {
            StreamError::Status(status)
                if matches!(
                    status.code(),
                    tonic::Code::PermissionDenied
                        | tonic::Code::Unauthenticated
                        | tonic::Code::InvalidArgument
                        | tonic::Code::FailedPrecondition
                ) =>
            {
                Some(status)
            }
            _ => None,
        }
    }
}

/// An error with the chain of its causes, `a: b: c`: a transport error's
/// own words are "transport error", the reason (a certificate no trusted CA
/// signed, a refused connection) is in its sources.
struct Causes<'a>(&'a dyn std::error::Error);

impl std::fmt::Display for Causes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut shown = self.0.to_string();
        f.write_str(&shown)?;
        let mut next = self.0.source();
        while let Some(cause) = next {
            let text = cause.to_string();
            // Wrappers often repeat their source's words.
            if !shown.contains(&text) {
                write!(f, ": {text}")?;
                shown = text;
            }
            next = cause.source();
        }
        Ok(())
    }
}

/// Streams batches from `batches` to one of `collectors` until the channel
/// closes and everything is acknowledged (or `drain_timeout` passes).
/// Unacknowledged batches are kept in memory, at most `max_pending`.
pub async fn run(
    collectors: Collectors,
    identity: Identity,
    batches: mpsc::Receiver<Batch>,
    max_pending: usize,
    drain_timeout: Duration,
) -> Delivery {
    let queue = Queue::new(max_pending, None);
    run_queue(collectors, identity, batches, queue, drain_timeout).await
}

/// As [`run`], but with `max_pending` batches unacknowledged it takes no more
/// from `batches` until acknowledgements make room: the producer waits on
/// the channel instead of the oldest batch being dropped. For a producer
/// that must lose nothing and may wait (a load generator, a replay), not for
/// a sampler, which must never block.
pub async fn run_holding_back(
    collectors: Collectors,
    identity: Identity,
    batches: mpsc::Receiver<Batch>,
    max_pending: usize,
    drain_timeout: Duration,
) -> Delivery {
    let queue = Queue::new(max_pending, None).holding_back();
    run_queue(collectors, identity, batches, queue, drain_timeout).await
}

/// As [`run`], with unacknowledged batches kept in `spool` (memory holds only
/// the newest `max_in_memory`; older ones are read back from disk to resend).
pub async fn run_with_spool(
    collectors: Collectors,
    identity: Identity,
    batches: mpsc::Receiver<Batch>,
    spool: Spool,
    max_in_memory: usize,
    drain_timeout: Duration,
) -> Delivery {
    let queue = Queue::new(max_in_memory, Some(spool));
    run_queue(collectors, identity, batches, queue, drain_timeout).await
}

async fn run_queue(
    mut collectors: Collectors,
    identity: Identity,
    mut batches: mpsc::Receiver<Batch>,
    mut queue: Queue,
    drain_timeout: Duration,
) -> Delivery {
    let mut backoff = new_backoff();
    let mut refused_backoff = new_refused_backoff();
    let mut drain_deadline: Option<Instant> = None;
    loop {
        let mut delay = None;
        match collectors.next().await {
            None => {
                warn!(collectors = %collectors.urls(), pending = queue.len(), "no collector address resolves")
            }
            Some(collector) => match connect(&collector.endpoint, &identity).await {
                Ok((tx, responses, durable)) => {
                    collectors.connected();
                    backoff = new_backoff();
                    refused_backoff = new_refused_backoff();
                    queue.acknowledge(durable);
                    // A new stream resends from the lowest unacknowledged batch.
                    queue.from_disk.clear();
                    info!(collector = %collector.name, durable_seq = durable, pending = queue.len(), "connected");
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
                            warn!(collector = %collector.name, error = %Causes(&e), pending = queue.len(), "stream lost; reconnecting")
                        }
                    }
                }
                Err(e) => {
                    if let Some(status) = e.refusal() {
                        let wait = refused_backoff.next().unwrap_or(REFUSED_MAX_DELAY);
                        delay = Some(wait);
                        error!(
                            collector = %collector.name,
                            code = ?status.code(),
                            reason = %status.message(),
                            retry_in = ?wait,
                            pending = queue.len(),
                            "collector refused this agent; retrying less and less often (up to every {REFUSED_MAX_DELAY:?}) until the cause is fixed"
                        );
                    } else {
                        warn!(collector = %collector.name, error = %Causes(&e), pending = queue.len(), "collector unreachable");
                    }
                }
            },
        }
        // The next address at once, unless every one failed since the last
        // connection (or this one refused the agent): then wait.
        if !collectors.failed() && delay.is_none() {
            continue;
        }
        let delay = delay.unwrap_or_else(|| backoff.next().unwrap_or(Duration::from_secs(30)));
        if wait_taking_batches(
            delay,
            &mut batches,
            &mut queue,
            &mut drain_deadline,
            drain_timeout,
        )
        .await
        {
            return queue.finish();
        }
    }
    queue.finish()
}

/// Waits `delay` while taking batches, so the sampler never blocks; true
/// when the agent is done (its input closed with nothing left to send, or
/// the drain deadline passed).
async fn wait_taking_batches(
    delay: Duration,
    batches: &mut mpsc::Receiver<Batch>,
    queue: &mut Queue,
    drain_deadline: &mut Option<Instant>,
    drain_timeout: Duration,
) -> bool {
    let wake = Instant::now() + delay;
    loop {
        if drain_deadline.is_some_and(|d| Instant::now() >= d) {
            return true;
        }
        let until = drain_deadline.map_or(wake, |d| d.min(wake));
        tokio::select! {
            batch = batches.recv(), if drain_deadline.is_none() && !queue.holds_back() => match batch {
                Some(batch) => queue.push(batch),
                None => {
                    if queue.is_empty() {
                        return true;
                    }
                    *drain_deadline = Some(Instant::now() + drain_timeout);
                }
            },
            _ = tokio::time::sleep_until(until) => {
                if Instant::now() >= wake {
                    return false;
                }
            }
        }
    }
}

fn new_backoff() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(30))
        .with_jitter()
        .without_max_times()
        .build()
}

fn new_refused_backoff() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(REFUSED_MIN_DELAY)
        .with_max_delay(REFUSED_MAX_DELAY)
        .without_max_times()
        .build()
}

type Responses = tonic::Streaming<gputel_proto::CollectorMessage>;

async fn connect(
    endpoint: &tonic::transport::Endpoint,
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
    // Everything unacknowledged is unsent on this new stream: the cursor is
    // the lowest sequence number still to send.
    let mut cursor = 0u64;
    loop {
        if drain_deadline.is_some() && queue.is_empty() {
            return Ended::Done;
        }
        let has_unsent = queue.last_seq().is_some_and(|last| last >= cursor);
        let deadline = drain_deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            permit = tx.reserve(), if has_unsent => {
                let Ok(permit) = permit else { return Ended::Lost(StreamError::Closed) };
                if let Some(batch) = queue.next_from(cursor) {
                    cursor = batch.seq + 1;
                    permit.send(AgentMessage { kind: Some(agent_message::Kind::Batch(batch)) });
                } else {
                    // Nothing at or after the cursor is left (acknowledged meanwhile).
                    cursor = queue.last_seq().map_or(cursor, |last| last + 1);
                }
            }
            batch = batches.recv(), if drain_deadline.is_none() && !queue.holds_back() => match batch {
                Some(batch) => queue.push(batch),
                None => *drain_deadline = Some(Instant::now() + drain_timeout),
            },
            message = responses.message() => match message {
                Ok(Some(message)) => match message.kind {
                    Some(collector_message::Kind::Ack(ack)) => queue.acknowledge(ack.seq),
                    Some(collector_message::Kind::Reject(reject)) => {
                        error!(seq = reject.seq, reason = %reject.reason, "collector rejected a batch; it is dropped");
                        queue.reject(reject.seq);
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

/// Unacknowledged batches in sequence order: the newest in memory (at most
/// `max`), all of them in the spool when there is one.
#[derive(Debug)]
struct Queue {
    batches: VecDeque<Batch>,
    max: usize,
    /// At `max`, take no more batches rather than drop the oldest.
    hold_back: bool,
    spool: Option<Spool>,
    /// Batches read back from the spool for resending, in order.
    from_disk: VecDeque<Batch>,
    /// Sequence numbers rejected by the collector, skipped when resending.
    rejected: Vec<u64>,
    /// This run's first sequence number: lower ones are an earlier run's.
    first_of_run: u64,
    delivery: Delivery,
}

/// Batches read from the spool at a time when resending.
const SPOOL_READ: usize = 256;

impl Queue {
    fn new(max: usize, spool: Option<Spool>) -> Self {
        let first_of_run = spool.as_ref().map_or(1, Spool::next_seq);
        let earlier = Earlier {
            pending: spool.as_ref().map_or(0, Spool::len),
            ..Earlier::default()
        };
        Self {
            batches: VecDeque::new(),
            max,
            hold_back: false,
            spool,
            from_disk: VecDeque::new(),
            rejected: Vec::new(),
            first_of_run,
            delivery: Delivery {
                earlier,
                ..Delivery::default()
            },
        }
    }

    /// Makes a full queue hold the producer back instead of dropping.
    fn holding_back(mut self) -> Self {
        self.hold_back = true;
        // Room for one, or nothing would ever be taken.
        self.max = self.max.max(1);
        self
    }

    /// Whether to leave new batches in the channel until acknowledgements
    /// make room.
    fn holds_back(&self) -> bool {
        self.hold_back && self.batches.len() >= self.max
    }

    /// What was delivered, with what is left unacknowledged now.
    fn finish(&mut self) -> Delivery {
        let earlier = self.earlier_len();
        self.delivery.earlier.unacknowledged = earlier;
        self.delivery.unacknowledged = self.len() as u64 - earlier;
        self.delivery
    }

    /// Unacknowledged batches of earlier runs: in the spool only.
    fn earlier_len(&self) -> u64 {
        self.spool
            .as_ref()
            .map_or(0, |spool| spool.len_before(self.first_of_run))
    }

    /// Batches not yet acknowledged: the spooled ones, and any the spool
    /// could not take, which are in memory only.
    fn len(&self) -> usize {
        match &self.spool {
            Some(spool) => {
                let spooled_last = spool.next_seq() - 1;
                let memory_only = self.batches.iter().filter(|b| b.seq > spooled_last).count();
                spool.len() as usize + memory_only
            }
            None => self.batches.len(),
        }
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The newest unacknowledged sequence number (a batch the spool could
    /// not take is in memory only).
    fn last_seq(&self) -> Option<u64> {
        let in_memory = self.batches.back().map(|b| b.seq);
        match &self.spool {
            Some(spool) if !spool.is_empty() => in_memory.max(Some(spool.next_seq() - 1)),
            _ => in_memory,
        }
    }

    /// The first unacknowledged batch with sequence `cursor` or later.
    fn next_from(&mut self, cursor: u64) -> Option<Batch> {
        let in_memory =
            self.batches.front().is_some_and(|b| b.seq <= cursor) || self.spool.is_none();
        if in_memory {
            return self
                .batches
                .iter()
                .find(|b| b.seq >= cursor && !self.rejected.contains(&b.seq))
                .cloned();
        }
        // Older than memory holds: read it back from the spool.
        while self.from_disk.front().is_some_and(|b| b.seq < cursor) {
            self.from_disk.pop_front();
        }
        if self.from_disk.is_empty() {
            let spool = self.spool.as_ref()?;
            match spool.read_from(cursor, SPOOL_READ) {
                Ok(batches) => self.from_disk = batches.into(),
                Err(e) => {
                    warn!(error = %e, "cannot read the spool; resending from memory");
                    return self.batches.iter().find(|b| b.seq >= cursor).cloned();
                }
            }
        }
        while let Some(batch) = self.from_disk.pop_front() {
            if !self.rejected.contains(&batch.seq) {
                return Some(batch);
            }
        }
        None
    }

    /// Adds a batch: to the spool first, then to memory, evicting the oldest
    /// from memory past `max` (dropped and counted unless the spool has it).
    fn push(&mut self, batch: Batch) {
        self.delivery.produced += 1;
        let mut spooled = false;
        if let Some(spool) = &mut self.spool {
            match spool.append(&batch) {
                Ok(dropped) => {
                    spooled = true;
                    if dropped > 0 {
                        // Gone from disk means gone: memory must not resend them.
                        if let Some(first) = spool.first_seq() {
                            self.batches.retain(|b| b.seq >= first);
                        }
                        self.delivery.dropped += dropped;
                        warn!(
                            dropped,
                            dropped_total = self.delivery.dropped,
                            "spool full: oldest batches dropped"
                        );
                    }
                }
                Err(e) => {
                    warn!(seq = batch.seq, error = %e, "cannot spool a batch; it is kept in memory only")
                }
            }
        }
        self.batches.push_back(batch);
        if self.batches.len() > self.max
            && let Some(old) = self.batches.pop_front()
            && !spooled
        {
            self.delivery.dropped += 1;
            warn!(
                seq = old.seq,
                dropped_total = self.delivery.dropped,
                "pending queue full: oldest batch dropped"
            );
        }
    }

    /// Everything with seq <= `seq` is acknowledged.
    fn acknowledge(&mut self, seq: u64) {
        let before = self.len() as u64;
        let before_earlier = self.earlier_len();
        while self.batches.front().is_some_and(|b| b.seq <= seq) {
            let Some(batch) = self.batches.pop_front() else {
                break;
            };
            let rows = &mut self.delivery.acknowledged_rows;
            rows.gpu += batch.gpu.len() as u64;
            rows.node += batch.node.len() as u64;
            rows.ib += batch.ib.len() as u64;
        }
        self.from_disk.retain(|b| b.seq > seq);
        self.rejected.retain(|r| *r > seq);
        if let Some(spool) = &mut self.spool
            && let Err(e) = spool.acknowledge(seq)
        {
            warn!(error = %e, "cannot delete acknowledged spool segments");
        }
        let (after, after_earlier) = (self.len() as u64, self.earlier_len());
        self.delivery.earlier.acknowledged += before_earlier.saturating_sub(after_earlier);
        self.delivery.acknowledged +=
            (before - before_earlier).saturating_sub(after - after_earlier);
    }

    /// The collector refused `seq` for good: never send it again.
    fn reject(&mut self, seq: u64) {
        let before = self.batches.len();
        self.batches.retain(|b| b.seq != seq);
        self.from_disk.retain(|b| b.seq != seq);
        if self.spool.is_some() {
            // It stays on disk until its segment is acknowledged; skip it.
            self.rejected.push(seq);
        }
        if self.batches.len() < before || self.spool.is_some() {
            self.delivery.rejected += 1;
        }
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

    fn seqs(q: &Queue) -> Vec<u64> {
        q.batches.iter().map(|b| b.seq).collect()
    }

    #[test]
    fn refusals_back_off_exponentially_to_ten_minutes() {
        let delays: Vec<u64> = new_refused_backoff().take(9).map(|d| d.as_secs()).collect();
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 320, 600, 600]);
        let denied = StreamError::Status(tonic::Status::permission_denied("no"));
        assert_eq!(
            denied.refusal().map(tonic::Status::code),
            Some(tonic::Code::PermissionDenied)
        );
        let unavailable = StreamError::Status(tonic::Status::unavailable("disk full"));
        assert!(unavailable.refusal().is_none());
    }

    #[test]
    fn an_error_shows_its_causes_once_each() {
        let inner = std::io::Error::other("invalid peer certificate: UnknownIssuer");
        let outer = Wrapped(std::io::Error::other(Wrapped(inner)));
        assert_eq!(
            Causes(&outer).to_string(),
            "transport error: invalid peer certificate: UnknownIssuer"
        );
    }

    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("transport error")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn without_a_spool_a_full_queue_drops_the_oldest_and_counts_it() {
        let mut q = Queue::new(2, None);
        q.push(batch(1));
        q.push(batch(2));
        q.push(batch(3));
        assert_eq!(seqs(&q), [2, 3]);
        assert_eq!(q.delivery.dropped, 1);
        assert_eq!(q.delivery.produced, 3);
        assert_eq!(q.next_from(0).map(|b| b.seq), Some(2));
    }

    #[test]
    fn a_queue_holding_back_takes_no_more_until_an_ack_makes_room() {
        let mut q = Queue::new(2, None).holding_back();
        q.push(batch(1));
        assert!(!q.holds_back());
        q.push(batch(2));
        assert!(q.holds_back());
        q.acknowledge(1);
        assert!(!q.holds_back());
        q.push(batch(3));
        assert!(q.holds_back());
        assert_eq!(seqs(&q), [2, 3]);
        assert_eq!(q.delivery.dropped, 0);
        // A dropping queue never holds back, and no queue holds back at 0.
        let mut dropping = Queue::new(1, None);
        dropping.push(batch(1));
        assert!(!dropping.holds_back());
        assert!(!Queue::new(0, None).holding_back().holds_back());
    }

    #[tokio::test]
    async fn holding_back_leaves_batches_in_the_channel_while_disconnected() {
        let (tx, mut rx) = mpsc::channel(8);
        for seq in 1..=5 {
            tx.send(batch(seq)).await.unwrap();
        }
        let mut q = Queue::new(3, None).holding_back();
        let mut drain_deadline = None;
        let done = wait_taking_batches(
            Duration::from_millis(50),
            &mut rx,
            &mut q,
            &mut drain_deadline,
            Duration::from_secs(1),
        )
        .await;
        assert!(!done);
        assert_eq!(seqs(&q), [1, 2, 3]);
        assert_eq!(rx.len(), 2, "two left for the producer to wait on");
        assert_eq!(q.delivery.dropped, 0);
    }

    #[test]
    fn acks_are_cumulative_and_rejects_remove_one() {
        let mut q = Queue::new(10, None);
        for seq in 1..=5 {
            q.push(batch(seq));
        }
        q.acknowledge(2);
        q.acknowledge(2);
        q.reject(4);
        assert_eq!(seqs(&q), [3, 5]);
        assert_eq!(q.next_from(4).map(|b| b.seq), Some(5));
        q.acknowledge(5);
        assert_eq!(
            q.delivery,
            Delivery {
                produced: 5,
                acknowledged: 4,
                rejected: 1,
                dropped: 0,
                unacknowledged: 0,
                acknowledged_rows: TableRows::default(),
                earlier: Earlier::default(),
            }
        );
        assert_eq!(q.last_seq(), None);
    }

    /// A run counts its own batches; an earlier run's, left in the spool,
    /// are counted apart.
    #[test]
    fn an_earlier_runs_batches_are_counted_apart_from_this_runs() {
        let dir = tempfile::tempdir().unwrap();
        let mut spool = Spool::open(dir.path(), 1 << 20).unwrap();
        for seq in 1..=5 {
            spool.append(&batch(seq)).unwrap();
        }
        spool.acknowledge(2).unwrap();
        drop(spool);

        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        let mut q = Queue::new(10, Some(spool));
        q.push(batch(6));
        q.push(batch(7));
        q.acknowledge(4);
        q.acknowledge(6);
        assert_eq!(
            q.finish(),
            Delivery {
                produced: 2,
                acknowledged: 1,
                rejected: 0,
                dropped: 0,
                unacknowledged: 1,
                acknowledged_rows: TableRows::default(),
                earlier: Earlier {
                    pending: 3,
                    acknowledged: 3,
                    unacknowledged: 0,
                },
            }
        );

        // Everything acknowledged: the next run starts with nothing pending.
        q.acknowledge(7);
        drop(q);
        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        let mut q = Queue::new(10, Some(spool));
        assert_eq!(q.finish(), Delivery::default());
    }

    #[test]
    fn with_a_spool_batches_evicted_from_memory_are_resent_from_disk() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        let mut q = Queue::new(2, Some(spool));
        for seq in 1..=5 {
            q.push(batch(seq));
        }
        // Memory keeps 4 and 5; nothing was dropped: 1 to 3 are on disk.
        assert_eq!(seqs(&q), [4, 5]);
        assert_eq!(q.delivery.dropped, 0);
        assert_eq!(q.len(), 5);
        let mut sent = Vec::new();
        let mut cursor = 0;
        while let Some(b) = q.next_from(cursor) {
            cursor = b.seq + 1;
            sent.push(b.seq);
        }
        assert_eq!(sent, [1, 2, 3, 4, 5]);
        q.acknowledge(3);
        assert_eq!(q.len(), 2);
        assert_eq!(q.last_seq(), Some(5));
        q.acknowledge(5);
        assert!(q.is_empty());
    }

    /// A stream lost while resending from disk: the next stream starts again
    /// from the lowest unacknowledged batch, not from what was read ahead.
    #[test]
    fn a_new_stream_resends_from_the_first_unacknowledged_batch() {
        let dir = tempfile::tempdir().unwrap();
        let spool = Spool::open(dir.path(), 1 << 20).unwrap();
        let mut q = Queue::new(2, Some(spool));
        for seq in 1..=6 {
            q.push(batch(seq));
        }
        assert_eq!(q.next_from(0).map(|b| b.seq), Some(1));
        assert_eq!(q.next_from(2).map(|b| b.seq), Some(2));
        // The collector had 1 when the stream broke.
        q.acknowledge(1);
        q.from_disk.clear();
        assert_eq!(q.next_from(0).map(|b| b.seq), Some(2));
    }
}
