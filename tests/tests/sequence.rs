//! Two agents with one agent id (a node image cloned with its spool): the
//! second numbers its batches from 1 again. The collector rejects a number it
//! already stored with other content, and the agent logs the reason and drops
//! the batch; what was stored first stays, once.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gputel_agent::client::{self, Delivery, Earlier, Identity, TableRows};
use gputel_agent::collectors::Collectors;
use gputel_collector::ServeOptions;
use gputel_collector::clock::Clock;
use gputel_collector::memory::MemoryPlan;
use gputel_proto::{Batch, NodeSample};
use tokio::net::TcpListener;

const WAIT: Duration = Duration::from_secs(30);

/// Log lines, as the fmt layer writes them.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Batch `seq` with one node row (a minute ago plus `seq` seconds, by the
/// start of the process) whose CPU count tells its sender.
fn batch(seq: u64, cpu_count: u32) -> Batch {
    static START_US: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    let start = *START_US.get_or_init(gputel_agent::clock::now_us);
    Batch {
        seq,
        node: vec![NodeSample {
            ts_us: start - 60_000_000 + seq as i64 * 1_000_000,
            cpu_count,
            ..NodeSample::default()
        }],
        ..Batch::default()
    }
}

/// Runs the agent's client with `batches`, until each is acknowledged or rejected.
async fn deliver(collector: &str, batches: Vec<Batch>) -> Delivery {
    let identity = Identity {
        node: "gpu-node-060".into(),
        agent_id: "cloned-agent".into(),
        boot_id: String::new(),
    };
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    for batch in batches {
        tx.send(batch).await.expect("client takes batches");
    }
    drop(tx);
    tokio::time::timeout(
        WAIT,
        client::run(
            Collectors::new(&[collector.to_owned()], None, "n").expect("a collector URL"),
            identity,
            rx,
            16,
            Duration::from_secs(10),
        ),
    )
    .await
    .expect("the client delivers and stops")
}

#[tokio::test]
async fn a_resent_number_with_other_content_is_rejected_and_the_agent_logs_why() {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // The test's runtime has one thread: collector and agent log through it.
    let _guard = tracing::subscriber::set_default(subscriber);

    let dir = tempfile::tempdir().expect("tempdir");
    let store = gputel_collector::store::open_store(
        dir.path().join("store").to_str().expect("utf-8 temp path"),
        &Default::default(),
    )
    .expect("open the store");
    let (wal, replayed) =
        gputel_collector::wal::Wal::open(&dir.path().join("wal")).expect("open the log");
    let options = ServeOptions {
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
        node_silence: None,
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let serving = gputel_collector::serve(listener, store, Clock::System, options, wal, replayed)
        .await
        .expect("serve");
    let endpoint = format!("http://{}", serving.local_addr());

    // The first agent: 1 to 3, acknowledged.
    let first = deliver(&endpoint, (1..=3).map(|seq| batch(seq, 8)).collect()).await;
    assert_eq!(first.acknowledged, 3);
    assert_eq!(first.rejected, 0);

    // The clone numbers from 1 again, with its own readings; the collector
    // has 1 to 3 already (its welcome says 3), so 2 can only be a conflict.
    let clone = deliver(&endpoint, vec![batch(2, 16)]).await;
    assert_eq!(
        clone,
        Delivery {
            produced: 1,
            acknowledged: 0,
            rejected: 1,
            dropped: 0,
            unacknowledged: 0,
            acknowledged_rows: TableRows::default(),
            earlier: Earlier::default(),
        }
    );
    // The same batch again is a duplicate: acknowledged, not stored again.
    let resent = deliver(&endpoint, vec![batch(2, 8)]).await;
    assert_eq!(resent.acknowledged, 1);
    assert_eq!(resent.rejected, 0);
    assert_eq!(
        serving
            .shared()
            .stats
            .duplicates
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(serving.shared().buffered_rows(), 3);
    tokio::time::timeout(WAIT, serving.shutdown())
        .await
        .expect("the collector stops")
        .expect("the collector shuts down cleanly");

    let log = String::from_utf8(log.0.lock().expect("log lock").clone()).expect("utf-8 log");
    let rejected: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("gputel_agent::client: collector rejected a batch"))
        .collect();
    assert_eq!(rejected.len(), 1, "{log}");
    assert!(
        rejected[0].contains(
            "seq=2 reason=sequence number 2 was received before with different content; \
             the first is kept (this agent id has 3 stored)"
        ),
        "{}",
        rejected[0]
    );
}
