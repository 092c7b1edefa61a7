//! The collector's memory stays within twice `--memory-budget` under
//! messages built to amplify it: a 16.6 MB message of 8.3 M empty GPU rows
//! (two bytes each on the wire, hundreds decoded), 1 M of them in 2 MB, and
//! many streams at once each sending messages just under what one message
//! may take. Peak RSS is the kernel's (`VmHWM` in `/proc/PID/status`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes, BytesMut};
use gputel_proto::v1::Hello;
use gputel_proto::{
    AgentMessage, Batch, CollectorMessage, GpuSample, agent_message, collector_message,
};
use gputel_tests::{duckdb_value, start_collector, table_scan};
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::{Codec, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Status, Streaming};

const BUDGET_MIB: u64 = 256;

/// Sends messages as given bytes (so that the test never decodes, nor
/// holds, what it sends), and decodes the collector's answers.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = CollectorMessage;
    type Encoder = RawEncoder;
    type Decoder = tonic_prost::ProstDecoder<CollectorMessage>;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::default()
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct RawEncoder;

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put(item);
        Ok(())
    }
}

struct Stream {
    tx: mpsc::Sender<Bytes>,
    rx: Streaming<CollectorMessage>,
}

impl Stream {
    async fn open(addr: &str, node: &str) -> Stream {
        let channel = Channel::from_shared(format!("http://{addr}"))
            .expect("address")
            .connect()
            .await
            .expect("connect");
        let mut grpc = tonic::client::Grpc::new(channel)
            .max_encoding_message_size(64 << 20)
            .max_decoding_message_size(64 << 20);
        grpc.ready().await.expect("ready");
        let (tx, rx) = mpsc::channel(2);
        let hello = AgentMessage {
            kind: Some(agent_message::Kind::Hello(Hello {
                node: node.into(),
                agent_id: format!("{node}-agent"),
                agent_version: "0.1.0".into(),
                boot_id: "6b0c3e63-3f0d-4d7e-9a8c-2c1f5f0e7d11".into(),
            })),
        };
        tx.send(hello.encode_to_vec().into()).await.expect("send");
        let path =
            tonic::codegen::http::uri::PathAndQuery::from_static("/gputel.v1.Telemetry/Stream");
        let response = grpc
            .streaming(tonic::Request::new(ReceiverStream::new(rx)), path, RawCodec)
            .await
            .expect("stream opens");
        let mut stream = Stream {
            tx,
            rx: response.into_inner(),
        };
        match stream.next().await {
            collector_message::Kind::Welcome(_) => {}
            other => panic!("expected a welcome, got {other:?}"),
        }
        stream
    }

    async fn send(&self, message: Bytes) {
        self.tx.send(message).await.expect("request stream open");
    }

    async fn next(&mut self) -> collector_message::Kind {
        let message = tokio::time::timeout(Duration::from_secs(120), self.rx.message())
            .await
            .expect("an answer within 120 s")
            .expect("stream healthy")
            .expect("stream open");
        message.kind.expect("a kind")
    }

    /// The reason batch `seq` was rejected.
    async fn rejected(&mut self, seq: u64) -> String {
        loop {
            match self.next().await {
                collector_message::Kind::Reject(reject) => {
                    assert_eq!(reject.seq, seq, "{reject:?}");
                    return reject.reason;
                }
                collector_message::Kind::Ack(_) => continue,
                other => panic!("expected a reject of {seq}, got {other:?}"),
            }
        }
    }
}

/// A batch message of `rows` empty GPU rows, encoded by hand: two bytes a row.
fn empty_rows(seq: u64, rows: usize) -> Bytes {
    let mut batch = BytesMut::with_capacity(rows * 2 + 16);
    encode_key(1, WireType::Varint, &mut batch);
    encode_varint(seq, &mut batch);
    for _ in 0..rows {
        encode_key(2, WireType::LengthDelimited, &mut batch);
        encode_varint(0, &mut batch);
    }
    let mut message = BytesMut::with_capacity(batch.len() + 16);
    encode_key(2, WireType::LengthDelimited, &mut message);
    encode_varint(batch.len() as u64, &mut message);
    message.put(batch);
    message.freeze()
}

fn one_real_row(seq: u64) -> Bytes {
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as i64;
    AgentMessage {
        kind: Some(agent_message::Kind::Batch(Batch {
            seq,
            gpu: vec![GpuSample {
                ts_us: now_us,
                gpu: 0,
                uuid: "GPU-4f4e1a52-0000-4000-8000-000000000001".into(),
                model: "NVIDIA H100 80GB HBM3".into(),
                temperature_c: Some(41),
                ..Default::default()
            }],
            ..Default::default()
        })),
    }
    .encode_to_vec()
    .into()
}

/// `VmHWM`: the most resident memory the process ever had.
fn peak_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kib * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_messages_stay_within_twice_the_memory_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let (collector, addr) =
        start_collector(&store, &["--memory-budget", &format!("{BUDGET_MIB}MiB")]);
    let pid = collector.pid();

    // Four streams at once, each sending the 16.6 MB message of the attack
    // and then 1 M empty rows in 2 MB: each is refused before it is decoded,
    // with the reason, and the stream carries on.
    let mut tasks = Vec::new();
    for n in 0..4 {
        let addr = addr.clone();
        tasks.push(tokio::spawn(async move {
            let mut stream = Stream::open(&addr, &format!("big-{n}")).await;
            stream.send(empty_rows(1, 8_300_000)).await;
            let reason = stream.rejected(1).await;
            stream.send(empty_rows(2, 1_000_000)).await;
            let second = stream.rejected(2).await;
            stream.send(one_real_row(3)).await;
            match stream.next().await {
                collector_message::Kind::Ack(ack) => assert_eq!(ack.seq, 3),
                other => panic!("expected the real row acknowledged, got {other:?}"),
            }
            (reason, second)
        }));
    }
    for task in tasks {
        let (reason, second) = task.await.expect("stream task");
        assert!(
            reason.starts_with("message of 16600007 bytes with 8300000 rows would take up to "),
            "{reason}"
        );
        assert!(
            reason.ends_with(
                "MiB decoded, above the 16 MiB one message may take; send fewer rows per batch"
            ),
            "{reason}"
        );
        assert!(second.contains("with 1000000 rows"), "{second}");
    }

    // Sixteen streams at once, each sending twenty messages just under one
    // message's share (16 MiB decoded at this budget): together far more
    // than the 64 MiB in flight, so they take turns. Each decodes and is
    // then rejected by validation (its rows are empty).
    let rows = 9_000;
    let bound = gputel_proto::wire::census(&empty_rows(1, rows))
        .expect("census")
        .decoded_bytes_bound();
    assert!(bound < 16 << 20 && bound > 8 << 20, "{bound}");
    let mut tasks = Vec::new();
    for n in 0..16 {
        let addr = addr.clone();
        tasks.push(tokio::spawn(async move {
            let mut stream = Stream::open(&addr, &format!("many-{n}")).await;
            let mut reasons = Vec::new();
            for seq in 1..=20 {
                stream.send(empty_rows(seq, rows)).await;
                reasons.push(stream.rejected(seq).await);
            }
            reasons
        }));
    }
    for task in tasks {
        let reasons = task.await.expect("stream task");
        assert_eq!(reasons.len(), 20);
        for reason in reasons {
            assert!(!reason.contains("one message may take"), "{reason}");
        }
    }

    let peak = peak_rss_bytes(pid);
    eprintln!("collector peak RSS: {} MiB", peak >> 20);
    let limit = 2 * (BUDGET_MIB << 20);
    assert!(
        peak <= limit,
        "collector peaked at {} MiB, above twice its {BUDGET_MIB} MiB budget",
        peak >> 20
    );
    // Nothing else was lost: the four real rows are stored.
    let stopped = collector.terminate(Duration::from_secs(60));
    assert!(stopped.status.success(), "{stopped:?}");
    let rows = duckdb_value(
        dir.path(),
        &format!("select count(*) from {}", table_scan(&store, "gpu")),
    );
    assert_eq!(rows, serde_json::json!(4));
}
