//! gputel's tables: their Arrow schemas, sort keys and partition paths.
//!
//! The collector writes each table under
//! `<store>/<table>/date=YYYY-MM-DD/hour=HH/<file>.parquet`; DuckDB, Spark and
//! Trino read that layout directly with hive partitioning. A scheduler's job
//! trace, imported by `gputel-collector import-jobs`, goes to
//! [`scheduler_job`], partitioned by submit month. The golden files in
//! `schemas/golden/` pin every schema: a test fails when one changes without
//! its golden file.

mod partition;
pub mod scheduler_job;
mod tables;

pub use partition::{PartitionError, PartitionKey, PartitionPath};
pub use scheduler_job::{JobTracePath, Month, scheduler_job_schema};
pub use tables::{Table, describe_schema, golden_path};
