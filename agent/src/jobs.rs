//! Job attribution: which scheduler job (and Kubernetes pod) owns each GPU.
//!
//! Sources, in order of precedence per GPU:
//! 1. a Slurm prolog/epilog mapping directory (`--hpc-job-mapping-dir`) in
//!    dcgm-exporter's HPC job-mapping format: one file per GPU index, holding
//!    the job ids on that GPU, one per line;
//! 2. the cgroup of each compute process on the GPU (`/proc/<pid>/cgroup`):
//!    Slurm on cgroup v1 (`/slurm/uid_<u>/job_<id>/…`) and v2
//!    (`…/job_<id>/step_<n>/…`), Kubernetes pods (`…kubepods…-pod<uid>.slice`
//!    with the systemd driver, `…/pod<uid>/…` with cgroupfs);
//! 3. `SLURM_JOB_ID` in `/proc/<pid>/environ`.
//!
//! On Kubernetes, the kubelet's pod-resources API ([`crate::kube`]) names the
//! pod, namespace and container each GPU is allocated to; cgroups still give
//! `pod_uid` where a GPU's processes run in a pod.
//!
//! Processes are listed at the slower process cadence, so a GPU's jobs are
//! those of its last listing. A process that ended between NVML's listing and
//! the /proc read is normal and simply contributes nothing.
//!
//! A GPU shared by several jobs has `job_count` > 1 and no `job_id`: its
//! samples cannot be split between the jobs, and pretending otherwise would
//! put one job's usage on another. The `gpu_process` rows still name each
//! process's job.
//!
//! MIG: a MIG device's row carries the jobs of the processes on that device,
//! or those of the mapping file `<gpu>.<GPU instance id>` (dcgm-exporter's
//! name for it); the GPU's own row carries every job on any of its MIG
//! devices (its `<gpu>` file, when there is one, wins), so it has a `job_id`
//! only when one job holds the whole GPU.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use gputel_proto::Batch;
use tracing::debug;

use crate::kube::PodsRx;

/// What owns one process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owner {
    pub job_id: Option<String>,
    pub pod_uid: Option<String>,
}

/// The jobs and pods on one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct GpuJobs {
    jobs: BTreeSet<String>,
    pods: BTreeSet<String>,
}

/// A `gpu` row's identity on a node: GPU index, and the GPU and compute
/// instance ids of a MIG device's row (None on a GPU's own row).
type RowKey = (u32, Option<u32>, Option<u32>);

/// Tracks the jobs on every GPU and stamps them on each tick's rows.
#[derive(Debug)]
pub struct JobAttributor {
    procfs_root: PathBuf,
    mapping_dir: Option<PathBuf>,
    /// From the last process listing, by GPU and MIG device.
    from_processes: HashMap<RowKey, GpuJobs>,
    /// The kubelet's latest GPU allocations, on Kubernetes nodes.
    pods: Option<PodsRx>,
}

impl JobAttributor {
    pub fn new(procfs_root: impl Into<PathBuf>, mapping_dir: Option<PathBuf>) -> Self {
        Self {
            procfs_root: procfs_root.into(),
            mapping_dir,
            from_processes: HashMap::new(),
            pods: None,
        }
    }

    /// Also stamps the pods the kubelet allocated each GPU to, as `pods`
    /// last published them.
    pub fn with_pods(mut self, pods: PodsRx) -> Self {
        self.pods = Some(pods);
        self
    }

    /// Fills the job columns of a tick's rows. `processes_listed` says whether
    /// this tick listed every GPU's processes (its `gpu_process` rows, possibly
    /// none, are then the whole truth).
    pub fn apply(&mut self, batch: &mut Batch, processes_listed: bool) {
        if processes_listed {
            self.from_processes.clear();
            for p in &mut batch.gpu_process {
                let owner = owner_of(&self.procfs_root, p.pid);
                let key = (p.gpu, p.gpu_instance_id, p.compute_instance_id);
                let jobs = self.from_processes.entry(key).or_default();
                if let Some(job) = &owner.job_id {
                    jobs.jobs.insert(job.clone());
                }
                if let Some(pod) = &owner.pod_uid {
                    jobs.pods.insert(pod.clone());
                }
                p.job_id = owner.job_id;
                p.pod_uid = owner.pod_uid;
            }
        }
        let mut node_jobs = BTreeSet::new();
        // The jobs of every row, for the events; MIG devices' rows first,
        // so that their GPU's row can take the union of theirs.
        let mut row_jobs: Vec<(RowKey, BTreeSet<String>)> = Vec::new();
        let mut on_instances: HashMap<u32, GpuJobs> = HashMap::new();
        for row in batch.gpu.iter_mut().filter(|r| r.gpu_instance_id.is_some()) {
            let key = (row.gpu, row.gpu_instance_id, row.compute_instance_id);
            let file = format!("{}.{}", row.gpu, row.gpu_instance_id.unwrap_or_default());
            let seen = self.from_processes.get(&key).cloned().unwrap_or_default();
            let mapped = self
                .mapping_dir
                .as_deref()
                .and_then(|dir| read_mapping(dir, &file));
            let jobs = mapped.unwrap_or_else(|| seen.jobs.clone());
            stamp(row, &jobs, &seen.pods);
            let union = on_instances.entry(row.gpu).or_default();
            union.jobs.extend(jobs.iter().cloned());
            union.pods.extend(seen.pods.iter().cloned());
            row_jobs.push((key, jobs));
        }
        for row in batch.gpu.iter_mut().filter(|r| r.gpu_instance_id.is_none()) {
            let mut seen = GpuJobs::default();
            for (_, jobs) in self.from_processes.iter().filter(|(k, _)| k.0 == row.gpu) {
                seen.jobs.extend(jobs.jobs.iter().cloned());
                seen.pods.extend(jobs.pods.iter().cloned());
            }
            let mapped = self
                .mapping_dir
                .as_deref()
                .and_then(|dir| read_mapping(dir, &row.gpu.to_string()));
            let jobs = match (mapped, on_instances.get(&row.gpu)) {
                (Some(jobs), _) => jobs,
                (None, Some(instances)) => instances.jobs.clone(),
                (None, None) => seen.jobs,
            };
            stamp(row, &jobs, &seen.pods);
            node_jobs.extend(jobs.iter().cloned());
            row_jobs.push(((row.gpu, None, None), jobs));
        }
        for event in &mut batch.event {
            // An XID NVML attributes to a GPU instance belongs to the jobs of
            // its compute instances (one, or all when it names none).
            let mut jobs = BTreeSet::new();
            for ((gpu, gi, ci), row) in &row_jobs {
                let on = *gpu == event.gpu
                    && *gi == event.gpu_instance_id
                    && (event.compute_instance_id.is_none() || *ci == event.compute_instance_id);
                if on {
                    jobs.extend(row.iter().cloned());
                }
            }
            event.job_id = single(&jobs);
        }
        for node in &mut batch.node {
            node.jobs = node_jobs.iter().cloned().collect();
        }
        if let Some(pods) = &self.pods
            && let Some(devices) = pods.borrow().as_deref()
        {
            devices.stamp(&mut batch.gpu);
        }
    }
}

/// Puts a row's jobs and pods on it: the one job (none when idle or
/// shared), how many, and the one pod.
fn stamp(row: &mut gputel_proto::GpuSample, jobs: &BTreeSet<String>, pods: &BTreeSet<String>) {
    row.job_count = jobs.len() as u32;
    row.job_id = single(jobs);
    row.pod_uid = single(pods);
}

fn single(set: &BTreeSet<String>) -> Option<String> {
    match set.len() {
        1 => set.iter().next().cloned(),
        _ => None,
    }
}

/// The job ids in `<dir>/<file>` (`<gpu>`, or `<gpu>.<GPU instance id>`
/// for a MIG device), one per line; None when the file is missing or empty
/// (the GPU is idle as far as the prolog knows).
fn read_mapping(dir: &Path, file: &str) -> Option<BTreeSet<String>> {
    let path = dir.join(file);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                debug!(path = %path.display(), error = %e, "job mapping file unreadable");
            }
            return None;
        }
    };
    let jobs: BTreeSet<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| is_job_id(l))
        .map(str::to_owned)
        .collect();
    (!jobs.is_empty()).then_some(jobs)
}

/// Job ids are what schedulers print: digits, with `_` for array tasks and
/// `+` for heterogeneous components. Anything else is ignored.
fn is_job_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'+' | b'.' | b'-'))
}

/// The job and pod of a process, from its cgroup, then its environment.
pub fn owner_of(procfs_root: &Path, pid: u32) -> Owner {
    let dir = procfs_root.join(pid.to_string());
    let mut owner = std::fs::read_to_string(dir.join("cgroup"))
        .map(|text| owner_from_cgroup(&text))
        .unwrap_or_default();
    if owner.job_id.is_none()
        && let Ok(environ) = std::fs::read(dir.join("environ"))
    {
        owner.job_id = slurm_job_from_environ(&environ);
    }
    owner
}

/// Parses `/proc/<pid>/cgroup` (v1 lines `id:controllers:path`, v2 `0::path`).
pub fn owner_from_cgroup(text: &str) -> Owner {
    let mut owner = Owner::default();
    for line in text.lines() {
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        for part in path.split('/') {
            if owner.job_id.is_none()
                && let Some(id) = part.strip_prefix("job_")
                && !id.is_empty()
                && id.bytes().all(|b| b.is_ascii_digit())
            {
                owner.job_id = Some(id.to_owned());
            }
            if owner.pod_uid.is_none() {
                owner.pod_uid = pod_uid(part);
            }
        }
    }
    owner
}

/// A Kubernetes pod UID from one cgroup path component: `pod<uid>` (cgroupfs
/// driver) or `kubepods-<qos>-pod<uid with _ for ->.slice` (systemd driver).
fn pod_uid(part: &str) -> Option<String> {
    let uid = if let Some(slice) = part.strip_suffix(".slice") {
        let (_, uid) = slice.rsplit_once("-pod")?;
        uid.replace('_', "-")
    } else {
        part.strip_prefix("pod")?.to_owned()
    };
    let looks_like_uid = uid.len() == 36
        && uid.bytes().enumerate().all(|(i, b)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                b == b'-'
            } else {
                b.is_ascii_hexdigit()
            }
        });
    looks_like_uid.then_some(uid)
}

/// `SLURM_JOB_ID` from a NUL-separated `/proc/<pid>/environ`.
pub fn slurm_job_from_environ(environ: &[u8]) -> Option<String> {
    environ
        .split(|b| *b == 0)
        .filter_map(|kv| kv.strip_prefix(b"SLURM_JOB_ID="))
        .filter_map(|v| std::str::from_utf8(v).ok())
        .find(|v| is_job_id(v))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gputel_proto::{GpuEvent, GpuProcess, GpuSample, NodeSample};

    fn fixture_proc() -> PathBuf {
        PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/proc"
        ))
    }

    fn owner(job: Option<&str>, pod: Option<&str>) -> Owner {
        Owner {
            job_id: job.map(str::to_owned),
            pod_uid: pod.map(str::to_owned),
        }
    }

    #[test]
    fn slurm_cgroup_v2_v1_kubernetes_and_environ_fixtures() {
        let root = fixture_proc();
        assert_eq!(owner_of(&root, 4242), owner(Some("4242"), None));
        assert_eq!(owner_of(&root, 5151), owner(Some("5151"), None));
        assert_eq!(
            owner_of(&root, 6161),
            owner(None, Some("8f3c2a1e-4b5d-4c6e-9f70-123456789abc"))
        );
        assert_eq!(
            owner_of(&root, 6262),
            owner(None, Some("5e6f7a8b-1c2d-4e3f-8a9b-0c1d2e3f4a5b"))
        );
        assert_eq!(owner_of(&root, 7171), owner(Some("7171"), None));
        // A process that ended before /proc was read: nobody, no error.
        assert_eq!(owner_of(&root, 999_999), Owner::default());
    }

    #[test]
    fn cgroup_lines_without_jobs_or_pods_are_nobody() {
        assert_eq!(
            owner_from_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n"),
            Owner::default()
        );
        assert_eq!(owner_from_cgroup("garbage"), Owner::default());
        assert_eq!(owner_from_cgroup("0::/slurm/job_/x"), Owner::default());
        assert_eq!(owner_from_cgroup("0::/a/podnot-a-uid/b"), Owner::default());
    }

    #[test]
    fn environ_fallback_takes_only_slurm_job_id() {
        assert_eq!(
            slurm_job_from_environ(b"A=1\0SLURM_JOB_IDX=9\0SLURM_JOB_ID=77\0"),
            Some("77".to_owned())
        );
        assert_eq!(slurm_job_from_environ(b"SLURM_JOB_ID=../x\0"), None);
        assert_eq!(slurm_job_from_environ(b""), None);
    }

    fn gpu(index: u32) -> GpuSample {
        GpuSample {
            gpu: index,
            ..GpuSample::default()
        }
    }

    fn process(gpu: u32, pid: u32) -> GpuProcess {
        GpuProcess {
            gpu,
            pid,
            ..GpuProcess::default()
        }
    }

    #[test]
    fn every_row_gets_its_gpus_job_and_shared_gpus_none() {
        let mut jobs = JobAttributor::new(fixture_proc(), None);
        let mut batch = Batch {
            gpu: (0..4).map(gpu).collect(),
            node: vec![NodeSample::default()],
            gpu_process: vec![
                process(0, 4242),
                process(1, 6161),
                process(2, 4242),
                process(2, 5151),
            ],
            event: vec![GpuEvent {
                gpu: 0,
                ..GpuEvent::default()
            }],
            ..Batch::default()
        };
        jobs.apply(&mut batch, true);
        let got: Vec<_> = batch
            .gpu
            .iter()
            .map(|g| (g.job_id.as_deref(), g.job_count, g.pod_uid.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                (Some("4242"), 1, None),
                (None, 0, Some("8f3c2a1e-4b5d-4c6e-9f70-123456789abc")),
                (None, 2, None),
                (None, 0, None),
            ]
        );
        assert_eq!(batch.node[0].jobs, ["4242", "5151"]);
        assert_eq!(batch.event[0].job_id.as_deref(), Some("4242"));
        assert_eq!(batch.gpu_process[3].job_id.as_deref(), Some("5151"));

        // Between listings the GPUs keep their jobs.
        let mut next = Batch {
            gpu: (0..4).map(gpu).collect(),
            ..Batch::default()
        };
        jobs.apply(&mut next, false);
        assert_eq!(next.gpu[0].job_id.as_deref(), Some("4242"));
        // A listing with no processes makes every GPU idle.
        let mut idle = Batch {
            gpu: (0..4).map(gpu).collect(),
            ..Batch::default()
        };
        jobs.apply(&mut idle, true);
        assert!(
            idle.gpu
                .iter()
                .all(|g| g.job_id.is_none() && g.job_count == 0)
        );
    }

    #[test]
    fn the_mapping_directory_wins_over_processes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("0"), "4243\n").unwrap();
        std::fs::write(dir.path().join("1"), "").unwrap();
        std::fs::write(dir.path().join("3"), "100\n101\n../etc\n").unwrap();
        let mut jobs = JobAttributor::new(fixture_proc(), Some(dir.path().to_owned()));
        let mut batch = Batch {
            gpu: (0..4).map(gpu).collect(),
            gpu_process: vec![process(0, 4242), process(1, 5151)],
            ..Batch::default()
        };
        jobs.apply(&mut batch, true);
        let got: Vec<_> = batch
            .gpu
            .iter()
            .map(|g| (g.job_id.as_deref(), g.job_count))
            .collect();
        // GPU 1's empty file falls back to its process; GPU 3 is shared.
        assert_eq!(
            got,
            [(Some("4243"), 1), (Some("5151"), 1), (None, 0), (None, 2)]
        );
    }

    fn mig_row(gpu: u32, gi: u32) -> GpuSample {
        GpuSample {
            gpu,
            gpu_instance_id: Some(gi),
            compute_instance_id: Some(0),
            ..GpuSample::default()
        }
    }

    fn mig_process(gpu: u32, gi: u32, pid: u32) -> GpuProcess {
        GpuProcess {
            gpu_instance_id: Some(gi),
            compute_instance_id: Some(0),
            ..process(gpu, pid)
        }
    }

    /// MIG devices' rows get their own processes' jobs, or the mapping file
    /// `<gpu>.<gi>`; the GPU's row gets every job on it, and an XID NVML
    /// attributes to an instance gets that instance's job.
    #[test]
    fn mig_devices_have_their_own_jobs_and_the_gpu_row_all_of_them() {
        let mut jobs = JobAttributor::new(fixture_proc(), None);
        let mut batch = Batch {
            gpu: vec![gpu(0), mig_row(0, 1), mig_row(0, 2), gpu(1), mig_row(1, 5)],
            gpu_process: vec![
                mig_process(0, 1, 4242),
                mig_process(0, 2, 5151),
                mig_process(1, 5, 4242),
            ],
            event: vec![
                GpuEvent {
                    gpu: 0,
                    gpu_instance_id: Some(2),
                    compute_instance_id: Some(0),
                    ..GpuEvent::default()
                },
                GpuEvent {
                    gpu: 0,
                    ..GpuEvent::default()
                },
            ],
            ..Batch::default()
        };
        jobs.apply(&mut batch, true);
        let got: Vec<_> = batch
            .gpu
            .iter()
            .map(|g| (g.gpu, g.gpu_instance_id, g.job_id.as_deref(), g.job_count))
            .collect();
        assert_eq!(
            got,
            [
                (0, None, None, 2),
                (0, Some(1), Some("4242"), 1),
                (0, Some(2), Some("5151"), 1),
                (1, None, Some("4242"), 1),
                (1, Some(5), Some("4242"), 1),
            ]
        );
        assert_eq!(batch.event[0].job_id.as_deref(), Some("5151"));
        // An XID on the shared GPU itself names no job.
        assert_eq!(batch.event[1].job_id, None);

        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("0.1"), "9999\n").unwrap();
        let mut mapped = JobAttributor::new(fixture_proc(), Some(dir.path().to_owned()));
        let mut batch = Batch {
            gpu: vec![gpu(0), mig_row(0, 1), mig_row(0, 2)],
            gpu_process: vec![mig_process(0, 1, 4242), mig_process(0, 2, 5151)],
            ..Batch::default()
        };
        mapped.apply(&mut batch, true);
        let got: Vec<_> = batch
            .gpu
            .iter()
            .map(|g| (g.job_id.as_deref(), g.job_count))
            .collect();
        assert_eq!(got, [(None, 2), (Some("9999"), 1), (Some("5151"), 1)]);
        assert_eq!(batch.gpu_process[0].job_id.as_deref(), Some("4242"));
    }
}
