//! systemd's notification protocol, spoken by the real programs to a socket
//! of the test's own (as systemd would see it with `Type=notify` and
//! `WatchdogSec=`): READY=1 with a status once they work, WATCHDOG=1 again
//! and again while their loops make progress, none once the sampler hangs,
//! and STOPPING=1 at SIGTERM.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gputel_tests::{Running, SCENARIO_ENV, collector_bin, fixture_agent, unused_port, wal_dir_of};

/// The watchdog timeout given to the programs: they pet every half of it.
const WATCHDOG: Duration = Duration::from_secs(1);
/// Generous bound for anything the tests wait for, on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(30);

/// The socket systemd would listen on, at `NOTIFY_SOCKET`.
struct NotifySocket {
    socket: UnixDatagram,
    /// Every datagram received so far.
    seen: Vec<String>,
}

impl NotifySocket {
    fn bind(dir: &Path) -> (NotifySocket, std::path::PathBuf) {
        let path = dir.join("notify.sock");
        let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
        let socket = NotifySocket {
            socket,
            seen: Vec::new(),
        };
        (socket, path)
    }

    /// The next datagram within `timeout`, or `None`.
    fn next(&mut self, timeout: Duration) -> Option<String> {
        self.socket
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))
            .expect("set_read_timeout");
        let mut buf = [0u8; 4096];
        match self.socket.recv(&mut buf) {
            Ok(n) => {
                let message = String::from_utf8_lossy(&buf[..n]).into_owned();
                self.seen.push(message.clone());
                Some(message)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => panic!("reading the notify socket: {e}"),
        }
    }

    /// Reads datagrams until one has the line `line`; returns that datagram.
    fn wait_for(&mut self, line: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left) {
                Some(message) if message.lines().any(|l| l == line) => return message,
                Some(_) => {}
                None => panic!("no {line:?} within {PATIENCE:?}; received: {:?}", self.seen),
            }
        }
    }

    /// Whatever is queued now, without waiting.
    fn drain(&mut self) -> Vec<String> {
        std::iter::from_fn(|| self.next(Duration::from_millis(1))).collect()
    }
}

/// Sets what systemd sets for a `Type=notify` service with `WatchdogSec=`.
/// `WATCHDOG_PID` is left unset: the child's pid is not known before it
/// starts, and unset means "this process".
fn under_systemd(cmd: &mut Command, socket: &Path) {
    cmd.env("NOTIFY_SOCKET", socket)
        .env("WATCHDOG_USEC", WATCHDOG.as_micros().to_string())
        .env_remove("WATCHDOG_PID");
}

fn status_of(message: &str) -> &str {
    message
        .lines()
        .find_map(|l| l.strip_prefix("STATUS="))
        .unwrap_or_else(|| panic!("no STATUS= in {message:?}"))
}

fn agent_command(dir: &Path, socket: &Path) -> (Command, String) {
    let collector = format!("http://127.0.0.1:{}", unused_port());
    let mut cmd = fixture_agent("notify-node");
    cmd.args(["--collector", &collector])
        .args(["--interval", "100ms", "--drain-timeout", "100ms"])
        .arg("--spool-dir")
        .arg(dir.join("spool"));
    under_systemd(&mut cmd, socket);
    (cmd, collector)
}

#[test]
fn the_agent_is_ready_pets_the_watchdog_and_says_when_it_stops() {
    let dir = tempfile::tempdir().unwrap();
    let (mut notify, socket) = NotifySocket::bind(dir.path());
    // No collector listens: the agent works (it spools) and is ready anyway.
    let (cmd, collector) = agent_command(dir.path(), &socket);
    let mut agent = Running::spawn(cmd);

    let ready = notify.wait_for("READY=1");
    assert_eq!(
        status_of(&ready),
        format!("sampling 8 GPUs and the host every 100ms; delivering to {collector}")
    );
    for _ in 0..3 {
        notify.wait_for("WATCHDOG=1");
    }
    agent.wait_for_log("petting the systemd watchdog", PATIENCE);

    let out = agent.terminate(PATIENCE);
    assert!(out.status.success(), "{out:?}");
    let after: Vec<String> = notify.drain();
    let stopping = after
        .iter()
        .find(|m| m.lines().any(|l| l == "STOPPING=1"))
        .unwrap_or_else(|| panic!("no STOPPING=1 after SIGTERM; received after it: {after:?}"));
    assert_eq!(status_of(stopping), "stopping: delivering what was sampled");
    // Readiness is told once.
    let readies = notify
        .seen
        .iter()
        .filter(|m| m.lines().any(|l| l == "READY=1"))
        .count();
    assert_eq!(readies, 1, "{:?}", notify.seen);
}

#[test]
fn a_hung_sampler_stops_the_watchdog_pets() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("hang.toml");
    // Every NVML call about a GPU blocks forever from 1.5 s after init.
    std::fs::write(&scenario, "hang_at_ms = 1500\n\n[[gpu]]\n").unwrap();
    let (mut notify, socket) = NotifySocket::bind(dir.path());
    let (mut cmd, _) = agent_command(dir.path(), &socket);
    cmd.env(SCENARIO_ENV, &scenario);
    let mut agent = Running::spawn(cmd);

    let ready = notify.wait_for("READY=1");
    assert!(
        status_of(&ready).starts_with("sampling 1 GPU and the host every 100ms"),
        "{ready:?}"
    );
    notify.wait_for("WATCHDOG=1");

    let line = agent.wait_for_log("no longer petted", PATIENCE);
    assert!(
        line.contains("the sampling loop has been stuck on one tick"),
        "{line}"
    );
    // Pets sent before that decision may still be queued; none may follow.
    notify.drain();
    let later = notify.next(WATCHDOG * 3);
    assert_eq!(later, None, "a datagram after the sampler hung");
    // The sampler never returns, so the agent cannot stop by itself: systemd
    // would kill it (WatchdogSignal=SIGABRT, then SIGKILL); so does Drop.
}

#[test]
fn the_collector_is_ready_once_listening_pets_the_watchdog_and_says_when_it_stops() {
    let dir = tempfile::tempdir().unwrap();
    let (mut notify, socket) = NotifySocket::bind(dir.path());
    let store = dir.path().join("store");
    let mut cmd = Command::new(collector_bin());
    cmd.args(["--plaintext", "--listen", "127.0.0.1:0", "--store"])
        .arg(&store)
        .arg("--wal-dir")
        .arg(wal_dir_of(&store))
        .env("RUST_LOG", "info");
    under_systemd(&mut cmd, &socket);
    let mut collector = Running::spawn(cmd);
    let addr = collector.listening_address();

    let ready = notify.wait_for("READY=1");
    assert_eq!(
        status_of(&ready),
        format!("listening on {addr}; writing to {}", store.display())
    );
    for _ in 0..3 {
        notify.wait_for("WATCHDOG=1");
    }

    let out = collector.terminate(PATIENCE);
    assert!(out.status.success(), "{out:?}");
    let after = notify.drain();
    let stopping = after
        .iter()
        .find(|m| m.lines().any(|l| l == "STOPPING=1"))
        .unwrap_or_else(|| panic!("no STOPPING=1 after SIGTERM; received after it: {after:?}"));
    assert_eq!(status_of(stopping), "stopping: writing buffered rows");
}
