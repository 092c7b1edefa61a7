//! Configuration: a TOML file (`--config`) overridden by command-line flags.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser};
use gputel_schemas::column::{MAX_MAP_ENTRIES, MAX_VALUE_BYTES};
use serde::Deserialize;

use crate::metrics::HostnameLabel;
use crate::sampler::Source;
use crate::sampler::dcgm::{DEFAULT_DCGM_HOST, DcgmHost};
use crate::sampler::gpu::Profiling;

/// The collector's default address (see gputel-collector's `--listen`).
pub const DEFAULT_COLLECTOR: &str = "http://127.0.0.1:7117";

#[derive(Debug, Parser)]
#[command(
    name = "gputel-agent",
    version,
    about = "Samples GPUs, the host and InfiniBand ports, and streams them to a gputel collector",
    long_about = "Samples every GPU through NVML, the host through /proc and InfiniBand ports \
                  through /sys, once per --interval at wall-clock multiples of it, and streams \
                  the samples to a gputel collector over gRPC. Batches the collector has not \
                  acknowledged are kept and resent after a reconnect.\n\n\
                  Settings come from --config (TOML; keys are the flags' long names without the \
                  leading dashes, e.g. interval = \"5s\"); flags override the file."
)]
pub struct Cli {
    /// TOML configuration file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print one snapshot as JSON on stdout and exit, without a collector.
    #[arg(long)]
    pub once: bool,
    /// Stop after this many ticks, once the collector has acknowledged them.
    #[arg(long, value_name = "N", conflicts_with = "once")]
    pub ticks: Option<u64>,
    #[command(flatten)]
    pub settings: Settings,
}

/// Every setting, optional so that file and flags can be merged.
#[derive(Debug, Default, Clone, Args, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Settings {
    /// Collector to stream to; repeat the flag or separate URLs with commas
    /// for several (a DNS name stands for every address it resolves to):
    /// the agent streams to one and fails over to the next when it is lost
    /// [default: http://127.0.0.1:7117].
    #[arg(long, value_name = "URL", value_delimiter = ',')]
    #[serde(default, deserialize_with = "one_or_many")]
    pub collector: Option<Vec<String>>,
    /// Time between samples; ticks fall on wall-clock multiples of it [default: 1s].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(default, with = "humantime_serde")]
    pub interval: Option<Duration>,
    /// Node name put on every row [default: the host name].
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,
    /// Where procfs is mounted [default: /proc].
    #[arg(long, value_name = "DIR")]
    pub procfs_root: Option<PathBuf>,
    /// Where sysfs is mounted [default: /sys].
    #[arg(long, value_name = "DIR")]
    pub sysfs_root: Option<PathBuf>,
    /// Sources to sample, comma-separated: gpu (every GPU, through NVML), node
    /// (the host's CPU, memory and load, through /proc), ib (InfiniBand
    /// ports, through /sys). In the file, a list: sources = ["gpu", "node"]
    /// [default: gpu,node,ib].
    #[arg(long, value_name = "SOURCES", value_delimiter = ',')]
    pub sources: Option<Vec<Source>>,
    /// NVML library to load [default: the system's libnvidia-ml.so.1].
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,
    /// Where SM activity, SM occupancy, tensor and DRAM activity come from:
    /// auto (GPM on GPUs that have it, Hopper and newer; DCGM's profiling
    /// fields on the others, such as A100s), gpm (GPM only; DCGM is never
    /// loaded), dcgm (DCGM for every GPU; GPM only where DCGM cannot read a
    /// GPU) [default: auto].
    #[arg(long, value_name = "SOURCE")]
    pub profiling_source: Option<Profiling>,
    /// DCGM to read profiling fields through: a host engine at HOST:PORT
    /// or unix:///PATH (nv-hostengine, shared with dcgm-exporter), or
    /// embedded to start DCGM inside the agent [default: 127.0.0.1:5555].
    #[arg(long, value_name = "ADDR", value_parser = DcgmHost::parse)]
    pub dcgm_host: Option<DcgmHost>,
    /// DCGM library to load [default: libdcgm.so.4, else libdcgm.so.3].
    #[arg(long, value_name = "PATH")]
    pub dcgm_lib: Option<PathBuf>,
    /// While this file exists, DCGM's profiling is paused (dcgmProfPause),
    /// so a job can profile itself with Nsight; the profiling columns are
    /// null meanwhile, and removing the file resumes it [default: none].
    #[arg(long, value_name = "FILE")]
    pub dcgm_pause_file: Option<PathBuf>,
    /// Directory of the on-disk spool: unacknowledged batches are kept there
    /// until the collector has them, through collector outages and agent
    /// restarts. Without it they are kept in memory only [default: none].
    #[arg(long, value_name = "DIR")]
    pub spool_dir: Option<PathBuf>,
    /// Largest size of the spool, in bytes; beyond it the oldest batches are
    /// dropped, and counted [default: 268435456].
    #[arg(long, value_name = "BYTES")]
    pub spool_max_bytes: Option<u64>,
    /// Unacknowledged batches kept in memory (with a spool: the newest of them,
    /// the rest are read back from disk); without a spool the oldest are
    /// dropped, and counted, beyond it [default: 3600].
    #[arg(long, value_name = "BATCHES")]
    pub max_pending_batches: Option<usize>,
    /// At shutdown, how long to wait for the collector to acknowledge what was sent
    /// [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(default, with = "humantime_serde")]
    pub drain_timeout: Option<Duration>,
    /// Time between listings of the GPUs' compute processes, which are slow NVML
    /// calls that hold a driver lock [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(default, with = "humantime_serde")]
    pub process_interval: Option<Duration>,
    /// Time between the GPU readings that cost NVML milliseconds of CPU each
    /// (3-4 ms for the energy counter on an H200, against microseconds for
    /// the rest): energy, PCIe traffic and replays, graphics engine activity
    /// and MIG mode. Their columns are null at the ticks between, and
    /// `power_avg_mw` and the PCIe rates span the time between two reads; set
    /// it to the sampling interval to read them at every tick [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(default, with = "humantime_serde")]
    pub slow_read_interval: Option<Duration>,
    /// Slurm prolog/epilog job mapping directory, in dcgm-exporter's format: one
    /// file per GPU index holding the job ids on it, one per line. It wins over
    /// the jobs found from the GPUs' processes [default: none].
    #[arg(long, value_name = "DIR")]
    pub hpc_job_mapping_dir: Option<PathBuf>,
    /// The kubelet's pod-resources socket, asked at every process listing
    /// which pod and container each GPU is allocated to; where it does not
    /// exist (not a Kubernetes node), pods are found from cgroups alone
    /// [default: /var/lib/kubelet/pod-resources/kubelet.sock].
    #[arg(long, value_name = "PATH")]
    pub kubelet_socket: Option<PathBuf>,
    /// A pod label to keep in the gpu table's pod_labels column (e.g. team,
    /// or app.kubernetes.io/name); repeat the flag or separate keys with
    /// commas. The agent then lists its node's pods from the API server,
    /// with the pod's service account (it needs get and list on pods)
    /// [default: none].
    #[arg(long, value_name = "KEY", value_delimiter = ',')]
    pub pod_label: Option<Vec<String>>,
    /// The API server to read pod labels from [default: in a pod, the
    /// cluster's own: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT].
    #[arg(long, value_name = "URL")]
    pub kube_api_server: Option<String>,
    /// PEM CA that signs the collector's certificate (with an https:// collector).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// PEM certificate the agent presents; it must name this node.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Name the collector's certificate is checked against [default: the
    /// collector URL's host].
    #[arg(long, value_name = "NAME")]
    pub tls_server_name: Option<String>,
    /// Stream to an http:// collector without TLS. For loopback development only.
    #[arg(long)]
    #[serde(default)]
    pub plaintext: bool,
    /// Log filter, as in RUST_LOG (e.g. "info", "gputel_agent=debug") [default: info].
    #[arg(long, value_name = "FILTER")]
    pub log: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics, with dcgm-exporter's
    /// metric and label names, e.g. 0.0.0.0:9400 (dcgm-exporter's usual port)
    /// [default: off].
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Name of the /metrics host label: hostname, as dcgm-exporter names it
    /// since 4.6.0-4.8.3, or Hostname, as its earlier releases did, for
    /// dashboards that select on that [default: hostname].
    #[arg(long, value_name = "NAME")]
    pub metrics_hostname_label: Option<HostnameLabel>,
}

impl Settings {
    /// These settings, with `other`'s filling the gaps.
    fn or(self, other: Settings) -> Settings {
        Settings {
            collector: self.collector.or(other.collector),
            interval: self.interval.or(other.interval),
            node: self.node.or(other.node),
            procfs_root: self.procfs_root.or(other.procfs_root),
            sysfs_root: self.sysfs_root.or(other.sysfs_root),
            sources: self.sources.or(other.sources),
            nvml_lib: self.nvml_lib.or(other.nvml_lib),
            profiling_source: self.profiling_source.or(other.profiling_source),
            dcgm_host: self.dcgm_host.or(other.dcgm_host),
            dcgm_lib: self.dcgm_lib.or(other.dcgm_lib),
            dcgm_pause_file: self.dcgm_pause_file.or(other.dcgm_pause_file),
            max_pending_batches: self.max_pending_batches.or(other.max_pending_batches),
            spool_dir: self.spool_dir.or(other.spool_dir),
            spool_max_bytes: self.spool_max_bytes.or(other.spool_max_bytes),
            drain_timeout: self.drain_timeout.or(other.drain_timeout),
            process_interval: self.process_interval.or(other.process_interval),
            slow_read_interval: self.slow_read_interval.or(other.slow_read_interval),
            hpc_job_mapping_dir: self.hpc_job_mapping_dir.or(other.hpc_job_mapping_dir),
            kubelet_socket: self.kubelet_socket.or(other.kubelet_socket),
            pod_label: self.pod_label.or(other.pod_label),
            kube_api_server: self.kube_api_server.or(other.kube_api_server),
            log: self.log.or(other.log),
            metrics_listen: self.metrics_listen.or(other.metrics_listen),
            metrics_hostname_label: self.metrics_hostname_label.or(other.metrics_hostname_label),
            // A flag overrides the file: --plaintext sets the file's TLS aside.
            tls_ca: self.tls_ca.or(other.tls_ca.filter(|_| !self.plaintext)),
            tls_cert: self.tls_cert.or(other.tls_cert.filter(|_| !self.plaintext)),
            tls_key: self.tls_key.or(other.tls_key.filter(|_| !self.plaintext)),
            tls_server_name: self.tls_server_name.or(other.tls_server_name),
            plaintext: self.plaintext || other.plaintext,
        }
    }
}

/// `collector = "URL"` or `collector = ["URL", …]` in the file.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(Some(match OneOrMany::deserialize(d)? {
        OneOrMany::One(url) => vec![url],
        OneOrMany::Many(urls) => urls,
    }))
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The collectors' URLs, at least one, all http:// or all https://.
    pub collectors: Vec<String>,
    pub interval: Duration,
    pub node: String,
    pub procfs_root: PathBuf,
    pub sysfs_root: PathBuf,
    /// The sources sampled, each once, in [`Source::ALL`]'s order.
    pub sources: Vec<Source>,
    pub nvml_lib: Option<PathBuf>,
    pub profiling_source: Profiling,
    pub dcgm_host: DcgmHost,
    /// None: the system's libdcgm.so.4 or libdcgm.so.3.
    pub dcgm_lib: Option<PathBuf>,
    pub dcgm_pause_file: Option<PathBuf>,
    pub max_pending_batches: usize,
    pub spool_dir: Option<PathBuf>,
    pub spool_max_bytes: u64,
    pub drain_timeout: Duration,
    pub process_interval: Duration,
    pub slow_read_interval: Duration,
    pub hpc_job_mapping_dir: Option<PathBuf>,
    pub kubelet_socket: PathBuf,
    /// Pod labels kept; none: the API server is never asked.
    pub pod_labels: Vec<String>,
    pub kube_api_server: Option<String>,
    pub log: String,
    /// Where to serve `/metrics`; None: not served.
    pub metrics_listen: Option<SocketAddr>,
    /// The name of the host label on `/metrics`.
    pub metrics_hostname_label: HostnameLabel,
    /// Mutual TLS, or None for a plaintext http:// collector.
    pub tls: Option<TlsFiles>,
}

/// The PEM files of the agent's mutual TLS.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub server_name: Option<String>,
}

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    File(#[from] gputel_runtime::config_file::ConfigFileError),
    #[error("cannot read the host name from {path} ({source}); set --node")]
    Hostname {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

impl Config {
    /// Merges flags over the file (if any) over the defaults.
    pub fn load(cli: &Cli) -> Result<Config, ConfigError> {
        let file = match &cli.config {
            Some(path) => read_file(path)?,
            None => Settings::default(),
        };
        let s = cli.settings.clone().or(file);
        let procfs_root = s.procfs_root.unwrap_or_else(|| PathBuf::from("/proc"));
        let node = match s.node {
            Some(node) => node,
            None => hostname(&procfs_root)?,
        };
        let mut config = Config {
            collectors: s
                .collector
                .filter(|urls| !urls.is_empty())
                .unwrap_or_else(|| vec![DEFAULT_COLLECTOR.to_owned()]),
            interval: s.interval.unwrap_or(Duration::from_secs(1)),
            node,
            procfs_root,
            sysfs_root: s.sysfs_root.unwrap_or_else(|| PathBuf::from("/sys")),
            sources: match s.sources {
                Some(listed) => Source::ALL
                    .into_iter()
                    .filter(|source| listed.contains(source))
                    .collect(),
                None => Source::ALL.to_vec(),
            },
            nvml_lib: s.nvml_lib,
            profiling_source: s.profiling_source.unwrap_or_default(),
            dcgm_host: s
                .dcgm_host
                .unwrap_or_else(|| DcgmHost::Tcp(DEFAULT_DCGM_HOST.to_owned())),
            dcgm_lib: s.dcgm_lib,
            dcgm_pause_file: s.dcgm_pause_file,
            max_pending_batches: s.max_pending_batches.unwrap_or(3600),
            spool_dir: s.spool_dir,
            spool_max_bytes: s.spool_max_bytes.unwrap_or(256 * 1024 * 1024),
            drain_timeout: s.drain_timeout.unwrap_or(Duration::from_secs(10)),
            process_interval: s.process_interval.unwrap_or(Duration::from_secs(10)),
            slow_read_interval: s.slow_read_interval.unwrap_or(Duration::from_secs(10)),
            hpc_job_mapping_dir: s.hpc_job_mapping_dir,
            kubelet_socket: s
                .kubelet_socket
                .unwrap_or_else(|| PathBuf::from(crate::kube::DEFAULT_KUBELET_SOCKET)),
            pod_labels: s.pod_label.unwrap_or_default(),
            kube_api_server: s.kube_api_server,
            log: s.log.unwrap_or_else(|| "info".to_owned()),
            metrics_listen: s.metrics_listen,
            metrics_hostname_label: s.metrics_hostname_label.unwrap_or_default(),
            tls: None,
        };
        let https = config.collectors.iter().any(|c| c.starts_with("https://"));
        config.tls = match (s.tls_ca, s.tls_cert, s.tls_key, https, s.plaintext) {
            // --once never talks to the collector.
            _ if cli.once => None,
            (Some(ca), Some(cert), Some(key), true, false) => Some(TlsFiles {
                ca,
                cert,
                key,
                server_name: s.tls_server_name,
            }),
            (None, None, None, false, true) => None,
            (_, _, _, true, _) => {
                return Err(ConfigError::Invalid(
                    "an https:// collector needs tls-ca, tls-cert and tls-key (and no plaintext)"
                        .into(),
                ));
            }
            _ => {
                return Err(ConfigError::Invalid(format!(
                    "collector {} is plaintext: use https:// with tls-ca, tls-cert and tls-key, \
                     or pass plaintext for loopback development",
                    config.collectors.join(",")
                )));
            }
        };
        if config.interval < Duration::from_millis(10) {
            return Err(ConfigError::Invalid(
                "interval must be at least 10ms".into(),
            ));
        }
        if config.process_interval < config.interval {
            return Err(ConfigError::Invalid(
                "process-interval must be at least the sampling interval".into(),
            ));
        }
        if config.slow_read_interval < config.interval {
            return Err(ConfigError::Invalid(
                "slow-read-interval must be at least the sampling interval".into(),
            ));
        }
        if config.sources.is_empty() {
            return Err(ConfigError::Invalid(
                "sources is empty: name at least one of gpu, node, ib".into(),
            ));
        }
        if config.max_pending_batches == 0 {
            return Err(ConfigError::Invalid(
                "max-pending-batches must be above zero".into(),
            ));
        }
        if let Some(key) = config
            .pod_labels
            .iter()
            .find(|key| key.is_empty() || !crate::kube::storable_label(key))
        {
            return Err(ConfigError::Invalid(format!(
                "pod-label {key:?} is not a label key: use 1 to {MAX_VALUE_BYTES} printable characters"
            )));
        }
        // The collector refuses a row with more labels than that.
        if config.pod_labels.len() > MAX_MAP_ENTRIES {
            return Err(ConfigError::Invalid(format!(
                "pod-label names {} labels: keep at most {MAX_MAP_ENTRIES}",
                config.pod_labels.len()
            )));
        }
        let node_ok = !config.node.is_empty()
            && config.node.len() <= 253
            && config
                .node
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !node_ok {
            return Err(ConfigError::Invalid(format!(
                "node name {:?} is invalid: use 1 to 253 characters of [A-Za-z0-9._-] (set --node)",
                config.node
            )));
        }
        Ok(config)
    }
}

fn hostname(procfs_root: &Path) -> Result<String, ConfigError> {
    let path = procfs_root.join("sys/kernel/hostname");
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_owned())
        .map_err(|source| ConfigError::Hostname { path, source })
}

fn read_file(path: &Path) -> Result<Settings, ConfigError> {
    Ok(gputel_runtime::config_file::read_toml(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The configuration of `gputel-agent --plaintext --node n ARGS`, or
    /// the words of why not (from the command line or the file).
    fn load(args: &[&str]) -> Result<Config, String> {
        let mut argv = vec!["gputel-agent", "--plaintext", "--node", "n"];
        argv.extend_from_slice(args);
        Config::load(&Cli::try_parse_from(argv).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn flags_override_file_and_file_overrides_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(
            &path,
            "interval = \"5s\"\nnode = \"gpu-017\"\ncollector = \"http://c:1\"\n",
        )
        .unwrap();
        let cli = Cli::parse_from([
            "gputel-agent",
            "--config",
            path.to_str().unwrap(),
            "--collector",
            "http://10.0.0.1:7117",
            "--plaintext",
        ]);
        let config = Config::load(&cli).unwrap();
        assert_eq!(config.collectors, ["http://10.0.0.1:7117"]);
        assert_eq!(config.interval, Duration::from_secs(5));
        assert_eq!(config.node, "gpu-017");
        assert_eq!(config.procfs_root, PathBuf::from("/proc"));
        assert_eq!(config.max_pending_batches, 3600);
        assert_eq!(config.metrics_listen, None);
    }

    #[test]
    fn several_collectors_come_from_a_list_in_the_file_or_repeated_or_comma_separated_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(
            &path,
            "collector = [\"http://a:7117\", \"http://b:7117\"]\nplaintext = true\nnode = \"n\"\n",
        )
        .unwrap();
        let from_file = Config::load(&Cli::parse_from([
            "gputel-agent",
            "--config",
            path.to_str().unwrap(),
        ]))
        .unwrap();
        assert_eq!(from_file.collectors, ["http://a:7117", "http://b:7117"]);
        let repeated = load(&[
            "--collector",
            "http://c:1",
            "--collector",
            "http://d:1,http://e:1",
        ])
        .unwrap();
        assert_eq!(
            repeated.collectors,
            ["http://c:1", "http://d:1", "http://e:1"]
        );
        assert_eq!(load(&[]).unwrap().collectors, [DEFAULT_COLLECTOR]);
        // One https:// collector among them needs TLS.
        let err = load(&["--collector", "http://c:1,https://d:1"]).unwrap_err();
        assert!(err.starts_with("an https:// collector needs"), "{err}");
    }

    #[test]
    fn sources_come_from_file_or_flag_each_once_in_sampling_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(
            &path,
            "node = \"n\"\nsources = [\"ib\", \"node\", \"ib\"]\n",
        )
        .unwrap();
        let file = path.to_str().unwrap();
        let load = |args: &[&str]| {
            let mut argv = vec!["gputel-agent", "--plaintext"];
            argv.extend_from_slice(args);
            Config::load(&Cli::parse_from(argv))
        };
        assert_eq!(
            load(&["--node", "n"]).unwrap().sources,
            [Source::Gpu, Source::Node, Source::Ib]
        );
        assert_eq!(
            load(&["--config", file]).unwrap().sources,
            [Source::Node, Source::Ib]
        );
        assert_eq!(
            load(&["--config", file, "--sources", "ib,gpu"])
                .unwrap()
                .sources,
            [Source::Gpu, Source::Ib]
        );

        std::fs::write(&path, "node = \"n\"\nsources = []\n").unwrap();
        let err = load(&["--config", file]).unwrap_err().to_string();
        assert_eq!(err, "sources is empty: name at least one of gpu, node, ib");

        std::fs::write(&path, "node = \"n\"\nsources = [\"gpu\", \"dcgm\"]\n").unwrap();
        let err = load(&["--config", file]).unwrap_err().to_string();
        assert!(
            err.contains("unknown variant `dcgm`, expected one of `gpu`, `node`, `ib`"),
            "{err}"
        );
    }

    #[test]
    fn the_metrics_host_label_name_comes_from_file_or_flag() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        let file = path.to_str().unwrap();
        assert_eq!(
            load(&[]).unwrap().metrics_hostname_label,
            HostnameLabel::Lower
        );
        std::fs::write(&path, "metrics-hostname-label = \"Hostname\"\n").unwrap();
        assert_eq!(
            load(&["--config", file]).unwrap().metrics_hostname_label,
            HostnameLabel::Capital
        );
        assert_eq!(
            load(&["--config", file, "--metrics-hostname-label", "hostname"])
                .unwrap()
                .metrics_hostname_label,
            HostnameLabel::Lower
        );
        // Only dcgm-exporter's two spellings.
        let err = load(&["--metrics-hostname-label", "HOSTNAME"]).unwrap_err();
        assert!(
            err.contains("invalid value 'HOSTNAME'")
                && err.contains("[possible values: hostname, Hostname]"),
            "{err}"
        );
        std::fs::write(&path, "metrics-hostname-label = \"host\"\n").unwrap();
        let err = load(&["--config", file]).unwrap_err();
        assert!(
            err.contains("unknown variant `host`, expected `hostname` or `Hostname`"),
            "{err}"
        );
    }

    #[test]
    fn metrics_listen_comes_from_file_or_flag() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, "node = \"n\"\nmetrics-listen = \"0.0.0.0:9400\"\n").unwrap();
        let from_file = Cli::parse_from([
            "gputel-agent",
            "--plaintext",
            "--config",
            path.to_str().unwrap(),
        ]);
        assert_eq!(
            Config::load(&from_file).unwrap().metrics_listen,
            Some("0.0.0.0:9400".parse().unwrap())
        );
        let flag = Cli::parse_from([
            "gputel-agent",
            "--plaintext",
            "--config",
            path.to_str().unwrap(),
            "--metrics-listen",
            "127.0.0.1:0",
        ]);
        assert_eq!(
            Config::load(&flag).unwrap().metrics_listen,
            Some("127.0.0.1:0".parse().unwrap())
        );
        std::fs::write(&path, "metrics-listen = \"localhost\"\n").unwrap();
        let err = Config::load(&from_file).unwrap_err().to_string();
        assert!(err.contains("metrics-listen"), "{err}");
    }

    #[test]
    fn plaintext_only_when_asked_and_https_only_with_certificates() {
        let load = |args: &[&str]| {
            let mut all = vec!["gputel-agent", "--node", "n1"];
            all.extend_from_slice(args);
            Config::load(&Cli::parse_from(all)).map(|c| c.tls.is_some())
        };
        let err = load(&[]).unwrap_err().to_string();
        assert!(
            err.starts_with("collector http://127.0.0.1:7117 is plaintext"),
            "{err}"
        );
        assert!(!load(&["--plaintext"]).unwrap());
        // --once never connects.
        assert!(!load(&["--once"]).unwrap());
        let err = load(&["--collector", "https://c:7117", "--tls-ca", "ca.pem"])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("an https:// collector needs"), "{err}");
        let tls = [
            "--collector",
            "https://c:7117",
            "--tls-ca",
            "ca.pem",
            "--tls-cert",
            "n1.pem",
            "--tls-key",
            "n1.key",
        ];
        assert!(load(&tls).unwrap());
    }

    #[test]
    fn dcgm_settings_come_from_file_or_flag() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        let file = path.to_str().unwrap();
        let defaults = load(&[]).unwrap();
        assert_eq!(defaults.profiling_source, Profiling::Auto);
        assert_eq!(defaults.dcgm_host, DcgmHost::Tcp("127.0.0.1:5555".into()));
        assert_eq!(defaults.dcgm_lib, None);
        assert_eq!(defaults.dcgm_pause_file, None);

        std::fs::write(
            &path,
            "profiling-source = \"dcgm\"\ndcgm-host = \"unix:///run/nvidia-dcgm.sock\"\n\
             dcgm-lib = \"/opt/dcgm/libdcgm.so.4\"\n\
             dcgm-pause-file = \"/run/gputel/profiling-paused\"\n",
        )
        .unwrap();
        let from_file = load(&["--config", file]).unwrap();
        assert_eq!(from_file.profiling_source, Profiling::Dcgm);
        assert_eq!(
            from_file.dcgm_host,
            DcgmHost::Unix("/run/nvidia-dcgm.sock".into())
        );
        assert_eq!(
            from_file.dcgm_lib,
            Some(PathBuf::from("/opt/dcgm/libdcgm.so.4"))
        );
        assert_eq!(
            from_file.dcgm_pause_file,
            Some(PathBuf::from("/run/gputel/profiling-paused"))
        );
        let flags = load(&[
            "--config",
            file,
            "--profiling-source",
            "gpm",
            "--dcgm-host",
            "embedded",
        ])
        .unwrap();
        assert_eq!(flags.profiling_source, Profiling::Gpm);
        assert_eq!(flags.dcgm_host, DcgmHost::Embedded);

        let err = load(&["--dcgm-host", "unix://relative.sock"]).unwrap_err();
        assert!(
            err.contains("invalid value 'unix://relative.sock' for '--dcgm-host <ADDR>'")
                && err.contains("use HOST:PORT"),
            "{err}"
        );
        let err = load(&["--profiling-source", "nvml"]).unwrap_err();
        assert!(err.contains("[possible values: auto, gpm, dcgm]"), "{err}");
        std::fs::write(&path, "dcgm-host = \"gpu-017:70000\"\n").unwrap();
        let err = load(&["--config", file]).unwrap_err();
        assert!(
            err.contains("\"gpu-017:70000\" is not a DCGM host engine"),
            "{err}"
        );
    }

    #[test]
    fn bad_node_names_are_refused() {
        let cli = Cli::parse_from(["gputel-agent", "--plaintext", "--node", "../../etc"]);
        let err = Config::load(&cli).unwrap_err().to_string();
        assert!(
            err.starts_with("node name \"../../etc\" is invalid"),
            "{err}"
        );
    }

    /// Pod labels the collector would refuse in every row are refused here.
    #[test]
    fn pod_labels_the_collector_cannot_store_are_refused() {
        let keys = |n: usize| {
            (0..n)
                .map(|i| format!("k{i}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        let ok = load(&["--pod-label", &keys(64)]).expect("64 labels");
        assert_eq!(ok.pod_labels.len(), 64);
        assert_eq!(
            load(&["--pod-label", &keys(65)]).unwrap_err(),
            "pod-label names 65 labels: keep at most 64"
        );
        let long = "k".repeat(257);
        assert_eq!(
            load(&["--pod-label", &format!("team,{long}")]).unwrap_err(),
            format!("pod-label {long:?} is not a label key: use 1 to 256 printable characters")
        );
        assert!(load(&["--pod-label", "team,,app"]).is_err());
    }
}
