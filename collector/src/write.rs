//! The write path: everything between a validated batch and the persister.
//! Drops sequences already received, appends the rest to the write-ahead log
//! and the write buffer, acknowledges them once the log is synced to disk,
//! logs the collector's own alert rows and node events the same way, hands
//! accepted batches to the alert rules, and tells the node watch (see
//! [`crate::silence`]) which nodes it hears from. The gRPC sessions
//! (`ingest`) call it; the flush loop takes what it holds.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use gputel_proto::{Batch, EventKind, GpuEvent, GpuSample, NodeEvent};
use prost::Message as _;
use tokio::sync::{Notify, mpsc, watch};
use tracing::{debug, error, info, warn};

use crate::buffer::WriteBuffer;
use crate::clock::Clock;
use crate::memory::MemoryPlan;
use crate::peers::Peers;
use crate::silence::{NodeChange, NodeWatch, StreamEnd, seconds};
use crate::systemd::Heartbeat;
use crate::validate::{ValidBatch, canonical_node, validate_batch};
use crate::wal::{Replayed, Wal, WalError, batch_fingerprint};

/// Where a connected agent's acknowledgements go: its stream. `ack` must not
/// wait; false when the ack could not be queued (the next one covers it,
/// acks being cumulative).
pub trait AckSink: Send + Sync + std::fmt::Debug {
    fn ack(&self, seq: u64) -> bool;
}

/// What the alert rules see of one accepted batch: its GPU rows and XID
/// events, as the protocol carries them (the rules read the same typed rows
/// the `gpu` and `event` tables are built from).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AlertInput {
    pub node: String,
    pub gpus: Vec<GpuSample>,
    /// The batch's events of kind XID; `code` is the XID.
    pub xids: Vec<GpuEvent>,
    /// Its rows' place in the queue's bound, given back when it is dropped.
    pub queued: QueuedRows,
}

impl AlertInput {
    /// The readings of a batch from `node`.
    pub fn from_batch(node: &str, batch: &Batch) -> AlertInput {
        AlertInput {
            node: node.to_owned(),
            gpus: batch.gpu.clone(),
            xids: batch
                .event
                .iter()
                .filter(|e| e.kind() == EventKind::Xid)
                .cloned()
                .collect(),
            queued: QueuedRows::default(),
        }
    }
}

/// Rows of an [`AlertInput`] counted against the alert queue's bound while
/// it exists; a clone is not in the queue and counts nothing.
#[derive(Debug, Default)]
pub struct QueuedRows {
    queue: Option<Arc<AtomicUsize>>,
    rows: usize,
}

impl Drop for QueuedRows {
    fn drop(&mut self) {
        if let Some(queue) = &self.queue {
            queue.fetch_sub(self.rows, Ordering::Relaxed);
        }
    }
}

impl Clone for QueuedRows {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for QueuedRows {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Where the alert task takes its input: accepted batches (a bounded queue:
/// when it is full, batches skip the rules, never delaying an ack) and node
/// changes (a few per node and silence, never dropped). A node's return is
/// queued before the batch that brought it back.
#[derive(Debug, Clone)]
pub struct AlertSink {
    pub batches: mpsc::Sender<AlertInput>,
    pub nodes: mpsc::UnboundedSender<NodeChange>,
}

/// What became of a batch handed to [`WritePath::accept`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// Logged and buffered; its ack follows once the log is synced.
    New,
    /// Received before: dropped. `Some(durable)` when it is already durable,
    /// so the agent can be acknowledged at once.
    Duplicate(Option<u64>),
}

/// Why a valid batch was not taken in. [`Refused::Sequence`] is for good
/// (the agent is sent a reject and drops the batch); the others are for now
/// (the agent keeps the batch and retries).
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error(transparent)]
    Sequence(#[from] SequenceError),
    #[error("agent {agent_id} sends more than {rate} rows/s; retry later")]
    OverRate { agent_id: String, rate: u64 },
    #[error("the collector holds {max} rows not yet written to the store; retry later")]
    StoreBehind { max: usize },
    #[error(transparent)]
    Log(#[from] LogUnavailable),
}

/// How far past the highest sequence number received from an agent id a
/// batch's may be. An agent numbers its batches one by one, one a tick (at
/// least 10 ms apart: at most 100 a second); a gap is what it dropped while
/// the collector was away. 2^32 is 100 batches a second for 497 days, longer
/// than any outage an agent id is remembered through ([`AGENT_RETENTION_US`]),
/// and small enough that no number of refused jumps can use up the sequence
/// space of an agent id.
pub const MAX_SEQ_AHEAD: u64 = 1 << 32;

/// Batches per agent id whose content is remembered (as a fingerprint), to
/// tell a resend from a different batch under a number already received.
/// An agent resends only what its welcome did not cover: batches received
/// but not yet synced, at most its send window (32) and what the network
/// held. 128 fingerprints are 2 KiB an agent.
pub const FINGERPRINTS_KEPT: usize = 128;

/// A sequence number the collector refuses for good: answered with a reject
/// that names it; the agent id keeps its place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SequenceError {
    #[error(
        "sequence number {seq} is the largest there is: no batch could follow it; \
         refused, the agent id keeps its place at {received}"
    )]
    Last { seq: u64, received: u64 },
    #[error(
        "sequence number {seq} is more than {MAX_SEQ_AHEAD} past the highest received \
         from this agent id ({received}): more batches than an agent makes in a year; \
         refused, the agent id keeps its place"
    )]
    TooFar { seq: u64, received: u64 },
    #[error(
        "sequence number {seq} was received before with different content; the first \
         is kept (this agent id has {durable} stored): two agents use one agent id, or \
         an agent's spool was reset; give each agent its own --spool-dir"
    )]
    Conflict { seq: u64, durable: u64 },
    #[error(
        "sequence number {seq} is behind the highest received from this agent id \
         ({received}) and older than the last {FINGERPRINTS_KEPT} batches whose content \
         can be compared; refused, nothing is stored again"
    )]
    Behind { seq: u64, received: u64 },
}

/// A hello naming an agent id that another node owns: refused, so that no
/// client can write into another node's sequence space or take its acks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "agent id {agent_id} belongs to node {owner}; node {node} may not use it \
     (each agent needs its own agent id: a copied --spool-dir copies agent.id)"
)]
pub struct OtherNode {
    pub agent_id: String,
    pub owner: String,
    pub node: String,
}

/// The write path's state, shared by the stream tasks, the log syncer and
/// the persister.
#[derive(Debug)]
pub struct WritePath {
    state: Mutex<State>,
    /// Woken when the buffer holds `flush_rows` rows (half as many while
    /// a compaction round runs).
    pub flush_now: Notify,
    /// Woken when records wait for an fsync.
    sync_wanted: Notify,
    flush_rows: usize,
    /// Whether a compaction round is running (see [`WritePath::compacting`]).
    compacting: AtomicBool,
    max_unwritten_rows: usize,
    max_agent_rows_per_s: u64,
    /// Rows taken from the buffer whose files are not written yet.
    unwritten_rows: AtomicUsize,
    draining: AtomicBool,
    clock: Clock,
    /// Numbers sessions, so that a stale one never detaches a newer one.
    next_session: AtomicU64,
    /// Where accepted batches and node changes go for the alert rules, when
    /// alerting is on.
    alert_sink: OnceLock<AlertSink>,
    /// Node silence, when on.
    silence: OnceLock<Silence>,
    /// GPU rows queued for the alert rules, and the most that may be.
    alert_queue_rows: Arc<AtomicUsize>,
    max_alert_queue_rows: usize,
    /// Counters reported in logs.
    pub stats: Stats,
    /// Beats each time the flush loop takes the buffer; the watchdog reads it.
    pub taken: Heartbeat,
}

/// The node watch and what it needs to run.
#[derive(Debug)]
struct Silence {
    watch: Mutex<NodeWatch>,
    /// Where the watch is saved (`nodes.json` beside the log).
    file: PathBuf,
    /// Node events the log did not take (it failed); retried at each check.
    unlogged: Mutex<Vec<NodeEvent>>,
    /// Whether the last try to log them failed (logged once, not per try).
    log_failing: AtomicBool,
    /// Woken when a change should be saved at once.
    save_now: Notify,
}

/// How often the node watch looks for nodes past their threshold.
const SILENCE_CHECK: Duration = Duration::from_millis(500);
/// How often the node watch is saved when only arrivals changed (a change
/// of silence is saved at once).
const SILENCE_SAVE: Duration = Duration::from_secs(30);

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
    /// The node this agent id belongs to (canonical name); None for an id
    /// known from a state file older than owners, claimed by its next hello.
    owner: Option<String>,
    /// Highest sequence appended to the log and the buffer.
    received: u64,
    /// (sequence, fingerprint) of the last [`FINGERPRINTS_KEPT`] batches
    /// appended, oldest first.
    recent: VecDeque<(u64, u64)>,
    /// Highest sequence synced to the log, and so acknowledged.
    durable: u64,
    /// The connected stream: its session id and where its acks go.
    session: Option<(u64, Arc<dyn AckSink>)>,
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
    /// Remembers the content of a batch just appended.
    fn remember(&mut self, seq: u64, fingerprint: u64) {
        if self.recent.len() == FINGERPRINTS_KEPT {
            self.recent.pop_front();
        }
        self.recent.push_back((seq, fingerprint));
    }

    /// Checks a batch's sequence number: Ok(true) when it is new, Ok(false)
    /// for a resend of what was received (same content), else why not.
    fn check_seq(&self, seq: u64, fingerprint: u64) -> Result<bool, SequenceError> {
        let received = self.received;
        if seq == u64::MAX {
            return Err(SequenceError::Last { seq, received });
        }
        if seq > received {
            return if seq - received > MAX_SEQ_AHEAD {
                Err(SequenceError::TooFar { seq, received })
            } else {
                Ok(true)
            };
        }
        match self.recent.iter().find(|(s, _)| *s == seq) {
            Some((_, logged)) if *logged == fingerprint => Ok(false),
            Some(_) => Err(SequenceError::Conflict {
                seq,
                durable: self.durable,
            }),
            None => Err(SequenceError::Behind { seq, received }),
        }
    }
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

impl LogUnavailable {
    /// Whether the log refused to keep room on its volume (see [`WalError::is_low_space`]).
    pub fn is_low_space(&self) -> bool {
        self.0.is_low_space()
    }
}

/// A compaction round running, from [`WritePath::compacting`] until dropped.
#[derive(Debug)]
pub struct Compacting<'a>(&'a AtomicBool);

impl Drop for Compacting<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

impl WritePath {
    /// The shared state over an opened log, with what it replayed already in
    /// the buffer.
    pub fn new(
        flush_rows: usize,
        memory: &MemoryPlan,
        max_agent_rows_per_s: u64,
        clock: Clock,
        wal: Wal,
        replayed: Replayed,
    ) -> Self {
        let mut agents: HashMap<String, AgentState> = HashMap::new();
        let ids = wal.durable().keys().chain(wal.owners().keys());
        for id in ids {
            let seq = wal.durable().get(id).copied().unwrap_or(0);
            let agent = AgentState {
                // Names stored before they were made canonical compare as
                // the same node.
                owner: wal.owners().get(id).map(|n| canonical_node(n)),
                received: seq,
                durable: seq,
                session: None,
                // Remembered for a full retention period after a restart.
                last_seen_us: clock.now_us(),
                ..AgentState::default()
            };
            agents.insert(id.clone(), agent);
        }
        // What the log still holds can be compared with a resend.
        for (record, fingerprint) in replayed.records.iter().zip(&replayed.fingerprints) {
            if let (Some(batch), Some(fingerprint), Some(agent)) =
                (&record.batch, fingerprint, agents.get_mut(&record.agent_id))
            {
                agent.remember(batch.seq, *fingerprint);
            }
        }
        let stats = Stats::default();
        let mut buffer = WriteBuffer::default();
        let now_us = clock.now_us();
        for record in &replayed.records {
            buffer.append_alerts(&record.alerts);
            buffer.append_node_events(&record.node_events);
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
            compacting: AtomicBool::new(false),
            max_unwritten_rows: memory.max_unwritten_rows,
            max_agent_rows_per_s,
            unwritten_rows: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            clock,
            next_session: AtomicU64::new(1),
            alert_sink: OnceLock::new(),
            alert_queue_rows: Arc::new(AtomicUsize::new(0)),
            max_alert_queue_rows: memory.alert_queue_rows,
            silence: OnceLock::new(),
            stats,
            taken: Heartbeat::new(),
        }
    }

    /// From now on, every accepted batch (never a duplicate) is also handed
    /// to `sink` for the alert rules, and every node change; the nodes
    /// silent now are told at once. Set once.
    pub fn set_alert_sink(&self, sink: AlertSink) {
        if self.alert_sink.set(sink).is_err() {
            warn!("alert rules were already connected; the second connection is ignored");
            return;
        }
        self.announce_silences();
    }

    /// Watches the nodes for silence with `watch`, saved to `file`. Set once;
    /// [`WritePath::run_node_watch`] does the watching.
    pub fn watch_node_silence(&self, watch: NodeWatch, file: PathBuf) {
        let silence = Silence {
            watch: Mutex::new(watch),
            file,
            unlogged: Mutex::new(Vec::new()),
            log_failing: AtomicBool::new(false),
            save_now: Notify::new(),
        };
        if self.silence.set(silence).is_err() {
            warn!("node silence was already watched; the second watch is ignored");
            return;
        }
        self.announce_silences();
    }

    /// Tells the alert task which nodes are silent already (silences from
    /// before a restart), once both are there.
    fn announce_silences(&self) {
        let (Some(sink), Some(silence)) = (self.alert_sink.get(), self.silence.get()) else {
            return;
        };
        let silences = lock(&silence.watch).silences();
        for s in silences {
            let _ = sink.nodes.send(NodeChange::Silent(s));
        }
    }

    /// A batch of `node` arrived (`taken`: it passed validation). A silent
    /// node is back: its `node_back` event is logged and the alert task
    /// told, before the batch reaches the rules.
    pub fn heard(&self, node: &str, taken: Option<&Batch>) {
        let Some(silence) = self.silence.get() else {
            return;
        };
        let now_us = self.clock.now_us();
        let (change, event) = {
            let mut watch = lock(&silence.watch);
            let Some(change) = watch.heard(node, taken, now_us) else {
                return;
            };
            let event = watch.event(&change);
            (change, event)
        };
        self.node_changed(silence, change, event);
        silence.save_now.notify_one();
    }

    /// A stream of `node`'s agent opened.
    pub fn stream_opened(&self, node: &str) {
        if let Some(silence) = self.silence.get() {
            lock(&silence.watch).stream_opened(node, self.clock.now_us());
        }
    }

    /// A stream of `node`'s agent ended.
    pub fn stream_closed(&self, node: &str, end: StreamEnd) {
        if let Some(silence) = self.silence.get() {
            lock(&silence.watch).stream_closed(node, end);
        }
    }

    /// The nodes with a stream open now.
    pub fn streaming_nodes(&self) -> Vec<String> {
        let state = self.lock();
        let mut nodes: Vec<String> = state
            .agents
            .values()
            .filter(|a| a.session.is_some())
            .filter_map(|a| a.owner.clone())
            .collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    /// Looks for silent nodes every [`SILENCE_CHECK`] and saves the watch,
    /// until `stop` turns true; returns at once when silence is not watched.
    /// A node that went quiet here while `peers` lists it on another
    /// collector has moved there: it is forgotten here, not silent.
    pub async fn run_node_watch(
        self: Arc<Self>,
        mut stop: watch::Receiver<bool>,
        peers: Arc<Peers>,
    ) {
        let Some(silence) = self.silence.get() else {
            return;
        };
        let mut check = tokio::time::interval(SILENCE_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut save = tokio::time::interval(SILENCE_SAVE);
        save.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        save.tick().await;
        loop {
            tokio::select! {
                () = stopped(&mut stop) => break,
                _ = check.tick() => {
                    let now_us = self.clock.now_us();
                    let moved = self.moved_elsewhere(silence, &peers, now_us).await;
                    let found = {
                        let mut watch = lock(&silence.watch);
                        let changes = watch.check(now_us);
                        changes
                            .into_iter()
                            .map(|c| {
                                let event = watch.event(&c);
                                (c, event)
                            })
                            .collect::<Vec<_>>()
                    };
                    let found: Vec<_> = moved.into_iter().map(|c| (c, None)).chain(found).collect();
                    let changed = !found.is_empty() || lock(&silence.watch).has_new_nodes();
                    for (change, event) in found {
                        self.node_changed(silence, change, event);
                    }
                    self.log_node_events(silence, Vec::new());
                    if changed {
                        self.save_node_watch(silence).await;
                    }
                }
                _ = silence.save_now.notified() => self.save_node_watch(silence).await,
                _ = save.tick() => {
                    if lock(&silence.watch).is_dirty() {
                        self.save_node_watch(silence).await;
                    }
                }
            }
        }
        self.save_node_watch(silence).await;
    }

    /// Of the nodes due to fall silent at `now_us`, those another collector
    /// streams have moved there: they are no longer watched here, and
    /// become [`NodeChange::Moved`] (no event). Asked before the watch marks
    /// any node silent, so that no batch arriving during the lookup can
    /// announce a node back before its silence; a node heard from meanwhile
    /// is kept.
    async fn moved_elsewhere(
        &self,
        silence: &Silence,
        peers: &Peers,
        now_us: i64,
    ) -> Vec<NodeChange> {
        let due = lock(&silence.watch).due(now_us);
        if due.is_empty() {
            return Vec::new();
        }
        let elsewhere = peers.elsewhere(&due).await;
        let mut watch = lock(&silence.watch);
        elsewhere
            .into_iter()
            .filter(|(node, _)| watch.forget_if_due(node, now_us))
            .map(|(node, to)| NodeChange::Moved { node, to })
            .collect()
    }

    /// Logs a node change, its event and tells the alert task.
    fn node_changed(&self, silence: &Silence, change: NodeChange, event: Option<NodeEvent>) {
        match &change {
            NodeChange::Silent(s) if !s.restored => warn!(
                node = %s.node,
                silent_for = %seconds(s.at_us - s.last_heard_us),
                threshold = %seconds(s.threshold_us),
                "node silent: nothing received from it for longer than its threshold"
            ),
            NodeChange::Silent(_) => {}
            NodeChange::Back {
                node,
                at_us,
                last_heard_us,
                ..
            } => info!(
                node = %node,
                silent_for = %seconds(at_us - last_heard_us),
                "node back: heard from again"
            ),
            NodeChange::Forgotten { node, .. } => info!(
                node = %node,
                "node forgotten after a week of silence"
            ),
            NodeChange::Moved { node, to } => info!(
                node = %node,
                collector = %to,
                "node streams to another collector now: no longer watched here"
            ),
        }
        if let Some(event) = event {
            self.log_node_events(silence, vec![event]);
        }
        if let Some(sink) = self.alert_sink.get() {
            let _ = sink.nodes.send(change);
        }
    }

    /// Logs node events (and any the log refused before) and buffers them
    /// for the `event` table; what the log refuses is kept and retried.
    fn log_node_events(&self, silence: &Silence, events: Vec<NodeEvent>) {
        let mut unlogged = lock(&silence.unlogged);
        unlogged.extend(events);
        if unlogged.is_empty() {
            return;
        }
        let logged = {
            let mut guard = self.lock();
            let state = &mut *guard;
            state
                .wal
                .append_node_events(&unlogged)
                .map(|()| state.buffer.append_node_events(&unlogged))
        };
        match logged {
            Ok(()) => {
                unlogged.clear();
                self.sync_wanted.notify_one();
                if silence.log_failing.swap(false, Ordering::Relaxed) {
                    info!("node events are logged again");
                }
            }
            Err(e) => {
                if !silence.log_failing.swap(true, Ordering::Relaxed) {
                    error!(
                        error = %e, events = unlogged.len(),
                        "node events not logged yet; kept and retried every {SILENCE_CHECK:?}"
                    );
                }
            }
        }
    }

    async fn save_node_watch(&self, silence: &Silence) {
        let bytes = lock(&silence.watch).saved();
        let path = silence.file.clone();
        let result = tokio::task::spawn_blocking(move || crate::state_file::replace(&path, &bytes))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        if let Err(e) = result {
            error!(
                error = %e, file = %silence.file.display(),
                "cannot save the node watch; a restart now would forget which nodes are silent"
            );
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
    fn to_alerts(&self, node: &str, batch: &Batch) {
        let Some(sink) = self.alert_sink.get() else {
            return;
        };
        if batch.gpu.is_empty() && batch.event.is_empty() {
            return;
        }
        let rows = batch.gpu.len();
        let queued = self.alert_queue_rows.fetch_add(rows, Ordering::Relaxed);
        let mut input = AlertInput::from_batch(node, batch);
        input.queued = QueuedRows {
            queue: Some(Arc::clone(&self.alert_queue_rows)),
            rows,
        };
        // Over the bound, the input is dropped here and its rows given back.
        if queued + rows > self.max_alert_queue_rows || sink.batches.try_send(input).is_err() {
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
        lock(&self.state)
    }

    /// Takes the buffered rows. Closes the current log segment first (which
    /// syncs it, so what waited for a sync is acknowledged here), unless it
    /// holds no record: a flush retried on a failing store adds no file.
    pub fn take(&self) -> Result<Taken, WalError> {
        self.taken.beat();
        let mut guard = self.lock();
        let state = &mut *guard;
        let closed = if state.wal.holds_records() {
            Some(state.wal.rotate()?)
        } else {
            None
        };
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
        state.segments.extend(closed);
        let segments = std::mem::take(&mut state.segments);
        let first = segments
            .iter()
            .min()
            .copied()
            .unwrap_or(state.wal.segment());
        let next = state.buffer.successor();
        Ok(Taken {
            buffer: std::mem::replace(&mut state.buffer, next),
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

    /// The collector's clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// A number for a new stream, never given before.
    pub fn new_session_id(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }

    /// Attaches a new stream of `agent_id` from `node` (canonical name);
    /// returns the agent's durable sequence for its welcome. An agent id
    /// belongs to the first node that uses it, until it is forgotten; a
    /// stream of another node is refused and the owner's stream, if any,
    /// stays attached.
    pub fn connect(
        &self,
        node: &str,
        agent_id: &str,
        session: u64,
        acks: Arc<dyn AckSink>,
    ) -> Result<u64, OtherNode> {
        let mut guard = self.lock();
        let state = &mut *guard;
        let agent = state.agents.entry(agent_id.to_owned()).or_default();
        match &agent.owner {
            Some(owner) if owner != node => {
                return Err(OtherNode {
                    agent_id: agent_id.to_owned(),
                    owner: owner.clone(),
                    node: node.to_owned(),
                });
            }
            Some(_) => {}
            None => {
                agent.owner = Some(node.to_owned());
                state.wal.note_owner(agent_id, node);
            }
        }
        agent.session = Some((session, acks));
        agent.last_seen_us = self.clock.now_us();
        Ok(agent.durable)
    }

    /// Detaches a stream, unless a newer one of the same agent replaced it.
    pub fn disconnect(&self, agent_id: &str, session: u64) {
        let mut state = self.lock();
        if let Some(agent) = state.agents.get_mut(agent_id)
            && agent.session.as_ref().is_some_and(|(id, _)| *id == session)
        {
            agent.session = None;
        }
    }

    /// Whether batches are refused because the collector is stopping.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Counts a batch that failed validation.
    pub fn count_rejected(&self) {
        self.stats.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes in a validated batch of `agent_id` from `node`: dedupe, the
    /// agent's rate, the bound on unwritten rows, then the log and the buffer.
    ///
    /// `encoded` is the batch as the agent sent it, when the message held it
    /// once: it is logged as it came, without encoding the decoded batch
    /// again, and fingerprinted as logged.
    pub fn accept(
        &self,
        node: &str,
        agent_id: &str,
        valid: ValidBatch<'_>,
        encoded: Option<&[u8]>,
    ) -> Result<Accepted, Refused> {
        let batch = valid.get();
        let encoded = match encoded {
            Some(bytes) => Cow::Borrowed(bytes),
            None => Cow::Owned(batch.encode_to_vec()),
        };
        let fingerprint = batch_fingerprint(&encoded);
        let rows = crate::validate::row_count(batch);
        let (duplicate_of_durable, full) = {
            let mut guard = self.lock();
            let state = &mut *guard;
            let agent = state.agents.entry(agent_id.to_owned()).or_default();
            let now_us = self.clock.now_us();
            agent.last_seen_us = now_us;
            let new = agent.check_seq(batch.seq, fingerprint)?;
            if new && !agent.take_allowance(rows, self.max_agent_rows_per_s, now_us) {
                return Err(Refused::OverRate {
                    agent_id: agent_id.to_owned(),
                    rate: self.max_agent_rows_per_s,
                });
            }
            if !new {
                let durable = (batch.seq <= agent.durable).then_some(agent.durable);
                (Some(durable), false)
            } else if state.buffer.rows() + self.unwritten_rows.load(Ordering::Relaxed)
                >= self.max_unwritten_rows
            {
                drop(guard);
                self.flush_now.notify_one();
                return Err(Refused::StoreBehind {
                    max: self.max_unwritten_rows,
                });
            } else {
                if let Err(e) = state.wal.append_batch(agent_id, node, &encoded) {
                    drop(guard);
                    if e.is_low_space() {
                        // Room comes back when a flush releases segments.
                        self.flush_now.notify_one();
                    }
                    return Err(LogUnavailable(e).into());
                }
                agent.received = batch.seq;
                agent.remember(batch.seq, fingerprint);
                state.buffer.append(node, valid);
                state.unsynced.insert(agent_id.to_owned(), batch.seq);
                let full = state.buffer.rows() >= self.flush_threshold() || state.wal.wants_flush();
                (None, full)
            }
        };
        if let Some(durable) = duplicate_of_durable {
            self.stats.duplicates.fetch_add(1, Ordering::Relaxed);
            return Ok(Accepted::Duplicate(durable));
        }
        self.sync_wanted.notify_one();
        self.to_alerts(node, batch);
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats.rows.fetch_add(rows as u64, Ordering::Relaxed);
        if full {
            self.flush_now.notify_one();
        }
        Ok(Accepted::New)
    }

    /// Rows at which the buffer is flushed: `flush_rows`, or half as many
    /// while a compaction round runs, so that the round's memory (a range
    /// of an hour's rows, its Parquet readers and writers) comes out of the
    /// rows' share rather than on top of a full buffer: the collector's
    /// peak is the rows waiting at their most, just before a flush.
    fn flush_threshold(&self) -> usize {
        if self.compacting.load(Ordering::Relaxed) {
            (self.flush_rows / 2).max(1)
        } else {
            self.flush_rows
        }
    }

    /// Marks a compaction round as running until the guard is dropped:
    /// meanwhile the buffer is flushed at half its rows.
    pub fn compacting(&self) -> Compacting<'_> {
        self.compacting.store(true, Ordering::Relaxed);
        Compacting(&self.compacting)
    }

    /// Stops accepting batches: they are left to the agents to resend.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }
}

/// Completes once `stop` turns true (without holding its lock after).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// A panic while holding a lock leaves plain data behind, still usable.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The collector's exit status when the log cannot be synced (EX_IOERR).
const EXIT_LOG_SYNC_FAILED: i32 = 74;

/// How long to wait before retrying a failed log write or sync.
const SYNC_RETRY: Duration = Duration::from_millis(200);

fn max_ts(batch: &Batch) -> i64 {
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
        if let Some((_, sink)) = &agent.session
            && !sink.ack(agent.durable)
        {
            debug!(agent_id, "ack not queued; the next one covers it");
        }
    }
}
