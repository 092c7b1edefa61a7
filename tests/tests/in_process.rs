//! The agent and the collector as libraries, in one process: `gputel_agent::run`
//! on the fake NVML and the fixture trees streams to `gputel_collector::serve`
//! on 127.0.0.1:0, and every row it sampled is read back from the Parquet the
//! collector wrote. No binaries, no DuckDB: the library boundary itself.

use std::path::Path;
use std::time::Duration;

use clap::Parser;
use gputel_collector::ServeOptions;
use gputel_collector::clock::Clock;
use gputel_collector::memory::MemoryPlan;
use gputel_tests::{fake_nvml, fixture};
use parquet::file::reader::{FileReader, SerializedFileReader};
use tokio::net::TcpListener;

/// Bound on the whole run; it takes about a second.
const WAIT: Duration = Duration::from_secs(30);
const TICKS: u64 = 3;

/// Rows in the Parquet files under `<store>/<table>/`.
fn stored_rows(store: &Path, table: &str) -> i64 {
    fn walk(dir: &Path, total: &mut i64) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                walk(&path, total);
            } else if path.extension().is_some_and(|e| e == "parquet") {
                let file = std::fs::File::open(&path).expect("open a Parquet file");
                let reader = SerializedFileReader::new(file).expect("a Parquet file");
                *total += reader.metadata().file_metadata().num_rows();
            }
        }
    }
    let mut total = 0;
    walk(&store.join(table), &mut total);
    total
}

/// InfiniBand ports in the fixture tree: one `ib` row each per tick.
fn fixture_ports() -> i64 {
    let devices = fixture("sys").join("class/infiniband");
    std::fs::read_dir(devices)
        .expect("fixture devices")
        .map(|d| {
            std::fs::read_dir(d.expect("device").path().join("ports"))
                .expect("ports")
                .count() as i64
        })
        .sum()
}

/// Runs the agent library for [`TICKS`] ticks, with `extra` flags, against
/// the collector library, and returns its summary once the collector has
/// written everything out under `store_dir`.
async fn run_agent_against_collector(store_dir: &Path, extra: &[&str]) -> gputel_agent::Summary {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = gputel_collector::store::open_store(
        store_dir.to_str().expect("utf-8 temp path"),
        &Default::default(),
    )
    .expect("open the store");
    let (wal, replayed) =
        gputel_collector::wal::Wal::open(&dir.path().join("wal")).expect("open the log");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let options = ServeOptions {
        // Only the shutdown flushes: the files then hold every row once.
        flush_interval: Duration::from_secs(3600),
        flush_rows: usize::MAX,
        max_message_bytes: gputel_proto::DEFAULT_MAX_MESSAGE_BYTES,
        memory: MemoryPlan {
            max_unwritten_rows: usize::MAX,
            ..MemoryPlan::default()
        },
        max_agent_rows_per_s: u64::MAX / 16,
        tls: None,
        alert_sink: None,
        node_silence: Some(gputel_collector::silence::DEFAULT_SILENCE_AFTER),
    };
    let serving = gputel_collector::serve(listener, store, Clock::System, options, wal, replayed)
        .await
        .expect("serve");
    let collector = format!("http://{}", serving.local_addr());

    let fake = fake_nvml();
    let (procfs, sysfs) = (fixture("proc"), fixture("sys"));
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "gputel-agent".as_ref(),
        "--collector".as_ref(),
        collector.as_ref(),
        "--plaintext".as_ref(),
        "--node".as_ref(),
        "in-process-node".as_ref(),
        "--interval".as_ref(),
        "100ms".as_ref(),
        "--nvml-lib".as_ref(),
        fake.as_os_str(),
        "--procfs-root".as_ref(),
        procfs.as_os_str(),
        "--sysfs-root".as_ref(),
        sysfs.as_os_str(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    let cli = gputel_agent::config::Cli::parse_from(args);
    let config = gputel_agent::config::Config::load(&cli).expect("agent config");

    // With a tick count the agent stops by itself once it has delivered them.
    let summary = tokio::time::timeout(
        WAIT,
        gputel_agent::run(config, Some(TICKS), std::future::pending()),
    )
    .await
    .expect("the agent stops after its ticks")
    .expect("the agent runs");
    tokio::time::timeout(WAIT, serving.shutdown())
        .await
        .expect("the collector stops")
        .expect("the collector shuts down cleanly");
    assert_eq!(summary.ticks, TICKS);
    assert_eq!(summary.delivery.produced, TICKS);
    assert_eq!(summary.delivery.acknowledged, TICKS);
    assert!(summary.delivered_all(), "{}", summary.line());
    summary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_library_streams_every_tick_to_the_collector_library() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store_dir = dir.path().join("store");
    let summary = run_agent_against_collector(&store_dir, &[]).await;

    // The fake's built-in scenario: eight H100s.
    let gpus = 8;
    let rows = summary.delivery.acknowledged_rows;
    assert_eq!(rows.gpu, TICKS * gpus);
    assert_eq!(rows.node, TICKS);
    assert_eq!(rows.ib as i64, TICKS as i64 * fixture_ports());

    assert_eq!(stored_rows(&store_dir, "gpu"), (TICKS * gpus) as i64);
    assert_eq!(stored_rows(&store_dir, "node"), TICKS as i64);
    assert_eq!(
        stored_rows(&store_dir, "ib"),
        TICKS as i64 * fixture_ports()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_configured_sources_reach_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gpu_only = dir.path().join("gpu-only");
    let rows = run_agent_against_collector(&gpu_only, &["--sources", "gpu"])
        .await
        .delivery
        .acknowledged_rows;
    assert_eq!((rows.gpu, rows.node, rows.ib), (TICKS * 8, 0, 0));
    assert_eq!(stored_rows(&gpu_only, "gpu"), (TICKS * 8) as i64);
    assert_eq!(stored_rows(&gpu_only, "node"), 0);
    assert_eq!(stored_rows(&gpu_only, "ib"), 0);

    let host_only = dir.path().join("host-only");
    let rows = run_agent_against_collector(&host_only, &["--sources", "node,ib"])
        .await
        .delivery
        .acknowledged_rows;
    assert_eq!(
        (rows.gpu, rows.node, rows.ib as i64),
        (0, TICKS, TICKS as i64 * fixture_ports())
    );
    assert_eq!(stored_rows(&host_only, "gpu"), 0);
    assert_eq!(stored_rows(&host_only, "node"), TICKS as i64);
}
