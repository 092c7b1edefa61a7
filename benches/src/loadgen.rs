//! `gputel-loadgen`: simulated agents that stream to a real collector as fast
//! as it acknowledges, through the agent's own gRPC client
//! ([`gputel_agent::client::run`]), so queueing, resends, deduplication and
//! acknowledgements behave exactly as in production.
//!
//! Each agent is one task with its own connection, node name and agent id,
//! generating its rows with a [`SimNode`] as it goes. Tick timestamps are
//! synthetic (start + k × interval): nothing sleeps, so a run lasts as long as
//! the collector needs; with `--pace` each tick is sent at its time instead,
//! as a fleet sends them, for what a collector holds and spends at a given
//! rate.
//!
//! Each agent keeps one stream for the whole run, as a real agent does. Its
//! client ([`client::run_holding_back`]) holds at most `--max-pending`
//! unacknowledged batches; with that many, it takes no more until the
//! collector's acknowledgements make room, so the generator waits and nothing
//! is ever dropped. `--window` splits an agent's ticks into several streams
//! instead: each window's stream is closed once the collector has
//! acknowledged all of it, and the next reconnects with the same agent id and
//! continues its sequence.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat};
use clap::Parser;
use gputel_agent::client::{self, Delivery, Identity};
use gputel_agent::clock::Cadence;
use gputel_agent::collectors::{Collectors, CollectorsError};
use gputel_collector::validate::{MAX_FUTURE_US, MIN_TS_US, validate_batch, validate_hello};
use gputel_proto::{AgentMessage, Batch, Hello, agent_message};
use gputel_runtime::time::duration_us;
use gputel_schemas::Table;
use prost::Message;
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity as TlsIdentity};
use tracing::{info, warn};

use crate::{AgentBatch, IB_PORTS_PER_NODE, SimNode, Values, buffer_and_take, metric_values};

/// Rows all streaming agents together may hold unacknowledged, unless
/// `--max-pending` says otherwise. A generated row takes about 550 bytes in
/// memory (a GPU row is a 496-byte struct with two strings), so about 150 MB;
/// fewer cost little, as the collector acknowledges at each log sync.
pub const PENDING_ROWS_BUDGET: u64 = 250_000;
/// Batches waiting between an agent's generator and its client.
const HANDOFF: usize = 16;
/// How long connecting to the collector may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Past `--timeout`, how long a client may take to give up and report. A
/// client still connecting (the collector took the connection but does not
/// answer) does not look at the deadline; it is abandoned after this.
const REPORT_GRACE: Duration = Duration::from_secs(2);
/// Agents named in a failure message, at most.
const NAMED_AGENTS: usize = 5;

#[derive(Debug, Parser)]
#[command(
    name = "gputel-loadgen",
    version,
    about = "Simulated gputel agents streaming to a collector as fast as it acknowledges",
    long_about = "Simulates --agents agents with --gpus GPUs each (and 4 InfiniBand ports), each \
                  on its own gRPC stream with its own node name and agent id, and sends --ticks \
                  ticks from every agent through the agent's real client: a tick is sent as soon \
                  as the collector's acknowledgements allow, never on a timer. Timestamps are \
                  synthetic (--start-ts + k × --interval-ms), and the rows come from a \
                  deterministic simulation of a training cluster.\n\n\
                  The collector acknowledges a batch once it is durable (synced to its \
                  write-ahead log), so a run measures ingest up to that point; Parquet files \
                  follow at the collector's --flush-interval.\n\n\
                  Exits 0 once every batch of every agent is acknowledged, after printing one \
                  line on stdout:\n  agents=N gpus=G ticks=T batches=… acknowledged=… rejected=0 \
                  dropped=0 rows: gpu=… node=… ib=… values=… elapsed_s=… values_per_s=…\n\
                  (values: non-null numeric, non-key values in stored rows, as in the \
                  benchmarks). Otherwise it prints the same line, says on stderr what is \
                  missing, and exits 1; it exits 2 without sending anything when the flags are \
                  unusable or the collector cannot be reached.",
    after_help = "Example: gputel-loadgen --collector http://127.0.0.1:7117 --agents 100 \
                  --gpus 8 --ticks 300"
)]
pub struct Cli {
    /// The collector's gRPC URL, e.g. http://collector:7117 (a bare
    /// host:port means http://); repeat it or separate URLs with commas for
    /// several: each agent streams to one (spread by node name) and fails
    /// over to the next, as gputel-agent does.
    #[arg(long, value_name = "URL", value_delimiter = ',', required = true)]
    pub collector: Vec<String>,
    /// Simulated agents (nodes), each on its own stream.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub agents: u32,
    /// GPUs per node: rows in the `gpu` table per agent and tick.
    #[arg(long, value_name = "G", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub gpus: u32,
    /// Ticks (batches) every agent sends.
    #[arg(long, value_name = "T", value_parser = clap::value_parser!(u64).range(1..))]
    pub ticks: u64,
    /// Simulated time between two ticks, in milliseconds; it spaces the
    /// timestamps, and is waited for only with --pace.
    #[arg(long, value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub interval_ms: u64,
    /// Timestamp of the first tick: RFC 3339 (2025-01-31T12:00:00Z) or `now`
    /// (rounded down to a multiple of the interval, as agents tick) [default:
    /// now minus ticks × interval, so the whole run lies in the recent past;
    /// with --pace, now].
    #[arg(long, value_name = "RFC3339|now")]
    pub start_ts: Option<String>,
    /// Node names are this prefix and the agent's number, from 1, zero-padded
    /// to the width of --agents (loadgen-001 … loadgen-100).
    #[arg(long, value_name = "PREFIX", default_value = "loadgen-")]
    pub node_prefix: String,
    /// Agents streaming at once; the others wait their turn, a window at a
    /// time [default: all of them].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: Option<u32>,
    /// Unacknowledged batches an agent may have; with that many it waits for
    /// the collector's acknowledgements, on the same stream [default: as
    /// many as keep the streaming agents together at most 250000
    /// unacknowledged rows].
    #[arg(long, value_name = "BATCHES", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_pending: Option<u64>,
    /// Batches an agent sends on one stream; it then waits until the
    /// collector has acknowledged all of them, and the next window is a new
    /// stream [default: --ticks, one stream for the whole run].
    #[arg(long, value_name = "BATCHES", value_parser = clap::value_parser!(u64).range(1..))]
    pub window: Option<u64>,
    /// Give up when not every batch is acknowledged within this time.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Send every agent's tick k at k × --interval-ms after the start, as a
    /// fleet of agents does, instead of as fast as the collector acknowledges
    /// (the run then lasts ticks × interval; --timeout counts from its end).
    #[arg(long)]
    pub pace: bool,
    /// What the simulated sensors report: a training cluster's telemetry,
    /// or random noise over each value's range (the worst case for
    /// compression).
    #[arg(long, value_enum, default_value_t = Values::Realistic)]
    pub values: Values,
    /// Fill every field a real HGX H100 node under Slurm reports (profiling
    /// metrics, throttle reasons, ECC and remapped rows, PCIe and NVLink,
    /// every InfiniBand counter, RAPL), not only the drawn ones; the drawn
    /// values stay the same.
    #[arg(long)]
    pub every_field: bool,
    /// As the agent's --slow-read-interval: the energy counter, PCIe bytes
    /// and replays, GPM graphics activity and MIG mode are sent at the
    /// first tick and then once per this interval, null in between (0: at
    /// every tick).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub slow_read_interval: Duration,
    /// Worker threads of the runtime [default: one per CPU].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: Option<u32>,
    /// CA certificate (PEM) that signed the collector's certificate: the
    /// agents then stream over mutual TLS, as a fleet's agents do, to
    /// https:// URLs. Needs --tls-cert and --tls-key.
    #[arg(long, value_name = "FILE", requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
    /// Each node's client certificate (PEM), whose DNS name is the node's
    /// name; `{node}` in the path stands for that name (certs/{node}.pem),
    /// so that every simulated node presents its own, as a fleet's nodes do.
    #[arg(long, value_name = "PATH", requires = "tls_ca")]
    pub tls_cert: Option<String>,
    /// Each node's private key (PEM); `{node}` as in --tls-cert.
    #[arg(long, value_name = "PATH", requires = "tls_ca")]
    pub tls_key: Option<String>,
}

/// Why a run cannot start.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Collectors(#[from] CollectorsError),
    #[error("--start-ts {value:?} is neither RFC 3339 (e.g. 2025-01-31T12:00:00Z) nor `now`")]
    StartTs {
        value: String,
        #[source]
        source: chrono::ParseError,
    },
    #[error(
        "the ticks would span {first} to {last}, outside what the collector accepts \
         (2000-01-01 to one day past its clock); change --start-ts, --ticks or --interval-ms"
    )]
    TimeRange { first: String, last: String },
    #[error("--node-prefix {prefix:?} does not make valid node names: {reason}")]
    NodePrefix { prefix: String, reason: String },
    #[error(
        "one tick of {gpus} GPUs would be refused by the collector ({reason}); use fewer --gpus"
    )]
    BatchTooLarge { gpus: u32, reason: String },
    #[error(
        "--pace sends every agent's ticks at their time, so every agent streams at once: \
         leave out --concurrency (or give it --agents)"
    )]
    PacedTurns,
    #[error("cannot read {path}")]
    TlsFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("unusable TLS files for {node}")]
    TlsConfig {
        node: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("--tls-ca needs https:// collector URLs, and https:// URLs need --tls-ca")]
    TlsScheme,
}

/// Why a run could not stream at all.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot reach the collector at {url} ({reason}); is it running and listening there?")]
    Unreachable { url: String, reason: String },
    #[error("cannot reach the collector at {url}: no connection within {CONNECT_TIMEOUT:?}")]
    ConnectTimeout { url: String },
}

/// A run's settings, resolved and checked.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The collectors' URLs, as given.
    pub collectors: Vec<String>,
    pub agents: u32,
    pub gpus: u32,
    pub ticks: u64,
    pub interval_us: i64,
    pub start_us: i64,
    pub node_prefix: String,
    pub concurrency: u32,
    /// Batches an agent sends on one stream.
    pub window: u64,
    /// Unacknowledged batches an agent may have.
    pub max_pending: u64,
    pub timeout: Duration,
    /// Send tick k at k × interval after the start.
    pub pace: bool,
    /// What the simulated sensors report.
    pub values: Values,
    /// Whether rows carry every field a real node reports.
    pub every_field: bool,
    /// Time between two slow-read ticks.
    pub slow_read_us: i64,
    /// Makes this run's agent ids unique: a collector deduplicates by agent id
    /// and would take a second run's batches for resends of the first's.
    pub run_id: String,
    /// Metric values in one agent's rows over the whole run.
    pub run_values: RunValues,
    /// Mutual TLS: every agent's client settings.
    pub tls: Option<Arc<AgentsTls>>,
}

/// The client TLS settings of every simulated agent: one CA, a certificate
/// and key per node, read before the run starts.
#[derive(Debug)]
pub struct AgentsTls {
    ca: Certificate,
    identities: Vec<TlsIdentity>,
}

impl AgentsTls {
    /// Reads the CA and, for each of `nodes`, the files of `cert` and `key`
    /// with `{node}` replaced by its name.
    fn read(ca: &Path, cert: &str, key: &str, nodes: &[String]) -> Result<AgentsTls, PlanError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| PlanError::TlsFile {
                path: path.to_owned(),
                source,
            })
        };
        let ca = Certificate::from_pem(read(ca)?);
        let identities = nodes
            .iter()
            .map(|node| {
                let cert = read(Path::new(&cert.replace("{node}", node)))?;
                let key = read(Path::new(&key.replace("{node}", node)))?;
                Ok(TlsIdentity::from_pem(cert, key))
            })
            .collect::<Result<Vec<_>, PlanError>>()?;
        let tls = AgentsTls { ca, identities };
        // PEM that does not parse fails here, not at every connection.
        for (i, node) in nodes.iter().enumerate() {
            Endpoint::from_static("https://localhost")
                .tls_config(tls.client(i))
                .map_err(|source| PlanError::TlsConfig {
                    node: node.clone(),
                    source,
                })?;
        }
        Ok(tls)
    }

    /// Agent `i`'s client settings.
    fn client(&self, i: usize) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(self.ca.clone())
            .identity(self.identities[i].clone())
    }
}

impl Plan {
    /// When an agent's tick `k` is sent, after the run's start: k × interval
    /// with --pace, at once without.
    fn send_after(&self, k: u64) -> Duration {
        if !self.pace {
            return Duration::ZERO;
        }
        Duration::from_micros(u64::try_from(self.interval_us).unwrap_or(0))
            .saturating_mul(u32::try_from(k).unwrap_or(u32::MAX))
    }

    /// Resolves `cli` with `now_us` as the current time.
    pub fn new(cli: &Cli, now_us: i64) -> Result<Plan, PlanError> {
        // Checks the URLs; each agent makes its own list (its own start).
        Collectors::new(&cli.collector, None, "")?;
        let https = cli.collector.iter().any(|url| url.starts_with("https://"));
        if https != cli.tls_ca.is_some() {
            return Err(PlanError::TlsScheme);
        }
        let interval_us = i64::try_from(cli.interval_ms.saturating_mul(1000)).unwrap_or(i64::MAX);
        let span_us = i64::try_from(cli.ticks)
            .unwrap_or(i64::MAX)
            .saturating_mul(interval_us);
        // Like the agent's ticks, at wall-clock multiples of the interval.
        let aligned_now_us = now_us - now_us.rem_euclid(interval_us);
        if cli.pace && cli.concurrency.is_some_and(|c| c < cli.agents) {
            return Err(PlanError::PacedTurns);
        }
        let start_us = match cli.start_ts.as_deref() {
            None if cli.pace => aligned_now_us,
            None => aligned_now_us.saturating_sub(span_us),
            Some("now") => aligned_now_us,
            Some(value) => DateTime::parse_from_rfc3339(value)
                .map_err(|source| PlanError::StartTs {
                    value: value.to_owned(),
                    source,
                })?
                .timestamp_micros(),
        };
        let last_us = start_us.saturating_add(span_us - interval_us);
        // A paced tick is checked against the clock when it is sent.
        let sent_by_us = now_us.saturating_add(if cli.pace { span_us } else { 0 });
        if start_us < MIN_TS_US || last_us > sent_by_us.saturating_add(MAX_FUTURE_US) {
            return Err(PlanError::TimeRange {
                first: rfc3339(start_us),
                last: rfc3339(last_us),
            });
        }
        let run_id = format!("{:x}", now_us);
        let mut plan = Plan {
            collectors: cli.collector.clone(),
            agents: cli.agents,
            gpus: cli.gpus,
            ticks: cli.ticks,
            interval_us,
            start_us,
            node_prefix: cli.node_prefix.clone(),
            concurrency: cli.concurrency.unwrap_or(cli.agents).min(cli.agents),
            window: 1,
            max_pending: 1,
            timeout: cli.timeout,
            pace: cli.pace,
            values: cli.values,
            every_field: cli.every_field,
            slow_read_us: duration_us(cli.slow_read_interval),
            run_id,
            run_values: RunValues::default(),
            tls: None,
        };
        if let (Some(ca), Some(cert), Some(key)) = (&cli.tls_ca, &cli.tls_cert, &cli.tls_key) {
            let nodes: Vec<String> = (0..cli.agents).map(|i| plan.node_name(i)).collect();
            plan.tls = Some(Arc::new(AgentsTls::read(ca, cert, key, &nodes)?));
        }
        for i in [0, cli.agents - 1] {
            let hello = plan.hello(i);
            validate_hello(&hello).map_err(|e| PlanError::NodePrefix {
                prefix: cli.node_prefix.clone(),
                reason: e.to_string(),
            })?;
        }
        // Agent 0's node, its slow columns read every `slow_read_us`.
        let probe = |slow_read_us| {
            SimNode::new(0, plan.node_name(0), cli.gpus, start_us, interval_us)
                .with_every_field(cli.every_field)
                .with_slow_read_interval(slow_read_us)
        };
        // The ticks of a run: the first reads the slow columns (less those
        // that span two slow reads), later slow-read ticks all of them, the
        // others none.
        let second = |slow_read_us| {
            let mut node = probe(slow_read_us);
            node.next_batch();
            node.next_batch()
        };
        let ticks = [
            probe(plan.slow_read_us).next_batch(),
            second(0),
            second(i64::MAX),
        ];
        // The largest as the collector will see it: within its limits?
        let too_large = |reason: String| PlanError::BatchTooLarge {
            gpus: cli.gpus,
            reason,
        };
        let largest = &ticks[1];
        validate_batch(largest, now_us.max(start_us).saturating_add(interval_us))
            .map_err(|e| too_large(e.to_string()))?;
        let message_bytes = AgentMessage {
            kind: Some(agent_message::Kind::Batch(largest.clone())),
        }
        .encoded_len();
        if message_bytes > gputel_proto::DEFAULT_MAX_MESSAGE_BYTES {
            return Err(too_large(format!(
                "{message_bytes} bytes, more than the default limit of {} bytes a message",
                gputel_proto::DEFAULT_MAX_MESSAGE_BYTES
            )));
        }
        let mut slow = Cadence::new(plan.slow_read_us);
        let slow_ticks = (0..cli.ticks)
            .filter(|&k| slow.due(start_us.saturating_add((k as i64).saturating_mul(interval_us))))
            .count() as u64;
        let [first, later_slow, plain] = ticks.map(|batch| values_per_tick(&plan, batch));
        plan.run_values = RunValues {
            rows: first.rows.map(|r| r * cli.ticks),
            values: std::array::from_fn(|t| {
                first.values[t]
                    + later_slow.values[t] * (slow_ticks - 1)
                    + plain.values[t] * (cli.ticks - slow_ticks)
            }),
        };
        plan.window = cli.window.unwrap_or(cli.ticks).min(cli.ticks);
        plan.max_pending = cli.max_pending.unwrap_or_else(|| {
            let rows_per_batch = u64::from(cli.gpus) + 1 + IB_PORTS_PER_NODE as u64;
            (PENDING_ROWS_BUDGET / (rows_per_batch * u64::from(plan.concurrency))).max(1)
        });
        plan.max_pending = plan.max_pending.min(plan.window);
        Ok(plan)
    }

    /// Agent `i`'s node name (`i` from 0).
    pub fn node_name(&self, i: u32) -> String {
        let width = self.agents.to_string().len();
        format!("{}{:0width$}", self.node_prefix, i + 1)
    }

    /// Agent `i`'s client TLS settings, with --tls-ca.
    fn client_tls(&self, i: u32) -> Option<ClientTlsConfig> {
        self.tls.as_ref().map(|tls| tls.client(i as usize))
    }

    fn hello(&self, i: u32) -> Hello {
        Hello {
            node: self.node_name(i),
            agent_id: format!("loadgen.{}.{}", self.run_id, i + 1),
            ..Hello::default()
        }
    }

    fn identity(&self, i: u32) -> Identity {
        let hello = self.hello(i);
        Identity {
            node: hello.node,
            agent_id: hello.agent_id,
            boot_id: self.run_id.clone(),
        }
    }
}

/// Rows of `gpu`, `node` and `ib`, and the metric values in them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunValues {
    pub rows: [u64; 3],
    pub values: [u64; 3],
}

impl RunValues {
    /// The values in `rows` of them: exact for all of them (every agent
    /// sends the same columns at the same ticks), in proportion for part.
    fn in_rows(&self, rows: [u64; 3]) -> u64 {
        (0..3)
            .map(|t| {
                let v = u128::from(rows[t]) * u128::from(self.values[t]);
                v.checked_div(u128::from(self.rows[t])).unwrap_or(0) as u64
            })
            .sum()
    }
}

/// One simulated tick's rows and metric values.
fn values_per_tick(plan: &Plan, batch: Batch) -> RunValues {
    let rows = [batch.gpu.len(), batch.node.len(), batch.ib.len()].map(|n| n as u64);
    let mut values = [0u64; 3];
    let tick = AgentBatch {
        node: plan.node_name(0),
        batch,
    };
    for (table, _, rb) in buffer_and_take(&[tick]) {
        let slot = match table {
            Table::Gpu => 0,
            Table::Node => 1,
            Table::Ib => 2,
            _ => continue,
        };
        values[slot] += metric_values(table, &rb);
    }
    RunValues { rows, values }
}

fn rfc3339(ts_us: i64) -> String {
    DateTime::from_timestamp_micros(ts_us).map_or_else(
        || format!("{ts_us} µs since 1970"),
        |t| t.to_rfc3339_opts(SecondsFormat::Secs, true),
    )
}

/// What one agent got done.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AgentOutcome {
    pub node: String,
    /// Batches generated and handed to the client.
    pub batches: u64,
    pub delivery: Delivery,
    /// False when its task did not come back in time.
    pub finished: bool,
}

impl AgentOutcome {
    fn add(&mut self, d: &Delivery) {
        let t = &mut self.delivery;
        t.produced += d.produced;
        t.acknowledged += d.acknowledged;
        t.rejected += d.rejected;
        t.dropped += d.dropped;
        t.unacknowledged += d.unacknowledged;
        t.acknowledged_rows.gpu += d.acknowledged_rows.gpu;
        t.acknowledged_rows.node += d.acknowledged_rows.node;
        t.acknowledged_rows.ib += d.acknowledged_rows.ib;
    }
}

/// The result of a run: the summary line and whatever went wrong.
#[derive(Debug, Clone)]
pub struct Summary {
    pub agents: u32,
    pub gpus: u32,
    pub ticks: u64,
    pub elapsed: Duration,
    /// Every agent's rows and values, had all been acknowledged.
    pub values_per_agent: RunValues,
    pub timeout: Duration,
    pub outcomes: Vec<AgentOutcome>,
}

impl Summary {
    fn total(&self) -> AgentOutcome {
        let mut total = AgentOutcome::default();
        for o in &self.outcomes {
            total.batches += o.batches;
            total.add(&o.delivery);
        }
        total
    }

    /// Metric values in the acknowledged rows.
    pub fn values(&self) -> u64 {
        let rows = self.total().delivery.acknowledged_rows;
        self.values_per_agent
            .in_rows([rows.gpu, rows.node, rows.ib])
    }

    /// `None` when every batch of every agent was acknowledged; otherwise
    /// what is missing, in words.
    pub fn failure(&self) -> Option<String> {
        let total = self.total();
        let expected = u64::from(self.agents) * self.ticks;
        let d = &total.delivery;
        if d.acknowledged == expected && d.rejected == 0 && d.dropped == 0 {
            return None;
        }
        let mut problems = Vec::new();
        if d.rejected > 0 {
            problems.push(format!(
                "the collector rejected {} batches (its reasons are logged above)",
                d.rejected
            ));
        }
        if d.dropped > 0 {
            problems.push(format!("the client dropped {} batches", d.dropped));
        }
        let short: Vec<&AgentOutcome> = self
            .outcomes
            .iter()
            .filter(|o| o.delivery.acknowledged < self.ticks)
            .collect();
        if !short.is_empty() {
            let named: Vec<String> = short
                .iter()
                .take(NAMED_AGENTS)
                .map(|o| {
                    format!(
                        "{} ({} of {}{})",
                        o.node,
                        o.delivery.acknowledged,
                        self.ticks,
                        if o.finished { "" } else { ", still connecting" }
                    )
                })
                .collect();
            let more = short.len().saturating_sub(NAMED_AGENTS);
            problems.push(format!(
                "{} of {expected} batches were not acknowledged within {} ({} of {} agents \
                 short: {}{}); is the collector up and keeping up?",
                expected - d.acknowledged.min(expected),
                humantime::format_duration(self.timeout),
                short.len(),
                self.agents,
                named.join(", "),
                if more > 0 {
                    format!(", and {more} more")
                } else {
                    String::new()
                }
            ));
        }
        Some(problems.join("; "))
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.total();
        let d = &total.delivery;
        let secs = self.elapsed.as_secs_f64();
        let per_s = if secs > 0.0 {
            self.values() as f64 / secs
        } else {
            0.0
        };
        write!(
            f,
            "agents={} gpus={} ticks={} batches={} acknowledged={} rejected={} dropped={} \
             rows: gpu={} node={} ib={} values={} elapsed_s={secs:.3} values_per_s={per_s:.0}",
            self.agents,
            self.gpus,
            self.ticks,
            total.batches,
            d.acknowledged,
            d.rejected,
            d.dropped,
            d.acknowledged_rows.gpu,
            d.acknowledged_rows.node,
            d.acknowledged_rows.ib,
            self.values(),
        )
    }
}

/// Progress an agent's task shares, so a task that has to be abandoned still
/// counts what it generated.
#[derive(Debug, Default)]
struct Generated(AtomicU64);

/// Streams every agent's ticks; returns once all are acknowledged, or at
/// `plan.timeout`.
pub async fn run(plan: Plan) -> Result<Summary, RunError> {
    // Fail in words, at once, when nothing listens (the client would retry forever).
    let mut collectors =
        Collectors::new(&plan.collectors, plan.client_tls(0), "").expect("checked by Plan::new");
    let mut last = RunError::Unreachable {
        url: collectors.urls(),
        reason: "no address resolves".to_owned(),
    };
    loop {
        let Some(candidate) = collectors.next().await else {
            return Err(last);
        };
        match tokio::time::timeout(CONNECT_TIMEOUT, candidate.endpoint.connect()).await {
            Ok(Ok(_channel)) => break,
            Ok(Err(e)) => {
                last = RunError::Unreachable {
                    url: candidate.name,
                    reason: causes(&e),
                }
            }
            Err(_) => {
                last = RunError::ConnectTimeout {
                    url: candidate.name,
                }
            }
        }
        if collectors.failed() {
            return Err(last);
        }
    }
    info!(
        collector = %plan.collectors.join(","),
        agents = plan.agents,
        gpus = plan.gpus,
        ticks = plan.ticks,
        first_tick = %rfc3339(plan.start_us),
        window = plan.window,
        max_pending = plan.max_pending,
        concurrency = plan.concurrency,
        "streaming"
    );
    let plan = Arc::new(plan);
    let started = Instant::now();
    let deadline = started + plan.send_after(plan.ticks) + plan.timeout;
    let permits = Arc::new(Semaphore::new(plan.concurrency as usize));
    let generated: Arc<Vec<Generated>> =
        Arc::new((0..plan.agents).map(|_| Generated::default()).collect());
    let tasks: Vec<_> = (0..plan.agents)
        .map(|i| {
            tokio::spawn(agent(
                Arc::clone(&plan),
                i,
                Arc::clone(&permits),
                Arc::clone(&generated),
                started,
                deadline,
            ))
        })
        .collect();
    let mut outcomes = Vec::with_capacity(tasks.len());
    for (i, task) in (0..plan.agents).zip(tasks) {
        let abort = task.abort_handle();
        let outcome = match tokio::time::timeout_at(deadline + REPORT_GRACE, task).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(e)) => {
                warn!(node = %plan.node_name(i), error = %e, "agent task failed");
                unfinished(&plan, i, &generated)
            }
            Err(_) => {
                abort.abort();
                unfinished(&plan, i, &generated)
            }
        };
        outcomes.push(outcome);
    }
    Ok(Summary {
        agents: plan.agents,
        gpus: plan.gpus,
        ticks: plan.ticks,
        elapsed: started.elapsed(),
        values_per_agent: plan.run_values,
        timeout: plan.timeout,
        outcomes,
    })
}

/// An error and its sources, each said once: tonic nests "transport error"
/// around "tcp connect error" around the OS's reason.
fn causes(e: &dyn std::error::Error) -> String {
    let mut said: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(e) = next {
        let text = e.to_string();
        if !said.contains(&text) {
            said.push(text);
        }
        next = e.source();
    }
    said.join(": ")
}

fn unfinished(plan: &Plan, i: u32, generated: &[Generated]) -> AgentOutcome {
    AgentOutcome {
        node: plan.node_name(i),
        batches: generated[i as usize].0.load(Ordering::Relaxed),
        ..AgentOutcome::default()
    }
}

/// One agent: its ticks, a window at a time (by default one window), each
/// window on one client stream.
async fn agent(
    plan: Arc<Plan>,
    i: u32,
    permits: Arc<Semaphore>,
    generated: Arc<Vec<Generated>>,
    started: Instant,
    deadline: Instant,
) -> AgentOutcome {
    let mut sent: u64 = 0;
    let identity = plan.identity(i);
    let mut outcome = AgentOutcome {
        node: identity.node.clone(),
        finished: true,
        ..AgentOutcome::default()
    };
    let mut node = SimNode::new(
        i as usize,
        identity.node.clone(),
        plan.gpus,
        plan.start_us,
        plan.interval_us,
    )
    .with_values(plan.values)
    .with_every_field(plan.every_field)
    .with_slow_read_interval(plan.slow_read_us);
    let mut left = plan.ticks;
    while left > 0 {
        let window = left.min(plan.window);
        let Ok(_permit) = permits.acquire().await else {
            break;
        };
        // The client gives up on what is unacknowledged at the run's deadline.
        let drain = deadline.saturating_duration_since(Instant::now());
        if drain.is_zero() {
            break;
        }
        let (tx, rx) = mpsc::channel(HANDOFF);
        let collectors = Collectors::new(&plan.collectors, plan.client_tls(i), &identity.node)
            .expect("checked by Plan::new")
            .with_connect_timeout(CONNECT_TIMEOUT);
        let stream = tokio::spawn(client::run_holding_back(
            collectors,
            identity.clone(),
            rx,
            usize::try_from(plan.max_pending).unwrap_or(usize::MAX),
            drain,
        ));
        for _ in 0..window {
            if plan.pace {
                tokio::time::sleep_until(started + plan.send_after(sent)).await;
            }
            sent += 1;
            if tx.send(node.next_batch()).await.is_err() {
                break;
            }
            outcome.batches += 1;
            generated[i as usize].0.fetch_add(1, Ordering::Relaxed);
        }
        drop(tx);
        let delivery = match stream.await {
            Ok(delivery) => delivery,
            Err(e) => {
                warn!(node = %identity.node, error = %e, "client task failed");
                break;
            }
        };
        outcome.add(&delivery);
        left -= window;
        if delivery.acknowledged < window {
            // Timed out or rejected: the run has failed; say so sooner.
            break;
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_US: i64 = 1_750_000_000_000_000;

    fn cli(args: &[&str]) -> Cli {
        let mut all = vec!["gputel-loadgen", "--collector", "http://127.0.0.1:7117"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).expect("valid flags")
    }

    #[test]
    fn defaults_put_the_run_in_the_recent_past() {
        let plan = Plan::new(&cli(&["--agents", "100", "--ticks", "300"]), NOW_US).unwrap();
        assert_eq!(plan.gpus, 8);
        assert_eq!(plan.interval_us, 1_000_000);
        assert_eq!(plan.start_us, NOW_US - 300 * 1_000_000);
        let aligned = Plan::new(
            &cli(&["--agents", "1", "--ticks", "4", "--interval-ms", "15000"]),
            NOW_US + 12_123_456,
        )
        .unwrap();
        // Aligned to the interval (NOW_US + 5 s is a multiple of 15 s), the
        // last tick in the past.
        assert_eq!(aligned.start_us, NOW_US + 5_000_000 - 4 * 15_000_000);
        assert_eq!(plan.concurrency, 100);
        assert_eq!(plan.node_name(0), "loadgen-001");
        assert_eq!(plan.node_name(99), "loadgen-100");
        // 8 GPUs: 10 metrics plus the XID and job counts at every tick, and
        // the energy counter at the 30 slow-read ticks of 300 s (NOW_US is a
        // multiple of 10 s); node: 11 of 15; IB: 5 of 29.
        assert_eq!(
            plan.run_values,
            RunValues {
                rows: [2400, 300, 1200],
                values: [2400 * 12 + 30 * 8, 300 * 11, 1200 * 5]
            }
        );
        // The agent's --once: at every tick.
        let every_tick = cli(&[
            "--agents",
            "1",
            "--ticks",
            "300",
            "--slow-read-interval",
            "0s",
        ]);
        let plan = Plan::new(&every_tick, NOW_US + 3_456_789).unwrap();
        assert_eq!(plan.run_values.values, [2400 * 13, 300 * 11, 1200 * 5]);
        // A run that starts between two multiples of 10 s: at its first
        // tick, then at each multiple.
        let unaligned = cli(&[
            "--agents",
            "1",
            "--ticks",
            "25",
            "--start-ts",
            "2024-06-12T16:00:07Z",
        ]);
        let plan = Plan::new(&unaligned, NOW_US).unwrap();
        assert_eq!(plan.run_values.values[0], 25 * 8 * 12 + 4 * 8); // :07, :10, :20, :30
        // Every field, 34 GPU values at every tick: the first tick adds the
        // energy and PCIe replay counters, later slow-read ticks also average
        // power, the PCIe rates and graphics activity, which span two.
        let every_field = cli(&[
            "--agents",
            "1",
            "--ticks",
            "20",
            "--every-field",
            "--start-ts",
            "2024-06-12T16:00:00Z",
        ]);
        let plan = Plan::new(&every_field, NOW_US).unwrap();
        assert_eq!(plan.run_values.values[0], 8 * (18 * 34 + 36 + 40));
    }

    #[test]
    fn a_paced_run_starts_now_and_may_reach_into_the_future() {
        // Two days of ticks from now: unpaced, the last ones would be sent
        // more than the day ahead the collector accepts, and the plan is
        // refused; paced, each is sent at its time.
        let args = ["--agents", "10", "--ticks", "172800", "--start-ts", "now"];
        assert!(matches!(
            Plan::new(&cli(&args), NOW_US),
            Err(PlanError::TimeRange { .. })
        ));
        let paced = Plan::new(
            &cli(&["--agents", "10", "--ticks", "172800", "--pace"]),
            NOW_US,
        )
        .expect("two paced days from now");
        assert!(paced.pace);
        assert_eq!(paced.start_us, NOW_US);
        // Agents taking turns could not send their ticks at their time.
        let turns = [
            "--agents",
            "10",
            "--ticks",
            "60",
            "--pace",
            "--concurrency",
            "5",
        ];
        assert!(matches!(
            Plan::new(&cli(&turns), NOW_US),
            Err(PlanError::PacedTurns)
        ));
    }

    #[test]
    fn help_states_the_pending_row_budget() {
        use clap::CommandFactory;
        let help = Cli::command().render_long_help().to_string();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            help.contains(&format!(
                "at most {PENDING_ROWS_BUDGET} unacknowledged rows"
            )),
            "{help}"
        );
    }

    #[test]
    fn one_stream_an_agent_holding_at_most_the_pending_row_budget() {
        let plan = |args: &[&str]| {
            let plan = Plan::new(&cli(args), NOW_US).unwrap();
            (plan.window, plan.max_pending)
        };
        assert_eq!(plan(&["--agents", "4", "--ticks", "50"]), (50, 50));
        // 13 rows a batch, 1000 agents streaming.
        assert_eq!(
            plan(&["--agents", "1000", "--ticks", "3600"]),
            (3600, PENDING_ROWS_BUDGET / 13_000)
        );
        assert_eq!(
            plan(&["--agents", "1000", "--ticks", "3600", "--concurrency", "10"]),
            (3600, PENDING_ROWS_BUDGET / 130)
        );
        assert_eq!(
            plan(&[
                "--agents",
                "1000",
                "--ticks",
                "3600",
                "--max-pending",
                "5000"
            ]),
            (3600, 3600)
        );
        // A window bounds what is pending on its stream.
        assert_eq!(
            plan(&["--agents", "1000", "--ticks", "3600", "--window", "7"]),
            (7, 7)
        );
        assert_eq!(
            plan(&[
                "--agents",
                "2",
                "--ticks",
                "3600",
                "--window",
                "500",
                "--max-pending",
                "3"
            ]),
            (500, 3)
        );
    }

    #[test]
    fn start_ts_parses_rfc3339_and_refuses_what_the_collector_would() {
        let plan = Plan::new(
            &cli(&[
                "--agents",
                "1",
                "--ticks",
                "10",
                "--start-ts",
                "2025-06-01T00:00:00+02:00",
            ]),
            NOW_US,
        )
        .unwrap();
        assert_eq!(plan.start_us, 1_748_728_800_000_000);
        let err = Plan::new(
            &cli(&["--agents", "1", "--ticks", "100000", "--start-ts", "now"]),
            NOW_US,
        )
        .unwrap_err();
        assert!(matches!(err, PlanError::TimeRange { .. }), "{err}");
        let err = Plan::new(
            &cli(&["--agents", "1", "--ticks", "1", "--start-ts", "yesterday"]),
            NOW_US,
        )
        .unwrap_err();
        assert!(matches!(err, PlanError::StartTs { .. }), "{err}");
    }

    #[test]
    fn bad_node_prefixes_and_oversized_batches_are_refused() {
        let err = Plan::new(
            &cli(&["--agents", "2", "--ticks", "1", "--node-prefix", "a b"]),
            NOW_US,
        )
        .unwrap_err();
        assert!(matches!(err, PlanError::NodePrefix { .. }), "{err}");
        let err = Plan::new(
            &cli(&["--agents", "1", "--ticks", "1", "--gpus", "100000"]),
            NOW_US,
        )
        .unwrap_err();
        assert!(matches!(err, PlanError::BatchTooLarge { .. }), "{err}");
    }

    #[test]
    fn the_summary_line_and_what_is_missing() {
        let mut delivered = Delivery {
            produced: 3,
            acknowledged: 3,
            ..Delivery::default()
        };
        delivered.acknowledged_rows.gpu = 6;
        delivered.acknowledged_rows.node = 3;
        delivered.acknowledged_rows.ib = 12;
        let done = AgentOutcome {
            node: "n1".into(),
            batches: 3,
            delivery: delivered,
            finished: true,
        };
        let mut summary = Summary {
            agents: 2,
            gpus: 2,
            ticks: 3,
            elapsed: Duration::from_secs(2),
            values_per_agent: RunValues {
                rows: [6, 3, 12],
                values: [6 * 13, 3 * 11, 12 * 9],
            },
            timeout: Duration::from_secs(60),
            outcomes: vec![done.clone(), done.clone()],
        };
        assert_eq!(summary.failure(), None);
        assert_eq!(
            summary.to_string(),
            "agents=2 gpus=2 ticks=3 batches=6 acknowledged=6 rejected=0 dropped=0 \
             rows: gpu=12 node=6 ib=24 values=438 elapsed_s=2.000 values_per_s=219"
        );
        summary.outcomes[1] = AgentOutcome {
            node: "n2".into(),
            batches: 2,
            ..AgentOutcome::default()
        };
        assert_eq!(
            summary.failure().as_deref(),
            Some(
                "3 of 6 batches were not acknowledged within 1m (1 of 2 agents short: \
                 n2 (0 of 3, still connecting)); is the collector up and keeping up?"
            )
        );
    }
}
