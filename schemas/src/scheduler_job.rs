//! The `scheduler_job` table: a scheduler's own job trace (sacct output, or a
//! CSV in the Acme trace layout), imported next to the telemetry so that GPU
//! rows join to job type, user and final state.
//!
//! The flush loop never writes it, so it is not a [`crate::Table`]: it is
//! written by `gputel-collector import-jobs`, one file per submit month,
//! `scheduler_job/month=YYYY-MM/<stem>.parquet` (`month=unknown` for jobs
//! without a submit time).

use std::fmt;
use std::sync::{Arc, LazyLock};

use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use chrono::{DateTime, Datelike, Utc};

use crate::partition::{PartitionError, valid_stem};

/// The table's name: its directory under the store and its golden file's stem.
pub const NAME: &str = "scheduler_job";

/// The table's column names.
pub mod col {
    pub const JOB_ID: &str = "job_id";
    pub const SOURCE: &str = "source";
    pub const USER: &str = "user";
    pub const QUEUE: &str = "queue";
    pub const STATE: &str = "state";
    pub const JOB_TYPE: &str = "job_type";
    pub const SUBMIT_TIME: &str = "submit_time";
    pub const START_TIME: &str = "start_time";
    pub const END_TIME: &str = "end_time";
    pub const QUEUE_S: &str = "queue_s";
    pub const DURATION_S: &str = "duration_s";
    pub const NODES: &str = "nodes";
    pub const GPUS: &str = "gpus";
    pub const CPUS: &str = "cpus";
    pub const NODE_LIST: &str = "node_list";
    pub const GPU_TIME_S: &str = "gpu_time_s";
    pub const FAIL_TIME: &str = "fail_time";
    pub const STOP_TIME: &str = "stop_time";
    pub const MEM_PER_POD_GB: &str = "mem_per_pod_gb";
    pub const SHARED_MEM_PER_POD: &str = "shared_mem_per_pod";
    pub const IMPORTED_AT: &str = "imported_at";
}

/// Columns the rows of a file are sorted by.
pub const SORT_KEY: &[&str] = &[col::SUBMIT_TIME, col::JOB_ID];

/// Columns with a bloom filter: the one joins and lookups use.
pub const BLOOM_FILTER_COLUMNS: &[&str] = &[col::JOB_ID];

/// The Arrow schema of `scheduler_job`. The partition column (`month`) is not
/// in the files: readers derive it from the path.
pub fn scheduler_job_schema() -> SchemaRef {
    SCHEDULER_JOB.clone()
}

fn dict_str(name: &str, nullable: bool) -> Field {
    Field::new_dictionary(name, DataType::Int32, DataType::Utf8, nullable)
}

fn timestamp(name: &str, nullable: bool) -> Field {
    Field::new(
        name,
        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        nullable,
    )
}

static SCHEDULER_JOB: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        dict_str(col::JOB_ID, false),
        dict_str(col::SOURCE, false),
        dict_str(col::USER, true),
        dict_str(col::QUEUE, true),
        dict_str(col::STATE, true),
        dict_str(col::JOB_TYPE, true),
        timestamp(col::SUBMIT_TIME, true),
        timestamp(col::START_TIME, true),
        timestamp(col::END_TIME, true),
        Field::new(col::QUEUE_S, DataType::Int64, true),
        Field::new(col::DURATION_S, DataType::Int64, true),
        Field::new(col::NODES, DataType::Int32, true),
        Field::new(col::GPUS, DataType::Int32, true),
        Field::new(col::CPUS, DataType::Int32, true),
        dict_str(col::NODE_LIST, true),
        Field::new(col::GPU_TIME_S, DataType::Int64, true),
        // Kalos' own columns (trace_kalos.csv); null in Seren's layout and
        // in sacct's. Files written before they existed lack them: readers
        // merge by name (DuckDB's union_by_name) and see nulls.
        timestamp(col::FAIL_TIME, true),
        timestamp(col::STOP_TIME, true),
        Field::new(col::MEM_PER_POD_GB, DataType::Float64, true),
        Field::new(col::SHARED_MEM_PER_POD, DataType::Float64, true),
        timestamp(col::IMPORTED_AT, false),
    ]))
});

/// A calendar month in UTC: the partition of a `scheduler_job` row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Month {
    year: u16,
    month: u8,
}

impl Month {
    /// The UTC month of a timestamp in microseconds since the Unix epoch;
    /// years outside 0000-9999 have no partition.
    pub fn from_ts_us(ts_us: i64) -> Result<Self, PartitionError> {
        let time: DateTime<Utc> =
            DateTime::from_timestamp_micros(ts_us).ok_or(PartitionError::Timestamp(ts_us))?;
        let year = u16::try_from(time.year())
            .ok()
            .filter(|y| *y <= 9999)
            .ok_or(PartitionError::Timestamp(ts_us))?;
        Ok(Self {
            year,
            month: time.month() as u8,
        })
    }

    pub fn year(&self) -> u16 {
        self.year
    }

    /// 1 to 12.
    pub fn month(&self) -> u8 {
        self.month
    }

    fn parse(text: &str) -> Option<Self> {
        let (year, month) = text.split_once('-')?;
        if year.len() != 4
            || month.len() != 2
            || !(year.bytes().chain(month.bytes())).all(|b| b.is_ascii_digit())
        {
            return None;
        }
        let month: u8 = month.parse().ok()?;
        (1..=12).contains(&month).then_some(Self {
            year: year.parse().ok()?,
            month,
        })
    }
}

impl fmt::Display for Month {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}", self.year, self.month)
    }
}

/// The path of one `scheduler_job` file, relative to the store's root:
/// `scheduler_job/month=YYYY-MM/<stem>.parquet`, or `month=unknown` for jobs
/// without a submit time.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JobTracePath {
    month: Option<Month>,
    stem: String,
}

/// The partition value of jobs without a submit time.
const UNKNOWN_MONTH: &str = "unknown";

impl JobTracePath {
    /// A file path; the stem is restricted to `[A-Za-z0-9_-]` so it can never
    /// leave its partition directory.
    pub fn new(month: Option<Month>, stem: &str) -> Result<Self, PartitionError> {
        if !valid_stem(stem) {
            return Err(PartitionError::FileStem(stem.to_owned()));
        }
        Ok(Self {
            month,
            stem: stem.to_owned(),
        })
    }

    /// Parses a path written by [`JobTracePath::to_string`].
    pub fn parse(path: &str) -> Result<Self, PartitionError> {
        let bad = || PartitionError::MonthPath(path.to_owned());
        let mut parts = path.split('/');
        let (Some(NAME), Some(month), Some(file), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let month = match month.strip_prefix("month=").ok_or_else(bad)? {
            UNKNOWN_MONTH => None,
            text => Some(Month::parse(text).ok_or_else(bad)?),
        };
        let stem = file.strip_suffix(".parquet").ok_or_else(bad)?;
        Self::new(month, stem).map_err(|_| bad())
    }

    /// The submit month of the file's jobs; `None` for jobs without one.
    pub fn month(&self) -> Option<Month> {
        self.month
    }

    pub fn stem(&self) -> &str {
        &self.stem
    }
}

impl fmt::Display for JobTracePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.month {
            Some(month) => write!(f, "{NAME}/month={month}/{}.parquet", self.stem),
            None => write!(f, "{NAME}/month={UNKNOWN_MONTH}/{}.parquet", self.stem),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn month_is_the_utc_month() {
        // 2024-02-29T23:59:59.999999Z, then 2024-03-01T00:00:00Z
        assert_eq!(
            Month::from_ts_us(1_709_251_199_999_999)
                .unwrap()
                .to_string(),
            "2024-02"
        );
        assert_eq!(
            Month::from_ts_us(1_709_251_200_000_000)
                .unwrap()
                .to_string(),
            "2024-03"
        );
        assert_eq!(Month::from_ts_us(-1).unwrap().to_string(), "1969-12");
        assert!(Month::from_ts_us(i64::MAX).is_err());
        // 10000-01-01T00:00:00Z: a five-digit year has no partition.
        assert!(Month::from_ts_us(253_402_300_800_000_000).is_err());
    }

    #[test]
    fn path_round_trips() {
        let month = Month::from_ts_us(1_709_251_200_000_000).unwrap();
        let path = JobTracePath::new(Some(month), "sacct-0123abcd").unwrap();
        let text = path.to_string();
        assert_eq!(text, "scheduler_job/month=2024-03/sacct-0123abcd.parquet");
        assert_eq!(JobTracePath::parse(&text).unwrap(), path);

        let path = JobTracePath::new(None, "acme-0123abcd").unwrap();
        let text = path.to_string();
        assert_eq!(text, "scheduler_job/month=unknown/acme-0123abcd.parquet");
        assert_eq!(JobTracePath::parse(&text).unwrap(), path);
    }

    #[test]
    fn hostile_stems_and_paths_are_refused() {
        for stem in ["", "../x", "a/b", "a.b", &"x".repeat(129)] {
            assert!(JobTracePath::new(None, stem).is_err(), "{stem:?}");
        }
        for path in [
            "scheduler_job/month=2024-03/a.csv",
            "scheduler_job/month=2024-13/a.parquet",
            "scheduler_job/month=2024-3/a.parquet",
            "scheduler_job/month=+024-03/a.parquet",
            "scheduler_job/month=/a.parquet",
            "scheduler_job/date=2024-03-01/a.parquet",
            "job/month=2024-03/a.parquet",
            "scheduler_job/month=2024-03/x/a.parquet",
        ] {
            assert!(JobTracePath::parse(path).is_err(), "{path}");
        }
    }

    #[test]
    fn sort_key_and_bloom_columns_exist() {
        let schema = scheduler_job_schema();
        for name in SORT_KEY.iter().chain(BLOOM_FILTER_COLUMNS) {
            assert!(schema.field_with_name(name).is_ok(), "no column {name}");
        }
    }
}
