//! Logs through `tracing` to stderr, which journald captures under systemd.

use tracing_subscriber::EnvFilter;

/// The filter given was not a valid `tracing` directive.
#[derive(Debug, thiserror::Error)]
#[error("invalid log filter {filter:?}: {source}")]
pub struct LogFilterError {
    filter: String,
    #[source]
    source: tracing_subscriber::filter::ParseError,
}

/// Logs to stderr at `default_filter` (e.g. "info", "gputel_agent=debug"),
/// or as `RUST_LOG` says when it is set and valid. Colours only on a
/// terminal. Call once, early in `main`.
pub fn init(default_filter: &str) -> Result<(), LogFilterError> {
    let filter = match EnvFilter::try_from_default_env() {
        Ok(filter) => filter,
        Err(_) => EnvFilter::try_new(default_filter).map_err(|source| LogFilterError {
            filter: default_filter.to_owned(),
            source,
        })?,
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // A closed stderr must not stop the program: by default a failed
        // write is reported with eprint!, which panics when stderr is gone.
        .log_internal_errors(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    Ok(())
}
