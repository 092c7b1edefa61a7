//! `gputel-loadgen`: simulated agents streaming to a collector as fast as it
//! acknowledges. See `gputel_benches::loadgen` and `--help`.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use gputel_benches::loadgen::{self, Cli, Plan};

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
    gputel_runtime::logging::init(DEFAULT_LOG)?;

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
