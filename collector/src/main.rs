use anyhow::Context;
use clap::Parser;
use gputel_collector::config::{Cli, Config};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::load(Cli::parse())?;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.log))
        .with_context(|| format!("invalid log filter {:?}", config.log))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    gputel_collector::run(config, gputel_collector::shutdown_signal()).await?;
    Ok(())
}
