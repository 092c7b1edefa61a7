//! `gputel-collector job`: the report of a job the fake NVML ran states the
//! scenario's numbers, agrees with DuckDB's reading of the same store, and
//! an unknown job, an empty store and a missing one say so with their exit
//! statuses.

use std::path::Path;
use std::process::{Command, Output};

use gputel_tests::{collector_bin, duckdb, run_scenario_pipeline, table_scan};
use serde_json::Value;

/// Job 4242 (fixture process 4242) runs on GPUs 0 and 1: GPU 0 busy, hot
/// and thermally throttled with an XID 13; GPU 1 idle, without GPM (no SM
/// activity). Job 5151 on GPU 2 must not count.
const SCENARIO: &str = r#"
[[gpu]]
fb_total_bytes = 85520809984
fb_used_bytes = 42949672960
gpu_util_pct = 97
sm_active_pct = 87.5
power_mw = 512000
temperature_c = 62
memory_temperature_c = 70
clock_event_reasons = 32
xid_events = [{ at_ms = 500, xid = 13 }]
processes = [{ pid = 4242, used_memory_bytes = 42949672960 }]

[[gpu]]
fb_total_bytes = 85520809984
fb_used_bytes = 1073741824
gpu_util_pct = 0
gpm = false
power_mw = 61000
temperature_c = 34
memory_temperature_c = 35
processes = [{ pid = 4242, used_memory_bytes = 1073741824 }]

[[gpu]]
gpu_util_pct = 50
power_mw = 300000
processes = [{ pid = 5151, used_memory_bytes = 1000 }]
"#;

const TICKS: u64 = 12;

fn job(store: &Path, args: &[&str]) -> Output {
    Command::new(collector_bin())
        .arg("job")
        .args(args)
        .arg("--store")
        .arg(store)
        .output()
        .expect("run gputel-collector job")
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn the_report_states_the_scenarios_numbers_and_agrees_with_duckdb() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = run_scenario_pipeline(tmp.path(), SCENARIO, TICKS, &[]);

    let out = job(&store, &["4242", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(report["job_id"], "4242");
    assert_eq!(report["gpus"], 2);
    assert_eq!(report["nodes"], serde_json::json!(["gpu-node-017"]));
    let gpus = report["gpu_figures"].as_array().expect("gpu_figures");
    assert_eq!(gpus.len(), 2, "{gpus:?}");
    let (busy, idle) = (&gpus[0], &gpus[1]);

    // The scenario's values, exactly.
    assert_eq!(
        (busy["node"].clone(), busy["gpu"].clone()),
        ("gpu-node-017".into(), 0.into())
    );
    assert_eq!(busy["model"], "NVIDIA H100 80GB HBM3");
    assert_eq!(busy["samples"], TICKS);
    assert_eq!(f(&busy["gpu_util_mean_pct"]), 97.0);
    assert_eq!(f(&busy["gpu_util_max_pct"]), 97.0);
    assert_eq!(f(&busy["sm_active_mean_pct"]), 87.5);
    assert_eq!(f(&busy["sm_active_max_pct"]), 87.5);
    assert_eq!(busy["memory_used_max_bytes"], 42_949_672_960_i64);
    assert_eq!(busy["memory_total_bytes"], 85_520_809_984_i64);
    assert_eq!(
        f(&busy["memory_used_max_pct"]),
        42_949_672_960.0 * 100.0 / 85_520_809_984.0
    );
    assert_eq!(f(&busy["power_mean_w"]), 512.0);
    assert_eq!(f(&busy["power_max_w"]), 512.0);
    assert_eq!(busy["temperature_max_c"], 62);
    assert_eq!(f(&busy["temperature_mean_c"]), 62.0);
    assert_eq!(busy["memory_temperature_max_c"], 70);
    // Throttled for heat the whole time, never for power.
    assert_eq!(f(&busy["throttle_thermal_s"]), f(&busy["time_s"]));
    assert_eq!(f(&busy["throttle_power_s"]), 0.0);
    assert_eq!(f(&busy["interval_s"]), 0.1);
    // 512 W over the time its samples stand for.
    let busy_time = f(&busy["time_s"]);
    assert!((f(&busy["energy_kwh"]) - 512.0 * busy_time / 3.6e6).abs() < 1e-15);

    assert_eq!(idle["gpu"], 1);
    assert_eq!(f(&idle["gpu_util_mean_pct"]), 0.0);
    assert_eq!(idle["sm_active_mean_pct"], Value::Null);
    assert_eq!(f(&idle["power_mean_w"]), 61.0);
    assert_eq!(idle["temperature_max_c"], 34);
    assert_eq!(idle["memory_used_max_bytes"], 1_073_741_824_i64);
    assert_eq!(f(&idle["throttle_thermal_s"]), 0.0);

    // The XID is the job's event and a hint; the idle GPU and the
    // throttling are hints; GPU 0's memory (50 %) and SMs (87.5 %) are not.
    let events = report["events"].as_array().expect("events");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["kind"], "xid");
    assert_eq!(events[0]["code"], 13);
    assert_eq!(events[0]["gpu"], 0);
    let kinds: Vec<&str> = report["hints"]
        .as_array()
        .expect("hints")
        .iter()
        .filter_map(|h| h["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["idle_gpus", "throttled", "xid"]);
    assert!(
        report["hints"][0]["text"].as_str().is_some_and(
            |t| t.starts_with("1 of 2 GPUs were idle") && t.contains("gpu-node-017 GPU 1")
        ),
        "{}",
        report["hints"][0]
    );

    // DuckDB, on the same store, with the same rule: each sample weighs the
    // gap to its GPU's next sample, at most 3 median gaps; the last one the
    // median gap.
    let sql = format!(
        "with s as (select node, gpu, epoch_us(ts) as t, gpu_util_pct, power_mw \
                    from {gpu} where job_id = '4242'), \
              g as (select *, lead(t) over (partition by node, gpu order by t) - t as gap from s), \
              m as (select node, gpu, quantile_disc(gap, 0.5) as med from g group by all), \
              w as (select g.*, (case when gap is null then med else least(gap, 3 * med) end) / 1e6 as weight \
                    from g join m using (node, gpu)) \
         select gpu, count(*) as samples, sum(weight) as time_s, \
                sum(gpu_util_pct * weight) / sum(weight) as util, \
                sum(power_mw / 1000 * weight) / 3.6e6 as energy_kwh \
         from w group by gpu order by gpu",
        gpu = table_scan(&store, "gpu")
    );
    let rows = duckdb(tmp.path(), &sql);
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (row, figures) in rows.iter().zip(gpus) {
        assert_eq!(row["gpu"], figures["gpu"]);
        assert_eq!(row["samples"], figures["samples"]);
        assert!(
            (f(&row["time_s"]) - f(&figures["time_s"])).abs() < 1e-9,
            "{row:?} {figures}"
        );
        assert!((f(&row["util"]) - f(&figures["gpu_util_mean_pct"])).abs() < 1e-9);
        assert!((f(&row["energy_kwh"]) - f(&figures["energy_kwh"])).abs() < 1e-15);
    }
    let energy = f(&rows[0]["energy_kwh"]) + f(&rows[1]["energy_kwh"]);
    assert!((f(&report["energy_kwh"]) - energy).abs() < 1e-15);
    let util = (97.0 * f(&rows[0]["time_s"])) / (f(&rows[0]["time_s"]) + f(&rows[1]["time_s"]));
    assert!((f(&report["gpu_util_mean_pct"]) - util).abs() < 1e-9);

    // What it read: a part of what the files hold.
    let read = &report["read"];
    assert!(read["files"].as_u64().is_some_and(|n| n > 0), "{read}");
    assert!(f(&read["bytes_read"]) < f(&read["file_bytes"]), "{read}");

    // The text report: the same figures, with bars.
    let out = job(&store, &["4242"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("Job 4242 in "), "{text}");
    assert!(
        text.contains(&format!(
            "    utilization [{}{}] 97.0 % mean, peak 97.0 %\n",
            "█".repeat(29),
            "░"
        )),
        "{text}"
    );
    assert!(text.contains("    memory      ["), "{text}");
    assert!(
        text.contains(" 40.0 GiB peak of 79.6 GiB (50.2 %)\n"),
        "{text}"
    );
    assert!(
        text.contains("    SM active   [░░░░░░░░░░░░░░░░░░░░░░░░░░░░░░] not measured\n"),
        "{text}"
    );
    assert!(text.contains("    XIDs        13\n"), "{text}");
    assert!(
        text.contains("\nHints\n  * 1 of 2 GPUs were idle"),
        "{text}"
    );
    println!("{text}");
}

#[test]
fn an_unknown_job_an_empty_store_and_no_store_say_so() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = run_scenario_pipeline(tmp.path(), SCENARIO, 3, &[]);

    let out = job(&store, &["999"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(&format!(
            "job 999 is not in {}: none of its GPU samples is in the 1 hours of job records (",
            store.display()
        )),
        "{stderr}"
    );
    // A window without the job's hours.
    let out = job(&store, &["4242", "--to", "2000-01-01T00:00:00Z"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("it holds no job records between the start and 2000-01-01T00:00:00.000Z"),
        "{stderr}"
    );

    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let out = job(&empty, &["4242", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "{} holds no telemetry (no gpu or job table): no collector has written there yet, \
             or --store names another place.\n",
            empty.display()
        )
    );

    let missing = tmp.path().join("missing");
    let out = job(&missing, &["4242"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(!missing.exists(), "a report made a store directory");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "error: there is no store at {}: no such directory (give --store)\n",
            missing.display()
        )
    );
}
