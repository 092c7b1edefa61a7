//! Mutual TLS between agent and collector: a node with its certificate
//! streams; a client whose certificate no trusted CA signed is refused; a
//! node cannot write as another.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gputel_tests::{Running, collector_bin, fake_nvml, fixture, unused_port, wal_dir_of};
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

fn tls_collector(pki: &Pki, store: &Path, port: u16) -> Running {
    let (cert, key) = pki.issue("collector", &["localhost"]);
    let mut cmd = Command::new(collector_bin());
    cmd.args(["--listen", &format!("127.0.0.1:{port}"), "--store"])
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
    collector.wait_for_log("listening on ", Duration::from_secs(30));
    collector
}

/// An agent as `node` with a certificate from `pki` for `cert_node`; its summary.
fn tls_agent(ca: &Path, pki: &Pki, node: &str, cert_node: &str, port: u16) -> String {
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
    let out = Running::spawn(cmd).wait(Duration::from_secs(60));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn mutual_tls_admits_a_node_as_itself_only() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new(tmp.path(), "cluster");
    let store = tmp.path().join("store");
    let port = unused_port();
    let mut collector = tls_collector(&pki, &store, port);

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

    // A certificate from a CA the collector does not trust: refused.
    let rogue = Pki::new(tmp.path(), "rogue");
    let summary = tls_agent(&pki.ca(), &rogue, "gpu-node-050", "gpu-node-050", port);
    assert!(summary.contains("acknowledged=0 "), "{summary}");

    assert!(
        collector
            .terminate(Duration::from_secs(30))
            .status
            .success()
    );
    // Only the legitimate node's rows were stored.
    let nodes = gputel_tests::duckdb(
        tmp.path(),
        &format!(
            "select node, count(*) as n from {} group by node",
            gputel_tests::table_scan(&store, "node")
        ),
    );
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(nodes[0]["node"], "gpu-node-050");
    assert_eq!(nodes[0]["n"], 3);
}
