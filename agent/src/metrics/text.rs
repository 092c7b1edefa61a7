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
        // Writing to a String cannot fail.
        let _ = writeln!(self.out, " {value}");
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

/// Appends `text` with `\` and newlines escaped, and `"` too in a label
/// value.
fn escape(out: &mut String, text: &str, quotes: bool) {
    let special = |c: char| c == '\\' || c == '\n' || (quotes && c == '"');
    if !text.contains(special) {
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
