//! Every committed fuzz input, replayed through the fuzz targets' own code
//! (`fuzz/src/lib.rs`): the seeds in `fuzz/seeds/TARGET` and the corpus in
//! `fuzz/corpus/TARGET` that fuzzing grew and `cargo fuzz cmin` minimized.
//! This is how CI checks the targets; `scripts/fuzz` runs the fuzzer itself.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

#[allow(dead_code, clippy::unwrap_used)]
#[path = "../../fuzz/src/lib.rs"]
mod fuzz;

use gputel_tests::workspace_root;

/// A fuzz target's body: the fuzzer's bytes in, a panic on a failed check.
type Target = fn(&[u8]);

/// Runs `target` on every input of its seeds and corpus; returns how many
/// there were. A panic names the input.
fn replay(name: &str, target: Target) -> usize {
    let root = workspace_root().join("fuzz");
    let mut inputs = Vec::new();
    for dir in ["seeds", "corpus"] {
        let dir = root.join(dir).join(name);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_file() {
                inputs.push(path);
            }
        }
    }
    inputs.sort();
    for path in &inputs {
        let bytes = std::fs::read(path).expect("read a fuzz input");
        if catch_unwind(AssertUnwindSafe(|| target(&bytes))).is_err() {
            panic!("fuzz target {name} panicked on {}", shown(path));
        }
    }
    inputs.len()
}

fn shown(path: &Path) -> String {
    path.strip_prefix(workspace_root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Every target has inputs: a target whose seeds went missing would
/// otherwise pass by checking nothing.
#[test]
fn every_committed_input_of_every_target() {
    let targets: [(&str, Target); 6] = [
        ("agent_message", fuzz::agent_message::run),
        ("job_trace", fuzz::job_trace::run),
        ("procfs", fuzz::procfs::run),
        ("spool_open", fuzz::spool_open::run),
        ("sysfs_ib", fuzz::sysfs_ib::run),
        ("wal_replay", fuzz::wal_replay::run),
    ];
    let listed = std::fs::read_dir(workspace_root().join("fuzz/fuzz_targets"))
        .expect("fuzz/fuzz_targets")
        .count();
    assert_eq!(listed, targets.len(), "a fuzz target is not replayed here");
    for (name, target) in targets {
        let inputs = replay(name, target);
        assert!(inputs >= 1, "fuzz target {name} has no committed input");
        eprintln!("{name}: {inputs} inputs");
    }
}
