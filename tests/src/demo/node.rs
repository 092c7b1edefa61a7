//! The running simulation: the trees the agent reads (`proc/`, `sys/`,
//! `jobmap/`, the scenario), kept moving once a second, and the job trace
//! imported into the store.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{
    Attribution, CYCLE_S, GPUS, History, Job, Process, ib_bytes_per_s, jobs, processes, scenario,
    trace_changes, trace_dump,
};

/// The file under `--dir` that carries the history from one simulation to
/// the next (see [`History`]).
const HISTORY_FILE: &str = "history";

/// Why the simulation cannot go on.
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}: {source}")]
pub struct DemoError {
    what: &'static str,
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> DemoError + 'a {
    move |source| DemoError {
        what,
        path: path.to_owned(),
        source,
    }
}

/// Replaces `path` with `contents` in one rename, so a reader never sees
/// half a file.
fn write_atomic(tmp_dir: &Path, path: &Path, contents: &str) -> Result<(), DemoError> {
    let name = path.file_name().unwrap_or_default();
    let tmp = tmp_dir.join(name);
    std::fs::write(&tmp, contents).map_err(io("cannot write", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io("cannot replace", path))
}

/// What to simulate, and where.
#[derive(Debug, Clone)]
pub struct Options {
    /// Directory of the simulated trees; its parts are replaced.
    pub dir: PathBuf,
    /// GPUs, their jobs and processes, and the job trace.
    pub gpus: bool,
    /// InfiniBand ports.
    pub ib: bool,
    /// Where `import-jobs` writes the trace: the collector's store.
    pub store: PathBuf,
    /// The `gputel-collector` program, for `import-jobs`.
    pub collector: PathBuf,
    /// The fixture tree whose InfiniBand ports are copied.
    pub fixture_sys: PathBuf,
}

impl Options {
    /// The fake NVML's scenario file.
    pub fn scenario_path(&self) -> PathBuf {
        self.dir.join("scenario.toml")
    }

    /// The agent's `--procfs-root`.
    pub fn proc_dir(&self) -> PathBuf {
        self.dir.join("proc")
    }

    /// The agent's `--sysfs-root`.
    pub fn sys_dir(&self) -> PathBuf {
        self.dir.join("sys")
    }

    /// The agent's `--hpc-job-mapping-dir`.
    pub fn jobmap_dir(&self) -> PathBuf {
        self.dir.join("jobmap")
    }

    fn trace_dir(&self) -> PathBuf {
        self.dir.join("trace")
    }

    fn tmp_dir(&self) -> PathBuf {
        self.dir.join("tmp")
    }
}

/// The counter files of one port that traffic moves: (file, bytes per unit).
const MOVED_COUNTERS: [(&str, u64); 6] = [
    ("port_xmit_data", 4),
    ("port_rcv_data", 4),
    ("port_xmit_packets", 4096),
    ("port_rcv_packets", 4096),
    ("unicast_xmit_packets", 4096),
    ("unicast_rcv_packets", 4096),
];
/// The ports the pretraining job's traffic crosses.
const BUSY_PORTS: [&str; 2] = ["mlx5_0", "mlx5_1"];

/// One moving counter file.
#[derive(Debug)]
struct Counter {
    path: PathBuf,
    value: u64,
    /// Bytes a unit of the counter stands for: 4 for the data counters,
    /// which count 4-byte words; 4096 (the MTU) for packets.
    bytes_per_unit: u64,
    /// Bytes not yet counted (less than a unit).
    rest: u64,
}

/// A running simulation.
#[derive(Debug)]
pub struct Node {
    options: Options,
    history: History,
    /// When the pretraining job started, Unix seconds (kept in the history).
    pretrain_start_unix: i64,
    jobs: Vec<Job>,
    processes: Vec<Process>,
    counters: Vec<Counter>,
    start_unix: i64,
    /// The last second simulated.
    last: Option<u64>,
    imports: u64,
}

impl Node {
    /// Builds the simulated trees under `options.dir`; `start_unix` is the
    /// simulation's second 0.
    pub fn prepare(options: Options, start_unix: i64) -> Result<Node, DemoError> {
        let dir = &options.dir;
        std::fs::create_dir_all(dir).map_err(io("cannot create", dir))?;
        for part in ["proc", "sys", "jobmap", "trace", "tmp"] {
            let path = dir.join(part);
            match std::fs::remove_dir_all(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("cannot remove", &path)(e)),
            }
        }
        let tmp = options.tmp_dir();
        std::fs::create_dir_all(&tmp).map_err(io("cannot create", &tmp))?;
        // Where the last simulation here left the scheduler's history.
        let fresh = History::default();
        let (first_job, pretrain_started) = read_history(&options.dir.join(HISTORY_FILE))
            .unwrap_or((fresh.first_job, start_unix - fresh.pretrain_age_s as i64));
        let history = History {
            first_job,
            pretrain_age_s: u64::try_from(start_unix - pretrain_started).unwrap_or(0),
        };
        let jobs = jobs(history);
        let processes = processes(&jobs);
        let mut counters = Vec::new();
        if options.gpus {
            for part in [
                options.proc_dir(),
                options.jobmap_dir(),
                options.trace_dir(),
            ] {
                std::fs::create_dir_all(&part).map_err(io("cannot create", &part))?;
            }
            // The host stays real: its CPU, memory, load, name and boot id.
            for name in ["stat", "meminfo", "loadavg", "sys"] {
                let link = options.proc_dir().join(name);
                std::os::unix::fs::symlink(Path::new("/proc").join(name), &link)
                    .map_err(io("cannot create", &link))?;
            }
            write_atomic(&tmp, &options.scenario_path(), &scenario(&jobs))?;
        }
        if options.ib {
            let class = options.sys_dir().join("class");
            copy_tree(
                &options.fixture_sys.join("class/infiniband"),
                &class.join("infiniband"),
            )?;
            let powercap = class.join("powercap");
            std::os::unix::fs::symlink("/sys/class/powercap", &powercap)
                .map_err(io("cannot create", &powercap))?;
            for port in BUSY_PORTS {
                let dir = class.join("infiniband").join(port).join("ports/1/counters");
                for (name, bytes_per_unit) in MOVED_COUNTERS {
                    let path = dir.join(name);
                    let text = std::fs::read_to_string(&path).map_err(io("cannot read", &path))?;
                    let value = text.trim().parse().map_err(|e| {
                        io("not a counter:", &path)(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            e,
                        ))
                    })?;
                    counters.push(Counter {
                        path,
                        value,
                        bytes_per_unit,
                        rest: 0,
                    });
                }
            }
        }
        let node = Node {
            options,
            history,
            pretrain_start_unix: pretrain_started,
            jobs,
            processes,
            counters,
            start_unix,
            last: None,
            imports: 0,
        };
        node.save_history(0)?;
        Ok(node)
    }

    /// What the simulation stands for in the scheduler's history.
    pub fn history(&self) -> History {
        self.history
    }

    /// Records where a later simulation goes on: past the jobs of `cycle`,
    /// which has begun, with the same pretraining job.
    fn save_history(&self, cycle: u64) -> Result<(), DemoError> {
        let text = format!(
            "next_job={}\npretrain_started={}\n",
            self.history.cycle_first_job(cycle + 1),
            self.pretrain_start_unix
        );
        write_atomic(
            &self.options.tmp_dir(),
            &self.options.dir.join(HISTORY_FILE),
            &text,
        )
    }

    /// Brings the trees to second `t` of the simulation (every second since
    /// the last call, for the traffic counted).
    pub fn advance(&mut self, t: u64) -> Result<(), DemoError> {
        let from = self.last.map_or(t, |last| last + 1);
        if from > t {
            return Ok(());
        }
        if self.options.gpus {
            if (from..=t).any(|n| n % CYCLE_S == 0) && t > 0 {
                self.save_history(t / CYCLE_S)?;
            }
            self.sync_processes(t)?;
            self.sync_mapping(t)?;
            let changed = (from..=t).any(|n| trace_changes().contains(&(n % CYCLE_S)));
            if self.last.is_none() || changed {
                self.import_trace(t);
            }
        }
        if self.options.ib {
            for n in from..=t {
                let bytes = ib_bytes_per_s(n % CYCLE_S);
                for counter in &mut self.counters {
                    let total = counter.rest + bytes;
                    counter.value = counter.value.wrapping_add(total / counter.bytes_per_unit);
                    counter.rest = total % counter.bytes_per_unit;
                }
            }
            let tmp = self.options.tmp_dir();
            for counter in &self.counters {
                write_atomic(&tmp, &counter.path, &format!("{}\n", counter.value))?;
            }
        }
        self.last = Some(t);
        Ok(())
    }

    /// `proc/<pid>/` exists for the processes running at `t`, and for a few
    /// seconds either side (NVML and the agent's clock may be a moment
    /// apart from ours).
    fn sync_processes(&self, t: u64) -> Result<(), DemoError> {
        const MARGIN_S: u64 = 5;
        let proc = self.options.proc_dir();
        let wanted: Vec<&Process> = self
            .processes
            .iter()
            .filter(|p| {
                p.from_s.is_none_or(|from| from <= t + MARGIN_S)
                    && p.until_s.is_none_or(|until| t < until + MARGIN_S)
            })
            .collect();
        let wanted_pids: BTreeSet<u32> = wanted.iter().map(|p| p.pid).collect();
        for entry in std::fs::read_dir(&proc).map_err(io("cannot list", &proc))? {
            let entry = entry.map_err(io("cannot list", &proc))?;
            let pid = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok());
            if pid.is_some_and(|pid| !wanted_pids.contains(&pid)) {
                let path = entry.path();
                std::fs::remove_dir_all(&path).map_err(io("cannot remove", &path))?;
            }
        }
        for p in wanted {
            let dir = proc.join(p.pid.to_string());
            if dir.exists() {
                continue;
            }
            let user = self
                .jobs
                .iter()
                .find(|j| j.id == p.job)
                .map_or("nobody", |j| j.user);
            // Built beside it and renamed in, so the agent never reads a
            // process directory without its files.
            let staged = self.options.tmp_dir().join(p.pid.to_string());
            std::fs::create_dir_all(&staged).map_err(io("cannot create", &staged))?;
            for (name, text) in proc_files(p, user) {
                let path = staged.join(name);
                std::fs::write(&path, text).map_err(io("cannot write", &path))?;
            }
            std::fs::rename(&staged, &dir).map_err(io("cannot create", &dir))?;
        }
        Ok(())
    }

    /// `jobmap/<gpu>` names the jobs that hold a GPU without a process (as
    /// a Slurm prolog writes it and its epilog removes it).
    fn sync_mapping(&self, t: u64) -> Result<(), DemoError> {
        let map = self.options.jobmap_dir();
        for gpu in 0..GPUS {
            let ids: Vec<String> = self
                .jobs
                .iter()
                .filter(|j| {
                    j.attribution == Attribution::MappingFile
                        && j.gpus.contains(&gpu)
                        && j.runs_at(t as i64)
                })
                .map(|j| format!("{}\n", j.id))
                .collect();
            let path = map.join(gpu.to_string());
            let now = std::fs::read_to_string(&path).ok();
            if ids.is_empty() {
                if now.is_some() {
                    std::fs::remove_file(&path).map_err(io("cannot remove", &path))?;
                }
            } else if now.as_deref() != Some(&ids.concat()) {
                write_atomic(&self.options.tmp_dir(), &path, &ids.concat())?;
            }
        }
        Ok(())
    }

    /// Dumps the scheduler's records at `t` and imports them into the store.
    /// A failed import is said and the simulation goes on.
    fn import_trace(&mut self, t: u64) {
        self.imports += 1;
        let file = self
            .options
            .trace_dir()
            .join(format!("jobs-{:06}.csv", self.imports));
        let dump = trace_dump(&self.jobs, t as i64, self.start_unix);
        if let Err(e) = std::fs::write(&file, dump) {
            eprintln!(
                "gputel-demo: cannot write the job trace {}: {e}",
                file.display()
            );
            return;
        }
        let out = Command::new(&self.options.collector)
            .args(["import-jobs", "--format", "acme"])
            .arg(&file)
            .arg("--store")
            .arg(&self.options.store)
            .output();
        match out {
            Ok(out) if out.status.success() => {
                eprintln!(
                    "gputel-demo: {}",
                    String::from_utf8_lossy(&out.stdout).trim()
                );
                // The store keeps what it imported.
                let _ = std::fs::remove_file(&file);
            }
            Ok(out) => eprintln!(
                "gputel-demo: import-jobs of {} failed ({}): {}",
                file.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            Err(e) => eprintln!(
                "gputel-demo: cannot run {}: {e}",
                self.options.collector.display()
            ),
        }
    }
}

/// The next job id and the pretraining job's start (Unix seconds) a former
/// simulation left; None when there is none, or it cannot be read.
fn read_history(path: &Path) -> Option<(u64, i64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let value = |key: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
            .map(str::trim)
    };
    let history = value("next_job")?
        .parse()
        .ok()
        .zip(value("pretrain_started")?.parse().ok());
    if history.is_none() {
        eprintln!(
            "gputel-demo: {} is not a simulation's history; starting a new one",
            path.display()
        );
    }
    history
}

/// Copies a directory tree of plain files and directories.
fn copy_tree(from: &Path, to: &Path) -> Result<(), DemoError> {
    std::fs::create_dir_all(to).map_err(io("cannot create", to))?;
    for entry in std::fs::read_dir(from).map_err(io("cannot list", from))? {
        let entry = entry.map_err(io("cannot list", from))?;
        let target = to.join(entry.file_name());
        let kind = entry
            .file_type()
            .map_err(io("cannot read", &entry.path()))?;
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target).map_err(io("cannot copy to", &target))?;
        }
    }
    Ok(())
}

/// The files of `/proc/<pid>/` the agent reads for a process: (`comm`,
/// `cgroup`, `environ`).
fn proc_files(p: &Process, user: &str) -> [(&'static str, String); 3] {
    let job = p.job;
    let cgroup = match p.attribution {
        Attribution::SlurmCgroupV2 => {
            format!("0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n")
        }
        Attribution::SlurmCgroupV1 => format!(
            "12:pids:/slurm/uid_1000/job_{job}/step_0/task_0\n\
             11:memory:/slurm/uid_1000/job_{job}/step_0/task_0\n\
             10:devices:/slurm/uid_1000/job_{job}/step_0/task_0\n\
             9:cpuset:/slurm/uid_1000/job_{job}/step_0\n\
             1:name=systemd:/system.slice/slurmd.service\n\
             0::/system.slice/slurmd.service\n"
        ),
        Attribution::SlurmEnviron | Attribution::MappingFile => {
            "0::/user.slice/user-1000.slice/session-3.scope\n".to_owned()
        }
    };
    let comm = match p.attribution {
        Attribution::SlurmCgroupV1 => "python3\n",
        _ => "python\n",
    };
    let environ = format!(
        "SLURM_JOB_ID={job}\0SLURM_JOB_USER={user}\0CUDA_VISIBLE_DEVICES={}\0",
        p.gpu
    );
    [
        ("comm", comm.to_owned()),
        ("cgroup", cgroup),
        ("environ", environ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_goes_on_with_new_job_ids_and_the_same_pretraining_job() {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = Options {
            dir: dir.path().join("node"),
            gpus: true,
            ib: false,
            store: dir.path().join("store"),
            collector: dir.path().join("no-collector"),
            fixture_sys: dir.path().join("no-fixture"),
        };
        let first = Node::prepare(options.clone(), 1_000_000).expect("prepare");
        assert_eq!(
            first.history(),
            History {
                first_job: 1001,
                pretrain_age_s: 7200
            }
        );
        drop(first);
        // Five minutes later: the first cycle's ids were taken.
        let second = Node::prepare(options.clone(), 1_000_300).expect("prepare again");
        assert_eq!(
            second.history(),
            History {
                first_job: 1005,
                pretrain_age_s: 7500
            }
        );
        assert_eq!(second.jobs[1].id, 1005);
        // A history that cannot be read starts a new one.
        std::fs::write(options.dir.join(HISTORY_FILE), "next_job=x\n").expect("write");
        let third = Node::prepare(options, 1_000_600).expect("prepare a third time");
        assert_eq!(third.history(), History::default());
    }
}
