//! Alerts through a collector failover, end to end (README, *Two or more
//! collectors*, "Alerts: who sends what"): two collectors on one store with
//! the same rules and one real Alertmanager, whose webhook receiver is a
//! small HTTP server here that records every notification. An agent on the
//! fake NVML with a GPU that stays hot streams to one of them; the alert
//! fires and Alertmanager notifies once. That collector is killed
//! (SIGKILL), the agent moves to the other, which evaluates the node from
//! scratch and fires the same alert (same labels) after the rule's `for`.
//! Alertmanager merges it into the alert it has: one alert, still active,
//! with its first start, and no second notification, firing or resolved.
//! The `alert` table holds a `firing` row from each collector and no
//! `resolved` row.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gputel_tests::{
    Alertmanager, HttpRecorder, Running, SCENARIO_ENV, collector_bin, duckdb, fixture_agent,
};
use serde_json::{Map, Value, json};

const NODE: &str = "gpu-node-042";

/// `for` 1 s; no `clear` crossing happens: GPU 1 stays at 95 °C.
const RULES: &str = r#"
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

/// GPU 0 cool, GPU 1 hot throughout.
const SCENARIO: &str = "[[gpu]]\ntemperature_c = 50\n[[gpu]]\ntemperature_c = 95\n";

/// Alertmanager's group timers: the first notification 1 s after the alert
/// arrives, then a look at the group every 2 s; a repeat only after an hour.
const GROUP_INTERVAL: Duration = Duration::from_secs(2);

/// How often each collector re-sends firing alerts (`endsAt` four of them
/// ahead: 20 s, far more than a failover takes here).
const RESEND: &str = "5s";

/// A real Alertmanager, clustering off, that routes every alert to
/// `webhook` (resolutions too); None when the test is to be skipped.
fn alertmanager(dir: &Path, webhook: &str) -> Option<Alertmanager> {
    Alertmanager::start_with_config(
        dir,
        &format!(
            "route:\n  receiver: hook\n  group_by: [alertname]\n  group_wait: 1s\n  \
             group_interval: {}s\n  repeat_interval: 1h\n\
             receivers:\n  - name: hook\n    webhook_configs:\n      \
             - url: {webhook}\n        send_resolved: true\n",
            GROUP_INTERVAL.as_secs()
        ),
    )
}

/// A collector on a free loopback port over `store`, its log in `wal`, with
/// the rules and Alertmanager; returns it and its URL.
fn collector(store: &Path, wal: &Path, rules: &Path, am_url: &str) -> (Running, String) {
    let mut cmd = Command::new(collector_bin());
    cmd.args(["--plaintext", "--listen", "127.0.0.1:0", "--store"])
        .arg(store)
        .arg("--wal-dir")
        .arg(wal)
        .args(["--flush-interval", "1s", "--rules"])
        .arg(rules)
        .args(["--alertmanager-url", am_url])
        .args(["--alert-resend-interval", RESEND])
        .env("RUST_LOG", "info");
    let mut running = Running::spawn(cmd);
    let addr = running.listening_address();
    (running, format!("http://{addr}"))
}

/// Polls `what` until it returns Some, at most `timeout`.
fn wait_until<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(Instant::now() < deadline, "no {what} within {timeout:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Parquet files under `dir`, recursively.
fn parquet_files(dir: &Path) -> Vec<String> {
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return files;
    };
    for entry in entries.map_while(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            files.extend(parquet_files(&path));
        } else if path.extension().is_some_and(|e| e == "parquet") {
            files.push(path.display().to_string());
        }
    }
    files
}

/// Whether the log directory `wal` is that of collector `id` (its state
/// file holds the id).
fn wal_of(wal: &Path, id: &str) -> bool {
    let state = std::fs::read(wal.join("state.pb")).expect("the log's state file");
    state.windows(id.len()).any(|w| w == id.as_bytes())
}

/// An RFC 3339 time of Alertmanager's, in milliseconds since the epoch.
fn millis(time: &Value) -> i64 {
    let text = time.as_str().unwrap_or_else(|| panic!("a time: {time}"));
    chrono::DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|e| panic!("{text}: {e}"))
        .timestamp_millis()
}

#[test]
fn alerts_keep_firing_through_a_failover_without_a_second_notification() {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    // Alertmanager's webhook receiver: answers 200, records every notification.
    let webhook = HttpRecorder::start("");
    let Some(am) = alertmanager(dir.path(), &format!("{}/hook", webhook.url)) else {
        return;
    };
    let rules = dir.path().join("alerts.toml");
    std::fs::write(&rules, RULES).expect("write rules");
    let store = dir.path().join("store");
    let (wal_a, wal_b) = (dir.path().join("a.wal"), dir.path().join("b.wal"));
    let (a, url_a) = collector(&store, &wal_a, &rules, &am.url);
    let (b, url_b) = collector(&store, &wal_b, &rules, &am.url);

    let scenario = dir.path().join("scenario.toml");
    std::fs::write(&scenario, SCENARIO).expect("write scenario");
    let jobs = dir.path().join("jobs");
    std::fs::create_dir_all(&jobs).expect("jobs dir");
    std::fs::write(jobs.join("1"), "4242\n").expect("job mapping");
    let mut cmd = fixture_agent(NODE);
    cmd.args(["--collector", &format!("{url_a},{url_b}")])
        .args(["--interval", "100ms"])
        .arg("--hpc-job-mapping-dir")
        .arg(&jobs)
        .env(SCENARIO_ENV, &scenario)
        .env("RUST_LOG", "info");
    let mut agent = Running::spawn(cmd);

    // The agent picks its first collector by a hash of its node name: that
    // one is the "first", the other the survivor.
    let connected = agent.wait_for_log("connected", Duration::from_secs(30));
    let first_is_a = connected.contains(&format!("collector={url_a} "));
    assert!(
        first_is_a || connected.contains(&format!("collector={url_b} ")),
        "{connected}"
    );
    let (mut first, mut survivor, first_wal, survivor_wal, survivor_url) = if first_is_a {
        (a, b, &wal_a, &wal_b, &url_b)
    } else {
        (b, a, &wal_b, &wal_a, &url_a)
    };

    let fired = first.wait_for_log("alert firing", Duration::from_secs(30));
    assert!(
        fired.contains("rule=GpuHot") && fired.contains(NODE),
        "{fired}"
    );
    let expected_labels: Map<String, Value> = json!({
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
    .clone();

    // Alertmanager has it firing and has notified once.
    let before = wait_until("GpuHot in Alertmanager", Duration::from_secs(30), || {
        am.alerts_named("GpuHot").into_iter().next()
    });
    assert_eq!(before["labels"], Value::Object(expected_labels.clone()));
    assert_eq!(before["status"]["state"], "active", "{before:#}");
    wait_until("firing notification", Duration::from_secs(30), || {
        (!webhook.received().is_empty()).then_some(())
    });
    // The first collector's firing row is in the store, not only in its log.
    wait_until(
        "alert file of the first collector",
        Duration::from_secs(30),
        || (!parquet_files(&store.join("alert")).is_empty()).then_some(()),
    );
    assert_eq!(
        webhook.received().len(),
        1,
        "before the failover: {:#?}",
        webhook.received()
    );

    // SIGKILL: the first collector neither resolves nor hands over anything.
    let killed_at = chrono::Utc::now();
    let killed = first.signal("KILL", Duration::from_secs(30));
    assert!(!killed.status.success());
    let moved = agent.wait_for_log(
        &format!("collector={survivor_url} "),
        Duration::from_secs(30),
    );
    assert!(moved.contains("connected"), "{moved}");

    // The survivor fires the alert again after `for`, and sends it.
    let refired = survivor.wait_for_log("alert firing", Duration::from_secs(30));
    assert!(
        refired.contains("rule=GpuHot") && refired.contains(NODE),
        "{refired}"
    );
    wait_until(
        "the survivor's alert in Alertmanager",
        Duration::from_secs(30),
        || {
            let alerts = am.alerts_named("GpuHot");
            let updated = alerts.first()?["updatedAt"].as_str()?.to_owned();
            let updated = chrono::DateTime::parse_from_rfc3339(&updated).ok()?;
            (updated > killed_at).then_some(())
        },
    );
    // A few looks at the group by Alertmanager, and a resend of the survivor.
    std::thread::sleep(GROUP_INTERVAL * 3);

    let after = am.alerts_named("GpuHot");
    assert_eq!(after.len(), 1, "{after:#?}");
    let alert = &after[0];
    assert_eq!(alert["labels"], Value::Object(expected_labels.clone()));
    assert_eq!(alert["status"]["state"], "active", "{alert:#}");
    assert_eq!(alert["fingerprint"], before["fingerprint"], "{alert:#}");
    // Merged: the start is the first collector's.
    assert_eq!(alert["startsAt"], before["startsAt"], "{alert:#}");

    let notifications = webhook.received();
    assert_eq!(notifications.len(), 1, "{notifications:#?}");
    let notification = &notifications[0];
    assert_eq!(notification.request_line, "POST /hook HTTP/1.1");
    let body = notification.json();
    assert_eq!(body["status"], "firing", "{body:#}");
    let alerts = body["alerts"].as_array().expect("alerts");
    assert_eq!(alerts.len(), 1, "{body:#}");
    assert_eq!(alerts[0]["status"], "firing");
    assert_eq!(alerts[0]["labels"], Value::Object(expected_labels));
    // The webhook prints times as Go does (no trailing zeros): compare instants.
    assert_eq!(millis(&alerts[0]["startsAt"]), millis(&before["startsAt"]));

    drop(agent);
    let (stopped, survivor_log) = survivor.terminate_with_log(Duration::from_secs(30));
    assert!(stopped.status.success(), "{}", survivor_log.join("\n"));
    // Stopping sends no resolution either.
    assert!(
        webhook.received().len() == 1 && am.alerts_named("GpuHot").len() == 1,
        "{:#?}",
        webhook.received()
    );

    // One firing row from each collector (the collector id starts each
    // file's name), no resolution.
    let rows = duckdb(
        dir.path(),
        &format!(
            "select regexp_extract(filename, '([0-9a-f]+)-[0-9]+\\.parquet$', 1) as collector, \
                    status, rule, node, gpu, job_id, value, starts_at = ts as starts_now, \
                    epoch_ms(starts_at) as starts_ms \
             from read_parquet('{}/alert/**/*.parquet', hive_partitioning = true, filename = true) \
             order by ts",
            store.display()
        ),
    );
    assert_eq!(rows.len(), 2, "{rows:#?}");
    let ids: Vec<&str> = rows
        .iter()
        .map(|r| r["collector"].as_str().expect("collector id"))
        .collect();
    assert!(wal_of(first_wal, ids[0]), "{rows:#?}");
    assert!(wal_of(survivor_wal, ids[1]), "{rows:#?}");
    assert_ne!(ids[0], ids[1]);
    for row in &rows {
        let mut row = row.clone();
        row.remove("collector");
        row.remove("starts_ms");
        assert_eq!(
            Value::Object(row),
            json!({
                "status": "firing", "rule": "GpuHot", "node": NODE, "gpu": 1,
                "job_id": "4242", "value": 95.0, "starts_now": true,
            }),
            "{rows:#?}"
        );
    }
    // The first row's start is the one Alertmanager keeps; the survivor's is later.
    assert_eq!(
        rows[0]["starts_ms"],
        json!(millis(&before["startsAt"])),
        "{rows:#?}"
    );
    assert!(
        rows[1]["starts_ms"].as_i64() > rows[0]["starts_ms"].as_i64(),
        "{rows:#?}"
    );
    eprintln!(
        "failover of {NODE}: the alert fired on both collectors, one notification; {:?} in all",
        started.elapsed()
    );
}
