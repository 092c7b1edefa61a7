//! The report as one HTML page: inline SVG figures, each with a one-line
//! reading and the shipped SQL that computes its numbers in DuckDB. No
//! script, no style sheet or font from elsewhere: it opens offline.

use std::fmt::Write as _;

use super::cdf::Curve;
use super::svg::{self, escape, number};
use super::{CDF_METRICS, Fleet};

/// One figure of the page.
#[derive(Debug)]
pub struct Figure {
    /// The anchor, e.g. `gpu_util_pct`.
    pub id: String,
    pub title: String,
    pub reading: String,
    pub svg: String,
    /// The shipped query (schemas/sql/) and what of it the figure shows.
    pub sql: &'static str,
    pub sql_note: String,
}

fn metric(name: &str) -> (&'static str, &'static str) {
    CDF_METRICS
        .iter()
        .find(|m| m.0 == name)
        .map_or(("", ""), |m| (m.1, m.2))
}

fn pct_or_unit(v: f64, unit: &str) -> String {
    if unit == "%" {
        format!("{} %", number(v))
    } else {
        format!("{} {unit}", number(v))
    }
}

/// A CDF figure of one or more fleet_cdf.sql columns.
fn cdf_figure(fleet: &Fleet, id: &str, title: &str, columns: &[&str]) -> Option<Figure> {
    let curves: Vec<(&str, &Curve)> = columns
        .iter()
        .filter_map(|c| fleet.cdfs.get(c).map(|curve| (*c, curve)))
        .collect();
    let (first, curve) = curves.first()?;
    let (name, unit) = metric(first);
    let q = |c: &Curve, i: usize| c.quantiles.get(i).copied().flatten();
    let reading = match (q(curve, 10), q(curve, 18)) {
        (Some(p50), Some(p90)) => format!(
            "{name}: half of the observed time at or below {}, a tenth of it above {}.",
            pct_or_unit(p50, unit),
            pct_or_unit(p90, unit)
        ),
        _ => format!("{name}."),
    };
    let labels: Vec<String> = curves.iter().map(|(c, _)| metric(c).0.to_owned()).collect();
    let series: Vec<(&str, &[(f64, f64)])> = curves
        .iter()
        .zip(&labels)
        .map(|((_, curve), label)| (label.as_str(), curve.points.as_slice()))
        .collect();
    let x_title = if curves.len() == 1 {
        format!("{name} ({unit})")
    } else {
        format!("value ({unit})")
    };
    Some(Figure {
        id: id.to_owned(),
        title: title.to_owned(),
        reading,
        svg: svg::cdf(title, &x_title, &series, unit == "%"),
        sql: "fleet_cdf.sql",
        sql_note: format!("columns {}", columns.join(", ")),
    })
}

/// Every figure the store's data supports, in the page's order.
pub fn figures(fleet: &Fleet) -> Vec<Figure> {
    let mut out = Vec::new();
    let cdfs: [(&str, &str, &[&str]); 9] = [
        ("gpu_util", "GPU utilization", &["gpu_util_pct"]),
        (
            "sm",
            "SM activity, SM occupancy and tensor activity",
            &["sm_active_pct", "sm_occupancy_pct", "tensor_active_pct"],
        ),
        ("gpu_memory", "GPU memory used", &["gpu_mem_share_pct"]),
        (
            "gpu_power_share",
            "GPU power, of the limit",
            &["power_share_pct"],
        ),
        ("gpu_power", "GPU power", &["power_w"]),
        (
            "temperature",
            "GPU and GPU memory temperature",
            &["temperature_c", "memory_temperature_c"],
        ),
        ("host_cpu", "Host CPU", &["cpu_busy_pct"]),
        ("host_memory", "Host memory", &["host_mem_share_pct"]),
        (
            "infiniband",
            "InfiniBand send and receive",
            &["ib_xmit_share_pct", "ib_rcv_share_pct"],
        ),
    ];
    for (id, title, columns) in cdfs {
        out.extend(cdf_figure(fleet, id, title, columns));
    }
    if !fleet.power_states.is_empty() {
        let series: Vec<(&str, &[(f64, f64)])> = fleet
            .power_states
            .iter()
            .map(|s| (s.state, s.curve.points.as_slice()))
            .collect();
        let idle: Vec<String> = fleet
            .power_states
            .iter()
            .filter(|s| s.state != "allocated, active")
            .map(|s| {
                format!(
                    "{} GPUs drew {} W at the median, {} % of the GPU energy",
                    s.state,
                    s.power_w_p50.map_or("?".into(), number),
                    number(100.0 * s.energy_share)
                )
            })
            .collect();
        out.push(Figure {
            id: "idle_power".into(),
            title: "Power of idle GPUs".into(),
            reading: if idle.is_empty() {
                "No GPU was idle.".into()
            } else {
                format!("{}.", idle.join("; "))
            },
            svg: svg::cdf("Power of idle GPUs", "GPU power (W)", &series, false),
            sql: "idle_gpu_power.sql",
            sql_note: "rows of node '(all)'".into(),
        });
    }
    if !fleet.job_types.is_empty() {
        let rows: Vec<(String, f64)> = fleet
            .job_types
            .iter()
            .filter_map(|t| Some((t.job_type.clone(), t.gpu_util_mean_pct?)))
            .collect();
        let top = &fleet.job_types[0];
        out.push(Figure {
            id: "utilization_by_job_type".into(),
            title: "GPU utilization by job type".into(),
            reading: format!(
                "{} jobs used the most GPU time ({} GPU hours) at {} mean utilization.",
                top.job_type,
                number(top.gpu_hours),
                top.gpu_util_mean_pct
                    .map_or("unknown".into(), |u| format!("{} %", number(u)))
            ),
            svg: svg::bars(
                "GPU utilization by job type",
                "time-weighted mean GPU utilization (%)",
                &rows,
                true,
            ),
            sql: "utilization_by_job_type.sql",
            sql_note: "column gpu_util_mean_pct".into(),
        });
    }
    if !fleet.jobs.is_empty() {
        let points: Vec<(f64, f64)> = fleet
            .jobs
            .iter()
            .filter_map(|j| Some((j.duration_s, j.gpu_util_mean_pct?)))
            .collect();
        let (long, short): (Vec<_>, Vec<_>) = points.iter().partition(|p| p.0 >= 3600.0);
        let avg = |v: &[&(f64, f64)]| {
            (!v.is_empty()).then(|| v.iter().map(|p| p.1).sum::<f64>() / v.len() as f64)
        };
        let reading = match (avg(&short), avg(&long)) {
            (Some(s), Some(l)) => format!(
                "{} jobs; those under an hour averaged {} % utilization, longer ones {} %.",
                points.len(),
                number(s),
                number(l)
            ),
            _ => format!("{} jobs.", points.len()),
        };
        out.push(Figure {
            id: "job_duration_vs_utilization".into(),
            title: "Job duration against GPU utilization".into(),
            reading,
            svg: svg::scatter(
                "Job duration against GPU utilization",
                "job duration (s, log scale)",
                "mean GPU utilization (%)",
                &points,
            ),
            sql: "job_duration_vs_utilization.sql",
            sql_note: "duration_s against gpu_util_mean_pct".into(),
        });
        let share = |f: fn(&super::Job) -> Option<f64>| {
            let mut values: Vec<f64> = fleet.jobs.iter().filter_map(f).collect();
            values.sort_by(f64::total_cmp);
            let n = values.len() as f64;
            values
                .iter()
                .enumerate()
                .map(|(i, v)| (*v, (i + 1) as f64 / n))
                .collect::<Vec<_>>()
        };
        let imbalance = share(|j| Some(j.mem_peak_max_pct? - j.mem_peak_min_pct?));
        let idle = share(|j| j.idle_share_pct);
        let median = |v: &[(f64, f64)]| v.iter().find(|p| p.1 >= 0.5).map(|p| p.0);
        out.push(Figure {
            id: "job_imbalance".into(),
            title: "Per-job GPU memory imbalance and idle time".into(),
            reading: format!(
                "Half of the jobs had their GPUs' peak memory within {} percentage points of \
                 each other and spent at most {} % of their GPU time idle.",
                median(&imbalance).map_or("?".into(), number),
                median(&idle).map_or("?".into(), number)
            ),
            svg: svg::cdf(
                "Per-job GPU memory imbalance and idle time",
                "percentage points / % of the job's GPU time",
                &[
                    ("memory imbalance (max − min peak)", &imbalance),
                    ("idle share (< 5 % utilization)", &idle),
                ],
                true,
            ),
            sql: "job_imbalance.sql",
            sql_note: "mem_imbalance_pct and idle_share_pct, as a CDF over jobs".into(),
        });
    }
    if !fleet.xids.is_empty() {
        let rows: Vec<(String, f64)> = fleet
            .xids
            .iter()
            .map(|x| (format!("{} ({} jobs)", x.category, x.jobs), x.events as f64))
            .collect();
        let events: u64 = fleet.xids.iter().map(|x| x.events).sum();
        let worst = fleet.xids.iter().max_by_key(|x| x.events);
        out.push(Figure {
            id: "xids".into(),
            title: "XID errors by category".into(),
            reading: format!(
                "{events} XID events; the most were {} ({} events on {} GPUs, {} jobs hit).",
                worst.map_or("", |x| x.category.as_str()),
                worst.map_or(0, |x| x.events),
                worst.map_or(0, |x| x.gpus),
                worst.map_or(0, |x| x.jobs)
            ),
            svg: svg::bars("XID errors by category", "XID events", &rows, false),
            sql: "xid_failures.sql",
            sql_note: "rows with job_id '(all)'; jobs hit: the other rows".into(),
        });
    }
    for (dimension, id, title) in [
        (
            "job_type",
            "trace_job_types",
            "GPU time by job type (whole trace)",
        ),
        (
            "state",
            "trace_states",
            "GPU time by final state (whole trace)",
        ),
    ] {
        let groups: Vec<&super::TraceShare> = fleet
            .trace_shares
            .iter()
            .filter(|s| s.dimension == dimension)
            .collect();
        let Some(top) = groups.first() else { continue };
        let jobs: usize = groups.iter().map(|g| g.jobs).sum();
        let rows: Vec<(String, f64)> = groups
            .iter()
            .map(|g| {
                let share = g.share.unwrap_or(0.0);
                let pct = 100.0 * g.jobs as f64 / jobs.max(1) as f64;
                (
                    format!("{} ({} % of jobs)", g.value, number(pct)),
                    100.0 * share,
                )
            })
            .collect();
        out.push(Figure {
            id: id.into(),
            title: title.into(),
            reading: format!(
                "Of the {jobs} GPU jobs of the trace ({}), {} ones ({} % of the jobs) took \
                 {} % of the GPU time.",
                fleet.trace_from,
                top.value,
                number(100.0 * top.jobs as f64 / jobs.max(1) as f64),
                number(100.0 * top.share.unwrap_or(0.0))
            ),
            svg: svg::bars(title, "share of the trace's GPU time (%)", &rows, true),
            sql: "gpu_time_share.sql",
            sql_note: format!("rows of scope 'trace', dimension '{dimension}'"),
        });
    }
    if !fleet.throttle.is_empty() {
        let throttled: Vec<&super::Throttle> = fleet
            .throttle
            .iter()
            .filter(|t| t.throttled_s > 0.0)
            .collect();
        let rows: Vec<(String, f64)> = throttled
            .iter()
            .map(|t| (format!("{} GPU {}", t.node, t.gpu), t.share_pct()))
            .collect();
        out.push(Figure {
            id: "throttling".into(),
            title: "Throttled time per GPU".into(),
            reading: match throttled.first() {
                Some(t) => format!(
                    "{} of {} GPUs were throttled at some point; {} GPU {} the most, {} % of \
                     its time.",
                    throttled.len(),
                    fleet.throttle.len(),
                    t.node,
                    t.gpu,
                    number(t.share_pct())
                ),
                None => format!(
                    "None of the {} GPUs was throttled (thermal, power or hardware slowdown).",
                    fleet.throttle.len()
                ),
            },
            svg: svg::bars(
                "Throttled time per GPU",
                "share of the GPU's time throttled (%), most throttled first",
                &rows,
                true,
            ),
            sql: "throttle_time.sql",
            sql_note: "column throttled_pct".into(),
        });
    }
    out
}

const STYLE: &str = "body{font:15px/1.45 system-ui,sans-serif;margin:2em auto;max-width:62em;\
padding:0 1em;color:#222}h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em}\
.reading{margin:.3em 0 .6em}svg{max-width:100%;height:auto;border:1px solid #eee}\
pre{background:#f6f6f6;padding:.8em;overflow-x:auto;font-size:12px}\
table{border-collapse:collapse}td,th{padding:.15em .8em;text-align:left}\
nav li{margin:.1em 0}.meta{color:#555}";

/// The whole page.
pub fn page(fleet: &Fleet, figures: &[Figure]) -> String {
    let mut out = String::new();
    let span = match (&fleet.first_ts, &fleet.last_ts) {
        (Some(a), Some(b)) => format!("{a} to {b}"),
        _ => "no GPU samples".into(),
    };
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>\
         <title>gputel report: {store}</title><style>{STYLE}</style></head><body>\
         <h1>gputel report</h1><p class=\"meta\">Store <code>{store}</code>, {span} \
         (UTC): {nodes} nodes, {gpus} GPUs, {rows} GPU samples; {resample}. Every quantity \
         is time-weighted: a sample counts for the time until its device's next one (at \
         most three sampling intervals). {trace} Read {files} files, {read} of {bytes} \
         bytes.</p>",
        store = escape(&fleet.store),
        span = escape(&span),
        nodes = fleet.nodes,
        gpus = fleet.gpus,
        rows = fleet.gpu_rows,
        resample = match fleet.resample_s {
            Some(s) => format!(
                "each device averaged over {} s windows before the CDFs",
                number(s)
            ),
            None => "every sample as recorded".into(),
        },
        trace = if fleet.trace_from == gputel_schemas::scheduler_job::NAME {
            "Job types and states: the store's imported trace (scheduler_job).".to_owned()
        } else {
            format!(
                "Job types and states: the trace in <code>{}</code>, not imported; the \
                 figures' SQL reads them once <code>gputel-collector import-jobs</code> has \
                 put it in the store.",
                escape(&fleet.trace_from)
            )
        },
        files = fleet.read.files,
        read = fleet.read.bytes_read,
        bytes = fleet.read.file_bytes,
    );
    out.push_str("<nav><h2>Figures</h2><ol>");
    for f in figures {
        let _ = write!(
            out,
            "<li><a href=\"#{}\">{}</a></li>",
            escape(&f.id),
            escape(&f.title)
        );
    }
    out.push_str("</ol></nav>");
    for f in figures {
        let sql = gputel_schemas::sql::text(f.sql).unwrap_or("");
        let _ = write!(
            out,
            "<section id=\"{id}\"><h2>{title}</h2><p class=\"reading\">{reading}</p>{svg}\
             <details><summary>SQL: <code>schemas/sql/{file}</code> ({note}); run it with \
             <code>scripts/duckdb -c \".read schemas/sql/views.sql\" -c \".read \
             schemas/sql/{file}\"</code></summary><pre>{sql}</pre></details></section>",
            id = escape(&f.id),
            title = escape(&f.title),
            reading = escape(&f.reading),
            svg = f.svg,
            file = escape(f.sql),
            note = escape(&f.sql_note),
            sql = escape(sql),
        );
    }
    out.push_str("</body></html>\n");
    out
}
