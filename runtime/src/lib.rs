//! Process plumbing shared by gputel's programs (the agent, the collector
//! and the load generator), so that it exists once: the log set-up, the
//! shutdown signals, systemd's readiness and watchdog, reading a TOML config
//! file, the one-line report of the error that stops a program, and the
//! checksummed record framing of the agent's spool and the
//! collector's write-ahead log, and durations in microseconds.

pub mod config_file;
pub mod framing;
pub mod logging;
pub mod notify;
pub mod report;
pub mod signal;
pub mod time;
