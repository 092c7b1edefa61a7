//! `scripts/run-local` owns what it starts: a closed terminal (SIGHUP),
//! Ctrl-C (SIGINT, also when it was started in the background of a script)
//! and SIGTERM stop the agent first, so that it delivers what it sampled,
//! then the simulation and the collector, and leave no process behind; a
//! second run-local while one runs says so in one line and leaves the first
//! alone; a taken port is one line. Each run uses the programs already built
//! (`GPUTEL_BIN_DIR`), its own port and its own directories.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gputel_tests::{Running, collector_bin, duckdb_bin, target_dir, unused_port, workspace_root};

/// run-local's settings for a run on `port` with every directory under
/// `dir`, with the programs already built.
fn settings(dir: &Path, port: u16) -> Vec<(&'static str, OsString)> {
    vec![
        ("GPUTEL_BIN_DIR", target_dir().into()),
        ("GPUTEL_STORE", dir.join("store").into()),
        ("GPUTEL_WAL", dir.join("wal").into()),
        ("GPUTEL_RUN_DIR", dir.join("run").into()),
        ("GPUTEL_LISTEN", format!("127.0.0.1:{port}").into()),
        ("GPUTEL_FLUSH", "1s".into()),
        ("GPUTEL_FAKE_GPUS", "1".into()),
        ("GPUTEL_DUCKDB", duckdb_bin().into()),
    ]
}

/// A run-local command (see [`settings`]) leading a process group of its
/// own, as a terminal's job does: with SIGHUP at its default, even when the
/// suite itself runs under `nohup`.
fn run_local(dir: &Path, port: u16) -> Command {
    let mut cmd = Command::new("env");
    cmd.arg("--default-signal=HUP")
        .arg(workspace_root().join("scripts/run-local"))
        .envs(settings(dir, port))
        .process_group(0);
    cmd
}

/// The processes whose command line names `dir`: everything a run-local
/// under it started (its programs, their log tees, an import).
fn processes_of(dir: &Path) -> Vec<(u32, String)> {
    let needle = dir.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("list /proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // A process may end while it is read: then it is not there.
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = raw
            .split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.iter().any(|a| a.contains(&needle)) {
            found.push((pid, args.join(" ")));
        }
    }
    found
}

/// The gputel programs among `processes`, by name.
fn programs(processes: &[(u32, String)]) -> Vec<String> {
    let mut names: Vec<String> = processes
        .iter()
        .filter_map(|(_, cmdline)| {
            let program = cmdline.split(' ').next()?;
            let name = Path::new(program).file_name()?.to_str()?;
            name.starts_with("gputel-").then(|| name.to_owned())
        })
        .collect();
    names.sort();
    names
}

/// Waits until nothing under `dir` runs any more; returns what still does.
fn wait_until_gone(dir: &Path, timeout: Duration) -> Vec<(u32, String)> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = processes_of(dir);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Kills whatever a failed test left running under its directory.
struct Leftovers(PathBuf);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for (pid, _) in processes_of(&self.0) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

fn signal_group(leader: u32, signal: &str) {
    let status = Command::new("kill")
        .args(["-s", signal, "--", &format!("-{leader}")])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -s {signal} -{leader} failed");
}

/// The RFC 3339 time a log line starts with, for ordering lines of two logs.
fn line_time<'a>(log: &'a str, needle: &str) -> &'a str {
    let line = log
        .lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no {needle:?} in\n{log}"));
    line.split_whitespace().next().expect("a timestamp")
}

/// What a clean stop leaves in the logs: the agent delivered everything it
/// sampled and stopped before the collector began its last write.
fn assert_stopped_in_order(run: &Path) {
    let agent = std::fs::read_to_string(run.join("agent.log")).expect("agent.log");
    let collector = std::fs::read_to_string(run.join("collector.log")).expect("collector.log");
    let stopped = agent
        .lines()
        .find(|l| l.contains("gputel_agent: stopped: ticks="))
        .unwrap_or_else(|| panic!("the agent did not stop cleanly:\n{agent}"));
    assert!(stopped.contains(" unacknowledged=0 "), "{stopped}");
    assert!(!stopped.contains("ticks=0 "), "{stopped}");
    assert!(
        line_time(&agent, "gputel_agent: stopped: ticks=")
            <= line_time(&collector, "shutting down: writing buffered rows"),
        "the collector began to stop before the agent had:\n{agent}\n{collector}"
    );
    assert!(
        collector.contains("gputel_collector: stopped"),
        "{collector}"
    );
}

/// Starts run-local and waits until its agent has delivered a batch that
/// the collector wrote; returns it and the gputel programs it runs.
fn start(dir: &Path, port: u16) -> Running {
    let mut script = Running::spawn(run_local(dir, port));
    script.wait_for_log("gputel_agent::client: connected", Duration::from_secs(60));
    script.wait_for_log("gputel_collector::flush: flushed", Duration::from_secs(60));
    assert_eq!(
        programs(&processes_of(dir)),
        ["gputel-agent", "gputel-collector", "gputel-demo"],
        "{:?}",
        processes_of(dir)
    );
    script
}

/// SIGHUP (a closed terminal) or SIGTERM to run-local's process group.
fn stops_cleanly_on(signal: &str) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let _leftovers = Leftovers(tmp.path().to_owned());
    let script = start(tmp.path(), unused_port());
    signal_group(script.pid(), signal);
    let (out, log) = script.wait_with_log(Duration::from_secs(60));
    assert!(out.status.success(), "{}: {}", out.status, log.join("\n"));
    assert!(
        log.iter().any(|l| l.contains("stopped; the data is in")),
        "{}",
        log.join("\n")
    );
    let left = wait_until_gone(tmp.path(), Duration::from_secs(10));
    assert!(left.is_empty(), "left running after SIG{signal}: {left:?}");
    assert_stopped_in_order(&tmp.path().join("run"));
}

#[test]
fn a_closed_terminal_stops_everything_agent_first() {
    stops_cleanly_on("HUP");
}

#[test]
fn sigterm_stops_everything_agent_first() {
    stops_cleanly_on("TERM");
}

/// A script that starts run-local with `&` and waits: its job inherits
/// SIGINT ignored, and Ctrl-C (SIGINT to the script's process group) must
/// still stop it.
#[test]
fn ctrl_c_stops_a_run_local_started_in_the_background_of_a_script() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let _leftovers = Leftovers(tmp.path().to_owned());
    let script = workspace_root().join("scripts/run-local");
    let mut shell = Command::new("bash");
    shell
        .arg("-c")
        .arg(format!("'{}' & wait", script.display()))
        .envs(settings(tmp.path(), unused_port()))
        .process_group(0);
    let mut shell = Running::spawn(shell);
    shell.wait_for_log("gputel_collector::flush: flushed", Duration::from_secs(60));
    assert_eq!(
        programs(&processes_of(tmp.path())),
        ["gputel-agent", "gputel-collector", "gputel-demo"]
    );
    signal_group(shell.pid(), "INT");
    let left = wait_until_gone(tmp.path(), Duration::from_secs(60));
    assert!(left.is_empty(), "left running after Ctrl-C: {left:?}");
    assert_stopped_in_order(&tmp.path().join("run"));
}

#[test]
fn a_second_run_local_says_so_and_leaves_the_first_alone() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let _leftovers = Leftovers(tmp.path().to_owned());
    let port = unused_port();
    let first = start(tmp.path(), port);
    let before = processes_of(tmp.path());

    let second = run_local(tmp.path(), port)
        .stdin(Stdio::null())
        .output()
        .expect("run a second run-local");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{stderr}");
    let run = tmp.path().join("run");
    assert_eq!(
        stderr,
        format!(
            "error: gputel is already running from {} (scripts/run-local, pid {}, collector on 127.0.0.1:{port}); \
             stop it first: Ctrl-C where it runs, or kill {}\n",
            run.display(),
            first.pid(),
            first.pid()
        )
    );
    // The first goes on with the same processes, and stops as usual.
    assert_eq!(processes_of(tmp.path()), before);
    signal_group(first.pid(), "TERM");
    let (out, log) = first.wait_with_log(Duration::from_secs(60));
    assert!(out.status.success(), "{}", log.join("\n"));
    assert!(wait_until_gone(tmp.path(), Duration::from_secs(10)).is_empty());
    assert_stopped_in_order(&run);
}

#[test]
fn a_taken_port_is_one_line() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let _leftovers = Leftovers(tmp.path().to_owned());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("address").port();

    let out = run_local(tmp.path(), port)
        .stdin(Stdio::null())
        .output()
        .expect("run run-local");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "error: 127.0.0.1:{port} is in use by another program (an earlier gputel-collector?); \
             stop it, or choose another address: GPUTEL_LISTEN=127.0.0.1:7118 scripts/run-local\n"
        )
    );
    assert!(processes_of(tmp.path()).is_empty());

    // The collector itself says it in one line too, whatever RUST_BACKTRACE says.
    let out = Command::new(collector_bin())
        .args([
            "--plaintext",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--store",
        ])
        .arg(tmp.path().join("store"))
        .arg("--wal-dir")
        .arg(tmp.path().join("wal"))
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run gputel-collector");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let in_use = std::net::TcpListener::bind(("127.0.0.1", port)).expect_err("the port is taken");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.contains(" WARN ")).collect();
    assert_eq!(
        lines,
        [format!(
            "gputel-collector: cannot listen on 127.0.0.1:{port}: {in_use}"
        )],
        "{stderr}"
    );
}

/// A script killed with SIGKILL cannot stop its programs; the next
/// run-local finds them by the lock they still hold, names them, and starts
/// nothing.
#[test]
fn the_programs_of_a_killed_run_local_are_named_by_the_next() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let _leftovers = Leftovers(tmp.path().to_owned());
    let port = unused_port();
    // Its programs will outlive it, holding its output open: no pipes here.
    let mut script = run_local(tmp.path(), port)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start run-local");
    let collector_log = tmp.path().join("run/collector.log");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&collector_log).is_ok_and(|log| log.contains("flushed")) {
        assert!(Instant::now() < deadline, "the collector never flushed");
        std::thread::sleep(Duration::from_millis(100));
    }
    script.kill().expect("SIGKILL run-local");
    script.wait().expect("reap run-local");
    let mut orphans: Vec<u32> = processes_of(tmp.path())
        .into_iter()
        .filter(|(_, cmdline)| cmdline.contains("/gputel-"))
        .map(|(pid, _)| pid)
        .collect();
    orphans.sort_unstable();
    assert_eq!(orphans.len(), 3, "{:?}", processes_of(tmp.path()));

    let next = run_local(tmp.path(), port)
        .stdin(Stdio::null())
        .output()
        .expect("run run-local again");
    let stderr = String::from_utf8_lossy(&next.stderr);
    assert_eq!(next.status.code(), Some(1), "{stderr}");
    let prefix = format!(
        "error: programs of an earlier scripts/run-local still run from {} (the script, pid {}, is gone); stop them first: kill ",
        tmp.path().join("run").display(),
        script.id()
    );
    let named = stderr
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix('\n'))
        .unwrap_or_else(|| panic!("{stderr:?}"));
    let mut named: Vec<u32> = named
        .split(' ')
        .map(|pid| pid.parse().expect("a pid"))
        .collect();
    named.sort_unstable();
    assert_eq!(named, orphans);

    // As the line says: kill them, and nothing is left.
    for pid in &named {
        let _ = Command::new("kill").arg(pid.to_string()).status();
    }
    let left = wait_until_gone(tmp.path(), Duration::from_secs(30));
    assert!(left.is_empty(), "{left:?}");
}
