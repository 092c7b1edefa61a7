//! Kubernetes attribution end to end: a fake kubelet serves the published
//! pod-resources API (proto/kubelet/podresources/v1/api.proto) on a Unix
//! socket, a fake API server lists the node's pods with their labels, and
//! every gpu row names the pod, namespace and container the kubelet
//! allocated its GPU (or MIG device) to, with the labels chosen by
//! `--pod-label`, through the whole pipeline to DuckDB. The manifests of
//! `deploy/kubernetes/` pass the Kubernetes API's schemas, and their
//! ConfigMaps are configurations the programs start with.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gputel_proto::podresources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use gputel_proto::podresources::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, PodResources,
};
use gputel_tests::{
    HttpRecorder, Running, agent_bin, collector_bin, duckdb, provided_path, run_scenario_pipeline,
    shipped_query, table_scan, workspace_root,
};
use serde_json::{Value, json};
use tonic::{Request, Response, Status};

/// An A100 in MIG mode with two MIG devices, and three H100s.
const SCENARIO: &str = r#"
[[gpu]]
name = "NVIDIA A100-SXM4-40GB"
uuid = "GPU-a100a100-0000-4000-8000-000000000000"
gpm = false
mig_mode = 1

[[gpu.mig]]
gpu_instance_id = 1
profile = "3g.20gb"
uuid = "MIG-11111111-2222-5333-8444-555555555555"
fb_total_bytes = 20937965568

[[gpu.mig]]
gpu_instance_id = 2
profile = "3g.20gb"
uuid = "MIG-66666666-7777-5888-8999-aaaaaaaaaaaa"
fb_total_bytes = 20937965568

[[gpu]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-4100b100-0000-4000-8000-000000000001"

[[gpu]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-4100b100-0000-4000-8000-000000000002"

[[gpu]]
name = "NVIDIA H100 80GB HBM3"
uuid = "GPU-4100b100-0000-4000-8000-000000000003"
"#;

const TICKS: u64 = 8;
const NODE: &str = "gpu-node-017";

fn devices(resource: &str, ids: &[&str]) -> ContainerDevices {
    ContainerDevices {
        resource_name: resource.to_owned(),
        device_ids: ids.iter().map(|id| (*id).to_owned()).collect(),
        topology: None,
    }
}

fn pod(namespace: &str, name: &str, containers: &[(&str, ContainerDevices)]) -> PodResources {
    PodResources {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        containers: containers
            .iter()
            .map(|(name, devices)| ContainerResources {
                name: (*name).to_owned(),
                devices: vec![devices.clone()],
                ..ContainerResources::default()
            })
            .collect(),
        ..PodResources::default()
    }
}

/// A kubelet's pod-resources service with a fixed allocation; counts calls.
#[derive(Debug, Default, Clone)]
struct FakeKubelet {
    calls: Arc<Mutex<BTreeMap<&'static str, u32>>>,
}

impl FakeKubelet {
    fn count(&self, call: &'static str) {
        *self.calls.lock().expect("lock").entry(call).or_default() += 1;
    }

    fn pods() -> Vec<PodResources> {
        vec![
            // GPU 1 by UUID; the pod's sidecar holds a device of another plugin.
            pod(
                "train",
                "llama-0",
                &[
                    (
                        "trainer",
                        devices(
                            "nvidia.com/gpu",
                            &["GPU-4100b100-0000-4000-8000-000000000001"],
                        ),
                    ),
                    ("sidecar", devices("example.com/nic", &["eth1"])),
                ],
            ),
            // GPU 2 by index (the device plugin's DEVICE_ID_STRATEGY=index).
            pod(
                "eval",
                "e-1",
                &[("main", devices("nvidia.com/gpu", &["2"]))],
            ),
            // GPU 3 time-sliced between two pods: shared, so no pod.
            pod(
                "dev",
                "nb-1",
                &[(
                    "nb",
                    devices(
                        "nvidia.com/gpu.shared",
                        &["GPU-4100b100-0000-4000-8000-000000000003::0"],
                    ),
                )],
            ),
            pod(
                "dev",
                "nb-2",
                &[(
                    "nb",
                    devices(
                        "nvidia.com/gpu.shared",
                        &["GPU-4100b100-0000-4000-8000-000000000003::1"],
                    ),
                )],
            ),
            // The A100's two MIG devices, one per container of one pod.
            pod(
                "infer",
                "srv",
                &[
                    (
                        "a",
                        devices(
                            "nvidia.com/mig-3g.20gb",
                            &["MIG-11111111-2222-5333-8444-555555555555"],
                        ),
                    ),
                    (
                        "b",
                        devices(
                            "nvidia.com/mig-3g.20gb",
                            &["MIG-66666666-7777-5888-8999-aaaaaaaaaaaa"],
                        ),
                    ),
                ],
            ),
        ]
    }
}

#[tonic::async_trait]
impl PodResourcesLister for FakeKubelet {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.count("List");
        Ok(Response::new(ListPodResourcesResponse {
            pod_resources: Self::pods(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        self.count("GetAllocatableResources");
        Ok(Response::new(AllocatableResourcesResponse {
            devices: vec![devices(
                "nvidia.com/gpu",
                &[
                    "GPU-4100b100-0000-4000-8000-000000000001",
                    "GPU-4100b100-0000-4000-8000-000000000002",
                ],
            )],
            ..AllocatableResourcesResponse::default()
        }))
    }

    async fn get(
        &self,
        _: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        Err(Status::unimplemented("the agent lists"))
    }
}

/// The API server's pod list of the node, with labels, as JSON.
const POD_LIST: &str = r#"{"kind":"PodList","apiVersion":"v1","items":[
  {"metadata":{"name":"llama-0","namespace":"train","uid":"0b0c","labels":
    {"team":"pretrain","app.kubernetes.io/name":"llama","pod-template-hash":"7c9"}}},
  {"metadata":{"name":"e-1","namespace":"eval","labels":{"team":"eval"}}},
  {"metadata":{"name":"srv","namespace":"infer","labels":{"app.kubernetes.io/name":"vllm"}}},
  {"metadata":{"name":"web","namespace":"train","labels":{"team":"web"}}}
]}"#;

/// Serves the fake kubelet on `socket`, on a thread of its own.
fn serve_kubelet(socket: PathBuf, kubelet: FakeKubelet) {
    let (up_tx, up_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        runtime.block_on(async move {
            let listener = tokio::net::UnixListener::bind(&socket).expect("bind kubelet socket");
            up_tx.send(()).expect("the kubelet is up");
            tonic::transport::Server::builder()
                .add_service(PodResourcesListerServer::new(kubelet))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
                .await
                .expect("serve the kubelet");
        });
    });
    up_rx.recv().expect("the fake kubelet started");
}

fn pods_by_row(store: &Path, dir: &Path) -> Vec<Value> {
    duckdb(
        dir,
        &format!(
            "select gpu, gpu_instance_id as gi, pod_namespace, pod_name, container, \
             pod_labels['team'] as team, pod_labels['app.kubernetes.io/name'] as app, \
             cardinality(pod_labels)::INTEGER as labels, count(*) as ticks \
             from {} group by all order by gpu, gi nulls first",
            table_scan(store, "gpu")
        ),
    )
    .into_iter()
    .map(Value::Object)
    .collect()
}

#[test]
fn gpu_rows_name_the_pod_and_container_the_kubelet_allocated_them_to() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let socket = tmp.path().join("kubelet.sock");
    let kubelet = FakeKubelet::default();
    serve_kubelet(socket.clone(), kubelet.clone());
    // The API server's pod list of the node.
    let api = HttpRecorder::start(POD_LIST);
    let store = run_scenario_pipeline(
        tmp.path(),
        SCENARIO,
        TICKS,
        &[
            "--process-interval",
            "100ms",
            "--kubelet-socket",
            socket.to_str().expect("utf-8 path"),
            "--pod-label",
            "team,app.kubernetes.io/name",
            "--kube-api-server",
            &api.url,
        ],
    );
    let t = TICKS;
    assert_eq!(
        pods_by_row(&store, tmp.path()),
        [
            // The A100: both MIG devices are one pod's, in two containers.
            json!({"gpu": 0, "gi": null, "pod_namespace": "infer", "pod_name": "srv",
                   "container": null, "team": null, "app": "vllm", "labels": 1, "ticks": t}),
            json!({"gpu": 0, "gi": 1, "pod_namespace": "infer", "pod_name": "srv",
                   "container": "a", "team": null, "app": "vllm", "labels": 1, "ticks": t}),
            json!({"gpu": 0, "gi": 2, "pod_namespace": "infer", "pod_name": "srv",
                   "container": "b", "team": null, "app": "vllm", "labels": 1, "ticks": t}),
            json!({"gpu": 1, "gi": null, "pod_namespace": "train", "pod_name": "llama-0",
                   "container": "trainer", "team": "pretrain", "app": "llama", "labels": 2,
                   "ticks": t}),
            json!({"gpu": 2, "gi": null, "pod_namespace": "eval", "pod_name": "e-1",
                   "container": "main", "team": "eval", "app": null, "labels": 1, "ticks": t}),
            json!({"gpu": 3, "gi": null, "pod_namespace": null, "pod_name": null,
                   "container": null, "team": null, "app": null, "labels": null, "ticks": t}),
        ]
    );
    // The README's per-team query, through views.sql.
    let per_team = shipped_query(
        &store,
        "",
        "views.sql",
        "SELECT pod_labels['team'] AS team, count(DISTINCT (node, gpu)) AS gpus, \
         round(avg(sm_active_pct), 1) AS sm_active_pct \
         FROM gpu WHERE pod_name IS NOT NULL GROUP BY ALL ORDER BY gpus DESC, team NULLS LAST",
    );
    assert_eq!(
        per_team
            .iter()
            .map(|r| (r["team"].clone(), r["gpus"].clone()))
            .collect::<Vec<_>>(),
        [
            (json!("eval"), json!(1)),
            (json!("pretrain"), json!(1)),
            (Value::Null, json!(1))
        ]
    );
    let calls = kubelet.calls.lock().expect("lock").clone();
    assert_eq!(calls.get("GetAllocatableResources"), Some(&1), "{calls:?}");
    assert!(calls.get("List").is_some_and(|n| *n >= 2), "{calls:?}");
    // This node's pods, from the API server's cache, asked once: the list
    // is recent, and the pods it lacks (the two time-sliced ones) are asked
    // for again only 30 s later.
    let queries: Vec<String> = api
        .received()
        .iter()
        .map(|r| r.target().to_owned())
        .collect();
    assert_eq!(
        queries,
        [format!(
            "/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}&resourceVersion=0"
        )]
    );
}

/// A socket nobody answers on (a kubelet that is down) costs the agent
/// nothing but the pod columns: every row is delivered, without pods.
#[test]
fn a_kubelet_that_does_not_answer_leaves_rows_without_pods() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let socket = tmp.path().join("kubelet.sock");
    // Bound and never accepted on: connecting succeeds at the socket level
    // only until the backlog fills, and no gRPC answer ever comes.
    let listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
    let store = run_scenario_pipeline(
        tmp.path(),
        SCENARIO,
        TICKS,
        &[
            "--process-interval",
            "100ms",
            "--kubelet-socket",
            socket.to_str().expect("utf-8 path"),
        ],
    );
    drop(listener);
    let rows = pods_by_row(&store, tmp.path());
    let t = TICKS;
    assert_eq!(
        rows,
        [
            (0, None),
            (0, Some(1)),
            (0, Some(2)),
            (1, None),
            (2, None),
            (3, None)
        ]
        .map(
            |(gpu, gi)| json!({"gpu": gpu, "gi": gi, "pod_namespace": null,
                "pod_name": null, "container": null, "team": null, "app": null,
                "labels": null, "ticks": t})
        )
    );
}

/// `deploy/kubernetes/`: the manifests kubectl applies.
fn manifests() -> Vec<PathBuf> {
    ["namespace.yaml", "agent.yaml", "collector.yaml"]
        .iter()
        .map(|file| workspace_root().join("deploy/kubernetes").join(file))
        .collect()
}

/// `kubernetes-validate --strict` on `files`: its exit status and output.
fn kube_validate(bin: &Path, files: &[PathBuf]) -> (bool, String) {
    let out = Command::new(bin)
        .args(["--strict", "--kubernetes-version", "1.30.0"])
        .args(files)
        .output()
        .expect("run kubernetes-validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Every manifest passes the Kubernetes API's schemas (strict: no unknown
/// field), as of 1.30, the oldest release the manifests are meant for; and
/// the check fails a manifest with a mistake in it.
#[test]
fn manifests_pass_the_kubernetes_api_schemas() {
    let Some(bin) = provided_path(
        "GPUTEL_KUBE_VALIDATE",
        "scripts/test installs kubernetes-validate (PyPI) and sets it",
    ) else {
        return;
    };
    let files = manifests();
    let (ok, out) = kube_validate(&bin, &files);
    assert!(ok, "{out}");
    for kind in [
        "namespace/gputel",
        "serviceaccount/gputel-agent",
        "clusterrole/gputel-agent",
        "clusterrolebinding/gputel-agent",
        "configmap/gputel-agent",
        "daemonset/gputel-agent",
        "service/gputel-collector",
        "configmap/gputel-collector",
        "statefulset/gputel-collector",
    ] {
        assert!(
            out.contains(&format!("passed for resource {kind} ")),
            "{kind} not checked:\n{out}"
        );
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let agent = std::fs::read_to_string(&files[1]).expect("read agent.yaml");
    let broken = tmp.path().join("agent.yaml");
    std::fs::write(
        &broken,
        agent.replace("hostPID: true", "hostPID: true\n      hostPIDs: true"),
    )
    .expect("write");
    let (ok, out) = kube_validate(&bin, &[broken]);
    assert!(!ok && out.contains("hostPIDs"), "{out}");
}

/// The value of `key: |` in a ConfigMap's `data`, as YAML's literal block
/// reads it: the lines below, one level deeper than the key.
fn config_map_file(manifest: &Path, key: &str) -> String {
    let text = std::fs::read_to_string(manifest).expect("read manifest");
    let mut lines = text.lines();
    let head = format!("  {key}: |");
    lines
        .by_ref()
        .find(|line| *line == head)
        .unwrap_or_else(|| panic!("{key} not in {}", manifest.display()));
    let mut out = String::new();
    for line in lines {
        if let Some(body) = line.strip_prefix("    ") {
            out.push_str(body);
        } else if !line.trim().is_empty() {
            break;
        }
        out.push('\n');
    }
    out.trim_end().to_owned() + "\n"
}

/// The agent's and the collector's ConfigMaps hold configurations the
/// programs start with, and the alert rules are the shipped defaults.
#[test]
fn config_maps_hold_configs_the_programs_start_with() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let files = manifests();

    let agent_toml = tmp.path().join("agent.toml");
    std::fs::write(&agent_toml, config_map_file(&files[1], "agent.toml")).expect("write");
    let out = Command::new(agent_bin())
        .arg("--config")
        .arg(&agent_toml)
        .args(["--once", "--node", "gpu-node-017", "--interval", "10ms"])
        .args(["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
        .output()
        .expect("run agent");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let alerts = config_map_file(&files[2], "alerts.toml");
    assert_eq!(
        alerts,
        std::fs::read_to_string(workspace_root().join("systemd/alerts.toml"))
            .expect("read alerts.toml"),
        "collector.yaml's alerts.toml differs from systemd/alerts.toml"
    );
    let rules = tmp.path().join("alerts.toml");
    std::fs::write(&rules, alerts).expect("write");
    let collector_toml = tmp.path().join("collector.toml");
    let config = config_map_file(&files[2], "collector.toml");
    assert!(
        config.contains("store = \"s3://gputel/telemetry\""),
        "{config}"
    );
    std::fs::write(&collector_toml, config).expect("write");
    // Started here on loopback with a local store and WAL; the rest is the
    // ConfigMap's.
    let mut cmd = Command::new(collector_bin());
    cmd.arg("--config")
        .arg(&collector_toml)
        .args(["--plaintext", "--listen", "127.0.0.1:0", "--store"])
        .arg(tmp.path().join("store"))
        .arg("--wal-dir")
        .arg(tmp.path().join("wal"))
        .arg("--rules")
        .arg(&rules);
    let mut collector = Running::spawn(cmd);
    let line = collector.wait_for_log("listening on ", Duration::from_secs(30));
    assert!(line.contains("flush_interval=10s"), "{line}");
    assert!(
        collector
            .log
            .iter()
            .any(|l| l.contains("loaded 8 alert rules")),
        "{:#?}",
        collector.log
    );
    assert!(
        collector
            .terminate(Duration::from_secs(30))
            .status
            .success()
    );
}
