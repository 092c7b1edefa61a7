use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use gputel_agent::config::{Cli, Config};
use gputel_agent::sampling::Samplers;
use gputel_agent::snapshot;
use tracing::{info, warn};

fn main() -> ExitCode {
    gputel_runtime::report::exit("gputel-agent", run().map_err(Into::into))
}

fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let config = Config::load(&cli)?;
    gputel_runtime::logging::init(&config.log)?;

    if cli.once {
        // Both samples read everything, the slow reads too: the snapshot
        // shows every reading, its rates over the gap between the two.
        let config = Config {
            slow_read_interval: Duration::ZERO,
            ..config
        };
        let samplers = Samplers::open(&config);
        let gap = config.interval.min(Duration::from_secs(1));
        let snap = snapshot::take(&config.node, samplers, gap);
        let mut out = std::io::stdout().lock();
        serde_json::to_writer_pretty(&mut out, &snap)?;
        writeln!(out)?;
        return Ok(());
    }

    // One thread for the network side is plenty at one batch per interval.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let summary = runtime.block_on(async {
        let shutdown = gputel_runtime::signal::shutdown_signal()?;
        anyhow::Ok(gputel_agent::run(config, cli.ticks, shutdown).await?)
    })?;
    let line = summary.line();
    if summary.delivered_all() {
        info!("stopped: {line}");
    } else {
        warn!("stopped with data not delivered: {line}");
    }
    // For scripts and tests; under systemd stdout is the journal too, which
    // has the summary from the log line above already.
    if std::env::var_os("JOURNAL_STREAM").is_none() {
        println!("{line}");
    }
    Ok(())
}
