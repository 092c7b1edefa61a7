//! Rule evaluation on the stream: a state machine per (rule, node, GPU) fed
//! with samples and their sample times (never the wall clock), so that the
//! same samples always give the same alerts.
//!
//! inactive → pending (condition holds) → firing (held for `for`) →
//! resolved (the clear condition held for `clear-for`) → inactive. Between
//! the threshold and the clear level a firing alert stays firing (a pending
//! one falls back to inactive: `for` means the condition held throughout):
//! that is the hysteresis that keeps a GPU hovering at the threshold from
//! flapping.
//!
//! A node that falls silent (see `crate::silence`) is not a sample: the
//! node watch tells the evaluator, which resolves the node's alerts (their
//! data stopped, as Prometheus' staleness resolves the alerts of a target
//! that is down), drops its pending ones and fires the `up` rules for it;
//! when the node is heard from again, those resolve and its samples are
//! evaluated afresh.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use gputel_proto::GpuSample;
use gputel_runtime::time::duration_us;
use serde::{Deserialize, Serialize};

use super::rules::{Condition, Metric, Rule, RuleSet, xid_matches};
use crate::silence::Silence;
use crate::write::AlertInput;

/// Why an alert resolved other than by its own clear condition (the
/// `alert` table's `reason`, and an annotation in Alertmanager).
pub mod reason {
    /// Its node fell silent: its data stopped.
    pub const NODE_SILENT: &str = "node_silent";
    /// Its rule left the rules file.
    pub const RULE_REMOVED: &str = "rule_removed";
    /// Its node was silent for a week and is no longer watched.
    pub const NODE_FORGOTTEN: &str = "node_forgotten";
}

/// What one sample says about a rule's condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// The condition holds.
    Breach,
    /// Neither breached nor clear (between threshold and clear level).
    Hold,
    /// The clear condition holds.
    Clear,
}

/// Where one alert stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    Inactive,
    /// The condition has held since `since_us`, not yet for `for`.
    Pending {
        since_us: i64,
    },
    /// Firing since `starts_at_us`; the clear condition has held since
    /// `clearing_since_us`, not yet for `clear-for`.
    Firing {
        starts_at_us: i64,
        clearing_since_us: Option<i64>,
    },
}

/// A change worth telling someone about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Pending,
    /// No longer pending, without having fired.
    Cancelled,
    Firing {
        starts_at_us: i64,
    },
    Resolved {
        starts_at_us: i64,
        ends_at_us: i64,
    },
}

/// The state machine of one alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tracker {
    pub phase: Phase,
    /// Sample time of the last observation; older samples are ignored.
    pub last_ts_us: i64,
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker {
            phase: Phase::Inactive,
            last_ts_us: i64::MIN,
        }
    }
}

impl Tracker {
    /// Feeds one observation at sample time `ts_us`.
    pub fn observe(
        &mut self,
        level: Level,
        ts_us: i64,
        for_us: i64,
        clear_for_us: i64,
    ) -> Option<Change> {
        if ts_us < self.last_ts_us {
            return None;
        }
        self.last_ts_us = ts_us;
        match (self.phase, level) {
            (Phase::Inactive, Level::Breach) => {
                if for_us == 0 {
                    self.fire(ts_us)
                } else {
                    self.phase = Phase::Pending { since_us: ts_us };
                    Some(Change::Pending)
                }
            }
            (Phase::Inactive, _) => None,
            (Phase::Pending { since_us }, Level::Breach) => (ts_us - since_us >= for_us)
                .then(|| self.fire(ts_us))
                .flatten(),
            // `for` asks for the condition itself to hold throughout; the
            // clear level only delays resolution.
            (Phase::Pending { .. }, Level::Hold | Level::Clear) => {
                self.phase = Phase::Inactive;
                Some(Change::Cancelled)
            }
            (Phase::Firing { starts_at_us, .. }, Level::Breach | Level::Hold) => {
                self.phase = Phase::Firing {
                    starts_at_us,
                    clearing_since_us: None,
                };
                None
            }
            (
                Phase::Firing {
                    starts_at_us,
                    clearing_since_us,
                },
                Level::Clear,
            ) => {
                let since = clearing_since_us.unwrap_or(ts_us);
                if ts_us - since >= clear_for_us {
                    self.phase = Phase::Inactive;
                    Some(Change::Resolved {
                        starts_at_us,
                        ends_at_us: ts_us,
                    })
                } else {
                    self.phase = Phase::Firing {
                        starts_at_us,
                        clearing_since_us: Some(since),
                    };
                    None
                }
            }
        }
    }

    fn fire(&mut self, ts_us: i64) -> Option<Change> {
        self.phase = Phase::Firing {
            starts_at_us: ts_us,
            clearing_since_us: None,
        };
        Some(Change::Firing {
            starts_at_us: ts_us,
        })
    }
}

/// Identifies one alert: a rule on a GPU, or on a node (`gpu` None).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AlertKey {
    pub rule: String,
    pub node: String,
    pub gpu: Option<u32>,
}

impl AlertKey {
    /// A stable text form, for maps keyed by alert.
    pub fn fingerprint(&self) -> String {
        match self.gpu {
            Some(gpu) => format!("{}/{}/{gpu}", self.rule, self.node),
            None => format!("{}/{}", self.rule, self.node),
        }
    }
}

/// An alert that is pending or firing, with what it says about its GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tracked {
    pub tracker: Tracker,
    pub uuid: Option<String>,
    pub model: Option<String>,
    pub job_id: Option<String>,
    /// The value at the last observation (or of the firing sample).
    pub value: Option<f64>,
    /// Sample time of the last matching XID event.
    #[serde(default)]
    pub last_event_us: Option<i64>,
    /// The threshold it fired at, where it is the alert's own (an `up`
    /// alert's silence threshold, s); otherwise the rule's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
}

/// A firing or resolution (or a pending change, which is not notified).
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub key: AlertKey,
    pub change: Change,
    /// Sample time of the transition.
    pub ts_us: i64,
    pub rule: Arc<Rule>,
    pub uuid: Option<String>,
    pub model: Option<String>,
    pub job_id: Option<String>,
    pub value: Option<f64>,
    pub threshold: Option<f64>,
    /// Why it resolved, when not by its own clear condition (see [`reason`]).
    pub reason: Option<&'static str>,
}

/// A node silent now, with what its `up` alerts say.
#[derive(Debug, Clone, PartialEq)]
struct SilentNode {
    /// When it fell silent.
    since_us: i64,
    /// The silence that made it silent, s.
    threshold_s: f64,
    /// The jobs on its GPUs at its last tick, comma-separated.
    jobs: Option<String>,
}

/// Every alert's state under one set of rules.
#[derive(Debug, Default)]
pub struct Evaluator {
    rules: Vec<Arc<Rule>>,
    /// Pending and firing alerts only: an inactive one holds no memory.
    states: BTreeMap<AlertKey, Tracked>,
    /// The latest model and job of each GPU, for XID alerts.
    gpus: HashMap<(String, u32), (String, Option<String>)>,
    /// Nodes silent now.
    silent: BTreeMap<String, SilentNode>,
}

impl Evaluator {
    /// An evaluator with these rules and saved states.
    pub fn new(rules: &RuleSet, states: BTreeMap<AlertKey, Tracked>) -> Evaluator {
        let mut evaluator = Evaluator {
            rules: Vec::new(),
            states,
            ..Evaluator::default()
        };
        evaluator.set_rules(rules);
        evaluator
    }

    /// An evaluator without rules holding saved states; [`Evaluator::set_rules`]
    /// then drops those of rules that are gone.
    pub fn restore(states: BTreeMap<AlertKey, Tracked>) -> Evaluator {
        Evaluator {
            rules: Vec::new(),
            states,
            ..Evaluator::default()
        }
    }

    /// Replaces the rules. Alerts of rules still present keep their state;
    /// those of removed rules are dropped and returned (firing ones must be
    /// resolved by the caller).
    pub fn set_rules(&mut self, rules: &RuleSet) -> Vec<(AlertKey, Tracked)> {
        self.rules = rules.rules.iter().cloned().map(Arc::new).collect();
        let names: std::collections::HashSet<&str> =
            self.rules.iter().map(|r| r.name.as_str()).collect();
        let gone: Vec<AlertKey> = self
            .states
            .keys()
            .filter(|k| !names.contains(k.rule.as_str()))
            .cloned()
            .collect();
        gone.into_iter()
            .filter_map(|k| self.states.remove(&k).map(|t| (k, t)))
            .collect()
    }

    /// The rules in force.
    pub fn rules(&self) -> &[Arc<Rule>] {
        &self.rules
    }

    /// Pending and firing alerts.
    pub fn states(&self) -> &BTreeMap<AlertKey, Tracked> {
        &self.states
    }

    /// The rule named `name`.
    pub fn rule(&self, name: &str) -> Option<Arc<Rule>> {
        self.rules.iter().find(|r| r.name == name).cloned()
    }

    /// `s.node` fell silent at `s.at_us`: its firing alerts resolve (reason
    /// [`reason::NODE_SILENT`]), its pending ones are dropped, and every
    /// `up` rule fires for it. Told again for a silence from before a
    /// restart, it changes only what is not so already.
    pub fn node_silent(&mut self, s: &Silence) -> Vec<Transition> {
        self.silent.insert(
            s.node.clone(),
            SilentNode {
                since_us: s.at_us,
                threshold_s: s.threshold_us as f64 / 1e6,
                jobs: (!s.jobs.is_empty()).then(|| s.jobs.join(",")),
            },
        );
        let keys: Vec<AlertKey> = self
            .states
            .keys()
            .filter(|k| k.node == s.node)
            .cloned()
            .collect();
        let mut out = Vec::new();
        for key in keys {
            let rule = self.rule(&key.rule);
            if rule.as_ref().is_some_and(|r| r.metric == Metric::Up) {
                continue;
            }
            let (Some(rule), Some(tracked)) = (rule, self.states.remove(&key)) else {
                continue;
            };
            if let Phase::Firing { starts_at_us, .. } = tracked.tracker.phase {
                let ends_at_us = s.at_us.max(tracked.tracker.last_ts_us).max(starts_at_us);
                out.push(Transition {
                    key,
                    change: Change::Resolved {
                        starts_at_us,
                        ends_at_us,
                    },
                    ts_us: ends_at_us,
                    threshold: tracked.threshold.or(rule.threshold()),
                    rule,
                    uuid: tracked.uuid,
                    model: tracked.model,
                    job_id: tracked.job_id,
                    value: tracked.value,
                    reason: Some(reason::NODE_SILENT),
                });
            }
        }
        out.extend(self.fire_silent());
        out
    }

    /// Fires every `up` rule for every silent node it does not fire for
    /// yet (a node that just fell silent, a rule just added).
    pub fn fire_silent(&mut self) -> Vec<Transition> {
        let mut out = Vec::new();
        for rule in self.rules.iter().filter(|r| r.metric == Metric::Up) {
            for (node, silent) in &self.silent {
                let key = AlertKey {
                    rule: rule.name.clone(),
                    node: node.clone(),
                    gpu: None,
                };
                if self.states.contains_key(&key) {
                    continue;
                }
                let tracked = Tracked {
                    tracker: Tracker {
                        phase: Phase::Firing {
                            starts_at_us: silent.since_us,
                            clearing_since_us: None,
                        },
                        last_ts_us: silent.since_us,
                    },
                    uuid: None,
                    model: None,
                    job_id: silent.jobs.clone(),
                    value: Some(0.0),
                    last_event_us: None,
                    threshold: Some(silent.threshold_s),
                };
                self.states.insert(key.clone(), tracked);
                out.push(Transition {
                    key,
                    change: Change::Firing {
                        starts_at_us: silent.since_us,
                    },
                    ts_us: silent.since_us,
                    rule: Arc::clone(rule),
                    uuid: None,
                    model: None,
                    job_id: silent.jobs.clone(),
                    value: Some(0.0),
                    threshold: Some(silent.threshold_s),
                    reason: None,
                });
            }
        }
        out
    }

    /// `node` was heard from again at `at_us`: its `up` alerts resolve
    /// (value 1), and its samples count again.
    pub fn node_back(&mut self, node: &str, at_us: i64) -> Vec<Transition> {
        self.silent.remove(node);
        self.resolve_up(node, at_us, 1.0, None)
    }

    /// `node` streams to another collector now, which evaluates its samples
    /// from here on: its alerts, pending and firing, are dropped without a
    /// transition. Returns the keys of those that were firing.
    pub fn node_moved(&mut self, node: &str) -> Vec<AlertKey> {
        self.silent.remove(node);
        let mut firing = Vec::new();
        for key in self.keys_of(node) {
            if let Some(tracked) = self.states.remove(&key)
                && matches!(tracked.tracker.phase, Phase::Firing { .. })
            {
                firing.push(key);
            }
        }
        firing
    }

    /// The keys of `node`'s alerts, pending and firing.
    fn keys_of(&self, node: &str) -> Vec<AlertKey> {
        self.states
            .keys()
            .filter(|k| k.node == node)
            .cloned()
            .collect()
    }

    /// `node` was silent for a week and is no longer watched: its `up`
    /// alerts resolve (reason [`reason::NODE_FORGOTTEN`]).
    pub fn node_forgotten(&mut self, node: &str, at_us: i64) -> Vec<Transition> {
        self.silent.remove(node);
        self.resolve_up(node, at_us, 0.0, Some(reason::NODE_FORGOTTEN))
    }

    fn resolve_up(
        &mut self,
        node: &str,
        at_us: i64,
        value: f64,
        why: Option<&'static str>,
    ) -> Vec<Transition> {
        let mut out = Vec::new();
        for key in self.keys_of(node) {
            let Some(rule) = self.rule(&key.rule).filter(|r| r.metric == Metric::Up) else {
                continue;
            };
            let Some(tracked) = self.states.remove(&key) else {
                continue;
            };
            let Phase::Firing { starts_at_us, .. } = tracked.tracker.phase else {
                continue;
            };
            let ends_at_us = at_us.max(starts_at_us);
            out.push(Transition {
                key,
                change: Change::Resolved {
                    starts_at_us,
                    ends_at_us,
                },
                ts_us: ends_at_us,
                rule,
                uuid: None,
                model: None,
                job_id: tracked.job_id,
                value: Some(value),
                threshold: tracked.threshold,
                reason: why,
            });
        }
        out
    }

    /// Feeds one batch's readings; returns what changed, in sample order per alert.
    pub fn observe(&mut self, input: &AlertInput) -> Vec<Transition> {
        let mut out = Vec::new();
        // Queued before its node fell silent: its samples are older than
        // the silence, whose resolutions stand.
        if self.silent.contains_key(&input.node) {
            return out;
        }
        // Rules are about physical GPUs: a MIG device's row has no
        // temperature or power of its own (its GPU's row has them).
        let mut gpus: Vec<&GpuSample> = input
            .gpus
            .iter()
            .filter(|g| g.gpu_instance_id.is_none())
            .collect();
        gpus.sort_by_key(|g| (g.ts_us, g.gpu));
        for g in &gpus {
            self.gpus.insert(
                (input.node.clone(), g.gpu),
                (g.model.clone(), g.job_id.clone()),
            );
        }
        let rules = self.rules.clone();
        for rule in &rules {
            match &rule.condition {
                Condition::Xid {
                    codes,
                    categories,
                    clear_after,
                } => {
                    for x in &input.xids {
                        if xid_matches(codes, categories, x.code) {
                            let (model, job) = self
                                .gpus
                                .get(&(input.node.clone(), x.gpu))
                                .cloned()
                                .map_or((None, None), |(m, j)| (Some(m), j));
                            let point = Point {
                                ts_us: x.ts_us,
                                gpu: Some(x.gpu),
                                uuid: Some(&x.uuid),
                                model: model.as_deref(),
                                job_id: x.job_id.as_deref().or(job.as_deref()),
                                value: Some(x.code as f64),
                                threshold: None,
                            };
                            self.step(
                                rule,
                                &input.node,
                                &point,
                                Some(Level::Breach),
                                true,
                                &mut out,
                            );
                        }
                    }
                    // Sample time moves on with the GPU's ticks; the alert
                    // clears once `clear_after` passes without an event.
                    for g in &gpus {
                        let key = AlertKey {
                            rule: rule.name.clone(),
                            node: input.node.clone(),
                            gpu: Some(g.gpu),
                        };
                        let Some(last) = self.states.get(&key).and_then(|t| t.last_event_us) else {
                            continue;
                        };
                        let level = if g.ts_us - last >= duration_us(*clear_after) {
                            Level::Clear
                        } else {
                            Level::Hold
                        };
                        let point = Point::of(g, None, None);
                        self.step(rule, &input.node, &point, Some(level), false, &mut out);
                    }
                }
                // Judged by the node watch, not by samples.
                Condition::Silence => {}
                Condition::Throttle { mask } => {
                    for g in &gpus {
                        let level = g.clock_event_reasons.map(|r| {
                            if r & mask != 0 {
                                Level::Breach
                            } else {
                                Level::Clear
                            }
                        });
                        let value = g.clock_event_reasons.map(|r| (r & mask) as f64);
                        let point = Point::of(g, value, Some(*mask as f64));
                        self.step(rule, &input.node, &point, level, false, &mut out);
                    }
                }
                Condition::Threshold {
                    op,
                    threshold,
                    clear,
                    relative_to_limit,
                } => {
                    let level_of = |v: f64| {
                        if op.holds(v, *threshold) {
                            Level::Breach
                        } else if op.holds(v, *clear) {
                            Level::Hold
                        } else {
                            Level::Clear
                        }
                    };
                    if rule.metric == Metric::NodePower {
                        for tick in node_ticks(&gpus, *relative_to_limit) {
                            let point = Point {
                                ts_us: tick.ts_us,
                                gpu: None,
                                uuid: None,
                                model: None,
                                job_id: tick.jobs.as_deref(),
                                value: tick.value,
                                threshold: Some(*threshold),
                            };
                            let level = tick.value.map(level_of);
                            self.step(rule, &input.node, &point, level, false, &mut out);
                        }
                        continue;
                    }
                    for g in &gpus {
                        let value = gpu_value(rule.metric, g, *relative_to_limit);
                        let point = Point::of(g, value, Some(*threshold));
                        self.step(
                            rule,
                            &input.node,
                            &point,
                            value.map(level_of),
                            false,
                            &mut out,
                        );
                    }
                }
            }
        }
        out
    }

    /// Feeds one observation to the alert of `rule` at `point`.
    fn step(
        &mut self,
        rule: &Arc<Rule>,
        node: &str,
        point: &Point<'_>,
        level: Option<Level>,
        event: bool,
        out: &mut Vec<Transition>,
    ) {
        let Some(level) = level else {
            return;
        };
        let key = AlertKey {
            rule: rule.name.clone(),
            node: node.to_owned(),
            gpu: point.gpu,
        };
        if level != Level::Breach && !self.states.contains_key(&key) {
            return;
        }
        let tracked = self.states.entry(key.clone()).or_insert_with(|| Tracked {
            tracker: Tracker::default(),
            uuid: None,
            model: None,
            job_id: None,
            value: None,
            last_event_us: None,
            threshold: None,
        });
        if event {
            tracked.last_event_us = Some(point.ts_us);
        }
        let firing = matches!(tracked.tracker.phase, Phase::Firing { .. });
        let change = tracked.tracker.observe(
            level,
            point.ts_us,
            duration_us(rule.for_),
            duration_us(rule.clear_for),
        );
        // A firing alert keeps the identity it fired with, so Alertmanager
        // sees one alert, not a new one whenever the job changes.
        if !firing || matches!(change, Some(Change::Resolved { .. })) {
            if let Some(uuid) = point.uuid {
                tracked.uuid = Some(uuid.to_owned());
            }
            if let Some(model) = point.model {
                tracked.model = Some(model.to_owned());
            }
            if !firing {
                tracked.job_id = point.job_id.map(str::to_owned);
            }
        }
        if point.value.is_some() && (event || rule.metric != Metric::Xid) {
            tracked.value = point.value;
        }
        let snapshot = tracked.clone();
        if snapshot.tracker.phase == Phase::Inactive {
            self.states.remove(&key);
        }
        if let Some(change) = change {
            out.push(Transition {
                key,
                change,
                ts_us: point.ts_us,
                rule: Arc::clone(rule),
                uuid: snapshot.uuid,
                model: snapshot.model,
                job_id: snapshot.job_id,
                value: snapshot.value,
                threshold: point.threshold,
                reason: None,
            });
        }
    }
}

/// One observation point: a GPU sample, an event, or a node tick.
struct Point<'a> {
    ts_us: i64,
    gpu: Option<u32>,
    uuid: Option<&'a str>,
    model: Option<&'a str>,
    job_id: Option<&'a str>,
    value: Option<f64>,
    threshold: Option<f64>,
}

impl<'a> Point<'a> {
    fn of(g: &'a GpuSample, value: Option<f64>, threshold: Option<f64>) -> Point<'a> {
        Point {
            ts_us: g.ts_us,
            gpu: Some(g.gpu),
            uuid: Some(&g.uuid),
            model: Some(&g.model),
            job_id: g.job_id.as_deref(),
            value,
            threshold,
        }
    }
}

/// A GPU's value of a per-GPU numeric metric (percent of the power limit
/// when `relative`); None when not measured.
fn gpu_value(metric: Metric, g: &GpuSample, relative: bool) -> Option<f64> {
    match metric {
        Metric::Temperature => g.temperature_c.map(f64::from),
        Metric::MemoryTemperature => g.memory_temperature_c.map(f64::from),
        Metric::Power if relative => match (g.power_mw, g.power_limit_mw) {
            (Some(p), Some(l)) if l > 0 => Some(f64::from(p) * 100.0 / f64::from(l)),
            _ => None,
        },
        Metric::Power => g.power_mw.map(|p| f64::from(p) / 1000.0),
        _ => None,
    }
}

/// A node at one tick: its GPUs' power summed.
struct NodeTick {
    ts_us: i64,
    value: Option<f64>,
    /// The distinct jobs on its GPUs, comma-separated.
    jobs: Option<String>,
}

/// Sums each tick's GPU power (GPUs of one tick share its timestamp);
/// relative: as percent of the sum of the same GPUs' limits.
fn node_ticks(gpus: &[&GpuSample], relative: bool) -> Vec<NodeTick> {
    let mut ticks: BTreeMap<i64, (u64, u64, bool, Vec<&str>)> = BTreeMap::new();
    for g in gpus {
        let t = ticks.entry(g.ts_us).or_default();
        if let Some(job) = &g.job_id
            && !t.3.contains(&job.as_str())
        {
            t.3.push(job);
        }
        let Some(p) = g.power_mw else { continue };
        if relative {
            let Some(l) = g.power_limit_mw else { continue };
            t.1 += u64::from(l);
        }
        t.0 += u64::from(p);
        t.2 = true;
    }
    ticks
        .into_iter()
        .map(|(ts_us, (power, limit, any, mut jobs))| {
            jobs.sort_unstable();
            let value = match (any, relative) {
                (false, _) => None,
                (true, true) if limit == 0 => None,
                (true, true) => Some(power as f64 * 100.0 / limit as f64),
                (true, false) => Some(power as f64 / 1000.0),
            };
            NodeTick {
                ts_us,
                value,
                jobs: (!jobs.is_empty()).then(|| jobs.join(",")),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alert::rules::parse;
    use gputel_proto::{EventKind, GpuEvent};

    const S: i64 = 1_000_000;
    const T0: i64 = 1_795_240_800_000_000;

    fn levels(
        tracker: &mut Tracker,
        seq: &[(Level, i64)],
        for_s: i64,
        clear_for_s: i64,
    ) -> Vec<Option<Change>> {
        seq.iter()
            .map(|&(l, t)| tracker.observe(l, T0 + t * S, for_s * S, clear_for_s * S))
            .collect()
    }

    #[test]
    fn pending_fires_after_for_and_resolves_on_clear() {
        use Level::*;
        let mut t = Tracker::default();
        let changes = levels(
            &mut t,
            &[
                (Clear, 0),
                (Breach, 1),
                (Breach, 2),
                (Breach, 3),
                (Breach, 4),
                (Hold, 5),
                (Clear, 6),
                (Clear, 7),
            ],
            2,
            0,
        );
        assert_eq!(
            changes,
            vec![
                None,
                Some(Change::Pending),
                None,
                Some(Change::Firing {
                    starts_at_us: T0 + 3 * S
                }),
                None,
                None,
                Some(Change::Resolved {
                    starts_at_us: T0 + 3 * S,
                    ends_at_us: T0 + 6 * S
                }),
                None,
            ]
        );
        assert_eq!(t.phase, Phase::Inactive);
    }

    #[test]
    fn pending_is_cancelled_when_clear_before_for() {
        use Level::*;
        let mut t = Tracker::default();
        let changes = levels(
            &mut t,
            &[(Breach, 0), (Hold, 1), (Clear, 2), (Breach, 3)],
            5,
            0,
        );
        assert_eq!(
            changes,
            vec![
                Some(Change::Pending),
                Some(Change::Cancelled),
                None,
                Some(Change::Pending)
            ]
        );
    }

    #[test]
    fn clear_for_delays_resolution_and_a_breach_resets_it() {
        use Level::*;
        let mut t = Tracker::default();
        let changes = levels(
            &mut t,
            &[
                (Breach, 0),
                (Clear, 1),
                (Clear, 2),
                (Breach, 3),
                (Clear, 4),
                (Clear, 6),
                (Clear, 7),
            ],
            0,
            3,
        );
        assert_eq!(changes[0], Some(Change::Firing { starts_at_us: T0 }));
        assert_eq!(&changes[1..6], &[None, None, None, None, None]);
        assert_eq!(
            changes[6],
            Some(Change::Resolved {
                starts_at_us: T0,
                ends_at_us: T0 + 7 * S
            })
        );
    }

    #[test]
    fn older_samples_are_ignored() {
        let mut t = Tracker::default();
        assert_eq!(
            t.observe(Level::Breach, T0 + 5 * S, 0, 0),
            Some(Change::Firing {
                starts_at_us: T0 + 5 * S
            })
        );
        assert_eq!(t.observe(Level::Clear, T0 + 4 * S, 0, 0), None);
        assert!(matches!(t.phase, Phase::Firing { .. }));
    }

    fn reading(ts_s: i64, gpu: u32, temp: u32, power_w: u32, limit_w: u32) -> GpuSample {
        GpuSample {
            ts_us: T0 + ts_s * S,
            gpu,
            uuid: format!("GPU-{gpu}"),
            model: "NVIDIA H100 80GB HBM3".into(),
            temperature_c: Some(temp),
            memory_temperature_c: None,
            power_mw: Some(power_w * 1000),
            power_limit_mw: Some(limit_w * 1000),
            clock_event_reasons: Some(0),
            job_id: Some(format!("job{gpu}")),
            ..Default::default()
        }
    }

    fn input(gpus: Vec<GpuSample>) -> AlertInput {
        AlertInput {
            node: "n1".into(),
            gpus,
            ..AlertInput::default()
        }
    }

    fn rules(text: &str) -> RuleSet {
        parse(text, "test.toml").unwrap()
    }

    const HOT: &str = "[[rule]]\nname = \"Hot\"\nmetric = \"temperature_c\"\nop = \">\"\nthreshold = 85\nclear = 80\nfor = \"2s\"\n";

    /// Firing and resolved transitions of a temperature series on GPU 0.
    fn run_temps(rule: &str, temps: &[u32]) -> Vec<(String, i64)> {
        let mut e = Evaluator::new(&rules(rule), BTreeMap::new());
        let mut out = Vec::new();
        for (i, &t) in temps.iter().enumerate() {
            for tr in e.observe(&input(vec![reading(i as i64, 0, t, 300, 700)])) {
                match tr.change {
                    Change::Firing { .. } => out.push(("firing".to_owned(), i as i64)),
                    Change::Resolved { .. } => out.push(("resolved".to_owned(), i as i64)),
                    _ => {}
                }
            }
        }
        out
    }

    #[test]
    fn hysteresis_keeps_an_oscillating_gpu_from_flapping() {
        let oscillating = [90, 90, 90, 84, 88, 82, 86, 81, 90, 83, 87, 82, 79, 79];
        // With clear = 80: one firing, one resolution when it drops below 80.
        assert_eq!(
            run_temps(HOT, &oscillating),
            vec![("firing".to_owned(), 2), ("resolved".to_owned(), 12)]
        );
        // Without a clear level the same series flaps.
        let no_hysteresis = HOT.replace("clear = 80\n", "").replace("\"2s\"", "\"0s\"");
        let flaps = run_temps(&no_hysteresis, &oscillating);
        assert!(flaps.len() >= 8, "{flaps:?}");
    }

    #[test]
    fn alerts_carry_identity_value_and_threshold() {
        let mut e = Evaluator::new(&rules(HOT), BTreeMap::new());
        assert!(e.observe(&input(vec![reading(0, 3, 91, 300, 700)])).len() == 1); // pending
        assert!(
            e.observe(&input(vec![reading(1, 3, 92, 300, 700)]))
                .is_empty()
        );
        let mut second = reading(2, 3, 93, 300, 700);
        second.job_id = Some("other".into());
        let fired = e.observe(&input(vec![second]));
        assert_eq!(fired.len(), 1);
        let f = &fired[0];
        assert_eq!(
            f.change,
            Change::Firing {
                starts_at_us: T0 + 2 * S
            }
        );
        assert_eq!(
            f.key,
            AlertKey {
                rule: "Hot".into(),
                node: "n1".into(),
                gpu: Some(3)
            }
        );
        assert_eq!(f.uuid.as_deref(), Some("GPU-3"));
        assert_eq!(f.model.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        // The job on the GPU when the alert fired.
        assert_eq!(f.job_id.as_deref(), Some("other"));
        assert_eq!((f.value, f.threshold), (Some(93.0), Some(85.0)));
        assert_eq!(e.states().len(), 1);
        let resolved = e.observe(&input(vec![reading(3, 3, 70, 300, 700)]));
        assert_eq!(resolved[0].value, Some(70.0));
        assert!(e.states().is_empty());
    }

    #[test]
    fn power_relative_to_the_limit_fires_only_above_it() {
        let rule = "[[rule]]\nname = \"Power\"\nmetric = \"power_w\"\nop = \">\"\nthreshold = 100\nrelative-to = \"power-limit\"\n";
        let mut e = Evaluator::new(&rules(rule), BTreeMap::new());
        let fired = e.observe(&input(vec![
            reading(0, 0, 50, 690, 700),
            reading(0, 1, 50, 720, 700),
            reading(0, 2, 50, 700, 700),
            reading(0, 3, 50, 520, 500),
        ]));
        let gpus: Vec<_> = fired.iter().map(|t| t.key.gpu).collect();
        assert_eq!(gpus, vec![Some(1), Some(3)]);
        assert!((fired[1].value.unwrap() - 104.0).abs() < 1e-9);
    }

    #[test]
    fn node_power_sums_the_gpus_of_one_tick() {
        let rule = "[[rule]]\nname = \"NodePower\"\nmetric = \"node_power_w\"\nop = \">\"\nthreshold = 2000\n";
        let mut e = Evaluator::new(&rules(rule), BTreeMap::new());
        let below = e.observe(&input(
            (0..4).map(|g| reading(0, g, 50, 500, 700)).collect(),
        ));
        assert!(below.is_empty());
        let above = e.observe(&input(
            (0..4).map(|g| reading(1, g, 50, 501, 700)).collect(),
        ));
        assert_eq!(above.len(), 1);
        assert_eq!(above[0].key.gpu, None);
        assert_eq!(above[0].value, Some(2004.0));
        assert_eq!(above[0].job_id.as_deref(), Some("job0,job1,job2,job3"));
    }

    #[test]
    fn xid_fires_on_listed_codes_and_clears_after_quiet() {
        let rule =
            "[[rule]]\nname = \"Xid\"\nmetric = \"xid\"\ncodes = [79]\nclear-after = \"10s\"\n";
        let mut e = Evaluator::new(&rules(rule), BTreeMap::new());
        let xid = |ts_s: i64, code| GpuEvent {
            ts_us: T0 + ts_s * S,
            gpu: 2,
            uuid: "GPU-2".into(),
            kind: EventKind::Xid as i32,
            code,
            ..Default::default()
        };
        let mut batch = input(vec![reading(0, 2, 50, 300, 700)]);
        batch.xids = vec![xid(0, 31)];
        assert!(e.observe(&batch).is_empty());
        batch.gpus = vec![reading(1, 2, 50, 300, 700)];
        batch.xids = vec![xid(1, 79)];
        let fired = e.observe(&batch);
        assert_eq!(fired.len(), 1);
        assert_eq!(
            fired[0].change,
            Change::Firing {
                starts_at_us: T0 + S
            }
        );
        assert_eq!(
            (fired[0].value, fired[0].job_id.as_deref()),
            (Some(79.0), Some("job2"))
        );
        assert!(
            e.observe(&input(vec![reading(10, 2, 50, 300, 700)]))
                .is_empty()
        );
        let resolved = e.observe(&input(vec![reading(11, 2, 50, 300, 700)]));
        assert_eq!(
            resolved[0].change,
            Change::Resolved {
                starts_at_us: T0 + S,
                ends_at_us: T0 + 11 * S
            }
        );
        assert_eq!(resolved[0].value, Some(79.0));
    }

    #[test]
    fn xid_categories_fire_on_their_xids_and_listed_codes_too() {
        let rule = "[[rule]]\nname = \"XidHw\"\nmetric = \"xid\"\n\
                    categories = [\"hardware\", \"memory\"]\ncodes = [13]\n";
        let mut e = Evaluator::new(&rules(rule), BTreeMap::new());
        // One GPU per XID, so that each fires (or not) on its own.
        let xid = |gpu: u32, code| GpuEvent {
            ts_us: T0,
            gpu,
            uuid: format!("GPU-{gpu}"),
            kind: EventKind::Xid as i32,
            code,
            ..Default::default()
        };
        let mut batch = input((0..6).map(|g| reading(0, g, 50, 300, 700)).collect());
        // 79 hardware, 48 memory, 13 application but listed, 31 application,
        // 74 nvlink, 999 in no category.
        batch.xids = [79, 48, 13, 31, 74, 999]
            .iter()
            .enumerate()
            .map(|(g, code)| xid(g as u32, *code))
            .collect();
        let mut fired: Vec<(Option<u32>, Option<f64>)> = e
            .observe(&batch)
            .iter()
            .map(|a| (a.key.gpu, a.value))
            .collect();
        fired.sort_by_key(|(gpu, _)| *gpu);
        assert_eq!(
            fired,
            [
                (Some(0), Some(79.0)),
                (Some(1), Some(48.0)),
                (Some(2), Some(13.0))
            ]
        );
    }

    #[test]
    fn throttle_fires_on_its_reasons_only() {
        let rule = "[[rule]]\nname = \"Thermal\"\nmetric = \"thermal_throttle\"\nfor = \"1s\"\n";
        let mut e = Evaluator::new(&rules(rule), BTreeMap::new());
        let with = |ts, reasons| {
            let mut r = reading(ts, 0, 50, 300, 700);
            r.clock_event_reasons = Some(reasons);
            input(vec![r])
        };
        assert!(e.observe(&with(0, 0x4)).is_empty());
        assert_eq!(e.observe(&with(1, 0x40))[0].change, Change::Pending);
        assert!(matches!(
            e.observe(&with(2, 0x40))[0].change,
            Change::Firing { .. }
        ));
        assert!(matches!(
            e.observe(&with(3, 0x1))[0].change,
            Change::Resolved { .. }
        ));
    }

    #[test]
    fn removed_rules_hand_back_their_alerts() {
        let mut e = Evaluator::new(&rules(&HOT.replace("\"2s\"", "\"0s\"")), BTreeMap::new());
        e.observe(&input(vec![reading(0, 0, 95, 300, 700)]));
        assert_eq!(e.set_rules(&rules(HOT)).len(), 0);
        assert_eq!(e.states().len(), 1);
        let gone = e.set_rules(&RuleSet::default());
        assert_eq!(gone.len(), 1);
        assert!(e.states().is_empty());
    }

    const SILENT: &str =
        "[[rule]]\nname = \"NodeSilent\"\nmetric = \"up\"\nseverity = \"critical\"\n";

    fn silence(node: &str, at_s: i64, jobs: &[&str]) -> Silence {
        Silence {
            node: node.into(),
            at_us: T0 + at_s * S,
            last_heard_us: T0 + (at_s - 3) * S,
            threshold_us: 3 * S,
            jobs: jobs.iter().map(|j| (*j).to_owned()).collect(),
            restored: false,
        }
    }

    /// (rule, gpu, change) of transitions, for comparing.
    fn summary(ts: &[Transition]) -> Vec<(String, Option<u32>, Change, Option<&'static str>)> {
        ts.iter()
            .map(|t| (t.key.rule.clone(), t.key.gpu, t.change, t.reason))
            .collect()
    }

    #[test]
    fn a_silent_node_resolves_its_alerts_fires_up_and_resolves_it_when_back() {
        let mut e = Evaluator::new(&rules(&format!("{HOT}{SILENT}")), BTreeMap::new());
        // GPU 0 hot from 0 s (fires at 2 s), GPU 1 hot from 2 s (pending).
        for t in 0..3 {
            let mut gpus = vec![reading(t, 0, 95, 300, 700)];
            if t == 2 {
                gpus.push(reading(t, 1, 95, 300, 700));
            }
            e.observe(&input(gpus));
        }
        // Another node's alert is none of this silence's business.
        let mut other = input(vec![reading(0, 0, 95, 300, 700)]);
        other.node = "n2".into();
        e.observe(&other);
        other.gpus = vec![reading(2, 0, 95, 300, 700)];
        e.observe(&other);
        assert_eq!(e.states().len(), 3);

        let fell = e.node_silent(&silence("n1", 10, &["job0", "job1"]));
        assert_eq!(
            summary(&fell),
            [
                (
                    "Hot".to_owned(),
                    Some(0),
                    Change::Resolved {
                        starts_at_us: T0 + 2 * S,
                        ends_at_us: T0 + 10 * S
                    },
                    Some(reason::NODE_SILENT)
                ),
                (
                    "NodeSilent".to_owned(),
                    None,
                    Change::Firing {
                        starts_at_us: T0 + 10 * S
                    },
                    None
                ),
            ]
        );
        assert_eq!((fell[0].value, fell[0].threshold), (Some(95.0), Some(85.0)));
        let up = &fell[1];
        assert_eq!((up.value, up.threshold), (Some(0.0), Some(3.0)));
        assert_eq!(up.job_id.as_deref(), Some("job0,job1"));
        // GPU 1's pending alert is gone; n2's stays; NodeSilent is tracked.
        let keys: Vec<(&str, &str, Option<u32>)> = e
            .states()
            .keys()
            .map(|k| (k.rule.as_str(), k.node.as_str(), k.gpu))
            .collect();
        assert_eq!(keys, [("Hot", "n2", Some(0)), ("NodeSilent", "n1", None)]);
        // Told again (after a restart), nothing changes twice.
        assert!(
            e.node_silent(&Silence {
                restored: true,
                ..silence("n1", 10, &["job0", "job1"])
            })
            .is_empty()
        );
        // A batch queued before the silence is not evaluated after it.
        assert!(
            e.observe(&input(vec![reading(3, 1, 95, 300, 700)]))
                .is_empty()
        );

        let back = e.node_back("n1", T0 + 20 * S);
        assert_eq!(
            summary(&back),
            [(
                "NodeSilent".to_owned(),
                None,
                Change::Resolved {
                    starts_at_us: T0 + 10 * S,
                    ends_at_us: T0 + 20 * S
                },
                None
            )]
        );
        assert_eq!((back[0].value, back[0].threshold), (Some(1.0), Some(3.0)));
        // Its samples count again, from scratch: `for` starts over.
        assert_eq!(
            e.observe(&input(vec![reading(21, 0, 95, 300, 700)]))[0].change,
            Change::Pending
        );
    }

    #[test]
    fn a_node_that_moved_drops_its_alerts_without_a_transition() {
        let mut e = Evaluator::new(&rules(HOT), BTreeMap::new());
        // GPU 0 fires (95 °C for 2 s); GPU 1 is pending.
        for t in 0..=2 {
            e.observe(&input(vec![reading(t, 0, 95, 300, 700)]));
        }
        e.observe(&input(vec![reading(3, 1, 95, 300, 700)]));
        assert_eq!(e.states().len(), 2);
        let handed = e.node_moved("n1");
        assert_eq!(
            handed.iter().map(AlertKey::fingerprint).collect::<Vec<_>>(),
            ["Hot/n1/0"]
        );
        assert!(e.states().is_empty());
        // Nothing else of the node is tracked: the next sample starts over.
        assert_eq!(
            e.observe(&input(vec![reading(4, 0, 95, 300, 700)]))[0].change,
            Change::Pending
        );
    }

    #[test]
    fn an_up_rule_added_while_a_node_is_silent_fires_for_it() {
        let mut e = Evaluator::new(&rules(HOT), BTreeMap::new());
        // Without an up rule, a silence only resolves.
        e.observe(&input(vec![reading(0, 0, 95, 300, 700)]));
        assert!(e.node_silent(&silence("n1", 5, &[])).is_empty());
        e.set_rules(&rules(&format!("{HOT}{SILENT}")));
        let fired = e.fire_silent();
        assert_eq!(fired.len(), 1);
        assert_eq!(
            fired[0].change,
            Change::Firing {
                starts_at_us: T0 + 5 * S
            }
        );
        assert_eq!(fired[0].job_id, None);
        assert!(e.fire_silent().is_empty());
        // A week later the node is forgotten: its alert resolves, still 0.
        let gone = e.node_forgotten("n1", T0 + 100 * S);
        assert_eq!(
            summary(&gone),
            [(
                "NodeSilent".to_owned(),
                None,
                Change::Resolved {
                    starts_at_us: T0 + 5 * S,
                    ends_at_us: T0 + 100 * S
                },
                Some(reason::NODE_FORGOTTEN)
            )]
        );
        assert_eq!(gone[0].value, Some(0.0));
        assert!(e.states().is_empty());
    }
}
