//! One damaged record in the middle of the collector's write-ahead log (four
//! bytes flipped in record 51 of 100 acknowledged batches, the collector
//! killed before it flushed) costs that record only: `wal check` names the
//! damage, and after a restart the other 99 batches are in Parquet, once.

use std::process::Command;
use std::time::Duration;

use gputel_runtime::framing;
use gputel_tests::{
    assert_gpu_rows_exactly_once, collector_bin, run_loadgen, start_collector, wal_dir_of,
};

const GPUS: u64 = 2;
const BATCHES: u64 = 100;

/// The one non-empty segment of the log in `dir`.
fn written_segment(dir: &std::path::Path) -> std::path::PathBuf {
    let mut written: Vec<_> = std::fs::read_dir(dir)
        .expect("list the log")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "log")
                && std::fs::metadata(p).is_ok_and(|m| m.len() > 0)
        })
        .collect();
    assert_eq!(written.len(), 1, "{written:?}");
    written.remove(0)
}

fn wal_check(wal: &std::path::Path) -> (Option<i32>, String) {
    let out = Command::new(collector_bin())
        .args(["wal", "check", "--wal-dir"])
        .arg(wal)
        .output()
        .expect("run gputel-collector wal check");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn a_record_damaged_mid_log_costs_only_itself() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = tmp.path().join("store");
    let (collector, addr) = start_collector(&store, &["--flush-interval", "1h"]);
    let summary = run_loadgen(
        &addr,
        "60s",
        &[
            "--agents",
            "1",
            "--gpus",
            &GPUS.to_string(),
            "--ticks",
            &BATCHES.to_string(),
            "--window",
            "1",
        ],
    );
    assert!(
        summary.contains(&format!("acknowledged={BATCHES} rejected=0")),
        "{summary}"
    );
    // Every batch is acknowledged, so durable in the log; none is flushed.
    assert!(
        !collector
            .signal("KILL", Duration::from_secs(10))
            .status
            .success()
    );

    let wal = wal_dir_of(&store);
    let segment = written_segment(&wal);
    let mut bytes = std::fs::read(&segment).expect("read the segment");
    let mut offsets = Vec::new();
    let mut at = 0;
    while let Some((_, used)) = framing::next_record(&bytes[at..]).expect("an intact log") {
        offsets.push(at);
        at += used;
    }
    assert_eq!(offsets.len() as u64, BATCHES, "one record per batch");
    let flip = offsets[50] + framing::HEADER_BYTES + 7;
    for b in &mut bytes[flip..flip + 4] {
        *b ^= 0xa5;
    }
    std::fs::write(&segment, &bytes).expect("damage the segment");

    let (code, report) = wal_check(&wal);
    assert_eq!(code, Some(1), "{report}");
    let name = segment.display().to_string();
    assert!(
        report.contains(&format!(
            "{name}: 99 records, {} bytes; damaged at byte {} ({} bytes: checksum mismatch), intact records follow",
            bytes.len(),
            offsets[50],
            offsets[51] - offsets[50]
        )),
        "{report}"
    );
    assert_eq!(
        std::fs::read(&segment).expect("reread"),
        bytes,
        "check changes nothing"
    );

    // Salvage does what a start does to the log, without serving.
    let out = Command::new(collector_bin())
        .args(["wal", "salvage", "--wal-dir"])
        .arg(&wal)
        .output()
        .expect("run gputel-collector wal salvage");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert_eq!(
        said.trim(),
        format!(
            "{}: 99 intact records kept for the collector to write; 1 damaged stretches \
             ({} bytes) copied to {}/quarantine/ and skipped; 0 torn bytes cut off",
            wal.display(),
            offsets[51] - offsets[50],
            wal.display()
        )
    );
    let (code, report) = wal_check(&wal);
    assert_eq!(code, Some(1), "the damage is still there to see: {report}");

    let (mut collector, _) = start_collector(&store, &["--flush-interval", "1h"]);
    collector.find_log("write-ahead log damaged", Duration::from_secs(30));
    assert!(
        collector
            .terminate(Duration::from_secs(60))
            .status
            .success()
    );
    assert_gpu_rows_exactly_once(tmp.path(), &store, (BATCHES - 1) * GPUS);

    // The replayed rows are stored and their segments released; the damaged
    // bytes are kept for whoever wants to look.
    let (code, report) = wal_check(&wal);
    assert_eq!(code, Some(0), "{report}");
    let kept = std::fs::read_dir(wal.join("quarantine"))
        .expect("a quarantine directory")
        .count();
    assert_eq!(kept, 1);
}
