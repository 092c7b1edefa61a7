//! The example configuration files shipped for systemd load as they are.

use std::process::Command;

use gputel_tests::{agent_bin, collector_bin, workspace_root};

#[test]
fn the_example_agent_config_loads() {
    // --once reads the config like a service start does; the collector is not contacted.
    let out = Command::new(agent_bin())
        .arg("--config")
        .arg(workspace_root().join("systemd/agent.toml"))
        .args(["--once", "--node", "example", "--interval", "10ms"])
        .args(["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snap: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(snap["node"], "example");
}

#[test]
fn the_example_collector_config_is_valid_and_bad_keys_are_named() {
    let dir = tempfile::tempdir().unwrap();
    // The example listens on 7117 and writes under /var/lib; override those to
    // start it here, and stop it at once: the file itself must parse.
    let text = std::fs::read_to_string(workspace_root().join("systemd/collector.toml")).unwrap();
    let config = dir.path().join("collector.toml");
    std::fs::write(&config, &text).unwrap();
    let mut cmd = Command::new(collector_bin());
    cmd.arg("--config")
        .arg(&config)
        .args(["--plaintext", "--listen", "127.0.0.1:0", "--store"])
        .arg(dir.path().join("store"))
        .arg("--wal-dir")
        .arg(dir.path().join("wal"))
        .arg("--rules")
        .arg(workspace_root().join("systemd/alerts.toml"));
    let mut collector = gputel_tests::Running::spawn(cmd);
    let line = collector.wait_for_log("listening on ", std::time::Duration::from_secs(30));
    assert!(
        collector
            .log
            .iter()
            .any(|l| l.contains("loaded 7 alert rules")),
        "{:#?}",
        collector.log
    );
    assert!(line.contains("flush_interval=60s"), "{line}");
    let stopped = collector.terminate(std::time::Duration::from_secs(30));
    assert!(stopped.status.success());

    std::fs::write(&config, format!("{text}\nflush_interval = \"1s\"\n")).unwrap();
    let out = Command::new(collector_bin())
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown field `flush_interval`"), "{err}");
    assert!(err.contains("collector.toml is invalid"), "{err}");
}
