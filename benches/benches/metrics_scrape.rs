//! The agent's `/metrics` per scrape, for 8 GPUs, the node and 4 IB ports.
//! Issue 18's target: ≤ 0.2 ms of CPU per scrape.
//!
//! - `render`: one tick's page written from the recorded rows, uncached
//!   (`Metrics::render`): what the first scrape after a tick pays for the
//!   text, and what every scrape paid before pages were cached.
//! - `gzip/level_N`: compressing that page once with a new
//!   `flate2::write::GzEncoder` at levels 1, 6, 9 (the agent uses 1);
//!   `gzip/level_1_reset_compressor`: with one compressor reset between
//!   pages, as the agent does.
//! - `cached_plain`, `cached_gzip`: a scrape between ticks, which takes the
//!   cached bytes of the page (plain, or its gzip copy).
//! - `record`: the sampling thread's part of a tick (`Metrics::record`).
//! - `first_gzip_of_a_page`: the first gzip scrape of a page already
//!   rendered: the agent's compression alone.
//! - `first_after_tick_plain`, `first_after_tick_gzip`: recording a tick,
//!   then the scrape after it (renders; the gzip one also compresses, with
//!   the agent's compressor, which is kept from page to page).
//!
//! - `cold/first_after_tick_plain`, `cold/first_after_tick_gzip`: the same
//!   with the CPU's caches taken by 64 MB written before each tick, as a
//!   scrape once a second finds them.
//!
//! None of these count the HTTP exchange; `benches/scripts/metrics-scrape.sh`
//! measures the whole agent process under scrapes.
//!
//! The rows: the simulated cluster's 8 H100s with every field the fake NVML
//! fills set (so the page has the live agent's series), the node and 4 IB
//! ports read by the agent's samplers from `tests/fixtures`, and XIDs on
//! two GPUs.

use std::hint::black_box;
use std::io::Write as _;

use criterion::{Criterion, criterion_group, criterion_main};
use gputel_agent::metrics::{Encoding, Metrics};
use gputel_agent::sampler::ib::IbSampler;
use gputel_agent::sampler::node::NodeSampler;
use gputel_agent::sampler::{Sampler, Tick};
use gputel_benches::{Cluster, SECOND_US, START_US, fixtures_dir};
use gputel_proto::{Batch, EventKind, GpuEvent, GpuSample};

/// Fills what the simulator leaves unset with what the fake NVML's H100s
/// report, so every per-GPU family has a series.
fn full_row(row: GpuSample) -> GpuSample {
    let gpu = row.gpu;
    GpuSample {
        pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x18 + 0x10 * gpu)),
        enc_util_pct: Some(0),
        dec_util_pct: Some(0),
        fb_reserved_bytes: Some(566_231_040),
        sm_active_pct: Some(87.5 + gpu as f32),
        sm_occupancy_pct: Some(41.25),
        tensor_active_pct: Some(42.25),
        dram_active_pct: Some(31.5),
        gr_engine_active_pct: Some(98.5),
        power_limit_mw: Some(700_000),
        clock_event_reasons: Some(0),
        ecc_corrected_volatile: Some(0),
        ecc_uncorrected_volatile: Some(0),
        ecc_corrected_aggregate: Some(17),
        ecc_uncorrected_aggregate: Some(0),
        remapped_rows_corrected: Some(0),
        remapped_rows_uncorrected: Some(0),
        remapped_rows_pending: Some(false),
        remapped_rows_failure: Some(false),
        pcie_replay_count: Some(0),
        pcie_tx_bytes_per_s: Some(1_234_567 + u64::from(gpu)),
        pcie_rx_bytes_per_s: Some(2_345_678 + u64::from(gpu)),
        nvlink_tx_bytes_per_s: Some(40_000_000_000 + u64::from(gpu) * 12_345),
        nvlink_rx_bytes_per_s: Some(36_000_000_000 + u64::from(gpu) * 54_321),
        ..row
    }
}

/// One tick's batches, one after another: GPU rows from the simulator,
/// node and IB rows from the agent's samplers on the fixtures.
struct Ticks {
    cluster: Cluster,
    node: NodeSampler,
    ib: IbSampler,
    ts: i64,
}

impl Ticks {
    fn new() -> Self {
        let mut ticks = Self {
            cluster: Cluster::new(1),
            node: NodeSampler::new(fixtures_dir().join("proc")),
            ib: IbSampler::new(fixtures_dir().join("sys")),
            ts: START_US,
        };
        // The first IB reading has no rates yet.
        ticks.next();
        ticks
    }

    fn next(&mut self) -> Batch {
        self.ts += SECOND_US;
        let mut tick = Tick::new(self.ts);
        self.node.sample(&mut tick);
        self.ib.sample(&mut tick);
        assert!(tick.errors.is_empty(), "{:?}", tick.errors);
        let sim = self.cluster.tick().remove(0).batch;
        tick.batch.gpu = sim.gpu.into_iter().map(full_row).collect();
        tick.batch
    }
}

fn xid(gpu: u32, code: u64) -> GpuEvent {
    GpuEvent {
        ts_us: START_US,
        gpu,
        uuid: format!("GPU-{gpu}"),
        kind: EventKind::Xid as i32,
        code,
        ..GpuEvent::default()
    }
}

fn gzip(bytes: &[u8], level: u32) -> Vec<u8> {
    let mut out = flate2::write::GzEncoder::new(
        Vec::with_capacity(bytes.len() / 4),
        flate2::Compression::new(level),
    );
    out.write_all(bytes).expect("writing to a Vec cannot fail");
    out.finish().expect("writing to a Vec cannot fail")
}

fn scrape(c: &mut Criterion) {
    let mut ticks = Ticks::new();
    let metrics = Metrics::new("gpu-node-017").with_driver_version(Some("550.54.15"));
    let mut first = ticks.next();
    first.event = vec![xid(3, 79), xid(3, 48), xid(6, 13)];
    metrics.record(&first);
    metrics.record(&ticks.next());

    let plain = metrics.scrape(Encoding::Identity);
    let series = std::str::from_utf8(&plain.body)
        .expect("the page is UTF-8")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .count();
    println!(
        "the page: {} bytes, {series} series; gzip level 1 / 6 / 9: {} / {} / {} bytes",
        plain.body.len(),
        gzip(&plain.body, 1).len(),
        gzip(&plain.body, 6).len(),
        gzip(&plain.body, 9).len(),
    );

    let mut g = c.benchmark_group("metrics_scrape");
    g.bench_function("render", |b| b.iter(|| black_box(metrics.render())));
    for level in [1, 6, 9] {
        g.bench_function(format!("gzip/level_{level}"), |b| {
            b.iter(|| black_box(gzip(&plain.body, level)))
        });
    }
    // One raw-deflate compressor reset between pages, as the agent keeps
    // it (gzip framing left out: 18 bytes and a CRC-32 of the page).
    let mut deflate = flate2::Compress::new(flate2::Compression::new(1), false);
    let mut out = Vec::with_capacity(plain.body.len());
    g.bench_function("gzip/level_1_reset_compressor", |b| {
        b.iter(|| {
            deflate.reset();
            out.clear();
            let status = deflate
                .compress_vec(&plain.body, &mut out, flate2::FlushCompress::Finish)
                .expect("compress");
            assert_eq!(status, flate2::Status::StreamEnd);
            black_box(out.len())
        })
    });
    // Both cached copies exist from here on.
    metrics.scrape(Encoding::Gzip);
    g.bench_function("cached_plain", |b| {
        b.iter(|| black_box(metrics.scrape(Encoding::Identity)))
    });
    g.bench_function("cached_gzip", |b| {
        b.iter(|| black_box(metrics.scrape(Encoding::Gzip)))
    });
    // A fresh batch per iteration (its making is outside the timing):
    // recorded alone, then recorded and scraped once.
    g.bench_function("record", |b| {
        b.iter_batched(
            || ticks.next(),
            |batch| metrics.record(&batch),
            criterion::BatchSize::SmallInput,
        )
    });
    for (name, encoding) in [
        ("first_after_tick_plain", Encoding::Identity),
        ("first_after_tick_gzip", Encoding::Gzip),
    ] {
        g.bench_function(name, |b| {
            b.iter_batched(
                || ticks.next(),
                |batch| {
                    metrics.record(&batch);
                    black_box(metrics.scrape(encoding))
                },
                criterion::BatchSize::SmallInput,
            )
        });
    }
    // The agent's compression alone: the page is rendered in the setup.
    g.bench_function("first_gzip_of_a_page", |b| {
        b.iter_batched(
            || {
                metrics.record(&ticks.next());
                metrics.scrape(Encoding::Identity)
            },
            |_plain| black_box(metrics.scrape(Encoding::Gzip)),
            // Each setup right before its routine: a batch of setups would
            // leave only the last page to compress.
            criterion::BatchSize::PerIteration,
        )
    });
    g.finish();

    // The same first scrapes as a scraper once a second finds the agent:
    // its caches taken by everything else that ran in between (here, 64 MB
    // written before each tick, outside the timing).
    let mut g = c.benchmark_group("metrics_scrape/cold");
    g.sample_size(30);
    let mut elsewhere = vec![0u8; 64 << 20];
    for (name, encoding) in [
        ("first_after_tick_plain", Encoding::Identity),
        ("first_after_tick_gzip", Encoding::Gzip),
    ] {
        g.bench_function(name, |b| {
            b.iter_batched(
                || {
                    let batch = ticks.next();
                    for (i, line) in elsewhere.chunks_mut(64).enumerate() {
                        line[0] = i as u8;
                    }
                    black_box(&elsewhere);
                    batch
                },
                |batch| {
                    metrics.record(&batch);
                    black_box(metrics.scrape(encoding))
                },
                criterion::BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, scrape);
criterion_main!(benches);
