//! Helpers for gputel's end-to-end tests: where the built programs and
//! fixtures are, running the collector and agent as real processes, and
//! asking the real DuckDB CLI about what they wrote.
//!
//! The programs are found next to the test executable (`target/<profile>/`);
//! build them first with `cargo build --workspace` (the project's test command
//! does).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub mod demo;
pub mod s3;

/// The workspace's root directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_owned()
}

/// `tests/fixtures/<name>`.
pub fn fixture(name: &str) -> PathBuf {
    workspace_root().join("tests/fixtures").join(name)
}

/// The directory holding the built programs: the test executable's grandparent.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("test executable lives in target/<profile>/deps")
        .to_owned()
}

fn built(file: &str) -> PathBuf {
    let path = target_dir().join(file);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --workspace` before the tests (scripts/test does)",
        path.display()
    );
    path
}

/// The `gputel-agent` program.
pub fn agent_bin() -> PathBuf {
    built("gputel-agent")
}

/// The `gputel-collector` program.
pub fn collector_bin() -> PathBuf {
    built("gputel-collector")
}

/// The `gputel-loadgen` program (`benches/`).
pub fn loadgen_bin() -> PathBuf {
    built("gputel-loadgen")
}

/// The fake NVML library (`tests/fake-nvml`).
pub fn fake_nvml() -> PathBuf {
    built("libgputel_fake_nvml.so")
}

/// The fake DCGM library (`tests/fake-dcgm`), driven by the same scenario
/// variable as the fake NVML.
pub fn fake_dcgm() -> PathBuf {
    built("libgputel_fake_dcgm.so")
}

/// An agent command on the fake NVML and the fixture trees, as node `node`;
/// the fake's scenario variable is cleared (its built-in eight H100s).
pub fn fixture_agent(node: &str) -> Command {
    let mut cmd = Command::new(agent_bin());
    cmd.arg("--nvml-lib")
        .arg(fake_nvml())
        .arg("--procfs-root")
        .arg(fixture("proc"))
        .arg("--sysfs-root")
        .arg(fixture("sys"))
        .args(["--node", node, "--plaintext"])
        .env_remove(SCENARIO_ENV);
    cmd
}

/// Environment variable naming the fake NVML's scenario file.
pub const SCENARIO_ENV: &str = "GPUTEL_FAKE_NVML_SCENARIO";

/// A child process killed when dropped, so a failing test leaves nothing behind.
#[derive(Debug)]
pub struct Running {
    child: Option<Child>,
    /// stderr lines, as the process writes them.
    stderr: mpsc::Receiver<String>,
    /// Every stderr line seen so far.
    pub log: Vec<String>,
}

impl Running {
    /// Starts `cmd` with stderr piped and read line by line on a thread.
    pub fn spawn(mut cmd: Command) -> Running {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Running {
            child: Some(child),
            stderr: rx,
            log: Vec::new(),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Waits for a collector's "listening on ADDR" log line; returns ADDR.
    pub fn listening_address(&mut self) -> String {
        self.logged_address("listening on ")
    }

    /// Waits for an agent's "metrics listening on ADDR" log line; returns ADDR.
    pub fn metrics_address(&mut self) -> String {
        self.logged_address("metrics listening on ")
    }

    /// Waits for a log line with `prefix` followed by an address; returns it.
    fn logged_address(&mut self, prefix: &str) -> String {
        let line = self.wait_for_log(prefix, Duration::from_secs(30));
        line.split(prefix)
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned()
    }

    /// Reads stderr until a line contains `needle`; returns that line.
    pub fn wait_for_log(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) => {
                    self.log.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no log line with {needle:?} within {timeout:?}; log so far:\n{}",
                    self.log.join("\n")
                ),
            }
        }
    }

    /// Like [`Running::wait_for_log`], but a line already read counts too.
    pub fn find_log(&mut self, needle: &str, timeout: Duration) -> String {
        match self.log.iter().find(|l| l.contains(needle)) {
            Some(line) => line.clone(),
            None => self.wait_for_log(needle, timeout),
        }
    }

    /// Sends SIGTERM and waits for the process to exit; returns its stdout.
    pub fn terminate(self, timeout: Duration) -> Output {
        self.signal("TERM", timeout)
    }

    /// Sends a signal (`"TERM"`, `"KILL"`, …) and waits for the process to exit.
    pub fn signal(self, signal: &str, timeout: Duration) -> Output {
        let child = self.child.as_ref().expect("running");
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
        self.wait(timeout)
    }

    /// Sends a signal (`"HUP"`, …) and leaves the process running.
    pub fn send_signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("running");
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Sends SIGTERM, waits for the process to exit, and returns its stdout
    /// and every stderr line it wrote, to its last.
    pub fn terminate_with_log(mut self, timeout: Duration) -> (Output, Vec<String>) {
        self.send_signal("TERM");
        let out = self.wait_for_exit(timeout);
        (out, std::mem::take(&mut self.log))
    }

    /// Waits for the process to exit by itself; returns its output.
    pub fn wait(mut self, timeout: Duration) -> Output {
        self.wait_for_exit(timeout)
    }

    /// Waits for the process to exit by itself; returns its output and
    /// every stderr line it wrote.
    pub fn wait_with_log(mut self, timeout: Duration) -> (Output, Vec<String>) {
        let out = self.wait_for_exit(timeout);
        (out, std::mem::take(&mut self.log))
    }

    fn wait_for_exit(&mut self, timeout: Duration) -> Output {
        let mut child = self.child.take().expect("running");
        let deadline = std::time::Instant::now() + timeout;
        while child.try_wait().expect("try_wait").is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                self.drain_log();
                panic!(
                    "process did not exit within {timeout:?}; log:\n{}",
                    self.log.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let output = child.wait_with_output().expect("wait_with_output");
        self.drain_log();
        output
    }

    fn drain_log(&mut self) {
        while let Ok(line) = self.stderr.recv_timeout(Duration::from_millis(200)) {
            self.log.push(line);
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The write-ahead log directory the tests give a collector of `store`.
pub fn wal_dir_of(store: &Path) -> PathBuf {
    store.with_extension("wal")
}

/// A collector on `127.0.0.1:0` writing to `store` (its log beside it, see
/// [`wal_dir_of`]); returns it and its address.
pub fn start_collector(store: &Path, extra_args: &[&str]) -> (Running, String) {
    let mut cmd = Command::new(collector_bin());
    cmd.args(["--plaintext", "--listen", "127.0.0.1:0", "--store"])
        .arg(store)
        .arg("--wal-dir")
        .arg(wal_dir_of(store))
        .args(extra_args)
        .env("RUST_LOG", "info");
    let mut collector = Running::spawn(cmd);
    let addr = collector.listening_address();
    (collector, addr)
}

/// The DuckDB CLI: `$GPUTEL_DUCKDB`, else `duckdb` on PATH.
pub fn duckdb_bin() -> PathBuf {
    installed_tool(
        "GPUTEL_DUCKDB",
        "duckdb",
        "-version",
        "the DuckDB CLI",
        "pip install duckdb-cli",
    )
}

/// A test tool that must be there: `$var`, else `command` on PATH; fails
/// the test, naming where `scripts/test` gets it (`source`), when running
/// it with `version_arg` does not succeed.
pub fn installed_tool(
    var: &str,
    command: &str,
    version_arg: &str,
    what: &str,
    source: &str,
) -> PathBuf {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(command));
    let found = Command::new(&path)
        .arg(version_arg)
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{what} ({}) is not installed: scripts/test installs it ({source})",
        path.display()
    );
    path
}

/// A path the test command provides in `$var` (a tool it installed, files it
/// built): under `CI=true` a missing one fails the test; otherwise the test
/// is skipped, saying so and how `scripts/test` provides it (`provided`).
pub fn provided_path(var: &str, provided: &str) -> Option<PathBuf> {
    match std::env::var_os(var) {
        Some(path) => Some(PathBuf::from(path)),
        None if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{var} is not set: {provided}")
        }
        None => {
            eprintln!("skipped: {var} is not set ({provided})");
            None
        }
    }
}

/// Runs a shipped query (`schemas/sql/FILE`) on `store` in the DuckDB CLI,
/// from the repository root as the README runs them (views.sql finds the
/// XID catalogue by its default, relative path): `views.sql`, then `before`
/// (e.g. `SET VARIABLE` lines the query reads), then the file (unless it is
/// views.sql itself), then `after`. Returns the rows as JSON; fails the test
/// on an error or anything on stderr.
pub fn shipped_query(
    store: &Path,
    before: &str,
    file: &str,
    after: &str,
) -> Vec<serde_json::Value> {
    let sql_dir = workspace_root().join("schemas/sql");
    let mut cmd = Command::new(duckdb_bin());
    cmd.current_dir(workspace_root())
        .arg("-json")
        .arg("-c")
        .arg(format!("SET VARIABLE store = '{}'", store.display()))
        .arg("-c")
        .arg(format!(".read {}", sql_dir.join("views.sql").display()));
    if !before.is_empty() {
        cmd.arg("-c").arg(before);
    }
    if file != "views.sql" {
        cmd.arg("-c")
            .arg(format!(".read {}", sql_dir.join(file).display()));
    }
    if !after.is_empty() {
        cmd.arg("-c").arg(after);
    }
    let out = cmd.output().expect("run duckdb");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "duckdb on {file} {before:?} {after:?}: {}\n{stderr}",
        out.status
    );
    let text = String::from_utf8_lossy(&out.stdout);
    if text.trim().is_empty() {
        return Vec::new();
    }
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("duckdb printed {text:?}: {e}"))
}

/// Runs `sql` in DuckDB with `dir` as the working directory and returns the
/// rows as JSON objects.
pub fn duckdb(dir: &Path, sql: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
    let out = Command::new(duckdb_bin())
        .current_dir(dir)
        .args(["-json", "-c", sql])
        .output()
        .expect("run duckdb");
    assert!(
        out.status.success(),
        "duckdb failed on {sql:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    if text.trim().is_empty() {
        return Vec::new();
    }
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("duckdb printed {text:?}: {e}"))
}

/// One value from a one-row, one-column query.
pub fn duckdb_value(dir: &Path, sql: &str) -> serde_json::Value {
    let rows = duckdb(dir, sql);
    assert_eq!(rows.len(), 1, "{sql}: {rows:?}");
    let row = &rows[0];
    assert_eq!(row.len(), 1, "{sql}: {row:?}");
    row.values().next().cloned().expect("one column")
}

/// `read_parquet` over a table of the store, with hive partitions.
pub fn table_scan(store: &Path, table: &str) -> String {
    format!(
        "read_parquet('{}/{table}/**/*.parquet', hive_partitioning = true)",
        store.display()
    )
}

/// Whether each node's gpu rows in `store` are `ticks` ticks `interval_ms`
/// apart, first to last: its agent took every tick. An agent that wakes
/// more than an interval late skips the ticks it missed, as it should, and
/// its sample before the gap then stands for two intervals or more; tests
/// whose expectations count every sample as one interval check this and
/// run their pipeline again on a machine loaded enough for that. The error
/// describes the schedule found.
pub fn gpu_ticks_on_grid(store: &Path, ticks: u64, interval_ms: u64) -> Result<(), String> {
    let rows = duckdb(
        store,
        &format!(
            "SELECT node, count(DISTINCT ts) AS ticks, \
                    (epoch_us(max(ts)) - epoch_us(min(ts))) // 1000 AS span_ms \
             FROM {} GROUP BY node ORDER BY node",
            table_scan(store, "gpu")
        ),
    );
    let span_ms = (ticks - 1) * interval_ms;
    let on_grid = !rows.is_empty()
        && rows
            .iter()
            .all(|r| r["ticks"].as_u64() == Some(ticks) && r["span_ms"].as_u64() == Some(span_ms));
    if on_grid {
        Ok(())
    } else {
        Err(format!(
            "want {ticks} ticks over {span_ms} ms on each node, got {}",
            serde_json::Value::Array(rows.into_iter().map(serde_json::Value::Object).collect())
        ))
    }
}

/// How many times [`taking_every_tick`] runs a pipeline.
const PIPELINE_RUNS: usize = 3;

/// Runs a pipeline (`run`, given the attempt's number) until the store it
/// wrote (`store`) has every agent's every tick ([`gpu_ticks_on_grid`]),
/// at most [`PIPELINE_RUNS`] times; returns what the run that did made.
pub fn taking_every_tick<T>(
    ticks: u64,
    interval_ms: u64,
    mut run: impl FnMut(usize) -> T,
    store: impl Fn(&T) -> PathBuf,
) -> T {
    let mut schedules = Vec::new();
    for attempt in 0..PIPELINE_RUNS {
        let made = run(attempt);
        match gpu_ticks_on_grid(&store(&made), ticks, interval_ms) {
            Ok(()) => return made,
            Err(schedule) => {
                eprintln!("ticks skipped under load, running the pipeline again: {schedule}");
                schedules.push(schedule);
            }
        }
    }
    panic!(
        "in {PIPELINE_RUNS} runs of the pipeline an agent skipped ticks (woke over an interval late): {}",
        schedules.join("; ")
    );
}

/// Prometheus' `promtool`: `$GPUTEL_PROMTOOL`, else `promtool` on PATH.
pub fn promtool_bin() -> PathBuf {
    installed_tool(
        "GPUTEL_PROMTOOL",
        "promtool",
        "--version",
        "promtool",
        "Debian package prometheus",
    )
}

/// Runs `promtool check metrics` on an exposition `text`; returns its lint
/// complaints as (metric, complaint) pairs. Fails the test when promtool
/// cannot parse the text at all.
pub fn promtool_check_metrics(text: &str) -> Vec<(String, String)> {
    use std::io::Write;
    let mut child = Command::new(promtool_bin())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("wait for promtool");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Exit status 0: clean; 3: lint complaints only; anything else: broken.
    assert!(
        matches!(out.status.code(), Some(0 | 3)),
        "promtool check metrics failed ({}): {stderr}",
        out.status
    );
    let complaints: Vec<(String, String)> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (metric, text) = l.split_once(' ').unwrap_or((l, ""));
            (metric.to_owned(), text.to_owned())
        })
        .collect();
    assert_eq!(
        out.status.code() == Some(3),
        !complaints.is_empty(),
        "promtool's status {} does not match its output: {stderr}",
        out.status
    );
    complaints
}

/// Asserts that the `gpu` table of `store` holds exactly `rows` rows and no
/// (node, gpu, ts) twice: nothing lost, nothing doubled.
pub fn assert_gpu_rows_exactly_once(dir: &Path, store: &Path, rows: u64) {
    let scan = table_scan(store, "gpu");
    assert_eq!(
        duckdb_value(dir, &format!("select count(*) from {scan}")),
        serde_json::json!(rows),
        "rows in {scan}"
    );
    assert_eq!(
        duckdb_value(
            dir,
            &format!("select count(*) from (select distinct node, gpu, ts from {scan})")
        ),
        serde_json::json!(rows),
        "distinct (node, gpu, ts) in {scan}"
    );
}

/// A collector on `127.0.0.1:port` writing to `store`, its log beside it,
/// flushing every `flush_interval`; for tests that restart it on one port.
pub fn collector_on(port: u16, store: &Path, flush_interval: &str) -> Running {
    let mut cmd = Command::new(collector_bin());
    cmd.args([
        "--plaintext",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--store",
    ])
    .arg(store)
    .arg("--wal-dir")
    .arg(wal_dir_of(store))
    .args(["--flush-interval", flush_interval]);
    let mut collector = Running::spawn(cmd);
    collector.wait_for_log("listening on ", Duration::from_secs(30));
    collector
}

/// The value of `key` in a summary line of `key=value` words (what the
/// agent and the load generator print at exit).
pub fn summary_field<'a>(summary: &'a str, key: &str) -> &'a str {
    summary
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {summary:?}"))
}

/// Runs `gputel-loadgen` against the collector at `addr`, giving up after
/// `timeout`; asserts that it succeeded and returns its summary line.
pub fn run_loadgen(addr: &str, timeout: &str, args: &[&str]) -> String {
    let out = Command::new(loadgen_bin())
        .args([
            "--collector",
            &format!("http://{addr}"),
            "--timeout",
            timeout,
        ])
        .args(args)
        .output()
        .expect("run gputel-loadgen");
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        out.status.success(),
        "gputel-loadgen {args:?} failed ({}): {stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A port on 127.0.0.1 that nothing listens on (free when this returns).
pub fn unused_port() -> u16 {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    probe.local_addr().expect("local addr").port()
}

/// Runs the fixture agent (node `gpu-node-017`, the fake NVML with
/// `scenario`) for `ticks` ticks of 100 ms against a collector writing to
/// `<dir>/store`, then stops the collector; returns the store.
pub fn run_scenario_pipeline(
    dir: &Path,
    scenario: &str,
    ticks: u64,
    agent_args: &[&str],
) -> PathBuf {
    let store = dir.join("store");
    let path = dir.join("scenario.toml");
    std::fs::write(&path, scenario).expect("write scenario");
    let (collector, addr) = start_collector(&store, &["--flush-interval", "1s"]);
    let mut agent = fixture_agent("gpu-node-017");
    agent
        .args(["--collector", &format!("http://{addr}")])
        .args(["--interval", "100ms", "--ticks", &ticks.to_string()])
        .args(agent_args)
        .env(SCENARIO_ENV, &path);
    let agent = Running::spawn(agent).wait(Duration::from_secs(60));
    assert!(
        agent.status.success(),
        "agent failed: {}",
        String::from_utf8_lossy(&agent.stdout)
    );
    assert!(
        collector
            .terminate(Duration::from_secs(30))
            .status
            .success(),
        "collector failed"
    );
    store
}

/// Prometheus' Alertmanager: `$GPUTEL_ALERTMANAGER` (scripts/test installs
/// it). Under `CI=true` a missing one fails the test; otherwise the test is
/// skipped with a printed reason (None).
pub fn alertmanager_bin() -> Option<PathBuf> {
    provided_path(
        "GPUTEL_ALERTMANAGER",
        "scripts/test installs Alertmanager (Debian package prometheus-alertmanager) and sets it",
    )
}

/// Prometheus' node_exporter: `$GPUTEL_NODE_EXPORTER` (scripts/test installs
/// it). Under `CI=true` a missing one fails the test; otherwise the test is
/// skipped with a printed reason (None).
pub fn node_exporter_bin() -> Option<PathBuf> {
    provided_path(
        "GPUTEL_NODE_EXPORTER",
        "scripts/test installs node_exporter (Debian package prometheus-node-exporter) and sets it",
    )
}

/// A real Alertmanager on a free loopback port, clustering off, routing
/// every alert to a receiver that drops it; killed when dropped.
#[derive(Debug)]
pub struct Alertmanager {
    _process: Running,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    addr: String,
}

impl Alertmanager {
    /// Starts one with its storage and configuration under `dir`, and waits
    /// until `/-/ready` answers; None when the test is to be skipped.
    pub fn start(dir: &Path) -> Option<Alertmanager> {
        Self::start_with_config(
            dir,
            "route:\n  receiver: drop\n  group_wait: 1s\nreceivers:\n  - name: drop\n",
        )
    }

    /// Like [`Alertmanager::start`], with `yaml` as its alertmanager.yml
    /// (routes and receivers of the test's own).
    pub fn start_with_config(dir: &Path, yaml: &str) -> Option<Alertmanager> {
        let bin = alertmanager_bin()?;
        let config = dir.join("alertmanager.yml");
        std::fs::write(&config, yaml).expect("write alertmanager.yml");
        let port = unused_port();
        let addr = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(&bin);
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.path={}", dir.join("am-data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--cluster.listen-address=");
        let process = Running::spawn(cmd);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while http_get(&addr, "/-/ready").is_none_or(|(status, _)| status != 200) {
            assert!(
                std::time::Instant::now() < deadline,
                "Alertmanager ({}) not ready on {addr} within 30 s",
                bin.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(Alertmanager {
            _process: process,
            url: format!("http://{addr}"),
            addr,
        })
    }

    /// Its active alerts (`GET /api/v2/alerts`; resolved ones are not listed).
    pub fn alerts(&self) -> Vec<serde_json::Value> {
        let (status, body) = http_get(&self.addr, "/api/v2/alerts").expect("Alertmanager answers");
        assert_eq!(status, 200, "GET /api/v2/alerts: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("alerts {body:?}: {e}"))
    }

    /// Its active alerts named `alertname`.
    pub fn alerts_named(&self, alertname: &str) -> Vec<serde_json::Value> {
        self.alerts()
            .into_iter()
            .filter(|a| a["labels"]["alertname"] == alertname)
            .collect()
    }

    /// Polls its alerts until `done` holds for them (at most `timeout`);
    /// returns them.
    pub fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let alerts = self.alerts();
            if done(&alerts) {
                return alerts;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "Alertmanager: no {what} within {timeout:?}; its alerts: {alerts:#?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// One request an [`HttpRecorder`] received.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    /// E.g. `POST /hook HTTP/1.1`.
    pub request_line: String,
    /// The body, of its Content-Length; "body not read: …" when it could not
    /// be.
    pub body: Vec<u8>,
}

impl HttpRequest {
    /// The request target: path and query, as sent.
    pub fn target(&self) -> &str {
        self.request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
    }

    /// The body as JSON; a body that is not JSON is a string, to fail the
    /// test that expects otherwise.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(&self.body).into_owned())
        })
    }
}

/// A plain HTTP/1.1 server on a free loopback port, on a thread of its own,
/// standing in for a peer (a webhook receiver, an API server): it answers
/// every request with 200 and one fixed JSON body, and records it.
#[derive(Debug)]
pub struct HttpRecorder {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    received: std::sync::Arc<std::sync::Mutex<Vec<HttpRequest>>>,
}

impl HttpRecorder {
    pub fn start(response: &'static str) -> HttpRecorder {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("local address"));
        let received: std::sync::Arc<std::sync::Mutex<Vec<HttpRequest>>> =
            std::sync::Arc::default();
        let seen = std::sync::Arc::clone(&received);
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let request = answer(stream, response);
                seen.lock().expect("not poisoned").push(request);
            }
        });
        HttpRecorder { url, received }
    }

    /// Every request so far, in order.
    pub fn received(&self) -> Vec<HttpRequest> {
        self.received.lock().expect("not poisoned").clone()
    }
}

/// Reads one HTTP/1.1 request (a body of Content-Length bytes), answers
/// `response` with 200 and closes.
fn answer(stream: std::net::TcpStream, response: &str) -> HttpRequest {
    use std::io::{Read, Write};
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut reader = BufReader::new(stream.try_clone().expect("clone the stream"));
    let mut request_line = String::new();
    let _ = reader.read_line(&mut request_line);
    let mut length = 0;
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) if line == "\r\n" => break,
            Ok(_) => {
                if let Some((name, value)) = line.split_once(':')
                    && name.trim().eq_ignore_ascii_case("content-length")
                {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
    }
    let mut body = vec![0; length];
    if let Err(e) = reader.read_exact(&mut body) {
        body = format!("body not read: {e}").into_bytes();
    }
    let mut stream = stream;
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{response}",
        response.len()
    );
    HttpRequest {
        request_line: request_line.trim_end().to_owned(),
        body,
    }
}

/// A plain HTTP/1.1 GET on loopback: the status and the body; None when
/// nothing answers.
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let split = response.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&response[..split]).to_ascii_lowercase();
    let body = &response[split + 4..];
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_vec()
    };
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}

/// The body of a chunked HTTP/1.1 response.
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = body.windows(2).position(|w| w == b"\r\n") {
        let size = String::from_utf8_lossy(&body[..eol]);
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        let rest = &body[eol + 2..];
        if size == 0 || rest.len() < size {
            break;
        }
        out.extend_from_slice(&rest[..size]);
        body = rest[size..].strip_prefix(b"\r\n").unwrap_or(&rest[size..]);
    }
    out
}

/// The scheduler job trace the characterization store imports, in this
/// order: an Acme-format dump (job types spelt as the AcmeTrace files spell
/// them: `Eval`), then two overlapping sacct dumps. Job 7171 is RUNNING in
/// the Acme dump and in the first sacct dump, COMPLETED in the last; 9999
/// is in none. `(format, text)` pairs for `gputel-collector import-jobs`.
pub const TRACE_IMPORTS: &[(&str, &str)] = &[
    (
        "acme",
        "job_id,user,node_num,gpu_num,cpu_num,type,state,submit_time,start_time,end_time,duration,queue,gpu_time
4242,alice,2,3,96,Pretrain,COMPLETED,2026-11-02 08:00:00,2026-11-02 08:05:00,2026-11-02 10:05:00,7200,300,21600.0
5151,bob,1,1,16,Eval,FAILED,2026-11-02 09:00:00,2026-11-02 09:00:10,2026-11-02 09:10:10,600,10,600.0
7171,alice,1,1,16,SFT,RUNNING,2026-11-02 09:30:00,2026-11-02 09:30:05,,,5,
8080,carol,1,1,8,Debug,CANCELLED,2026-11-02 10:00:00,2026-11-02 10:00:01,2026-11-02 10:20:01,1200,1,1200.0
",
    ),
    (
        "sacct",
        "JobID|User|Partition|State|Submit|Start|End|NNodes|AllocTRES|NodeList
7171|alice|gpu|RUNNING|2026-11-02T09:30:00|2026-11-02T09:30:05|Unknown|1|billing=2,cpu=16,gres/gpu=1,mem=64G,node=1|gpu-node-001
",
    ),
    (
        "sacct",
        "JobID|User|Partition|State|Submit|Start|End|NNodes|AllocTRES|NodeList
7171|alice|gpu|COMPLETED|2026-11-02T09:30:00|2026-11-02T09:30:05|2026-11-02T11:30:05|1|billing=2,cpu=16,gres/gpu=1,mem=64G,node=1|gpu-node-001
",
    ),
];
