//! Alerting end to end: the fake NVML drives GPUs over thresholds, the
//! agent streams to a collector with alert rules, and a real Alertmanager
//! receives the alerts; the `alert` table is read back with DuckDB.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gputel_tests::{
    Alertmanager, Running, SCENARIO_ENV, collector_bin, duckdb, fixture_agent, start_collector,
    table_scan, unused_port, wal_dir_of,
};
use serde_json::{Value, json};

const NODE: &str = "gpu-node-017";

const HOT_RULES: &str = r#"
[[rule]]
name = "GpuHot"
metric = "temperature_c"
op = ">"
threshold = 85
clear = 80
for = "1s"
severity = "critical"
labels = { team = "infra" }
"#;

/// `n` copies of `v`, as TOML array items.
fn repeat(v: u32, n: usize) -> String {
    vec![v.to_string(); n].join(", ")
}

/// Runs an agent for `ticks` ticks of 100 ms on `scenario`, GPU 1 of job 4242.
fn agent(dir: &Path, addr: &str, scenario: &str, ticks: Option<u32>) -> Running {
    let path = dir.join("scenario.toml");
    std::fs::write(&path, scenario).expect("write scenario");
    let jobs = dir.join("jobs");
    std::fs::create_dir_all(&jobs).expect("jobs dir");
    std::fs::write(jobs.join("1"), "4242\n").expect("job mapping");
    let mut cmd = fixture_agent(NODE);
    cmd.args([
        "--collector",
        &format!("http://{addr}"),
        "--interval",
        "100ms",
    ])
    .arg("--hpc-job-mapping-dir")
    .arg(&jobs)
    .env(SCENARIO_ENV, &path);
    if let Some(ticks) = ticks {
        cmd.args(["--ticks", &ticks.to_string()]);
    }
    Running::spawn(cmd)
}

fn write_rules(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("alerts.toml");
    std::fs::write(&path, text).expect("write rules");
    path
}

fn labels(alert: &Value) -> &serde_json::Map<String, Value> {
    alert["labels"].as_object().expect("labels")
}

fn gpus_of(alerts: &[Value]) -> Vec<String> {
    let mut gpus: Vec<String> = alerts
        .iter()
        .filter_map(|a| a["labels"]["gpu"].as_str().map(str::to_owned))
        .collect();
    gpus.sort();
    gpus
}

/// (gpu, status, rule) of every row of the `alert` table, in time order.
fn alert_rows(dir: &Path, store: &Path) -> Vec<(i64, String, String)> {
    duckdb(
        dir,
        &format!(
            "select gpu, status, rule from {} order by ts, gpu",
            table_scan(store, "alert")
        ),
    )
    .into_iter()
    .map(|r| {
        (
            r["gpu"].as_i64().expect("gpu"),
            r["status"].as_str().expect("status").to_owned(),
            r["rule"].as_str().expect("rule").to_owned(),
        )
    })
    .collect()
}

/// GPU 1 is hot from 1 s to 5 s, then cools: the alert reaches Alertmanager
/// with its labels, and leaves it once resolved. GPU 2 gets hot, then
/// hovers between the clear level and the threshold: it fires once and
/// stays firing (hysteresis). GPU 0 stays cool.
#[test]
fn temperature_alert_fires_and_resolves_in_alertmanager() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(am) = Alertmanager::start(dir.path()) else {
        return;
    };
    let rules = write_rules(dir.path(), HOT_RULES);
    let store = dir.path().join("store");
    let (collector, addr) = start_collector(
        &store,
        &[
            "--flush-interval",
            "1s",
            "--rules",
            rules.to_str().expect("utf-8"),
            "--alertmanager-url",
            &am.url,
        ],
    );
    // Steps of 500 ms from the agent's start.
    let oscillating = vec!["88, 82"; 40].join(", ");
    let scenario = format!(
        "step_ms = 500\n\
         [[gpu]]\ntemperature_c = 50\n\
         [[gpu]]\ntemperature_c = [50, 50, {}, {}]\n\
         [[gpu]]\ntemperature_c = [50, 50, {}, {oscillating}]\n",
        repeat(95, 8),
        repeat(50, 80),
        repeat(95, 4)
    );
    let agent = agent(dir.path(), &addr, &scenario, Some(130));

    let fired = am.wait_for("GpuHot on GPU 1", Duration::from_secs(30), |alerts| {
        alerts.iter().any(|a| a["labels"]["gpu"] == "1")
    });
    let gpu1 = fired
        .iter()
        .find(|a| a["labels"]["gpu"] == "1")
        .expect("GPU 1");
    assert_eq!(
        labels(gpu1),
        json!({
            "alertname": "GpuHot",
            "severity": "critical",
            "team": "infra",
            "node": NODE,
            "gpu": "1",
            "uuid": "GPU-00000001-fake-4000-8000-000000000001",
            "model": "NVIDIA H100 80GB HBM3",
            "job_id": "4242",
        })
        .as_object()
        .expect("object")
    );
    assert_eq!(gpu1["annotations"]["value"], "95");
    assert_eq!(gpu1["annotations"]["threshold"], "85");
    assert_eq!(gpu1["annotations"]["metric"], "temperature_c");
    assert_eq!(gpu1["status"]["state"], "active");

    // Resolved alerts leave Alertmanager's list; GPU 2 stays, GPU 0 never came.
    let after = am.wait_for("GPU 1 resolved", Duration::from_secs(30), |alerts| {
        gpus_of(alerts) == ["2"]
    });
    assert_eq!(after[0]["labels"]["alertname"], "GpuHot");

    assert!(
        agent.wait(Duration::from_secs(60)).status.success(),
        "agent failed"
    );
    // GPU 2 hovered between 82 and 88 until the end: still firing.
    assert_eq!(gpus_of(&am.alerts_named("GpuHot")), ["2"]);
    assert!(
        collector
            .terminate(Duration::from_secs(30))
            .status
            .success()
    );
    let rows = alert_rows(dir.path(), &store);
    let expected = [(1, "firing"), (2, "firing"), (1, "resolved")];
    let mut by_gpu: Vec<(i64, &str)> = rows.iter().map(|(g, s, _)| (*g, s.as_str())).collect();
    by_gpu.sort_by_key(|(g, _)| *g);
    let mut want = expected.to_vec();
    want.sort_by_key(|(g, _)| *g);
    assert_eq!(by_gpu, want, "alert rows {rows:?}");
    let row = duckdb(
        dir.path(),
        &format!(
            "select node, uuid, model, job_id, severity, metric, value, threshold, \
                    starts_at = ts as starts_now, typeof(ts) as ts_type \
             from {} where gpu = 1 and status = 'firing'",
            table_scan(&store, "alert")
        ),
    );
    assert_eq!(
        row,
        vec![
            json!({
                "node": NODE, "uuid": "GPU-00000001-fake-4000-8000-000000000001",
                "model": "NVIDIA H100 80GB HBM3", "job_id": "4242", "severity": "critical",
                "metric": "temperature_c", "value": 95.0, "threshold": 85.0,
                "starts_now": true, "ts_type": "TIMESTAMP WITH TIME ZONE",
            })
            .as_object()
            .expect("object")
            .clone()
        ]
    );
}

/// A power rule relative to the power limit fires for exactly the GPUs
/// above their own limit: 720 of 700 W and 520 of 500 W, not 690 of 700 W
/// nor 700 of 700 W.
#[test]
fn power_relative_to_the_limit_fires_only_above_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(am) = Alertmanager::start(dir.path()) else {
        return;
    };
    let rules = write_rules(
        dir.path(),
        r#"
[[rule]]
name = "PowerOverLimit"
metric = "power_w"
op = ">"
threshold = 100
relative-to = "power-limit"
for = "500ms"
"#,
    );
    let store = dir.path().join("store");
    let (collector, addr) = start_collector(
        &store,
        &[
            "--flush-interval",
            "1s",
            "--rules",
            rules.to_str().expect("utf-8"),
            "--alertmanager-url",
            &am.url,
        ],
    );
    let scenario = "\
        [[gpu]]\npower_mw = 690000\npower_limit_mw = 700000\n\
        [[gpu]]\npower_mw = 720000\npower_limit_mw = 700000\n\
        [[gpu]]\npower_mw = 700000\npower_limit_mw = 700000\n\
        [[gpu]]\npower_mw = 520000\npower_limit_mw = 500000\n";
    let agent = agent(dir.path(), &addr, scenario, Some(30));
    assert!(
        agent.wait(Duration::from_secs(60)).status.success(),
        "agent failed"
    );
    assert!(
        collector
            .terminate(Duration::from_secs(30))
            .status
            .success()
    );
    let alerts = am.alerts_named("PowerOverLimit");
    assert_eq!(gpus_of(&alerts), ["1", "3"], "{alerts:#?}");
    let gpu3 = alerts
        .iter()
        .find(|a| a["labels"]["gpu"] == "3")
        .expect("GPU 3");
    assert_eq!(gpu3["annotations"]["value"], "104");
    assert_eq!(
        gpu3["annotations"]["summary"],
        format!("power_w 104% of the power limit > 100% on {NODE} GPU 3")
    );
    let rows = alert_rows(dir.path(), &store);
    let firing: Vec<i64> = rows.iter().map(|(g, _, _)| *g).collect();
    assert_eq!(firing, [1, 3], "{rows:?}");
    assert!(rows.iter().all(|(_, s, _)| s == "firing"), "{rows:?}");
}

/// A collector killed while an alert fires comes back with it firing: the
/// same alert (same start) in Alertmanager, one `firing` row, no second
/// notification.
#[test]
fn a_firing_alert_survives_a_collector_crash() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(am) = Alertmanager::start(dir.path()) else {
        return;
    };
    let rules = write_rules(dir.path(), HOT_RULES);
    let store = dir.path().join("store");
    let port = unused_port();
    let collector = |flush: &str| {
        let mut cmd = Command::new(collector_bin());
        cmd.args(["--plaintext", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--store")
            .arg(&store)
            .arg("--wal-dir")
            .arg(wal_dir_of(&store))
            .args(["--flush-interval", flush, "--rules"])
            .arg(&rules)
            .args(["--alertmanager-url", &am.url]);
        let mut running = Running::spawn(cmd);
        running.wait_for_log("listening on ", Duration::from_secs(30));
        running
    };
    // A long flush interval: the firing row is in the log only when killed.
    let mut first = collector("1h");
    let agent = agent(
        dir.path(),
        &format!("127.0.0.1:{port}"),
        "[[gpu]]\ntemperature_c = 50\n[[gpu]]\ntemperature_c = 95\n",
        None,
    );
    first.wait_for_log("alert firing", Duration::from_secs(30));
    let before = am.wait_for("GpuHot", Duration::from_secs(30), |a| !a.is_empty());
    let starts_at = before[0]["startsAt"].clone();
    first.signal("KILL", Duration::from_secs(10));

    let mut second = collector("1s");
    let restored = second.find_log("alerts restored", Duration::from_secs(30));
    assert!(restored.contains("firing=1"), "{restored}");
    // The agent reconnects and streams on; the hot GPU keeps the alert firing.
    second.find_log("agent connected", Duration::from_secs(30));
    second.wait_for_log("flushed", Duration::from_secs(30));
    drop(agent);
    assert!(
        !second.log.iter().any(|l| l.contains("alert firing")),
        "fired again after the restart: {:#?}",
        second.log
    );
    assert!(second.terminate(Duration::from_secs(30)).status.success());
    let after = am.alerts_named("GpuHot");
    assert_eq!(after.len(), 1, "{after:#?}");
    assert_eq!(after[0]["startsAt"], starts_at);
    assert_eq!(
        alert_rows(dir.path(), &store),
        [(1, "firing".to_owned(), "GpuHot".to_owned())]
    );
}

/// A malformed rules file stops the start with the file, line and field; at
/// a SIGHUP it is refused and the rules in force stay (they still fire).
#[test]
fn malformed_rules_are_refused_and_a_bad_reload_keeps_the_old_rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = "[[rule]]\nname = \"GpuHot\"\nmetric = \"temperature_c\"\nop = \">\"\nthreshold = \"hot\"\n";
    let rules = write_rules(dir.path(), bad);
    let store = dir.path().join("store");
    let out = Command::new(collector_bin())
        .args(["--plaintext", "--listen", "127.0.0.1:0", "--rules"])
        .arg(&rules)
        .arg("--store")
        .arg(&store)
        .arg("--wal-dir")
        .arg(wal_dir_of(&store))
        .output()
        .expect("run collector");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}:5:13: field `threshold`: invalid type: string \"hot\", expected f64",
            rules.display()
        )),
        "{stderr}"
    );

    write_rules(dir.path(), HOT_RULES);
    let (mut collector, addr) = start_collector(
        &store,
        &[
            "--flush-interval",
            "1s",
            "--rules",
            rules.to_str().expect("utf-8"),
        ],
    );
    collector.find_log("loaded 1 alert rules", Duration::from_secs(10));
    write_rules(
        dir.path(),
        &format!("{HOT_RULES}\n[[rule]]\nname = \"Two\"\nmetric = \"xid\"\nfor = \"1m\"\n"),
    );
    collector.send_signal("HUP");
    let refused = collector.wait_for_log("alert rules not reloaded", Duration::from_secs(10));
    assert!(
        refused.contains(":15:7: rule \"Two\", field `for`: does not apply to metric xid"),
        "{refused}"
    );
    // The old rule still fires.
    let agent = agent(dir.path(), &addr, "[[gpu]]\ntemperature_c = 95\n", Some(20));
    collector.wait_for_log("alert firing", Duration::from_secs(30));
    assert!(agent.wait(Duration::from_secs(60)).status.success());
    // A good file replaces the rules.
    write_rules(dir.path(), &HOT_RULES.replace("GpuHot", "GpuVeryHot"));
    collector.send_signal("HUP");
    collector.wait_for_log("reloaded 1 alert rules", Duration::from_secs(10));
    assert!(
        collector
            .terminate(Duration::from_secs(30))
            .status
            .success()
    );
    let rows = alert_rows(dir.path(), &store);
    // GpuHot was dropped with the reload: it resolves.
    assert_eq!(
        rows,
        [
            (0, "firing".to_owned(), "GpuHot".to_owned()),
            (0, "resolved".to_owned(), "GpuHot".to_owned())
        ]
    );
}

/// `systemctl reload` sends SIGHUP whether or not the collector has rules:
/// without them it is logged and ignored, not the end of the process (the
/// signal's default action), and a stop after it is still clean.
#[test]
fn sighup_without_rules_does_not_stop_the_collector() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let (mut collector, _addr) = start_collector(&store, &[]);
    // At once after "listening on", as systemd may once READY=1 is sent.
    collector.send_signal("HUP");
    collector.wait_for_log("no alert rules to reload", Duration::from_secs(10));
    collector.send_signal("HUP");
    collector.wait_for_log("no alert rules to reload", Duration::from_secs(10));
    let (out, log) = collector.terminate_with_log(Duration::from_secs(30));
    assert!(out.status.success(), "{:?}\n{}", out.status, log.join("\n"));
    assert!(log.iter().any(|l| l.contains("stopped")), "{log:#?}");
}
