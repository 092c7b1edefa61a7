//! The text exposition format 0.0.4, written straight into one `String`.
//!
//! The bytes are those the prometheus crate's `TextEncoder` writes (the
//! golden page test in `mod.rs` holds them to it): `# HELP` with `\` and
//! newlines escaped, `# TYPE`, then one line per sample with its labels in
//! braces (none when there are no labels), values as Rust prints an `f64`.
//! Writing the text directly, rather than building the crate's protobuf
//! families first, spares the per-label allocations: a page of 8 GPUs
//! renders in about a fifth of the time (see `metrics_scrape` in
//! benches/README.md).

use std::fmt::Write as _;

use super::Kind;

/// A page being written, one family after another.
#[derive(Debug)]
pub(super) struct Text {
    out: String,
    /// The family being written: its name, and where its header starts.
    family: Option<(&'static str, usize)>,
    /// Samples written in that family so far.
    samples: usize,
}

impl Text {
    /// An empty page with room for `capacity` bytes.
    pub(super) fn with_capacity(capacity: usize) -> Self {
        Self {
            out: String::with_capacity(capacity),
            family: None,
            samples: 0,
        }
    }

    /// Starts family `name`. A family that gets no sample is taken out
    /// again when the next one starts (the format has no empty families).
    pub(super) fn family(&mut self, name: &'static str, help: &str, kind: Kind) {
        self.close();
        let start = self.out.len();
        if !help.is_empty() {
            self.out.push_str("# HELP ");
            self.out.push_str(name);
            self.out.push(' ');
            escape(&mut self.out, help, false);
            self.out.push('\n');
        }
        self.out.push_str("# TYPE ");
        self.out.push_str(name);
        self.out.push_str(match kind {
            Kind::Gauge => " gauge\n",
            Kind::Counter => " counter\n",
        });
        self.family = Some((name, start));
        self.samples = 0;
    }

    /// A sample of the current family: `labels`, then `extra` pairs after
    /// them.
    pub(super) fn sample(&mut self, labels: &Labels, extra: &[(&str, &str)], value: f64) {
        let Some((name, _)) = self.family else {
            debug_assert!(false, "a sample outside a family");
            return;
        };
        self.samples += 1;
        self.out.push_str(name);
        if !labels.0.is_empty() || !extra.is_empty() {
            self.out.push('{');
            self.out.push_str(&labels.0);
            let mut first = labels.0.is_empty();
            for (label, value) in extra {
                if !first {
                    self.out.push(',');
                }
                first = false;
                pair(&mut self.out, label, value);
            }
            self.out.push('}');
        }
        self.out.push(' ');
        push_value(&mut self.out, value);
        self.out.push('\n');
    }

    /// The page.
    pub(super) fn finish(mut self) -> String {
        self.close();
        self.out
    }

    fn close(&mut self) {
        if let Some((_, start)) = self.family.take()
            && self.samples == 0
        {
            self.out.truncate(start);
        }
    }
}

/// Labels written once, escaped, for the samples that share them:
/// `a="x",b="y"`.
#[derive(Debug, Clone, Default)]
pub(super) struct Labels(String);

impl Labels {
    /// No labels.
    pub(super) fn new() -> Self {
        Self::default()
    }

    /// Adds `name="value"` after the labels so far.
    pub(super) fn with(mut self, name: &str, value: &str) -> Self {
        if !self.0.is_empty() {
            self.0.push(',');
        }
        pair(&mut self.0, name, value);
        self
    }
}

fn pair(out: &mut String, name: &str, value: &str) {
    out.push_str(name);
    out.push_str("=\"");
    escape(out, value, true);
    out.push('"');
}

/// Appends `value` as Rust's `Display` prints an `f64`, which is what the
/// prometheus crate's encoder writes: integers without a fraction or an
/// exponent, other values as the shortest decimal that reads back as the
/// same `f64`. Integers below 10^15 and decimals from 0.0001 to 10^15 of up
/// to 15 significant digits (every value a GPU, the node or a port gives)
/// are written by `itoa` and `ryu`, without `core::fmt`, which was about a
/// third of a page's render; the rest by `Display`.
pub(super) fn push_value(out: &mut String, value: f64) {
    /// Below 2^53, every integer is an `f64` and converts exactly.
    const EXACT: f64 = 1e15;
    let magnitude = value.abs();
    // (`as` saturates, and NaN becomes 0, which is not NaN.)
    let integer = value as i64;
    if integer as f64 == value && magnitude < EXACT && !(value == 0.0 && value.is_sign_negative()) {
        out.push_str(itoa::Buffer::new().format(integer));
        return;
    }
    // ryu writes plain decimals, not exponents, between 1e-5 and 1e16.
    let mut buffer = ryu::Buffer::new();
    if (1e-4..EXACT).contains(&magnitude)
        && let Some(decimal) = shortest_as_displayed(&mut buffer, value, 15)
    {
        out.push_str(decimal);
        return;
    }
    // Writing to a String cannot fail.
    let _ = write!(out, "{value}");
}

/// ryu's shortest decimal of finite `value`, when it is the one `Display`
/// writes: when it has at most `dig` significant digits, `dig` being the
/// type's DIG (15 for an f64, 6 for an f32). Both write the shortest
/// decimal that reads back; of more digits there can be two, exactly
/// halfway, and `Display` rounds the half up where ryu rounds it to even
/// (-1010.4382934570312 against …313). Of up to DIG digits there is one: no
/// two such decimals read back as the same value. Outside 1e-5..1e16 ryu
/// writes an exponent (`1e-7`, where `Display` writes `0.0000001`), which
/// is counted as digits: the same value, other text, so `push_value`, which
/// writes the text, keeps to the range, and `decimal`, which parses it,
/// need not.
pub(super) fn shortest_as_displayed<F: ryu::Float>(
    buffer: &mut ryu::Buffer,
    value: F,
    dig: usize,
) -> Option<&str> {
    let decimal = buffer.format_finite(value);
    let digits = decimal.trim_start_matches(['-', '0', '.']);
    let significant = digits.len() - usize::from(digits.contains('.'));
    (significant <= dig).then_some(decimal)
}

/// Appends `text` with `\` and newlines escaped, and `"` too in a label
/// value.
fn escape(out: &mut String, text: &str, quotes: bool) {
    let bytes = text.as_bytes();
    let special = if quotes {
        memchr::memchr3(b'\\', b'\n', b'"', bytes)
    } else {
        memchr::memchr2(b'\\', b'\n', bytes)
    };
    if special.is_none() {
        out.push_str(text);
        return;
    }
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quotes => out.push_str("\\\""),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn displayed(value: f64) -> String {
        format!("{value}")
    }

    fn pushed(value: f64) -> String {
        let mut out = String::new();
        push_value(&mut out, value);
        out
    }

    #[test]
    fn values_are_written_as_display_writes_them() {
        for value in [
            0.0,
            -0.0,
            1.0,
            -1.0,
            1980.0,
            0.973,
            512.345,
            0.0001,
            0.00009999,
            1e-5,
            1.5e-7,
            123_456_789.0,
            999_999_999_999_999.0,
            1e15,
            1e15 + 0.5,
            -1e15,
            9_007_199_254_740_993.0,
            1e21,
            1e300,
            f64::MIN_POSITIVE,
            f64::MAX,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.1 + 0.2,
        ] {
            assert_eq!(pushed(value), displayed(value), "{value:e}");
        }
        // Values of every magnitude and digit count, from a fixed xorshift
        // sequence: bit patterns (every exponent), f32 readings as the
        // agent widens them, and ratios rounded to six decimals.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let bits = f64::from_bits(state);
            let reading = f64::from(f32::from_bits(state as u32));
            let ratio = ((state % 100_000_000) as f64 / 1e6 * 1e4).round() / 1e6;
            let scaled = (state >> 11) as f64 / (1u64 << (state % 60)) as f64;
            for value in [bits, reading, ratio, scaled, -scaled] {
                assert_eq!(pushed(value), displayed(value), "{value:e}");
            }
        }
    }

    #[test]
    fn families_without_samples_leave_nothing() {
        let mut text = Text::with_capacity(0);
        text.family("empty_first", "None.", Kind::Gauge);
        text.family("a_total", "A \\ counter\nover two lines.", Kind::Counter);
        text.sample(&Labels::new(), &[], 3.0);
        text.family("empty_between", "None.", Kind::Gauge);
        text.family("b", "", Kind::Gauge);
        let labels = Labels::new().with("x", "1").with("y", "say \"hi\"\\\n");
        text.sample(&labels, &[("z", "2")], 0.25);
        text.sample(&Labels::new(), &[("z", "3")], -1.5e-7);
        text.sample(&labels, &[], f64::NAN);
        text.family("empty_last", "None.", Kind::Counter);
        assert_eq!(
            text.finish(),
            "# HELP a_total A \\\\ counter\\nover two lines.\n\
             # TYPE a_total counter\n\
             a_total 3\n\
             # TYPE b gauge\n\
             b{x=\"1\",y=\"say \\\"hi\\\"\\\\\\n\",z=\"2\"} 0.25\n\
             b{z=\"3\"} -0.00000015\n\
             b{x=\"1\",y=\"say \\\"hi\\\"\\\\\\n\"} NaN\n"
        );
    }
}
