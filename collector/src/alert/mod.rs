//! Alerting on the live stream: [`rules`] (the TOML rules file), [`eval`]
//! (a state machine per rule, node and GPU, in sample time) and [`notify`]
//! (Alertmanager's v2 API and a plain webhook).
//!
//! Ingest hands every accepted batch (after deduplication, so a resent batch
//! never fires twice) to one alert task over a bounded queue, without
//! waiting, and the node watch (`crate::silence`) hands it every node that
//! falls silent or comes back. The task evaluates the rules, logs each
//! firing and resolution as a row of the `alert` table (through the
//! write-ahead log and the normal flush), tells the notifier, and keeps the
//! pending and firing alerts in a state file beside the log, so a restart
//! neither forgets a firing alert nor notifies it anew.

pub mod eval;
pub mod notify;
pub mod rules;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gputel_proto::AlertRow;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use crate::silence::NodeChange;
use crate::write::{AlertInput, AlertSink, WritePath};
use eval::{AlertKey, Change, Evaluator, Phase, Tracked, Transition, reason};
use notify::{AmAlert, Notifier, NotifyError, rfc3339_us};
use rules::{Condition, Rule, RuleSet, RulesError};

/// Accepted batches queued for the rules before new ones are skipped.
const INPUT_QUEUE: usize = 4096;
/// The state file, in the write-ahead log's directory.
pub const STATE_FILE: &str = "alerts.json";
/// How often pending-only changes are saved (firing and resolution are
/// saved at once).
const SAVE_INTERVAL: Duration = Duration::from_secs(1);

/// What alerting needs to start.
#[derive(Debug, Clone)]
pub struct AlertConfig {
    /// The rules file (`--rules`).
    pub rules: PathBuf,
    /// Alertmanager base URLs (`--alertmanager-url`, one per instance).
    pub alertmanager_urls: Vec<String>,
    /// A plain JSON webhook (`--alert-webhook`).
    pub webhook: Option<String>,
    /// How often firing alerts are sent again.
    pub resend_interval: Duration,
    /// Where pending and firing alerts are kept across restarts.
    pub state_file: PathBuf,
}

/// Why alerting could not start.
#[derive(Debug, thiserror::Error)]
pub enum AlertError {
    #[error(transparent)]
    Rules(#[from] RulesError),
    #[error(transparent)]
    Notify(#[from] NotifyError),
    #[error("cannot read alert state {path}: {reason}; move it aside to start without it")]
    State { path: PathBuf, reason: String },
}

/// The running alert task.
#[derive(Debug)]
pub struct Alerting {
    rules_path: PathBuf,
    rules_tx: mpsc::Sender<RuleSet>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Alerting with its rules and saved state loaded, before it runs: ingest
/// can queue batches for it from the first stream on.
#[derive(Debug)]
pub struct PreparedAlerting {
    config: AlertConfig,
    rules: RuleSet,
    saved: BTreeMap<AlertKey, Tracked>,
    notifier: Notifier,
    tx: mpsc::Sender<AlertInput>,
    rx: mpsc::Receiver<AlertInput>,
    node_tx: mpsc::UnboundedSender<NodeChange>,
    node_rx: mpsc::UnboundedReceiver<NodeChange>,
}

impl PreparedAlerting {
    /// Where ingest hands accepted batches and the node watch its changes
    /// (see `ServeOptions::alert_sink`).
    pub fn sink(&self) -> AlertSink {
        AlertSink {
            batches: self.tx.clone(),
            nodes: self.node_tx.clone(),
        }
    }

    /// Starts evaluating what the sink receives; rows go to `shared`.
    pub fn start(self, shared: Arc<WritePath>) -> Alerting {
        let (rules_tx, rules_rx) = mpsc::channel(4);
        let (stop, stop_rx) = watch::channel(false);
        let mut task = AlertTask {
            evaluator: Evaluator::default(),
            notifier: self.notifier,
            shared,
            state_file: self.config.state_file,
            resend_interval: self.config.resend_interval,
            dirty: false,
        };
        task.restore(self.saved, &self.rules);
        let task = tokio::spawn(task.run(self.rx, self.node_rx, rules_rx, stop_rx));
        Alerting {
            rules_path: self.config.rules,
            rules_tx,
            stop,
            task,
        }
    }
}

impl Alerting {
    /// Loads the rules and the saved state and starts the notifier; the
    /// evaluation starts with [`PreparedAlerting::start`].
    pub fn prepare(config: AlertConfig) -> Result<PreparedAlerting, AlertError> {
        let rules = rules::load(&config.rules)?;
        info!(
            rules = rules.rules.len(),
            file = %config.rules.display(),
            "loaded {} alert rules", rules.rules.len()
        );
        let saved = load_state(&config.state_file)?;
        let notifier = Notifier::start(
            &config.alertmanager_urls,
            config.webhook.as_deref(),
            config.resend_interval,
        )?;
        let (tx, rx) = mpsc::channel(INPUT_QUEUE);
        let (node_tx, node_rx) = mpsc::unbounded_channel();
        Ok(PreparedAlerting {
            config,
            rules,
            saved,
            notifier,
            tx,
            rx,
            node_tx,
            node_rx,
        })
    }

    /// Prepares and starts alerting on `shared`, connecting its ingest.
    pub fn start(config: AlertConfig, shared: Arc<WritePath>) -> Result<Alerting, AlertError> {
        let prepared = Alerting::prepare(config)?;
        shared.set_alert_sink(prepared.sink());
        Ok(prepared.start(shared))
    }

    /// Reads the rules file again; a file with an error is logged and the
    /// rules in force stay.
    pub async fn reload(&self) {
        match rules::load(&self.rules_path) {
            Ok(rules) => {
                info!(
                    rules = rules.rules.len(),
                    file = %self.rules_path.display(),
                    "reloaded {} alert rules", rules.rules.len()
                );
                let _ = self.rules_tx.send(rules).await;
            }
            Err(e) => {
                error!(error = %e, "alert rules not reloaded; the previous rules stay in force")
            }
        }
    }

    /// Evaluates what is queued, saves the state and stops.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        if let Err(e) = self.task.await {
            warn!(error = %e, "alert task failed");
        }
    }
}

/// Reloads the rules at every SIGHUP until `stop` turns true; without
/// rules (`alerting` is `None`) a SIGHUP is logged and changes nothing.
///
/// The handler is installed by this call, not when the returned future is
/// first polled: SIGHUP's default action ends the process, and
/// `systemctl reload` (the unit's `ExecReload`) sends it whether or not the
/// collector was given rules, so neither a reload asked for just after the
/// collector said it was listening nor one without rules may find the
/// signal unwatched. Call within a tokio runtime.
pub fn reload_on_sighup(
    alerting: Option<Arc<Alerting>>,
    mut stop: watch::Receiver<bool>,
) -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let hup = {
        use tokio::signal::unix::{SignalKind, signal};
        signal(SignalKind::hangup())
            .inspect_err(|e| {
                warn!(error = %e, "cannot watch SIGHUP; alert rules are read only at start");
            })
            .ok()
    };
    async move {
        #[cfg(unix)]
        if let Some(mut hup) = hup {
            loop {
                tokio::select! {
                    _ = hup.recv() => match &alerting {
                        Some(alerting) => alerting.reload().await,
                        None => info!("SIGHUP: no alert rules to reload (the collector was started without --rules)"),
                    },
                    _ = stopped(&mut stop) => return,
                }
            }
        }
        let _ = alerting;
        stopped(&mut stop).await;
    }
}

/// Completes once `stop` turns true (without holding its lock after).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// The saved alerts, one entry per pending or firing alert.
#[derive(Debug, Default, Serialize, Deserialize)]
struct SavedState {
    version: u32,
    alerts: Vec<SavedAlert>,
}

#[derive(Debug, Serialize, Deserialize)]
struct SavedAlert {
    key: AlertKey,
    #[serde(flatten)]
    state: Tracked,
}

fn load_state(path: &Path) -> Result<BTreeMap<AlertKey, Tracked>, AlertError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => {
            return Err(AlertError::State {
                path: path.to_owned(),
                reason: e.to_string(),
            });
        }
    };
    let saved: SavedState = serde_json::from_slice(&bytes).map_err(|e| AlertError::State {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    Ok(saved.alerts.into_iter().map(|a| (a.key, a.state)).collect())
}

/// Replaces the state file atomically: a crash leaves the old or the new one.
fn save_state(path: &Path, states: &BTreeMap<AlertKey, Tracked>) -> std::io::Result<()> {
    let saved = SavedState {
        version: 1,
        alerts: states
            .iter()
            .map(|(key, state)| SavedAlert {
                key: key.clone(),
                state: state.clone(),
            })
            .collect(),
    };
    let bytes = serde_json::to_vec_pretty(&saved).map_err(std::io::Error::other)?;
    crate::state_file::replace(path, &bytes)
}

struct AlertTask {
    evaluator: Evaluator,
    notifier: Notifier,
    shared: Arc<WritePath>,
    state_file: PathBuf,
    resend_interval: Duration,
    /// Pending changes not yet saved.
    dirty: bool,
}

impl AlertTask {
    /// Takes the saved alerts back: firing ones are sent again with their
    /// original start, so Alertmanager sees the same alert, not a new one.
    fn restore(&mut self, saved: BTreeMap<AlertKey, Tracked>, rules: &RuleSet) {
        self.evaluator = Evaluator::restore(saved);
        let gone = self.evaluator.set_rules(rules);
        for (key, _) in &gone {
            warn!(rule = %key.rule, node = %key.node, gpu = ?key.gpu, "saved alert of a rule no longer in the rules file dropped");
        }
        let (mut firing, mut pending) = (0, 0);
        for (key, tracked) in self.evaluator.states().clone() {
            match tracked.tracker.phase {
                Phase::Firing { starts_at_us, .. } => {
                    firing += 1;
                    if let Some(rule) = self.rule(&key.rule) {
                        let t = transition(&key, &tracked, rule, Change::Firing { starts_at_us });
                        self.notifier.fire(key.fingerprint(), am_alert(&t, None));
                    }
                }
                Phase::Pending { .. } => pending += 1,
                Phase::Inactive => {}
            }
        }
        if firing + pending > 0 {
            info!(firing, pending, file = %self.state_file.display(), "alerts restored");
        }
    }

    fn rule(&self, name: &str) -> Option<Arc<Rule>> {
        self.evaluator.rule(name)
    }

    async fn run(
        mut self,
        mut inputs: mpsc::Receiver<AlertInput>,
        mut nodes: mpsc::UnboundedReceiver<NodeChange>,
        mut rules: mpsc::Receiver<RuleSet>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut resend = tokio::time::interval(self.resend_interval);
        resend.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        resend.tick().await;
        let mut save = tokio::time::interval(SAVE_INTERVAL);
        save.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = stopped(&mut stop) => break,
                Some(set) = rules.recv() => self.set_rules(&set).await,
                // Before batches: a node's return is queued before the
                // batch that brought it back.
                Some(change) = nodes.recv() => self.node_changed(&change).await,
                input = inputs.recv() => match input {
                    Some(input) => self.evaluate(&input).await,
                    None => break,
                },
                _ = resend.tick() => self.notifier.resend(),
                _ = save.tick(), if self.dirty => self.save().await,
            }
        }
        // What ingest accepted before the stop is evaluated still.
        while let Ok(change) = nodes.try_recv() {
            self.node_changed(&change).await;
        }
        while let Ok(input) = inputs.try_recv() {
            self.evaluate(&input).await;
        }
        self.save().await;
        self.notifier.stop().await;
    }

    async fn evaluate(&mut self, input: &AlertInput) {
        let transitions = self.evaluator.observe(input);
        self.apply(transitions).await;
    }

    /// A node fell silent (its alerts resolve, the `up` rules fire), came
    /// back (those resolve), or was forgotten.
    async fn node_changed(&mut self, change: &NodeChange) {
        let transitions = match change {
            NodeChange::Silent(s) => self.evaluator.node_silent(s),
            NodeChange::Back { node, at_us, .. } => self.evaluator.node_back(node, *at_us),
            NodeChange::Forgotten { node, at_us } => self.evaluator.node_forgotten(node, *at_us),
            NodeChange::Moved { node, to } => {
                let handed = self.evaluator.node_moved(node);
                for key in &handed {
                    self.notifier.hand_over(&key.fingerprint());
                }
                if !handed.is_empty() {
                    info!(node = %node, to = %to, alerts = handed.len(), "firing alerts handed over to the collector the node streams to now");
                }
                self.dirty = true;
                self.save().await;
                Vec::new()
            }
        };
        self.apply(transitions).await;
    }

    /// Rows, notifications and the state file for what changed.
    async fn apply(&mut self, transitions: Vec<Transition>) {
        if transitions.is_empty() {
            return;
        }
        let mut rows = Vec::new();
        for t in &transitions {
            match t.change {
                Change::Firing { .. } => {
                    info!(rule = %t.key.rule, node = %t.key.node, gpu = ?t.key.gpu, value = ?t.value, "alert firing");
                    rows.push(alert_row(t, "firing"));
                    self.notifier.fire(t.key.fingerprint(), am_alert(t, None));
                }
                Change::Resolved { ends_at_us, .. } => {
                    info!(rule = %t.key.rule, node = %t.key.node, gpu = ?t.key.gpu, value = ?t.value, reason = t.reason.unwrap_or("cleared"), "alert resolved");
                    rows.push(alert_row(t, "resolved"));
                    let key = t.key.fingerprint();
                    // Alertmanager identifies an alert by its labels: the
                    // resolution carries the labels it fired with.
                    let fired = self.notifier.firing(&key).map(|a| a.labels.clone());
                    let mut alert = am_alert(t, Some(ends_at_us));
                    if let Some(labels) = fired {
                        alert.labels = labels;
                    }
                    self.notifier.resolve(key, alert);
                }
                Change::Pending | Change::Cancelled => {}
            }
        }
        self.dirty = true;
        if !rows.is_empty() {
            if let Err(e) = self.shared.append_alerts(&rows) {
                error!(error = %e, rows = rows.len(), "alert rows not logged; they are missing from the alert table");
            }
            // Firing and resolution are saved at once; pending changes wait
            // for the next save tick.
            self.save().await;
        }
    }

    /// New rules: alerts of rules that are gone resolve now.
    async fn set_rules(&mut self, set: &RuleSet) {
        let old: Vec<Arc<Rule>> = self.evaluator.rules().to_vec();
        let gone = self.evaluator.set_rules(set);
        let mut transitions = Vec::new();
        for (key, tracked) in gone {
            let Phase::Firing { starts_at_us, .. } = tracked.tracker.phase else {
                continue;
            };
            let Some(rule) = old.iter().find(|r| r.name == key.rule) else {
                continue;
            };
            let ends_at_us = tracked.tracker.last_ts_us;
            let mut t = transition(
                &key,
                &tracked,
                Arc::clone(rule),
                Change::Resolved {
                    starts_at_us,
                    ends_at_us,
                },
            );
            t.ts_us = ends_at_us;
            t.reason = Some(reason::RULE_REMOVED);
            transitions.push(t);
        }
        // A new `up` rule fires for the nodes silent now.
        transitions.extend(self.evaluator.fire_silent());
        self.dirty = true;
        self.apply(transitions).await;
    }

    async fn save(&mut self) {
        let states = self.evaluator.states().clone();
        let path = self.state_file.clone();
        let result = tokio::task::spawn_blocking(move || save_state(&path, &states))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        match result {
            Ok(()) => self.dirty = false,
            Err(e) => error!(
                error = %e, file = %self.state_file.display(),
                "cannot save alert state; a restart now would forget pending and firing alerts"
            ),
        }
    }
}

/// A transition rebuilt from a saved alert.
fn transition(key: &AlertKey, tracked: &Tracked, rule: Arc<Rule>, change: Change) -> Transition {
    let ts_us = match change {
        Change::Firing { starts_at_us } => starts_at_us,
        Change::Resolved { ends_at_us, .. } => ends_at_us,
        _ => tracked.tracker.last_ts_us,
    };
    Transition {
        key: key.clone(),
        change,
        ts_us,
        threshold: tracked.threshold.or(rule.threshold()),
        rule,
        uuid: tracked.uuid.clone(),
        model: tracked.model.clone(),
        job_id: tracked.job_id.clone(),
        value: tracked.value,
        reason: None,
    }
}

fn starts_at(t: &Transition) -> i64 {
    match t.change {
        Change::Firing { starts_at_us } | Change::Resolved { starts_at_us, .. } => starts_at_us,
        _ => t.ts_us,
    }
}

/// The `alert` table's row for a firing or resolution.
fn alert_row(t: &Transition, status: &str) -> AlertRow {
    AlertRow {
        ts_us: t.ts_us,
        node: t.key.node.clone(),
        gpu: t.key.gpu,
        uuid: t.uuid.clone(),
        model: t.model.clone(),
        job_id: t.job_id.clone(),
        rule: t.rule.name.clone(),
        severity: t.rule.severity.clone(),
        status: status.to_owned(),
        metric: t.rule.metric.name().to_owned(),
        value: t.value,
        threshold: t.threshold,
        starts_at_us: starts_at(t),
        reason: t.reason.map(str::to_owned),
    }
}

/// A number as people read it: at most two decimals.
fn number(v: f64) -> String {
    let rounded = (v * 100.0).round() / 100.0;
    format!("{rounded}")
}

/// The units of a rule's values and of its threshold, as written after them.
fn units(rule: &Rule) -> (&'static str, &'static str) {
    match (&rule.condition, rule.metric) {
        (
            Condition::Threshold {
                relative_to_limit: true,
                ..
            },
            _,
        ) => ("% of the power limit", "%"),
        (_, rules::Metric::Temperature | rules::Metric::MemoryTemperature) => ("°C", "°C"),
        (_, rules::Metric::Power | rules::Metric::NodePower) => (" W", " W"),
        _ => ("", ""),
    }
}

/// The alert as Alertmanager gets it: labels identify it (and route it),
/// annotations describe it. `ends_at_us` is set for a resolution; a firing
/// alert's end is set by the notifier.
fn am_alert(t: &Transition, ends_at_us: Option<i64>) -> AmAlert {
    let rule = &t.rule;
    let mut labels = rule.labels.clone();
    labels.insert("alertname".into(), rule.name.clone());
    labels.insert("severity".into(), rule.severity.clone());
    labels.insert("node".into(), t.key.node.clone());
    if let Some(gpu) = t.key.gpu {
        labels.insert("gpu".into(), gpu.to_string());
    }
    for (name, value) in [
        ("uuid", &t.uuid),
        ("model", &t.model),
        ("job_id", &t.job_id),
    ] {
        if let Some(value) = value {
            labels.insert(name.into(), value.clone());
        }
    }
    let mut annotations = rule.annotations.clone();
    annotations.insert("metric".into(), rule.metric.name().into());
    let (unit, threshold_unit) = units(rule);
    let where_ = match t.key.gpu {
        Some(gpu) => format!("{} GPU {gpu}", t.key.node),
        None => t.key.node.clone(),
    };
    let job = t
        .job_id
        .as_deref()
        .map(|j| format!(" (job {j})"))
        .unwrap_or_default();
    if let Some(v) = t.value {
        annotations.insert("value".into(), number(v));
    }
    let summary = match (&rule.condition, t.value) {
        (Condition::Threshold { op, threshold, .. }, Some(v)) => {
            annotations.insert("threshold".into(), number(*threshold));
            format!(
                "{} {}{unit} {} {}{threshold_unit} on {where_}{job}",
                rule.metric,
                number(v),
                op.symbol(),
                number(*threshold)
            )
        }
        (Condition::Xid { .. }, Some(v)) => format!("XID {} on {where_}{job}", number(v)),
        (Condition::Throttle { .. }, _) => format!("{} on {where_}{job}", rule.metric),
        (Condition::Silence, _) => match t.threshold {
            Some(threshold) => {
                annotations.insert("threshold".into(), number(threshold));
                format!(
                    "{where_} is silent: no data for more than {} s{job}",
                    number(threshold)
                )
            }
            None => format!("{where_} is silent{job}"),
        },
        _ => format!("{} on {where_}{job}", rule.name),
    };
    annotations.entry("summary".into()).or_insert(summary);
    if let Some(reason) = t.reason {
        annotations.insert("reason".into(), reason.into());
    }
    AmAlert {
        labels,
        annotations,
        starts_at: rfc3339_us(starts_at(t)),
        ends_at: ends_at_us.map(rfc3339_us).unwrap_or_default(),
        generator_url: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eval::Tracker;

    #[test]
    fn state_survives_a_save_and_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STATE_FILE);
        assert!(load_state(&path).unwrap().is_empty());
        let key = AlertKey {
            rule: "Hot".into(),
            node: "n1".into(),
            gpu: Some(1),
        };
        let tracked = Tracked {
            tracker: Tracker {
                phase: Phase::Firing {
                    starts_at_us: 42,
                    clearing_since_us: Some(50),
                },
                last_ts_us: 60,
            },
            uuid: Some("GPU-1".into()),
            model: Some("H100".into()),
            job_id: None,
            value: Some(91.0),
            last_event_us: None,
            threshold: None,
        };
        let states = BTreeMap::from([(key.clone(), tracked.clone())]);
        save_state(&path, &states).unwrap();
        assert_eq!(load_state(&path).unwrap(), states);
        std::fs::write(&path, "{").unwrap();
        let e = load_state(&path).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("cannot read alert state {}", path.display())),
            "{e}"
        );
    }

    #[test]
    fn alertmanager_gets_labels_and_a_summary() {
        let set = rules::parse(
            "[[rule]]\nname = \"GpuHot\"\nmetric = \"temperature_c\"\nop = \">\"\nthreshold = 85\nseverity = \"critical\"\nlabels = { team = \"infra\" }\n",
            "a.toml",
        )
        .unwrap();
        let t = Transition {
            key: AlertKey {
                rule: "GpuHot".into(),
                node: "gpu-node-017".into(),
                gpu: Some(1),
            },
            change: Change::Firing {
                starts_at_us: 1_795_240_800_000_000,
            },
            ts_us: 1_795_240_800_000_000,
            rule: Arc::new(set.rules[0].clone()),
            uuid: Some("GPU-1".into()),
            model: Some("NVIDIA H100 80GB HBM3".into()),
            job_id: Some("4242".into()),
            value: Some(91.0),
            threshold: Some(85.0),
            reason: None,
        };
        let alert = am_alert(&t, None);
        let labels: Vec<(&str, &str)> = alert
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            labels,
            vec![
                ("alertname", "GpuHot"),
                ("gpu", "1"),
                ("job_id", "4242"),
                ("model", "NVIDIA H100 80GB HBM3"),
                ("node", "gpu-node-017"),
                ("severity", "critical"),
                ("team", "infra"),
                ("uuid", "GPU-1"),
            ]
        );
        assert_eq!(
            alert.annotations["summary"],
            "temperature_c 91°C > 85°C on gpu-node-017 GPU 1 (job 4242)"
        );
        assert_eq!(alert.annotations["value"], "91");
        assert_eq!(alert.annotations["threshold"], "85");
        let row = alert_row(&t, "firing");
        assert_eq!(
            (row.rule.as_str(), row.status.as_str(), row.metric.as_str()),
            ("GpuHot", "firing", "temperature_c")
        );
        assert_eq!(
            (row.gpu, row.value, row.threshold),
            (Some(1), Some(91.0), Some(85.0))
        );
        assert_eq!(row.starts_at_us, 1_795_240_800_000_000);
    }

    #[test]
    fn a_silent_node_reads_as_such_and_its_resolved_alerts_say_why() {
        let set = rules::parse(
            "[[rule]]\nname = \"NodeSilent\"\nmetric = \"up\"\nseverity = \"critical\"\n",
            "a.toml",
        )
        .unwrap();
        let silent = Transition {
            key: AlertKey {
                rule: "NodeSilent".into(),
                node: "gpu-node-017".into(),
                gpu: None,
            },
            change: Change::Firing {
                starts_at_us: 1_795_240_800_000_000,
            },
            ts_us: 1_795_240_800_000_000,
            rule: Arc::new(set.rules[0].clone()),
            uuid: None,
            model: None,
            job_id: Some("4242".into()),
            value: Some(0.0),
            threshold: Some(30.0),
            reason: None,
        };
        let alert = am_alert(&silent, None);
        let labels: Vec<(&str, &str)> = alert
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            labels,
            [
                ("alertname", "NodeSilent"),
                ("job_id", "4242"),
                ("node", "gpu-node-017"),
                ("severity", "critical"),
            ]
        );
        assert_eq!(
            alert.annotations["summary"],
            "gpu-node-017 is silent: no data for more than 30 s (job 4242)"
        );
        assert_eq!(
            (
                alert.annotations["metric"].as_str(),
                alert.annotations["value"].as_str(),
                alert.annotations["threshold"].as_str()
            ),
            ("up", "0", "30")
        );
        assert!(!alert.annotations.contains_key("reason"));
        let row = alert_row(&silent, "firing");
        assert_eq!(
            (row.metric.as_str(), row.gpu, row.value, row.threshold),
            ("up", None, Some(0.0), Some(30.0))
        );
        assert_eq!(row.reason, None);

        let mut resolved = silent.clone();
        resolved.change = Change::Resolved {
            starts_at_us: 1_795_240_800_000_000,
            ends_at_us: 1_795_240_860_000_000,
        };
        resolved.reason = Some(reason::NODE_SILENT);
        let alert = am_alert(&resolved, Some(1_795_240_860_000_000));
        assert_eq!(alert.annotations["reason"], "node_silent");
        assert_eq!(alert.ends_at, "2026-11-21T06:01:00.000Z");
        assert_eq!(
            alert_row(&resolved, "resolved").reason.as_deref(),
            Some("node_silent")
        );
    }
}
