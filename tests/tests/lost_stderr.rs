//! A program whose stderr goes away (the terminal closed, the log pipe's
//! reader killed by the same Ctrl-C) still shuts down cleanly: the collector
//! writes what it holds, the agent delivers what it sampled. Logging used to
//! panic on the first write to the closed pipe, so the last flush never ran.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use gputel_tests::{
    assert_gpu_rows_exactly_once, collector_bin, fixture_agent, summary_field, wal_dir_of,
};

#[test]
fn a_collector_without_stderr_still_writes_what_it_holds_at_sigterm() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = tmp.path().join("store");
    let mut collector = Command::new(collector_bin())
        .args([
            "--plaintext",
            "--listen",
            "127.0.0.1:0",
            "--flush-interval",
            "1h",
        ])
        .arg("--store")
        .arg(&store)
        .arg("--wal-dir")
        .arg(wal_dir_of(&store))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the collector");
    let mut stderr = BufReader::new(collector.stderr.take().expect("piped"));
    let mut line = String::new();
    let addr = loop {
        line.clear();
        let n = stderr.read_line(&mut line).expect("read the log");
        assert!(n > 0, "the collector exited before listening");
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest
                .split_whitespace()
                .next()
                .expect("an address")
                .to_owned();
        }
    };

    // The agent with its own stderr closed from the start.
    let mut agent = fixture_agent("gpu-node-061");
    agent
        .args([
            "--collector",
            &format!("http://{addr}"),
            "--interval",
            "50ms",
        ])
        .args(["--ticks", "5"])
        .env("RUST_LOG", "info");
    let mut agent = agent
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the agent");
    drop(agent.stderr.take());
    let out = agent.wait_with_output().expect("wait for the agent");
    assert!(out.status.success(), "agent: {:?}", out.status);
    let summary = String::from_utf8_lossy(&out.stdout);
    assert_eq!(summary_field(&summary, "acknowledged"), "5", "{summary}");

    // Nothing is flushed yet (an hour's interval); the log pipe goes away.
    drop(stderr);
    let status = Command::new("kill")
        .args(["-TERM", &collector.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(exit) = collector.try_wait().expect("try_wait") {
            break exit;
        }
        if std::time::Instant::now() > deadline {
            let _ = collector.kill();
            panic!("the collector did not exit within 30 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "collector: {exit:?}");
    assert_gpu_rows_exactly_once(tmp.path(), &store, 5 * 8);
}
