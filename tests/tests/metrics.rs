//! The agent's `/metrics` endpoint, end to end: the real agent on the fake
//! NVML and the fixture trees, scraped over HTTP, checked by the real
//! `promtool` and against the scenario's values under dcgm-exporter's names.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use gputel_tests::{Running, SCENARIO_ENV, fixture_agent, promtool_check_metrics, start_collector};

/// Two GPUs with constant readings; GPU 0 saw four XIDs before the agent
/// started listening (the fake delivers them anyway), GPU 1 is an A100
/// without GPM, HBM temperature or video encoder. The PCI addresses are the
/// fake's defaults (HGX buses 18 and 2A).
const SCENARIO: &str = r#"
driver_version = "550.54.15"

[[gpu]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-3f5b2c1e-8a4d-4e6f-9b7a-1c2d3e4f5a6b"
fb_total_bytes = 85520809984
fb_used_bytes = 42949672960
temperature_c = 61
memory_temperature_c = 68
power_mw = 512000
power_limit_mw = 700000
energy_mj = 123456789
sm_clock_mhz = 1980
memory_clock_mhz = 2619
gpu_util_pct = 97
memory_copy_util_pct = 41
enc_util_pct = 5
dec_util_pct = 17
fb_reserved_bytes = 566231040
sm_active_pct = 87.5
tensor_active_pct = 42.25
xid_events = [{ at_ms = 0, xid = 999 }, { at_ms = 0, xid = 48 }, { at_ms = 0, xid = 79 }, { at_ms = 0, xid = 79 }]

[[gpu]]
name = "NVIDIA A100-SXM4-80GB"
uuid = "GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
fb_total_bytes = 85899345920
fb_used_bytes = 1073741824
temperature_c = 34
memory_temperature_c = "unsupported"
enc_util_pct = "unsupported"
power_mw = 61000
gpm = false
"#;

/// dcgm-exporter 4.6.0-4.8.3's labels, in its order.
const H100: &str = r#"gpu="0",UUID="GPU-3f5b2c1e-8a4d-4e6f-9b7a-1c2d3e4f5a6b",pci_bus_id="00000000:18:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",hostname="gpu-node-017",DCGM_FI_DRIVER_VERSION="550.54.15""#;
const A100: &str = r#"gpu="1",UUID="GPU-0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d",pci_bus_id="00000000:2A:00.0",device="nvidia1",modelName="NVIDIA A100-SXM4-80GB",hostname="gpu-node-017",DCGM_FI_DRIVER_VERSION="550.54.15""#;
/// gputel's own per-GPU labels: dcgm-exporter's without the camelCase
/// `modelName` and the driver version.
const H100_OWN: &str = r#"gpu="0",UUID="GPU-3f5b2c1e-8a4d-4e6f-9b7a-1c2d3e4f5a6b",pci_bus_id="00000000:18:00.0",device="nvidia0",hostname="gpu-node-017""#;

/// What promtool says of dcgm-exporter's own names and labels, which
/// dashboards depend on: the only complaints allowed, and only on DCGM_*.
const DCGM_LINTS: &[&str] = &[
    r#"counter metrics should have "_total" suffix"#,
    "label names should be written in 'snake_case' not 'camelCase'",
    "metric name should not include type 'counter'",
];

struct Scrape {
    status: String,
    content_type: String,
    body: String,
}

/// A response as it came: status line, headers, body bytes.
struct Raw {
    status: String,
    head: String,
    body: Vec<u8>,
}

impl Raw {
    fn header(&self, name: &str) -> Option<String> {
        self.head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_owned())
    }
}

/// A plain HTTP/1.1 GET.
fn get(addr: &str, path: &str) -> std::io::Result<Scrape> {
    let raw = get_raw(addr, path, &[])?;
    Ok(Scrape {
        content_type: raw.header("content-type").unwrap_or_default(),
        status: raw.status,
        body: String::from_utf8(raw.body).expect("a UTF-8 body"),
    })
}

/// An HTTP/1.1 GET with extra request `headers`.
fn get_raw(addr: &str, path: &str, headers: &[(&str, &str)]) -> std::io::Result<Raw> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of headers in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8(raw[..end].to_vec()).expect("ASCII headers");
    let body = raw[end + 4..].to_vec();
    let status = head.lines().next().unwrap_or_default().to_owned();
    let response = Raw { status, head, body };
    if let Some(len) = response.header("content-length") {
        assert_eq!(
            len.parse::<usize>().ok(),
            Some(response.body.len()),
            "{}",
            response.head
        );
    }
    Ok(response)
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut text)
        .expect("a gzip stream");
    text
}

/// The value of `gputel_agent_ticks_total` in a page.
fn ticks_of(page: &[u8]) -> u64 {
    let page = std::str::from_utf8(page).expect("UTF-8");
    series(page, "gputel_agent_ticks_total")
        .first()
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no tick count in\n{page}"))
}

/// The sample lines of `name` (comments and other metrics left out).
fn series<'a>(body: &'a str, name: &str) -> Vec<&'a str> {
    body.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .collect()
}

#[test]
fn metrics_endpoint_serves_dcgm_exporter_names_that_promtool_accepts() {
    let tmp = tempfile::tempdir().unwrap();
    let scenario = tmp.path().join("scenario.toml");
    std::fs::write(&scenario, SCENARIO).unwrap();
    let (collector, addr) = start_collector(&tmp.path().join("store"), &["--flush-interval", "1s"]);

    let mut cmd = fixture_agent("gpu-node-017");
    cmd.args(["--collector", &format!("http://{addr}")])
        .args(["--interval", "100ms", "--metrics-listen", "127.0.0.1:0"])
        .env(SCENARIO_ENV, &scenario)
        .env("RUST_LOG", "info");
    let mut agent = Running::spawn(cmd);
    let metrics_addr = agent.metrics_address();

    // Scrape until the XIDs have come through and GPM has its two samples;
    // every value is constant, so the scrape that shows them is exact.
    let deadline = Instant::now() + Duration::from_secs(30);
    let scrape = loop {
        let scrape = get(&metrics_addr, "/metrics").expect("GET /metrics");
        let ready = scrape.body.contains("gputel_xid_events_total{")
            && scrape.body.contains("DCGM_FI_PROF_SM_ACTIVE{");
        if ready {
            break scrape;
        }
        assert!(
            Instant::now() < deadline,
            "no XIDs or GPM values within 30s; last scrape:\n{}",
            scrape.body
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(scrape.status, "HTTP/1.1 200 OK");
    assert_eq!(
        scrape.content_type,
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let body = scrape.body.as_str();

    // The real promtool parses it and has nothing to say but what
    // dcgm-exporter's names earn.
    let complaints = promtool_check_metrics(body);
    let unexpected: Vec<_> = complaints
        .iter()
        .filter(|(metric, text)| !(metric.starts_with("DCGM_") && DCGM_LINTS.contains(&&**text)))
        .collect();
    assert!(unexpected.is_empty(), "promtool: {unexpected:#?}");
    // gputel's own metrics are lint-free; the DCGM ones earn exactly these.
    assert!(
        complaints.contains(&(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION".into(),
            DCGM_LINTS[0].into()
        )),
        "{complaints:#?}"
    );

    // Exact values under dcgm-exporter's names, units and labels.
    for (name, h100, a100) in [
        ("DCGM_FI_DEV_GPU_TEMP", Some("61"), Some("34")),
        ("DCGM_FI_DEV_MEMORY_TEMP", Some("68"), None),
        // mW to W.
        ("DCGM_FI_DEV_POWER_USAGE", Some("512"), Some("61")),
        ("DCGM_FI_DEV_POWER_MGMT_LIMIT", Some("700"), Some("700")),
        ("DCGM_FI_DEV_SM_CLOCK", Some("1980"), Some("1980")),
        ("DCGM_FI_DEV_MEM_CLOCK", Some("2619"), Some("2619")),
        ("DCGM_FI_DEV_GPU_UTIL", Some("97"), Some("0")),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", Some("41"), Some("0")),
        // The A100's encoder is unsupported: no series.
        ("DCGM_FI_DEV_ENC_UTIL", Some("5"), None),
        ("DCGM_FI_DEV_DEC_UTIL", Some("17"), Some("0")),
        // Bytes to MiB: 40 GiB used, 540 MiB reserved, 81559 MiB total.
        ("DCGM_FI_DEV_FB_USED", Some("40960"), Some("1024")),
        ("DCGM_FI_DEV_FB_RESERVED", Some("540"), Some("0")),
        ("DCGM_FI_DEV_FB_FREE", Some("40059"), Some("80896")),
        // Percent to ratio; the A100 has no GPM, so no series.
        ("DCGM_FI_PROF_SM_ACTIVE", Some("0.875"), None),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", Some("0.4225"), None),
    ] {
        let want: Vec<String> = [(H100, h100), (A100, a100)]
            .into_iter()
            .filter_map(|(labels, v)| v.map(|v| format!("{name}{{{labels}}} {v}")))
            .collect();
        assert_eq!(series(body, name), want, "{name} in\n{body}");
    }
    // Energy: the H100's is given; the A100's is the fake's integral of its
    // power, so present but not exact.
    let energy = series(body, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION");
    assert_eq!(energy.len(), 2, "{energy:?}");
    assert_eq!(
        energy[0],
        format!("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{H100}}} 123456789")
    );
    assert!(
        energy[1].starts_with(&format!("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{A100}}} ")),
        "{energy:?}"
    );
    // The last XID, as DCGM keeps it, with its code and the catalogue's text.
    assert_eq!(
        series(body, "DCGM_FI_DEV_XID_ERRORS"),
        [format!(
            "DCGM_FI_DEV_XID_ERRORS{{{H100},err_code=\"79\",err_msg=\"GPU has fallen off the bus\"}} 79"
        )]
    );
    // NVLink: DCGM's KiB/s / 1000 of both directions, from the same tick's
    // rates as DCGM_FI_PROF_NVLINK_{TX,RX}_BYTES (B/s). The rates themselves
    // depend on when each tick woke, so the relation is checked exactly, and
    // the magnitude (the fake's 40 + 36 GB/s, about 74218) loosely.
    let value_of = |name: &str, labels: &str| -> u64 {
        let prefix = format!("{name}{{{labels}}} ");
        let line = series(body, name)
            .into_iter()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no {prefix}"));
        line[prefix.len()..]
            .parse::<f64>()
            .unwrap_or_else(|_| panic!("{line}")) as u64
    };
    assert_eq!(series(body, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL").len(), 2);
    for labels in [H100, A100] {
        let total = value_of("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", labels);
        let tx = value_of("DCGM_FI_PROF_NVLINK_TX_BYTES", labels);
        let rx = value_of("DCGM_FI_PROF_NVLINK_RX_BYTES", labels);
        assert_eq!(total, (tx + rx) / 1024 / 1000, "{labels}");
        assert!((50_000..100_000).contains(&total), "{total}");
    }
    for (header, kind) in [
        ("DCGM_FI_DEV_GPU_TEMP", "gauge"),
        ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter"),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge"),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter"),
        ("DCGM_FI_DEV_XID_ERRORS", "gauge"),
        ("DCGM_FI_PROF_SM_ACTIVE", "gauge"),
        ("gputel_xid_events_total", "counter"),
        ("gputel_agent_ticks_total", "counter"),
    ] {
        assert!(
            body.contains(&format!("\n# TYPE {header} {kind}\n")),
            "{header} is not a {kind}"
        );
    }
    assert!(!body.contains("hpc_job"), "no job is known: {body}");

    // Every XID counted, per GPU and XID.
    assert_eq!(
        series(body, "gputel_xid_events_total"),
        [
            format!("gputel_xid_events_total{{{H100_OWN},xid=\"48\"}} 1"),
            format!("gputel_xid_events_total{{{H100_OWN},xid=\"79\"}} 2"),
            format!("gputel_xid_events_total{{{H100_OWN},xid=\"999\"}} 1"),
        ]
    );

    // The host and InfiniBand fixtures under gputel's names.
    assert_eq!(
        series(body, "gputel_node_memory_total_bytes"),
        [format!(
            "gputel_node_memory_total_bytes {}",
            2_113_389_424_u64 * 1024
        )]
    );
    assert_eq!(
        series(body, "gputel_node_load1"),
        ["gputel_node_load1 23.41"]
    );
    assert_eq!(
        series(body, "gputel_infiniband_port_data_received_bytes_total")[0],
        format!(
            "gputel_infiniband_port_data_received_bytes_total{{device=\"mlx5_0\",port=\"1\"}} {}",
            4 * 1_984_460_973_326_841_u64
        )
    );
    assert_eq!(
        series(body, "gputel_infiniband_port_state").len(),
        4,
        "one state per fixture port"
    );
    let ticks: u64 = series(body, "gputel_agent_ticks_total")[0]
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("a tick count");
    assert!(ticks >= 2, "GPM needs two ticks, the counter says {ticks}");

    // Only /metrics is served.
    let other = get(&metrics_addr, "/").expect("GET /");
    assert_eq!(other.status, "HTTP/1.1 404 Not Found");

    // The endpoint stops with the agent, which stops cleanly.
    let stopped = agent.terminate(Duration::from_secs(30));
    assert!(stopped.status.success(), "agent exit: {:?}", stopped.status);
    assert!(
        TcpStream::connect(&metrics_addr).is_err(),
        "{metrics_addr} still accepts connections"
    );
    drop(collector);
}

#[test]
fn a_taken_metrics_port_stops_the_agent_with_a_clear_message() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = fixture_agent("gpu-node-017")
        .args([
            "--collector",
            "http://127.0.0.1:9",
            "--metrics-listen",
            &addr,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot listen for /metrics on {addr}: "))
            && stderr.contains("choose another --metrics-listen address"),
        "{stderr}"
    );
    // It stopped before sampling: nothing was delivered or printed.
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `metrics-hostname-label = "Hostname"` in the agent's file keeps the host
/// label's pre-4.6.0 name on every GPU series, dcgm-exporter's and gputel's.
#[test]
fn the_config_file_can_keep_the_capital_hostname_label() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("agent.toml");
    std::fs::write(&config, "metrics-hostname-label = \"Hostname\"\n").unwrap();
    let scenario = tmp.path().join("scenario.toml");
    std::fs::write(
        &scenario,
        "[[gpu]]\ntemperature_c = 44\nxid_events = [{ at_ms = 0, xid = 13 }]\n",
    )
    .unwrap();
    let mut cmd = fixture_agent("gpu-node-017");
    // No collector: the endpoint serves whatever was sampled.
    cmd.arg("--config")
        .arg(&config)
        .args(["--collector", "http://127.0.0.1:9", "--drain-timeout", "1s"])
        .args(["--interval", "100ms", "--metrics-listen", "127.0.0.1:0"])
        .env(SCENARIO_ENV, &scenario)
        .env("RUST_LOG", "info");
    let mut agent = Running::spawn(cmd);
    let addr = agent.metrics_address();
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let body = get(&addr, "/metrics").expect("GET /metrics").body;
        if body.contains("gputel_xid_events_total{") {
            break body;
        }
        assert!(Instant::now() < deadline, "no XID within 30s:\n{body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let ids = r#"gpu="0",UUID="GPU-00000000-fake-4000-8000-000000000000",pci_bus_id="00000000:18:00.0",device="nvidia0""#;
    assert_eq!(
        series(&body, "DCGM_FI_DEV_GPU_TEMP"),
        [format!(
            r#"DCGM_FI_DEV_GPU_TEMP{{{ids},modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-017",DCGM_FI_DRIVER_VERSION="550.54.15"}} 44"#
        )]
    );
    assert_eq!(
        series(&body, "gputel_xid_events_total"),
        [format!(
            r#"gputel_xid_events_total{{{ids},Hostname="gpu-node-017",xid="13"}} 1"#
        )]
    );
    assert!(!body.contains("hostname="), "{body}");
    agent.terminate(Duration::from_secs(30));
}

/// Scrapes within one tick get the same page, plain or gzip-compressed as
/// `Accept-Encoding` allows (weight 0 refuses gzip); a scrape after the
/// next tick gets that tick's values.
#[test]
fn scrapes_share_a_tick_page_and_gzip_when_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let scenario = tmp.path().join("scenario.toml");
    // Energy grows with every tick, so each tick's page differs.
    std::fs::write(&scenario, "[[gpu]]\npower_mw = 300000\n").unwrap();
    let mut cmd = fixture_agent("gpu-node-017");
    cmd.args(["--collector", "http://127.0.0.1:9", "--drain-timeout", "1s"])
        .args(["--interval", "1s", "--metrics-listen", "127.0.0.1:0"])
        // Energy, read at every tick here, differs from one page to the next.
        .args(["--slow-read-interval", "1s"])
        .env(SCENARIO_ENV, &scenario)
        .env("RUST_LOG", "info");
    let mut agent = Running::spawn(cmd);
    let addr = agent.metrics_address();

    // Three scrapes in a row, retried until no tick falls between them.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (plain, gzip, refused) = loop {
        let plain = get_raw(&addr, "/metrics", &[]).expect("GET /metrics");
        let gzip = get_raw(&addr, "/metrics", &[("Accept-Encoding", "gzip, deflate")])
            .expect("GET /metrics, gzip");
        let refused = get_raw(
            &addr,
            "/metrics",
            &[("Accept-Encoding", "gzip;q=0, identity")],
        )
        .expect("GET /metrics, gzip refused");
        let ticks = ticks_of(&plain.body);
        if ticks >= 1 && ticks == ticks_of(&refused.body) {
            break (plain, gzip, refused);
        }
        assert!(
            Instant::now() < deadline,
            "no two scrapes within a tick in 30 s"
        );
    };
    for response in [&plain, &gzip, &refused] {
        assert_eq!(response.status, "HTTP/1.1 200 OK");
        assert_eq!(
            response.header("content-type").as_deref(),
            Some("text/plain; version=0.0.4; charset=utf-8")
        );
        assert_eq!(response.header("vary").as_deref(), Some("accept-encoding"));
    }
    assert_eq!(plain.header("content-encoding"), None);
    assert_eq!(refused.header("content-encoding"), None);
    assert_eq!(gzip.header("content-encoding").as_deref(), Some("gzip"));
    // One tick, one page: the same bytes, and the gzip copy holds them.
    assert_eq!(plain.body, refused.body);
    assert_eq!(gunzip(&gzip.body), plain.body);
    assert!(
        gzip.body.len() * 4 < plain.body.len(),
        "{}",
        gzip.body.len()
    );
    let text = std::str::from_utf8(&plain.body).expect("UTF-8");
    assert!(text.contains("\nDCGM_FI_DEV_POWER_USAGE{"), "{text}");

    // The next tick's page: a higher tick count, its own energy reading.
    let ticks = ticks_of(&plain.body);
    let energy = |page: &[u8]| {
        series(
            std::str::from_utf8(page).expect("UTF-8"),
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        )
        .first()
        .map(|l| (*l).to_owned())
        .expect("an energy series")
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let next = loop {
        let next =
            get_raw(&addr, "/metrics", &[("Accept-Encoding", "gzip")]).expect("GET /metrics, gzip");
        let body = gunzip(&next.body);
        if ticks_of(&body) > ticks {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "no tick after {ticks} within 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_ne!(energy(&next), energy(&plain.body));
    // Plain text of that tick: the same page.
    let again = get_raw(&addr, "/metrics", &[]).expect("GET /metrics");
    if ticks_of(&again.body) == ticks_of(&next) {
        assert_eq!(again.body, next);
    }
    agent.terminate(Duration::from_secs(30));
}
