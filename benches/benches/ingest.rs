//! Collector ingest per metric value. DESIGN.md's target: ≥ 2 M metric values
//! per second per core, gRPC to Parquet. Every benchmark runs on one thread
//! and reports throughput in metric values (see
//! `gputel_benches::metric_columns`: one non-null value of a numeric,
//! non-key column of a stored row), so criterion's "elem/s" reads as values/s.
//!
//! `ingest/*` runs on what a collector sees between two flushes at the default
//! interval: 60 s of 16 simulated nodes (8 GPUs, 4 IB ports each) at 1 Hz,
//! one Batch per node and tick, as agents send them:
//!
//! - `decode`: each AgentMessage's census and decoding, as the collector
//!   takes it off the stream;
//! - `validate`: `validate_batch` on each decoded batch;
//! - `append`: `WriteBuffer::append` of every batch into an empty buffer;
//! - `take`: `WriteBuffer::take`, and every column of its builders made an
//!   Arrow array (a flush makes them one at a time as it encodes them);
//! - `sort`: `persist::sort_rows` of every table (the sorted copy included);
//! - `encode`: `persist::encode` of every table's sorted rows;
//! - `sort_encode`: `persist::sort_and_encode` of every table, as a flush
//!   sorts and encodes (a column at a time since 2026-11-27; before, this
//!   was `persist::sort_rows` and then `persist::encode`);
//! - `end_to_end`: all of the above in sequence, from encoded messages to
//!   Parquet bytes. It leaves out HTTP/2 and gRPC framing, the WAL and the
//!   store's write of the file (`benches/scripts/ingest.sh` measures those
//!   end to end).
//!
//! `persist_hour/*` sorts and encodes one hour of those 16 nodes per table:
//! the files hourly compaction would write.

use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use criterion::{BatchSize, Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use gputel_benches::{AgentBatch, bench_mode, buffer_and_take, metric_values, simulate};
use gputel_collector::buffer::WriteBuffer;
use gputel_collector::ingest::decode;
use gputel_collector::persist::{encode, sort_and_encode, sort_rows};
use gputel_collector::validate::validate_batch;
use gputel_proto::wire::census;
use gputel_proto::{AgentMessage, Batch, agent_message};
use gputel_schemas::{BatchColumns, PartitionKey, Table};
use prost::Message;

/// Nodes and seconds of the per-flush data set; a tiny one under `cargo test`.
fn flush_set() -> (usize, u32) {
    if bench_mode() { (16, 60) } else { (2, 5) }
}

/// Nodes and seconds of the hourly data set.
fn hour_set() -> (usize, u32) {
    if bench_mode() { (16, 3600) } else { (2, 30) }
}

fn encode_message(batch: &Batch) -> Vec<u8> {
    AgentMessage {
        kind: Some(agent_message::Kind::Batch(batch.clone())),
    }
    .encode_to_vec()
}

/// What the collector does with a message off the stream: its census, then
/// its decoding.
fn decode_batch(bytes: &Bytes) -> Batch {
    let census = census(bytes).expect("a well-formed message");
    match decode(bytes, &census) {
        Ok((
            AgentMessage {
                kind: Some(agent_message::Kind::Batch(batch)),
            },
            _,
        )) => batch,
        other => panic!("expected a batch, got {other:?}"),
    }
}

/// The collector's clock when the last of `batches` arrives.
fn arrival_us(batches: &[AgentBatch]) -> i64 {
    batches
        .iter()
        .flat_map(|b| b.batch.node.iter().map(|n| n.ts_us))
        .max()
        .unwrap_or_default()
        + 500_000
}

fn sort_encode_all(taken: &[(Table, PartitionKey, arrow_array::RecordBatch)]) -> usize {
    taken
        .iter()
        .map(|(table, _, rb)| {
            let mut rows = BatchColumns::from(rb.clone());
            sort_and_encode(*table, &mut rows, table.name())
                .expect("sort and encode Parquet")
                .len()
        })
        .sum()
}

fn ingest(c: &mut Criterion) {
    let (nodes, seconds) = flush_set();
    let batches = simulate(nodes, seconds);
    let messages: Vec<Bytes> = batches
        .iter()
        .map(|b| Bytes::from(encode_message(&b.batch)))
        .collect();
    let now_us = arrival_us(&batches);
    let taken = buffer_and_take(&batches);
    let values: u64 = taken.iter().map(|(t, _, rb)| metric_values(*t, rb)).sum();
    let wire: usize = messages.iter().map(Bytes::len).sum();
    println!(
        "ingest/*: {nodes} nodes × {seconds} s = {} batches, {values} metric values, \
         {wire} bytes of messages ({:.2} bytes/value on the wire)",
        batches.len(),
        wire as f64 / values as f64
    );

    let mut g = c.benchmark_group("ingest");
    g.throughput(Throughput::Elements(values))
        .sampling_mode(SamplingMode::Flat)
        .sample_size(20)
        .measurement_time(Duration::from_secs(5));

    g.bench_function("decode", |b| {
        b.iter(|| {
            for m in &messages {
                black_box(decode_batch(m));
            }
        })
    });

    g.bench_function("validate", |b| {
        b.iter(|| {
            for ab in &batches {
                black_box(validate_batch(&ab.batch, now_us).is_ok());
            }
        })
    });

    // ValidBatch is a checked reference: validate once, append many times.
    let valid: Vec<_> = batches
        .iter()
        .map(|ab| {
            let v = validate_batch(&ab.batch, now_us).expect("simulated batches are valid");
            (ab.node.as_str(), v)
        })
        .collect();
    let fill = || {
        let mut buffer = WriteBuffer::default();
        for (node, v) in &valid {
            buffer.append(node, *v);
        }
        buffer
    };

    g.bench_function("append", |b| {
        b.iter_batched(|| (), |()| fill(), BatchSize::PerIteration)
    });

    g.bench_function("take", |b| {
        b.iter_batched(
            fill,
            |mut buffer| buffer.take_batches().expect("rows fit their schemas"),
            BatchSize::PerIteration,
        )
    });

    g.bench_function("sort", |b| {
        b.iter(|| {
            for (table, _, rb) in &taken {
                black_box(sort_rows(*table, rb).expect("sort key columns exist"));
            }
        })
    });

    let sorted: Vec<_> = taken
        .iter()
        .map(|(table, _, rb)| {
            (
                *table,
                sort_rows(*table, rb).expect("sort key columns exist"),
            )
        })
        .collect();
    g.bench_function("encode", |b| {
        b.iter(|| {
            for (table, rb) in &sorted {
                black_box(encode(*table, table.schema(), rb).expect("encode Parquet"));
            }
        })
    });

    g.bench_function("sort_encode", |b| {
        b.iter(|| black_box(sort_encode_all(&taken)))
    });

    g.bench_function("end_to_end", |b| {
        b.iter(|| {
            let mut buffer = WriteBuffer::default();
            for (m, ab) in messages.iter().zip(&batches) {
                let batch = decode_batch(m);
                let valid = validate_batch(&batch, now_us).expect("valid");
                buffer.append(&ab.node, valid);
            }
            // As a flush does: each column made an array as it is encoded.
            let bytes: usize = buffer
                .take()
                .into_iter()
                .map(|(table, _, mut rows)| {
                    sort_and_encode(table, rows.as_mut(), table.name())
                        .expect("sort and encode Parquet")
                        .len()
                })
                .sum();
            black_box(bytes)
        })
    });
    g.finish();
}

fn persist_hour(c: &mut Criterion) {
    let (nodes, seconds) = hour_set();
    let taken = buffer_and_take(&simulate(nodes, seconds));
    let mut g = c.benchmark_group("persist_hour");
    g.sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .measurement_time(Duration::from_secs(8));
    for (table, _, rb) in &taken {
        let values = metric_values(*table, rb);
        println!(
            "persist_hour/{table}: {nodes} nodes × {seconds} s, {} rows, {values} metric values",
            rb.num_rows()
        );
        g.throughput(Throughput::Elements(values));
        g.bench_function(table.name(), |b| {
            b.iter(|| {
                let sorted = sort_rows(*table, rb).expect("sort key columns exist");
                black_box(encode(*table, table.schema(), &sorted).expect("encode Parquet"))
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(2));
    targets = ingest, persist_hour
}
criterion_main!(benches);
