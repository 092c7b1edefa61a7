//! What the store derives rather than holds: rates of the `ib` counters and
//! CPU shares from the `node` jiffy counters. The tables keep counters only
//! (a rate or a share is a difference of two rows, so storing it would
//! repeat the counters in a form that compresses worse); the `node` and
//! `ib` views of `schemas/sql/views.sql` add the derived columns, and the
//! fleet report computes them with the functions here, by the same rules:
//!
//! - each counter is compared with its own last non-null reading on the
//!   same device (an unreadable file leaves one row null, and the next
//!   increase spans both intervals);
//! - a reading lower than the previous one is a reset (port reset, driver
//!   reload, `perfquery -R`, reboot) and, as in Prometheus' `rate()`, the new
//!   value is the whole increase since it: a lower bound;
//! - a legacy 32-bit IB counter stopped at 2^32 - 1 has no rate;
//! - CPU shares need every group to have grown or held (the aggregate
//!   iowait may go backwards, and a reboot resets them all) and some time
//!   to have passed.

use gputel_proto::NodeSample;

/// Where a legacy 32-bit IB packet counter stops: 2^32 - 1.
pub const IB_SATURATED_PACKETS: u64 = u32::MAX as u64;
/// Where a legacy 32-bit IB data counter stops, in bytes: it counts 4-byte words.
pub const IB_SATURATED_BYTES: u64 = 4 * IB_SATURATED_PACKETS;

/// One reading of a counter and its time, µs since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    pub ts_us: i64,
    pub value: u64,
}

/// Per second from `prev` to `now`; None unless time moved forward, or when
/// `now` is `saturated_at` (a counter that no longer counts).
pub fn per_second(prev: Reading, now: Reading, saturated_at: Option<u64>) -> Option<f64> {
    if saturated_at == Some(now.value) {
        return None;
    }
    let elapsed_us = now.ts_us.checked_sub(prev.ts_us).filter(|&dt| dt > 0)?;
    let increase = if now.value >= prev.value {
        now.value - prev.value
    } else {
        now.value
    };
    Some(increase as f64 / (elapsed_us as f64 / 1e6))
}

/// A `node` row's CPU counters, in jiffies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuJiffies {
    pub user: u64,
    pub system: u64,
    pub iowait: u64,
    pub idle: u64,
    pub steal: u64,
}

/// Shares of all CPUs' time over an interval, in percent; they add up to 100.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuShares {
    pub user: f64,
    pub system: f64,
    pub iowait: f64,
    pub idle: f64,
    pub steal: f64,
}

impl From<[u64; 5]> for CpuJiffies {
    /// user, system, iowait, idle, steal, in that order.
    fn from([user, system, iowait, idle, steal]: [u64; 5]) -> Self {
        Self {
            user,
            system,
            iowait,
            idle,
            steal,
        }
    }
}

impl CpuJiffies {
    /// The row's five counters, when all are there.
    pub fn of(
        user: Option<u64>,
        system: Option<u64>,
        iowait: Option<u64>,
        idle: Option<u64>,
        steal: Option<u64>,
    ) -> Option<Self> {
        Some(Self {
            user: user?,
            system: system?,
            iowait: iowait?,
            idle: idle?,
            steal: steal?,
        })
    }

    /// A node row's counters, when all five are there.
    pub fn of_row(row: &NodeSample) -> Option<Self> {
        Self::of(
            row.cpu_user_jiffies,
            row.cpu_system_jiffies,
            row.cpu_iowait_jiffies,
            row.cpu_idle_jiffies,
            row.cpu_steal_jiffies,
        )
    }

    /// Sets a node row's five counters.
    pub fn write_to(&self, row: &mut NodeSample) {
        row.cpu_user_jiffies = Some(self.user);
        row.cpu_system_jiffies = Some(self.system);
        row.cpu_iowait_jiffies = Some(self.iowait);
        row.cpu_idle_jiffies = Some(self.idle);
        row.cpu_steal_jiffies = Some(self.steal);
    }

    /// All the CPU time they count; None past u64 (no machine gets there).
    pub fn total(&self) -> Option<u64> {
        [self.user, self.system, self.iowait, self.idle, self.steal]
            .into_iter()
            .try_fold(0u64, u64::checked_add)
    }

    /// Each group's share of the time from `prev` to `self`: 100 × Δgroup /
    /// Δ(sum of the groups). None when a counter went backwards or no CPU
    /// time passed.
    pub fn shares_since(&self, prev: &Self) -> Option<CpuShares> {
        let d = CpuJiffies {
            user: self.user.checked_sub(prev.user)?,
            system: self.system.checked_sub(prev.system)?,
            iowait: self.iowait.checked_sub(prev.iowait)?,
            idle: self.idle.checked_sub(prev.idle)?,
            steal: self.steal.checked_sub(prev.steal)?,
        };
        let total = d.total().filter(|&t| t > 0)? as f64;
        // Multiplying before dividing keeps whole-number shares exact, as
        // the view's 100.0 * Δ / Δtotal does.
        let pct = |part: u64| 100.0 * part as f64 / total;
        Some(CpuShares {
            user: pct(d.user),
            system: pct(d.system),
            iowait: pct(d.iowait),
            idle: pct(d.idle),
            steal: pct(d.steal),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000;

    fn at(ts_us: i64, value: u64) -> Reading {
        Reading { ts_us, value }
    }

    #[test]
    fn a_rate_is_the_increase_over_the_time_between_readings() {
        assert_eq!(per_second(at(0, 100), at(S, 1_100), None), Some(1_000.0));
        assert_eq!(per_second(at(0, 100), at(15 * S, 1_600), None), Some(100.0));
        assert_eq!(per_second(at(0, 100), at(S / 2, 100), None), Some(0.0));
    }

    #[test]
    fn no_time_or_time_going_back_gives_no_rate() {
        assert_eq!(per_second(at(S, 100), at(S, 200), None), None);
        assert_eq!(per_second(at(2 * S, 100), at(S, 200), None), None);
    }

    #[test]
    fn a_reset_counts_the_new_value_as_the_increase() {
        assert_eq!(
            per_second(at(0, 5_000), at(2 * S, 2_000), None),
            Some(1_000.0)
        );
    }

    #[test]
    fn a_saturated_legacy_counter_has_no_rate_until_it_is_cleared() {
        let sat = Some(IB_SATURATED_BYTES);
        assert_eq!(
            per_second(
                at(0, IB_SATURATED_BYTES - 1_180),
                at(S, IB_SATURATED_BYTES),
                sat
            ),
            None
        );
        assert_eq!(
            per_second(
                at(S, IB_SATURATED_BYTES),
                at(2 * S, IB_SATURATED_BYTES),
                sat
            ),
            None
        );
        assert_eq!(
            per_second(at(2 * S, IB_SATURATED_BYTES), at(3 * S, 4_000), sat),
            Some(4_000.0)
        );
    }

    fn jiffies(user: u64, system: u64, iowait: u64, idle: u64, steal: u64) -> CpuJiffies {
        CpuJiffies::from([user, system, iowait, idle, steal])
    }

    #[test]
    fn shares_are_exact_over_whole_jiffies() {
        // The fixtures proc → proc-later: one second of 8 CPUs.
        let before = jiffies(417_064_711, 57_332_035, 1_057_559, 146_625_695, 0);
        let after = jiffies(417_065_151, 57_332_115, 1_057_567, 146_625_967, 0);
        assert_eq!(
            after.shares_since(&before),
            Some(CpuShares {
                user: 55.0,
                system: 10.0,
                iowait: 1.0,
                idle: 34.0,
                steal: 0.0
            })
        );
    }

    #[test]
    fn steal_is_a_share_of_its_own() {
        let s = jiffies(300, 100, 0, 500, 100).shares_since(&jiffies(0, 0, 0, 0, 0));
        assert_eq!(
            s.map(|s| (s.user, s.idle, s.steal)),
            Some((30.0, 50.0, 10.0))
        );
    }

    #[test]
    fn a_counter_going_backwards_or_no_time_gives_no_shares() {
        let before = jiffies(1_000, 100, 50, 5_000, 0);
        assert_eq!(
            jiffies(1_100, 100, 40, 5_100, 0).shares_since(&before),
            None
        );
        assert_eq!(before.shares_since(&before), None);
        assert_eq!(
            CpuJiffies::of(Some(1), Some(1), None, Some(1), Some(0)),
            None
        );
    }
}
