//! Parity with dcgm-exporter's default counters: every metric its
//! `etc/default-counters.csv` enables (the file itself, byte for byte, is in
//! `tests/fixtures/dcgm-exporter/`) is on the agent's `/metrics` with the
//! same TYPE and HELP, and every series carries exactly dcgm-exporter's
//! labels in its order, with the file's `label` rows among them. Rows gputel
//! cannot provide are listed once, in [`NOT_PROVIDED`], with the reason, and
//! the README lists the same.

use std::time::{Duration, Instant};

use gputel_tests::{Running, SCENARIO_ENV, fixture, fixture_agent, http_get, workspace_root};

/// Default counters gputel does not serve, and why. README.md's /metrics
/// section names each.
const NOT_PROVIDED: &[(&str, &str)] = &[(
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "the licence state of a vGPU, which only a vGPU guest's driver knows; the agent \
     runs on the host that owns the physical GPUs, where NVML has no such reading",
)];

/// Two H100s on which every metric reads, GPM included; GPU 0 is job 4242's
/// (mapping directory) and reports XID 79.
const SCENARIO: &str = r#"
driver_version = "550.90.07"

[[gpu]]
count = 2
enc_util_pct = 5
dec_util_pct = 17
fb_reserved_bytes = 566231040
fb_used_bytes = 42949672960
gpu_util_pct = 97
sm_active_pct = 87.5
tensor_active_pct = 42.25
dram_active_pct = 30.5
graphics_active_pct = 95
xid_events = [{ at_ms = 0, xid = 79 }]
"#;

/// dcgm-exporter's labels of a GPU series, in its order, before its
/// `label` rows and attributes.
const IDENTITY_LABELS: [&str; 6] = [
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "hostname",
];

/// One active row of the CSV.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Counter {
    field: String,
    kind: String,
    help: String,
}

/// The active rows of a dcgm-exporter counters file, as dcgm-exporter reads
/// it: `#` starts a comment line, fields are trimmed, three per row.
fn parse_counters(text: &str) -> Vec<Counter> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let fields: Vec<&str> = l.splitn(3, ',').map(str::trim).collect();
            assert_eq!(fields.len(), 3, "row {l:?} has no three fields");
            Counter {
                field: fields[0].to_owned(),
                kind: fields[1].to_owned(),
                help: fields[2].to_owned(),
            }
        })
        .collect()
}

/// The label names and values of one exposition line, in order.
fn labels_of(line: &str) -> Vec<(String, String)> {
    let Some(start) = line.find('{') else {
        return Vec::new();
    };
    let mut chars = line[start + 1..].chars();
    let mut out = Vec::new();
    loop {
        let name: String = chars.by_ref().take_while(|c| *c != '=').collect();
        assert_eq!(chars.next(), Some('"'), "{line}");
        let mut value = String::new();
        loop {
            match chars.next() {
                Some('\\') => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(c) => value.push(c),
                    None => panic!("{line}"),
                },
                Some('"') => break,
                Some(c) => value.push(c),
                None => panic!("unterminated value in {line}"),
            }
        }
        out.push((name, value));
        match chars.next() {
            Some(',') => {}
            Some('}') => return out,
            other => panic!("{other:?} after a label value in {line}"),
        }
    }
}

#[test]
fn dcgm_exporters_fixture_has_its_known_rows() {
    let text = std::fs::read_to_string(fixture("dcgm-exporter/default-counters.csv"))
        .expect("read the fixture");
    // The copy is whole: its size and its last row as NVIDIA ships them.
    assert_eq!(text.len(), 5836);
    let counters = parse_counters(&text);
    assert_eq!(counters.len(), 26, "{counters:#?}");
    let labels: Vec<&str> = counters
        .iter()
        .filter(|c| c.kind == "label")
        .map(|c| c.field.as_str())
        .collect();
    assert_eq!(labels, ["DCGM_FI_DRIVER_VERSION"]);
    assert_eq!(
        counters.last(),
        Some(&Counter {
            field: "DCGM_FI_PROF_PCIE_RX_BYTES".into(),
            kind: "gauge".into(),
            help: "The rate of data received over the PCIe bus - including both protocol headers \
                   and data payloads - in bytes per second."
                .into(),
        })
    );
    // "DCGM_FI_DEV_DEC_UTIL ," : a space before the comma, trimmed as
    // dcgm-exporter trims it.
    assert!(counters.iter().any(|c| c.field == "DCGM_FI_DEV_DEC_UTIL"));
}

#[test]
fn every_default_counter_is_served_with_dcgm_exporters_type_help_and_labels() {
    let text = std::fs::read_to_string(fixture("dcgm-exporter/default-counters.csv"))
        .expect("read the fixture");
    let counters = parse_counters(&text);
    for (field, _) in NOT_PROVIDED {
        assert!(
            counters.iter().any(|c| c.field == *field),
            "{field} is listed as not provided but is no active row"
        );
    }

    let tmp = tempfile::tempdir().unwrap();
    let scenario = tmp.path().join("scenario.toml");
    std::fs::write(&scenario, SCENARIO).unwrap();
    let jobs = tmp.path().join("jobs");
    std::fs::create_dir(&jobs).unwrap();
    std::fs::write(jobs.join("0"), "4242\n").unwrap();
    let mut cmd = fixture_agent("gpu-node-017");
    cmd.args(["--collector", "http://127.0.0.1:9", "--drain-timeout", "1s"])
        .args(["--interval", "100ms", "--metrics-listen", "127.0.0.1:0"])
        .arg("--hpc-job-mapping-dir")
        .arg(&jobs)
        .env(SCENARIO_ENV, &scenario)
        .env("RUST_LOG", "info");
    let mut agent = Running::spawn(cmd);
    let addr = agent.metrics_address();

    let metrics: Vec<&Counter> = counters
        .iter()
        .filter(|c| c.kind != "label" && !NOT_PROVIDED.iter().any(|(f, _)| *f == c.field))
        .collect();
    // Rates and GPM need two ticks, the XID its event: scrape until every
    // family is there.
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let (status, body) = http_get(&addr, "/metrics").expect("GET /metrics");
        assert_eq!(status, 200);
        let missing: Vec<&str> = metrics
            .iter()
            .map(|c| c.field.as_str())
            .filter(|f| !body.contains(&format!("\n{f}{{")))
            .collect();
        if missing.is_empty() {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "missing after 30s: {missing:?}\n{body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    agent.terminate(Duration::from_secs(30));

    let label_rows: Vec<&str> = counters
        .iter()
        .filter(|c| c.kind == "label")
        .map(|c| c.field.as_str())
        .collect();
    for counter in metrics {
        let name = &counter.field;
        let help = format!("# HELP {name} {}", counter.help);
        let kind = format!("# TYPE {name} {}", counter.kind);
        let lines: Vec<&str> = body.lines().collect();
        let at = lines
            .iter()
            .position(|l| *l == help)
            .unwrap_or_else(|| panic!("no {help:?} in\n{body}"));
        assert_eq!(lines.get(at + 1), Some(&kind.as_str()), "{name}");
        let series: Vec<&str> = lines[at + 2..]
            .iter()
            .take_while(|l| !l.starts_with('#'))
            .copied()
            .collect();
        assert_eq!(series.len(), 2, "{name}: one series per GPU: {series:#?}");
        for (gpu, line) in series.iter().enumerate() {
            assert!(line.starts_with(&format!("{name}{{")), "{line}");
            let labels = labels_of(line);
            let names: Vec<&str> = labels.iter().map(|(n, _)| n.as_str()).collect();
            let mut want: Vec<&str> = IDENTITY_LABELS.to_vec();
            want.extend(&label_rows);
            // dcgm-exporter's attributes, sorted by name.
            if name == "DCGM_FI_DEV_XID_ERRORS" {
                want.extend(["err_code", "err_msg"]);
            }
            if gpu == 0 {
                want.push("hpc_job");
            }
            assert_eq!(names, want, "{line}");
            let value = |label: &str| {
                labels
                    .iter()
                    .find(|(n, _)| n == label)
                    .map(|(_, v)| v.as_str())
            };
            assert_eq!(value("gpu"), Some(gpu.to_string().as_str()), "{line}");
            assert_eq!(
                value("pci_bus_id"),
                Some(["00000000:18:00.0", "00000000:2A:00.0"][gpu]),
                "{line}"
            );
            assert_eq!(value("hostname"), Some("gpu-node-017"), "{line}");
            // The label row's value: the scenario's driver version.
            assert_eq!(value("DCGM_FI_DRIVER_VERSION"), Some("550.90.07"), "{line}");
            if name == "DCGM_FI_DEV_XID_ERRORS" {
                assert_eq!(value("err_code"), Some("79"), "{line}");
                assert_eq!(
                    value("err_msg"),
                    Some("GPU has fallen off the bus"),
                    "{line}"
                );
            }
            if gpu == 0 {
                assert_eq!(value("hpc_job"), Some("4242"), "{line}");
            }
        }
    }
}

#[test]
fn the_readme_lists_every_default_counter_not_provided() {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).expect("README.md");
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("The agent"))
        .expect("README has a section \"The agent\"");
    for (field, _) in NOT_PROVIDED {
        assert!(
            section.contains(&format!("`{field}`")),
            "README.md's section \"The agent\" does not name {field}"
        );
    }
}

#[test]
fn labels_are_read_in_order_with_escapes() {
    assert_eq!(
        labels_of(r#"m{a="1",b="x\"y\\z\n",c=""} 3"#),
        [
            ("a".to_owned(), "1".to_owned()),
            ("b".to_owned(), "x\"y\\z\n".to_owned()),
            ("c".to_owned(), String::new()),
        ]
    );
    assert_eq!(labels_of("m 3"), []);
}
