//! Agent CPU per tick, excluding driver time. DESIGN.md's target: ≤ 1 ms for
//! 8 GPUs, the node and 4 IB ports (≤ 0.1 % of a core at 1 Hz).
//!
//! - `node_sample/*`: `NodeSampler::sample` on `tests/fixtures/proc` (8 CPU
//!   lines) and on a copy whose `/proc/stat` has the 224 CPU lines and a full
//!   `intr` line of the node the fixtures come from.
//! - `ib_sample/4_ports`: `IbSampler::sample` on `tests/fixtures/sys`, one
//!   second later each time, so rates are computed.
//! - `batch_encode`: one tick's rows (8 GPUs, node, 4 ports) made into a
//!   Batch, cloned into an AgentMessage as the client does (it keeps the
//!   original until acknowledged) and prost-encoded.
//! - `tick_excluding_driver/*`: node and IB sampling, building and encoding,
//!   with the 8 GPU rows copied from simulated ones in place of NVML calls
//!   (the copy stands for the rows' string allocations, which are agent CPU).
//! - `gpu_sample/fake_nvml`, `tick/fake_nvml`: `GpuSampler::sample` and the
//!   agent's whole `Samplers::sample` plus encoding against the fake NVML
//!   library (eight moving H100s). These include the fake "driver"'s own time
//!   and nvml-wrapper's, so they bound the GPU side from above rather than
//!   measure the agent alone. Skipped, with a note, when the library is not
//!   built; `GPUTEL_BENCH_NVML_LIB=/path/libnvidia-ml.so.1` measures a real
//!   driver instead.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use criterion::{Criterion, criterion_group, criterion_main};
use gputel_agent::config::{Cli, Config};
use gputel_agent::sampler::dcgm::{DEFAULT_DCGM_HOST, DcgmHost, DcgmOptions};
use gputel_agent::sampler::gpu::{GpuOptions, GpuSampler, Profiling};
use gputel_agent::sampler::ib::IbSampler;
use gputel_agent::sampler::node::NodeSampler;
use gputel_agent::sampler::{Sampler, Tick};
use gputel_agent::sampling::Samplers;
use gputel_benches::{Cluster, SECOND_US, START_US, fake_nvml_lib, fixtures_dir};
use gputel_proto::{AgentMessage, Batch, GpuSample, agent_message};
use prost::Message;

/// CPUs of the node the fixtures describe (the fixture keeps 8 of them).
const NODE_CPUS: usize = 224;
/// Interrupt lines in that node's `/proc/stat` `intr` line.
const NODE_IRQS: usize = 1024;
/// Names a library to measure instead of the fake one (e.g. the real NVML).
const NVML_LIB_ENV: &str = "GPUTEL_BENCH_NVML_LIB";

fn proc_fixture() -> PathBuf {
    fixtures_dir().join("proc")
}

fn sys_fixture() -> PathBuf {
    fixtures_dir().join("sys")
}

/// A procfs root like the fixture's, but with a full-size `/proc/stat`: the
/// fixture's 8 CPU lines repeated up to `NODE_CPUS`, the aggregate line their
/// sum, and an `intr` line with `NODE_IRQS` counters.
fn full_size_proc() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("create a temporary procfs root");
    let fixture = proc_fixture();
    for name in ["meminfo", "loadavg"] {
        std::fs::copy(fixture.join(name), dir.path().join(name)).expect("copy fixture file");
    }
    let stat = std::fs::read_to_string(fixture.join("stat")).expect("read fixture stat");
    let per_cpu: Vec<Vec<u64>> = stat
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .map(|v| v.parse().expect("fixture stat holds numbers"))
                .collect()
        })
        .collect();
    let cpus: Vec<&Vec<u64>> = per_cpu.iter().cycle().take(NODE_CPUS).collect();
    let mut sum = vec![0u64; per_cpu[0].len()];
    for cpu in &cpus {
        for (s, v) in sum.iter_mut().zip(cpu.iter()) {
            *s += v;
        }
    }
    let join = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(" ");
    let mut text = format!("cpu  {}\n", join(&sum));
    for (i, cpu) in cpus.iter().enumerate() {
        let _ = writeln!(text, "cpu{i} {}", join(cpu));
    }
    let irqs: Vec<u64> = (0..NODE_IRQS as u64)
        .map(|i| {
            if i % 3 == 0 {
                0
            } else {
                i * 7919 % 100_003 * 1000
            }
        })
        .collect();
    let _ = writeln!(text, "intr {} {}", irqs.iter().sum::<u64>(), join(&irqs));
    // Everything after the fixture's intr line (ctxt, btime, processes, …).
    for line in stat.lines().skip_while(|l| !l.starts_with("intr")).skip(1) {
        let _ = writeln!(text, "{line}");
    }
    std::fs::write(dir.path().join("stat"), text).expect("write stat");
    dir
}

/// Fails loudly if a fixture no longer reads cleanly: a bench of an error path
/// would measure the wrong thing.
fn checked_node_sampler(root: &Path, cpus: u32) -> NodeSampler {
    let mut sampler = NodeSampler::new(root);
    let mut tick = Tick::new(START_US);
    sampler.sample(&mut tick);
    assert!(
        tick.errors.is_empty(),
        "{}: {:?}",
        root.display(),
        tick.errors
    );
    let sample = &tick.batch.node[0];
    assert_eq!(sample.cpu_count, cpus, "{}", root.display());
    assert!(sample.memory_available_kib.is_some() && sample.load1.is_some());
    sampler
}

fn checked_ib_sampler() -> IbSampler {
    let mut sampler = IbSampler::new(sys_fixture());
    let mut tick = Tick::default();
    for n in 0..2 {
        tick = Tick::new(START_US + n * SECOND_US);
        sampler.sample(&mut tick);
        assert!(tick.errors.is_empty(), "{:?}", tick.errors);
    }
    let out = tick.batch.ib;
    assert_eq!(out.len(), 4);
    assert!(out.iter().all(|p| p.xmit_bytes.is_some()), "{out:?}");
    sampler
}

/// Eight realistic GPU rows, as GpuSampler would have made them.
fn gpu_rows() -> Vec<GpuSample> {
    let mut cluster = Cluster::new(1);
    cluster.tick().remove(0).batch.gpu
}

fn encode_tick(batch: &Batch, buf: &mut Vec<u8>) {
    let msg = AgentMessage {
        kind: Some(agent_message::Kind::Batch(batch.clone())),
    };
    buf.clear();
    msg.encode(buf).expect("a Vec grows as needed");
}

fn host(c: &mut Criterion) {
    let mut g = c.benchmark_group("agent_tick");

    let full = full_size_proc();
    for (name, root, cpus) in [
        ("node_sample/fixture_8_cpus", proc_fixture(), 8),
        (
            "node_sample/224_cpus",
            full.path().to_owned(),
            NODE_CPUS as u32,
        ),
    ] {
        let mut sampler = checked_node_sampler(&root, cpus);
        let mut ts = START_US;
        // The files do not change, so after the first tick the CPU shares are
        // skipped (no time passed): a few float operations less than in production.
        g.bench_function(name, |b| {
            b.iter(|| {
                ts += SECOND_US;
                let mut tick = Tick::new(ts);
                sampler.sample(&mut tick);
                black_box(tick)
            })
        });
    }

    let mut ib = checked_ib_sampler();
    let mut ts = START_US + 2 * SECOND_US;
    g.bench_function("ib_sample/4_ports", |b| {
        b.iter(|| {
            ts += SECOND_US;
            let mut tick = Tick::new(ts);
            ib.sample(&mut tick);
            black_box(tick)
        })
    });

    let template = Cluster::new(1).tick().remove(0).batch;
    let mut buf = Vec::with_capacity(4096);
    encode_tick(&template, &mut buf);
    println!(
        "one tick (8 GPUs, node, 4 IB ports) encodes to {} bytes on the wire",
        buf.len()
    );
    g.bench_function("batch_encode", |b| {
        b.iter(|| {
            let batch = Batch {
                seq: template.seq,
                gpu: template.gpu.clone(),
                node: template.node.clone(),
                ib: template.ib.clone(),
                ..Batch::default()
            };
            encode_tick(&batch, &mut buf);
            black_box(&buf);
            batch
        })
    });

    let gpus = gpu_rows();
    for (name, root, cpus) in [
        ("tick_excluding_driver/fixture_8_cpus", proc_fixture(), 8),
        (
            "tick_excluding_driver/224_cpus",
            full.path().to_owned(),
            NODE_CPUS as u32,
        ),
    ] {
        let mut node = checked_node_sampler(&root, cpus);
        let mut ib = checked_ib_sampler();
        let mut ts = START_US + 2 * SECOND_US;
        let mut seq = 0;
        let mut errors = 0;
        g.bench_function(name, |b| {
            b.iter(|| {
                ts += SECOND_US;
                seq += 1;
                let mut tick = Tick::new(ts);
                tick.batch = Batch {
                    seq,
                    gpu: gpus.clone(),
                    node: Vec::with_capacity(1),
                    ib: Vec::with_capacity(4),
                    ..Batch::default()
                };
                node.sample(&mut tick);
                ib.sample(&mut tick);
                errors += tick.errors.len();
                encode_tick(&tick.batch, &mut buf);
                black_box(&buf);
                tick
            })
        });
        assert_eq!(errors, 0, "a fixture failed to read");
    }
    g.finish();
}

/// The NVML library to measure: `$GPUTEL_BENCH_NVML_LIB`, else the fake one.
fn nvml_lib() -> Option<(PathBuf, &'static str)> {
    if let Some(path) = std::env::var_os(NVML_LIB_ENV).filter(|p| !p.is_empty()) {
        return Some((PathBuf::from(path), "nvml_lib"));
    }
    fake_nvml_lib().map(|p| (p, "fake_nvml"))
}

fn with_nvml(c: &mut Criterion) {
    let Some((lib, label)) = nvml_lib() else {
        println!(
            "note: agent_tick/gpu_sample/fake_nvml and agent_tick/tick/fake_nvml skipped: \
             libgputel_fake_nvml.so is not built; run `cargo build --release -p gputel-fake-nvml` \
             (or set {NVML_LIB_ENV} to an NVML library)"
        );
        return;
    };
    let options = GpuOptions {
        lib: Some(lib.clone()),
        procfs_root: proc_fixture(),
        // Processes are listed at the first tick only: their cost is not per tick.
        process_interval_us: i64::MAX,
        // At the agent's default: one tick in ten reads what is slow to read.
        slow_read_interval_us: 10 * SECOND_US,
        // As the agent runs by default: on a node of GPUs without GPM (a real
        // library named by the variable), DCGM's reads are part of a tick.
        profiling: Profiling::Auto,
        dcgm: DcgmOptions {
            lib: None,
            host: DcgmHost::Tcp(DEFAULT_DCGM_HOST.to_owned()),
            pause_file: None,
            interval: Duration::from_secs(1),
        },
    };
    let mut gpu = match GpuSampler::open(&options) {
        Ok(gpu) => gpu,
        Err(e) => {
            println!("note: agent_tick/*/{label} skipped: {e}");
            return;
        }
    };
    println!(
        "agent_tick/*/{label}: {} GPUs from {}",
        gpu.gpu_count(),
        lib.display()
    );
    let mut g = c.benchmark_group("agent_tick");

    let mut ts = START_US;
    g.bench_function(format!("gpu_sample/{label}"), |b| {
        b.iter(|| {
            ts += SECOND_US;
            let mut tick = Tick::new(ts);
            gpu.sample(&mut tick);
            black_box(tick)
        })
    });
    drop(gpu);

    let args: [OsString; 10] = [
        "gputel-agent".into(),
        "--plaintext".into(),
        "--node".into(),
        "bench-node".into(),
        "--procfs-root".into(),
        proc_fixture().into_os_string(),
        "--sysfs-root".into(),
        sys_fixture().into_os_string(),
        "--nvml-lib".into(),
        lib.into_os_string(),
    ];
    let cli = Cli::try_parse_from(args).expect("the bench's agent flags parse");
    let config = Config::load(&cli).expect("the bench's agent configuration is valid");
    let mut samplers = Samplers::open(&config);
    let mut buf = Vec::with_capacity(4096);
    let mut seq = 0;
    g.bench_function(format!("tick/{label}"), |b| {
        b.iter(|| {
            ts += SECOND_US;
            seq += 1;
            let mut tick = samplers.sample(ts);
            tick.batch.seq = seq;
            encode_tick(&tick.batch, &mut buf);
            black_box(&buf);
            tick
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = host, with_nvml
}
criterion_main!(benches);
