//! `gputel-demo`: the simulated GPU server of `scripts/run-local` (see
//! `gputel_tests::demo`, in tests/src/demo/).

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Parser;
use gputel_tests::demo::{self, Node, Options};

#[derive(Debug, Parser)]
#[command(
    name = "gputel-demo",
    about = "Simulates what a GPU server has and this machine lacks, for scripts/run-local",
    long_about = "Simulates what a GPU training server has and this machine lacks, for \
                  scripts/run-local: eight H100s with Slurm jobs, their processes, a thermal \
                  episode and XIDs (--gpus), and InfiniBand ports with traffic (--ib). It \
                  writes the trees a gputel agent reads under --dir and keeps them moving, \
                  once a second, until it is stopped. The host's own CPU, memory and RAPL \
                  readings stay real: the trees link to /proc and /sys for them.\n\n\
                  With --gpus: DIR/scenario.toml for the fake NVML library \
                  (GPUTEL_FAKE_NVML_SCENARIO), DIR/proc (--procfs-root), DIR/jobmap \
                  (--hpc-job-mapping-dir), and the jobs' scheduler records imported into \
                  --store with `gputel-collector import-jobs` whenever a job starts or ends. \
                  With --ib: DIR/sys (--sysfs-root).\n\n\
                  What is simulated is printed on stdout once the trees are ready; then \
                  \"gputel-demo: ready\" is logged on stderr. Start the agent after that: the \
                  scenario's clock starts when the agent loads the library."
)]
struct Cli {
    /// Directory for the simulated trees (its scenario.toml, proc, sys,
    /// jobmap, trace and tmp are replaced; its history file lets the next
    /// simulation there go on with new job ids).
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// Simulate the GPUs, their jobs and processes, and the job trace.
    #[arg(long)]
    gpus: bool,
    /// Simulate InfiniBand ports.
    #[arg(long)]
    ib: bool,
    /// The collector's store, where the job trace is imported (with --gpus).
    #[arg(long, value_name = "DIR", default_value = "gputel-data")]
    store: PathBuf,
    /// The gputel-collector program that imports the job trace [default: the
    /// one beside this program].
    #[arg(long, value_name = "PATH")]
    collector: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    anyhow::ensure!(
        cli.gpus || cli.ib,
        "nothing to simulate: give --gpus, --ib or both"
    );
    let collector = match cli.collector {
        Some(path) => path,
        None => std::env::current_exe()
            .context("cannot find this program's directory; give --collector")?
            .with_file_name("gputel-collector"),
    };
    let options = Options {
        dir: cli.dir,
        gpus: cli.gpus,
        ib: cli.ib,
        store: cli.store,
        collector,
        fixture_sys: gputel_tests::fixture("sys"),
    };
    let dir = options.dir.clone();
    let start = SystemTime::now();
    let start_unix = start.duration_since(UNIX_EPOCH)?.as_secs() as i64;
    let mut node = Node::prepare(options, start_unix)
        .with_context(|| format!("cannot build the simulated node in {}", dir.display()))?;
    node.advance(0)?;
    let mut out = std::io::stdout().lock();
    write!(out, "{}", demo::describe(cli.gpus, cli.ib, node.history()))?;
    out.flush()?;
    drop(out);
    eprintln!(
        "gputel-demo: ready: the simulated node is in {}",
        dir.display()
    );
    loop {
        // Half-way between whole seconds: the agent samples on whole
        // seconds, so each of its ticks sees one step of the counters.
        let now = SystemTime::now().duration_since(UNIX_EPOCH)?;
        let into_second = Duration::from_nanos(u64::from(now.subsec_nanos()));
        let half = Duration::from_millis(500);
        let wait = if into_second < half {
            half - into_second
        } else {
            Duration::from_secs(1) + half - into_second
        };
        std::thread::sleep(wait);
        let t = start.elapsed().unwrap_or_default().as_secs();
        node.advance(t)?;
    }
}
