//! Time-weighted distributions: how much observed time each value had.
//!
//! Values are kept to the hundredth (the precision the SQL rounds its
//! quantiles to), so a distribution holds at most one entry per distinct
//! hundredth, not one per sample: a day of 1000 nodes is a few thousand
//! entries per metric. A quantile is the smallest value with at least that
//! share of the time at or below it, as in schemas/sql/fleet_cdf.sql.

use std::collections::HashMap;

use serde::Serialize;

/// Weighted values of one metric.
#[derive(Debug, Clone, Default)]
pub struct Distribution {
    /// Value in hundredths → seconds.
    cells: HashMap<i64, f64>,
    total_s: f64,
}

impl Distribution {
    pub fn add(&mut self, value: f64, weight_s: f64) {
        if !value.is_finite() || weight_s <= 0.0 {
            return;
        }
        *self
            .cells
            .entry((value * 100.0).round() as i64)
            .or_default() += weight_s;
        self.total_s += weight_s;
    }

    pub fn total_s(&self) -> f64 {
        self.total_s
    }

    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    /// (value in hundredths, seconds), in value order: every sum over the
    /// cells adds in this order, so a figure's last digits do not depend on
    /// a hash map's order.
    fn sorted(&self) -> Vec<(i64, f64)> {
        let mut cells: Vec<(i64, f64)> = self.cells.iter().map(|(&v, &w)| (v, w)).collect();
        cells.sort_unstable_by_key(|c| c.0);
        cells
    }

    /// (value, cumulative seconds at or below it), in value order.
    pub fn cumulative(&self) -> Vec<(f64, f64)> {
        let mut sum = 0.0;
        self.sorted()
            .into_iter()
            .map(|(v, w)| {
                sum += w;
                (v as f64 / 100.0, sum)
            })
            .collect()
    }

    /// The values at each of `pcts` (0 to 100): the smallest value with at
    /// least pct % of the time at or below it, allowing a part in 10^9 for
    /// the last bits of float sums (as the SQL does).
    pub fn quantiles(&self, pcts: &[f64]) -> Vec<Option<f64>> {
        quantiles_of(&self.cumulative(), self.total_s, pcts)
    }

    /// The time-weighted mean.
    pub fn mean(&self) -> Option<f64> {
        (self.total_s > 0.0).then(|| {
            self.sorted()
                .into_iter()
                .map(|(v, w)| v as f64 / 100.0 * w)
                .sum::<f64>()
                / self.total_s
        })
    }

    /// The share of the time (0 to 1) with a value below `limit`.
    pub fn share_below(&self, limit: f64) -> Option<f64> {
        (self.total_s > 0.0).then(|| {
            self.sorted()
                .into_iter()
                .filter(|(v, _)| (*v as f64 / 100.0) < limit)
                .map(|(_, w)| w)
                .sum::<f64>()
                / self.total_s
        })
    }
}

/// [`Distribution::quantiles`] of a distribution's cumulative times.
fn quantiles_of(cumulative: &[(f64, f64)], total_s: f64, pcts: &[f64]) -> Vec<Option<f64>> {
    pcts.iter()
        .map(|&pct| {
            cumulative
                .iter()
                .find(|(_, cum)| cum * 100.0 >= pct * total_s * (1.0 - 1e-9))
                .map(|(v, _)| *v)
        })
        .collect()
}

/// A distribution fed sample by sample, either as they are or averaged
/// over fixed windows of each device's time (`--resample 15s`, as the study
/// plots): a window's value is its samples' time-weighted mean, its weight
/// their weights' sum. Windows are aligned to the epoch.
#[derive(Debug, Clone, Default)]
pub struct Windowed {
    window_us: Option<i64>,
    /// Each device's open window: (window number, Σ value × weight, Σ weight).
    open: HashMap<u32, (i64, f64, f64)>,
    pub dist: Distribution,
}

impl Windowed {
    pub fn new(window_us: Option<i64>) -> Self {
        Self {
            window_us: window_us.filter(|w| *w > 0),
            ..Self::default()
        }
    }

    pub fn add(&mut self, device: u32, ts_us: i64, value: Option<f64>, weight_s: f64) {
        let Some(value) = value.filter(|v| v.is_finite()) else {
            return;
        };
        if weight_s <= 0.0 {
            return;
        }
        let Some(window) = self.window_us else {
            self.dist.add(value, weight_s);
            return;
        };
        let n = ts_us.div_euclid(window);
        let open = self.open.entry(device).or_insert((n, 0.0, 0.0));
        if open.0 != n {
            if open.2 > 0.0 {
                self.dist.add(open.1 / open.2, open.2);
            }
            *open = (n, 0.0, 0.0);
        }
        open.1 += value * weight_s;
        open.2 += weight_s;
    }

    /// Closes the open windows: call once, after the last sample.
    pub fn finish(mut self) -> Distribution {
        let mut open: Vec<(u32, (i64, f64, f64))> = self.open.drain().collect();
        open.sort_unstable_by_key(|o| o.0);
        for (_, (_, sum, weight)) in open {
            if weight > 0.0 {
                self.dist.add(sum / weight, weight);
            }
        }
        self.dist
    }
}

/// A distribution as a figure draws it and the export writes it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Curve {
    /// Observed time it stands for, seconds.
    pub total_s: f64,
    /// Quantiles at 0, 5, ... 100 %.
    pub quantiles: Vec<Option<f64>>,
    /// (value, share of the time at or below it, 0 to 1), thinned for drawing.
    #[serde(skip)]
    pub points: Vec<(f64, f64)>,
    /// Quantiles at the 1000 percentiles of [`thousand`].
    #[serde(skip)]
    pub thousand: Vec<Option<f64>>,
}

/// 1000 evenly spaced percentiles from 0 to 100 (numpy's
/// `linspace(0, 100, 1000)`), the resolution of the study's published CDFs.
pub fn thousand() -> Vec<f64> {
    (0..1000).map(|i| f64::from(i) * 100.0 / 999.0).collect()
}

/// The percentiles the report and fleet_cdf.sql print: 0 to 100 by 5.
pub fn twenty_one() -> Vec<f64> {
    (0..=20).map(|i| f64::from(i) * 5.0).collect()
}

impl Curve {
    pub fn of(dist: &Distribution) -> Curve {
        let cumulative = dist.cumulative();
        let total = dist.total_s();
        // At most ~400 points: every step would be thousands of SVG nodes.
        let step = (cumulative.len() / 400).max(1);
        let mut points: Vec<(f64, f64)> = cumulative
            .iter()
            .enumerate()
            .filter(|(i, _)| i % step == 0 || *i + 1 == cumulative.len())
            .map(|(_, (v, c))| (*v, c / total))
            .collect();
        if let Some(first) = cumulative.first() {
            points.insert(0, (first.0, 0.0));
        }
        Curve {
            total_s: total,
            quantiles: quantiles_of(&cumulative, total, &twenty_one()),
            points,
            thousand: quantiles_of(&cumulative, total, &thousand()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_weighted_by_time() {
        let mut d = Distribution::default();
        // 1 s at 10 %, 15 s at 90 %: the 1 Hz sample is one 16th of the time.
        d.add(10.0, 1.0);
        d.add(90.0, 15.0);
        assert_eq!(
            d.quantiles(&[0.0, 6.25, 6.3, 50.0, 100.0]),
            vec![Some(10.0), Some(10.0), Some(90.0), Some(90.0), Some(90.0)]
        );
        assert_eq!(d.mean(), Some((10.0 + 90.0 * 15.0) / 16.0));
        assert_eq!(d.share_below(50.0), Some(1.0 / 16.0));
    }

    #[test]
    fn values_are_kept_to_the_hundredth() {
        let mut d = Distribution::default();
        d.add(33.333, 1.0);
        d.add(33.334, 1.0);
        d.add(f64::NAN, 1.0);
        d.add(1.0, 0.0);
        assert_eq!(d.cumulative(), vec![(33.33, 2.0)]);
    }

    #[test]
    fn windows_average_each_device_separately() {
        let mut w = Windowed::new(Some(15_000_000));
        // Device 0: fifteen 1 s samples, 0 then 14 × 100; device 1: one 15 s sample of 50.
        for i in 0..15 {
            w.add(
                0,
                i * 1_000_000,
                Some(if i == 0 { 0.0 } else { 100.0 }),
                1.0,
            );
        }
        w.add(1, 0, Some(50.0), 15.0);
        w.add(0, 15_000_000, Some(10.0), 1.0);
        let d = w.finish();
        let mut got = d.cumulative();
        got.iter_mut().for_each(|c| c.1 = (c.1 * 1e6).round() / 1e6);
        assert_eq!(got, vec![(10.0, 1.0), (50.0, 16.0), (93.33, 31.0)]);
    }
}
