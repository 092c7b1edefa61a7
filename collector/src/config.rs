//! Configuration: a TOML file (`--config`) overridden by command-line flags.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser};
use serde::Deserialize;

/// The collector's default gRPC port. Not assigned to a well-known service by
/// IANA, and clear of the Prometheus exporter range (9100-9999).
pub const DEFAULT_PORT: u16 = 7117;

#[derive(Debug, Parser)]
#[command(
    name = "gputel-collector",
    version,
    about = "Receives gputel agent streams and writes hive-partitioned Parquet",
    long_about = "Receives gputel agent streams over gRPC, validates every batch, and writes \
                  hive-partitioned Parquet (<store>/<table>/date=YYYY-MM-DD/hour=HH/*.parquet) \
                  that DuckDB, Spark and Trino read directly.\n\n\
                  Settings come from --config (TOML; keys are the flags' long names without the \
                  leading dashes, e.g. flush-interval = \"30s\"); flags override the file."
)]
pub struct Cli {
    /// TOML configuration file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: Settings,
}

/// Every setting, optional so that file and flags can be merged.
#[derive(Debug, Default, Clone, Args, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Settings {
    /// Address to serve the agents' gRPC streams on [default: 0.0.0.0:7117].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Where Parquet files go: a directory, or an object store URL (file://, memory://)
    /// [default: ./gputel-data].
    #[arg(long, value_name = "DIR|URL")]
    pub store: Option<String>,
    /// Longest time rows wait in memory before they are written [default: 60s].
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    #[serde(default, with = "humantime_serde")]
    pub flush_interval: Option<Duration>,
    /// Buffered rows (all tables) that trigger a write before the interval ends
    /// [default: 1000000].
    #[arg(long, value_name = "ROWS")]
    pub flush_rows: Option<usize>,
    /// Largest message accepted from an agent, in bytes [default: 16777216].
    #[arg(long, value_name = "BYTES")]
    pub max_message_bytes: Option<usize>,
    /// Log filter, as in RUST_LOG (e.g. "info", "gputel_collector=debug") [default: info].
    #[arg(long, value_name = "FILTER")]
    pub log: Option<String>,
}

impl Settings {
    /// These settings, with `other`'s filling the gaps.
    fn or(self, other: Settings) -> Settings {
        Settings {
            listen: self.listen.or(other.listen),
            store: self.store.or(other.store),
            flush_interval: self.flush_interval.or(other.flush_interval),
            flush_rows: self.flush_rows.or(other.flush_rows),
            max_message_bytes: self.max_message_bytes.or(other.max_message_bytes),
            log: self.log.or(other.log),
        }
    }
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub store: String,
    pub flush_interval: Duration,
    pub flush_rows: usize,
    pub max_message_bytes: usize,
    pub log: String,
}

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path} is invalid: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
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
        let config = Config {
            listen: s
                .listen
                .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT))),
            store: s.store.unwrap_or_else(|| "./gputel-data".to_owned()),
            flush_interval: s.flush_interval.unwrap_or(Duration::from_secs(60)),
            flush_rows: s.flush_rows.unwrap_or(1_000_000),
            max_message_bytes: s
                .max_message_bytes
                .unwrap_or(gputel_proto::DEFAULT_MAX_MESSAGE_BYTES),
            log: s.log.unwrap_or_else(|| "info".to_owned()),
        };
        if config.flush_interval.is_zero() {
            return Err(ConfigError::Invalid(
                "flush-interval must be above zero".into(),
            ));
        }
        if config.flush_rows == 0 {
            return Err(ConfigError::Invalid("flush-rows must be above zero".into()));
        }
        Ok(config)
    }
}

fn read_file(path: &Path) -> Result<Settings, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.to_owned(),
        source,
    })
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
            "store = \"/srv/gputel\"\nflush-interval = \"30s\"\nlisten = \"127.0.0.1:9000\"\n",
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
        assert_eq!(config.flush_rows, 1_000_000);
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
}
