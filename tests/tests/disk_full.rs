//! A full disk under the collector: batches are refused with UNAVAILABLE and
//! a log line that names the cause, the agent keeps them in its spool, and
//! when space returns everything arrives, exactly once.
//!
//! The collector's log and store live on a small tmpfs mounted in a private
//! mount namespace (`unshare`, as root or through a user namespace), so the
//! test needs no privileges on the host and leaves no mount behind. The
//! collector runs in that namespace (`nsenter`); the test reaches the tmpfs
//! through `/proc/<holder>/root`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gputel_tests::{
    Running, assert_gpu_rows_exactly_once, collector_bin, duckdb_value, fixture_agent, loadgen_bin,
    summary_field, table_scan,
};
use serde_json::json;

const TICKS: u64 = 60;

/// A process holding a private tmpfs of `size` mounted at `mountpoint`, and
/// the path under which this process sees that tmpfs.
fn small_disk(mountpoint: &Path, size: &str) -> (Running, PathBuf) {
    std::fs::create_dir_all(mountpoint).expect("mountpoint");
    let mut holder = Command::new("unshare");
    holder
        .args([
            "--user",
            "--map-root-user",
            "--mount",
            "--propagation",
            "private",
        ])
        .args(["sh", "-c"])
        .arg(
            r#"mount -t tmpfs -o "size=$1" gputel-test "$2" && echo mounted >&2 && exec sleep 600"#,
        )
        .args(["sh", size])
        .arg(mountpoint);
    let mut holder = Running::spawn(holder);
    holder.wait_for_log("mounted", Duration::from_secs(10));
    let seen = PathBuf::from(format!("/proc/{}/root", holder.pid())).join(
        mountpoint
            .strip_prefix("/")
            .expect("an absolute mountpoint"),
    );
    (holder, seen)
}

/// Fills the file system of `dir` with one file; returns its path.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).expect("create the filler");
    let chunk = vec![0u8; 64 * 1024];
    let mut size = chunk.len();
    while size >= 512 {
        match file.write_all(&chunk[..size]) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(28) => size /= 2, // ENOSPC
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
    path
}

/// A collector in `holder`'s mount namespace with its store and log on the
/// small disk mounted at `mounted`, flushing every `flush_interval`.
fn collector_on_disk(
    holder: &Running,
    mounted: &Path,
    flush_interval: &str,
    args: &[&str],
) -> Running {
    let mut collector = Command::new("nsenter");
    collector
        .args(["--target", &holder.pid().to_string()])
        .args(["--user", "--mount", "--preserve-credentials", "--"])
        .arg(collector_bin())
        .args([
            "--plaintext",
            "--listen",
            "127.0.0.1:0",
            "--flush-interval",
            flush_interval,
        ])
        .arg("--store")
        .arg(mounted.join("store"))
        .arg("--wal-dir")
        .arg(mounted.join("wal"))
        .args(args)
        .env("RUST_LOG", "info");
    Running::spawn(collector)
}

/// Lines of `log` that contain `needle`.
fn lines_with(log: &[String], needle: &str) -> usize {
    log.iter().filter(|l| l.contains(needle)).count()
}

/// The names of the log segment files in `wal`, sorted.
fn segment_files(wal: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(wal)
        .expect("read the log directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("wal-") && n.ends_with(".log"))
        .collect();
    names.sort();
    names
}

#[test]
fn a_full_disk_stops_acknowledgements_and_loses_nothing_when_space_returns() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (holder, disk) = small_disk(&tmp.path().join("disk"), "16m");
    let mounted = tmp.path().join("disk");

    // The watermark off: this is a disk something else fills to the last
    // byte, so the log's own writes fail (the watermark has its test below).
    let mut collector =
        collector_on_disk(&holder, &mounted, "300ms", &["--wal-min-free-bytes", "0"]);
    let addr = collector.listening_address();

    let mut agent = fixture_agent("gpu-node-031");
    agent
        .args([
            "--collector",
            &format!("http://{addr}"),
            "--interval",
            "100ms",
        ])
        .args(["--ticks", &TICKS.to_string(), "--drain-timeout", "60s"])
        .arg("--spool-dir")
        .arg(tmp.path().join("spool"));
    let agent = Running::spawn(agent);

    // Some rows get in while there is room.
    collector.wait_for_log("flushed", Duration::from_secs(30));
    let filler = fill(&disk);
    let refused = collector.wait_for_log("batch not taken in", Duration::from_secs(30));
    assert!(
        refused.contains("No space left on device"),
        "the refusal names the cause: {refused}"
    );
    // Full for a while: the agent spools what it samples meanwhile.
    std::thread::sleep(Duration::from_secs(2));
    std::fs::remove_file(&filler).expect("remove the filler");

    let out = agent.wait(Duration::from_secs(120));
    let summary = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(out.status.success(), "agent failed: {summary}");
    let field = |key| summary_field(&summary, key);
    assert_eq!(field("acknowledged"), TICKS.to_string(), "{summary}");
    assert_eq!(field("unacknowledged"), "0", "{summary}");
    assert_eq!(field("dropped"), "0", "{summary}");
    assert!(
        collector
            .terminate(Duration::from_secs(60))
            .status
            .success()
    );

    let store = disk.join("store");
    assert_gpu_rows_exactly_once(tmp.path(), &store, TICKS * 8);
    let scan = table_scan(&store, "node");
    assert_eq!(
        duckdb_value(
            tmp.path(),
            &format!("select count(distinct ts) from {scan}")
        ),
        json!(TICKS)
    );
    drop(holder);
}

/// Simulated agents streaming as fast as the collector takes their rows.
const LOAD_AGENTS: u64 = 2;
const LOAD_TICKS: u64 = 19_000;
const LOAD_GPUS: u64 = 8;

/// The collector's log and store share one small volume, and flushes only
/// when its log nears the watermark: the log fills the volume down to the
/// watermark again and again under load. Each time, batches are refused with
/// UNAVAILABLE (the agents keep them) and a flush starts, which has room to
/// write its Parquet files and release the log segments; then batches are
/// taken again, with nobody's help. Every row is stored once, no flush
/// fails, and the log holds one segment file per flush.
#[test]
fn a_log_that_fills_its_own_volume_refuses_batches_flushes_and_recovers_by_itself() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (holder, disk) = small_disk(&tmp.path().join("disk"), "32m");
    let mounted = tmp.path().join("disk");
    let mut collector = collector_on_disk(
        &holder,
        &mounted,
        // Flushes come from the watermark only.
        "1h",
        &[
            "--flush-rows",
            "100000000",
            "--max-unwritten-rows",
            "100000000",
            "--compact-interval",
            "0",
            // 12 MiB: a flush starts at 24 MiB of log, more than there is
            // room for, so the log meets the watermark first, every time.
            "--wal-min-free-bytes",
            "12582912",
        ],
    );
    let addr = collector.listening_address();
    let mut loadgen = Command::new(loadgen_bin());
    loadgen
        .args(["--collector", &format!("http://{addr}")])
        .args(["--agents", &LOAD_AGENTS.to_string()])
        .args(["--gpus", &LOAD_GPUS.to_string()])
        .args(["--ticks", &LOAD_TICKS.to_string(), "--window", "500"])
        .args(["--timeout", "100s"]);
    let loadgen = Running::spawn(loadgen);

    let refused = collector.wait_for_log("batch not taken in", Duration::from_secs(60));
    let first_refusal = Instant::now();
    assert!(
        refused.contains("(--wal-min-free-bytes) kept for writing Parquet"),
        "refused for the watermark, before the volume is full: {refused}"
    );
    let out = loadgen.wait(Duration::from_secs(120));
    let summary = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(out.status.success(), "loadgen: {summary}");
    let batches = LOAD_AGENTS * LOAD_TICKS;
    assert!(
        summary.contains(&format!(
            "batches={batches} acknowledged={batches} rejected=0 dropped=0"
        )),
        "{summary}"
    );
    let (stopped, log) = collector.terminate_with_log(Duration::from_secs(60));
    assert!(stopped.status.success(), "{}", log.join("\n"));
    let refusals = lines_with(&log, "batch not taken in");
    let flushes = lines_with(&log, "flushed files=");
    eprintln!("{refusals} refusal lines, {flushes} flushes");
    // One line per cause a minute, however many batches were refused (one
    // line per refused batch was dozens here).
    let most = 1 + first_refusal.elapsed().as_secs() / 60;
    assert!(
        (1..=most).contains(&(refusals as u64)),
        "{refusals} refusal lines, at most {most} expected:\n{}",
        log.join("\n")
    );

    assert_eq!(lines_with(&log, "flush failed"), 0);
    assert_eq!(lines_with(&log, "No space left on device"), 0);
    let store = disk.join("store");
    assert_gpu_rows_exactly_once(tmp.path(), &store, batches * LOAD_GPUS);
    // Each flush that wrote rows closed one segment, and names its files
    // after it: one segment more (the empty one being written) than flushes.
    let units = duckdb_value(
        tmp.path(),
        &format!(
            "select count(distinct regexp_extract(filename, '([^/]*)\\.parquet$', 1)) \
             from read_parquet('{}/gpu/*/*/*.parquet', filename = true)",
            store.display()
        ),
    )
    .as_u64()
    .expect("a count");
    assert!(
        units > 1,
        "the log filled the volume more than once: {units}"
    );
    assert_eq!(
        segment_files(&disk.join("wal")),
        [format!("wal-{:016}.log", units + 1)]
    );
    drop(holder);
}

/// A collector killed with rows in its log starts again on a volume that is
/// full to the last byte: it rewrites no state file and adds no segment, so
/// it serves (refusing batches with UNAVAILABLE, logging its failing flush
/// once), and once space returns it writes what its log held and what the
/// agent kept meanwhile, each row once.
#[test]
fn a_collector_starts_on_a_full_volume_and_catches_up_when_space_returns() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (holder, disk) = small_disk(&tmp.path().join("disk"), "16m");
    let mounted = tmp.path().join("disk");
    let run_agent = |addr: &str, spool: &str| {
        let mut agent = fixture_agent("gpu-node-032");
        agent
            .args(["--collector", &format!("http://{addr}")])
            .args([
                "--interval",
                "100ms",
                "--ticks",
                "20",
                "--drain-timeout",
                "60s",
            ])
            .arg("--spool-dir")
            .arg(tmp.path().join(spool));
        Running::spawn(agent)
    };
    let summary_of = |agent: Running| {
        let out = agent.wait(Duration::from_secs(90));
        let summary = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(out.status.success(), "agent failed: {summary}");
        assert_eq!(summary_field(&summary, "acknowledged"), "20", "{summary}");
        assert_eq!(summary_field(&summary, "unacknowledged"), "0", "{summary}");
    };

    // 20 ticks acknowledged, none flushed, then a crash.
    let mut first = collector_on_disk(&holder, &mounted, "1h", &[]);
    let addr = first.listening_address();
    summary_of(run_agent(&addr, "spool-1"));
    assert!(
        !first
            .signal("KILL", Duration::from_secs(10))
            .status
            .success()
    );
    let segments = segment_files(&disk.join("wal"));
    assert_eq!(segments, ["wal-0000000000000001.log"]);

    let filler = fill(&disk);
    let mut second = collector_on_disk(&holder, &mounted, "300ms", &[]);
    let addr = second.listening_address();
    // Said once at start, before any agent is refused.
    let short = second.find_log("already short of room", Duration::from_secs(1));
    assert!(short.contains("WARN"), "{short}");
    second.wait_for_log("flush failed", Duration::from_secs(30));
    let agent = run_agent(&addr, "spool-2");
    // Refused while the volume is full; the agent keeps its batches.
    let refused = second.wait_for_log("batch not taken in", Duration::from_secs(30));
    let first_refusal = Instant::now();
    // Full to the last page or two: the filler stops at the first refused
    // 512-byte write, and the collector may free a page (a temporary file)
    // after it; what matters is that the volume is under the room kept.
    let number_before = |marker: &str| -> u64 {
        let (head, _) = refused
            .split_once(marker)
            .unwrap_or_else(|| panic!("no {marker:?} in {refused}"));
        head.rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no number before {marker:?} in {refused}"))
    };
    let free = number_before(" bytes free, under the ");
    let kept = number_before(" (--wal-min-free-bytes)");
    assert!(free <= 8192 && free < kept, "{refused}");
    std::fs::remove_file(&filler).expect("remove the filler");
    summary_of(agent);
    let (stopped, log) = second.terminate_with_log(Duration::from_secs(60));
    assert!(stopped.status.success(), "{}", log.join("\n"));
    // One line while the flush failed, however often it was retried, and
    // one when it worked again.
    assert_eq!(lines_with(&log, "flush failed"), 1, "{}", log.join("\n"));
    assert_eq!(lines_with(&log, "flushing works again"), 1);
    // Refused batches: one line per cause a minute, with a count.
    let most = 1 + first_refusal.elapsed().as_secs() / 60;
    let refusals = lines_with(&log, "batch not taken in") as u64;
    assert!((1..=most).contains(&refusals), "{refusals} > {most}");

    let store = disk.join("store");
    assert_gpu_rows_exactly_once(tmp.path(), &store, 2 * 20 * 8);
    drop(holder);
}
