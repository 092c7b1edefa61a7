//! Inline SVG charts: CDF lines, a scatter plot, horizontal bars. Plain
//! SVG 1.1 with no script and no external reference, so a page shows its
//! figures offline, in any browser, and in a file viewer.

use std::fmt::Write as _;

const W: f64 = 640.0;
const H: f64 = 300.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 44.0;
/// Line colours, told apart by people with the common colour blindnesses
/// (Okabe and Ito's palette).
pub const COLOURS: [&str; 6] = [
    "#0072b2", "#e69f00", "#009e73", "#cc79a7", "#d55e00", "#56b4e9",
];

/// Escapes text for XML (element content and attribute values).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => {}
            c => out.push(c),
        }
    }
    out
}

/// Round tick positions covering [lo, hi]: about five.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(f64::EPSILON);
    let raw = span / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| span / s <= 6.0)
        .unwrap_or(10.0 * magnitude);
    let mut out = Vec::new();
    let mut t = (lo / step).ceil() * step;
    while t <= hi + step * 1e-9 {
        out.push(if t.abs() < step * 1e-9 { 0.0 } else { t });
        t += step;
    }
    out
}

/// A number as an axis label: no trailing zeros, thousands as k.
pub fn number(v: f64) -> String {
    if v.abs() >= 10_000.0 {
        return format!("{}k", number(v / 1000.0));
    }
    let text = format!("{v:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// The axes of a plot: x and y mapped from data to pixels.
struct Frame {
    x: (f64, f64),
    y: (f64, f64),
    log_x: bool,
}

impl Frame {
    fn px(&self, x: f64) -> f64 {
        let (lo, hi, x) = if self.log_x {
            (self.x.0.log10(), self.x.1.log10(), x.max(self.x.0).log10())
        } else {
            (self.x.0, self.x.1, x)
        };
        LEFT + (x - lo) / (hi - lo).max(f64::EPSILON) * (W - LEFT - RIGHT)
    }

    fn py(&self, y: f64) -> f64 {
        H - BOTTOM - (y - self.y.0) / (self.y.1 - self.y.0).max(f64::EPSILON) * (H - TOP - BOTTOM)
    }

    /// Grid, ticks and axis titles.
    fn axes(&self, out: &mut String, x_title: &str, y_title: &str, y_pct: bool) {
        let x_ticks = if self.log_x {
            let (lo, hi) = (
                self.x.0.log10().floor() as i32,
                self.x.1.log10().ceil() as i32,
            );
            (lo..=hi)
                .map(|e| 10f64.powi(e))
                .filter(|t| *t >= self.x.0 * 0.999 && *t <= self.x.1 * 1.001)
                .collect()
        } else {
            ticks(self.x.0, self.x.1)
        };
        for t in x_ticks {
            let x = self.px(t);
            let _ = write!(
                out,
                r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" class="grid"/><text x="{x:.1}" y="{:.1}" class="tick" text-anchor="middle">{}</text>"##,
                H - BOTTOM,
                H - BOTTOM + 16.0,
                number(t)
            );
        }
        for t in ticks(self.y.0, self.y.1) {
            let y = self.py(t);
            let label = if y_pct {
                format!("{}%", number(t * 100.0))
            } else {
                number(t)
            };
            let _ = write!(
                out,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" class="grid"/><text x="{:.1}" y="{:.1}" class="tick" text-anchor="end">{label}</text>"##,
                W - RIGHT,
                LEFT - 6.0,
                y + 4.0
            );
        }
        let _ = write!(
            out,
            r##"<rect x="{LEFT}" y="{TOP}" width="{:.1}" height="{:.1}" class="frame"/><text x="{:.1}" y="{:.1}" class="title" text-anchor="middle">{}</text><text transform="translate(14 {:.1}) rotate(-90)" class="title" text-anchor="middle">{}</text>"##,
            W - LEFT - RIGHT,
            H - TOP - BOTTOM,
            LEFT + (W - LEFT - RIGHT) / 2.0,
            H - 8.0,
            escape(x_title),
            TOP + (H - TOP - BOTTOM) / 2.0,
            escape(y_title)
        );
    }
}

fn open(out: &mut String, title: &str) {
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img"><title>{}</title><style>.grid{{stroke:#e4e4e4;stroke-width:1}}.frame{{fill:none;stroke:#888;stroke-width:1}}.tick{{font:11px sans-serif;fill:#444}}.title{{font:12px sans-serif;fill:#222}}.legend{{font:12px sans-serif;fill:#222}}</style><rect width="{W}" height="{H}" fill="#fff"/>"##,
        escape(title)
    );
}

fn legend(out: &mut String, labels: &[&str]) {
    if labels.len() < 2 {
        return;
    }
    // Bottom right: under a CDF's curves, which rise to the top right.
    for (i, label) in labels.iter().enumerate() {
        let y = H - BOTTOM - 8.0 - 16.0 * (labels.len() - 1 - i) as f64;
        let x = W - RIGHT - 190.0;
        let _ = write!(
            out,
            r##"<line x1="{x}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{}" stroke-width="3"/><text x="{:.1}" y="{y:.1}" class="legend">{}</text>"##,
            y - 4.0,
            x + 18.0,
            y - 4.0,
            COLOURS[i % COLOURS.len()],
            x + 24.0,
            escape(label)
        );
    }
}

/// A CDF per series: x the value, y the share of the time at or below it.
/// Each series is (label, points of (value, share 0..1)), already sorted.
/// With `pct`, the x axis runs from 0 to (at least) 100.
pub fn cdf(title: &str, x_title: &str, series: &[(&str, &[(f64, f64)])], pct: bool) -> String {
    let values = series.iter().flat_map(|(_, p)| p.iter().map(|p| p.0));
    let (mut lo, mut hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        (lo, hi) = (0.0, 1.0);
    }
    // Percent scales start at 0; others hug the data.
    if lo >= 0.0 && lo < hi * 0.5 {
        lo = 0.0;
    }
    if pct {
        lo = lo.min(0.0);
        hi = hi.max(100.0);
    }
    if hi <= lo {
        hi = lo + 1.0;
    }
    let frame = Frame {
        x: (lo, hi),
        y: (0.0, 1.0),
        log_x: false,
    };
    let mut out = String::new();
    open(&mut out, title);
    frame.axes(&mut out, x_title, "share of time at or below", true);
    for (i, (_, points)) in series.iter().enumerate() {
        // A step function: flat until the next value, then up.
        let mut d = String::new();
        let mut last_y = 0.0;
        for (j, (x, y)) in points.iter().enumerate() {
            let (px, py) = (frame.px(*x), frame.py(*y));
            if j == 0 {
                let _ = write!(d, "M{px:.1} {:.1}", frame.py(0.0));
            } else {
                let _ = write!(d, "H{px:.1}");
            }
            if (*y - last_y).abs() > 0.0 {
                let _ = write!(d, "V{py:.1}");
            }
            last_y = *y;
        }
        let _ = write!(
            out,
            r##"<path d="{d}" fill="none" stroke="{}" stroke-width="2"/>"##,
            COLOURS[i % COLOURS.len()]
        );
    }
    let labels: Vec<&str> = series.iter().map(|s| s.0).collect();
    legend(&mut out, &labels);
    out.push_str("</svg>");
    out
}

/// Points (x, y), x on a log scale (durations), y 0 to 100 %.
pub fn scatter(title: &str, x_title: &str, y_title: &str, points: &[(f64, f64)]) -> String {
    let xs = points.iter().map(|p| p.0).filter(|x| *x > 0.0);
    let (lo, hi) = xs.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if lo > hi {
        (1.0, 10.0)
    } else {
        (
            10f64.powf(lo.log10().floor()),
            10f64
                .powf(hi.log10().ceil())
                .max(10f64.powf(lo.log10().floor() + 1.0)),
        )
    };
    let frame = Frame {
        x: (lo, hi),
        y: (0.0, 100.0),
        log_x: true,
    };
    let mut out = String::new();
    open(&mut out, title);
    frame.axes(&mut out, x_title, y_title, false);
    for (x, y) in points.iter().filter(|p| p.0 > 0.0) {
        let _ = write!(
            out,
            r##"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}" fill-opacity="0.6"/>"##,
            frame.px(*x),
            frame.py(y.clamp(0.0, 100.0)),
            COLOURS[0]
        );
    }
    out.push_str("</svg>");
    out
}

/// Horizontal bars: (label, value), the scale from 0 to the largest value
/// (or to 100 when `pct`).
pub fn bars(title: &str, x_title: &str, rows: &[(String, f64)], pct: bool) -> String {
    let rows = &rows[..rows.len().min(24)];
    let height = TOP + BOTTOM + 20.0 * rows.len().max(1) as f64;
    let max = if pct {
        100.0
    } else {
        rows.iter()
            .map(|r| r.1)
            .fold(0.0, f64::max)
            .max(f64::EPSILON)
    };
    let left = 170.0;
    let width = W - left - RIGHT - 50.0;
    let mut out = String::new();
    let _ = write!(
        out,
        r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height}" width="{W}" height="{height}" role="img"><title>{}</title><style>.tick{{font:11px sans-serif;fill:#444}}.title{{font:12px sans-serif;fill:#222}}</style><rect width="{W}" height="{height}" fill="#fff"/>"##,
        escape(title)
    );
    for (i, (label, value)) in rows.iter().enumerate() {
        let y = TOP + 20.0 * i as f64;
        let w = (value / max).clamp(0.0, 1.0) * width;
        let shown: String = label.chars().take(26).collect();
        let _ = write!(
            out,
            r##"<text x="{:.1}" y="{:.1}" class="tick" text-anchor="end">{}</text><rect x="{left}" y="{:.1}" width="{w:.1}" height="14" fill="{}"/><text x="{:.1}" y="{:.1}" class="tick">{}</text>"##,
            left - 6.0,
            y + 11.0,
            escape(&shown),
            y + 1.0,
            COLOURS[0],
            left + w + 4.0,
            y + 11.0,
            escape(&number(*value))
        );
    }
    let _ = write!(
        out,
        r##"<text x="{:.1}" y="{:.1}" class="title" text-anchor="middle">{}</text></svg>"##,
        left + width / 2.0,
        height - 8.0,
        escape(x_title)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 100.0), vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        let labels: Vec<String> = ticks(0.0, 1.0).into_iter().map(number).collect();
        assert_eq!(labels, ["0", "0.2", "0.4", "0.6", "0.8", "1"]);
        assert_eq!(ticks(31.0, 74.0), vec![40.0, 50.0, 60.0, 70.0]);
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(escape("a<b & \"c\"\u{7}"), "a&lt;b &amp; &quot;c&quot;");
        let svg = bars("t", "x", &[("<job>".into(), 3.0)], false);
        assert!(svg.contains("&lt;job&gt;") && !svg.contains("<job>"));
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(number(20.0), "20");
        assert_eq!(number(0.25), "0.25");
        assert_eq!(number(86400.0), "86.4k");
    }
}
