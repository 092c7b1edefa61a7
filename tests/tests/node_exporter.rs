//! The agent against the real peer: Debian's node_exporter and
//! `gputel-agent --once --sources node,ib` read the same captured trees
//! (tests/fixtures/captures/, from node_exporter's and procfs' own fixtures),
//! and every InfiniBand counter, state, rate, device identity, RAPL energy and
//! memory figure node_exporter reports must be the agent's, port by port, in
//! node_exporter's units (bytes, bytes per second, joules).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gputel_tests::{
    Running, agent_bin, duckdb, fixture, http_get, node_exporter_bin, start_collector, table_scan,
    unused_port,
};
use serde_json::Value;

/// One sample of node_exporter's exposition: its labels and value.
#[derive(Debug, Clone)]
struct Series {
    labels: BTreeMap<String, String>,
    value: f64,
}

/// node_exporter's /metrics, by metric name.
type Exposition = BTreeMap<String, Vec<Series>>;

/// The agent's `ib` row field and node_exporter's `node_infiniband_<name>`
/// for every counter node_exporter 1.5.0 reads from `counters/`.
const COUNTERS: [(&str, &str); 22] = [
    ("xmit_bytes", "port_data_transmitted_bytes_total"),
    ("rcv_bytes", "port_data_received_bytes_total"),
    ("xmit_packets", "port_packets_transmitted_total"),
    ("rcv_packets", "port_packets_received_total"),
    ("unicast_xmit_packets", "unicast_packets_transmitted_total"),
    ("unicast_rcv_packets", "unicast_packets_received_total"),
    (
        "multicast_xmit_packets",
        "multicast_packets_transmitted_total",
    ),
    ("multicast_rcv_packets", "multicast_packets_received_total"),
    ("symbol_error", "symbol_error_total"),
    ("link_downed", "link_downed_total"),
    ("link_error_recovery", "link_error_recovery_total"),
    ("port_rcv_errors", "port_errors_received_total"),
    ("port_xmit_discards", "port_discards_transmitted_total"),
    ("port_rcv_discards", "port_discards_received_total"),
    ("port_xmit_wait", "port_transmit_wait_total"),
    (
        "port_rcv_constraint_errors",
        "port_constraint_errors_received_total",
    ),
    (
        "port_xmit_constraint_errors",
        "port_constraint_errors_transmitted_total",
    ),
    (
        "port_rcv_remote_physical_errors",
        "port_receive_remote_physical_errors_total",
    ),
    (
        "port_rcv_switch_relay_errors",
        "port_receive_switch_relay_errors_total",
    ),
    (
        "local_link_integrity_errors",
        "local_link_integrity_errors_total",
    ),
    (
        "excessive_buffer_overrun_errors",
        "excessive_buffer_overrun_errors_total",
    ),
    ("vl15_dropped", "vl15_dropped_total"),
];

/// Per-port gauges: the agent's field, node_exporter's name, and the
/// factor from the agent's unit to node_exporter's.
const GAUGES: [(&str, &str, f64); 3] = [
    ("state_id", "state_id", 1.0),
    ("phys_state_id", "physical_state_id", 1.0),
    // Gb/s to bytes/s.
    ("rate_gbps", "rate_bytes_per_second", 125_000_000.0),
];

fn capture(name: &str) -> PathBuf {
    fixture("captures").join(name)
}

/// node_exporter on `capture`'s trees with the infiniband, rapl and meminfo
/// collectors only: its /metrics, parsed.
fn node_exporter_metrics(bin: &Path, capture: &Path) -> Exposition {
    // node_exporter cannot listen on port 0 and say which port it got.
    let addr = format!("127.0.0.1:{}", unused_port());
    let mut cmd = Command::new(bin);
    cmd.arg(format!("--path.sysfs={}", capture.join("sys").display()))
        .arg(format!("--path.procfs={}", capture.join("proc").display()))
        .args([
            "--collector.disable-defaults",
            "--collector.infiniband",
            "--collector.rapl",
            "--collector.meminfo",
        ])
        .arg(format!("--web.listen-address={addr}"));
    let _node_exporter = Running::spawn(cmd);
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        match http_get(&addr, "/metrics") {
            Some((200, body)) => break body,
            _ => {
                assert!(
                    Instant::now() < deadline,
                    "node_exporter ({}) did not answer on {addr} within 30 s",
                    bin.display()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    let metrics = parse_exposition(&body);
    for collector in ["infiniband", "rapl", "meminfo"] {
        let success = &metrics["node_scrape_collector_success"];
        assert!(
            success
                .iter()
                .any(|s| s.labels["collector"] == collector && s.value == 1.0),
            "node_exporter's {collector} collector failed on {}: {success:?}",
            capture.display()
        );
    }
    metrics
}

/// The Prometheus text format, as node_exporter writes it (no timestamps;
/// label values without escaped quotes, as in these captures).
fn parse_exposition(text: &str) -> Exposition {
    let mut out = Exposition::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (head, value) = line.rsplit_once(' ').expect("a sample line has a value");
        let value: f64 = value.parse().unwrap_or_else(|e| panic!("{line:?}: {e}"));
        let (name, labels) = match head.split_once('{') {
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').expect("labels end with }");
                let mut labels = BTreeMap::new();
                let mut rest = body;
                while !rest.is_empty() {
                    let (key, after) = rest.split_once("=\"").expect("label=\"value\"");
                    let (value, after) = after.split_once('"').expect("closing quote");
                    assert!(!value.ends_with('\\'), "escaped quote in {line:?}");
                    labels.insert(key.to_owned(), value.to_owned());
                    rest = after.strip_prefix(',').unwrap_or(after);
                }
                (name, labels)
            }
            None => (head, BTreeMap::new()),
        };
        out.entry(name.to_owned())
            .or_default()
            .push(Series { labels, value });
    }
    out
}

/// `gputel-agent --node capture --sources node,ib` on `capture`'s trees.
fn capture_agent(capture: &Path) -> Command {
    let mut cmd = Command::new(agent_bin());
    cmd.args(["--node", "capture", "--sources", "node,ib"])
        .arg("--procfs-root")
        .arg(capture.join("proc"))
        .arg("--sysfs-root")
        .arg(capture.join("sys"));
    cmd
}

/// `gputel-agent --once --sources node,ib` on `capture`'s trees.
fn agent_once(capture: &Path) -> Value {
    let out = capture_agent(capture)
        .args(["--once", "--interval", "50ms"])
        .output()
        .expect("run gputel-agent");
    assert!(
        out.status.success(),
        "gputel-agent --once failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snap: Value = serde_json::from_slice(&out.stdout).expect("--once prints JSON");
    assert_eq!(snap["errors"], serde_json::json!([]), "{snap:#}");
    snap
}

/// node_exporter's value of `node_infiniband_<name>` for one port, if any.
fn port_value(ne: &Exposition, name: &str, device: &str, port: &str) -> Option<f64> {
    let series = ne.get(&format!("node_infiniband_{name}"))?;
    let found: Vec<f64> = series
        .iter()
        .filter(|s| s.labels["device"] == device && s.labels["port"] == port)
        .map(|s| s.value)
        .collect();
    assert!(found.len() <= 1, "{name} {device}/{port}: {found:?}");
    found.first().copied()
}

/// What the agent's JSON says as node_exporter would print it (f64, null as None).
fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Null => None,
        // Every integer here is below 2^53: f64 holds it exactly.
        Value::Number(n) => n.as_u64().map(|v| v as f64).or_else(|| n.as_f64()),
        other => panic!("not a number: {other}"),
    }
}

/// Compares everything both report for one capture; returns the number of
/// values compared, so a capture that compares nothing is noticed.
fn compare(name: &str, ne: &Exposition, agent: &Value) -> usize {
    let mut compared = 0;
    let ports = agent["ib_ports"].as_array().expect("ib_ports");

    // The same ports on both sides.
    let ne_ports: BTreeSet<(String, String)> = ne["node_infiniband_state_id"]
        .iter()
        .map(|s| (s.labels["device"].clone(), s.labels["port"].clone()))
        .collect();
    let agent_ports: BTreeSet<(String, String)> = ports
        .iter()
        .map(|p| {
            (
                p["device"].as_str().expect("device").to_owned(),
                p["port"].to_string(),
            )
        })
        .collect();
    assert_eq!(agent_ports, ne_ports, "{name}: ports");

    // Every per-port series node_exporter has is compared here, or is one
    // of its legacy_* series (counters_ext as is, see README).
    let known: BTreeSet<String> = COUNTERS
        .iter()
        .map(|(_, n)| *n)
        .chain(GAUGES.iter().map(|(_, n, _)| *n))
        .map(|n| format!("node_infiniband_{n}"))
        .collect();
    for metric in ne.keys().filter(|k| k.starts_with("node_infiniband_")) {
        assert!(
            known.contains(metric)
                || metric.starts_with("node_infiniband_legacy_")
                || metric == "node_infiniband_info",
            "{name}: node_exporter reports {metric}, which this test does not compare"
        );
    }

    for p in ports {
        let device = p["device"].as_str().expect("device");
        let port = p["port"].to_string();
        for (field, ne_name) in COUNTERS {
            assert_eq!(
                number(&p[field]),
                port_value(ne, ne_name, device, &port),
                "{name}: {device} port {port}: agent {field} vs node_infiniband_{ne_name}"
            );
            compared += 1;
        }
        for (field, ne_name, factor) in GAUGES {
            assert_eq!(
                number(&p[field]).map(|v| v * factor),
                port_value(ne, ne_name, device, &port),
                "{name}: {device} port {port}: agent {field} vs node_infiniband_{ne_name}"
            );
            compared += 1;
        }
    }

    // The device's identity; node_exporter prints an absent hca_type as "".
    for info in &ne["node_infiniband_info"] {
        let device = &info.labels["device"];
        let p = ports
            .iter()
            .find(|p| p["device"] == device.as_str())
            .unwrap_or_else(|| panic!("{name}: no agent port of {device}"));
        for (field, label) in [
            ("board_id", "board_id"),
            ("fw_ver", "firmware_version"),
            ("hca_type", "hca_type"),
        ] {
            assert_eq!(
                p[field].as_str().unwrap_or(""),
                info.labels[label],
                "{name}: {device} {field}"
            );
            compared += 1;
        }
    }

    // RAPL: the agent sums the package-N zones, node_exporter has one series
    // per zone, in joules.
    let host = &agent["host"];
    let ne_uj = |metric: &str| {
        ne.get(metric).map(|series| {
            series
                .iter()
                .map(|s| (s.value * 1e6).round() as u64)
                .sum::<u64>()
        })
    };
    assert_eq!(
        host["cpu_package_energy_uj"].as_u64(),
        ne_uj("node_rapl_package_joules_total"),
        "{name}: CPU package energy"
    );
    assert_eq!(
        host["dram_energy_uj"].as_u64(),
        ne_uj("node_rapl_dram_joules_total"),
        "{name}: DRAM energy"
    );
    compared += 2;

    // Memory: node_exporter reports the meminfo lines in bytes; the agent
    // sends KiB, and without MemAvailable the cache and reclaimable slab
    // counted as available.
    let mem = |line: &str| {
        ne.get(&format!("node_memory_{line}_bytes"))
            .map(|s| s[0].value as u64)
    };
    let kib = |field: &str| host[field].as_u64().map(|v| v * 1024);
    assert_eq!(kib("memory_total_kib"), mem("MemTotal"), "{name}: total");
    let available = mem("MemAvailable").unwrap_or_else(|| {
        mem("MemFree").expect("MemFree")
            + mem("Buffers").expect("Buffers")
            + mem("Cached").expect("Cached")
            + mem("SReclaimable").unwrap_or(0)
    });
    assert_eq!(
        kib("memory_available_kib"),
        Some(available),
        "{name}: available"
    );
    compared + 2
}

#[test]
fn the_agent_reports_what_node_exporter_reports_on_real_captures() {
    let Some(bin) = node_exporter_bin() else {
        return;
    };
    for (name, at_least) in [("node_exporter-1.5.0", 80), ("procfs-3c943fd", 110)] {
        let dir = capture(name);
        let ne = node_exporter_metrics(&bin, &dir);
        let agent = agent_once(&dir);
        let compared = compare(name, &ne, &agent);
        assert!(
            compared >= at_least,
            "{name}: only {compared} values compared"
        );
    }
}

#[test]
fn node_exporter_repeats_the_copied_counters_ext_and_the_agent_does_not() {
    let Some(bin) = node_exporter_bin() else {
        return;
    };
    let dir = capture("node_exporter-1.5.0");
    let ne = node_exporter_metrics(&bin, &dir);
    let agent = agent_once(&dir);
    let legacy = |name: &str, port: &str| port_value(&ne, name, "mlx4_0", port);
    // Port 2's counters_ext is port 1's: node_exporter reports port 1's
    // data under port 2's labels, and zero packets on port 1.
    assert_eq!(
        legacy("legacy_data_received_bytes_total", "2"),
        Some(18_527_668.0)
    );
    assert_eq!(legacy("legacy_packets_received_total", "1"), Some(0.0));
    let port = |n: u64| {
        agent["ib_ports"]
            .as_array()
            .expect("ib_ports")
            .iter()
            .find(|p| p["device"] == "mlx4_0" && p["port"] == n)
            .cloned()
            .expect("mlx4_0 port")
    };
    assert_eq!(port(2)["rcv_bytes"], 0);
    assert_eq!(port(2)["rcv_packets"], Value::Null);
    assert_eq!(port(1)["rcv_packets"], 6_825_908_347_u64);
    // The node's traffic, summed over ports, counts port 1's once.
    let rcv: u64 = agent["ib_ports"]
        .as_array()
        .expect("ib_ports")
        .iter()
        .filter_map(|p| p["rcv_bytes"].as_u64())
        .sum();
    assert_eq!(rcv, 18_527_668);
}

/// What reaches Parquet is what `--once` says (and so what node_exporter
/// says): the agent streams two ticks of each capture to a collector, and
/// the last tick's `ib` and `node` rows, read back with DuckDB, hold the same
/// counters, states, rates and memory figures as the snapshot, to the byte.
#[test]
fn the_stored_rows_are_the_snapshot_node_exporter_agrees_with() {
    let columns: Vec<&str> = COUNTERS
        .iter()
        .map(|(field, _)| *field)
        .chain(["state", "phys_state", "link_layer", "rate_gbps", "fw_ver"])
        .collect();
    for name in ["node_exporter-1.5.0", "procfs-3c943fd"] {
        let capture = capture(name);
        let snap = agent_once(&capture);
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = tmp.path().join("store");
        let (collector, addr) = start_collector(&store, &["--flush-interval", "1h"]);
        let out = capture_agent(&capture)
            .args(["--collector", &format!("http://{addr}"), "--plaintext"])
            .args(["--interval", "100ms", "--ticks", "2"])
            .output()
            .expect("run gputel-agent");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            collector
                .terminate(Duration::from_secs(30))
                .status
                .success()
        );

        let ib = table_scan(&store, "ib");
        let stored = duckdb(
            tmp.path(),
            &format!(
                "select device, port, {} from {ib} where ts = (select max(ts) from {ib}) \
                 order by device, port",
                columns.join(", ")
            ),
        );
        let ports = snap["ib_ports"].as_array().expect("ib_ports");
        assert_eq!(stored.len(), ports.len(), "{name}: ports");
        for (row, port) in stored.iter().zip(ports) {
            assert_eq!(row["device"], port["device"], "{name}");
            assert_eq!(row["port"], port["port"], "{name}");
            for column in &columns {
                assert_eq!(
                    number_or_text(&row[*column]),
                    number_or_text(&port[*column]),
                    "{name} {}/{}: {column}",
                    port["device"],
                    port["port"]
                );
            }
        }
        let node = table_scan(&store, "node");
        let memory = duckdb(
            tmp.path(),
            &format!(
                "select memory_total_kib, memory_available_kib, \
                 cpu_package_energy_uj from {node} order by ts desc limit 1"
            ),
        );
        for (column, value) in &memory[0] {
            assert_eq!(
                number_or_text(value),
                number_or_text(&snap["host"][column.as_str()]),
                "{name}: node.{column}"
            );
        }
    }
}

/// A JSON value as text, numbers without a trailing `.0`, null as null:
/// DuckDB and `--once` print the same integer in either form.
fn number_or_text(v: &Value) -> Value {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
            _ => v.clone(),
        },
        _ => v.clone(),
    }
}
