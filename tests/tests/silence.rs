//! Node silence end to end: an agent on the fake NVML runs a thermal
//! episode (GPU 1 at 95 °C and throttled for heat) against a collector with
//! alert rules and a real Alertmanager; the agent is stopped (SIGSTOP) in
//! the middle of it, then resumed. The collector notices the silence, and
//! the `event` and `alert` tables, read back with DuckDB, and Alertmanager
//! say what the README's *Node silence* promises.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gputel_tests::{
    Alertmanager, Running, SCENARIO_ENV, assert_gpu_rows_exactly_once, collector_bin, duckdb,
    duckdb_bin, fixture_agent, start_collector, table_scan, unused_port, wal_dir_of,
    workspace_root,
};
use serde_json::{Map, Value, json};

const NODE: &str = "gpu-node-031";

const RULES: &str = r#"
[[rule]]
name = "GpuHot"
metric = "temperature_c"
op = ">"
threshold = 85
clear = 80
for = "1s"
severity = "critical"

[[rule]]
name = "GpuThermalThrottling"
metric = "thermal_throttle"
for = "1s"

[[rule]]
name = "NodeSilent"
metric = "up"
severity = "critical"
labels = { team = "infra" }
"#;

/// GPU 0 cool, GPU 1 hot and held down by HW thermal slowdown throughout.
const SCENARIO: &str = "\
    [[gpu]]\ntemperature_c = 50\n\
    [[gpu]]\ntemperature_c = 95\nclock_event_reasons = 64\n";

/// `alertname` → `startsAt` of the active alerts.
fn active(alerts: &[Value]) -> Vec<(String, String)> {
    let mut names: Vec<(String, String)> = alerts
        .iter()
        .map(|a| {
            (
                a["labels"]["alertname"].as_str().unwrap_or("").to_owned(),
                a["startsAt"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    names.sort();
    names
}

fn names(alerts: &[Value]) -> Vec<String> {
    active(alerts).into_iter().map(|(name, _)| name).collect()
}

fn row(value: Value) -> Map<String, Value> {
    value.as_object().expect("object").clone()
}

/// The agent is stopped mid-episode for 4 s (the threshold is 2 s, well
/// over three of its 100 ms intervals): `node_silent`, the thermal alerts
/// resolved with reason `node_silent`, `NodeSilent` firing in the table
/// and in Alertmanager; resumed: `node_back`, `NodeSilent` resolved, and
/// the GPU, still hot, fires anew.
#[test]
fn a_stopped_agent_is_a_silent_node_and_its_return_is_recorded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(am) = Alertmanager::start(dir.path()) else {
        return;
    };
    let rules = dir.path().join("alerts.toml");
    std::fs::write(&rules, RULES).expect("write rules");
    let store = dir.path().join("store");
    let (mut collector, addr) = start_collector(
        &store,
        &[
            "--flush-interval",
            "1s",
            "--node-silence-after",
            "2s",
            "--rules",
            rules.to_str().expect("utf-8"),
            "--alertmanager-url",
            &am.url,
        ],
    );
    let scenario = dir.path().join("scenario.toml");
    std::fs::write(&scenario, SCENARIO).expect("write scenario");
    let jobs = dir.path().join("jobs");
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
    .env(SCENARIO_ENV, &scenario);
    let agent = Running::spawn(cmd);

    // The episode: both thermal alerts fire for GPU 1.
    let firing = am.wait_for("the thermal alerts", Duration::from_secs(30), |a| {
        names(a) == ["GpuHot", "GpuThermalThrottling"]
    });
    let first_hot = active(&firing)[0].1.clone();

    // Stopped mid-episode: the process is there, its stream open, and
    // nothing comes from it.
    agent.send_signal("STOP");
    let stopped_at = Instant::now();
    let silent = collector.wait_for_log("node silent", Duration::from_secs(30));
    assert!(silent.contains(&format!("node={NODE}")), "{silent}");
    assert!(silent.contains("threshold=2.0 s"), "{silent}");
    let during = am.wait_for(
        "NodeSilent instead of the thermal alerts",
        Duration::from_secs(30),
        |a| names(a) == ["NodeSilent"],
    );
    let node_silent = &during[0];
    assert_eq!(
        node_silent["labels"],
        json!({
            "alertname": "NodeSilent",
            "severity": "critical",
            "team": "infra",
            "node": NODE,
            "job_id": "4242",
        })
    );
    assert_eq!(node_silent["annotations"]["metric"], "up");
    assert_eq!(node_silent["annotations"]["value"], "0");
    assert_eq!(node_silent["annotations"]["threshold"], "2");
    assert_eq!(
        node_silent["annotations"]["summary"],
        format!("{NODE} is silent: no data for more than 2 s (job 4242)")
    );
    // The thermal alerts are not sent again while the node is silent.
    std::thread::sleep(Duration::from_secs(4).saturating_sub(stopped_at.elapsed()));
    assert_eq!(names(&am.alerts()), ["NodeSilent"]);

    agent.send_signal("CONT");
    let paused = stopped_at.elapsed();
    let back = collector.wait_for_log("node back", Duration::from_secs(30));
    assert!(back.contains(&format!("node={NODE}")), "{back}");
    // NodeSilent resolves; the GPU, still hot, fires anew: a new alert
    // (its `for` counted again from the return), not the one before.
    let after = am.wait_for(
        "the thermal alerts again, without NodeSilent",
        Duration::from_secs(30),
        |a| names(a) == ["GpuHot", "GpuThermalThrottling"],
    );
    let again_hot = active(&after)[0].1.clone();
    assert!(again_hot > first_hot, "{again_hot} after {first_hot}");

    assert!(
        collector
            .terminate(Duration::from_secs(30))
            .status
            .success()
    );
    drop(agent);

    // The events: one silence, one return, of the node as a whole.
    let events = duckdb(
        dir.path(),
        &format!(
            "select kind, gpu, uuid, job_id, code, detail, typeof(ts) as ts_type \
             from {} where kind like 'node_%' order by ts",
            table_scan(&store, "event")
        ),
    );
    assert_eq!(events.len(), 2, "{events:#?}");
    let (silent, back) = (&events[0], &events[1]);
    for (event, kind) in [(silent, "node_silent"), (back, "node_back")] {
        assert_eq!(event["kind"], kind);
        assert_eq!(event["gpu"], Value::Null, "{event:?}");
        assert_eq!(event["uuid"], Value::Null, "{event:?}");
        assert_eq!(event["job_id"], "4242");
        assert_eq!(event["ts_type"], "TIMESTAMP WITH TIME ZONE");
    }
    // Noticed 2 s (the threshold) after the last batch, within a check of
    // the watch (500 ms) and some slack for a loaded machine.
    let silent_ms = silent["code"].as_i64().expect("code");
    assert!((2000..4000).contains(&silent_ms), "{silent:?}");
    let detail = silent["detail"].as_str().expect("detail");
    assert!(
        detail.contains("(threshold 2.0 s: --node-silence-after; its interval is 0.1 s)"),
        "{detail}"
    );
    assert!(detail.ends_with("; its stream is open"), "{detail}");
    // The return: the whole silence, at least as long as the stop.
    let back_ms = back["code"].as_i64().expect("code");
    let paused_ms = paused.as_millis() as i64;
    assert!(
        back_ms >= paused_ms - 50 && back_ms < paused_ms + 5000,
        "{back:?} after a stop of {paused_ms} ms"
    );
    assert!(back_ms > silent_ms);

    // The alerts: each thermal alert resolved by the silence at the moment
    // NodeSilent fired, NodeSilent resolved at the return, the thermal
    // alerts firing anew.
    let alerts = duckdb(
        dir.path(),
        &format!(
            "select rule, gpu, status, metric, value, threshold, job_id, reason, \
                    epoch_ms(ts) as ts_ms, epoch_ms(starts_at) as starts_ms \
             from {} order by ts, rule, status",
            table_scan(&store, "alert")
        ),
    );
    let shape: Vec<(&str, &str, Option<&str>)> = alerts
        .iter()
        .map(|a| {
            (
                a["rule"].as_str().expect("rule"),
                a["status"].as_str().expect("status"),
                a["reason"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            ("GpuHot", "firing", None),
            ("GpuThermalThrottling", "firing", None),
            ("GpuHot", "resolved", Some("node_silent")),
            ("GpuThermalThrottling", "resolved", Some("node_silent")),
            ("NodeSilent", "firing", None),
            ("NodeSilent", "resolved", None),
            ("GpuHot", "firing", None),
            ("GpuThermalThrottling", "firing", None),
        ],
        "{alerts:#?}"
    );
    let silence_ts = &alerts[4]["ts_ms"];
    assert_eq!(&alerts[2]["ts_ms"], silence_ts);
    assert_eq!(&alerts[3]["ts_ms"], silence_ts);
    let up = |a: &Map<String, Value>| {
        row(json!({
            "gpu": a["gpu"], "metric": a["metric"], "value": a["value"],
            "threshold": a["threshold"], "job_id": a["job_id"],
        }))
    };
    assert_eq!(
        up(&alerts[4]),
        row(json!({"gpu": null, "metric": "up", "value": 0.0, "threshold": 2.0, "job_id": "4242"}))
    );
    assert_eq!(
        up(&alerts[5]),
        row(json!({"gpu": null, "metric": "up", "value": 1.0, "threshold": 2.0, "job_id": "4242"}))
    );
    assert_eq!(alerts[5]["starts_ms"], *silence_ts);
    // The resolution of a GPU alert keeps its GPU and its last value.
    assert_eq!(alerts[2]["gpu"], 1);
    assert_eq!(alerts[2]["value"], 95.0);

    // The views of schemas/sql/ read node events alongside GPU events.
    let viewed = duckdb_views(
        &store,
        "select kind, gpu, job_id from event_attributed where kind like 'node_%' order by ts",
    );
    assert_eq!(
        viewed,
        [
            row(json!({"kind": "node_silent", "gpu": null, "job_id": "4242"})),
            row(json!({"kind": "node_back", "gpu": null, "job_id": "4242"})),
        ]
    );
}

/// A collector killed and started again 4 s later (over the node's 3 s
/// threshold) while an agent streams: the node, known from `nodes.json`,
/// gets its grace to reconnect, and no `node_silent` is recorded. The
/// agent then stops cleanly: that is a silence like any other, and its
/// event says the agent closed its stream. That collector is killed with
/// the event only in its write-ahead log: the next one stores it, once,
/// and knows the node is silent without a second event.
#[test]
fn a_collector_restart_is_no_silence_and_a_clean_stop_is_one() {
    const TICKS: u64 = 100;
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let port = unused_port();
    let collector = |flush_interval: &str| {
        let mut cmd = Command::new(collector_bin());
        cmd.args(["--plaintext", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--store")
            .arg(&store)
            .arg("--wal-dir")
            .arg(wal_dir_of(&store))
            .args(["--flush-interval", flush_interval])
            .args(["--node-silence-after", "3s"]);
        let mut running = Running::spawn(cmd);
        running.wait_for_log("listening on ", Duration::from_secs(30));
        running
    };
    let first = collector("1s");
    let mut cmd = fixture_agent(NODE);
    cmd.args(["--collector", &format!("http://127.0.0.1:{port}")])
        .args(["--interval", "100ms", "--ticks", &TICKS.to_string()])
        .args(["--drain-timeout", "30s"]);
    let mut agent = Running::spawn(cmd);
    agent.wait_for_log("connected", Duration::from_secs(30));
    // Long enough for the node's interval to be learnt and saved.
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !first
            .signal("KILL", Duration::from_secs(10))
            .status
            .success()
    );
    std::thread::sleep(Duration::from_secs(4));

    // Written only to the log from here on.
    let mut second = collector("1h");
    let restored = second.find_log("node watch restored", Duration::from_secs(10));
    assert!(restored.contains("nodes=1 silent=0"), "{restored}");
    let agent = agent.wait(Duration::from_secs(60));
    let summary = String::from_utf8_lossy(&agent.stdout).trim().to_owned();
    assert!(agent.status.success(), "{summary}");
    assert!(summary.contains("unacknowledged=0"), "{summary}");
    let stopped = Instant::now();
    let silent = second.wait_for_log("node silent", Duration::from_secs(30));
    assert!(stopped.elapsed() >= Duration::from_secs(2), "{silent}");
    // The line is logged as the event is handed to the log; it is in a
    // segment (written, which a SIGKILL does not undo) an instant later.
    wait_for_logged(&wal_dir_of(&store), b"its agent closed its stream");
    let killed = second.signal("KILL", Duration::from_secs(10));
    assert!(!killed.status.success());

    let mut third = collector("1s");
    let restored = third.find_log("node watch restored", Duration::from_secs(10));
    assert!(restored.contains("nodes=1 silent=1"), "{restored}");
    let (out, log) = third.terminate_with_log(Duration::from_secs(30));
    assert!(out.status.success());
    assert!(!log.iter().any(|l| l.contains("node silent")), "{log:#?}");

    let events = duckdb(
        dir.path(),
        &format!(
            "select kind, job_id, detail from {} where kind like 'node_%'",
            table_scan(&store, "event")
        ),
    );
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["kind"], "node_silent");
    let detail = events[0]["detail"].as_str().expect("detail");
    assert!(
        detail.ends_with("; its agent closed its stream"),
        "{detail}"
    );
    // Nothing the agent sent was lost or doubled through both kills.
    assert_gpu_rows_exactly_once(dir.path(), &store, TICKS * 8);
}

/// Waits until a segment of the write-ahead log in `wal` holds `needle`.
fn wait_for_logged(wal: &Path, needle: &[u8]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let logged = std::fs::read_dir(wal)
            .expect("the log directory")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
            .filter_map(|e| std::fs::read(e.path()).ok())
            .any(|bytes| bytes.windows(needle.len()).any(|w| w == needle));
        if logged {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no log segment in {} holds {:?} within 10 s",
            wal.display(),
            String::from_utf8_lossy(needle)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `sql` after `.read schemas/sql/views.sql` on `store`, from the
/// repository root as the README runs the views.
fn duckdb_views(store: &Path, sql: &str) -> Vec<Map<String, Value>> {
    let out = Command::new(duckdb_bin())
        .current_dir(workspace_root())
        .arg("-json")
        .arg("-c")
        .arg(format!("SET VARIABLE store = '{}'", store.display()))
        .arg("-c")
        .arg(".read schemas/sql/views.sql")
        .arg("-c")
        .arg(sql)
        .output()
        .expect("run duckdb");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "duckdb on {sql:?}: {}\n{stderr}",
        out.status
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("duckdb printed {out:?}: {e}"))
}
