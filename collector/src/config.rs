//! Configuration: a TOML file (`--config`) overridden by command-line flags.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use chrono::FixedOffset;
use clap::{Args, Parser, Subcommand};
use serde::Deserialize;

use gputel_schemas::Table;

use crate::compact::Retention;
use crate::import::{Format, parse_utc_offset};
use crate::memory::{self, MemoryPlan};
use crate::store::S3Options;

/// The collector's default gRPC port. Not assigned to a well-known service by
/// IANA, and clear of the Prometheus exporter range (9100-9999).
pub const DEFAULT_PORT: u16 = 7117;

/// How often a directory store is compacted when not configured.
pub const DEFAULT_COMPACT_INTERVAL: Duration = Duration::from_secs(10 * 60);
/// How long rows wait in memory at most: a sample is queryable within this
/// (and about a second) of its tick, at p99 and at worst.
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(10);
/// The most buffered rows that start a write when `--flush-rows` is not
/// given (fewer when the memory budget is small). A flush holds its rows in
/// memory while they are sorted and encoded, about 0.35 KB each as Arrow
/// columns (GPU rows are the widest, 0.5 KB with every field); at 49 152
/// that is about 17 MB. Up to about 380 agents with 8 GPUs and 4 InfiniBand
/// ports at 1 Hz (13 rows a second each) the interval starts every write; a
/// larger fleet writes every 49 152 rows, so the rows a flush holds stop
/// growing with it. 65 536 took a 1000-agent collector with every field to
/// 93-103 MB at its peak, this 87.5-90.6 MB, for half as many files again
/// in the hour not yet compacted (benches/README.md, "Collector memory at a
/// fleet's pace").
pub const MAX_DEFAULT_FLUSH_ROWS: usize = 49_152;

/// Where Parquet files go when no store is configured.
pub const DEFAULT_STORE: &str = "./gputel-data";

/// Where the write-ahead log goes when none is configured.
pub const DEFAULT_WAL_DIR: &str = "./gputel-wal";

#[derive(Debug, Parser)]
#[command(
    name = "gputel-collector",
    version,
    about = "Receives gputel agent streams and writes hive-partitioned Parquet",
    long_about = "Receives gputel agent streams over gRPC, validates every batch, and writes \
                  hive-partitioned Parquet (<store>/<table>/date=YYYY-MM-DD/hour=HH/*.parquet) \
                  that DuckDB, Spark and Trino read directly.\n\n\
                  Settings come from --config (TOML; keys are the flags' long names without the \
                  leading dashes, e.g. flush-interval = \"30s\"); flags override the file.\n\n\
                  With a command, runs that command instead of the server.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// TOML configuration file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: Settings,
    /// Without a command, the collector serves agents.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// What `gputel-collector` does other than serving.
#[derive(Debug, Subcommand)]
pub enum Command {
    ImportJobs(ImportJobs),
    Compact(Compact),
    Job(JobReport),
    Report(FleetReport),
    /// Inspects or repairs the write-ahead log.
    #[command(subcommand)]
    Wal(WalCommand),
}

/// `gputel-collector wal ...`.
#[derive(Debug, Subcommand)]
pub enum WalCommand {
    /// Reports what the write-ahead log holds and any damage, changing nothing.
    #[command(
        long_about = "Reads every segment of the write-ahead log and the state file, \
                  and prints per segment its intact records and any damaged stretch (file, \
                  byte offset, length, reason), then one summary line; changes nothing, so it \
                  is safe beside a running collector. Exits 1 when the log is damaged or its \
                  state file is missing or empty.\n\n\
                  At start the collector itself copies each damaged stretch to \
                  <wal-dir>/quarantine/ and replays every intact record after it; a torn last \
                  record (a crash mid-write) was never acknowledged and is dropped."
    )]
    Check(WalDir),
    /// Repairs the write-ahead log as a start would, without serving.
    #[command(
        long_about = "Does to the write-ahead log what the collector does at start, \
                  and nothing else: each damaged stretch is copied to <wal-dir>/quarantine/ \
                  and skipped, a torn last record (never acknowledged) is cut off. The intact \
                  records stay in the log, for the collector to write at its next start. \
                  Prints what it did. Run it with the collector stopped."
    )]
    Salvage(WalDir),
}

/// Where the log is: `--wal-dir`, else the `--config` file's, else the default.
#[derive(Debug, Args)]
pub struct WalDir {
    /// The log directory [default: the wal-dir in --config, else ./gputel-wal].
    #[arg(long, value_name = "DIR")]
    pub wal_dir: Option<PathBuf>,
    /// The collector's TOML configuration file, for its wal-dir.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

impl WalDir {
    /// The directory: the flag over the file over the default.
    pub fn resolve(&self) -> Result<PathBuf, ConfigError> {
        let file = match &self.config {
            Some(path) => read_file(path)?,
            None => Settings::default(),
        };
        Ok(self
            .wal_dir
            .clone()
            .or(file.wal_dir)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_WAL_DIR)))
    }
}

/// `gputel-collector compact`.
#[derive(Debug, Args)]
#[command(
    about = "Compacts the small files of closed hours and applies retention, once",
    long_about = "Merges the files of each closed hour of each table into few large sorted files \
                  (row groups of 100k to 1M rows), then exits. The serving collector does the \
                  same every --compact-interval; this runs one round now, e.g. from cron, or \
                  on a store no collector serves.\n\n\
                  An hour is closed once it ended --min-age ago. On a local store the new \
                  hour replaces the old in one atomic directory exchange; on S3 the merged \
                  files are deleted after the compacted ones are uploaded (see the README).\n\n\
                  A large hour is merged a range of nodes at a time, its rows spilled to \
                  temporary files meanwhile: under the store's .compacting/ for a local \
                  store, else under $TMPDIR (about 1.7 times the hour's bytes at most; \
                  memory stays about 50 MB).\n\n\
                  One compactor per store at a time: the store's compaction lease (a lock \
                  file at a local store's root; on S3 an object taken and renewed by \
                  conditional writes, _gputel/compaction.lease) is held for the round. When \
                  a serving collector holds it, this prints so and does nothing.\n\n\
                  With --retention, also deletes date= partitions older than their table's \
                  age. Store, S3 settings and retention come from --config when not given."
)]
pub struct Compact {
    /// The store: a directory or an object store URL (file://, s3://, memory://)
    /// [default: the store in --config, else ./gputel-data].
    #[arg(long, value_name = "DIR|URL")]
    pub store: Option<String>,
    /// The collector's TOML configuration file, for the store, S3 settings and retention.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Only this table (repeatable) [default: every table].
    #[arg(long = "table", value_name = "TABLE")]
    pub tables: Vec<String>,
    /// Compact hours that ended at least this long ago.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = humantime::parse_duration)]
    pub min_age: Duration,
    /// Only hours that start before this time (RFC 3339, e.g. 2026-05-01T00:00:00Z).
    #[arg(long, value_name = "TIME")]
    pub before: Option<chrono::DateTime<chrono::Utc>>,
    /// Only apply retention; compact nothing.
    #[arg(long)]
    pub retention_only: bool,
    /// Delete partitions older than AGE (every table) or TABLE=AGE (repeatable),
    /// e.g. --retention 365d --retention gpu=90d [default: the config's].
    #[arg(long, value_name = "[TABLE=]AGE")]
    pub retention: Vec<String>,
}

impl Compact {
    /// Store, S3 settings and retention: flags over the `--config` file.
    pub fn resolve(&self) -> Result<(String, S3Options, Retention), ConfigError> {
        let file = match &self.config {
            Some(path) => read_file(path)?,
            None => Settings::default(),
        };
        let store = self
            .store
            .clone()
            .or(file.store.clone())
            .unwrap_or_else(|| DEFAULT_STORE.to_owned());
        let retention = if self.retention.is_empty() {
            file.retention.clone().unwrap_or_default()
        } else {
            self.retention.clone()
        };
        let retention = Retention::parse(&retention).map_err(ConfigError::Invalid)?;
        Ok((store, file.s3_options(), retention))
    }

    /// The tables named by `--table`, or all.
    pub fn tables(&self) -> Result<Vec<Table>, ConfigError> {
        if self.tables.is_empty() {
            return Ok(Table::ALL.to_vec());
        }
        self.tables
            .iter()
            .map(|name| {
                Table::ALL
                    .into_iter()
                    .find(|t| t.name() == name)
                    .ok_or_else(|| {
                        ConfigError::Invalid(format!(
                            "no table {name:?}; tables: {}",
                            Table::ALL.map(|t| t.name()).join(", ")
                        ))
                    })
            })
            .collect()
    }
}

/// `gputel-collector import-jobs`.
#[derive(Debug, Args)]
#[command(
    about = "Imports a scheduler's job trace (sacct output, Acme trace CSV) into the scheduler_job table",
    long_about = "Imports a scheduler's job trace into the scheduler_job table of the store, next to \
                  the telemetry, so that GPU rows join to job type, user and final state.\n\n\
                  --format sacct reads the output of\n  \
                  sacct --parsable2 --allocations \
                  --format=JobID,User,Partition,State,Submit,Start,End,NNodes,AllocTRES,NodeList\n\
                  --format acme reads a CSV with the columns of the Acme trace (job_id, user, \
                  node_num, gpu_num, cpu_num, type, state, submit_time, start_time, end_time, \
                  duration, queue, gpu_time).\n\n\
                  Jobs go to <store>/scheduler_job/month=YYYY-MM/<format>-<hash>.parquet by the UTC \
                  month of their submit time (month=unknown without one). The hash covers the file's \
                  bytes, the format and --utc-offset, so importing the same file again replaces its \
                  own files and adds no rows. Lines that cannot be read are listed on stderr as \
                  FILE:LINE: reason and skipped; a summary goes to stdout."
)]
pub struct ImportJobs {
    /// The trace's format.
    #[arg(long, value_enum)]
    pub format: Format,
    /// The job trace to import.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Where Parquet files go: a directory, or an object store URL (file://, memory://)
    /// [default: the store in --config, else ./gputel-data].
    #[arg(long, value_name = "DIR|URL")]
    pub store: Option<String>,
    /// The collector's TOML configuration file, to take the store from.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The cluster's offset from UTC, for times written without a zone (sacct's
    /// always are; Acme's usually carry one), e.g. +08:00 for China Standard Time.
    #[arg(
        long,
        value_name = "+HH:MM",
        default_value = "+00:00",
        allow_hyphen_values = true,
        value_parser = parse_utc_offset
    )]
    pub utc_offset: FixedOffset,
}

impl ImportJobs {
    /// The store to import into: `--store`, else the store in `--config`,
    /// else the server's default.
    pub fn store(&self) -> Result<String, ConfigError> {
        if let Some(store) = &self.store {
            return Ok(store.clone());
        }
        let file = match &self.config {
            Some(path) => read_file(path)?,
            None => Settings::default(),
        };
        Ok(file.store.unwrap_or_else(|| DEFAULT_STORE.to_owned()))
    }
}

/// `gputel-collector report`.
#[derive(Debug, Args)]
#[command(
    about = "Writes the fleet's characterization figures (CDFs of utilization, SM activity, memory, power, temperature, host and InfiniBand load; idle power; jobs; XIDs; throttling) as one offline HTML page",
    long_about = "Writes one self-contained HTML page (inline SVG, no script, nothing \
                  fetched) with the figures of the Acme study's infrastructure and failure \
                  analysis that the store supports: time-weighted CDFs of GPU utilization, SM \
                  activity, occupancy and tensor activity, GPU memory and power as shares of \
                  capacity and limit, GPU and memory temperature, host CPU and memory, \
                  InfiniBand send and receive as shares of the link rate; the power of idle \
                  GPUs; utilization by job type; job duration against utilization; per-job \
                  memory imbalance and idle time; XIDs by category; throttled time per GPU. \
                  Each figure has a one-line reading and the shipped SQL (schemas/sql/) that \
                  computes the same numbers in DuckDB.\n\n\
                  Reads the store in process, one hour at a time and only the columns the \
                  figures need; a directory or an s3:// store alike. Each sample counts for the \
                  time to its device's next sample (at most 3 median intervals), so agents \
                  sampling every 1 s and every 15 s add up right.\n\n\
                  Exit status: 0 with a report written; 1 when the store holds nothing to draw \
                  (said on stderr); 2 when the store cannot be read or the page not written."
)]
pub struct FleetReport {
    #[command(flatten)]
    pub source: ReportStore,
    /// Where to write the page.
    #[arg(long, value_name = "FILE", default_value = "gputel-report.html")]
    pub out: PathBuf,
    /// Average each device's samples over windows of this length before the CDFs,
    /// as the study plots (15s); without it every sample counts as recorded.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub resample: Option<std::time::Duration>,
    /// Also write the CDFs in the study's layout: 1000 quantile points per metric
    /// (CSV: metric,acme_metric,percentile,value).
    #[arg(long, value_name = "FILE")]
    pub cdf_csv: Option<PathBuf>,
    /// Also print the report's numbers as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Only samples from this time on (RFC 3339, e.g. 2026-05-01T00:00:00Z).
    #[arg(long, value_name = "TIME")]
    pub from: Option<chrono::DateTime<chrono::Utc>>,
    /// Only samples up to this time (RFC 3339).
    #[arg(long, value_name = "TIME")]
    pub to: Option<chrono::DateTime<chrono::Utc>>,
    /// Type the jobs and draw the trace's figures from this job trace file (see
    /// --jobs-format) instead of the trace imported into the store; nothing is
    /// written to the store.
    #[arg(long, value_name = "TRACE")]
    pub jobs: Option<PathBuf>,
    /// The format of the --jobs file.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = Format::Acme, requires = "jobs")]
    pub jobs_format: Format,
    /// The cluster's offset from UTC for times in the --jobs file written without a
    /// zone, as for import-jobs --utc-offset.
    #[arg(
        long,
        value_name = "+HH:MM",
        default_value = "+00:00",
        allow_hyphen_values = true,
        value_parser = parse_utc_offset,
        requires = "jobs"
    )]
    pub jobs_utc_offset: FixedOffset,
}

/// Where a report reads: `--store` and `--config`.
#[derive(Debug, Args)]
pub struct ReportStore {
    /// The store: a directory or an object store URL (file://, s3://)
    /// [default: the store in --config, else ./gputel-data].
    #[arg(long, value_name = "DIR|URL")]
    pub store: Option<String>,
    /// The collector's TOML configuration file, for the store and S3 settings.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

impl ReportStore {
    /// Store and S3 settings: the flag over the `--config` file over the default.
    pub fn resolve(&self) -> Result<(String, S3Options), ConfigError> {
        let file = match &self.config {
            Some(path) => read_file(path)?,
            None => Settings::default(),
        };
        let store = self
            .store
            .clone()
            .or(file.store.clone())
            .unwrap_or_else(|| DEFAULT_STORE.to_owned());
        Ok((store, file.s3_options()))
    }
}

/// `gputel-collector job`.
#[derive(Debug, Args)]
#[command(
    about = "Prints one job's efficiency report: per GPU utilization, SM activity, memory, power, energy, temperatures, throttling, XIDs, and hints",
    long_about = "Prints one job's efficiency report from the store, in the spirit of Slurm's \
                  jobstats: the job's span, nodes and GPUs; per GPU the time-weighted mean and \
                  peak utilization and SM activity as bars, peak memory of the GPU's total, mean \
                  power and energy, temperatures, time throttled, XIDs; the job's events and \
                  alerts; and plain-language hints (idle GPUs, low SM activity, memory mostly \
                  unused, throttling, XIDs).\n\n\
                  Reads only the job's hours (from the job table), and of those files only the \
                  row groups and columns it needs. Each sample counts for the time to the GPU's \
                  next sample (at most 3 median intervals), so agents sampling every 1 s and \
                  every 15 s add up right.\n\n\
                  Exit status: 0 with a report; 1 when the store holds no samples of the job \
                  (or nothing at all), said on stderr with what the store holds; 2 when the \
                  store cannot be read."
)]
pub struct JobReport {
    /// The job id as the gpu table holds it: the scheduler's (Slurm: 4242, array task 4242_7).
    #[arg(value_name = "JOBID")]
    pub job_id: String,
    #[command(flatten)]
    pub source: ReportStore,
    /// Print the report as one JSON object (e.g. for a Slurm epilog to keep in the
    /// job's AdminComment).
    #[arg(long)]
    pub json: bool,
    /// Only look at hours from this time on (RFC 3339, e.g. 2026-05-01T00:00:00Z).
    #[arg(long, value_name = "TIME")]
    pub from: Option<chrono::DateTime<chrono::Utc>>,
    /// Only look at hours up to this time (RFC 3339).
    #[arg(long, value_name = "TIME")]
    pub to: Option<chrono::DateTime<chrono::Utc>>,
}

/// Every setting, optional so that file and flags can be merged.
#[derive(Debug, Default, Clone, Args, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Settings {
    /// Address to serve the agents' gRPC streams on [default: 0.0.0.0:7117 with TLS,
    /// 127.0.0.1:7117 (loopback only) with --plaintext].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Where Parquet files go: a directory, or an object store URL (s3://bucket/prefix,
    /// file://, memory://) [default: ./gputel-data].
    #[arg(long, value_name = "DIR|URL")]
    pub store: Option<String>,
    /// S3 endpoint, for S3-compatible servers (overrides AWS_ENDPOINT_URL).
    #[arg(long, value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// S3 region (overrides AWS_REGION).
    #[arg(long, value_name = "REGION")]
    pub s3_region: Option<String>,
    /// Allow a plain http:// S3 endpoint (as AWS_ALLOW_HTTP=true).
    #[arg(long)]
    #[serde(default)]
    pub s3_allow_http: bool,
    /// Address buckets as bucket.host instead of host/bucket.
    #[arg(long)]
    #[serde(default)]
    pub s3_virtual_hosted_style: bool,
    /// How often closed hours are compacted and retention applied, by
    /// whichever collector sharing the store holds its compaction lease; 0
    /// turns it off here [default: 10m].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(default, with = "humantime_serde")]
    pub compact_interval: Option<Duration>,
    /// Delete date partitions older than AGE (every table) or TABLE=AGE
    /// (repeatable), e.g. --retention 365d --retention gpu=90d [default: keep].
    #[arg(long, value_name = "[TABLE=]AGE")]
    pub retention: Option<Vec<String>>,
    /// Directory of the write-ahead log: batches are acknowledged once they are
    /// durable there, and replayed from it after a crash [default: ./gputel-wal].
    #[arg(long, value_name = "DIR")]
    pub wal_dir: Option<PathBuf>,
    /// Bytes kept free on the volume of --wal-dir: a batch that would leave
    /// less is refused with UNAVAILABLE (agents keep it and retry) and a
    /// flush started, so that the flush always has room to write Parquet
    /// and release log segments; 0 turns it off [default: 5 % of the volume,
    /// at most 256 MiB].
    #[arg(long, value_name = "BYTES")]
    pub wal_min_free_bytes: Option<u64>,
    /// Longest time rows wait in memory before they are written: a row is
    /// queryable at most this long after it arrives [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(default, with = "humantime_serde")]
    pub flush_interval: Option<Duration>,
    /// Buffered rows (all tables) that trigger a write before the interval ends,
    /// half as many while a compaction round runs [default: half of
    /// --max-unwritten-rows, at most 49152].
    #[arg(long, value_name = "ROWS")]
    pub flush_rows: Option<usize>,
    /// Memory the collector plans for, e.g. 4GiB: a quarter for messages
    /// being taken in (a larger message waits, one above a sixteenth is
    /// rejected), half for unwritten rows (--max-unwritten-rows), the rest
    /// for writing and the alert queue [default: 1GiB; at least 64MiB].
    #[arg(long, value_name = "SIZE")]
    pub memory_budget: Option<ByteSize>,
    /// Rows held in memory (buffered, or waiting for a write that failed) at
    /// which new batches are refused until the store catches up; agents keep
    /// them and retry [default: half the memory budget at 600 bytes a row:
    /// 894784 for 1GiB].
    #[arg(long, value_name = "ROWS")]
    pub max_unwritten_rows: Option<usize>,
    /// Rows per second one agent may send, on average over 10 s; beyond it
    /// its batches are refused with RESOURCE_EXHAUSTED and it retries after
    /// a backoff, keeping them [default: 100000].
    #[arg(long, value_name = "ROWS")]
    pub max_agent_rows_per_s: Option<u64>,
    /// Largest message accepted from an agent, in bytes [default: 16777216].
    #[arg(long, value_name = "BYTES")]
    pub max_message_bytes: Option<usize>,
    /// A node is silent once nothing has arrived from it for three of its
    /// usual intervals (learnt from its samples' times), and at least this
    /// long. The collector then writes a node_silent event (node_back when
    /// it is heard from again), fires the alert rules of metric "up" and
    /// resolves the node's other alerts. An agent stopped on purpose leaves
    /// its node silent too. After a restart, nodes known before get 90 s to
    /// reconnect [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(default, with = "humantime_serde")]
    pub node_silence_after: Option<Duration>,
    /// PEM certificate the collector presents to agents (with --tls-key and
    /// --tls-client-ca: mutual TLS).
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA that signs agents' certificates; an agent's certificate must
    /// name the node it writes as.
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
    /// Serve without TLS: no encryption, any client may write as any node.
    /// For loopback development only.
    #[arg(long)]
    #[serde(default)]
    pub plaintext: bool,
    /// Log filter, as in RUST_LOG (e.g. "info", "gputel_collector=debug") [default: info].
    #[arg(long, value_name = "FILTER")]
    pub log: Option<String>,
    /// Alerting; in the file, an `[alerts]` table.
    #[command(flatten)]
    #[serde(default, rename = "alerts")]
    pub alerts: AlertArgs,
}

/// Alert settings: flags, or keys of the config file's `[alerts]` table.
#[derive(Debug, Default, Clone, Args, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
#[command(next_help_heading = "Alerting")]
pub struct AlertArgs {
    /// Alert rules (TOML); without it, no alerting. SIGHUP reads the file
    /// again (a file with an error is logged and the rules in force stay).
    #[arg(long, value_name = "FILE")]
    pub rules: Option<PathBuf>,
    /// Alertmanager to send alerts to (its base URL, e.g. http://am:9093);
    /// repeat it for every instance of an HA cluster.
    #[arg(long = "alertmanager-url", value_name = "URL")]
    #[serde(default)]
    pub alertmanager_url: Vec<String>,
    /// Also POST every firing and resolution as plain JSON to this URL.
    #[arg(long, value_name = "URL")]
    pub alert_webhook: Option<String>,
    /// How often firing alerts are sent to Alertmanager again [default: 1m].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(default, with = "humantime_serde")]
    pub alert_resend_interval: Option<Duration>,
}

impl AlertArgs {
    fn or(self, other: AlertArgs) -> AlertArgs {
        AlertArgs {
            rules: self.rules.or(other.rules),
            alertmanager_url: if self.alertmanager_url.is_empty() {
                other.alertmanager_url
            } else {
                self.alertmanager_url
            },
            alert_webhook: self.alert_webhook.or(other.alert_webhook),
            alert_resend_interval: self.alert_resend_interval.or(other.alert_resend_interval),
        }
    }

    /// The alerting configuration, None without rules; the state file goes
    /// in `wal_dir`.
    fn resolve(self, wal_dir: &Path) -> Result<Option<crate::alert::AlertConfig>, ConfigError> {
        let Some(rules) = self.rules else {
            if !self.alertmanager_url.is_empty() || self.alert_webhook.is_some() {
                return Err(ConfigError::Invalid(
                    "alertmanager-url and alert-webhook need rules: give the alert rules file with --rules".into(),
                ));
            }
            return Ok(None);
        };
        let resend_interval = self
            .alert_resend_interval
            .unwrap_or(Duration::from_secs(60));
        if resend_interval.is_zero() {
            return Err(ConfigError::Invalid(
                "alert-resend-interval must be above zero".into(),
            ));
        }
        Ok(Some(crate::alert::AlertConfig {
            rules,
            alertmanager_urls: self.alertmanager_url,
            webhook: self.alert_webhook,
            resend_interval,
            state_file: wal_dir.join(crate::alert::STATE_FILE),
        }))
    }
}

impl Settings {
    /// The S3 flags as store options.
    pub fn s3_options(&self) -> S3Options {
        S3Options {
            endpoint: self.s3_endpoint.clone(),
            region: self.s3_region.clone(),
            allow_http: self.s3_allow_http,
            virtual_hosted_style: self.s3_virtual_hosted_style,
        }
    }

    /// These settings, with `other`'s filling the gaps.
    fn or(self, other: Settings) -> Settings {
        Settings {
            listen: self.listen.or(other.listen),
            store: self.store.or(other.store),
            s3_endpoint: self.s3_endpoint.or(other.s3_endpoint),
            s3_region: self.s3_region.or(other.s3_region),
            s3_allow_http: self.s3_allow_http || other.s3_allow_http,
            s3_virtual_hosted_style: self.s3_virtual_hosted_style || other.s3_virtual_hosted_style,
            compact_interval: self.compact_interval.or(other.compact_interval),
            retention: self.retention.or(other.retention),
            wal_dir: self.wal_dir.or(other.wal_dir),
            wal_min_free_bytes: self.wal_min_free_bytes.or(other.wal_min_free_bytes),
            flush_interval: self.flush_interval.or(other.flush_interval),
            flush_rows: self.flush_rows.or(other.flush_rows),
            memory_budget: self.memory_budget.or(other.memory_budget),
            max_unwritten_rows: self.max_unwritten_rows.or(other.max_unwritten_rows),
            max_agent_rows_per_s: self.max_agent_rows_per_s.or(other.max_agent_rows_per_s),
            max_message_bytes: self.max_message_bytes.or(other.max_message_bytes),
            node_silence_after: self.node_silence_after.or(other.node_silence_after),
            log: self.log.or(other.log),
            // A flag overrides the file: --plaintext sets the file's TLS aside.
            tls_cert: self.tls_cert.or(other.tls_cert.filter(|_| !self.plaintext)),
            tls_key: self.tls_key.or(other.tls_key.filter(|_| !self.plaintext)),
            tls_client_ca: self
                .tls_client_ca
                .or(other.tls_client_ca.filter(|_| !self.plaintext)),
            plaintext: self.plaintext || other.plaintext,
            alerts: self.alerts.or(other.alerts),
        }
    }
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub store: String,
    pub s3: S3Options,
    /// How often maintenance (compaction, retention) runs; None: never.
    pub compact_interval: Option<Duration>,
    pub retention: Retention,
    pub wal_dir: PathBuf,
    /// Bytes kept free on the log's volume; None: derived from its size
    /// ([`crate::wal::default_min_free_bytes`]).
    pub wal_min_free_bytes: Option<u64>,
    pub flush_interval: Duration,
    pub flush_rows: usize,
    /// The memory budget's shares, with `--max-unwritten-rows` applied.
    pub memory: MemoryPlan,
    pub max_agent_rows_per_s: u64,
    pub max_message_bytes: usize,
    /// The least silence after which a node is silent (see [`crate::silence`]).
    pub node_silence_after: Duration,
    pub log: String,
    /// Mutual TLS, or None when plaintext was asked for.
    pub tls: Option<TlsFiles>,
    /// Alert rules and where alerts go; None without `--rules`.
    pub alerts: Option<crate::alert::AlertConfig>,
}

/// The PEM files of the collector's mutual TLS.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    File(#[from] gputel_runtime::config_file::ConfigFileError),
    #[error("{0}")]
    Invalid(String),
}

impl Config {
    /// Merges flags over the file (if any) over the defaults.
    pub fn load(cli: Cli) -> Result<Config, ConfigError> {
        let file = match &cli.config {
            Some(path) => read_file(path)?,
            None => Settings::default(),
        };
        let s = cli.settings.or(file);
        let store = s.store.clone().unwrap_or_else(|| DEFAULT_STORE.to_owned());
        // Collectors sharing a store all run the job; the store's
        // compaction lease lets one of them at a time do it.
        let compact_interval = match s.compact_interval {
            Some(interval) if interval.is_zero() => None,
            Some(interval) => Some(interval),
            None => Some(DEFAULT_COMPACT_INTERVAL),
        };
        let retention = Retention::parse(s.retention.as_deref().unwrap_or_default())
            .map_err(ConfigError::Invalid)?;
        let s3 = s.s3_options();
        let wal_dir = s.wal_dir.unwrap_or_else(|| PathBuf::from(DEFAULT_WAL_DIR));
        // Without TLS anyone who reaches the port writes as any node: unless
        // an address is given, only this machine can.
        let default_listen = if s.plaintext {
            SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT))
        } else {
            SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT))
        };
        let memory = {
            let budget = s
                .memory_budget
                .map_or(memory::DEFAULT_BUDGET_BYTES, |b| b.as_u64());
            if budget < memory::MIN_BUDGET_BYTES {
                return Err(ConfigError::Invalid(format!(
                    "memory-budget must be at least 64MiB, not {}",
                    ByteSize::b(budget).display().iec()
                )));
            }
            let mut plan = MemoryPlan::from_budget(budget);
            if let Some(rows) = s.max_unwritten_rows {
                plan.max_unwritten_rows = rows;
            }
            plan
        };
        let config = Config {
            // A flush starts well before batches would be refused.
            flush_rows: s.flush_rows.unwrap_or_else(|| {
                (memory.max_unwritten_rows / 2).clamp(1, MAX_DEFAULT_FLUSH_ROWS)
            }),
            memory,
            alerts: s.alerts.resolve(&wal_dir)?,
            s3,
            compact_interval,
            retention,
            listen: s.listen.unwrap_or(default_listen),
            store,
            wal_dir,
            wal_min_free_bytes: s.wal_min_free_bytes,
            flush_interval: s.flush_interval.unwrap_or(DEFAULT_FLUSH_INTERVAL),

            max_agent_rows_per_s: s.max_agent_rows_per_s.unwrap_or(100_000),
            max_message_bytes: s
                .max_message_bytes
                .unwrap_or(gputel_proto::DEFAULT_MAX_MESSAGE_BYTES),
            node_silence_after: s
                .node_silence_after
                .unwrap_or(crate::silence::DEFAULT_SILENCE_AFTER),
            log: s.log.unwrap_or_else(|| "info".to_owned()),
            tls: match (s.tls_cert, s.tls_key, s.tls_client_ca, s.plaintext) {
                (Some(cert), Some(key), Some(client_ca), false) => Some(TlsFiles {
                    cert,
                    key,
                    client_ca,
                }),
                (None, None, None, true) => None,
                (_, _, _, true) => {
                    return Err(ConfigError::Invalid(
                        "plaintext and tls-cert/tls-key/tls-client-ca exclude each other".into(),
                    ));
                }
                _ => {
                    return Err(ConfigError::Invalid(
                        "give tls-cert, tls-key and tls-client-ca (mutual TLS), or plaintext \
                         for loopback development"
                            .into(),
                    ));
                }
            },
        };
        if config.flush_interval.is_zero() {
            return Err(ConfigError::Invalid(
                "flush-interval must be above zero".into(),
            ));
        }
        // Every accepted message must fit one log record, with room for its
        // agent id and node name.
        let max_message = crate::wal::MAX_RECORD_BYTES - 1024 * 1024;
        if config.max_message_bytes > max_message {
            return Err(ConfigError::Invalid(format!(
                "max-message-bytes must be at most {max_message} (63 MiB)"
            )));
        }
        if config.flush_rows == 0 {
            return Err(ConfigError::Invalid("flush-rows must be above zero".into()));
        }
        Ok(config)
    }
}

fn read_file(path: &Path) -> Result<Settings, ConfigError> {
    Ok(gputel_runtime::config_file::read_toml(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_file_and_file_overrides_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("collector.toml");
        std::fs::write(
            &path,
            "store = \"/srv/gputel\"\nflush-interval = \"30s\"\nlisten = \"127.0.0.1:9000\"\nplaintext = true\n",
        )
        .unwrap();
        let cli = Cli::parse_from([
            "gputel-collector",
            "--config",
            path.to_str().unwrap(),
            "--listen",
            "127.0.0.1:7000",
        ]);
        let config = Config::load(cli).unwrap();
        assert_eq!(config.listen, "127.0.0.1:7000".parse().unwrap());
        assert_eq!(config.store, "/srv/gputel");
        assert_eq!(config.flush_interval, Duration::from_secs(30));
        // A 1 GiB budget allows 894 784 unwritten rows; a flush starts at
        // the default's cap, well below half of them.
        assert_eq!(config.memory.max_unwritten_rows, 894_784);
        assert_eq!(config.flush_rows, MAX_DEFAULT_FLUSH_ROWS);
    }

    #[test]
    fn the_memory_budget_sizes_the_row_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("collector.toml");
        std::fs::write(&path, "plaintext = true\nmemory-budget = \"8GiB\"\n").unwrap();
        let file = path.to_str().unwrap();
        let config = Config::load(Cli::parse_from(["gputel-collector", "--config", file])).unwrap();
        assert_eq!(config.memory.budget_bytes, 8 << 30);
        assert_eq!(config.memory.max_unwritten_rows, 7_158_278);
        assert_eq!(config.memory.per_message_bytes, 512 << 20);
        assert_eq!(config.flush_rows, MAX_DEFAULT_FLUSH_ROWS);
        // A flag overrides the file; explicit row bounds override the budget.
        let config = Config::load(Cli::parse_from([
            "gputel-collector",
            "--config",
            file,
            "--memory-budget",
            "256MiB",
            "--max-unwritten-rows",
            "1000",
        ]))
        .unwrap();
        assert_eq!(config.memory.in_flight_bytes, 64 << 20);
        assert_eq!(config.memory.max_unwritten_rows, 1000);
        assert_eq!(config.flush_rows, 500);
        let err = Config::load(Cli::parse_from([
            "gputel-collector",
            "--plaintext",
            "--memory-budget",
            "10MB",
        ]))
        .unwrap_err()
        .to_string();
        assert_eq!(err, "memory-budget must be at least 64MiB, not 9.5 MiB");
        assert_eq!(config.node_silence_after, Duration::from_secs(30));
    }

    #[test]
    fn node_silence_after_comes_from_the_file_or_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("collector.toml");
        std::fs::write(&path, "plaintext = true\nnode-silence-after = \"2m\"\n").unwrap();
        let file = path.to_str().unwrap();
        let from_file =
            Config::load(Cli::parse_from(["gputel-collector", "--config", file])).unwrap();
        assert_eq!(from_file.node_silence_after, Duration::from_secs(120));
        let flag = Config::load(Cli::parse_from([
            "gputel-collector",
            "--config",
            file,
            "--node-silence-after",
            "1500ms",
        ]))
        .unwrap();
        assert_eq!(flag.node_silence_after, Duration::from_millis(1500));
        let err = Cli::try_parse_from(["gputel-collector", "--node-silence-after", "soon"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--node-silence-after"), "{err}");
    }

    #[test]
    fn plaintext_only_when_asked_and_the_flag_sets_file_tls_aside() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("collector.toml");
        std::fs::write(
            &path,
            "tls-cert = \"c.pem\"\ntls-key = \"c.key\"\ntls-client-ca = \"ca.pem\"\n",
        )
        .unwrap();
        let file = path.to_str().unwrap();
        let tls = Config::load(Cli::parse_from(["gputel-collector", "--config", file])).unwrap();
        assert_eq!(tls.tls.map(|t| t.client_ca), Some(PathBuf::from("ca.pem")));
        let plain = Config::load(Cli::parse_from([
            "gputel-collector",
            "--config",
            file,
            "--plaintext",
        ]))
        .unwrap();
        assert!(plain.tls.is_none());
        // Plaintext listens on loopback unless told otherwise; TLS on all.
        assert_eq!(plain.listen, "127.0.0.1:7117".parse().unwrap());
        assert_eq!(tls.listen, "0.0.0.0:7117".parse().unwrap());
        let err = Config::load(Cli::parse_from(["gputel-collector"]))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("give tls-cert, tls-key and tls-client-ca"),
            "{err}"
        );
        let err = Config::load(Cli::parse_from(["gputel-collector", "--tls-cert", "c.pem"]))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("give tls-cert"), "{err}");
    }

    #[test]
    fn alert_settings_come_from_an_alerts_table_and_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("collector.toml");
        std::fs::write(
            &path,
            "plaintext = true\nwal-dir = \"/w\"\n[alerts]\nrules = \"/etc/gputel/alerts.toml\"\n\
             alertmanager-url = [\"http://am1:9093\", \"http://am2:9093\"]\n",
        )
        .unwrap();
        let file = path.to_str().unwrap();
        let alerts = Config::load(Cli::parse_from(["gputel-collector", "--config", file]))
            .unwrap()
            .alerts
            .unwrap();
        assert_eq!(alerts.rules, PathBuf::from("/etc/gputel/alerts.toml"));
        assert_eq!(
            alerts.alertmanager_urls,
            ["http://am1:9093", "http://am2:9093"]
        );
        assert_eq!(alerts.resend_interval, Duration::from_secs(60));
        assert_eq!(alerts.state_file, PathBuf::from("/w/alerts.json"));
        let flags = Config::load(Cli::parse_from([
            "gputel-collector",
            "--config",
            file,
            "--alertmanager-url",
            "http://am3:9093",
            "--alert-webhook",
            "http://hook/x",
            "--alert-resend-interval",
            "30s",
        ]))
        .unwrap()
        .alerts
        .unwrap();
        assert_eq!(flags.alertmanager_urls, ["http://am3:9093"]);
        assert_eq!(flags.webhook.as_deref(), Some("http://hook/x"));
        assert_eq!(flags.resend_interval, Duration::from_secs(30));
        let err = Config::load(Cli::parse_from([
            "gputel-collector",
            "--plaintext",
            "--alertmanager-url",
            "http://am:9093",
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("alertmanager-url and alert-webhook need rules"),
            "{err}"
        );
        std::fs::write(&path, "[alerts]\nrule = \"x\"\n").unwrap();
        let err = Config::load(Cli::parse_from(["gputel-collector", "--config", file]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `rule`"), "{err}");
    }

    #[test]
    fn unknown_keys_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("collector.toml");
        std::fs::write(&path, "flush_interval = \"30s\"\n").unwrap();
        let cli = Cli::parse_from(["gputel-collector", "--config", path.to_str().unwrap()]);
        let err = Config::load(cli).unwrap_err().to_string();
        assert!(err.contains("unknown field `flush_interval`"), "{err}");
    }

    #[test]
    fn no_command_is_the_server() {
        let cli = Cli::parse_from([
            "gputel-collector",
            "--plaintext",
            "--listen",
            "127.0.0.1:7000",
        ]);
        assert!(cli.command.is_none());
        assert_eq!(
            Config::load(cli).unwrap().listen,
            "127.0.0.1:7000".parse().unwrap()
        );
    }

    #[test]
    fn import_jobs_arguments() {
        let cli = Cli::parse_from([
            "gputel-collector",
            "import-jobs",
            "--format",
            "acme",
            "trace.csv",
            "--utc-offset",
            "-05:00",
            "--store",
            "s3://bucket/gputel",
        ]);
        let Some(Command::ImportJobs(args)) = cli.command else {
            panic!("no import-jobs in {cli:?}");
        };
        assert_eq!(args.format, Format::Acme);
        assert_eq!(args.file, PathBuf::from("trace.csv"));
        assert_eq!(args.utc_offset, FixedOffset::west_opt(5 * 3600).unwrap());
        assert_eq!(args.store().unwrap(), "s3://bucket/gputel");

        let cli = Cli::parse_from(["gputel-collector", "import-jobs", "--format", "sacct", "f"]);
        let Some(Command::ImportJobs(args)) = cli.command else {
            panic!("no import-jobs in {cli:?}");
        };
        assert_eq!(args.utc_offset, FixedOffset::east_opt(0).unwrap());
        assert_eq!(args.store().unwrap(), DEFAULT_STORE);
    }

    #[test]
    fn import_jobs_takes_the_store_from_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("collector.toml");
        std::fs::write(&path, "store = \"/srv/gputel\"\nflush-interval = \"30s\"\n").unwrap();
        let cli = Cli::parse_from([
            "gputel-collector",
            "import-jobs",
            "--format=sacct",
            "jobs.txt",
            "--config",
            path.to_str().unwrap(),
        ]);
        let Some(Command::ImportJobs(args)) = cli.command else {
            panic!("no import-jobs in {cli:?}");
        };
        assert_eq!(args.store().unwrap(), "/srv/gputel");
    }

    #[test]
    fn server_flags_do_not_mix_with_commands() {
        for args in [
            &[
                "gputel-collector",
                "--store",
                "x",
                "import-jobs",
                "--format",
                "sacct",
                "f",
            ][..],
            &["gputel-collector", "import-jobs", "f"],
            &["gputel-collector", "import-jobs", "--format", "slurm", "f"],
            &[
                "gputel-collector",
                "import-jobs",
                "--format",
                "sacct",
                "f",
                "--utc-offset",
                "8",
            ],
        ] {
            assert!(Cli::try_parse_from(args).is_err(), "{args:?}");
        }
    }
}
