//! The report as text for a terminal: a header for the job, a block per
//! GPU with bars for the shares, then events, alerts and hints. Plain
//! Unicode, no colour, so it reads the same in a pipe, a mail and a log.

use std::fmt::Write as _;

use super::JobReport;
use super::summary::{GpuFigures, device_name};

/// Width of the hints' lines, in characters.
const LINE_WIDTH: usize = 80;
/// Width of a bar, in characters.
const BAR_WIDTH: usize = 30;

/// A bar of `pct` percent (clamped to 0–100).
pub fn bar(pct: f64) -> String {
    let filled = ((pct.clamp(0.0, 100.0) / 100.0) * BAR_WIDTH as f64).round() as usize;
    format!("[{}{}]", "█".repeat(filled), "░".repeat(BAR_WIDTH - filled))
}

/// `1 h 02 min 05 s`, `3 min 20 s`, `0.9 s`.
fn duration(s: f64) -> String {
    if s < 60.0 {
        return format!("{s:.1} s");
    }
    let total = s.round() as u64;
    let (h, m, sec) = (total / 3600, total / 60 % 60, total % 60);
    if h > 0 {
        format!("{h} h {m:02} min {sec:02} s")
    } else {
        format!("{m} min {sec:02} s")
    }
}

fn energy(kwh: f64) -> String {
    if kwh >= 1.0 {
        format!("{kwh:.2} kWh")
    } else {
        format!("{:.2} Wh", kwh * 1000.0)
    }
}

fn gib(bytes: i64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.1} %"))
}

/// The report as text.
pub fn text(r: &JobReport, store: &str) -> String {
    let mut out = String::new();
    let t = &r.totals;
    let _ = writeln!(out, "Job {} in {store}", r.job_id);
    if let Some(s) = &r.scheduler {
        let mut words: Vec<String> = Vec::new();
        if let Some(user) = &s.user {
            words.push(format!("user {user}"));
        }
        if let Some(queue) = &s.queue {
            words.push(format!("queue {queue}"));
        }
        if let Some(kind) = &s.job_type {
            words.push(kind.clone());
        }
        if let Some(state) = &s.state {
            words.push(state.clone());
        }
        if let (Some(start), Some(end)) = (&s.start_time, &s.end_time) {
            words.push(format!("ran {start} to {end}"));
        }
        let source = s.source.as_deref().unwrap_or("scheduler");
        let _ = writeln!(out, "  scheduler   {} ({source})", words.join(", "));
    }
    let _ = writeln!(
        out,
        "  sampled     {} to {} ({})",
        r.first_ts,
        r.last_ts,
        duration(r.duration_s)
    );
    let _ = writeln!(
        out,
        "  GPUs        {} on {} node{} ({}), {:.2} GPU-hours",
        t.gpus,
        t.nodes.len(),
        if t.nodes.len() == 1 { "" } else { "s" },
        t.nodes.join(", "),
        t.gpu_hours
    );
    let _ = writeln!(
        out,
        "  utilization {} {} mean",
        bar(t.gpu_util_mean_pct.unwrap_or(0.0)),
        pct(t.gpu_util_mean_pct)
    );
    if t.sm_active_mean_pct.is_some() {
        let _ = writeln!(
            out,
            "  SM active   {} {} mean",
            bar(t.sm_active_mean_pct.unwrap_or(0.0)),
            pct(t.sm_active_mean_pct)
        );
    }
    if let Some(kwh) = t.energy_kwh {
        let _ = writeln!(out, "  energy      {}", energy(kwh));
    }
    let mut node = None;
    for g in &r.gpus {
        if node != Some(&g.node) {
            let _ = writeln!(out, "\n{}", g.node);
            node = Some(&g.node);
        }
        gpu(&mut out, g, r);
    }
    if !r.events.is_empty() {
        let _ = writeln!(out, "\nEvents");
        for e in &r.events {
            let on = e
                .gpu
                .map_or_else(|| e.node.clone(), |g| format!("{} GPU {g}", e.node));
            let line = format!("  {}  {on}  {} {}  {}", e.ts, e.kind, e.code, e.detail);
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }
    if !r.alerts.is_empty() {
        let _ = writeln!(out, "\nAlerts");
        for a in &r.alerts {
            let on = a
                .gpu
                .map_or_else(|| a.node.clone(), |g| format!("{} GPU {g}", a.node));
            let value = a
                .value
                .map_or_else(String::new, |v| format!(" (value {v})"));
            let _ = writeln!(
                out,
                "  {}  {on}  {} {} {}{value}",
                a.ts, a.rule, a.severity, a.status
            );
        }
    }
    let _ = writeln!(out, "\nHints");
    if r.hints.is_empty() {
        let _ = writeln!(
            out,
            "  none: every GPU was busy, used its SMs and memory, and ran at full clocks."
        );
    }
    for h in &r.hints {
        let _ = writeln!(out, "{}", wrap(&h.text, "  * ", "    "));
    }
    let s = &r.read;
    let _ = writeln!(
        out,
        "\nRead {} of {} bytes ({} requests) in {} files, {} of {} row groups.",
        s.bytes_read, s.file_bytes, s.requests, s.files, s.row_groups_read, s.row_groups
    );
    out
}

/// Words of `text` in lines of at most [`LINE_WIDTH`] characters, the first
/// after `first`, the others after `rest`.
fn wrap(text: &str, first: &str, rest: &str) -> String {
    let mut out = String::from(first);
    let mut width = first.chars().count();
    let mut start = true;
    for word in text.split_whitespace() {
        let len = word.chars().count();
        if !start && width + 1 + len > LINE_WIDTH {
            out.push('\n');
            out.push_str(rest);
            width = rest.chars().count();
            start = true;
        }
        if !start {
            out.push(' ');
            width += 1;
        }
        out.push_str(word);
        width += len;
        start = false;
    }
    out
}

fn gpu(out: &mut String, g: &GpuFigures, r: &JobReport) {
    let name = device_name(g);
    let label = name.strip_prefix(&g.node).unwrap_or(&name).trim();
    let model = g.model.as_deref().unwrap_or("");
    let profile = g
        .mig_profile
        .as_deref()
        .map_or_else(String::new, |p| format!(" {p}"));
    let _ = writeln!(
        out,
        "  {label}  {model}{profile}  ({} samples every {} s, {})",
        g.samples,
        g.interval_s,
        duration(g.time_s)
    );
    let peak = |v: Option<f64>| v.map_or_else(String::new, |v| format!(", peak {v:.1} %"));
    let _ = writeln!(
        out,
        "    utilization {} {} mean{}",
        bar(g.gpu_util_mean_pct.unwrap_or(0.0)),
        pct(g.gpu_util_mean_pct),
        peak(g.gpu_util_max_pct)
    );
    let _ = writeln!(
        out,
        "    SM active   {} {}{}",
        bar(g.sm_active_mean_pct.unwrap_or(0.0)),
        g.sm_active_mean_pct
            .map_or_else(|| "not measured".to_owned(), |v| format!("{v:.1} % mean")),
        peak(g.sm_active_max_pct)
    );
    if let (Some(used), Some(total)) = (g.memory_used_max_bytes, g.memory_total_bytes) {
        let _ = writeln!(
            out,
            "    memory      {} {} peak of {} ({})",
            bar(g.memory_used_max_pct.unwrap_or(0.0)),
            gib(used),
            gib(total),
            pct(g.memory_used_max_pct)
        );
    }
    if let Some(mean) = g.power_mean_w {
        let _ = writeln!(
            out,
            "    power       {mean:.1} W mean, {:.1} W peak, {}",
            g.power_max_w.unwrap_or(mean),
            g.energy_kwh.map_or_else(String::new, energy)
        );
    }
    if let Some(max) = g.temperature_max_c {
        let memory = g
            .memory_temperature_max_c
            .map_or_else(String::new, |m| format!(", memory {m} °C max"));
        let _ = writeln!(
            out,
            "    temperature {max} °C max, {:.1} °C mean{memory}",
            g.temperature_mean_c.unwrap_or_default()
        );
    }
    let _ = writeln!(
        out,
        "    throttled   thermal {}, power {}, hardware slowdown {}",
        duration(g.throttle_thermal_s),
        duration(g.throttle_power_s),
        duration(g.throttle_hw_slowdown_s)
    );
    let mut xids: Vec<i64> = r
        .events
        .iter()
        .filter(|e| e.kind == "xid" && e.node == g.node && e.gpu == Some(i64::from(g.gpu)))
        .map(|e| e.code)
        .collect();
    xids.sort_unstable();
    if !xids.is_empty() {
        let list: Vec<String> = xids.iter().map(i64::to_string).collect();
        let _ = writeln!(out, "    XIDs        {}", list.join(", "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_and_durations() {
        assert_eq!(bar(0.0), format!("[{}]", "░".repeat(30)));
        assert_eq!(bar(50.0), format!("[{}{}]", "█".repeat(15), "░".repeat(15)));
        assert_eq!(bar(130.0), format!("[{}]", "█".repeat(30)));
        assert_eq!(duration(0.94), "0.9 s");
        assert_eq!(duration(200.0), "3 min 20 s");
        assert_eq!(duration(3725.0), "1 h 02 min 05 s");
        assert_eq!(energy(0.000_170_666), "0.17 Wh");
        assert_eq!(energy(12.345), "12.35 kWh");
        assert_eq!(
            wrap(&"word ".repeat(20), "  * ", "    "),
            format!(
                "  * {}word\n    {}word",
                "word ".repeat(14),
                "word ".repeat(4)
            )
        );
    }
}
