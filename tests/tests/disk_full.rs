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
use std::time::Duration;

use gputel_tests::{
    Running, assert_gpu_rows_exactly_once, collector_bin, duckdb_value, fixture_agent,
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

#[test]
fn a_full_disk_stops_acknowledgements_and_loses_nothing_when_space_returns() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (holder, disk) = small_disk(&tmp.path().join("disk"), "16m");
    let mounted = tmp.path().join("disk");

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
            "300ms",
        ])
        .arg("--store")
        .arg(mounted.join("store"))
        .arg("--wal-dir")
        .arg(mounted.join("wal"))
        .env("RUST_LOG", "info");
    let mut collector = Running::spawn(collector);
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
