//! Node silence: a node that stops sending is data too. The collector
//! learns each node's usual interval from its samples, notices when nothing
//! has arrived from it for a few of those intervals (never less than
//! `--node-silence-after`), and says so: a `node_silent` event, and a
//! `node_back` event when it is heard from again. The alert task turns the
//! same changes into the `up` rules' alerts and resolves the node's other
//! alerts, whose data stopped.
//!
//! Arrivals are timed by the collector's clock: silence is the absence of
//! samples, so no sample time can measure it. The interval comes from the
//! samples' own timestamps, which neither network delay nor the burst of a
//! spool's resend distorts. What is known of each node is kept in
//! [`STATE_FILE`] beside the write-ahead log, so that a node that dies while
//! the collector restarts is still noticed, and a silence that began before
//! a restart is not announced twice.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::time::Duration;

use gputel_runtime::time::duration_us;

use gputel_proto::{Batch, EventKind, NodeEvent};
use serde::{Deserialize, Serialize};

/// A node is silent after this many of its usual intervals without a batch
/// (or `--node-silence-after`, whichever is longer).
pub const INTERVALS: i64 = 3;
/// The least silence that counts, unless configured: long enough that a
/// collector's pause, a TCP retransmission or a slow NVML call on the node
/// never looks like a dead node.
pub const DEFAULT_SILENCE_AFTER: Duration = Duration::from_secs(30);
/// A node's interval until two of its ticks have been seen: the slowest
/// interval in common use (Prometheus' and DCGM's 15 s and 30 s fit under it).
pub const UNKNOWN_INTERVAL: Duration = Duration::from_secs(60);
/// After a start, how long the nodes known from before have to reconnect
/// before any of them can be silent: an agent that lost its collector
/// retries at most every 30 s, plus as much again of random jitter, plus a
/// 10 s connection timeout (70 s); 90 s leaves room for a slow start.
pub const START_GRACE: Duration = Duration::from_secs(90);
/// A node silent this long is forgotten (its silence alert resolves): a
/// node taken out of service does not keep an alert firing for ever.
pub const NODE_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// The state file, in the write-ahead log's directory.
pub const STATE_FILE: &str = "nodes.json";
/// Gaps between ticks kept per node; the interval is their median, so a
/// skipped tick or a gap across a silence does not move it.
const GAPS_KEPT: usize = 9;

/// How a node's last stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamEnd {
    /// The agent closed it (a clean stop: it delivered what it had).
    Closed,
    /// Broken, refused, or ended by an error.
    Lost,
}

/// What the collector knows of one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeState {
    /// When its last batch arrived, µs by the collector's clock.
    pub last_heard_us: i64,
    /// Sample time of its latest tick, µs (0: none seen).
    pub last_tick_us: i64,
    /// Gaps between its consecutive ticks, µs, oldest first.
    pub gaps_us: VecDeque<i64>,
    /// The jobs on its GPUs at its latest tick, sorted.
    pub jobs: Vec<String>,
    /// Since when it is silent, while it is (the collector's clock).
    pub silent_since_us: Option<i64>,
    /// Streams of its agents open now (none survive a restart).
    #[serde(skip)]
    streams: u32,
    /// How its last stream ended, since the collector started.
    #[serde(skip)]
    last_end: Option<StreamEnd>,
    /// It cannot be silent before this time (set for the nodes restored at
    /// start, see [`START_GRACE`]).
    #[serde(skip)]
    grace_until_us: i64,
}

impl NodeState {
    fn new(now_us: i64) -> NodeState {
        NodeState {
            last_heard_us: now_us,
            last_tick_us: 0,
            gaps_us: VecDeque::new(),
            jobs: Vec::new(),
            silent_since_us: None,
            streams: 0,
            last_end: None,
            grace_until_us: i64::MIN,
        }
    }

    /// Its usual interval between ticks: the median of the gaps seen;
    /// None before two ticks.
    pub fn interval_us(&self) -> Option<i64> {
        let mut gaps: Vec<i64> = self.gaps_us.iter().copied().collect();
        gaps.sort_unstable();
        gaps.get(gaps.len() / 2).copied()
    }

    /// Notes the ticks of a batch the collector took in: their gaps and the
    /// latest tick's jobs. Older ticks (a resend) change nothing.
    fn ticked(&mut self, batch: &Batch) {
        let mut ticks: Vec<i64> = batch
            .node
            .iter()
            .map(|s| s.ts_us)
            .chain(batch.gpu.iter().map(|s| s.ts_us))
            .chain(batch.ib.iter().map(|s| s.ts_us))
            .collect();
        ticks.sort_unstable();
        ticks.dedup();
        for ts in ticks {
            if ts <= self.last_tick_us {
                continue;
            }
            if self.last_tick_us > 0 {
                if self.gaps_us.len() == GAPS_KEPT {
                    self.gaps_us.pop_front();
                }
                self.gaps_us.push_back(ts - self.last_tick_us);
            }
            self.last_tick_us = ts;
            self.jobs = jobs_at(batch, ts);
        }
    }

    /// What its stream is doing, in words.
    fn stream_words(&self) -> &'static str {
        match (self.streams, self.last_end) {
            (1.., _) => "its stream is open",
            (0, Some(StreamEnd::Closed)) => "its agent closed its stream",
            (0, Some(StreamEnd::Lost)) => "its stream was lost",
            (0, None) => "it has not connected since the collector started",
        }
    }
}

/// The jobs on a node's GPUs at tick `ts`: its node row's list, else the
/// distinct jobs of its GPU rows.
fn jobs_at(batch: &Batch, ts: i64) -> Vec<String> {
    if let Some(node) = batch.node.iter().find(|s| s.ts_us == ts) {
        return node.jobs.clone();
    }
    let mut jobs: Vec<String> = batch
        .gpu
        .iter()
        .filter(|g| g.ts_us == ts)
        .filter_map(|g| g.job_id.clone())
        .collect();
    jobs.sort_unstable();
    jobs.dedup();
    jobs
}

/// A node that fell silent.
#[derive(Debug, Clone, PartialEq)]
pub struct Silence {
    pub node: String,
    /// When the collector noticed (its clock).
    pub at_us: i64,
    /// When its last batch arrived.
    pub last_heard_us: i64,
    /// The silence that made it silent, µs.
    pub threshold_us: i64,
    /// The jobs on its GPUs at its last tick.
    pub jobs: Vec<String>,
    /// A silence that began before the collector restarted, told again to
    /// the alert task; it has its event already.
    pub restored: bool,
}

/// A change in whether a node is heard from.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeChange {
    /// Nothing arrived from the node for its threshold.
    Silent(Silence),
    /// A silent node was heard from again.
    Back {
        node: String,
        /// When its first batch after the silence arrived.
        at_us: i64,
        /// When its last batch before the silence arrived.
        last_heard_us: i64,
        /// The jobs at its last tick before the silence.
        jobs: Vec<String>,
    },
    /// A node silent for [`NODE_RETENTION`] is no longer watched.
    Forgotten { node: String, at_us: i64 },
    /// A node that went quiet here streams to another collector sharing the
    /// store (`to`): it failed over, it is not silent. No longer watched
    /// here; its alerts are handed over, neither resolved nor re-sent.
    Moved { node: String, to: String },
}

impl NodeChange {
    /// The node it is about.
    pub fn node(&self) -> &str {
        match self {
            NodeChange::Silent(s) => &s.node,
            NodeChange::Back { node, .. }
            | NodeChange::Forgotten { node, .. }
            | NodeChange::Moved { node, .. } => node,
        }
    }
}

/// The one job of a list; None when idle or shared by several.
fn one_job(jobs: &[String]) -> Option<String> {
    match jobs {
        [job] => Some(job.clone()),
        _ => None,
    }
}

/// Seconds with one decimal, as people read a duration.
pub fn seconds(us: i64) -> String {
    format!("{:.1} s", us as f64 / 1e6)
}

fn rfc3339(us: i64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_micros(us)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn silent_ms(from_us: i64, to_us: i64) -> u64 {
    u64::try_from((to_us - from_us) / 1000).unwrap_or(0)
}

/// See [`NodeWatch::threshold_us`].
fn threshold_us(silence_after_us: i64, node: &NodeState) -> i64 {
    let interval = node.interval_us().unwrap_or(duration_us(UNKNOWN_INTERVAL));
    interval.saturating_mul(INTERVALS).max(silence_after_us)
}

/// Whether `node`, not silent yet, has gone without a batch for its
/// threshold (and past its start grace) at `now_us`.
fn is_due(silence_after_us: i64, node: &NodeState, now_us: i64) -> bool {
    node.silent_since_us.is_none()
        && now_us
            >= node
                .last_heard_us
                .saturating_add(threshold_us(silence_after_us, node))
                .max(node.grace_until_us)
}

/// Every node the collector has heard from, and which of them are silent.
#[derive(Debug)]
pub struct NodeWatch {
    /// The least silence that counts, µs (`--node-silence-after`).
    silence_after_us: i64,
    nodes: BTreeMap<String, NodeState>,
    /// Changed since the last save.
    dirty: bool,
    /// A node was added since the last save: saved at once, so that a
    /// crash soon after its first batch does not forget it.
    added: bool,
}

impl NodeWatch {
    /// A watch that knows no node yet.
    pub fn new(silence_after: Duration) -> NodeWatch {
        NodeWatch {
            silence_after_us: duration_us(silence_after),
            nodes: BTreeMap::new(),
            dirty: false,
            added: false,
        }
    }

    /// A watch over the nodes saved before a restart at `now_us`: each has
    /// [`START_GRACE`] (or its threshold, if longer) to reconnect before it
    /// can be silent; those silent already stay so, without a new event.
    pub fn restore(
        silence_after: Duration,
        saved: BTreeMap<String, NodeState>,
        now_us: i64,
    ) -> NodeWatch {
        let mut watch = NodeWatch::new(silence_after);
        for (name, mut node) in saved {
            let grace = duration_us(START_GRACE).max(watch.threshold_us(&node));
            node.grace_until_us = now_us.saturating_add(grace);
            watch.nodes.insert(name, node);
        }
        watch
    }

    /// Applies the node events the write-ahead log replayed (logged, not
    /// yet in the store): the state file may have been saved before the
    /// last of them, if the collector died in between. The log has the
    /// last word, so a silence is neither forgotten nor announced twice.
    pub fn replay(&mut self, events: &[NodeEvent]) {
        for event in events {
            let silence_us = i64::try_from(event.silent_ms)
                .unwrap_or(i64::MAX / 1000)
                .saturating_mul(1000);
            let last_heard_us = event.ts_us.saturating_sub(silence_us);
            let state = self.node_mut(&event.node, last_heard_us);
            match EventKind::try_from(event.kind) {
                Ok(EventKind::NodeSilent)
                    if state.silent_since_us.is_none() && state.last_heard_us <= last_heard_us =>
                {
                    state.silent_since_us = Some(event.ts_us);
                }
                Ok(EventKind::NodeBack) => {
                    if state
                        .silent_since_us
                        .is_some_and(|since| since <= event.ts_us)
                    {
                        state.silent_since_us = None;
                    }
                    state.last_heard_us = state.last_heard_us.max(event.ts_us);
                }
                _ => {}
            }
        }
    }

    /// The silence after which `node` is silent, µs: [`INTERVALS`] of its
    /// usual interval ([`UNKNOWN_INTERVAL`] until known), at least
    /// `--node-silence-after`.
    pub fn threshold_us(&self, node: &NodeState) -> i64 {
        threshold_us(self.silence_after_us, node)
    }

    /// The nodes known, by name.
    pub fn nodes(&self) -> &BTreeMap<String, NodeState> {
        &self.nodes
    }

    /// A batch of `node` arrived at `now_us` (whatever becomes of it);
    /// `taken` is the batch when it passed validation, to learn the node's
    /// interval and jobs from. Returns the node's return when it was silent.
    pub fn heard(&mut self, node: &str, taken: Option<&Batch>, now_us: i64) -> Option<NodeChange> {
        self.dirty = true;
        let state = self.node_mut(node, now_us);
        let back = state.silent_since_us.take().map(|_| NodeChange::Back {
            node: node.to_owned(),
            at_us: now_us,
            last_heard_us: state.last_heard_us,
            jobs: state.jobs.clone(),
        });
        state.last_heard_us = state.last_heard_us.max(now_us);
        // Reconnected: the grace after a restart is over for it.
        state.grace_until_us = i64::MIN;
        if let Some(batch) = taken {
            state.ticked(batch);
        }
        back
    }

    /// A stream of `node`'s agent opened.
    pub fn stream_opened(&mut self, node: &str, now_us: i64) {
        self.node_mut(node, now_us).streams += 1;
    }

    /// The state of `node`, new (first heard at `now_us`) if it is unknown.
    fn node_mut(&mut self, node: &str, now_us: i64) -> &mut NodeState {
        // Looked up first: a batch of a known node allocates nothing.
        if !self.nodes.contains_key(node) {
            self.added = true;
            self.nodes.insert(node.to_owned(), NodeState::new(now_us));
        }
        self.nodes
            .get_mut(node)
            .expect("a node is known once inserted")
    }

    /// A stream of `node`'s agent ended.
    pub fn stream_closed(&mut self, node: &str, end: StreamEnd) {
        if let Some(state) = self.nodes.get_mut(node) {
            state.streams = state.streams.saturating_sub(1);
            state.last_end = Some(end);
        }
    }

    /// The nodes silent now, as silences known from before (for the alert
    /// task when it starts).
    pub fn silences(&self) -> Vec<Silence> {
        self.nodes
            .iter()
            .filter_map(|(name, node)| {
                let at_us = node.silent_since_us?;
                Some(Silence {
                    node: name.clone(),
                    at_us,
                    last_heard_us: node.last_heard_us,
                    threshold_us: self.threshold_us(node),
                    jobs: node.jobs.clone(),
                    restored: true,
                })
            })
            .collect()
    }

    /// The nodes [`NodeWatch::check`] would find silent at `now_us`; nothing
    /// changes.
    pub fn due(&self, now_us: i64) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|(_, node)| is_due(self.silence_after_us, node, now_us))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Stops watching `node`, which streams to another collector now,
    /// unless it was heard from since it was [`NodeWatch::due`]: true when
    /// it is forgotten.
    pub fn forget_if_due(&mut self, node: &str, now_us: i64) -> bool {
        let due = self
            .nodes
            .get(node)
            .is_some_and(|state| is_due(self.silence_after_us, state, now_us));
        if due {
            self.nodes.remove(node);
            self.dirty = true;
        }
        due
    }

    /// What changed by `now_us`: nodes that passed their threshold without
    /// a batch, and silent nodes forgotten after [`NODE_RETENTION`].
    pub fn check(&mut self, now_us: i64) -> Vec<NodeChange> {
        let mut changes = Vec::new();
        let mut forgotten = Vec::new();
        for (name, node) in &mut self.nodes {
            if let Some(since) = node.silent_since_us {
                if now_us.saturating_sub(since) >= duration_us(NODE_RETENTION) {
                    forgotten.push(name.clone());
                }
                continue;
            }
            if is_due(self.silence_after_us, node, now_us) {
                let threshold = threshold_us(self.silence_after_us, node);
                node.silent_since_us = Some(now_us);
                changes.push(NodeChange::Silent(Silence {
                    node: name.clone(),
                    at_us: now_us,
                    last_heard_us: node.last_heard_us,
                    threshold_us: threshold,
                    jobs: node.jobs.clone(),
                    restored: false,
                }));
            }
        }
        for name in forgotten {
            self.nodes.remove(&name);
            changes.push(NodeChange::Forgotten {
                node: name,
                at_us: now_us,
            });
        }
        if !changes.is_empty() {
            self.dirty = true;
        }
        changes
    }

    /// The `event` row of a change: `node_silent` or `node_back`; none for
    /// a restored silence (it has its row) or a forgotten node.
    pub fn event(&self, change: &NodeChange) -> Option<NodeEvent> {
        match change {
            NodeChange::Silent(s) if !s.restored => {
                let state = self.nodes.get(&s.node);
                let why = match state.and_then(NodeState::interval_us) {
                    Some(interval) if interval.saturating_mul(INTERVALS) >= s.threshold_us => {
                        format!("{INTERVALS} × its interval of {}", seconds(interval))
                    }
                    Some(interval) => format!(
                        "--node-silence-after; its interval is {}",
                        seconds(interval)
                    ),
                    None => format!(
                        "its interval is not known yet, taken as {}",
                        seconds(duration_us(UNKNOWN_INTERVAL))
                    ),
                };
                let last_tick = state
                    .map(|n| n.last_tick_us)
                    .filter(|t| *t > 0)
                    .map_or("none".to_owned(), rfc3339);
                let stream = state.map_or("", NodeState::stream_words);
                let mut detail = format!(
                    "no batch for {} (threshold {}: {why}); last sample {last_tick}; {stream}",
                    seconds(s.at_us - s.last_heard_us),
                    seconds(s.threshold_us),
                );
                if s.jobs.len() > 1 {
                    detail.push_str(&format!("; jobs {}", s.jobs.join(",")));
                }
                Some(NodeEvent {
                    ts_us: s.at_us,
                    node: s.node.clone(),
                    kind: EventKind::NodeSilent as i32,
                    silent_ms: silent_ms(s.last_heard_us, s.at_us),
                    detail,
                    job_id: one_job(&s.jobs),
                })
            }
            NodeChange::Back {
                node,
                at_us,
                last_heard_us,
                jobs,
            } => {
                let mut detail = format!(
                    "heard from again after {} without a batch",
                    seconds(at_us - last_heard_us)
                );
                if jobs.len() > 1 {
                    detail.push_str(&format!("; jobs before the silence {}", jobs.join(",")));
                }
                Some(NodeEvent {
                    ts_us: *at_us,
                    node: node.clone(),
                    kind: EventKind::NodeBack as i32,
                    silent_ms: silent_ms(*last_heard_us, *at_us),
                    detail,
                    job_id: one_job(jobs),
                })
            }
            NodeChange::Silent(_) | NodeChange::Forgotten { .. } | NodeChange::Moved { .. } => None,
        }
    }

    /// Whether anything changed since the last [`NodeWatch::saved`].
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Whether a node was added since the last [`NodeWatch::saved`].
    pub fn has_new_nodes(&self) -> bool {
        self.added
    }

    /// The state file's content now; marks the watch saved.
    pub fn saved(&mut self) -> Vec<u8> {
        self.dirty = false;
        self.added = false;
        let saved = SavedNodes {
            version: 1,
            nodes: self.nodes.clone(),
        };
        serde_json::to_vec_pretty(&saved).unwrap_or_default()
    }
}

/// The state file: every node known.
#[derive(Debug, Default, Serialize, Deserialize)]
struct SavedNodes {
    version: u32,
    nodes: BTreeMap<String, NodeState>,
}

/// Why the node state file could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read node state {path}: {reason}; move it aside to start without it")]
pub struct StateError {
    pub path: std::path::PathBuf,
    pub reason: String,
}

/// Reads the nodes saved in `path`; none when it does not exist.
pub fn load(path: &Path) -> Result<BTreeMap<String, NodeState>, StateError> {
    let error = |reason: String| StateError {
        path: path.to_owned(),
        reason,
    };
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(error(e.to_string())),
    };
    let saved: SavedNodes = serde_json::from_slice(&bytes).map_err(|e| error(e.to_string()))?;
    Ok(saved.nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gputel_proto::{GpuSample, NodeSample};

    const S: i64 = 1_000_000;
    const T0: i64 = 1_795_240_800_000_000;

    /// A batch of one tick at `T0 + ts_s` with the node's jobs.
    fn tick(ts_s: f64, jobs: &[&str]) -> Batch {
        let ts_us = T0 + (ts_s * 1e6).round() as i64;
        Batch {
            seq: 1,
            node: vec![NodeSample {
                ts_us,
                jobs: jobs.iter().map(|j| (*j).to_owned()).collect(),
                ..Default::default()
            }],
            gpu: vec![GpuSample {
                ts_us,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// A node sending one tick every `interval_s`, arriving `delay_s` after
    /// the tick, for `ticks` ticks from T0.
    fn steady(watch: &mut NodeWatch, node: &str, interval_s: f64, ticks: u32, delay_s: f64) {
        for i in 0..ticks {
            let ts = f64::from(i) * interval_s;
            let arrival = T0 + ((ts + delay_s) * 1e6).round() as i64;
            assert_eq!(watch.heard(node, Some(&tick(ts, &["4242"])), arrival), None);
        }
    }

    fn threshold_s(watch: &NodeWatch, node: &str) -> f64 {
        watch.threshold_us(&watch.nodes()[node]) as f64 / 1e6
    }

    #[test]
    fn the_threshold_is_three_intervals_or_the_configured_least() {
        let mut watch = NodeWatch::new(Duration::from_secs(30));
        // Unknown after one tick: 3 × 60 s.
        steady(&mut watch, "one-tick", 1.0, 1, 0.0);
        assert_eq!(threshold_s(&watch, "one-tick"), 180.0);
        // 1 s ticks: 3 s is under the 30 s least.
        steady(&mut watch, "fast", 1.0, 20, 0.2);
        assert_eq!(watch.nodes()["fast"].interval_us(), Some(S));
        assert_eq!(threshold_s(&watch, "fast"), 30.0);
        // 15 s ticks (the Acme study's DCGM cadence): 45 s.
        steady(&mut watch, "dcgm", 15.0, 20, 0.5);
        assert_eq!(threshold_s(&watch, "dcgm"), 45.0);
        // With no least, three intervals of 100 ms.
        let mut quick = NodeWatch::new(Duration::ZERO);
        steady(&mut quick, "n", 0.1, 10, 0.0);
        assert_eq!(threshold_s(&quick, "n"), 0.3);
    }

    #[test]
    fn the_interval_is_the_median_gap_of_ticks_not_of_arrivals() {
        let mut watch = NodeWatch::new(Duration::ZERO);
        // Ticks every second; one skipped (a slow tick), and the arrivals
        // of a spool's resend: ten ticks at once.
        for ts in [0.0, 1.0, 2.0, 4.0, 5.0] {
            watch.heard("n", Some(&tick(ts, &[])), T0 + (ts * 1e6) as i64);
        }
        for ts in 6..16 {
            watch.heard("n", Some(&tick(f64::from(ts), &[])), T0 + 20 * S);
        }
        assert_eq!(watch.nodes()["n"].interval_us(), Some(S));
        // A resent older batch, and a batch that failed validation, teach
        // nothing about the interval; both count as heard.
        watch.heard("n", Some(&tick(3.0, &[])), T0 + 21 * S);
        watch.heard("n", None, T0 + 22 * S);
        let node = &watch.nodes()["n"];
        assert_eq!(node.gaps_us.len(), GAPS_KEPT);
        assert_eq!(node.last_tick_us, T0 + 15 * S);
        assert_eq!(node.last_heard_us, T0 + 22 * S);
        // The interval follows a new --interval once most gaps have it.
        for i in 1..=5 {
            let ts = 15.0 + 10.0 * f64::from(i);
            watch.heard("n", Some(&tick(ts, &[])), T0 + (ts * 1e6) as i64);
        }
        assert_eq!(watch.nodes()["n"].interval_us(), Some(10 * S));
    }

    #[test]
    fn a_node_is_silent_once_past_its_threshold_and_back_at_its_next_batch() {
        let mut watch = NodeWatch::new(Duration::from_secs(2));
        // 1 s ticks, the last arriving at T0 + 9.2 s: threshold 3 s.
        steady(&mut watch, "n", 1.0, 10, 0.2);
        watch.stream_opened("n", T0);
        assert!(watch.check(T0 + 12 * S).is_empty());
        let changes = watch.check(T0 + 12_300_000);
        let silence = Silence {
            node: "n".into(),
            at_us: T0 + 12_300_000,
            last_heard_us: T0 + 9_200_000,
            threshold_us: 3 * S,
            jobs: vec!["4242".into()],
            restored: false,
        };
        assert_eq!(changes, [NodeChange::Silent(silence.clone())]);
        let event = watch.event(&changes[0]).expect("a node_silent row");
        assert_eq!(event.kind, EventKind::NodeSilent as i32);
        assert_eq!(
            (event.ts_us, event.silent_ms, event.job_id.as_deref()),
            (T0 + 12_300_000, 3100, Some("4242"))
        );
        assert_eq!(
            event.detail,
            "no batch for 3.1 s (threshold 3.0 s: 3 × its interval of 1.0 s); \
             last sample 2026-11-21T06:00:09.000Z; its stream is open"
        );
        // Silent once: no second event while it stays silent.
        assert!(watch.check(T0 + 60 * S).is_empty());
        assert_eq!(
            watch.silences(),
            [Silence {
                restored: true,
                ..silence
            }]
        );

        let back = watch.heard("n", Some(&tick(70.0, &["5151"])), T0 + 70_500_000);
        let back = back.expect("back");
        assert_eq!(
            back,
            NodeChange::Back {
                node: "n".into(),
                at_us: T0 + 70_500_000,
                last_heard_us: T0 + 9_200_000,
                jobs: vec!["4242".into()],
            }
        );
        let event = watch.event(&back).expect("a node_back row");
        assert_eq!(
            (event.kind, event.silent_ms, event.job_id.as_deref()),
            (EventKind::NodeBack as i32, 61_300, Some("4242"))
        );
        assert_eq!(
            event.detail,
            "heard from again after 61.3 s without a batch"
        );
        assert!(watch.silences().is_empty());
        // Its interval stays 1 s: the gap across the silence is one of nine.
        assert_eq!(threshold_s(&watch, "n"), 3.0);
    }

    #[test]
    fn a_clean_stop_is_silence_too_and_says_so() {
        let mut watch = NodeWatch::new(Duration::from_secs(1));
        watch.stream_opened("n", T0);
        steady(&mut watch, "n", 0.5, 4, 0.0);
        watch.stream_closed("n", StreamEnd::Closed);
        let changes = watch.check(T0 + 5 * S);
        assert_eq!(changes.len(), 1);
        let event = watch.event(&changes[0]).expect("event");
        assert!(
            event.detail.ends_with("; its agent closed its stream"),
            "{}",
            event.detail
        );
        assert_eq!(event.silent_ms, 3500);
    }

    #[test]
    fn nodes_known_before_a_restart_get_a_grace_to_reconnect() {
        let mut before = NodeWatch::new(Duration::from_secs(2));
        assert!(!before.has_new_nodes());
        steady(&mut before, "up", 1.0, 10, 0.0);
        assert!(before.has_new_nodes());
        steady(&mut before, "silent", 1.0, 10, 0.0);
        assert_eq!(before.check(T0 + 13 * S).len(), 2);
        for ts in [10_i32, 11] {
            let back = before.heard(
                "up",
                Some(&tick(f64::from(ts), &[])),
                T0 + i64::from(ts) * S,
            );
            assert_eq!(back.is_some(), ts == 10);
        }
        let file: SavedNodes =
            serde_json::from_slice(&before.saved()).expect("the state file parses");
        assert!(!before.is_dirty() && !before.has_new_nodes());

        // The collector was down for ten minutes.
        let start = T0 + 600 * S;
        let mut after = NodeWatch::restore(Duration::from_secs(2), file.nodes, start);
        // The silent node stays silent without a second event; the other
        // is not silent before the grace ends, even though its last batch
        // is ten minutes old.
        assert!(after.check(start).is_empty());
        assert!(after.check(start + 89 * S).is_empty());
        assert_eq!(after.silences().len(), 1);
        assert_eq!(after.silences()[0].node, "silent");
        // It reconnects within the grace: it is never silent.
        after.heard("up", Some(&tick(660.0, &[])), start + 60 * S);
        assert!(after.check(start + 62 * S).is_empty());
        assert_eq!(after.check(start + 63 * S).len(), 1);

        // A node that never reconnects is silent once the grace ends.
        let file: SavedNodes = serde_json::from_slice(&before.saved()).unwrap();
        let mut again = NodeWatch::restore(Duration::from_secs(2), file.nodes, start);
        let changes = again.check(start + 90 * S);
        assert_eq!(changes.len(), 1);
        let NodeChange::Silent(s) = &changes[0] else {
            panic!("{changes:?}")
        };
        assert_eq!((s.node.as_str(), s.restored), ("up", false));
        let event = again.event(&changes[0]).unwrap();
        assert!(
            event
                .detail
                .ends_with("; it has not connected since the collector started"),
            "{}",
            event.detail
        );
        // Its silence counts from its last batch, before the restart.
        assert_eq!(
            event.silent_ms,
            (start + 90 * S - (T0 + 11 * S)) as u64 / 1000
        );
    }

    /// The state file saved before the last node events the log holds:
    /// replaying them makes the node silent (then back, then silent) as
    /// the events say, without a new event.
    #[test]
    fn node_events_replayed_from_the_log_have_the_last_word() {
        let mut before = NodeWatch::new(Duration::from_secs(2));
        steady(&mut before, "n", 1.0, 10, 0.0);
        let saved: SavedNodes = serde_json::from_slice(&before.saved()).unwrap();
        // Logged after that save: silent at 12 s, back at 20 s, silent at 30 s.
        let changes = before.check(T0 + 12 * S);
        let silent = before.event(&changes[0]).unwrap();
        let back = before
            .heard("n", Some(&tick(20.0, &[])), T0 + 20 * S)
            .unwrap();
        let back = before.event(&back).unwrap();
        let again = before.check(T0 + 30 * S);
        let again = before.event(&again[0]).unwrap();

        let start = T0 + 40 * S;
        let mut after = NodeWatch::restore(Duration::from_secs(2), saved.nodes.clone(), start);
        after.replay(&[silent.clone(), back.clone()]);
        assert!(after.silences().is_empty());
        assert_eq!(after.nodes()["n"].last_heard_us, T0 + 20 * S);
        let mut after = NodeWatch::restore(Duration::from_secs(2), saved.nodes, start);
        after.replay(&[silent, back, again]);
        let silences = after.silences();
        assert_eq!(silences.len(), 1);
        assert_eq!(silences[0].at_us, T0 + 30 * S);
        assert!(after.check(start + 100 * S).is_empty());
        // A node the state file never held is known from its event.
        let mut fresh = NodeWatch::new(Duration::from_secs(2));
        fresh.replay(&[NodeEvent {
            ts_us: T0 + 5 * S,
            node: "m".into(),
            kind: EventKind::NodeSilent as i32,
            silent_ms: 3000,
            detail: String::new(),
            job_id: None,
        }]);
        assert_eq!(fresh.silences()[0].last_heard_us, T0 + 2 * S);
    }

    #[test]
    fn a_node_silent_for_a_week_is_forgotten() {
        let mut watch = NodeWatch::new(Duration::from_secs(30));
        steady(&mut watch, "n", 1.0, 5, 0.0);
        assert_eq!(watch.check(T0 + 40 * S).len(), 1);
        let week = duration_us(NODE_RETENTION);
        assert!(watch.check(T0 + 40 * S + week - 1).is_empty());
        let changes = watch.check(T0 + 40 * S + week);
        assert_eq!(
            changes,
            [NodeChange::Forgotten {
                node: "n".into(),
                at_us: T0 + 40 * S + week
            }]
        );
        assert_eq!(watch.event(&changes[0]), None);
        assert!(watch.nodes().is_empty());
    }

    #[test]
    fn a_due_node_is_forgotten_only_while_still_due() {
        let mut watch = NodeWatch::new(Duration::from_secs(30));
        steady(&mut watch, "a", 1.0, 5, 0.0);
        steady(&mut watch, "b", 1.0, 5, 0.0);
        // Last heard at 4 s, 30 s threshold: due from 34 s, and nothing changed by asking.
        assert!(watch.due(T0 + 33 * S).is_empty());
        let mut due = watch.due(T0 + 34 * S);
        due.sort();
        assert_eq!(due, ["a", "b"]);
        // b is heard from again before it is forgotten: kept.
        watch.heard("b", Some(&tick(34.0, &["4242"])), T0 + 34 * S);
        assert!(watch.forget_if_due("a", T0 + 34 * S));
        assert!(!watch.forget_if_due("b", T0 + 34 * S));
        assert_eq!(watch.nodes().keys().collect::<Vec<_>>(), ["b"]);
        // A silent node is no longer due.
        assert_eq!(watch.check(T0 + 70 * S).len(), 1);
        assert!(watch.due(T0 + 70 * S).is_empty());
    }

    #[test]
    fn a_shared_node_has_no_single_job_and_lists_them() {
        let mut watch = NodeWatch::new(Duration::from_secs(1));
        watch.heard("n", Some(&tick(0.0, &["1", "2"])), T0);
        watch.heard("n", Some(&tick(1.0, &["1", "2"])), T0 + S);
        let changes = watch.check(T0 + 10 * S);
        let event = watch.event(&changes[0]).unwrap();
        assert_eq!(event.job_id, None);
        assert!(event.detail.ends_with("; jobs 1,2"), "{}", event.detail);
    }

    #[test]
    fn a_damaged_state_file_is_refused_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATE_FILE);
        assert!(load(&path).unwrap().is_empty());
        std::fs::write(&path, "{").unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("cannot read node state {}", path.display())),
            "{e}"
        );
        assert!(e.ends_with("move it aside to start without it"), "{e}");
    }
}
