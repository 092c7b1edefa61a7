//! Retention: whole `date=` partitions past a table's age are deleted.

use super::*;

/// How long each table's partitions are kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Retention {
    /// For tables without their own age; None keeps them forever.
    pub default: Option<Duration>,
    pub tables: BTreeMap<Table, Duration>,
}

impl Retention {
    /// Parses `--retention` values: `AGE` (every table) or `TABLE=AGE`.
    pub fn parse<S: AsRef<str>>(values: &[S]) -> Result<Retention, String> {
        let mut retention = Retention::default();
        for value in values {
            let value = value.as_ref();
            let (table, age) = match value.split_once('=') {
                Some((name, age)) => {
                    let table = Table::ALL
                        .into_iter()
                        .find(|t| t.name() == name)
                        .ok_or_else(|| {
                            format!(
                                "retention {value:?}: no table {name:?}; tables: {}",
                                Table::ALL.map(|t| t.name()).join(", ")
                            )
                        })?;
                    (Some(table), age)
                }
                None => (None, value),
            };
            let age = humantime::parse_duration(age)
                .map_err(|e| format!("retention {value:?}: {e} (e.g. 90d, 12h)"))?;
            if age < Duration::from_secs(3600) {
                return Err(format!("retention {value:?}: keep data at least 1h"));
            }
            match table {
                Some(table) => {
                    retention.tables.insert(table, age);
                }
                None => retention.default = Some(age),
            }
        }
        Ok(retention)
    }

    /// How long `table` is kept; None: forever.
    pub fn age(&self, table: Table) -> Option<Duration> {
        self.tables.get(&table).copied().or(self.default)
    }

    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.tables.is_empty()
    }
}

/// What retention deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RetentionReport {
    /// `date=` partitions deleted.
    pub partitions: usize,
}

/// Deletes every `date=` partition older than its table's retention: a
/// partition goes once its whole day is older than the age.
pub async fn apply_retention(
    store: &Store,
    now_us: i64,
    retention: &Retention,
) -> Result<RetentionReport, CompactError> {
    let mut report = RetentionReport::default();
    for table in Table::ALL {
        let Some(age) = retention.age(table) else {
            continue;
        };
        let cutoff = now_us.saturating_sub(age.as_micros() as i64);
        for date in children(store.objects.as_ref(), table.name()).await? {
            let Some(day) = date_start_us(&date) else {
                continue;
            };
            if day + DAY_US > cutoff {
                continue;
            }
            let prefix = format!("{}/{date}", table.name());
            match &store.local {
                Some(root) => {
                    let root = root.clone();
                    let rel = prefix.clone();
                    tokio::task::spawn_blocking(move || delete_local(&root, &rel))
                        .await
                        .map_err(|e| io::Error::other(e.to_string()))
                        .and_then(|r| r)
                        .map_err(|source| CompactError::DeleteDir {
                            path: store.local.clone().unwrap_or_default().join(&prefix),
                            source,
                        })?;
                }
                None => delete_objects(store.objects.as_ref(), &prefix).await?,
            }
            info!(
                partition = %prefix,
                retention = %humantime::format_duration(age),
                day = %DateTime::from_timestamp_micros(day).map(|d| d.date_naive().to_string()).unwrap_or_default(),
                "deleted a partition past its retention"
            );
            report.partitions += 1;
        }
    }
    Ok(report)
}

/// Local store: the partition leaves the table in one rename, then is deleted.
pub(super) fn delete_local(root: &Path, partition: &str) -> io::Result<()> {
    let staging = staging_dir(root)?;
    let doomed = staging.join("partition");
    {
        let _lock = store::lock(root, true)?;
        std::fs::rename(root.join(partition), &doomed)?;
    }
    std::fs::remove_dir_all(&staging)
}

pub(super) async fn delete_objects(
    store: &dyn ObjectStore,
    prefix: &str,
) -> Result<(), CompactError> {
    let locations = store
        .list(Some(&ObjectPath::from(prefix)))
        .map_ok(|meta| meta.location)
        .boxed();
    store
        .delete_stream(locations)
        .try_collect::<Vec<_>>()
        .await
        .map_err(|source| CompactError::Delete {
            path: prefix.to_owned(),
            source,
        })?;
    Ok(())
}
