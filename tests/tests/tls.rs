//! Mutual TLS between agent and collector: a node with its certificate
//! streams; a client whose certificate no trusted CA signed is refused (and
//! the collector logs the failed handshake); an agent that does not trust the
//! collector says why; a node cannot write as another, nor into another's
//! agent id; node names are compared case-insensitively, without the root dot.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gputel_tests::{Running, collector_bin, fake_nvml, fixture, wal_dir_of};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

/// A CA and the PEM files it signs, in a directory.
struct Pki {
    dir: PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new(dir: &Path, name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key"))
            .expect("CA certificate");
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("ca.pem"), ca.pem()).expect("write CA");
        Pki { dir, ca }
    }

    fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// A certificate for `names` (DNS or IP), as `<stem>.pem` and `<stem>.key`.
    fn issue(&self, stem: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().expect("key");
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let cert = CertificateParams::new(names)
            .expect("params")
            .signed_by(&key, &self.ca)
            .expect("sign");
        let (pem, key_pem) = (
            self.dir.join(format!("{stem}.pem")),
            self.dir.join(format!("{stem}.key")),
        );
        std::fs::write(&pem, cert.pem()).expect("write cert");
        std::fs::write(&key_pem, key.serialize_pem()).expect("write key");
        (pem, key_pem)
    }
}

/// A collector with mutual TLS on 127.0.0.1, a port of its choosing; it and
/// the port.
fn tls_collector(pki: &Pki, store: &Path) -> (Running, u16) {
    let (cert, key) = pki.issue("collector", &["localhost"]);
    let mut cmd = Command::new(collector_bin());
    cmd.args(["--listen", "127.0.0.1:0", "--store"])
        .arg(store)
        .arg("--wal-dir")
        .arg(wal_dir_of(store))
        .args(["--flush-interval", "200ms", "--tls-cert"])
        .arg(cert)
        .arg("--tls-key")
        .arg(key)
        .arg("--tls-client-ca")
        .arg(pki.ca());
    let mut collector = Running::spawn(cmd);
    let addr = collector.listening_address();
    let port = addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {addr:?}"));
    (collector, port)
}

/// An agent as `node` with a certificate from `pki` for `cert_node`; its summary.
fn tls_agent(ca: &Path, pki: &Pki, node: &str, cert_node: &str, port: u16) -> String {
    let out =
        Running::spawn(tls_agent_cmd(ca, pki, node, cert_node, port)).wait(Duration::from_secs(60));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The command of [`tls_agent`]: three ticks of 100 ms, 3 s to deliver them.
fn tls_agent_cmd(ca: &Path, pki: &Pki, node: &str, cert_node: &str, port: u16) -> Command {
    let (cert, key) = pki.issue(cert_node, &[cert_node]);
    let mut cmd = Command::new(gputel_tests::agent_bin());
    cmd.arg("--nvml-lib")
        .arg(fake_nvml())
        .arg("--procfs-root")
        .arg(fixture("proc"))
        .arg("--sysfs-root")
        .arg(fixture("sys"))
        .args(["--node", node])
        .args(["--collector", &format!("https://localhost:{port}")])
        .arg("--tls-ca")
        .arg(ca)
        .arg("--tls-cert")
        .arg(cert)
        .arg("--tls-key")
        .arg(key)
        .args([
            "--interval",
            "100ms",
            "--ticks",
            "3",
            "--drain-timeout",
            "3s",
        ]);
    cmd
}

/// Stops `collector` (it must exit cleanly), then [`node_rows`].
fn stopped_node_rows(collector: Running, dir: &Path, store: &Path) -> Vec<(String, i64)> {
    assert!(
        collector
            .terminate(Duration::from_secs(30))
            .status
            .success()
    );
    node_rows(dir, store)
}

/// Stored rows of the `node` table per node: (node, rows), by node.
fn node_rows(dir: &Path, store: &Path) -> Vec<(String, i64)> {
    gputel_tests::duckdb(
        dir,
        &format!(
            "select node, count(*) as n from {} group by node order by node",
            gputel_tests::table_scan(store, "node")
        ),
    )
    .iter()
    .map(|r| {
        (
            r["node"].as_str().expect("node name").to_owned(),
            r["n"].as_i64().expect("count"),
        )
    })
    .collect()
}

#[test]
fn mutual_tls_admits_a_node_as_itself_only() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(tmp.path(), "cluster");
    let store = tmp.path().join("store");
    let (mut collector, port) = tls_collector(&pki, &store);

    // Node 50 with its own certificate: every tick is acknowledged.
    let summary = tls_agent(&pki.ca(), &pki, "gpu-node-050", "gpu-node-050", port);
    assert!(
        summary
            .starts_with("ticks=3 batches=3 acknowledged=3 rejected=0 dropped=0 unacknowledged=0"),
        "{summary}"
    );

    // Node 50's certificate used to write as node 51: refused.
    let summary = tls_agent(&pki.ca(), &pki, "gpu-node-051", "gpu-node-050", port);
    assert!(summary.contains("acknowledged=0 "), "{summary}");
    collector.wait_for_log(
        "does not name node \"gpu-node-051\"",
        Duration::from_secs(10),
    );

    // A certificate from a CA the collector does not trust: refused, and
    // the collector says who failed the handshake and why.
    let rogue = Pki::new(tmp.path(), "rogue");
    let summary = tls_agent(&pki.ca(), &rogue, "gpu-node-050", "gpu-node-050", port);
    assert!(summary.contains("acknowledged=0 "), "{summary}");
    let line = collector.wait_for_log("TLS handshake failed", Duration::from_secs(10));
    assert!(
        line.contains("peer=127.0.0.1:")
            && line.contains("reason=\"invalid peer certificate: UnknownIssuer\""),
        "{line}"
    );

    // An agent that does not trust the collector's CA says so, not just
    // "transport error".
    let mut distrusting = Running::spawn(tls_agent_cmd(
        &rogue.ca(),
        &pki,
        "gpu-node-050",
        "gpu-node-050",
        port,
    ));
    let line = distrusting.wait_for_log("collector unreachable", Duration::from_secs(30));
    assert!(
        line.contains("invalid peer certificate: UnknownIssuer"),
        "{line}"
    );
    let out = distrusting.wait(Duration::from_secs(60));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("acknowledged=0 "),
        "{out:?}"
    );

    // Only the legitimate node's rows were stored.
    assert_eq!(
        stopped_node_rows(collector, tmp.path(), &store),
        [("gpu-node-050".to_owned(), 3)]
    );
}

/// The attack: node 050, with its own valid certificate, says hello with
/// node 051's agent id (its spool's `agent.id`) and a sequence number of
/// 2^62. It is refused with both nodes named, and its agent logs the reason
/// and backs off; node 051's later batches are acknowledged to it and stored,
/// every one.
#[test]
fn a_node_cannot_write_into_another_nodes_agent_id() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(tmp.path(), "cluster");
    let store = tmp.path().join("store");
    let (mut collector, port) = tls_collector(&pki, &store);

    let spool_b = tmp.path().join("spool-051");
    let run_b = || {
        let mut cmd = tls_agent_cmd(&pki.ca(), &pki, "gpu-node-051", "gpu-node-051", port);
        cmd.arg("--spool-dir").arg(&spool_b);
        let out = Running::spawn(cmd).wait(Duration::from_secs(60));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let summary = run_b();
    assert!(
        summary.starts_with("ticks=3 batches=3 acknowledged=3 rejected=0 dropped=0"),
        "{summary}"
    );
    let agent_id_b = std::fs::read_to_string(spool_b.join("agent.id"))
        .expect("agent.id")
        .trim()
        .to_owned();

    let spool_a = tmp.path().join("spool-050");
    std::fs::create_dir_all(&spool_a).expect("mkdir");
    std::fs::write(spool_a.join("agent.id"), format!("{agent_id_b}\n")).expect("write agent.id");
    // An empty segment named after 2^62: the agent numbers from there.
    std::fs::write(spool_a.join(format!("spool-{:020}.log", 1u64 << 62)), b"").expect("segment");
    let mut cmd = tls_agent_cmd(&pki.ca(), &pki, "gpu-node-050", "gpu-node-050", port);
    cmd.arg("--spool-dir").arg(&spool_a);
    let mut attacker = Running::spawn(cmd);
    let refused = attacker.wait_for_log("collector refused this agent", Duration::from_secs(30));
    let reason = format!(
        "agent id {agent_id_b} belongs to node gpu-node-051; node gpu-node-050 may not use it"
    );
    assert!(
        refused.contains(&reason)
            && refused.contains("PermissionDenied")
            && refused.contains("retry_in=5s"),
        "{refused}"
    );
    let out = attacker.wait(Duration::from_secs(60));
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(
        summary
            .starts_with("ticks=3 batches=3 acknowledged=0 rejected=0 dropped=0 unacknowledged=3"),
        "{summary}"
    );
    collector.find_log(&reason, Duration::from_secs(10));

    // Node 051 carries on: its acks come to it, its rows are stored.
    let summary = run_b();
    assert!(
        summary.starts_with("ticks=3 batches=3 acknowledged=")
            && summary.contains("rejected=0 dropped=0 unacknowledged=0"),
        "{summary}"
    );
    assert_eq!(
        stopped_node_rows(collector, tmp.path(), &store),
        [("gpu-node-051".to_owned(), 6)]
    );
}

/// `GPU-NODE-052.` and `gpu-node-052` are one node for a `gpu-node-052`
/// certificate: one agent id's batches, stored under the canonical name.
#[test]
fn node_names_differing_in_case_or_root_dot_are_one_node() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(tmp.path(), "cluster");
    let store = tmp.path().join("store");
    let (mut collector, port) = tls_collector(&pki, &store);
    let spool = tmp.path().join("spool");
    for node in ["GPU-NODE-052.", "gpu-node-052"] {
        let mut cmd = tls_agent_cmd(&pki.ca(), &pki, node, "gpu-node-052", port);
        cmd.arg("--spool-dir").arg(&spool);
        let out = Running::spawn(cmd).wait(Duration::from_secs(60));
        let summary = String::from_utf8_lossy(&out.stdout);
        // (acknowledged counts the spool's batches of the run before too.)
        assert!(
            summary.starts_with("ticks=3 batches=3 acknowledged=")
                && summary.contains("rejected=0 dropped=0 unacknowledged=0"),
            "{node}: {summary}"
        );
    }
    collector.find_log(
        "node=gpu-node-052 sent_node=GPU-NODE-052.",
        Duration::from_secs(10),
    );
    assert_eq!(
        stopped_node_rows(collector, tmp.path(), &store),
        [("gpu-node-052".to_owned(), 6)]
    );
}

/// The load generator speaks mutual TLS as a fleet does, each simulated
/// node presenting its own certificate (`{node}` in --tls-cert and
/// --tls-key): every batch is acknowledged and stored under its node. A
/// node without its certificate, or a URL and TLS settings that disagree,
/// stop it before it sends anything, with the reason.
#[test]
fn the_load_generator_streams_over_mutual_tls_a_certificate_per_node() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(tmp.path(), "cluster");
    let store = tmp.path().join("store");
    let (collector, port) = tls_collector(&pki, &store);
    for node in ["lg-1", "lg-2", "lg-3"] {
        pki.issue(node, &[node]);
    }
    let loadgen = |agents: &str, url: &str, tls: bool| {
        let mut cmd = Command::new(gputel_tests::loadgen_bin());
        cmd.args([
            "--collector",
            url,
            "--agents",
            agents,
            "--node-prefix",
            "lg-",
        ])
        .args(["--ticks", "4", "--start-ts", "2026-01-01T00:00:00Z"])
        .args(["--timeout", "60s"]);
        if tls {
            cmd.arg("--tls-ca")
                .arg(pki.ca())
                .arg("--tls-cert")
                .arg(pki.dir.join("{node}.pem"))
                .arg("--tls-key")
                .arg(pki.dir.join("{node}.key"));
        }
        cmd.output().expect("run gputel-loadgen")
    };
    let https = format!("https://localhost:{port}");

    let out = loadgen("3", &https, true);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.starts_with(
            "agents=3 gpus=8 ticks=4 batches=12 acknowledged=12 rejected=0 dropped=0 \
             rows: gpu=96 node=12 ib=48 "
        ),
        "{stdout}"
    );

    // A fourth node has no certificate: named, and nothing is sent.
    let out = loadgen("4", &https, true);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        stderr.contains("cannot read ") && stderr.contains("lg-4.pem"),
        "{stderr}"
    );
    // TLS settings with an http:// URL, and an https:// URL without them.
    for (url, tls) in [(format!("http://127.0.0.1:{port}"), true), (https, false)] {
        let out = loadgen("3", &url, tls);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{url}: {out:?}");
        assert!(
            stderr.contains("--tls-ca needs https:// collector URLs"),
            "{stderr}"
        );
    }

    assert_eq!(
        stopped_node_rows(collector, tmp.path(), &store),
        [
            ("lg-1".to_owned(), 4),
            ("lg-2".to_owned(), 4),
            ("lg-3".to_owned(), 4)
        ]
    );
}
