//! What `systemd/` ships: the example configurations load with the
//! programs' own parsers, `systemd-analyze verify` accepts both units without
//! a word, their hardening keeps a low exposure score, and the sysusers and
//! tmpfiles snippets make the user and directories the units expect.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gputel_tests::{agent_bin, collector_bin, installed_tool, workspace_root};

/// `systemd-analyze`: `$GPUTEL_SYSTEMD_ANALYZE`, else the one on PATH.
fn systemd_analyze() -> PathBuf {
    installed_tool(
        "GPUTEL_SYSTEMD_ANALYZE",
        "systemd-analyze",
        "--version",
        "systemd-analyze",
        "Debian package systemd",
    )
}

/// The unit files, as `(name, text)`.
fn units() -> Vec<(&'static str, String)> {
    ["gputel-agent.service", "gputel-collector.service"]
        .into_iter()
        .map(|name| {
            let text = std::fs::read_to_string(workspace_root().join("systemd").join(name))
                .unwrap_or_else(|e| panic!("read systemd/{name}: {e}"));
            (name, text)
        })
        .collect()
}

/// Copies the units into `dir` with `ExecStart=` pointing at the programs
/// just built: verify checks that the binary exists and is executable, and
/// nothing is installed in /usr/bin here.
fn units_with_built_programs(dir: &Path) -> Vec<PathBuf> {
    units()
        .into_iter()
        .map(|(name, text)| {
            let (program, built) = if name.starts_with("gputel-agent") {
                ("/usr/bin/gputel-agent", agent_bin())
            } else {
                ("/usr/bin/gputel-collector", collector_bin())
            };
            let exec_start = format!("ExecStart={program} --config /etc/gputel/");
            assert_eq!(
                text.lines().filter(|l| l.starts_with(&exec_start)).count(),
                1,
                "{name} has one {exec_start}… line"
            );
            let path = dir.join(name);
            let rewritten = text.replace(
                &format!("ExecStart={program} "),
                &format!("ExecStart={} ", built.display()),
            );
            std::fs::write(&path, rewritten).expect("write the unit");
            path
        })
        .collect()
}

fn text_of(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn systemd_analyze_verify_accepts_both_units_without_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let units = units_with_built_programs(dir.path());
    let out = Command::new(systemd_analyze())
        .arg("verify")
        .args(&units)
        .output()
        .unwrap();
    // verify exits 0 after warnings such as an unknown key, so any output fails.
    let said = text_of(&out);
    assert!(out.status.success() && said.is_empty(), "{said}");

    // And it does speak up for a mistake, so the silence above means something.
    let agent = std::fs::read_to_string(&units[0]).unwrap();
    std::fs::write(&units[0], agent.replace("WatchdogSec=", "WatchdogSecs=")).unwrap();
    let out = Command::new(systemd_analyze())
        .arg("verify")
        .arg(&units[0])
        .output()
        .unwrap();
    assert!(
        text_of(&out).contains("Unknown key 'WatchdogSecs'"),
        "{}",
        text_of(&out)
    );
}

#[test]
fn the_units_are_notify_services_with_a_watchdog_as_a_dedicated_user() {
    for (name, text) in units() {
        let lines: Vec<&str> = text.lines().collect();
        for expected in [
            "Type=notify",
            "NotifyAccess=main",
            "WatchdogSec=30s",
            "Restart=on-failure",
            "User=gputel",
            "StateDirectory=gputel",
            "ConfigurationDirectory=gputel",
            "ProtectSystem=strict",
            "ProtectHome=yes",
            "PrivateTmp=yes",
            "NoNewPrivileges=yes",
        ] {
            assert!(lines.contains(&expected), "{name} lacks {expected}");
        }
    }
}

/// The exposure score `systemd-analyze security` gives a unit, ×10 (its
/// `--threshold` scale): 0 is fully locked down, 100 is root with everything.
fn exposure_at_most(unit: &Path, threshold: u32) -> Output {
    Command::new(systemd_analyze())
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(format!("--threshold={threshold}"))
        .arg(unit)
        .output()
        .expect("run systemd-analyze security")
}

#[test]
fn the_units_hardening_keeps_their_exposure_low() {
    let dir = tempfile::tempdir().unwrap();
    let units = units_with_built_programs(dir.path());
    // The agent keeps CAP_DAC_READ_SEARCH and CAP_SYS_PTRACE (job attribution
    // from other users' /proc/<pid>/environ) and the NVIDIA devices; the
    // collector needs no capability and no device at all.
    for (unit, threshold) in [(&units[0], 30), (&units[1], 20)] {
        let out = exposure_at_most(unit, threshold);
        let said = text_of(&out);
        assert!(
            out.status.success(),
            "{}: exposure over {threshold}:\n{said}",
            unit.display()
        );
        assert!(said.contains("Overall exposure level"), "{said}");
    }
    // Without the hardening the same check fails.
    let bare: String = std::fs::read_to_string(&units[1])
        .unwrap()
        .lines()
        .filter(|l| {
            !l.starts_with("Protect") && !l.starts_with("Private") && !l.starts_with("Restrict")
        })
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&units[1], bare).unwrap();
    assert!(!exposure_at_most(&units[1], 20).status.success());
}

/// Runs a systemd tool on a root directory of the test's own.
fn run_in_root(tool: &str, root: &Path, args: &[&str]) {
    let out = Command::new(tool)
        .arg(format!("--root={}", root.display()))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {tool} (Debian package systemd): {e}"));
    assert!(out.status.success(), "{tool}: {}", text_of(&out));
}

#[test]
fn sysusers_and_tmpfiles_snippets_make_the_user_and_directories() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let systemd = workspace_root().join("systemd");
    for dir in ["etc", "usr/lib/sysusers.d", "usr/lib/tmpfiles.d"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    // Installed as the packages install them, both at once.
    for package in ["gputel-agent", "gputel-collector"] {
        std::fs::copy(
            systemd.join(format!("{package}.sysusers")),
            root.join(format!("usr/lib/sysusers.d/{package}.conf")),
        )
        .unwrap();
        std::fs::copy(
            systemd.join(format!("{package}.tmpfile")),
            root.join(format!("usr/lib/tmpfiles.d/{package}.conf")),
        )
        .unwrap();
    }
    run_in_root("systemd-sysusers", root, &[]);
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    let user: Vec<&str> = passwd
        .lines()
        .find(|l| l.starts_with("gputel:"))
        .unwrap_or_else(|| panic!("no user gputel in {passwd}"))
        .split(':')
        .collect();
    assert_eq!(
        user[4..],
        ["gputel telemetry", "/var/lib/gputel", "/usr/sbin/nologin"]
    );
    let uid: u32 = user[2].parse().unwrap();
    assert!(uid < 1000, "a system user: {uid}");
    let group = std::fs::read_to_string(root.join("etc/group")).unwrap();
    assert!(
        group
            .lines()
            .any(|l| l.starts_with(&format!("gputel:x:{}:", user[3]))),
        "{group}"
    );

    // Giving files to another user takes root; the packages' postinst runs as root.
    let probe = root.join("probe");
    std::fs::write(&probe, "").unwrap();
    if std::fs::metadata(&probe).unwrap().uid() != 0 {
        eprintln!(
            "not root: systemd-tmpfiles cannot chown, so the tmpfiles snippets are not applied"
        );
        return;
    }
    run_in_root("systemd-tmpfiles", root, &["--create"]);
    for (dir, owner) in [("var/lib/gputel", uid), ("etc/gputel/tls", 0)] {
        let meta = std::fs::metadata(root.join(dir)).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o750, "{dir}");
        assert_eq!(meta.uid(), owner, "{dir}");
        assert_eq!(meta.gid().to_string(), user[3], "{dir}");
    }
}

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
    // The example states the default flush interval; another value in its
    // place shows that the file's settings are the ones taken.
    assert!(text.contains("\nflush-interval = \"10s\"\n"), "{text}");
    std::fs::write(
        &config,
        text.replace(
            "\nflush-interval = \"10s\"\n",
            "\nflush-interval = \"7s\"\n",
        ),
    )
    .unwrap();
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
            .any(|l| l.contains("loaded 8 alert rules")),
        "{:#?}",
        collector.log
    );
    assert!(line.contains("flush_interval=7s"), "{line}");
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
