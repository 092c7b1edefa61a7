//! `gputel-collector import-jobs`: reads a scheduler's job trace (sacct
//! output, or a CSV in the Acme trace layout) and writes it to the
//! `scheduler_job` table, next to the telemetry, so that GPU rows join to job
//! type, user and final state.
//!
//! One file per submit month, `scheduler_job/month=YYYY-MM/<format>-<hash>.parquet`,
//! whose name derives from a hash of the input bytes, the format and the UTC
//! offset: importing the same trace again replaces its own files instead of
//! adding rows. Overlapping different dumps are told apart by `imported_at`;
//! the `scheduler_job` view keeps the latest row per (source, job_id).
//!
//! A line that cannot be read is reported with its number and skipped; the
//! rest is imported. Nothing in a trace can make the import panic.

mod acme;
mod sacct;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{
    Float64Builder, Int32Builder, Int64Builder, StringDictionaryBuilder,
    TimestampMicrosecondBuilder,
};
use arrow_array::types::Int32Type;
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::ArrowError;
use chrono::{Datelike, FixedOffset, NaiveDate, TimeZone};
use gputel_schemas::scheduler_job::{self, JobTracePath, Month};
use object_store::ObjectStore;

use crate::persist::{self, PersistError};

/// A job trace's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Format {
    /// sacct --parsable2 --allocations output (JobID, User, Partition, State, Submit, Start,
    /// End, NNodes, AllocTRES, NodeList)
    Sacct,
    /// A CSV with the Acme trace's columns
    Acme,
}

impl Format {
    /// The format's name: the `source` column's value and the files' prefix.
    pub fn name(self) -> &'static str {
        match self {
            Format::Sacct => "sacct",
            Format::Acme => "acme",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One job of a trace: a `scheduler_job` row without `source` and `imported_at`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Job {
    pub job_id: String,
    pub user: Option<String>,
    pub queue: Option<String>,
    pub state: Option<String>,
    pub job_type: Option<String>,
    pub submit_us: Option<i64>,
    pub start_us: Option<i64>,
    pub end_us: Option<i64>,
    pub queue_s: Option<i64>,
    pub duration_s: Option<i64>,
    pub nodes: Option<i32>,
    pub gpus: Option<i32>,
    pub cpus: Option<i32>,
    pub node_list: Option<String>,
    pub gpu_time_s: Option<i64>,
    /// Kalos' `fail_time`: when the failure occurred.
    pub fail_us: Option<i64>,
    /// Kalos' `stop_time`: when the job was stopped.
    pub stop_us: Option<i64>,
    /// Kalos' `mem_per_pod_GB`: the memory configured for each pod, GB.
    pub mem_per_pod_gb: Option<f64>,
    /// Kalos' `shared_mem_per_pod`: the shared memory configured for each
    /// pod, in the trace's unit (its README names none).
    pub shared_mem_per_pod: Option<f64>,
}

/// A line that was not imported, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// 1-based line number in the file.
    pub line: u64,
    pub reason: String,
}

/// The header is missing, unreadable or lacks a required column: nothing in
/// the file can be imported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderError {
    pub line: u64,
    pub problem: String,
}

/// Why a trace could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read the job trace {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{}: {}", path.display(), error.line, error.problem)]
    Header { path: PathBuf, error: HeaderError },
    #[error("cannot assemble the rows of {path}: {source}")]
    Assemble {
        path: String,
        #[source]
        source: ArrowError,
    },
    #[error(transparent)]
    Persist(#[from] PersistError),
}

/// A parsed trace: its jobs, one per job id, and the lines it skipped.
#[derive(Debug, Clone)]
pub struct Trace {
    pub format: Format,
    pub utc_offset: FixedOffset,
    /// In file order; where a job id appears more than once, its last line wins.
    pub jobs: Vec<Job>,
    /// In line order.
    pub skipped: Vec<Skipped>,
    /// Records read after the header, blank lines not counted.
    pub records: usize,
    /// Identifies the input: bytes, format and offset.
    digest: u128,
}

impl Trace {
    /// Parses a whole trace. `utc_offset` applies to times written without a
    /// zone. Fails only when the header is missing or wrong.
    pub fn parse(
        format: Format,
        bytes: &[u8],
        utc_offset: FixedOffset,
    ) -> Result<Trace, HeaderError> {
        let text = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
        let mut rows = Rows::default();
        match format {
            Format::Sacct => sacct::parse(text, utc_offset, &mut rows)?,
            Format::Acme => acme::parse(text, utc_offset, &mut rows)?,
        }
        let mut skipped = rows.skipped;
        skipped.sort_by_key(|s| s.line);
        Ok(Trace {
            format,
            utc_offset,
            jobs: rows.jobs.into_iter().map(|(_, job)| job).collect(),
            skipped,
            records: rows.records,
            digest: digest(format, utc_offset, bytes),
        })
    }

    /// The stem of this trace's files: the format and 128 bits of a stable
    /// hash of the input bytes, the format and the UTC offset.
    pub fn stem(&self) -> String {
        format!("{}-{:032x}", self.format.name(), self.digest)
    }
}

/// xxHash3 (128 bits) of the input, then of that digest with the settings
/// that change the rows. xxHash3's output is fixed by its specification, so a
/// file keeps its name across builds and machines.
fn digest(format: Format, utc_offset: FixedOffset, bytes: &[u8]) -> u128 {
    use twox_hash::xxhash3_128::Hasher;
    let content = Hasher::oneshot(bytes);
    let mut key = format!("gputel scheduler_job\0{format}\0{utc_offset}\0").into_bytes();
    key.extend_from_slice(&content.to_le_bytes());
    Hasher::oneshot(&key)
}

/// Jobs as they are parsed, one per job id.
#[derive(Debug, Default)]
struct Rows {
    jobs: Vec<(u64, Job)>,
    by_id: HashMap<String, usize>,
    skipped: Vec<Skipped>,
    records: usize,
}

impl Rows {
    /// Takes the outcome of one record on `line`.
    fn push(&mut self, line: u64, job: Result<Job, String>) {
        self.records += 1;
        let job = match job {
            Ok(job) => job,
            Err(reason) => {
                self.skipped.push(Skipped { line, reason });
                return;
            }
        };
        match self.by_id.get(&job.job_id) {
            Some(&i) => {
                let (earlier, _) = self.jobs[i];
                self.skipped.push(Skipped {
                    line: earlier,
                    reason: format!(
                        "job {} is listed again on line {line}; the later line is kept",
                        job.job_id
                    ),
                });
                self.jobs[i] = (line, job);
            }
            None => {
                self.by_id.insert(job.job_id.clone(), self.jobs.len());
                self.jobs.push((line, job));
            }
        }
    }
}

/// Finds each of `required` in `header`, ignoring ASCII case; other columns
/// are allowed and ignored.
fn locate<const N: usize>(header: &[&str], required: &[&str; N]) -> Result<[usize; N], String> {
    let mut found = [0; N];
    let mut missing = Vec::new();
    for (slot, name) in found.iter_mut().zip(required) {
        let mut at = header
            .iter()
            .enumerate()
            .filter(|(_, h)| h.eq_ignore_ascii_case(name))
            .map(|(i, _)| i);
        match (at.next(), at.next()) {
            (Some(i), None) => *slot = i,
            (None, _) => missing.push(*name),
            (Some(_), Some(_)) => return Err(format!("the header names column {name} twice")),
        }
    }
    if missing.is_empty() {
        Ok(found)
    } else {
        Err(format!("the header lacks {}", missing.join(", ")))
    }
}

/// Finds each of `optional` in `header`, ignoring ASCII case, where it is
/// there at all: columns one layout of a format has and another lacks.
fn locate_optional<const N: usize>(
    header: &[&str],
    optional: &[&str; N],
) -> Result<[Option<usize>; N], String> {
    let mut found = [None; N];
    for (slot, name) in found.iter_mut().zip(optional) {
        let mut at = header
            .iter()
            .enumerate()
            .filter(|(_, h)| h.eq_ignore_ascii_case(name))
            .map(|(i, _)| i);
        *slot = at.next();
        if slot.is_some() && at.next().is_some() {
            return Err(format!("the header names column {name} twice"));
        }
    }
    Ok(found)
}

/// A text value; empty means null.
fn text(value: &str) -> Option<String> {
    let value = value.trim();
    (!value.is_empty()).then(|| value.to_owned())
}

/// A job state: its first word in capitals (`CANCELLED by 1000` →
/// `CANCELLED`); empty means null.
pub fn parse_state(value: &str) -> Result<Option<String>, String> {
    let Some(word) = value.split_whitespace().next() else {
        return Ok(None);
    };
    let state = word.to_ascii_uppercase();
    if state.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') {
        Ok(Some(state))
    } else {
        Err(format!(
            "state {value:?} is not a job state such as COMPLETED"
        ))
    }
}

/// A UTC offset, `+HH:MM` or `-HH:MM` (`+08:00` for China Standard Time);
/// `Z` is `+00:00`.
pub fn parse_utc_offset(value: &str) -> Result<FixedOffset, String> {
    let bad = || format!("UTC offset {value:?} is not +HH:MM or -HH:MM, e.g. +08:00");
    if value == "Z" {
        return FixedOffset::east_opt(0).ok_or_else(bad);
    }
    let b = value.as_bytes();
    let sign = match b.first() {
        Some(b'+') => 1,
        Some(b'-') => -1,
        _ => return Err(bad()),
    };
    let digits = |r: std::ops::Range<usize>| {
        b.get(r.clone())
            .filter(|d| d.iter().all(u8::is_ascii_digit))
            .and_then(|_| value.get(r)?.parse::<i32>().ok())
    };
    let (hours, minutes) = match b.len() {
        6 if b[3] == b':' => (digits(1..3), digits(4..6)),
        5 => (digits(1..3), digits(3..5)),
        3 => (digits(1..3), Some(0)),
        _ => (None, None),
    };
    match (hours, minutes) {
        (Some(h), Some(m)) if h < 24 && m < 60 => {
            FixedOffset::east_opt(sign * (h * 3600 + m * 60)).ok_or_else(bad)
        }
        _ => Err(bad()),
    }
}

/// A time `YYYY-MM-DDTHH:MM:SS` (or with a space for the `T`), optionally
/// with a fraction of a second and a zone (`Z`, `+08:00`); `utc_offset`
/// applies when there is no zone. Empty, `Unknown` and `None` mean null.
/// Returns microseconds since the Unix epoch, in UTC years 0000-9999.
pub fn parse_time(value: &str, utc_offset: FixedOffset) -> Result<Option<i64>, String> {
    let value = value.trim();
    if value.is_empty() || value == "Unknown" || value == "None" {
        return Ok(None);
    }
    let bad = || format!("{value:?} is not a time like 2024-03-01T10:00:00");
    let b = value.as_bytes();
    let shape = b.len() >= 19
        && [4, 7].iter().all(|&i| b[i] == b'-')
        && (b[10] == b'T' || b[10] == b' ')
        && [13, 16].iter().all(|&i| b[i] == b':')
        && [0, 1, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18]
            .iter()
            .all(|&i| b[i].is_ascii_digit());
    if !shape {
        return Err(bad());
    }
    // Every byte checked above is ASCII, so these slices are on char boundaries.
    let num = |r: std::ops::Range<usize>| value[r].parse::<u32>().map_err(|_| bad());
    let date = NaiveDate::from_ymd_opt(num(0..4)? as i32, num(5..7)?, num(8..10)?)
        .ok_or_else(|| format!("{value:?} is not a date in the calendar"))?;
    let naive = date
        .and_hms_opt(num(11..13)?, num(14..16)?, num(17..19)?)
        .ok_or_else(|| format!("{value:?} is not a time of day"))?;
    let mut rest = &value[19..];
    let mut micros = 0_i64;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 9 {
            return Err(bad());
        }
        for (i, d) in fraction.bytes().take(6).enumerate().take(digits) {
            micros += i64::from(d - b'0') * 10_i64.pow(5 - i as u32);
        }
        rest = &fraction[digits..];
    }
    let offset = match rest {
        "" => utc_offset,
        zone => parse_utc_offset(zone).map_err(|_| bad())?,
    };
    let time = offset
        .from_local_datetime(&naive)
        .single()
        .ok_or_else(bad)?;
    // Partitions have four-digit years.
    if !(0..=9999).contains(&time.naive_utc().year()) {
        return Err(format!("{value:?} is outside the years 0000-9999 in UTC"));
    }
    Ok(Some(time.timestamp_micros() + micros))
}

/// A count (nodes, GPUs, CPUs): a whole number, `8` or `8.0`; empty means null.
fn parse_count(column: &str, value: &str) -> Result<Option<i32>, String> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    let bad = || format!("{column} {value:?} is not a count");
    let n = match value.parse::<i64>() {
        Ok(n) => n,
        Err(_) => {
            let f: f64 = value.parse().map_err(|_| bad())?;
            if f.fract() != 0.0 || !(0.0..=f64::from(i32::MAX)).contains(&f) {
                return Err(bad());
            }
            f as i64
        }
    };
    i32::try_from(n)
        .ok()
        .filter(|n| *n >= 0)
        .map(Some)
        .ok_or_else(bad)
}

/// Seconds: a number, rounded to whole seconds; empty means null.
fn parse_seconds(column: &str, value: &str) -> Result<Option<i64>, String> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    let bad = || format!("{column} {value:?} is not a number of seconds");
    if let Ok(n) = value.parse::<i64>() {
        return if n >= 0 { Ok(Some(n)) } else { Err(bad()) };
    }
    let f: f64 = value.parse().map_err(|_| bad())?;
    // 9e18 s is far beyond any trace and still fits an i64.
    if f.is_finite() && (0.0..9e18).contains(&f) {
        Ok(Some(f.round() as i64))
    } else {
        Err(bad())
    }
}

/// A non-negative quantity such as a memory size (`1000`, `100.0`); empty
/// means null.
fn parse_amount(column: &str, value: &str) -> Result<Option<f64>, String> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    match value.parse::<f64>() {
        Ok(f) if f.is_finite() && f >= 0.0 => Ok(Some(f)),
        _ => Err(format!("{column} {value:?} is not a non-negative number")),
    }
}

/// Whole seconds from `from` to `to`, when both are known and in order.
fn span_s(from_us: Option<i64>, to_us: Option<i64>) -> Option<i64> {
    let span = to_us?.checked_sub(from_us?)?;
    (span >= 0).then_some(span / 1_000_000)
}

/// GPU seconds of a job that ran `duration_s` on `gpus` GPUs.
fn gpu_time_s(duration_s: Option<i64>, gpus: Option<i32>) -> Option<i64> {
    duration_s?.checked_mul(i64::from(gpus?))
}

/// Reads and parses a trace file.
pub fn read_trace(
    path: &Path,
    format: Format,
    utc_offset: FixedOffset,
) -> Result<Trace, ImportError> {
    let bytes = std::fs::read(path).map_err(|source| ImportError::Read {
        path: path.to_owned(),
        source,
    })?;
    Trace::parse(format, &bytes, utc_offset).map_err(|error| ImportError::Header {
        path: path.to_owned(),
        error,
    })
}

/// Writes a trace's jobs, one file per submit month; returns the files.
/// Each file appears whole or not at all, and replaces a file of the same
/// name, which only an import of the same trace can have written.
pub async fn write_trace(
    store: &dyn ObjectStore,
    trace: &Trace,
    imported_at_us: i64,
) -> Result<Vec<JobTracePath>, ImportError> {
    let stem = trace.stem();
    let mut months: BTreeMap<Option<Month>, Vec<&Job>> = BTreeMap::new();
    for job in &trace.jobs {
        // Parsed times are within years 0000-9999, which all have a month.
        let month = job.submit_us.and_then(|us| Month::from_ts_us(us).ok());
        months.entry(month).or_default().push(job);
    }
    let schema = scheduler_job::scheduler_job_schema();
    let mut written = Vec::with_capacity(months.len());
    for (month, mut jobs) in months {
        // The stem is the format's name, a dash and hex digits.
        let path = JobTracePath::new(month, &stem).expect("valid file stem");
        jobs.sort_by(|a, b| (a.submit_us, &a.job_id).cmp(&(b.submit_us, &b.job_id)));
        let batch = to_batch(&jobs, trace.format, imported_at_us).map_err(|source| {
            ImportError::Assemble {
                path: path.to_string(),
                source,
            }
        })?;
        let props = persist::properties(
            &schema,
            scheduler_job::SORT_KEY,
            scheduler_job::BLOOM_FILTER_COLUMNS,
        );
        let bytes = persist::encode_with(Arc::clone(&schema), props, &batch).map_err(|source| {
            PersistError::Encode {
                path: path.to_string(),
                source,
            }
        })?;
        persist::put_file(store, path.to_string(), bytes).await?;
        written.push(path);
    }
    Ok(written)
}

/// The `scheduler_job` columns of `jobs`, in schema order.
fn to_batch(jobs: &[&Job], format: Format, imported_at_us: i64) -> Result<RecordBatch, ArrowError> {
    type Dict = StringDictionaryBuilder<Int32Type>;
    let ts = || TimestampMicrosecondBuilder::with_capacity(jobs.len()).with_timezone("UTC");
    let (mut job_id, mut source, mut user, mut queue, mut state, mut job_type, mut node_list) = (
        Dict::new(),
        Dict::new(),
        Dict::new(),
        Dict::new(),
        Dict::new(),
        Dict::new(),
        Dict::new(),
    );
    let (mut submit, mut start, mut end, mut imported_at) = (ts(), ts(), ts(), ts());
    let mut queue_s = Int64Builder::with_capacity(jobs.len());
    let mut duration_s = Int64Builder::with_capacity(jobs.len());
    let mut gpu_time_s = Int64Builder::with_capacity(jobs.len());
    let mut nodes = Int32Builder::with_capacity(jobs.len());
    let mut gpus = Int32Builder::with_capacity(jobs.len());
    let mut cpus = Int32Builder::with_capacity(jobs.len());
    let (mut fail, mut stop) = (ts(), ts());
    let mut mem_per_pod_gb = Float64Builder::with_capacity(jobs.len());
    let mut shared_mem_per_pod = Float64Builder::with_capacity(jobs.len());
    for job in jobs {
        job_id.append_value(&job.job_id);
        source.append_value(format.name());
        user.append_option(job.user.as_deref());
        queue.append_option(job.queue.as_deref());
        state.append_option(job.state.as_deref());
        job_type.append_option(job.job_type.as_deref());
        submit.append_option(job.submit_us);
        start.append_option(job.start_us);
        end.append_option(job.end_us);
        queue_s.append_option(job.queue_s);
        duration_s.append_option(job.duration_s);
        nodes.append_option(job.nodes);
        gpus.append_option(job.gpus);
        cpus.append_option(job.cpus);
        node_list.append_option(job.node_list.as_deref());
        gpu_time_s.append_option(job.gpu_time_s);
        fail.append_option(job.fail_us);
        stop.append_option(job.stop_us);
        mem_per_pod_gb.append_option(job.mem_per_pod_gb);
        shared_mem_per_pod.append_option(job.shared_mem_per_pod);
        imported_at.append_value(imported_at_us);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(job_id.finish()),
        Arc::new(source.finish()),
        Arc::new(user.finish()),
        Arc::new(queue.finish()),
        Arc::new(state.finish()),
        Arc::new(job_type.finish()),
        Arc::new(submit.finish()),
        Arc::new(start.finish()),
        Arc::new(end.finish()),
        Arc::new(queue_s.finish()),
        Arc::new(duration_s.finish()),
        Arc::new(nodes.finish()),
        Arc::new(gpus.finish()),
        Arc::new(cpus.finish()),
        Arc::new(node_list.finish()),
        Arc::new(gpu_time_s.finish()),
        Arc::new(fail.finish()),
        Arc::new(stop.finish()),
        Arc::new(mem_per_pod_gb.finish()),
        Arc::new(shared_mem_per_pod.finish()),
        Arc::new(imported_at.finish()),
    ];
    RecordBatch::try_new(scheduler_job::scheduler_job_schema(), columns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc() -> FixedOffset {
        FixedOffset::east_opt(0).unwrap()
    }

    fn cst() -> FixedOffset {
        FixedOffset::east_opt(8 * 3600).unwrap()
    }

    /// 2024-03-01T10:00:00Z
    const T: i64 = 1_709_287_200_000_000;

    #[test]
    fn times_convert_from_the_cluster_offset_to_utc() {
        assert_eq!(parse_time("2024-03-01T10:00:00", utc()), Ok(Some(T)));
        assert_eq!(parse_time("2024-03-01 10:00:00", utc()), Ok(Some(T)));
        assert_eq!(
            parse_time("2024-03-01T18:00:00", cst()),
            Ok(Some(T)),
            "+08:00 local is 8 hours ahead of UTC"
        );
        let west = parse_utc_offset("-05:00").unwrap();
        assert_eq!(parse_time("2024-03-01T05:00:00", west), Ok(Some(T)));
        // A zone in the text wins over the option.
        assert_eq!(parse_time("2024-03-01 18:00:00+08:00", utc()), Ok(Some(T)));
        assert_eq!(parse_time("2024-03-01 10:00:00+00:00", cst()), Ok(Some(T)));
        assert_eq!(parse_time("2024-03-01T10:00:00Z", cst()), Ok(Some(T)));
        assert_eq!(
            parse_time("2024-03-01T10:00:00.25", utc()),
            Ok(Some(T + 250_000))
        );
        assert_eq!(
            parse_time("2024-03-01T10:00:00.123456789", utc()),
            Ok(Some(T + 123_456))
        );
    }

    #[test]
    fn unknown_times_are_null_and_bad_times_are_errors() {
        for null in ["", "  ", "Unknown", "None"] {
            assert_eq!(parse_time(null, utc()), Ok(None), "{null:?}");
        }
        for bad in [
            "2024-13-01T10:00:00",
            "2023-02-29T10:00:00",
            "2024-03-01T24:00:00",
            "2024-3-01T10:00:00",
            "2024-03-01",
            "2024-03-01X10:00:00",
            "+024-03-01T10:00:00",
            "2024-03-01T10:00:00.",
            "2024-03-01T10:00:00+8",
            "2024-03-01T10:00:00 PST",
            "2024-03-01T10:00:0é",
            "1709287200",
        ] {
            assert!(parse_time(bad, utc()).is_err(), "{bad:?}");
        }
        // Outside the partitions' four-digit years once in UTC.
        assert!(parse_time("0000-01-01T01:00:00", cst()).is_err());
        assert!(parse_time("9999-12-31T23:00:00", parse_utc_offset("-05:00").unwrap()).is_err());
        assert!(parse_time("0000-01-01T08:00:00", cst()).is_ok());
    }

    #[test]
    fn utc_offsets() {
        assert_eq!(parse_utc_offset("+08:00"), Ok(cst()));
        assert_eq!(parse_utc_offset("+0800"), Ok(cst()));
        assert_eq!(parse_utc_offset("+08"), Ok(cst()));
        assert_eq!(parse_utc_offset("+00:00"), Ok(utc()));
        assert_eq!(parse_utc_offset("Z"), Ok(utc()));
        assert_eq!(
            parse_utc_offset("-09:30"),
            Ok(FixedOffset::west_opt(9 * 3600 + 1800).unwrap())
        );
        for bad in [
            "",
            "8",
            "08:00",
            "+24:00",
            "+08:60",
            "+8:00",
            "UTC",
            "+08:00:00",
            "+٠٨:00",
        ] {
            assert!(parse_utc_offset(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn states_keep_their_first_word() {
        assert_eq!(parse_state("COMPLETED"), Ok(Some("COMPLETED".into())));
        assert_eq!(
            parse_state("CANCELLED by 1000"),
            Ok(Some("CANCELLED".into()))
        );
        assert_eq!(parse_state("NODE_FAIL"), Ok(Some("NODE_FAIL".into())));
        assert_eq!(parse_state("failed"), Ok(Some("FAILED".into())));
        assert_eq!(parse_state(""), Ok(None));
        assert!(parse_state("COMPLETED!").is_err());
        assert!(parse_state("0:0").is_err());
    }

    #[test]
    fn counts_and_seconds() {
        assert_eq!(parse_count("gpu_num", "8"), Ok(Some(8)));
        assert_eq!(parse_count("gpu_num", "8.0"), Ok(Some(8)));
        assert_eq!(parse_count("gpu_num", ""), Ok(None));
        for bad in ["8.5", "-1", "eight", "1e99", "NaN", "inf", "2147483648"] {
            assert!(parse_count("gpu_num", bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_seconds("gpu_time", "936"), Ok(Some(936)));
        assert_eq!(parse_seconds("gpu_time", "936.0"), Ok(Some(936)));
        assert_eq!(parse_seconds("gpu_time", "1.5"), Ok(Some(2)));
        assert_eq!(parse_seconds("gpu_time", ""), Ok(None));
        for bad in ["-3", "NaN", "inf", "1e19", "x"] {
            assert!(parse_seconds("gpu_time", bad).is_err(), "{bad:?}");
        }
        assert_eq!(span_s(Some(T), Some(T + 90_500_000)), Some(90));
        assert_eq!(span_s(Some(T), Some(T - 1)), None);
        assert_eq!(span_s(None, Some(T)), None);
        assert_eq!(span_s(Some(i64::MIN), Some(i64::MAX)), None);
        assert_eq!(gpu_time_s(Some(100), Some(8)), Some(800));
        assert_eq!(gpu_time_s(Some(i64::MAX), Some(2)), None);
    }

    #[test]
    fn amounts() {
        assert_eq!(parse_amount("mem_per_pod_GB", "1000"), Ok(Some(1000.0)));
        assert_eq!(parse_amount("mem_per_pod_GB", " 100.0 "), Ok(Some(100.0)));
        assert_eq!(parse_amount("mem_per_pod_GB", "0.5"), Ok(Some(0.5)));
        assert_eq!(parse_amount("mem_per_pod_GB", ""), Ok(None));
        for bad in ["-1", "NaN", "inf", "1e999", "x", "16G"] {
            assert!(parse_amount("mem_per_pod_GB", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn optional_columns_are_found_where_present() {
        let header = ["b", "FAIL_TIME", "a"];
        assert_eq!(
            locate_optional(&header, &["fail_time", "stop_time"]),
            Ok([Some(1), None])
        );
        assert!(locate_optional(&["x", "X"], &["x"]).is_err());
    }

    #[test]
    fn header_columns_are_found_in_any_order() {
        let header = ["b", "extra", "A"];
        assert_eq!(locate(&header, &["a", "b"]), Ok([2, 0]));
        assert_eq!(
            locate(&header, &["a", "c", "d"]),
            Err("the header lacks c, d".into())
        );
        assert!(locate(&["a", "A"], &["a"]).is_err());
    }

    #[test]
    fn a_repeated_job_keeps_its_last_line() {
        let bytes = b"JobID|User|Partition|State|Submit|Start|End|NNodes|AllocTRES|NodeList\n\
            7|a|p|RUNNING|2024-03-01T10:00:00|2024-03-01T10:00:00|Unknown|1||n1\n\
            7|a|p|COMPLETED|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T11:00:00|1||n1\n";
        let trace = Trace::parse(Format::Sacct, bytes, utc()).unwrap();
        assert_eq!(trace.jobs.len(), 1);
        assert_eq!(trace.jobs[0].state.as_deref(), Some("COMPLETED"));
        assert_eq!(trace.records, 2);
        assert_eq!(
            trace.skipped,
            vec![Skipped {
                line: 2,
                reason: "job 7 is listed again on line 3; the later line is kept".into()
            }]
        );
    }

    #[test]
    fn the_stem_depends_on_bytes_format_and_offset_only() {
        let bytes = b"JobID|User|Partition|State|Submit|Start|End|NNodes|AllocTRES|NodeList\n";
        let stem =
            |format, bytes: &[u8], offset| Trace::parse(format, bytes, offset).map(|t| t.stem());
        let a = stem(Format::Sacct, bytes, utc()).unwrap();
        assert_eq!(a, stem(Format::Sacct, bytes, utc()).unwrap());
        assert!(
            a.starts_with("sacct-") && a.len() == "sacct-".len() + 32,
            "{a}"
        );
        assert_ne!(a, stem(Format::Sacct, bytes, cst()).unwrap());
        let mut other = bytes.to_vec();
        other.push(b'\n');
        assert_ne!(a, stem(Format::Sacct, &other, utc()).unwrap());
        // The same digest forever: a changed hash would duplicate every
        // re-imported trace under a new name. XXH3-128 of no input is the
        // specification's test vector.
        assert_eq!(a, "sacct-7adecb52a88eaee9239d4ead99728a71");
        assert_eq!(
            twox_hash::xxhash3_128::Hasher::oneshot(b""),
            0x99aa06d3014798d86001c324468d497f
        );
    }

    #[test]
    fn batches_match_the_schema() {
        let job = Job {
            job_id: "1".into(),
            submit_us: Some(T),
            gpus: Some(8),
            fail_us: Some(T + 1),
            mem_per_pod_gb: Some(1000.0),
            ..Job::default()
        };
        let batch = to_batch(&[&job, &Job::default()], Format::Acme, T).unwrap();
        assert_eq!(batch.schema(), scheduler_job::scheduler_job_schema());
        assert_eq!(batch.num_rows(), 2);
        let column = |name: &str| batch.column_by_name(name).expect(name).clone();
        use arrow_array::Array;
        use arrow_array::cast::AsArray;
        use arrow_array::types::{Float64Type, TimestampMicrosecondType};
        let fail = column(scheduler_job::col::FAIL_TIME);
        assert_eq!(
            fail.as_primitive::<TimestampMicrosecondType>().value(0),
            T + 1
        );
        assert!(fail.is_null(1) && column(scheduler_job::col::STOP_TIME).is_null(0));
        let mem = column(scheduler_job::col::MEM_PER_POD_GB);
        assert_eq!(mem.as_primitive::<Float64Type>().value(0), 1000.0);
        assert!(column(scheduler_job::col::SHARED_MEM_PER_POD).is_null(0));
    }
}
