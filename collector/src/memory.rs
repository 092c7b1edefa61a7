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

use std::sync::OnceLock;

use gputel_proto::GpuSample;

/// How the process's allocator hands the memory it has freed back to the
/// kernel at once; set by the binary, which chose the allocator.
static RETURN_FREED: OnceLock<fn()> = OnceLock::new();

/// Tells [`return_freed_memory`] how to hand freed memory back to the
/// kernel; the first call counts.
pub fn set_return_freed(return_freed: fn()) {
    let _ = RETURN_FREED.set(return_freed);
}

/// Hands the memory freed so far back to the kernel now, not when the
/// allocator would (jemalloc: about a second after it was freed). For work
/// that frees a lot at once and then allocates as much again, such as
/// compaction's ranges: without it the freed pages of the ranges before
/// stay resident beside the next one. Does nothing unless the binary set
/// [`set_return_freed`].
pub fn return_freed_memory() {
    if let Some(return_freed) = RETURN_FREED.get() {
        return_freed();
    }
}

/// How the process's allocator runs a piece of work in memory of its own;
/// set by the binary, which chose the allocator.
static APART: OnceLock<fn(&mut dyn FnMut())> = OnceLock::new();

/// Tells [`apart`] how to run work in memory of its own; the first call
/// counts.
pub fn set_apart(apart: fn(&mut dyn FnMut())) {
    let _ = APART.set(apart);
}

/// Runs `work` on this thread with its allocations in memory of their own
/// (a jemalloc arena that nothing else allocates from), for work that
/// allocates and frees a lot beside the write path, such as compaction:
/// in one arena the write path's long-lived buffers end up scattered over
/// pages that compaction's freed memory cannot then be returned from. Runs
/// `work` as it is unless the binary set [`set_apart`].
pub fn apart<T>(work: impl FnOnce() -> T) -> T {
    let Some(apart) = APART.get() else {
        return work();
    };
    let mut work = Some(work);
    let mut out = None;
    apart(&mut || out = work.take().map(|work| work()));
    out.expect("the work ran")
}

/// The budget when none is given.
pub const DEFAULT_BUDGET_BYTES: u64 = 1 << 30;

/// The smallest budget accepted: below it one ordinary message would not
/// fit its share.
pub const MIN_BUDGET_BYTES: u64 = 64 << 20;

/// Memory one unwritten row takes, on average over the tables, while it is
/// buffered and then written to Parquet. Measured with the load
/// generator's rows held in Arrow's builders (see the README's memory
/// section; GPU rows, the widest, dominate); since the buffer holds its
/// integers packed a row takes less, so this bounds it.
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

    /// Work run apart runs once and gives its value back, set or not (the
    /// library's tests run without the binary's allocator).
    #[test]
    fn work_run_apart_gives_its_value() {
        let mut runs = 0;
        let value = apart(|| {
            runs += 1;
            vec![1, 2, 3]
        });
        assert_eq!((value, runs), (vec![1, 2, 3], 1));
    }

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
