//! `gputel-loadgen`: simulated agents streaming to a collector as fast as it
//! acknowledges. See `gputel_benches::loadgen` and `--help`.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use gputel_benches::loadgen::{self, Cli, Plan};
use tracing_subscriber::EnvFilter;

/// Logs when RUST_LOG is unset: the load generator's own lines and the
/// clients' warnings (lost streams, rejected batches), not a line per connection.
const DEFAULT_LOG: &str = "warn,gputel_benches=info";

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gputel-loadgen: {e:#}");
            // As for a usage error: the run did not start.
            ExitCode::from(2)
        }
    }
}

fn run(cli: &Cli) -> anyhow::Result<ExitCode> {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(DEFAULT_LOG))
        .context("invalid RUST_LOG")?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // A closed stderr must not stop the program: by default a failed
        // write is reported with eprint!, which panics when stderr is gone.
        .log_internal_errors(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    let now_us = chrono::Utc::now().timestamp_micros();
    let plan = Plan::new(cli, now_us)?;
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = cli.threads {
        runtime.worker_threads(threads as usize);
    }
    let runtime = runtime
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let summary = runtime.block_on(loadgen::run(plan))?;
    println!("{summary}");
    Ok(match summary.failure() {
        None => ExitCode::SUCCESS,
        Some(failure) => {
            eprintln!("gputel-loadgen: not every batch was delivered: {failure}");
            ExitCode::FAILURE
        }
    })
}
