//! The agent stream, end to end in one process: a real tonic client against
//! the collector's service on 127.0.0.1, writing Parquet into a temp dir.
//! Covers the handshake, cumulative acks after durability, deduplication
//! across reconnects, rejects, refused streams, message size limits and the
//! flush-then-close shutdown.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, TimestampMicrosecondType};
use gputel_collector::ServeOptions;
use gputel_collector::Serving;
use gputel_collector::clock::Clock;
use gputel_collector::memory::MemoryPlan;
use gputel_collector::write::WritePath;
use gputel_proto::v1::telemetry_client::TelemetryClient;
use gputel_proto::v1::{Ack, Reject, Welcome};
use gputel_proto::{
    AgentMessage, Batch, CollectorMessage, GpuSample, Hello, NodeSample, agent_message,
    collector_message,
};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use prost::Message;
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};

/// Bound on every wait in these tests.
const WAIT: Duration = Duration::from_secs(10);
/// The collector's (manual) clock: 2026-11-21T06:30:00Z.
const NOW: i64 = 1_795_242_600_000_000;
/// 1990-01-01T00:00:00Z: a node whose RTC battery died.
const Y1990: i64 = 631_152_000_000_000;
/// Long enough that the timer never fires during a test: flushes happen only
/// when the buffer reaches `flush_rows`, or at shutdown.
const NEVER: Duration = Duration::from_secs(3600);

async fn within<F: Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("timed out after {WAIT:?}: {what}"))
}

/// Polls a condition on shared state (no signal exists for "batch appended").
async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    within(what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// A collector serving on a listener bound before serving, with a manual clock.
struct Collector {
    serving: Serving,
    dir: TempDir,
    shared: Arc<WritePath>,
    /// The collector's clock, microseconds since the epoch.
    now: Arc<AtomicI64>,
}

impl Collector {
    async fn start(flush_rows: usize, max_message_bytes: usize) -> Self {
        Self::start_with(flush_rows, max_message_bytes, usize::MAX, u64::MAX / 16).await
    }

    async fn start_with(
        flush_rows: usize,
        max_message_bytes: usize,
        max_unwritten_rows: usize,
        max_agent_rows_per_s: u64,
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::start_in(
            dir,
            flush_rows,
            max_message_bytes,
            max_unwritten_rows,
            max_agent_rows_per_s,
        )
        .await
    }

    /// Shuts down (writing everything) and starts again on the same store
    /// and log, as after a restart.
    async fn restart(self) -> Self {
        let dir = self.shutdown().await;
        Self::start_in(
            dir,
            3,
            gputel_proto::DEFAULT_MAX_MESSAGE_BYTES,
            usize::MAX,
            u64::MAX / 16,
        )
        .await
    }

    async fn start_in(
        dir: TempDir,
        flush_rows: usize,
        max_message_bytes: usize,
        max_unwritten_rows: usize,
        max_agent_rows_per_s: u64,
    ) -> Self {
        let store = gputel_collector::store::open_store(
            dir.path().to_str().expect("utf-8 temp path"),
            &Default::default(),
        )
        .expect("open store");
        let now = Arc::new(AtomicI64::new(NOW));
        let clock = Clock::Manual(Arc::clone(&now));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let options = ServeOptions {
            flush_interval: NEVER,
            flush_rows,
            max_message_bytes,
            memory: MemoryPlan {
                max_unwritten_rows,
                ..MemoryPlan::default()
            },
            max_agent_rows_per_s,
            tls: None,
            alert_sink: None,
            node_silence: None,
        };
        let (wal, replayed) =
            gputel_collector::wal::Wal::open(&dir.path().join("wal")).expect("open log");
        let serving = gputel_collector::serve(listener, store, clock, options, wal, replayed)
            .await
            .expect("serve");
        let shared = Arc::clone(serving.shared());
        Self {
            serving,
            dir,
            shared,
            now,
        }
    }

    async fn channel(&self) -> Channel {
        let endpoint = Endpoint::from_shared(format!("http://{}", self.serving.local_addr()))
            .expect("endpoint");
        within("connect", endpoint.connect())
            .await
            .expect("connect")
    }

    fn store(&self) -> &Path {
        self.dir.path()
    }

    /// Waits for the GPU rows in the store to become `want`: acks come from
    /// the log, the Parquet files a moment later.
    async fn expect_stored(&self, want: Vec<(String, String, i32, i64)>) {
        let store = self.store().to_owned();
        let mut last = Vec::new();
        let found = tokio::time::timeout(WAIT, async {
            loop {
                last = stored_gpu_rows(&store);
                if last == want {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(found.is_ok(), "stored rows {last:?}, want {want:?}");
    }

    /// Step one of shutdown: the last flush and its acks; streams stay open.
    async fn stop_flushing(&mut self) {
        within("last flush", self.serving.finish_writing()).await;
    }

    /// Step two: close the streams and stop the server.
    async fn stop_serving(self) -> TempDir {
        within("server stops", self.serving.shutdown())
            .await
            .expect("server result");
        self.dir
    }

    async fn shutdown(mut self) -> TempDir {
        self.stop_flushing().await;
        self.stop_serving().await
    }
}

/// One agent stream: what it sends and what it receives.
struct Agent {
    tx: mpsc::Sender<AgentMessage>,
    rx: Streaming<CollectorMessage>,
}

impl Agent {
    async fn open(channel: Channel) -> Self {
        let (tx, rx) = mpsc::channel(16);
        let mut client = TelemetryClient::new(channel);
        let response = within("stream opens", client.stream(ReceiverStream::new(rx)))
            .await
            .expect("stream opens");
        Self {
            tx,
            rx: response.into_inner(),
        }
    }

    /// Opens a stream and completes the handshake; returns the welcome.
    async fn connect(channel: Channel, node: &str, agent_id: &str) -> (Self, Welcome) {
        let mut agent = Self::open(channel).await;
        agent.send(hello(node, agent_id)).await;
        let welcome = match agent.next().await {
            Ok(Some(collector_message::Kind::Welcome(w))) => w,
            other => panic!("expected a welcome, got {other:?}"),
        };
        (agent, welcome)
    }

    async fn send(&self, message: AgentMessage) {
        within("send", self.tx.send(message))
            .await
            .expect("request stream open");
    }

    async fn send_batch(&self, batch: Batch) {
        self.send(AgentMessage {
            kind: Some(agent_message::Kind::Batch(batch)),
        })
        .await;
    }

    async fn next(&mut self) -> Result<Option<collector_message::Kind>, Status> {
        let message = within("next collector message", self.rx.message()).await?;
        Ok(message.map(|m| m.kind.expect("collector messages carry a kind")))
    }

    /// Acks are cumulative and sent as the log syncs, so several may come
    /// before the one that covers `seq`: each lower, in increasing order.
    async fn expect_ack(&mut self, seq: u64) {
        let mut last = 0;
        loop {
            match self.next().await {
                Ok(Some(collector_message::Kind::Ack(ack))) if ack.seq < seq => {
                    assert!(ack.seq > last, "acks go backwards: {last} then {}", ack.seq);
                    last = ack.seq;
                }
                Ok(Some(collector_message::Kind::Ack(ack))) => {
                    assert_eq!(ack, Ack { seq });
                    return;
                }
                other => panic!("expected Ack {{ seq: {seq} }}, got {other:?}"),
            }
        }
    }

    async fn expect_reject(&mut self, seq: u64, reason: &str) {
        match self.next().await {
            Ok(Some(collector_message::Kind::Reject(reject))) => assert_eq!(
                reject,
                Reject {
                    seq,
                    reason: reason.to_owned()
                }
            ),
            other => panic!("expected Reject {{ seq: {seq} }}, got {other:?}"),
        }
    }

    async fn expect_status(&mut self, code: Code, message: &str) {
        match self.next().await {
            Err(status) => {
                assert_eq!(status.code(), code, "{status:?}");
                assert_eq!(status.message(), message, "{status:?}");
            }
            other => panic!("expected status {code:?} {message:?}, got {other:?}"),
        }
    }

    /// The collector ended the stream cleanly.
    async fn expect_end(&mut self) {
        match self.next().await {
            Ok(None) => {}
            other => panic!("expected the stream to end, got {other:?}"),
        }
    }

    /// Closes the request side, as an agent does when it goes away, and waits
    /// for the collector to end the stream.
    async fn close(self) {
        let Self { tx, mut rx } = self;
        drop(tx);
        match within("stream ends", rx.message()).await {
            Ok(None) => {}
            other => panic!("expected the stream to end, got {other:?}"),
        }
    }
}

fn hello(node: &str, agent_id: &str) -> AgentMessage {
    AgentMessage {
        kind: Some(agent_message::Kind::Hello(Hello {
            node: node.into(),
            agent_id: agent_id.into(),
            agent_version: "0.1.0".into(),
            boot_id: "6b0c3e63-3f0d-4d7e-9a8c-2c1f5f0e7d11".into(),
        })),
    }
}

/// Row `i` of batch `seq`: its uuid names both, so stored rows can be traced
/// back to the batch they came from.
fn gpu_row(seq: u64, i: u32) -> GpuSample {
    GpuSample {
        ts_us: ts_of(seq),
        gpu: i,
        uuid: format!("GPU-{seq}-{i}"),
        model: "NVIDIA H100 80GB HBM3".into(),
        temperature_c: Some(40 + i),
        ..Default::default()
    }
}

fn ts_of(seq: u64) -> i64 {
    NOW - 600_000_000 + i64::try_from(seq).expect("small seq") * 1_000_000
}

fn gpu_batch(seq: u64, rows: u32) -> Batch {
    Batch {
        seq,
        gpu: (0..rows).map(|i| gpu_row(seq, i)).collect(),
        ..Default::default()
    }
}

/// Every `.parquet` file of `table` in the store. A write in progress shows
/// as a staging file (`<name>.parquet#<n>`, renamed when complete): readers
/// never see it under a `.parquet` name, and neither does this.
fn parquet_files(store: &Path, table: &str) -> Vec<std::path::PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&store.join(table), &mut out);
    out.retain(|p| !p.to_string_lossy().contains(".parquet#"));
    for path in &out {
        assert_eq!(
            path.extension().and_then(|e| e.to_str()),
            Some("parquet"),
            "stray file {}",
            path.display()
        );
    }
    out.sort();
    out
}

/// Stored GPU rows as (node, uuid, gpu, ts), sorted: which rows landed, each once.
fn stored_gpu_rows(store: &Path) -> Vec<(String, String, i32, i64)> {
    let mut rows = Vec::new();
    for path in parquet_files(store, "gpu") {
        let file = std::fs::File::open(&path).expect("open");
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .expect("parquet footer")
            .build()
            .expect("reader");
        for batch in reader {
            let batch = batch.expect("decode");
            let dict = |name: &str| -> Vec<String> {
                let d = batch
                    .column_by_name(name)
                    .expect(name)
                    .as_dictionary::<Int32Type>();
                let values = d.values().as_string::<i32>();
                d.keys()
                    .values()
                    .iter()
                    .map(|k| values.value(usize::try_from(*k).expect("key")).to_owned())
                    .collect()
            };
            let nodes = dict("node");
            let uuids = dict("uuid");
            let gpus = batch
                .column_by_name("gpu")
                .expect("gpu")
                .as_primitive::<Int32Type>();
            let ts = batch
                .column_by_name("ts")
                .expect("ts")
                .as_primitive::<TimestampMicrosecondType>();
            for i in 0..batch.num_rows() {
                rows.push((
                    nodes[i].clone(),
                    uuids[i].clone(),
                    gpus.value(i),
                    ts.value(i),
                ));
            }
        }
    }
    rows.sort();
    rows
}

/// The rows `gpu_batch(seq, n)` from `node` should store.
fn expected_rows(node: &str, batches: &[(u64, u32)]) -> Vec<(String, String, i32, i64)> {
    let mut rows: Vec<_> = batches
        .iter()
        .flat_map(|&(seq, n)| {
            (0..n).map(move |i| {
                (
                    node.to_owned(),
                    format!("GPU-{seq}-{i}"),
                    i32::try_from(i).expect("small"),
                    ts_of(seq),
                )
            })
        })
        .collect();
    rows.sort();
    rows
}

fn welcome(durable_seq: u64) -> Welcome {
    Welcome {
        durable_seq,
        collector_version: env!("CARGO_PKG_VERSION").to_owned(),
    }
}

#[tokio::test]
async fn welcome_then_one_cumulative_ack_once_the_rows_are_in_parquet() {
    // Three one-row batches fill the buffer: the flush follows the third.
    let collector = Collector::start(3, gputel_proto::DEFAULT_MAX_MESSAGE_BYTES).await;
    let (mut agent, hello) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    assert_eq!(hello, welcome(0));

    for seq in 1..=3 {
        agent.send_batch(gpu_batch(seq, 1)).await;
    }
    // Acks are cumulative and sent only after the write: exactly one, for 3.
    agent.expect_ack(3).await;
    collector
        .expect_stored(expected_rows("node-a", &[(1, 1), (2, 1), (3, 1)]))
        .await;
    assert_eq!(parquet_files(collector.store(), "gpu").len(), 1);
    assert_eq!(collector.shared.buffered_rows(), 0);

    agent.close().await;
    collector.shutdown().await;
}

#[tokio::test]
async fn while_a_compaction_round_runs_the_buffer_is_flushed_at_half_its_rows() {
    let collector = Collector::start(4, gputel_proto::DEFAULT_MAX_MESSAGE_BYTES).await;
    let (mut agent, _) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    let round = collector.shared.compacting();
    // Two one-row batches are half of 4: the flush follows the second.
    for seq in 1..=2 {
        agent.send_batch(gpu_batch(seq, 1)).await;
    }
    agent.expect_ack(2).await;
    collector
        .expect_stored(expected_rows("node-a", &[(1, 1), (2, 1)]))
        .await;
    assert_eq!(parquet_files(collector.store(), "gpu").len(), 1);

    // Once the round is over the buffer takes its 4 rows again.
    drop(round);
    for seq in 3..=5 {
        agent.send_batch(gpu_batch(seq, 1)).await;
    }
    agent.expect_ack(5).await;
    assert_eq!(collector.shared.buffered_rows(), 3);
    assert_eq!(parquet_files(collector.store(), "gpu").len(), 1);
    agent.send_batch(gpu_batch(6, 1)).await;
    agent.expect_ack(6).await;
    collector
        .expect_stored(expected_rows(
            "node-a",
            &[(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1)],
        ))
        .await;
    assert_eq!(parquet_files(collector.store(), "gpu").len(), 2);

    agent.close().await;
    collector.shutdown().await;
}

#[tokio::test]
async fn after_a_reconnect_the_welcome_carries_the_durable_seq_and_resends_are_dropped() {
    let collector = Collector::start(3, gputel_proto::DEFAULT_MAX_MESSAGE_BYTES).await;
    let (mut first, hello) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    assert_eq!(hello, welcome(0));
    for seq in 1..=3 {
        first.send_batch(gpu_batch(seq, 1)).await;
    }
    first.expect_ack(3).await;
    first.close().await;

    // A new connection, as after a network outage.
    let (mut second, hello) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    assert_eq!(hello, welcome(3));
    // An agent that missed the ack resends; each duplicate of a durable batch
    // is answered with the durable seq and stored nowhere.
    second.send_batch(gpu_batch(2, 1)).await;
    second.expect_ack(3).await;
    second.send_batch(gpu_batch(3, 1)).await;
    second.expect_ack(3).await;
    assert_eq!(collector.shared.buffered_rows(), 0);
    assert_eq!(collector.shared.stats.duplicates.load(Ordering::Relaxed), 2);
    collector
        .expect_stored(expected_rows("node-a", &[(1, 1), (2, 1), (3, 1)]))
        .await;

    // The stream carries on with new batches; the ack comes from the log,
    // the Parquet file right after.
    second.send_batch(gpu_batch(4, 3)).await;
    second.expect_ack(4).await;
    collector
        .expect_stored(expected_rows("node-a", &[(1, 1), (2, 1), (3, 1), (4, 3)]))
        .await;

    second.close().await;
    collector.shutdown().await;
}

#[tokio::test]
async fn batches_durable_in_the_log_are_not_stored_twice_after_a_reconnect() {
    let collector = Collector::start(4, gputel_proto::DEFAULT_MAX_MESSAGE_BYTES).await;
    let (mut first, _) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    for seq in 1..=3 {
        first.send_batch(gpu_batch(seq, 1)).await;
    }
    // Durable in the log (acknowledged) but buffered, not yet in Parquet.
    first.expect_ack(3).await;
    assert_eq!(collector.shared.buffered_rows(), 3);
    assert!(stored_gpu_rows(collector.store()).is_empty());
    first.close().await;

    // An agent that lost the acks on the way resends everything.
    let (mut second, hello) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    assert_eq!(hello, welcome(3));
    for seq in 1..=3 {
        second.send_batch(gpu_batch(seq, 1)).await;
        second.expect_ack(3).await;
    }
    // A new batch fills the buffer, and everything is written once.
    second.send_batch(gpu_batch(4, 1)).await;
    second.expect_ack(4).await;
    assert_eq!(collector.shared.stats.duplicates.load(Ordering::Relaxed), 3);
    collector
        .expect_stored(expected_rows("node-a", &[(1, 1), (2, 1), (3, 1), (4, 1)]))
        .await;

    second.close().await;
    collector.shutdown().await;
}

#[tokio::test]
async fn an_invalid_batch_is_rejected_with_its_reason_and_the_stream_carries_on() {
    let collector = Collector::start(2, gputel_proto::DEFAULT_MAX_MESSAGE_BYTES).await;
    let (mut agent, _) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;

    let mut dead_rtc = gpu_batch(1, 1);
    dead_rtc.gpu[0].ts_us = Y1990;
    agent.send_batch(dead_rtc).await;
    agent
        .expect_reject(
            1,
            "gpu row 0: timestamp 631152000000000 µs is outside the accepted window \
             (2000-01-01 to one day after the collector's clock); check the node's clock",
        )
        .await;

    // One bad value refuses the whole batch, its valid GPU row included.
    let mut nan_load = gpu_batch(2, 1);
    nan_load.node = vec![NodeSample {
        ts_us: ts_of(2),
        cpu_count: 64,
        load1: Some(f32::NAN),
        ..Default::default()
    }];
    agent.send_batch(nan_load).await;
    agent
        .expect_reject(2, "node row 0: load1 is not a finite number")
        .await;

    agent.send_batch(gpu_batch(3, 2)).await;
    agent.expect_ack(3).await;
    collector
        .expect_stored(expected_rows("node-a", &[(3, 2)]))
        .await;
    assert_eq!(
        parquet_files(collector.store(), "node"),
        Vec::<std::path::PathBuf>::new()
    );
    assert_eq!(collector.shared.stats.rejected.load(Ordering::Relaxed), 2);

    agent.close().await;
    collector.shutdown().await;
}

#[tokio::test]
async fn a_stream_that_does_not_open_with_a_hello_fails_precondition() {
    let collector = Collector::start(1, gputel_proto::DEFAULT_MAX_MESSAGE_BYTES).await;
    let mut agent = Agent::open(collector.channel().await).await;
    agent.send_batch(gpu_batch(1, 1)).await;
    agent
        .expect_status(
            Code::FailedPrecondition,
            "the first message on a stream must be a hello",
        )
        .await;
    assert_eq!(collector.shared.buffered_rows(), 0);
    assert_eq!(stored_gpu_rows(collector.store()), Vec::new());
    collector.shutdown().await;
}

#[tokio::test]
async fn a_hello_with_a_path_as_node_name_is_an_invalid_argument() {
    let collector = Collector::start(1, gputel_proto::DEFAULT_MAX_MESSAGE_BYTES).await;
    let mut agent = Agent::open(collector.channel().await).await;
    agent.send(hello("../etc", "agent-a")).await;
    agent
        .expect_status(
            Code::InvalidArgument,
            "node name \"../etc\" is invalid: use 1 to 253 characters of [A-Za-z0-9._-]",
        )
        .await;

    // A second hello on a fresh stream that names a bad agent id.
    let mut agent = Agent::open(collector.channel().await).await;
    agent.send(hello("node-a", "a/b")).await;
    agent
        .expect_status(
            Code::InvalidArgument,
            "agent id \"a/b\" is invalid: use 1 to 128 characters of [A-Za-z0-9._-]",
        )
        .await;
    collector.shutdown().await;
}

const SIZE_LIMIT: usize = 64 * 1024;

/// A batch one byte-ish over `SIZE_LIMIT` once encoded, and its encoded length.
fn oversized_batch() -> (AgentMessage, usize) {
    let mut batch = gpu_batch(1, 1);
    batch.gpu[0].model = "x".repeat(SIZE_LIMIT);
    let message = AgentMessage {
        kind: Some(agent_message::Kind::Batch(batch)),
    };
    let len = message.encoded_len();
    assert!(len > SIZE_LIMIT);
    (message, len)
}

#[tokio::test]
async fn an_oversized_message_ends_its_own_stream_and_no_other() {
    let collector = Collector::start(1, SIZE_LIMIT).await;
    let (mut bystander, hello_b) =
        Agent::connect(collector.channel().await, "node-b", "agent-b").await;
    assert_eq!(hello_b, welcome(0));

    let channel_a = collector.channel().await;
    let (mut big, _) = Agent::connect(channel_a.clone(), "node-a", "agent-a").await;
    big.send(oversized_batch().0).await;
    // The stream ends (how it ends is the next test's business) and nothing
    // of the oversized batch is kept.
    match big.next().await {
        Ok(None) | Err(_) => {}
        Ok(Some(kind)) => panic!("expected the oversized stream to end, got {kind:?}"),
    }
    assert_eq!(collector.shared.buffered_rows(), 0);

    // The other agent's stream, on its own connection, is untouched.
    bystander.send_batch(gpu_batch(1, 1)).await;
    bystander.expect_ack(1).await;
    // So is the failed agent's connection: a new stream on it works, and the
    // refused seq 1 was never counted as received.
    let (mut again, hello_a) = Agent::connect(channel_a, "node-a", "agent-a").await;
    assert_eq!(hello_a, welcome(0));
    again.send_batch(gpu_batch(1, 1)).await;
    again.expect_ack(1).await;

    let mut want = expected_rows("node-b", &[(1, 1)]);
    want.extend(expected_rows("node-a", &[(1, 1)]));
    want.sort();
    collector.expect_stored(want).await;

    bystander.close().await;
    again.close().await;
    collector.shutdown().await;
}

/// A message the collector cannot decode (here one over
/// `max_decoding_message_size`) ends the stream with the decoder's status, so
/// the agent learns why instead of seeing a clean end of stream.
#[tokio::test]
async fn an_oversized_message_is_answered_with_out_of_range() {
    let collector = Collector::start(1, SIZE_LIMIT).await;
    let (mut big, _) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    let (message, len) = oversized_batch();
    big.send(message).await;
    match big.next().await {
        Err(status) => {
            assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
            assert_eq!(
                status.message(),
                format!(
                    "Error, decoded message length too large: found {len} bytes, the limit is: {SIZE_LIMIT} bytes"
                ),
            );
        }
        other => panic!(
            "the decode error for a {len}-byte message (limit {SIZE_LIMIT}) must reach \
             the agent as OUT_OF_RANGE, got {other:?}"
        ),
    }
    collector.shutdown().await;
}

#[tokio::test]
async fn shutdown_writes_and_acks_buffered_rows_before_closing_streams() {
    let mut collector = Collector::start(1_000_000, gputel_proto::DEFAULT_MAX_MESSAGE_BYTES).await;
    let (mut agent, _) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    agent.send_batch(gpu_batch(1, 1)).await;
    agent.send_batch(gpu_batch(2, 2)).await;
    let shared = Arc::clone(&collector.shared);
    wait_until("3 rows buffered", || shared.buffered_rows() == 3).await;
    // Below the flush threshold and long before the timer: nothing written yet.
    assert_eq!(stored_gpu_rows(collector.store()), Vec::new());

    collector.stop_flushing().await;
    collector
        .expect_stored(expected_rows("node-a", &[(1, 1), (2, 2)]))
        .await;
    let dir = collector.stop_serving().await;
    // The ack was queued before the stream closed, and the close is clean.
    agent.expect_ack(2).await;
    agent.expect_end().await;
    assert_eq!(
        stored_gpu_rows(dir.path()),
        expected_rows("node-a", &[(1, 1), (2, 2)])
    );
}

/// A store that cannot keep up must not grow memory without bound: past
/// `max_unwritten_rows` batches are refused, the agent keeps them and retries,
/// and once the rows are written the same batch is taken in.
#[tokio::test]
async fn batches_are_refused_while_too_many_rows_wait_for_the_store() {
    let mut collector =
        Collector::start_with(1_000_000, gputel_proto::DEFAULT_MAX_MESSAGE_BYTES, 2, 1_000).await;
    let (mut agent, _) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    agent.send_batch(gpu_batch(1, 1)).await;
    agent.expect_ack(1).await;
    agent.send_batch(gpu_batch(2, 1)).await;
    agent.expect_ack(2).await;
    agent.send_batch(gpu_batch(3, 1)).await;
    agent
        .expect_status(
            Code::ResourceExhausted,
            "the collector holds 2 rows not yet written to the store; retry later",
        )
        .await;
    // The refusal also asks for a flush: the rows held are written...
    collector
        .expect_stored(expected_rows("node-a", &[(1, 1), (2, 1)]))
        .await;
    // ...and the agent's retry of the refused batch is taken in.
    let (mut again, hello) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    assert_eq!(hello, welcome(2));
    again.send_batch(gpu_batch(3, 1)).await;
    again.expect_ack(3).await;
    collector.stop_flushing().await;
    collector
        .expect_stored(expected_rows("node-a", &[(1, 1), (2, 1), (3, 1)]))
        .await;
    collector.stop_serving().await;
}

/// Agent ids quiet for more than a week are forgotten, so a collector that
/// sees a new id at every agent start does not grow without bound.
#[tokio::test]
async fn agent_ids_quiet_for_a_week_are_forgotten() {
    let mut collector = Collector::start(1, gputel_proto::DEFAULT_MAX_MESSAGE_BYTES).await;
    let (mut agent, _) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    agent.send_batch(gpu_batch(1, 1)).await;
    agent.expect_ack(1).await;
    agent.close().await;
    let (again, hello) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    assert_eq!(hello, welcome(1));
    again.close().await;
    let shared = Arc::clone(&collector.shared);
    wait_until("the session is gone", || !shared.has_session("agent-a")).await;

    collector
        .now
        .fetch_add(8 * 24 * 3600 * 1_000_000, Ordering::SeqCst);
    // The next flush forgets it.
    collector.stop_flushing().await;
    let (_, hello) = Agent::connect(collector.channel().await, "node-a", "agent-b").await;
    assert_eq!(hello, welcome(0));
    let (_, hello) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    assert_eq!(hello, welcome(0));
    collector.stop_serving().await;
}

/// An agent over its rate is refused (it keeps the batch and retries); its
/// allowance refills with time, and other agents are not affected.
#[tokio::test]
async fn an_agent_over_its_rate_is_refused_until_its_allowance_refills() {
    // 1 row/s, 10 s of burst: 10 rows at once.
    let collector = Collector::start_with(
        1_000_000,
        gputel_proto::DEFAULT_MAX_MESSAGE_BYTES,
        usize::MAX,
        1,
    )
    .await;
    let (mut agent, _) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    agent.send_batch(gpu_batch(1, 10)).await;
    agent.expect_ack(1).await;
    agent.send_batch(gpu_batch(2, 1)).await;
    agent
        .expect_status(
            Code::ResourceExhausted,
            "agent agent-a sends more than 1 rows/s; retry later",
        )
        .await;
    // Another agent has its own allowance.
    let (mut other, _) = Agent::connect(collector.channel().await, "node-b", "agent-b").await;
    other.send_batch(gpu_batch(1, 3)).await;
    other.expect_ack(1).await;
    // Three seconds later agent-a may send three rows again.
    collector.now.fetch_add(3_000_000, Ordering::SeqCst);
    let (mut again, hello) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    assert_eq!(hello, welcome(1));
    again.send_batch(gpu_batch(2, 3)).await;
    again.expect_ack(2).await;
    collector.shutdown().await;
}

/// Batch `seq` with the rows of `gpu_batch(1, 1)`: for sequence numbers too
/// large to make timestamps from.
fn batch_numbered(seq: u64) -> Batch {
    Batch {
        seq,
        ..gpu_batch(1, 1)
    }
}

/// The attack: node A opens a stream with node B's agent id (and would send
/// a huge sequence number). It is refused with both nodes named; B's stream
/// stays attached, gets its own acks, and every one of its rows is stored.
#[tokio::test]
async fn a_hello_with_another_nodes_agent_id_is_refused_and_that_node_is_untouched() {
    let collector = Collector::start(3, gputel_proto::DEFAULT_MAX_MESSAGE_BYTES).await;
    let (mut b, hello_b) = Agent::connect(collector.channel().await, "node-b", "agent-b").await;
    assert_eq!(hello_b, welcome(0));
    b.send_batch(gpu_batch(1, 1)).await;
    b.expect_ack(1).await;

    let mut a = Agent::open(collector.channel().await).await;
    a.send(hello("node-a", "agent-b")).await;
    a.expect_status(
        Code::PermissionDenied,
        "agent id agent-b belongs to node node-b; node node-a may not use it \
         (each agent needs its own agent id: a copied --spool-dir copies agent.id)",
    )
    .await;
    // The same name in another case and with the root's dot is node-b itself.
    let (c, hello_c) = Agent::connect(collector.channel().await, "NODE-B.", "agent-b").await;
    assert_eq!(hello_c, welcome(1));
    c.close().await;
    let shared = Arc::clone(&collector.shared);
    wait_until("node-b's second stream is gone", || {
        !shared.has_session("agent-b")
    })
    .await;

    let (mut b, hello_b) = Agent::connect(collector.channel().await, "node-b", "agent-b").await;
    assert_eq!(hello_b, welcome(1));
    b.send_batch(gpu_batch(2, 1)).await;
    b.expect_ack(2).await;
    let mut a = Agent::open(collector.channel().await).await;
    a.send(hello("node-a", "agent-b")).await;
    a.expect_status(
        Code::PermissionDenied,
        "agent id agent-b belongs to node node-b; node node-a may not use it \
         (each agent needs its own agent id: a copied --spool-dir copies agent.id)",
    )
    .await;
    // B's acks still come to B.
    b.send_batch(gpu_batch(3, 1)).await;
    b.expect_ack(3).await;
    collector
        .expect_stored(expected_rows("node-b", &[(1, 1), (2, 1), (3, 1)]))
        .await;
    b.close().await;
    collector.shutdown().await;
}

/// Which node owns an agent id outlives a restart (it is in the log's state
/// file), and rows from a node named in another case are stored under the
/// canonical name.
#[tokio::test]
async fn the_owner_of_an_agent_id_outlives_a_restart() {
    let collector = Collector::start(3, gputel_proto::DEFAULT_MAX_MESSAGE_BYTES).await;
    let (mut b, _) = Agent::connect(collector.channel().await, "Node-B.", "agent-b").await;
    b.send_batch(gpu_batch(1, 1)).await;
    b.expect_ack(1).await;
    b.close().await;
    let collector = collector.restart().await;

    let mut a = Agent::open(collector.channel().await).await;
    a.send(hello("node-a", "agent-b")).await;
    a.expect_status(
        Code::PermissionDenied,
        "agent id agent-b belongs to node node-b; node node-a may not use it \
         (each agent needs its own agent id: a copied --spool-dir copies agent.id)",
    )
    .await;
    let (mut b, hello_b) = Agent::connect(collector.channel().await, "node-b", "agent-b").await;
    assert_eq!(hello_b, welcome(1));
    b.send_batch(gpu_batch(2, 1)).await;
    b.expect_ack(2).await;
    b.close().await;
    let collector = collector.restart().await;
    assert_eq!(
        stored_gpu_rows(collector.store()),
        expected_rows("node-b", &[(1, 1), (2, 1)])
    );
    collector.shutdown().await;
}

/// u64::MAX and jumps past `MAX_SEQ_AHEAD` are rejected with the reason; the
/// agent id keeps its place and carries on.
#[tokio::test]
async fn impossible_sequence_numbers_are_rejected_and_the_agent_id_keeps_working() {
    use gputel_collector::write::MAX_SEQ_AHEAD;
    let collector = Collector::start(3, gputel_proto::DEFAULT_MAX_MESSAGE_BYTES).await;
    let (mut agent, _) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    agent.send_batch(batch_numbered(u64::MAX)).await;
    agent
        .expect_reject(
            u64::MAX,
            "sequence number 18446744073709551615 is the largest there is: no batch could \
             follow it; refused, the agent id keeps its place at 0",
        )
        .await;
    agent.send_batch(batch_numbered(1 << 62)).await;
    agent
        .expect_reject(
            1 << 62,
            "sequence number 4611686018427387904 is more than 4294967296 past the highest \
             received from this agent id (0): more batches than an agent makes in a year; \
             refused, the agent id keeps its place",
        )
        .await;
    agent.send_batch(gpu_batch(1, 1)).await;
    agent.expect_ack(1).await;
    agent.send_batch(batch_numbered(2 + MAX_SEQ_AHEAD)).await;
    agent
        .expect_reject(
            2 + MAX_SEQ_AHEAD,
            "sequence number 4294967298 is more than 4294967296 past the highest received \
             from this agent id (1): more batches than an agent makes in a year; refused, \
             the agent id keeps its place",
        )
        .await;
    agent.send_batch(gpu_batch(2, 1)).await;
    agent.expect_ack(2).await;
    agent.close().await;
    let (again, hello) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    assert_eq!(hello, welcome(2));
    again.close().await;
    // The bound itself is allowed: a gap of dropped batches.
    let (mut again, _) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    again
        .send_batch(batch_numbered(2 + MAX_SEQ_AHEAD - 1))
        .await;
    again.expect_ack(2 + MAX_SEQ_AHEAD - 1).await;
    assert_eq!(collector.shared.stats.rejected.load(Ordering::Relaxed), 3);
    again.close().await;
    collector.shutdown().await;
}

/// A sequence number resent with other content is rejected (the first is
/// kept); resent with the same content it is a duplicate, acknowledged.
#[tokio::test]
async fn a_resend_with_different_content_is_rejected_and_the_first_is_kept() {
    let collector = Collector::start(3, gputel_proto::DEFAULT_MAX_MESSAGE_BYTES).await;
    let (mut agent, _) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    for seq in 1..=3 {
        agent.send_batch(gpu_batch(seq, 1)).await;
    }
    agent.expect_ack(3).await;
    agent.send_batch(gpu_batch(2, 2)).await;
    agent
        .expect_reject(
            2,
            "sequence number 2 was received before with different content; the first is \
             kept (this agent id has 3 stored): two agents use one agent id, or an agent's \
             spool was reset; give each agent its own --spool-dir",
        )
        .await;
    agent.send_batch(gpu_batch(2, 1)).await;
    agent.expect_ack(3).await;
    assert_eq!(collector.shared.stats.duplicates.load(Ordering::Relaxed), 1);
    collector
        .expect_stored(expected_rows("node-a", &[(1, 1), (2, 1), (3, 1)]))
        .await;
    agent.close().await;

    // After a restart the stored batches' content is no longer known: a
    // number already stored is refused rather than taken on trust.
    let collector = collector.restart().await;
    let (mut agent, hello) = Agent::connect(collector.channel().await, "node-a", "agent-a").await;
    assert_eq!(hello, welcome(3));
    agent.send_batch(gpu_batch(2, 1)).await;
    agent
        .expect_reject(
            2,
            "sequence number 2 is behind the highest received from this agent id (3) and \
             older than the last 128 batches whose content can be compared; refused, \
             nothing is stored again",
        )
        .await;
    agent.send_batch(gpu_batch(4, 1)).await;
    agent.expect_ack(4).await;
    agent.close().await;
    let collector = collector.restart().await;
    assert_eq!(
        stored_gpu_rows(collector.store()),
        expected_rows("node-a", &[(1, 1), (2, 1), (3, 1), (4, 1)])
    );
    collector.shutdown().await;
}
