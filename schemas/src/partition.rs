use std::fmt;

use chrono::{DateTime, Datelike, NaiveDate, Timelike, Utc};

use crate::Table;

/// Why a partition or file path could not be built or parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartitionError {
    #[error("timestamp {0} µs is outside the representable range")]
    Timestamp(i64),
    #[error("file stem {0:?} must be 1 to 128 characters of [A-Za-z0-9_-]")]
    FileStem(String),
    #[error("path {0:?} is not <table>/date=YYYY-MM-DD/hour=HH/<stem>.parquet")]
    Path(String),
    #[error("path {0:?} is not scheduler_job/month=YYYY-MM/<stem>.parquet (or month=unknown)")]
    MonthPath(String),
}

/// A file stem is 1 to 128 characters of `[A-Za-z0-9_-]`, so it can never
/// leave its partition directory.
pub(crate) fn valid_stem(stem: &str) -> bool {
    !stem.is_empty()
        && stem.len() <= 128
        && stem
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The hive partition of a row: its UTC date and hour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionKey {
    date: NaiveDate,
    hour: u8,
}

impl PartitionKey {
    /// The partition holding a timestamp in microseconds since the Unix epoch.
    pub fn from_ts_us(ts_us: i64) -> Result<Self, PartitionError> {
        let time: DateTime<Utc> =
            DateTime::from_timestamp_micros(ts_us).ok_or(PartitionError::Timestamp(ts_us))?;
        Ok(Self {
            date: time.date_naive(),
            hour: time.hour() as u8,
        })
    }

    /// The partition's UTC date.
    pub fn date(&self) -> NaiveDate {
        self.date
    }

    /// The partition's UTC hour, 0 to 23.
    pub fn hour(&self) -> u8 {
        self.hour
    }
}

/// Microseconds in an hour: a partition is the hour `ts_us.div_euclid(HOUR_US)`
/// of Unix time, which has no leap seconds.
const HOUR_US: i64 = 3_600_000_000;

/// [`PartitionKey::from_ts_us`] for a run of timestamps that nearly always
/// share their hour, as the rows of a batch do: the calendar is worked out
/// once an hour, not once a row.
#[derive(Debug, Default, Clone, Copy)]
pub struct HourCache {
    /// The last hour looked up (`ts_us.div_euclid(HOUR_US)`) and its key.
    last: Option<(i64, PartitionKey)>,
}

impl HourCache {
    /// The partition holding a timestamp, as [`PartitionKey::from_ts_us`].
    pub fn key(&mut self, ts_us: i64) -> Result<PartitionKey, PartitionError> {
        let hour = ts_us.div_euclid(HOUR_US);
        if let Some((last, key)) = self.last
            && last == hour
        {
            return Ok(key);
        }
        let key = PartitionKey::from_ts_us(ts_us)?;
        self.last = Some((hour, key));
        Ok(key)
    }
}

impl fmt::Display for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "date={:04}-{:02}-{:02}/hour={:02}",
            self.date.year(),
            self.date.month(),
            self.date.day(),
            self.hour
        )
    }
}

/// The path of one Parquet file in the store, relative to the store's root:
/// `<table>/date=YYYY-MM-DD/hour=HH/<stem>.parquet`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PartitionPath {
    table: Table,
    key: PartitionKey,
    stem: String,
}

impl PartitionPath {
    /// A file path; the stem is restricted to `[A-Za-z0-9_-]` so it can never
    /// leave its partition directory.
    pub fn new(table: Table, key: PartitionKey, stem: &str) -> Result<Self, PartitionError> {
        if !valid_stem(stem) {
            return Err(PartitionError::FileStem(stem.to_owned()));
        }
        Ok(Self {
            table,
            key,
            stem: stem.to_owned(),
        })
    }

    /// Parses a path written by [`PartitionPath::to_string`].
    pub fn parse(path: &str) -> Result<Self, PartitionError> {
        let bad = || PartitionError::Path(path.to_owned());
        let mut parts = path.split('/');
        let (Some(table), Some(date), Some(hour), Some(file), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(bad());
        };
        let table = Table::ALL
            .into_iter()
            .find(|t| t.name() == table)
            .ok_or_else(bad)?;
        let date = date
            .strip_prefix("date=")
            .and_then(|d| NaiveDate::parse_from_str(d, "%Y-%m-%d").ok())
            .ok_or_else(bad)?;
        let hour = hour
            .strip_prefix("hour=")
            .filter(|h| h.len() == 2)
            .and_then(|h| h.parse::<u8>().ok())
            .filter(|h| *h < 24)
            .ok_or_else(bad)?;
        let stem = file.strip_suffix(".parquet").ok_or_else(bad)?;
        Self::new(table, PartitionKey { date, hour }, stem).map_err(|_| bad())
    }

    pub fn table(&self) -> Table {
        self.table
    }

    pub fn key(&self) -> PartitionKey {
        self.key
    }

    pub fn stem(&self) -> &str {
        &self.stem
    }
}

impl fmt::Display for PartitionPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}.parquet",
            self.table.name(),
            self.key,
            self.stem
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_from_timestamp_is_utc_date_and_hour() {
        // 2026-11-21T05:59:59.999999Z
        let key = PartitionKey::from_ts_us(1_795_240_799_999_999).unwrap();
        assert_eq!(key.to_string(), "date=2026-11-21/hour=05");
        let key = PartitionKey::from_ts_us(1_795_240_800_000_000).unwrap();
        assert_eq!(key.to_string(), "date=2026-11-21/hour=06");
        let key = PartitionKey::from_ts_us(-1).unwrap();
        assert_eq!(key.to_string(), "date=1969-12-31/hour=23");
        assert_eq!(
            PartitionKey::from_ts_us(i64::MAX),
            Err(PartitionError::Timestamp(i64::MAX))
        );
    }

    #[test]
    fn the_hour_cache_gives_what_each_timestamp_would() {
        let midnight = 1_795_219_200_000_000; // 2026-11-21T00:00:00Z
        let mut cache = HourCache::default();
        let mut times = vec![
            midnight - 1,
            midnight,
            midnight + 1,
            midnight - 1,
            midnight + HOUR_US - 1,
            midnight + HOUR_US,
            -HOUR_US - 1,
            -HOUR_US,
            -1,
            0,
            i64::MIN,
            i64::MAX,
            midnight,
        ];
        // A batch's rows: the same second, then the next hours, then back.
        times.extend((0..200).map(|i| midnight + (i % 7) * 900_000_000 + i));
        for ts_us in times {
            assert_eq!(cache.key(ts_us), PartitionKey::from_ts_us(ts_us), "{ts_us}");
        }
        assert_eq!(
            cache.key(i64::MAX),
            Err(PartitionError::Timestamp(i64::MAX)),
            "an unrepresentable hour is never cached"
        );
    }

    #[test]
    fn path_round_trips() {
        let key = PartitionKey::from_ts_us(1_795_240_800_000_000).unwrap();
        let path = PartitionPath::new(Table::Gpu, key, "c0ffee-000042").unwrap();
        let text = path.to_string();
        assert_eq!(text, "gpu/date=2026-11-21/hour=06/c0ffee-000042.parquet");
        assert_eq!(PartitionPath::parse(&text).unwrap(), path);
    }

    #[test]
    fn hostile_stems_and_paths_are_refused() {
        let key = PartitionKey::from_ts_us(0).unwrap();
        for stem in ["", "../x", "a/b", "a.b", "nul\0", &"x".repeat(129)] {
            assert!(
                PartitionPath::new(Table::Node, key, stem).is_err(),
                "{stem:?}"
            );
        }
        for path in [
            "gpu/date=2026-11-21/hour=06/a.csv",
            "gpu/date=2026-11-21/hour=24/a.parquet",
            "gpu/date=2026-13-01/hour=06/a.parquet",
            "cpu/date=2026-11-21/hour=06/a.parquet",
            "gpu/date=2026-11-21/hour=06/x/a.parquet",
            "gpu/date=2026-11-21/hour=6/a.parquet",
        ] {
            assert!(PartitionPath::parse(path).is_err(), "{path}");
        }
    }
}
