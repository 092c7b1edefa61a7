//! Metric values in a scenario: a constant, a trace that steps through time,
//! or an injected NVML error, and how they evaluate at an elapsed time.
//! Most metrics hold integers; the GPM percentages hold reals.

use std::fmt;
use std::marker::PhantomData;

use nvml_wrapper_sys::bindings::{
    nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED, nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST,
    nvmlReturn_enum_NVML_ERROR_NO_DATA, nvmlReturn_enum_NVML_ERROR_NO_PERMISSION,
    nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED, nvmlReturn_enum_NVML_ERROR_TIMEOUT,
    nvmlReturn_enum_NVML_ERROR_UNKNOWN, nvmlReturn_t,
};
use serde::de::{self, Deserialize, Deserializer, SeqAccess, Visitor};

/// An NVML error a scenario can inject in place of a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `"unsupported"`: NVML_ERROR_NOT_SUPPORTED.
    NotSupported,
    /// `"gpu_lost"`: NVML_ERROR_GPU_IS_LOST.
    GpuLost,
    /// `"no_permission"`: NVML_ERROR_NO_PERMISSION.
    NoPermission,
    /// `"no_data"`: NVML_ERROR_NO_DATA.
    NoData,
    /// `"timeout"`: NVML_ERROR_TIMEOUT.
    Timeout,
    /// `"driver_not_loaded"`: NVML_ERROR_DRIVER_NOT_LOADED.
    DriverNotLoaded,
    /// `"unknown"`: NVML_ERROR_UNKNOWN.
    Unknown,
}

impl Fault {
    /// Every fault with the name a scenario spells it with.
    pub const ALL: [(&'static str, Fault); 7] = [
        ("unsupported", Fault::NotSupported),
        ("gpu_lost", Fault::GpuLost),
        ("no_permission", Fault::NoPermission),
        ("no_data", Fault::NoData),
        ("timeout", Fault::Timeout),
        ("driver_not_loaded", Fault::DriverNotLoaded),
        ("unknown", Fault::Unknown),
    ];

    /// The fault a scenario names, if the name is one of [`Fault::ALL`].
    pub fn from_name(name: &str) -> Option<Fault> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
    }

    /// The `nvmlReturn_t` an NVML call returns for this fault.
    pub fn code(self) -> nvmlReturn_t {
        match self {
            Fault::NotSupported => nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
            Fault::GpuLost => nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST,
            Fault::NoPermission => nvmlReturn_enum_NVML_ERROR_NO_PERMISSION,
            Fault::NoData => nvmlReturn_enum_NVML_ERROR_NO_DATA,
            Fault::Timeout => nvmlReturn_enum_NVML_ERROR_TIMEOUT,
            Fault::DriverNotLoaded => nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED,
            Fault::Unknown => nvmlReturn_enum_NVML_ERROR_UNKNOWN,
        }
    }

    fn names() -> String {
        Self::ALL
            .iter()
            .map(|(n, _)| format!("\"{n}\""))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl<'de> Deserialize<'de> for Fault {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Fault::from_name(&name).ok_or_else(|| {
            de::Error::custom(format!(
                "unknown error name \"{name}\", expected one of {}",
                Fault::names()
            ))
        })
    }
}

/// What a metric's values are: whole numbers (`u64`, most metrics) or
/// non-negative reals (`f64`, the GPM percentages). A value of the wrong kind
/// is a parse error naming the key's line.
pub trait Value: Copy + PartialEq + fmt::Debug + fmt::Display {
    /// How the parser describes one value of this kind in an error.
    const EXPECTING: &'static str;

    /// A TOML integer, already known to be non-negative.
    fn from_u64(v: u64) -> Self;

    /// A TOML float, or why this kind of metric does not take it.
    fn from_f64(v: f64) -> Result<Self, String>;
}

impl Value for u64 {
    const EXPECTING: &'static str = "a non-negative integer";

    fn from_u64(v: u64) -> u64 {
        v
    }

    fn from_f64(v: f64) -> Result<u64, String> {
        Err(format!(
            "{v} is not an integer; this metric takes whole numbers in the unit its key names"
        ))
    }
}

impl Value for f64 {
    const EXPECTING: &'static str = "a non-negative number";

    fn from_u64(v: u64) -> f64 {
        // Percentages and rates: far below 2^53, so exact.
        v as f64
    }

    fn from_f64(v: f64) -> Result<f64, String> {
        if v.is_finite() && v >= 0.0 {
            Ok(v)
        } else {
            Err(format!("{v} is not a finite, non-negative number"))
        }
    }
}

/// One point of a metric: a value or an injected error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sample<T = u64> {
    /// The value NVML reports, in the metric's unit.
    Value(T),
    /// The error NVML returns instead.
    Fault(Fault),
}

impl<T: Copy> Sample<T> {
    /// The value, or the fault as an error.
    pub fn get(self) -> Result<T, Fault> {
        match self {
            Sample::Value(v) => Ok(v),
            Sample::Fault(f) => Err(f),
        }
    }
}

impl Sample<u64> {
    /// The value, counting an error as zero (what an integral needs).
    fn or_zero(self) -> u64 {
        match self {
            Sample::Value(v) => v,
            Sample::Fault(_) => 0,
        }
    }
}

struct SampleVisitor<T>(PhantomData<T>);

impl<T: Value> Visitor<'_> for SampleVisitor<T> {
    type Value = Sample<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} or an error name ({})", T::EXPECTING, Fault::names())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Sample<T>, E> {
        Ok(Sample::Value(T::from_u64(v)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Sample<T>, E> {
        u64::try_from(v)
            .map(|v| Sample::Value(T::from_u64(v)))
            .map_err(|_| E::custom(format!("{v} is negative; NVML values are unsigned")))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Sample<T>, E> {
        T::from_f64(v).map(Sample::Value).map_err(E::custom)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Sample<T>, E> {
        Fault::from_name(v).map(Sample::Fault).ok_or_else(|| {
            E::custom(format!(
                "unknown error name \"{v}\", expected a number or one of {}",
                Fault::names()
            ))
        })
    }
}

impl<'de, T: Value> Deserialize<'de> for Sample<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(SampleVisitor(PhantomData))
    }
}

/// A metric of one GPU: what it reads at any point in time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Metric<T = u64> {
    /// The same sample at every instant (`45`, or `"unsupported"`).
    Constant(Sample<T>),
    /// Sample `i` holds during step `i`, and the trace repeats (`[1, 2, 3]`).
    /// Never empty.
    Trace(Vec<Sample<T>>),
}

impl<T: Copy> Metric<T> {
    /// A metric that always reads `value`.
    pub const fn constant(value: T) -> Metric<T> {
        Metric::Constant(Sample::Value(value))
    }

    /// A metric that always fails with `fault`.
    pub const fn fault(fault: Fault) -> Metric<T> {
        Metric::Constant(Sample::Fault(fault))
    }

    /// The sample during step `step` (counted from init, with any phase applied).
    pub fn at(&self, step: u64) -> Sample<T> {
        match self {
            Metric::Constant(s) => *s,
            // Parsing never builds an empty trace; a hand-built one reads as
            // an error rather than dividing by zero.
            Metric::Trace(trace) if trace.is_empty() => Sample::Fault(Fault::Unknown),
            Metric::Trace(trace) => {
                // The remainder is < len, so it fits usize.
                let i = step % trace.len() as u64;
                trace[i as usize]
            }
        }
    }

    /// Every sample this metric can read.
    pub fn samples(&self) -> &[Sample<T>] {
        match self {
            Metric::Constant(s) => std::slice::from_ref(s),
            Metric::Trace(t) => t,
        }
    }
}

impl Metric<u64> {
    /// ∫₀ˣ metric(t) dt, for `x` in milliseconds and steps of `step_ms`,
    /// counting errors as zero. For power in mW the result is in mW·ms (µJ);
    /// for a rate in B/s it is in B·ms/s (mB).
    pub fn integral(&self, step_ms: u64, x_ms: u128) -> u128 {
        match self {
            Metric::Constant(s) => u128::from(s.or_zero()) * x_ms,
            Metric::Trace(trace) if trace.is_empty() => 0,
            Metric::Trace(trace) => {
                let step = u128::from(step_ms.max(1));
                let len = trace.len() as u128;
                let cycle_ms = step * len;
                let cycle_sum: u128 = trace.iter().map(|s| u128::from(s.or_zero())).sum();
                let (cycles, rest) = (x_ms / cycle_ms, x_ms % cycle_ms);
                let (full_steps, partial_ms) = (rest / step, rest % step);
                // full_steps < len, so it fits usize.
                let head: u128 = trace
                    .iter()
                    .take(full_steps as usize)
                    .map(|s| u128::from(s.or_zero()))
                    .sum();
                let current = trace
                    .get(full_steps as usize)
                    .map_or(0, |s| u128::from(s.or_zero()));
                cycles * cycle_sum * step + head * step + current * partial_ms
            }
        }
    }
}

struct MetricVisitor<T>(PhantomData<T>);

impl<'de, T: Value> Visitor<'de> for MetricVisitor<T> {
    type Value = Metric<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, an error name ({}), or a non-empty array of those",
            T::EXPECTING,
            Fault::names()
        )
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Metric<T>, E> {
        SampleVisitor(PhantomData)
            .visit_u64(v)
            .map(Metric::Constant)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Metric<T>, E> {
        SampleVisitor(PhantomData)
            .visit_i64(v)
            .map(Metric::Constant)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Metric<T>, E> {
        SampleVisitor(PhantomData)
            .visit_f64(v)
            .map(Metric::Constant)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Metric<T>, E> {
        SampleVisitor(PhantomData)
            .visit_str(v)
            .map(Metric::Constant)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Metric<T>, A::Error> {
        let mut trace = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(sample) = seq.next_element::<Sample<T>>()? {
            trace.push(sample);
        }
        if trace.is_empty() {
            return Err(de::Error::custom(
                "a trace needs at least one value; write \"unsupported\" for a metric without values",
            ));
        }
        Ok(Metric::Trace(trace))
    }
}

impl<'de, T: Value> Deserialize<'de> for Metric<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(MetricVisitor(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(values: &[u64]) -> Metric {
        Metric::Trace(values.iter().map(|v| Sample::Value(*v)).collect())
    }

    #[test]
    fn trace_steps_and_wraps() {
        let m = trace(&[10, 20, 30]);
        let got: Vec<_> = (0..7).map(|s| m.at(s)).collect();
        let want: Vec<_> = [10, 20, 30, 10, 20, 30, 10]
            .iter()
            .map(|v| Sample::Value(*v))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn constant_integral_is_value_times_time() {
        assert_eq!(Metric::constant(300_000).integral(1000, 2_500), 750_000_000);
        assert_eq!(Metric::constant(7).integral(1000, 0), 0);
    }

    #[test]
    fn trace_integral_covers_cycles_steps_and_partial_step() {
        let m = trace(&[100, 200, 400]);
        // One cycle (3 steps of 10 ms) = 7000; then 100*10 + 200*4.
        assert_eq!(m.integral(10, 44), 7_000 + 1_000 + 800);
        assert_eq!(m.integral(10, 30), 7_000);
        assert_eq!(m.integral(10, 5), 500);
    }

    #[test]
    fn faults_integrate_as_zero() {
        let m = Metric::Trace(vec![Sample::Value(100), Sample::Fault(Fault::GpuLost)]);
        assert_eq!(m.integral(10, 40), 2_000);
        assert_eq!(
            Metric::Constant(Sample::Fault(Fault::NotSupported)).integral(10, 40),
            0
        );
    }

    #[derive(Debug, serde::Deserialize)]
    struct Keys {
        int: Option<Metric>,
        real: Option<Metric<f64>>,
    }

    fn keys(text: &str) -> Result<Keys, String> {
        toml::from_str(text).map_err(|e| e.message().to_owned())
    }

    #[test]
    fn real_metrics_take_floats_and_integers() {
        let k = keys("real = 87.5").expect("parses");
        assert_eq!(k.real, Some(Metric::constant(87.5)));
        let k = keys("real = [0, 12.5, \"unsupported\"]").expect("parses");
        assert_eq!(
            k.real,
            Some(Metric::Trace(vec![
                Sample::Value(0.0),
                Sample::Value(12.5),
                Sample::Fault(Fault::NotSupported)
            ]))
        );
        for bad in ["real = nan", "real = inf", "real = -0.5", "real = -1"] {
            assert!(keys(bad).is_err(), "{bad} must be rejected");
        }
        assert_eq!(
            keys("real = -0.5").err().as_deref(),
            Some("-0.5 is not a finite, non-negative number")
        );
    }

    #[test]
    fn integer_metrics_reject_floats() {
        assert_eq!(
            keys("int = 1.5").err().as_deref(),
            Some(
                "1.5 is not an integer; this metric takes whole numbers in the unit its key names"
            )
        );
        assert!(keys("int = [1, 2.0]").is_err());
        assert_eq!(
            keys("int = 7").expect("parses").int,
            Some(Metric::constant(7))
        );
    }

    #[test]
    fn fault_constant_reads_its_fault() {
        let m: Metric = Metric::fault(Fault::GpuLost);
        assert_eq!(m.at(3).get(), Err(Fault::GpuLost));
    }

    #[test]
    fn fault_names_round_trip_to_codes() {
        assert_eq!(
            Fault::from_name("unsupported").map(Fault::code),
            Some(nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED)
        );
        assert_eq!(
            Fault::from_name("gpu_lost").map(Fault::code),
            Some(nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST)
        );
        assert_eq!(Fault::from_name("Unsupported"), None);
    }
}
