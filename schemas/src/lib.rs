//! gputel's tables: their Arrow schemas, sort keys and partition paths.
//!
//! The collector writes each table under
//! `<store>/<table>/date=YYYY-MM-DD/hour=HH/<file>.parquet`; DuckDB, Spark and
//! Trino read that layout directly with hive partitioning. A scheduler's job
//! trace, imported by `gputel-collector import-jobs`, goes to
//! [`scheduler_job`], partitioned by submit month. The golden files in
//! `schemas/golden/` pin every schema: a test fails when one changes without
//! its golden file.
//!
//! Each table is declared once, in `tables.rs`: one line per column names
//! its [`column`] kind and where its value comes from. The Arrow schema, the
//! check every row passes before the collector stores it, and the builder
//! that turns rows into Arrow columns all come from that declaration.
//!
//! [`xid`] is the XID catalogue (`schemas/xid/xids.csv`): what each XID
//! means, its failure category and what clears it.

pub mod column;
pub mod derive;
mod partition;
pub mod scheduler_job;
pub mod sql;
mod tables;
pub mod xid;

pub use column::{ColumnError, RowContext, SharedNulls};
pub use partition::{HourCache, PartitionError, PartitionKey, PartitionPath};
pub use scheduler_job::{JobTracePath, Month, scheduler_job_schema};
pub use tables::{
    AlertRows, BatchColumns, Columns, EventRows, EventSource, GpuProcessRows, GpuRows, IbRows,
    JobRows, JobSpan, NodeRows, RowKey, Table, col, describe_schema, golden_path, take_batch,
};
