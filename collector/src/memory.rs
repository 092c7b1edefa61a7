//! The collector's memory budget (`--memory-budget`) and how it is shared
//! out, so that what the collector holds is bounded by construction rather
//! than by what agents happen to send.
//!
//! | share | of the budget | bounds |
//! |---|---|---|
//! | messages being decoded and taken in | 1/4 | every stream together ([`crate::ingest::InFlight`]) |
//! | one message | 1/16 | a larger one is rejected before it is decoded |
//! | batches queued for the alert rules | 1/16 | rows beyond it skip the rules (counted) |
//! | unwritten rows | 1/2 | `--max-unwritten-rows`: batches are refused beyond it |
//! | the rest | 1/8 | writing Parquet, the log, compaction ([`crate::persist::MAX_MERGE_ROWS`] rows at a time), the runtime |

use gputel_proto::GpuSample;

/// The budget when none is given.
pub const DEFAULT_BUDGET_BYTES: u64 = 1 << 30;

/// The smallest budget accepted: below it one ordinary message would not
/// fit its share.
pub const MIN_BUDGET_BYTES: u64 = 64 << 20;

/// Memory one unwritten row takes, on average over the tables, while it is
/// buffered in Arrow builders and then written to Parquet. Measured with
/// the load generator's rows (see the README's memory section); GPU rows,
/// the widest, dominate.
pub const UNWRITTEN_ROW_BYTES: u64 = 600;

/// How the budget is shared out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    pub budget_bytes: u64,
    /// Messages being decoded and handed to the write path, all streams.
    pub in_flight_bytes: u64,
    /// One message, decoded.
    pub per_message_bytes: u64,
    /// GPU rows waiting for the alert rules.
    pub alert_queue_rows: usize,
    /// Rows buffered or waiting for a write, beyond which batches are
    /// refused until the store catches up.
    pub max_unwritten_rows: usize,
}

impl MemoryPlan {
    pub fn from_budget(budget_bytes: u64) -> Self {
        let rows = |bytes: u64, row: u64| usize::try_from(bytes / row).unwrap_or(usize::MAX);
        Self {
            budget_bytes,
            in_flight_bytes: budget_bytes / 4,
            per_message_bytes: budget_bytes / 16,
            alert_queue_rows: rows(budget_bytes / 16, std::mem::size_of::<GpuSample>() as u64),
            max_unwritten_rows: rows(budget_bytes / 2, UNWRITTEN_ROW_BYTES),
        }
    }
}

impl Default for MemoryPlan {
    fn default() -> Self {
        Self::from_budget(DEFAULT_BUDGET_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shares_add_up_to_less_than_the_budget() {
        let plan = MemoryPlan::default();
        assert_eq!(plan.in_flight_bytes, 256 << 20);
        assert_eq!(plan.per_message_bytes, 64 << 20);
        assert_eq!(plan.max_unwritten_rows, (512 << 20) / 600);
        let alert_bytes = plan.alert_queue_rows as u64 * std::mem::size_of::<GpuSample>() as u64;
        let unwritten = plan.max_unwritten_rows as u64 * UNWRITTEN_ROW_BYTES;
        assert!(plan.in_flight_bytes + alert_bytes + unwritten <= plan.budget_bytes * 7 / 8 + 1);
    }
}
