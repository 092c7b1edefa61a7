use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use gputel_collector::clock::Clock;
use gputel_collector::config::{
    Cli, Command, Compact, Config, FleetReport, ImportJobs, JobReport, ReportStore, WalCommand,
};
use gputel_collector::{compact, import, report, store, wal};

/// jemalloc rather than glibc's malloc: under a fleet's load the collector
/// frees large, short-lived buffers (a flush's sorted slices and Parquet
/// pages) between many small long-lived ones (connections, buffered rows),
/// and glibc's arenas kept most of the freed memory resident
/// (benches/README.md, "Collector memory at a fleet's pace"). The feature
/// `system-allocator` leaves glibc's for heap profiling.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings (the environment's `_RJEM_MALLOC_CONF` overrides
/// them): a background thread hands freed pages back to the kernel about a
/// second after they were freed (jemalloc's default waits ten), so a
/// flush's memory is returned before the next one; one arena, so what one
/// thread frees (a flush's buffers, on a blocking thread) is what the next
/// allocation on any thread reuses (1000 agents: peak RSS 94 MB against
/// 101–106 MB with jemalloc's arena per few threads); and per-thread caches
/// kept small (blocks of up to 1 KiB, at most 16 of each size), which spare
/// most allocations the arena's lock for at most about 100 KB a thread (3 %
/// less CPU at 1000 paced agents and 9 % in a burst from 16, the same
/// anonymous memory, than with no caches: benches/README.md).
#[cfg(not(feature = "system-allocator"))]
#[allow(non_upper_case_globals, reason = "jemalloc's symbol name")]
#[unsafe(export_name = "_rjem_malloc_conf")]
static malloc_conf: &[u8; 113] =
    b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0,narenas:1,tcache_max:1024,tcache_nslots_small_max:16\0";

/// Purges every jemalloc arena's freed pages (`arena.<MALLCTL_ARENAS_ALL>.purge`).
#[cfg(not(feature = "system-allocator"))]
fn purge_freed_pages() {
    let purged = mallctl_do(c"arena.4096.purge");
    debug_assert!(purged, "jemalloc refused to purge");
}

/// Runs the jemalloc control `name` that reads and writes nothing (a purge,
/// a flush); false when jemalloc refuses.
#[cfg(not(feature = "system-allocator"))]
fn mallctl_do(name: &std::ffi::CStr) -> bool {
    // SAFETY: `name` is NUL-terminated and names a control without values
    // (null pointers, length 0).
    let failed = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    failed == 0
}

/// Reads the u32 jemalloc control `name`, writing `new` to it when given;
/// None when jemalloc refuses.
#[cfg(not(feature = "system-allocator"))]
fn mallctl_u32(name: &std::ffi::CStr, new: Option<u32>) -> Option<u32> {
    let mut old: u32 = 0;
    let mut len = std::mem::size_of::<u32>();
    let mut new = new;
    let (new_ptr, new_len) = match &mut new {
        Some(new) => ((new as *mut u32).cast(), std::mem::size_of::<u32>()),
        None => (std::ptr::null_mut(), 0),
    };
    // SAFETY: `name` is NUL-terminated; the control reads and writes a u32
    // (`arenas.create`, `thread.arena`), whose size `len` and `new_len` give.
    let failed = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr(),
            (&raw mut old).cast(),
            &raw mut len,
            new_ptr,
            new_len,
        )
    };
    (failed == 0).then_some(old)
}

/// Runs `work` with this thread's allocations in an arena of their own,
/// made at the first call (`arenas.create`), then back in the arena it had.
/// The thread's cache of freed blocks is emptied at each switch: it is the
/// thread's, not the arena's, and would otherwise hand `work` blocks of the
/// other arena and keep `work`'s own from the purge after it.
#[cfg(not(feature = "system-allocator"))]
fn in_own_arena(work: &mut dyn FnMut()) {
    static ARENA: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    let arena = *ARENA.get_or_init(|| mallctl_u32(c"arenas.create", None));
    let Some(previous) = arena.and_then(|arena| mallctl_u32(c"thread.arena", Some(arena))) else {
        return work();
    };
    mallctl_do(c"thread.tcache.flush");
    /// Puts the thread back in its arena, also when `work` panics.
    struct Back(u32);
    impl Drop for Back {
        fn drop(&mut self) {
            mallctl_do(c"thread.tcache.flush");
            mallctl_u32(c"thread.arena", Some(self.0));
        }
    }
    let _back = Back(previous);
    work();
}

fn main() -> ExitCode {
    #[cfg(not(feature = "system-allocator"))]
    {
        gputel_collector::memory::set_return_freed(purge_freed_pages);
        gputel_collector::memory::set_apart(in_own_arena);
    }
    gputel_runtime::report::exit("gputel-collector", run().map_err(Into::into))
}

#[tokio::main]
async fn run() -> anyhow::Result<()> {
    let mut cli = Cli::parse();
    compact::raise_open_files_limit();
    match cli.command.take() {
        Some(Command::ImportJobs(args)) => return import_jobs(args).await,
        Some(Command::Compact(args)) => return compact(args).await,
        Some(Command::Job(args)) => std::process::exit(job_report(args).await),
        Some(Command::Report(args)) => std::process::exit(fleet_report(args).await),
        Some(Command::Wal(WalCommand::Check(args))) => {
            let dir = args.resolve()?;
            let report = wal::check(&dir)?;
            for line in &report.lines {
                println!("{line}");
            }
            std::process::exit(i32::from(report.damaged));
        }
        Some(Command::Wal(WalCommand::Salvage(args))) => {
            gputel_runtime::logging::init("info")?;
            let dir = args.resolve()?;
            let (_, replayed) = wal::Wal::open(&dir)
                .with_context(|| format!("cannot salvage the log in {}", dir.display()))?;
            let lost: u64 = replayed.damaged.iter().map(|d| d.bytes).sum();
            println!(
                "{}: {} intact records kept for the collector to write; {} damaged stretches \
                 ({lost} bytes) copied to {}/quarantine/ and skipped; {} torn bytes cut off",
                dir.display(),
                replayed.records.len(),
                replayed.damaged.len(),
                dir.display(),
                replayed.torn_bytes
            );
            return Ok(());
        }
        None => {}
    }
    let shutdown =
        gputel_runtime::signal::shutdown_signal().context("cannot watch SIGTERM and SIGINT")?;
    let config = Config::load(cli)?;
    gputel_runtime::logging::init(&config.log)?;
    gputel_collector::run(config, shutdown).await?;
    Ok(())
}

/// Reads a job trace, each line it skips on stderr as `FILE:LINE: reason`.
fn read_trace(
    path: &std::path::Path,
    format: import::Format,
    utc_offset: chrono::FixedOffset,
) -> anyhow::Result<import::Trace> {
    let trace = import::read_trace(path, format, utc_offset)?;
    for skipped in &trace.skipped {
        eprintln!("{}:{}: {}", path.display(), skipped.line, skipped.reason);
    }
    Ok(trace)
}

/// `gputel-collector import-jobs`: each skipped line on stderr as
/// `FILE:LINE: reason`, one summary line on stdout.
async fn import_jobs(args: ImportJobs) -> anyhow::Result<()> {
    let store_spec = args.store()?;
    let trace = read_trace(&args.file, args.format, args.utc_offset)?;
    let file = args.file.display();
    if trace.jobs.is_empty() && !trace.skipped.is_empty() {
        anyhow::bail!(
            "no job imported from {file}: all {} of its lines were skipped",
            trace.records
        );
    }
    let store = store::open(&store_spec)?;
    import::write_trace(store.as_ref(), &trace, Clock::System.now_us()).await?;
    println!(
        "imported {} jobs from {file} ({} lines skipped) into {store_spec}",
        trace.jobs.len(),
        trace.skipped.len()
    );
    Ok(())
}

/// How long `gputel-collector compact` holds the store's compaction lease
/// unless it renews it (before each hour it publishes) or gives it up (at
/// its end).
const COMPACT_LEASE_TTL: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// `gputel-collector compact`: one round of retention and compaction under
/// the store's compaction lease; the log on stderr, one summary line on
/// stdout (or why another compactor's lease kept it from running).
async fn compact(args: Compact) -> anyhow::Result<()> {
    gputel_runtime::logging::init("info")?;
    let (store_spec, s3, retention) = args.resolve()?;
    let options = compact::CompactOptions {
        tables: args.tables()?,
        min_age: args.min_age,
        before_us: args.before.map(|t| t.timestamp_micros()),
        ..compact::CompactOptions::default()
    };
    let store = store::open_store(&store_spec, &s3)?;
    let options = (!args.retention_only).then_some(&options);
    let holder = compact::holder_name(&format!("compact[{}]", std::process::id()));
    let mut lease =
        match compact::Lease::acquire(&store, &holder, COMPACT_LEASE_TTL, Clock::System).await {
            Ok(lease) => lease,
            Err(e) if e.is_held() => {
                println!("nothing done in {store_spec}: {e}");
                return Ok(());
            }
            Err(e) => {
                return Err(e).with_context(|| format!("maintenance of {store_spec} stopped"));
            }
        };
    let round = compact::maintain(
        &store,
        Clock::System.now_us(),
        options,
        &retention,
        &mut lease,
    )
    .await;
    if let Err(e) = lease.release().await {
        tracing::warn!(error = %e, "cannot give the compaction lease up; it runs out by itself");
    }
    let (compacted, deleted) =
        round.with_context(|| format!("maintenance of {store_spec} stopped"))?;
    println!(
        "compacted {} hours ({} files, {} rows, {} bytes -> {} files, {} rows, {} bytes; {} duplicate rows removed, {} of them with values differing from the row kept; {} hours left as they are (changed meanwhile, or holding a file of another schema: see the log)); deleted {} partitions past retention in {store_spec}",
        compacted.hours,
        compacted.files_in,
        compacted.rows,
        compacted.bytes_in,
        compacted.files_out,
        compacted.rows - compacted.duplicates,
        compacted.bytes_out,
        compacted.duplicates,
        compacted.duplicates_differing,
        compacted.hours_skipped,
        deleted.partitions,
    );
    Ok(())
}

/// `gputel-collector job`: the report on stdout; exit status 0 with a
/// report, 1 when the store holds nothing of the job (why, on stderr), 2
/// when the store cannot be read.
async fn job_report(args: JobReport) -> i32 {
    match job_report_outcome(&args).await {
        Ok(report::Outcome::Report(r)) => {
            let text = if args.json {
                match serde_json::to_string(&r) {
                    Ok(json) => format!("{json}\n"),
                    Err(e) => {
                        eprintln!("error: cannot write the report as JSON: {e}");
                        return 2;
                    }
                }
            } else {
                report::render::text(&r, &store_name(&args))
            };
            printed(print_out(&text))
        }
        Ok(report::Outcome::NotFound(why)) => {
            eprintln!("{why}");
            1
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            2
        }
    }
}

fn store_name(args: &JobReport) -> String {
    args.source.resolve().map(|(s, _)| s).unwrap_or_default()
}

/// A report's store, by name and opened; never created (a local store is
/// opened by creating its directory, and a report must not leave one behind
/// for a mistyped path).
fn open_report_store(source: &ReportStore) -> anyhow::Result<(String, store::Store)> {
    let (store_spec, s3) = source.resolve()?;
    if !store_spec.contains("://") && !std::path::Path::new(&store_spec).is_dir() {
        anyhow::bail!("there is no store at {store_spec}: no such directory (give --store)");
    }
    let store = store::open_store(&store_spec, &s3)?;
    Ok((store_spec, store))
}

async fn job_report_outcome(args: &JobReport) -> anyhow::Result<report::Outcome> {
    let (store_spec, store) = open_report_store(&args.source)?;
    let query = report::Query {
        job_id: args.job_id.clone(),
        from_us: args.from.map(|t| t.timestamp_micros()),
        to_us: args.to.map(|t| t.timestamp_micros()),
    };
    report::report(store.objects, &store_spec, &query)
        .await
        .with_context(|| {
            format!(
                "cannot make the report of job {} from {store_spec}",
                args.job_id
            )
        })
}

/// Writes a report to stdout. A reader that stops early (`| head -1`) is
/// not an error: what it did not read is not needed.
fn print_out(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        done => done,
    }
}

/// The exit status after printing a report: 0, or 2 when stdout failed.
fn printed(done: std::io::Result<()>) -> i32 {
    match done {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: cannot write to stdout: {e}");
            2
        }
    }
}

/// `gputel-collector report`: the page written, one line on stdout; exit
/// status 0, 1 when the store holds nothing to draw, 2 on an error.
async fn fleet_report(args: FleetReport) -> i32 {
    match fleet_report_outcome(&args).await {
        Ok(Ok(line)) => printed(print_out(&format!("{line}\n"))),
        Ok(Err(why)) => {
            eprintln!("{why}");
            1
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            2
        }
    }
}

async fn fleet_report_outcome(args: &FleetReport) -> anyhow::Result<Result<String, String>> {
    use report::fleet;
    let (store_spec, store) = open_report_store(&args.source)?;
    let resample_us = match args.resample {
        Some(d) if d.as_micros() == 0 => anyhow::bail!("--resample must be longer than 0"),
        Some(d) => Some(i64::try_from(d.as_micros()).context("--resample is too long")?),
        None => None,
    };
    let options = fleet::Options {
        window: fleet::Window {
            from_us: args.from.map(|t| t.timestamp_micros()),
            to_us: args.to.map(|t| t.timestamp_micros()),
        },
        resample_us,
    };
    let trace = match &args.jobs {
        Some(path) => {
            let trace = read_trace(path, args.jobs_format, args.jobs_utc_offset)?;
            if trace.jobs.is_empty() {
                anyhow::bail!("{}: no job could be read from the trace", path.display());
            }
            Some((path.display().to_string(), trace))
        }
        None => None,
    };
    let trace_file = trace
        .as_ref()
        .map(|(name, trace)| fleet::TraceFile { name, trace });
    let fleet = match fleet::fleet(store.objects, &store_spec, options, trace_file)
        .await
        .with_context(|| format!("cannot make the report of {store_spec}"))?
    {
        Ok(fleet) => fleet,
        Err(why) => return Ok(Err(why)),
    };
    let figures = fleet::html::figures(&fleet);
    let page = fleet::html::page(&fleet, &figures);
    write_file(&args.out, page.as_bytes())?;
    if let Some(path) = &args.cdf_csv {
        write_file(path, fleet::cdf_csv(&fleet).as_bytes())?;
    }
    if args.json {
        let json = serde_json::to_string(&fleet).context("cannot write the report as JSON")?;
        print_out(&format!("{json}\n")).context("cannot write to stdout")?;
    }
    Ok(Ok(format!(
        "wrote {}: {} figures from {} GPU samples of {} GPUs on {} node{} ({}); open it in a browser",
        args.out.display(),
        figures.len(),
        fleet.gpu_rows,
        fleet.gpus,
        fleet.nodes,
        if fleet.nodes == 1 { "" } else { "s" },
        match (&fleet.first_ts, &fleet.last_ts) {
            (Some(a), Some(b)) => format!("{a} to {b}"),
            _ => "no GPU samples".into(),
        }
    )))
}

/// Writes a whole file through a temporary sibling, so a reader never sees half of it.
fn write_file(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("cannot write {}", path.display()))?;
    std::io::Write::write_all(&mut tmp, bytes)
        .with_context(|| format!("cannot write {}", path.display()))?;
    tmp.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}
