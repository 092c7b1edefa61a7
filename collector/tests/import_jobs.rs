//! `gputel-collector import-jobs`, run as users run it, on the sacct and Acme
//! traces under `tests/data/`: the exact rows read back from the Parquet
//! files, the skipped lines on stderr, UTC conversion, idempotent re-imports,
//! the files' layout, and the deduplicating view over overlapping dumps in
//! DuckDB.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, ArrayRef};
use arrow_schema::DataType;
use chrono::{DateTime, FixedOffset};
use gputel_collector::import::{Format, Trace};
use gputel_schemas::{JobTracePath, scheduler_job_schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::CompressionCodec;
use parquet::file::reader::FileReader;
use parquet::file::serialized_reader::SerializedFileReader;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn import(format: &str, file: &Path, store: &Path, offset: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gputel-collector"));
    cmd.args(["import-jobs", "--format", format])
        .arg(file)
        .arg("--store")
        .arg(store);
    if let Some(offset) = offset {
        cmd.arg(format!("--utc-offset={offset}"));
    }
    cmd.output().expect("run gputel-collector import-jobs")
}

/// Runs an import that must succeed; returns its stdout and stderr.
fn import_ok(format: &str, file: &Path, store: &Path, offset: Option<&str>) -> (String, String) {
    let out = import(format, file, store, offset);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "import failed: {}\n{stdout}{stderr}",
        out.status
    );
    (stdout, stderr)
}

/// Every file under `dir`, as `/`-separated paths relative to it.
fn files_under(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).expect("under root");
                let parts: Vec<_> = rel.iter().map(|p| p.to_string_lossy()).collect();
                out.push(parts.join("/"));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// One value as text; timestamps in RFC 3339, UTC.
fn cell(column: &ArrayRef, row: usize) -> String {
    if column.is_null(row) {
        return "null".into();
    }
    match column.data_type() {
        DataType::Dictionary(_, _) => {
            let dict = column.as_dictionary::<Int32Type>();
            let key = dict.keys().value(row) as usize;
            dict.values().as_string::<i32>().value(key).to_owned()
        }
        DataType::Timestamp(_, _) => {
            let us = column.as_primitive::<TimestampMicrosecondType>().value(row);
            DateTime::from_timestamp_micros(us)
                .expect("timestamp in range")
                .format("%Y-%m-%dT%H:%M:%SZ")
                .to_string()
        }
        DataType::Int64 => column.as_primitive::<Int64Type>().value(row).to_string(),
        DataType::Int32 => column.as_primitive::<Int32Type>().value(row).to_string(),
        DataType::Float64 => column.as_primitive::<Float64Type>().value(row).to_string(),
        other => panic!("unexpected column type {other}"),
    }
}

/// The rows of every `scheduler_job` file in the store, by file path: each
/// row its columns joined by `|`, `imported_at` left out (see [`imported_at`]).
fn rows(store: &Path) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for path in files_under(store) {
        let file = File::open(store.join(&path)).expect("open parquet file");
        let reader = ParquetRecordBatchReaderBuilder::try_new(file)
            .expect("parquet footer")
            .build()
            .expect("reader");
        let mut lines = Vec::new();
        for batch in reader {
            let batch = batch.expect("record batch");
            assert_eq!(batch.schema(), scheduler_job_schema(), "{path}");
            let last = batch.num_columns() - 1;
            assert_eq!(batch.schema().field(last).name(), "imported_at");
            for row in 0..batch.num_rows() {
                let values: Vec<String> = batch.columns()[..last]
                    .iter()
                    .map(|c| cell(c, row))
                    .collect();
                lines.push(values.join("|"));
            }
        }
        out.insert(path, lines);
    }
    out
}

/// The distinct `imported_at` values in the store, in microseconds.
fn imported_at(store: &Path) -> Vec<i64> {
    let mut out = Vec::new();
    for path in files_under(store) {
        let file = File::open(store.join(&path)).expect("open parquet file");
        for batch in ParquetRecordBatchReaderBuilder::try_new(file)
            .expect("parquet footer")
            .build()
            .expect("reader")
        {
            let batch = batch.expect("record batch");
            let column = batch
                .column_by_name("imported_at")
                .expect("imported_at column");
            assert_eq!(column.null_count(), 0);
            out.extend(column.as_primitive::<TimestampMicrosecondType>().values());
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// The stem shared by the files of one import, checked to be
/// `<format>-<32 hex digits>`.
fn stem_of(files: &[String], format: &str) -> String {
    let stems: Vec<String> = files
        .iter()
        .map(|f| {
            JobTracePath::parse(f)
                .unwrap_or_else(|e| panic!("{f}: {e}"))
                .stem()
                .to_owned()
        })
        .filter(|s| s.starts_with(&format!("{format}-")))
        .collect();
    let stem = stems.first().expect("a file of this format").clone();
    assert!(stems.iter().all(|s| *s == stem), "{stems:?}");
    let hash = &stem[format.len() + 1..];
    assert!(
        hash.len() == 32 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "{stem}"
    );
    stem
}

// job_id|source|user|queue|state|job_type|submit_time|start_time|end_time|
// queue_s|duration_s|nodes|gpus|cpus|node_list|gpu_time_s|fail_time|
// stop_time|mem_per_pod_gb|shared_mem_per_pod, sorted by submit_time then
// job_id. The cluster is at +08:00. Neither sacct nor Seren's layout (that
// of acme.csv) has the last four, Kalos' own columns.
const SACCT_2024_02: &[&str] = &[
    // Submitted 2024-03-01T03:00 local: February in UTC. No GPUs allocated.
    "4244+0|sacct|carol|debug|FAILED|null|2024-02-29T19:00:00Z|2024-02-29T19:00:05Z|2024-02-29T19:00:35Z|5|30|1|0|4|cpu-01|0|null|null|null|null",
];
const SACCT_2024_03: &[&str] = &[
    "4242|sacct|alice|gpu|COMPLETED|null|2024-03-01T02:00:00Z|2024-03-01T02:05:00Z|2024-03-01T04:05:00Z|300|7200|1|8|64|gpu-01|57600|null|null|null|null",
    "4245|sacct|alice|gpu|PENDING|null|2024-03-02T00:00:00Z|null|null|null|null|4|null|null|null|null|null|null|null|null",
    // gres/gpu:a100=4 and gres/gpu=4 are the same four GPUs.
    "4246|sacct|dave|gpu|RUNNING|null|2024-03-02T01:00:00Z|2024-03-02T01:00:10Z|null|10|null|1|4|32|gpu-04|null|null|null|null|null",
    "4251|sacct|heidi|gpu|PREEMPTED|null|2024-03-31T15:30:00Z|2024-03-31T15:40:00Z|2024-03-31T17:40:00Z|600|7200|1|8|64|gpu-07|57600|null|null|null|null",
    // Submitted 2024-04-01T05:00 local: still March in UTC. "CANCELLED by 1000".
    "4243_7|sacct|bob|gpu|CANCELLED|null|2024-03-31T21:00:00Z|2024-03-31T21:00:30Z|2024-03-31T21:30:30Z|30|1800|2|16|128|gpu-[02-03]|28800|null|null|null|null",
];
const SACCT_UNKNOWN: &[&str] = &[
    "4250|sacct|grace|gpu|NODE_FAIL|null|null|null|null|null|null|1|null|null|null|null|null|null|null|null",
];

const SACCT_SKIPPED: &[&str] = &[
    ":7: Submit: \"2024-13-01T00:00:00\" is not a date in the calendar",
    ":8: 6 fields where the header has 10",
    ":9: 4242.batch is a job step, not an allocation; run sacct with --allocations",
    ":10: AllocTRES gres/gpu \"two\" is not a count",
];

const ACME_2023_06: &[&str] = &[
    // 2023-07-01 07:59:30 at +08:00 is still June in UTC.
    "6104411|acme|u1a2b|null|COMPLETED|Pretrain|2023-06-30T23:59:30Z|2023-07-01T00:00:00Z|2023-07-01T12:00:00Z|30|43200|4|32|512|null|1382400|null|null|null|null",
];
const ACME_2023_07: &[&str] = &[
    // Written with +08:00 in the file.
    "6104412|acme|u3c4d|null|FAILED|SFT|2023-07-01T01:15:00Z|2023-07-01T01:15:12Z|2023-07-01T01:17:12Z|12|120|1|8|128|null|960|null|null|null|null",
    "6104413|acme|u5e6f|null|CANCELLED|Evaluation|2023-07-02T06:00:00Z|2023-07-02T06:20:00Z|2023-07-02T06:20:45Z|1200|45|1|1|16|null|45|null|null|null|null",
    "6104414|acme|u5e6f|null|COMPLETED|Other|2023-07-02T07:00:00Z|2023-07-02T07:00:01Z|2023-07-02T07:00:31Z|1|30|1|0|4|null|0|null|null|null|null",
    "6104415|acme|u7a8b|null|TIMEOUT|MLLM|2023-07-02T16:00:00Z|2023-07-02T16:05:00Z|2023-07-03T16:05:00Z|300|86400|2|16|256|null|1382400|null|null|null|null",
    // 1800.0, 5.0 and 14400.0 seconds.
    "6104416|acme|u1a2b|null|NODE_FAIL|Debug|2023-07-03T02:00:00Z|2023-07-03T02:00:05Z|2023-07-03T02:30:05Z|5|1800|1|8|128|null|14400|null|null|null|null",
    // Quoted fields.
    "6104420|acme|u2e3f|null|PREEMPTED|Evaluation|2023-07-05T04:00:00Z|2023-07-05T04:00:20Z|2023-07-05T04:10:20Z|20|600|1|4|64|null|2400|null|null|null|null",
    // Cancelled in the queue: no start, no end, no queue time.
    "6104421|acme|u2e3f|null|CANCELLED|SFT|2023-07-05T05:00:00Z|null|null|null|0|1|8|128|null|0|null|null|null|null",
];

const ACME_SKIPPED: &[&str] = &[
    ":8: gpu_num \"eight\" is not a count",
    ":9: 9 fields where the header has 13",
    ":10: job_id is empty",
    ":11: submit_time: \"2023-07-04 25:00:00\" is not a time of day",
];

fn expected_stderr(file: &Path, lines: &[&str]) -> String {
    lines
        .iter()
        .map(|l| format!("{}{l}\n", file.display()))
        .collect()
}

#[test]
fn sacct_rows_are_exact_and_in_utc() {
    let store = tempfile::tempdir().unwrap();
    let file = data("sacct.txt");
    let before = chrono::Utc::now().timestamp_micros();
    let (stdout, stderr) = import_ok("sacct", &file, store.path(), Some("+08:00"));
    let after = chrono::Utc::now().timestamp_micros();
    assert_eq!(
        stdout,
        format!(
            "imported 7 jobs from {} (4 lines skipped) into {}\n",
            file.display(),
            store.path().display()
        )
    );
    assert_eq!(stderr, expected_stderr(&file, SACCT_SKIPPED));

    let files = files_under(store.path());
    let stem = stem_of(&files, "sacct");
    let rows = rows(store.path());
    assert_eq!(
        rows,
        BTreeMap::from([
            (
                format!("scheduler_job/month=2024-02/{stem}.parquet"),
                strings(SACCT_2024_02)
            ),
            (
                format!("scheduler_job/month=2024-03/{stem}.parquet"),
                strings(SACCT_2024_03)
            ),
            (
                format!("scheduler_job/month=unknown/{stem}.parquet"),
                strings(SACCT_UNKNOWN)
            ),
        ])
    );
    let imported = imported_at(store.path());
    assert_eq!(imported.len(), 1, "one import, one imported_at");
    assert!((before..=after).contains(&imported[0]), "{imported:?}");
}

#[test]
fn acme_rows_are_exact_and_in_utc() {
    let store = tempfile::tempdir().unwrap();
    let file = data("acme.csv");
    let (stdout, stderr) = import_ok("acme", &file, store.path(), Some("+08:00"));
    assert_eq!(
        stdout,
        format!(
            "imported 8 jobs from {} (4 lines skipped) into {}\n",
            file.display(),
            store.path().display()
        )
    );
    assert_eq!(stderr, expected_stderr(&file, ACME_SKIPPED));
    let stem = stem_of(&files_under(store.path()), "acme");
    assert_eq!(
        rows(store.path()),
        BTreeMap::from([
            (
                format!("scheduler_job/month=2023-06/{stem}.parquet"),
                strings(ACME_2023_06)
            ),
            (
                format!("scheduler_job/month=2023-07/{stem}.parquet"),
                strings(ACME_2023_07)
            ),
        ])
    );
}

/// The published examples of the AcmeTrace files (tests/fixtures/acme-trace,
/// from the AcmeTrace README; origin and licence in tests/fixtures/README.md).
fn acme_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/acme-trace")
        .join(name)
}

#[test]
fn the_published_layouts_keep_every_column() {
    let store = tempfile::tempdir().unwrap();
    // Both files name their zone: the offset given here changes nothing.
    for name in ["trace_seren.csv", "trace_kalos.csv"] {
        let (stdout, stderr) = import_ok("acme", &acme_fixture(name), store.path(), Some("+08:00"));
        assert!(stdout.starts_with("imported 2 jobs"), "{stdout}");
        assert_eq!(stderr, "");
    }
    let rows: Vec<String> = rows(store.path()).into_values().flatten().collect();
    assert_eq!(
        rows,
        [
            // Seren: 2023-03-01 00:18:22+08:00 is February in UTC. No Kalos columns.
            "5778432|acme|u5907|null|FAILED|Other|2023-02-28T16:18:22Z|2023-02-28T16:18:54Z|2023-02-28T16:20:51Z|32|117|1|8|128|null|936|null|null|null|null",
            "5778469|acme|u5907|null|COMPLETED|Other|2023-02-28T16:23:58Z|2023-02-28T16:24:11Z|2023-02-28T17:09:04Z|13|2693|1|8|128|null|21544|null|null|null|null",
            // Kalos: the failed job's fail_time, the cancelled one's stop_time,
            // 1000 GB and 100 of shared memory per pod. The trace's own
            // duration is kept: 18 s, where end - start is 8 s.
            "dlctk696s0jbvitv|acme|uf794|null|FAILED|Other|2023-05-17T11:00:58Z|2023-05-17T11:01:08Z|2023-05-17T11:01:16Z|10|18|8|64|960|null|1152|2023-05-17T11:01:16Z|null|1000|100",
            "dlc1t2ypl09b8qtp|acme|uf794|null|CANCELLED|Other|2023-05-17T11:28:42Z|2023-05-17T11:28:54Z|2023-05-17T11:30:04Z|12|82|8|64|960|null|5248|null|2023-05-17T11:30:04Z|1000|100",
        ]
    );
}

#[test]
fn the_utc_offset_applies_only_to_times_without_a_zone() {
    let store = tempfile::tempdir().unwrap();
    import_ok("acme", &data("acme.csv"), store.path(), None);
    import_ok("sacct", &data("sacct.txt"), store.path(), Some("-05:00"));
    let rows: Vec<String> = rows(store.path()).into_values().flatten().collect();
    let submit = |job: &str| {
        let row = rows
            .iter()
            .find(|r| r.starts_with(&format!("{job}|")))
            .unwrap_or_else(|| panic!("no job {job}"));
        row.split('|').nth(6).expect("submit_time").to_owned()
    };
    // Without --utc-offset the cluster's times are UTC...
    assert_eq!(submit("6104411"), "2023-07-01T07:59:30Z");
    // ...but a time that names its zone keeps it.
    assert_eq!(submit("6104412"), "2023-07-01T01:15:00Z");
    // -05:00: five hours later in UTC.
    assert_eq!(submit("4242"), "2024-03-01T15:00:00Z");
    assert_eq!(submit("4243_7"), "2024-04-01T10:00:00Z");
    let files = files_under(store.path());
    assert!(
        files
            .iter()
            .any(|f| f.starts_with("scheduler_job/month=2024-04/sacct-")),
        "{files:?}"
    );
}

#[test]
fn importing_the_same_files_again_changes_no_rows() {
    let store = tempfile::tempdir().unwrap();
    let sacct = data("sacct.txt");
    let acme = data("acme.csv");
    import_ok("sacct", &sacct, store.path(), Some("+08:00"));
    import_ok("acme", &acme, store.path(), Some("+08:00"));
    let files = files_under(store.path());
    let first = rows(store.path());
    assert_eq!(files.len(), 5, "{files:?}");
    assert_eq!(first.values().map(Vec::len).sum::<usize>(), 7 + 8);
    let first_import = imported_at(store.path());

    let (stdout, _) = import_ok("sacct", &sacct, store.path(), Some("+08:00"));
    assert!(stdout.starts_with("imported 7 jobs"), "{stdout}");
    let (stdout, _) = import_ok("acme", &acme, store.path(), Some("+08:00"));
    assert!(stdout.starts_with("imported 8 jobs"), "{stdout}");
    assert_eq!(files_under(store.path()), files);
    assert_eq!(rows(store.path()), first);
    // The files were rewritten, not left alone.
    let second_import = imported_at(store.path());
    assert_eq!(second_import.len(), 2, "{second_import:?}");
    assert!(second_import[0] > *first_import.last().expect("an import"));

    // The same bytes read with another offset are other rows: other files.
    import_ok("sacct", &sacct, store.path(), Some("+09:00"));
    assert_eq!(files_under(store.path()).len(), files.len() + 3);
}

#[test]
fn files_are_zstd_with_sorted_rows_and_a_bloom_filter_on_job_id() {
    let store = tempfile::tempdir().unwrap();
    import_ok("sacct", &data("sacct.txt"), store.path(), Some("+08:00"));
    let path = files_under(store.path())
        .into_iter()
        .find(|f| f.contains("month=2024-03"))
        .expect("a March file");
    let reader = SerializedFileReader::new(File::open(store.path().join(path)).unwrap()).unwrap();
    let meta = reader.metadata();
    assert_eq!(meta.file_metadata().num_rows(), 5);
    let group = meta.row_group(0);
    let schema = scheduler_job_schema();
    let submit = schema.index_of("submit_time").unwrap();
    let job_id = schema.index_of("job_id").unwrap();
    let sorting: Vec<_> = group
        .sorting_columns()
        .expect("sorting columns")
        .iter()
        .map(|s| s.column_idx as usize)
        .collect();
    assert_eq!(sorting, [submit, job_id]);
    for column in group.columns() {
        assert_eq!(
            column.compression_codec(),
            CompressionCodec::ZSTD,
            "{}",
            column.column_path()
        );
        let bloom = column.bloom_filter_offset().is_some();
        assert_eq!(
            bloom,
            column.column_path().string() == "job_id",
            "bloom filter on {}",
            column.column_path()
        );
    }
}

#[test]
fn a_wrong_header_or_an_unreadable_file_fails_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");

    // Acme's CSV given as sacct output.
    let file = data("acme.csv");
    let out = import("sacct", &file, &store, None);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}:1: the header lacks JobID, User, Partition, State, Submit, Start, End, NNodes, AllocTRES, NodeList; expected the output of sacct --parsable2 --allocations",
            file.display()
        )),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());

    let out = import("acme", &data("sacct.txt"), &store, None);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("sacct.txt:1: the header lacks"), "{stderr}");

    let missing = dir.path().join("no-such-trace.txt");
    let out = import("sacct", &missing, &store, None);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot read the job trace {}", missing.display())),
        "{stderr}"
    );

    // Every line bad: each is listed, and the import fails.
    let bad = dir.path().join("bad.txt");
    std::fs::write(
        &bad,
        "JobID|User|Partition|State|Submit|Start|End|NNodes|AllocTRES|NodeList\n1|a\n2|b\n",
    )
    .unwrap();
    let out = import("sacct", &bad, &store, None);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let shown = bad.display();
    assert!(
        stderr.starts_with(&format!(
            "{shown}:2: 2 fields where the header has 10\n{shown}:3: 2 fields where the header has 10\n"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "no job imported from {shown}: all 2 of its lines were skipped"
        )),
        "{stderr}"
    );
    assert_eq!(files_under(&store), Vec::<String>::new());

    // A header and no jobs is an empty trace, not an error.
    let empty = dir.path().join("empty.txt");
    std::fs::write(
        &empty,
        "JobID|User|Partition|State|Submit|Start|End|NNodes|AllocTRES|NodeList\n",
    )
    .unwrap();
    let (stdout, _) = import_ok("sacct", &empty, &store, None);
    assert!(stdout.starts_with("imported 0 jobs"), "{stdout}");
    assert_eq!(files_under(&store), Vec::<String>::new());
}

/// The DuckDB CLI: `$GPUTEL_DUCKDB`, else `duckdb` on PATH.
fn duckdb(dir: &Path, sql: &str) -> String {
    let bin = std::env::var_os("GPUTEL_DUCKDB").unwrap_or_else(|| "duckdb".into());
    let out = Command::new(&bin)
        .current_dir(dir)
        .args(["-csv", "-noheader", "-c", sql])
        .output()
        .unwrap_or_else(|e| {
            panic!("the DuckDB CLI ({bin:?}) cannot run ({e}): scripts/test installs it (pip install duckdb-cli)")
        });
    assert!(
        out.status.success(),
        "duckdb failed on {sql:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What the `scheduler_job` view in `schemas/sql/` does: of the rows of
/// overlapping dumps, the latest import's row per (source, job_id).
const LATEST_PER_JOB: &str = "select * exclude (rn) from (
    select *, row_number() over (
        partition by source, job_id order by imported_at desc, filename desc) as rn
    from read_parquet('scheduler_job/**/*.parquet', hive_partitioning = true, filename = true))
  where rn = 1";

#[test]
fn duckdb_reads_the_layout_and_the_latest_dump_wins() {
    let store = tempfile::tempdir().unwrap();
    import_ok("sacct", &data("sacct.txt"), store.path(), Some("+08:00"));
    import_ok("acme", &data("acme.csv"), store.path(), Some("+08:00"));
    // A later dump: 4246 has finished, 4252 is new.
    import_ok(
        "sacct",
        &data("sacct-later.txt"),
        store.path(),
        Some("+08:00"),
    );
    let scan = "read_parquet('scheduler_job/**/*.parquet', hive_partitioning = true)";
    assert_eq!(
        duckdb(
            store.path(),
            &format!("select source, month, count(*) from {scan} group by all order by all")
        ),
        "acme,2023-06,1\nacme,2023-07,7\nsacct,2024-02,1\nsacct,2024-03,7\nsacct,unknown,1\n"
    );
    assert_eq!(
        duckdb(
            store.path(),
            &format!(
                "select typeof(month), typeof(submit_time), typeof(gpus), typeof(gpu_time_s), \
                        typeof(fail_time), typeof(mem_per_pod_gb) \
                 from {scan} limit 1"
            )
        ),
        "VARCHAR,TIMESTAMP WITH TIME ZONE,INTEGER,BIGINT,TIMESTAMP WITH TIME ZONE,DOUBLE\n"
    );
    assert_eq!(
        duckdb(
            store.path(),
            &format!(
                "set timezone = 'UTC'; select job_id, state, end_time, duration_s, gpu_time_s \
                 from ({LATEST_PER_JOB}) where source = 'sacct' and job_id in ('4242', '4246', '4252') \
                 order by job_id"
            )
        ),
        "4242,COMPLETED,2024-03-01 04:05:00+00,7200,57600\n\
         4246,COMPLETED,2024-03-02 13:00:10+00,43200,172800\n\
         4252,RUNNING,NULL,NULL,NULL\n"
    );
    assert_eq!(
        duckdb(
            store.path(),
            &format!("select source, count(*) from ({LATEST_PER_JOB}) group by all order by all")
        ),
        "acme,8\nsacct,8\n"
    );
}

#[test]
fn no_input_makes_the_parsers_panic() {
    let utc = FixedOffset::east_opt(0).unwrap();
    for (format, path) in [
        (Format::Sacct, data("sacct.txt")),
        (Format::Acme, data("acme.csv")),
        (Format::Acme, acme_fixture("trace_kalos.csv")),
    ] {
        let original = std::fs::read(path).unwrap();
        // Every prefix: truncated files.
        for len in 0..=original.len() {
            let _ = Trace::parse(format, &original[..len], utc);
        }
        // Every byte replaced by each character that means something to a parser.
        for at in 0..original.len() {
            for byte in [
                b'|', b',', b'"', b'\n', b'\r', b' ', b'.', b'+', b'-', b'9', 0xff, 0,
            ] {
                let mut bytes = original.clone();
                bytes[at] = byte;
                let _ = Trace::parse(format, &bytes, utc);
            }
        }
    }
}

fn strings(rows: &[&str]) -> Vec<String> {
    rows.iter().map(|r| (*r).to_owned()).collect()
}
