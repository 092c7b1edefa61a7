//! Durations as the programs count time: whole microseconds in an `i64`.

use std::time::Duration;

/// `d` in microseconds, saturating at `i64::MAX` (292 000 years) for a
/// duration too long to count, such as a configured "never".
pub fn duration_us(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn microseconds_saturate_instead_of_wrapping() {
        assert_eq!(duration_us(Duration::from_millis(1500)), 1_500_000);
        assert_eq!(duration_us(Duration::from_nanos(1999)), 1);
        assert_eq!(duration_us(Duration::MAX), i64::MAX);
    }
}
