//! Alert rules: a TOML file of `[[rule]]` tables, read and checked as a
//! whole. Every error names the file, the line and the field, so that a
//! typo is found at once (and a reload with one keeps the old rules).

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gputel_proto::clock_event_reasons as reason;
use gputel_schemas::xid::{self, XidCategory};
use serde::Deserialize;
use toml::Spanned;

/// How long an XID alert stays firing after the last matching event when
/// the rule does not say.
pub const DEFAULT_XID_CLEAR_AFTER: Duration = Duration::from_secs(300);
/// The severity of a rule that names none.
pub const DEFAULT_SEVERITY: &str = "warning";

/// Labels every alert carries itself; a rule cannot set them.
pub const RESERVED_LABELS: [&str; 7] = [
    "alertname",
    "severity",
    "node",
    "gpu",
    "uuid",
    "model",
    "job_id",
];

/// The rules of one file, checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuleSet {
    pub rules: Vec<Rule>,
}

/// One rule: when a metric of a GPU (or of a node) counts as a problem.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// The alert's name (`alertname` in Alertmanager); unique in the file.
    pub name: String,
    pub metric: Metric,
    pub condition: Condition,
    /// How long the condition must hold (in sample time) before the alert fires.
    pub for_: Duration,
    /// How long the clear condition must hold before a firing alert resolves.
    pub clear_for: Duration,
    pub severity: String,
    /// Extra labels for Alertmanager's routing.
    pub labels: BTreeMap<String, String>,
    /// Extra annotations (summary, runbook, …), passed through as written.
    pub annotations: BTreeMap<String, String>,
}

impl Rule {
    /// The rule's threshold as the `alert` table states it: the number for
    /// numeric metrics, the reason bits for throttling, none for XIDs and
    /// silence (an `up` alert carries its node's own).
    pub fn threshold(&self) -> Option<f64> {
        match self.condition {
            Condition::Threshold { threshold, .. } => Some(threshold),
            Condition::Throttle { mask } => Some(mask as f64),
            Condition::Xid { .. } | Condition::Silence => None,
        }
    }
}

/// What a rule watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Metric {
    /// GPU core temperature, °C.
    Temperature,
    /// HBM temperature, °C.
    MemoryTemperature,
    /// GPU power draw, W (or percent of its power limit).
    Power,
    /// The sum of a node's GPU power draw in one tick, W (or percent of the
    /// sum of their limits).
    NodePower,
    /// XID error events.
    Xid,
    /// Clock event reasons SW/HW thermal slowdown.
    ThermalThrottle,
    /// Clock event reasons SW power cap, HW power brake.
    PowerThrottle,
    /// Whether a node is heard from (Prometheus' `up`): 0 while it is
    /// silent. Judged by the collector itself, not by a sample.
    Up,
}

impl Metric {
    const ALL: [Metric; 8] = [
        Metric::Temperature,
        Metric::MemoryTemperature,
        Metric::Power,
        Metric::NodePower,
        Metric::Xid,
        Metric::ThermalThrottle,
        Metric::PowerThrottle,
        Metric::Up,
    ];

    /// The name used in rule files, labels and the `alert` table.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Temperature => "temperature_c",
            Metric::MemoryTemperature => "memory_temperature_c",
            Metric::Power => "power_w",
            Metric::NodePower => "node_power_w",
            Metric::Xid => "xid",
            Metric::ThermalThrottle => "thermal_throttle",
            Metric::PowerThrottle => "power_throttle",
            Metric::Up => "up",
        }
    }

    fn parse(name: &str) -> Option<Metric> {
        Metric::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Whether the metric is a number compared with a threshold.
    fn is_numeric(self) -> bool {
        matches!(
            self,
            Metric::Temperature | Metric::MemoryTemperature | Metric::Power | Metric::NodePower
        )
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A comparison of a value with a threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Gt,
    Ge,
    Lt,
    Le,
}

impl Op {
    fn parse(s: &str) -> Option<Op> {
        Some(match s {
            ">" => Op::Gt,
            ">=" => Op::Ge,
            "<" => Op::Lt,
            "<=" => Op::Le,
            _ => return None,
        })
    }

    /// `value <op> threshold`.
    pub fn holds(self, value: f64, threshold: f64) -> bool {
        match self {
            Op::Gt => value > threshold,
            Op::Ge => value >= threshold,
            Op::Lt => value < threshold,
            Op::Le => value <= threshold,
        }
    }

    fn upward(self) -> bool {
        matches!(self, Op::Gt | Op::Ge)
    }

    pub fn symbol(self) -> &'static str {
        match self {
            Op::Gt => ">",
            Op::Ge => ">=",
            Op::Lt => "<",
            Op::Le => "<=",
        }
    }
}

/// When a rule's condition holds, and when it is clear.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    /// Breached while `value <op> threshold`; clear once `value <op> clear`
    /// no longer holds (`clear` defaults to `threshold`; between the two the
    /// alert keeps its state: hysteresis).
    Threshold {
        op: Op,
        threshold: f64,
        clear: f64,
        /// Threshold and clear are percent of the GPU's (or node's) power limit.
        relative_to_limit: bool,
    },
    /// Breached by an XID event with one of `codes` or whose catalogue
    /// category is one of `categories` (any XID when both are empty); clear
    /// once `clear_after` passes without another.
    Xid {
        codes: Vec<u64>,
        categories: Vec<XidCategory>,
        clear_after: Duration,
    },
    /// Breached while any of the `mask` bits is set in the clock event reasons.
    Throttle { mask: u64 },
    /// Breached while the node is silent (see `--node-silence-after`);
    /// clear at its next batch.
    Silence,
}

/// Whether XID `code` breaches an XID condition of `codes` and
/// `categories`: either lists it, or both are empty (any XID). A code the
/// XID catalogue lacks has no category, so only `codes` can name it.
pub fn xid_matches(codes: &[u64], categories: &[XidCategory], code: u64) -> bool {
    (codes.is_empty() && categories.is_empty())
        || codes.contains(&code)
        || xid::category(code).is_some_and(|c| categories.contains(&c))
}

/// Why a rules file was refused.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error("cannot read alert rules {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `FILE:LINE:COLUMN: ...`, naming the rule and field where known.
    #[error("{0}; fix the alert rules file and load it again")]
    Invalid(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    rule: Vec<Spanned<RawRule>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawRule {
    name: Spanned<String>,
    metric: Spanned<String>,
    op: Option<Spanned<String>>,
    threshold: Option<Spanned<f64>>,
    clear: Option<Spanned<f64>>,
    relative_to: Option<Spanned<String>>,
    #[serde(rename = "for")]
    for_: Option<Spanned<String>>,
    clear_for: Option<Spanned<String>>,
    clear_after: Option<Spanned<String>>,
    codes: Option<Spanned<Vec<u64>>>,
    categories: Option<Spanned<Vec<String>>>,
    reasons: Option<Spanned<Vec<String>>>,
    severity: Option<Spanned<String>>,
    labels: Option<Spanned<BTreeMap<String, String>>>,
    annotations: Option<Spanned<BTreeMap<String, String>>>,
}

/// Reads and checks a rules file.
pub fn load(path: &Path) -> Result<RuleSet, RulesError> {
    let text = std::fs::read_to_string(path).map_err(|source| RulesError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(&text, &path.display().to_string())
}

/// Checks the rules in `text`; `file` names it in errors.
pub fn parse(text: &str, file: &str) -> Result<RuleSet, RulesError> {
    let at = Locator { text, file };
    let raw: RawFile = toml::from_str(text).map_err(|e| {
        let message = e.message().trim_end().to_owned();
        match e.span() {
            Some(span) => {
                // toml names the field itself for unknown and missing keys;
                // for a wrong value, the key is the one on the value's line.
                let field = if message.contains('`') {
                    None
                } else {
                    key_of_line(text, span.start)
                };
                at.error(span.start, None, field.as_deref(), &message)
            }
            None => RulesError::Invalid(format!("{file}: {message}")),
        }
    })?;
    let mut names = HashSet::new();
    let mut rules = Vec::with_capacity(raw.rule.len());
    for rule in raw.rule {
        let start = rule.span().start;
        let rule = check_rule(&at, rule.into_inner())?;
        if !names.insert(rule.name.clone()) {
            return Err(at.error(
                start,
                Some(&rule.name),
                Some("name"),
                "another rule has this name; names must be unique",
            ));
        }
        rules.push(rule);
    }
    Ok(RuleSet { rules })
}

/// Turns byte offsets into `file:line:column` messages.
struct Locator<'a> {
    text: &'a str,
    file: &'a str,
}

impl Locator<'_> {
    fn error(
        &self,
        offset: usize,
        rule: Option<&str>,
        field: Option<&str>,
        what: &str,
    ) -> RulesError {
        let (line, column) = line_column(self.text, offset);
        let mut message = format!("{}:{line}:{column}: ", self.file);
        if let Some(rule) = rule {
            message.push_str(&format!("rule {rule:?}, "));
        }
        if let Some(field) = field {
            message.push_str(&format!("field `{field}`: "));
        }
        message.push_str(what);
        RulesError::Invalid(message)
    }

    fn at<T>(&self, value: &Spanned<T>, rule: &str, field: &str, what: &str) -> RulesError {
        self.error(value.span().start, Some(rule), Some(field), what)
    }
}

/// 1-based line and column of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// The key assigned on the line holding `offset` (`key = value`).
fn key_of_line(text: &str, offset: usize) -> Option<String> {
    let start = text[..offset.min(text.len())]
        .rfind('\n')
        .map_or(0, |i| i + 1);
    let line = text[start..].lines().next()?;
    let (key, _) = line.split_once('=')?;
    let key = key.trim().trim_matches('"');
    (!key.is_empty()).then(|| key.to_owned())
}

fn duration(
    at: &Locator<'_>,
    value: &Spanned<String>,
    rule: &str,
    field: &str,
) -> Result<Duration, RulesError> {
    humantime::parse_duration(value.get_ref()).map_err(|e| {
        at.at(
            value,
            rule,
            field,
            &format!(
                "{:?} is not a duration ({e}); write e.g. \"30s\", \"2m\", \"1h\"",
                value.get_ref()
            ),
        )
    })
}

fn is_label_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn check_rule(at: &Locator<'_>, raw: RawRule) -> Result<Rule, RulesError> {
    let name = raw.name.get_ref().clone();
    if !is_label_name(&name) {
        return Err(at.at(
            &raw.name,
            &name,
            "name",
            "must be letters, digits and underscores, not starting with a digit (it becomes the alertname)",
        ));
    }
    let metric = Metric::parse(raw.metric.get_ref()).ok_or_else(|| {
        let known: Vec<_> = Metric::ALL.iter().map(|m| m.name()).collect();
        at.at(
            &raw.metric,
            &name,
            "metric",
            &format!(
                "unknown metric {:?}; expected one of {}",
                raw.metric.get_ref(),
                known.join(", ")
            ),
        )
    })?;
    // Fields that only some metrics take.
    let not_for = |field: &str, present: Option<usize>, which: &str| match present {
        Some(offset) => Err(at.error(
            offset,
            Some(&name),
            Some(field),
            &format!("does not apply to metric {metric} ({which})"),
        )),
        None => Ok(()),
    };
    let span = |v: &Option<Spanned<String>>| v.as_ref().map(|v| v.span().start);
    let condition = if metric.is_numeric() {
        not_for(
            "codes",
            raw.codes.as_ref().map(|v| v.span().start),
            "only xid takes codes",
        )?;
        not_for(
            "categories",
            raw.categories.as_ref().map(|v| v.span().start),
            "only xid takes categories",
        )?;
        not_for(
            "reasons",
            raw.reasons.as_ref().map(|v| v.span().start),
            "only throttle metrics take reasons",
        )?;
        not_for(
            "clear-after",
            span(&raw.clear_after),
            "only xid takes clear-after",
        )?;
        let op = raw.op.as_ref().ok_or_else(|| {
            at.at(
                &raw.metric,
                &name,
                "op",
                "missing: give one of \">\", \">=\", \"<\", \"<=\"",
            )
        })?;
        let op = Op::parse(op.get_ref()).ok_or_else(|| {
            at.at(
                op,
                &name,
                "op",
                &format!(
                    "{:?} is not one of \">\", \">=\", \"<\", \"<=\"",
                    op.get_ref()
                ),
            )
        })?;
        let threshold = raw.threshold.as_ref().ok_or_else(|| {
            at.at(
                &raw.metric,
                &name,
                "threshold",
                "missing: a number in the metric's unit",
            )
        })?;
        let relative_to_limit = match &raw.relative_to {
            None => false,
            Some(r) if r.get_ref() == "power-limit" => {
                if !matches!(metric, Metric::Power | Metric::NodePower) {
                    return Err(at.at(
                        r,
                        &name,
                        "relative-to",
                        "only power_w and node_power_w can be relative to the power limit",
                    ));
                }
                true
            }
            Some(r) => {
                return Err(at.at(
                    r,
                    &name,
                    "relative-to",
                    &format!(
                        "{:?} is unknown; the only one is \"power-limit\"",
                        r.get_ref()
                    ),
                ));
            }
        };
        let t = *threshold.get_ref();
        if !t.is_finite() {
            return Err(at.at(threshold, &name, "threshold", "must be a finite number"));
        }
        let clear = match &raw.clear {
            None => t,
            Some(c) => {
                let v = *c.get_ref();
                let wrong_side = if op.upward() { v > t } else { v < t };
                if !v.is_finite() || wrong_side {
                    let side = if op.upward() {
                        "at or below"
                    } else {
                        "at or above"
                    };
                    return Err(at.at(
                        c,
                        &name,
                        "clear",
                        &format!(
                            "{v} must be {side} the threshold {t} for op {:?}",
                            op.symbol()
                        ),
                    ));
                }
                v
            }
        };
        Condition::Threshold {
            op,
            threshold: t,
            clear,
            relative_to_limit,
        }
    } else {
        for (field, value) in [
            ("op", raw.op.as_ref().map(|v| v.span().start)),
            ("relative-to", span(&raw.relative_to)),
        ] {
            not_for(field, value, "it has no threshold")?;
        }
        for (field, value) in [
            ("threshold", raw.threshold.as_ref()),
            ("clear", raw.clear.as_ref()),
        ] {
            not_for(field, value.map(|v| v.span().start), "it has no threshold")?;
        }
        if metric == Metric::Up {
            let silence = "a node is silent after --node-silence-after, a setting of the collector";
            for (field, value) in [
                ("codes", raw.codes.as_ref().map(|v| v.span().start)),
                (
                    "categories",
                    raw.categories.as_ref().map(|v| v.span().start),
                ),
                ("reasons", raw.reasons.as_ref().map(|v| v.span().start)),
            ] {
                not_for(field, value, "it watches nodes, not GPUs")?;
            }
            for (field, value) in [
                ("for", span(&raw.for_)),
                ("clear-for", span(&raw.clear_for)),
                ("clear-after", span(&raw.clear_after)),
            ] {
                not_for(field, value, silence)?;
            }
            Condition::Silence
        } else if metric == Metric::Xid {
            not_for(
                "reasons",
                raw.reasons.as_ref().map(|v| v.span().start),
                "only throttle metrics take reasons",
            )?;
            not_for("for", span(&raw.for_), "an XID fires at once")?;
            not_for("clear-for", span(&raw.clear_for), "use clear-after")?;
            let clear_after = match &raw.clear_after {
                Some(v) => duration(at, v, &name, "clear-after")?,
                None => DEFAULT_XID_CLEAR_AFTER,
            };
            if clear_after.is_zero() {
                let v = raw.clear_after.as_ref().expect("zero only when given");
                return Err(at.at(v, &name, "clear-after", "must be above zero"));
            }
            let codes = raw.codes.map(Spanned::into_inner).unwrap_or_default();
            let categories = match &raw.categories {
                None => Vec::new(),
                Some(list) => {
                    let mut categories = Vec::new();
                    for category in list.get_ref() {
                        let Some(c) = XidCategory::from_name(category) else {
                            let known: Vec<_> = XidCategory::ALL.iter().map(|c| c.name()).collect();
                            return Err(at.at(
                                list,
                                &name,
                                "categories",
                                &format!(
                                    "unknown XID category {category:?}; expected some of {} \
                                     (schemas/xid/xids.csv)",
                                    known.join(", ")
                                ),
                            ));
                        };
                        if !categories.contains(&c) {
                            categories.push(c);
                        }
                    }
                    if categories.is_empty() {
                        return Err(at.at(
                            list,
                            &name,
                            "categories",
                            "must name at least one category (leave it out for any XID)",
                        ));
                    }
                    categories
                }
            };
            Condition::Xid {
                codes,
                categories,
                clear_after,
            }
        } else {
            not_for(
                "codes",
                raw.codes.as_ref().map(|v| v.span().start),
                "only xid takes codes",
            )?;
            not_for(
                "categories",
                raw.categories.as_ref().map(|v| v.span().start),
                "only xid takes categories",
            )?;
            not_for("clear-after", span(&raw.clear_after), "use clear-for")?;
            let mask = match &raw.reasons {
                None if metric == Metric::ThermalThrottle => reason::THERMAL,
                None => reason::POWER,
                Some(list) => {
                    let mut mask = 0;
                    for reason in list.get_ref() {
                        let bit = reason::NAMED
                            .iter()
                            .find(|(n, _)| n == reason)
                            .map(|(_, b)| *b)
                            .ok_or_else(|| {
                                let known: Vec<_> = reason::NAMED.iter().map(|(n, _)| *n).collect();
                                at.at(
                                    list,
                                    &name,
                                    "reasons",
                                    &format!(
                                        "unknown reason {reason:?}; expected some of {}",
                                        known.join(", ")
                                    ),
                                )
                            })?;
                        mask |= bit;
                    }
                    if mask == 0 {
                        return Err(at.at(list, &name, "reasons", "must name at least one reason"));
                    }
                    mask
                }
            };
            Condition::Throttle { mask }
        }
    };
    let for_ = match &raw.for_ {
        Some(v) => duration(at, v, &name, "for")?,
        None => Duration::ZERO,
    };
    let clear_for = match &raw.clear_for {
        Some(v) => duration(at, v, &name, "clear-for")?,
        None => Duration::ZERO,
    };
    let severity = match &raw.severity {
        Some(s) if s.get_ref().trim().is_empty() => {
            return Err(at.at(
                s,
                &name,
                "severity",
                "must not be empty (e.g. \"warning\", \"critical\")",
            ));
        }
        Some(s) => s.get_ref().clone(),
        None => DEFAULT_SEVERITY.to_owned(),
    };
    for (field, map) in [("labels", &raw.labels), ("annotations", &raw.annotations)] {
        let Some(map) = map else { continue };
        for key in map.get_ref().keys() {
            if !is_label_name(key) {
                return Err(at.at(
                    map,
                    &name,
                    field,
                    &format!("{key:?} is not a label name (letters, digits, underscores)"),
                ));
            }
            if field == "labels" && RESERVED_LABELS.contains(&key.as_str()) {
                return Err(at.at(
                    map,
                    &name,
                    field,
                    &format!("{key:?} is set by the collector itself; choose another name"),
                ));
            }
        }
    }
    Ok(Rule {
        name,
        metric,
        condition,
        for_,
        clear_for,
        severity,
        labels: raw.labels.map(Spanned::into_inner).unwrap_or_default(),
        annotations: raw.annotations.map(Spanned::into_inner).unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse(text, "alerts.toml").unwrap_err().to_string()
    }

    #[test]
    fn a_full_file_parses() {
        let set = parse(
            r#"
[[rule]]
name = "GpuHot"
metric = "temperature_c"
op = ">="
threshold = 85
clear = 80.5
for = "1m"
clear-for = "30s"
severity = "critical"
labels = { team = "infra" }
annotations = { runbook = "https://wiki/gpu-hot" }

[[rule]]
name = "PowerOverLimit"
metric = "power_w"
op = ">"
threshold = 100
relative-to = "power-limit"

[[rule]]
name = "Xid"
metric = "xid"
codes = [48, 79]
clear-after = "10m"

[[rule]]
name = "Throttle"
metric = "thermal_throttle"
reasons = ["hw_thermal"]
"#,
            "alerts.toml",
        )
        .unwrap();
        assert_eq!(set.rules.len(), 4);
        let hot = &set.rules[0];
        assert_eq!(hot.metric, Metric::Temperature);
        assert_eq!(
            hot.condition,
            Condition::Threshold {
                op: Op::Ge,
                threshold: 85.0,
                clear: 80.5,
                relative_to_limit: false
            }
        );
        assert_eq!(hot.for_, Duration::from_secs(60));
        assert_eq!(hot.clear_for, Duration::from_secs(30));
        assert_eq!(hot.severity, "critical");
        assert_eq!(hot.labels["team"], "infra");
        assert_eq!(hot.annotations["runbook"], "https://wiki/gpu-hot");
        let power = &set.rules[1];
        assert_eq!(
            power.condition,
            Condition::Threshold {
                op: Op::Gt,
                threshold: 100.0,
                clear: 100.0,
                relative_to_limit: true
            }
        );
        assert_eq!(power.severity, DEFAULT_SEVERITY);
        assert_eq!(power.for_, Duration::ZERO);
        assert_eq!(
            set.rules[2].condition,
            Condition::Xid {
                codes: vec![48, 79],
                categories: Vec::new(),
                clear_after: Duration::from_secs(600)
            }
        );
        assert_eq!(set.rules[3].condition, Condition::Throttle { mask: 0x40 });
    }

    #[test]
    fn an_up_rule_takes_names_and_labels_but_no_condition() {
        let set = parse(
            "[[rule]]\nname = \"NodeSilent\"\nmetric = \"up\"\nseverity = \"critical\"\n\
             labels = { team = \"infra\" }\nannotations = { runbook_url = \"https://wiki/silent\" }\n",
            "alerts.toml",
        )
        .unwrap();
        let rule = &set.rules[0];
        assert_eq!(
            (rule.metric, &rule.condition, rule.severity.as_str()),
            (Metric::Up, &Condition::Silence, "critical")
        );
        assert_eq!(rule.labels["team"], "infra");
        let e = err("[[rule]]\nname = \"A\"\nmetric = \"up\"\nfor = \"1m\"\n");
        assert!(
            e.starts_with(
                "alerts.toml:4:7: rule \"A\", field `for`: does not apply to metric up \
                 (a node is silent after --node-silence-after, a setting of the collector)"
            ),
            "{e}"
        );
        let e = err("[[rule]]\nname = \"A\"\nmetric = \"up\"\nop = \"<\"\nthreshold = 1\n");
        assert!(
            e.contains(
                ":4:6: rule \"A\", field `op`: does not apply to metric up (it has no threshold)"
            ),
            "{e}"
        );
        let e = err("[[rule]]\nname = \"A\"\nmetric = \"up\"\ncodes = [79]\n");
        assert!(
            e.contains("field `codes`: does not apply to metric up (it watches nodes, not GPUs)"),
            "{e}"
        );
    }

    #[test]
    fn xid_rules_take_catalogue_categories() {
        let set = parse(
            "[[rule]]\nname = \"Hw\"\nmetric = \"xid\"\n\
             categories = [\"hardware\", \"nvlink\", \"hardware\"]\n",
            "alerts.toml",
        )
        .unwrap();
        assert_eq!(
            set.rules[0].condition,
            Condition::Xid {
                codes: Vec::new(),
                categories: vec![XidCategory::Hardware, XidCategory::Nvlink],
                clear_after: DEFAULT_XID_CLEAR_AFTER
            }
        );
        let e = err("[[rule]]\nname = \"Hw\"\nmetric = \"xid\"\ncategories = [\"cosmic_rays\"]\n");
        assert_eq!(
            e,
            "alerts.toml:4:14: rule \"Hw\", field `categories`: unknown XID category \
             \"cosmic_rays\"; expected some of hardware, nvlink, memory, driver, application, \
             thermal_power, other (schemas/xid/xids.csv); fix the alert rules file and load it again"
        );
        let e = err("[[rule]]\nname = \"Hw\"\nmetric = \"xid\"\ncategories = []\n");
        assert!(
            e.contains("field `categories`: must name at least one category"),
            "{e}"
        );
        let e = err(
            "[[rule]]\nname = \"T\"\nmetric = \"temperature_c\"\nop = \">\"\nthreshold = 1\n\
             categories = [\"memory\"]\n",
        );
        assert!(
            e.contains("field `categories`: does not apply to metric temperature_c"),
            "{e}"
        );
        // Either list names an XID; both empty is any XID; 999 has no category.
        let hw = [XidCategory::Hardware];
        assert!(xid_matches(&[], &hw, 79));
        assert!(!xid_matches(&[], &hw, 13));
        assert!(xid_matches(&[13], &hw, 13));
        assert!(!xid_matches(&[], &hw, 999));
        assert!(xid_matches(&[], &[], 999));
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let e = err(
            "[[rule]]\nname = \"A\"\nmetric = \"temperature_c\"\nop = \">\"\nthreshold = \"hot\"\n",
        );
        assert!(
            e.starts_with("alerts.toml:5:13: field `threshold`: invalid type"),
            "{e}"
        );
        let e =
            err("[[rule]]\nname = \"A\"\nmetric = \"temperature_c\"\nop = \">\"\nthresold = 85\n");
        assert!(
            e.starts_with("alerts.toml:5:1: unknown field `thresold`"),
            "{e}"
        );
        let e = err("[[rule]]\nname = \"A\"\nmetric = \"temprature_c\"\n");
        assert!(
            e.starts_with("alerts.toml:3:10: rule \"A\", field `metric`: unknown metric \"temprature_c\"; expected one of temperature_c,"),
            "{e}"
        );
        let e = err(
            "[[rule]]\nname = \"A\"\nmetric = \"temperature_c\"\nop = \">\"\nthreshold = 85\nfor = \"soon\"\n",
        );
        assert!(
            e.starts_with("alerts.toml:6:7: rule \"A\", field `for`: \"soon\" is not a duration"),
            "{e}"
        );
        let e = err(
            "[[rule]]\nname = \"A\"\nmetric = \"temperature_c\"\nop = \">\"\nthreshold = 85\nclear = 90\n",
        );
        assert!(
            e.starts_with("alerts.toml:6:9: rule \"A\", field `clear`: 90 must be at or below the threshold 85 for op \">\""),
            "{e}"
        );
        let e = err("[[rule]]\nname = \"A\"\nmetric = \"temperature_c\"\nthreshold = 85\n");
        assert!(
            e.starts_with("alerts.toml:3:10: rule \"A\", field `op`: missing"),
            "{e}"
        );
        let e = err("[[rule]]\nname = \"A\"\nmetric = \"xid\"\nthreshold = 85\n");
        assert!(
            e.starts_with(
                "alerts.toml:4:13: rule \"A\", field `threshold`: does not apply to metric xid"
            ),
            "{e}"
        );
        let e = err(
            "[[rule]]\nname = \"A\"\nmetric = \"temperature_c\"\nop = \">\"\nthreshold = 85\nrelative-to = \"power-limit\"\n",
        );
        assert!(
            e.contains(":6:15: rule \"A\", field `relative-to`: only power_w"),
            "{e}"
        );
        let e = err(
            "[[rule]]\nname = \"A\"\nmetric = \"xid\"\n[[rule]]\nname = \"A\"\nmetric = \"xid\"\n",
        );
        assert!(
            e.starts_with("alerts.toml:4:1: rule \"A\", field `name`: another rule"),
            "{e}"
        );
        let e = err("[[rule]]\nname = \"A\"\nmetric = \"xid\"\nlabels = { node = \"x\" }\n");
        assert!(
            e.contains(":4:10: rule \"A\", field `labels`: \"node\" is set by the collector"),
            "{e}"
        );
        let e = err("[[rule]]\nname = \"A\"\n");
        assert!(
            e.starts_with("alerts.toml:1:1: missing field `metric`"),
            "{e}"
        );
        let e = err("[[rule]]\nname = \"A\"\nmetric = \"power_throttle\"\nreasons = [\"hot\"]\n");
        assert!(
            e.contains(":4:11: rule \"A\", field `reasons`: unknown reason \"hot\""),
            "{e}"
        );
        assert!(
            e.ends_with("fix the alert rules file and load it again"),
            "{e}"
        );
    }

    #[test]
    fn the_default_rules_file_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd/alerts.toml");
        let set = load(&path).unwrap();
        let names: Vec<&str> = set.rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "GpuTemperatureHigh",
                "GpuTemperatureCritical",
                "GpuMemoryTemperatureHigh",
                "GpuPowerOverLimit",
                "GpuXidCritical",
                "GpuThermalThrottling",
                "GpuPowerBrake",
                "NodeSilent"
            ]
        );
        assert_eq!(set.rules[7].condition, Condition::Silence);
        assert_eq!(
            set.rules[4].condition,
            Condition::Xid {
                codes: vec![48, 63, 64, 74, 79, 92, 94, 95],
                categories: Vec::new(),
                clear_after: Duration::from_secs(900)
            }
        );
    }

    #[test]
    fn an_empty_file_has_no_rules() {
        assert_eq!(parse("", "a.toml").unwrap().rules.len(), 0);
    }
}
