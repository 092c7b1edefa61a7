//! gputel's tables: their Arrow schemas, sort keys and partition paths.
//!
//! The collector writes each table under
//! `<store>/<table>/date=YYYY-MM-DD/hour=HH/<file>.parquet`; DuckDB, Spark and
//! Trino read that layout directly with hive partitioning. The golden files in
//! `schemas/golden/` pin every schema: a test fails when one changes without
//! its golden file.

mod partition;
mod tables;

pub use partition::{PartitionError, PartitionKey, PartitionPath};
pub use tables::{Table, describe_schema, golden_path};
