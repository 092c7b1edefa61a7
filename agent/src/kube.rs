//! Kubernetes attribution: the pod and container each GPU is allocated to.
//!
//! The kubelet's pod-resources API (`List` on
//! `/var/lib/kubelet/pod-resources/kubelet.sock`) names, for every container
//! on the node, the device ids each device plugin allocated to it. NVIDIA's
//! device plugin names a GPU by its UUID (`GPU-…`, the default) or by its
//! index (`DEVICE_ID_STRATEGY=index`), a MIG device by its UUID (`MIG-…`),
//! and a time-sliced replica by one of those followed by `::<replica>`.
//! That is exact where cgroups are a guess: it holds for a pod that has not
//! started a process yet, and for one whose processes NVML cannot list.
//! `GetAllocatableResources` says which devices the kubelet offers at all;
//! the agent logs them at every (re)connection, so that ids it cannot match
//! to a GPU (another device-id strategy) can be seen.
//!
//! Pod labels are not in that API: with `--pod-label`, the agent lists the
//! pods of its node from the API server (in-cluster: the service account's
//! token and CA; from the API server's cache, `resourceVersion=0`) and keeps
//! the labels named. Labels rarely change: the list is asked again only when
//! a pod holding a GPU is not in the last one (at most every
//! [`LABELS_RETRY`]), or that one is [`LABELS_MAX_AGE`] old, so a fleet's
//! agents cost the API server little.
//!
//! A background task polls both at the process cadence and publishes what
//! it read; the sampling thread stamps the latest on every tick's rows
//! without waiting on either. While the kubelet cannot be asked, nothing is
//! published and rows carry only what cgroups say (`pod_uid`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gputel_proto::GpuSample;
use gputel_proto::podresources::pod_resources_lister_client::PodResourcesListerClient;
use gputel_proto::podresources::{
    AllocatableResourcesRequest, ContainerDevices, ListPodResourcesRequest,
};
use gputel_schemas::column::MAX_VALUE_BYTES;
use serde::Deserialize;
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, info, warn};

/// The kubelet's pod-resources socket.
pub const DEFAULT_KUBELET_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// Where Kubernetes mounts a pod's service account.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Resources whose devices are GPUs: NVIDIA's device plugin names them
/// `nvidia.com/gpu`, `nvidia.com/mig-<profile>` and, renamed for
/// time-slicing, `nvidia.com/gpu.shared`.
const GPU_RESOURCE_PREFIX: &str = "nvidia.com/";
/// How long one kubelet or API server call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the agent waits at start for the kubelet's first answer, so
/// that its first rows already name their pods.
pub const FIRST_ANSWER_WAIT: Duration = Duration::from_secs(5);
/// How long a pod list's labels are used for pods it holds.
pub const LABELS_MAX_AGE: Duration = Duration::from_secs(300);
/// How soon the pods are listed again for a pod the last list lacked (one
/// created since, or one the API server does not know, such as a static pod
/// without its mirror).
pub const LABELS_RETRY: Duration = Duration::from_secs(30);
/// Whether the collector stores `s` as a label key or value: at most its
/// limit for a string, no control characters.
pub fn storable_label(s: &str) -> bool {
    s.len() <= MAX_VALUE_BYTES && !s.chars().any(char::is_control)
}

/// One container that a device is allocated to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContainerRef {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// What the kubelet (and the API server) said of the node's devices.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodDevices {
    /// By device id, replica suffix removed: the containers holding it.
    by_device: HashMap<String, BTreeSet<ContainerRef>>,
    /// By (namespace, pod): the labels kept.
    labels: HashMap<(String, String), BTreeMap<String, String>>,
}

impl PodDevices {
    /// The GPU devices of a `List` answer.
    pub fn from_list(answer: &gputel_proto::podresources::ListPodResourcesResponse) -> Self {
        let mut by_device: HashMap<String, BTreeSet<ContainerRef>> = HashMap::new();
        for pod in &answer.pod_resources {
            for container in &pod.containers {
                for id in gpu_device_ids(&container.devices) {
                    by_device.entry(id).or_default().insert(ContainerRef {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: container.name.clone(),
                    });
                }
            }
        }
        PodDevices {
            by_device,
            labels: HashMap::new(),
        }
    }

    /// Whether no GPU is allocated to any container.
    pub fn is_empty(&self) -> bool {
        self.by_device.is_empty()
    }

    /// The pods holding GPUs, for the label lookup.
    fn pods(&self) -> BTreeSet<(String, String)> {
        self.by_device
            .values()
            .flatten()
            .map(|c| (c.namespace.clone(), c.pod.clone()))
            .collect()
    }

    /// The containers holding a device known by any of `ids`.
    fn holders<'a>(&'a self, ids: &[&str], into: &mut BTreeSet<&'a ContainerRef>) {
        for id in ids {
            if let Some(holders) = self.by_device.get(*id) {
                into.extend(holders);
            }
        }
    }

    /// Stamps the pod columns on one tick's GPU rows: a MIG instance row
    /// gets its MIG device's holders, a GPU row those of the GPU (by UUID or
    /// index) and of every one of its MIG devices. A row names a pod only
    /// when one pod holds it, and a container only when one container does.
    pub fn stamp(&self, rows: &mut [GpuSample]) {
        let mut on_instances: HashMap<u32, BTreeSet<&ContainerRef>> = HashMap::new();
        for row in rows.iter_mut().filter(|r| r.gpu_instance_id.is_some()) {
            let mut holders = BTreeSet::new();
            if let Some(mig) = row.mig_uuid.as_deref() {
                self.holders(&[mig], &mut holders);
            }
            on_instances
                .entry(row.gpu)
                .or_default()
                .extend(holders.iter().copied());
            self.stamp_row(row, &holders);
        }
        for row in rows.iter_mut().filter(|r| r.gpu_instance_id.is_none()) {
            let index = row.gpu.to_string();
            let mut holders = on_instances.remove(&row.gpu).unwrap_or_default();
            self.holders(&[row.uuid.as_str(), index.as_str()], &mut holders);
            self.stamp_row(row, &holders);
        }
    }

    fn stamp_row(&self, row: &mut GpuSample, holders: &BTreeSet<&ContainerRef>) {
        let pods: BTreeSet<(&str, &str)> = holders
            .iter()
            .map(|c| (c.namespace.as_str(), c.pod.as_str()))
            .collect();
        let [(namespace, pod)] = pods.into_iter().collect::<Vec<_>>()[..] else {
            return;
        };
        row.pod_namespace = Some(namespace.to_owned());
        row.pod_name = Some(pod.to_owned());
        if let [only] = holders.iter().collect::<Vec<_>>()[..] {
            row.container = Some(only.container.clone());
        }
        if let Some(labels) = self.labels.get(&(namespace.to_owned(), pod.to_owned())) {
            row.pod_labels = labels.clone();
        }
    }
}

/// The ids of the GPU devices among a container's (or the node's
/// allocatable) devices, each once, a time-sliced replica's `::<n>` removed.
fn gpu_device_ids(devices: &[ContainerDevices]) -> BTreeSet<String> {
    devices
        .iter()
        .filter(|d| d.resource_name.starts_with(GPU_RESOURCE_PREFIX))
        .flat_map(|d| &d.device_ids)
        .map(|id| id.split_once("::").map_or(id.as_str(), |(id, _)| id))
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Where and what to ask.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// The kubelet's pod-resources socket.
    pub socket: PathBuf,
    /// Time between two listings.
    pub every: Duration,
    /// The node's name as Kubernetes knows it, for the API server's pod list.
    pub node: String,
    /// The labels to keep; none: the API server is never asked.
    pub labels: Vec<String>,
    /// The API server's URL; None: in-cluster (KUBERNETES_SERVICE_HOST and
    /// _PORT).
    pub api_server: Option<String>,
    /// Where the service account's `token` and `ca.crt` are.
    pub service_account_dir: PathBuf,
}

/// The receiving side: the latest devices, or None while the kubelet cannot
/// be asked.
pub type PodsRx = watch::Receiver<Option<Arc<PodDevices>>>;

/// Polls the kubelet (and, for labels, the API server) every `every`, and
/// publishes what it read; runs until `tx` has no receiver.
pub async fn watch_pods(options: KubeOptions, tx: watch::Sender<Option<Arc<PodDevices>>>) {
    let mut kubelet: Option<PodResourcesListerClient<Channel>> = None;
    // Made at the first need; a configuration that cannot give one (no API
    // server, no CA) is reported once and not tried again.
    let mut api: Option<Option<ApiServer>> = None;
    let mut announced_absent = false;
    let mut failing = false;
    let mut ticker = tokio::time::interval(options.every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if tx.is_closed() {
            return;
        }
        if !options.socket.exists() {
            if !announced_absent {
                info!(
                    socket = %options.socket.display(),
                    "no kubelet pod-resources socket: pods are attributed from cgroups (pod_uid)"
                );
                announced_absent = true;
            }
            kubelet = None;
            tx.send_replace(None);
            continue;
        }
        announced_absent = false;
        if kubelet.is_none() {
            match connect(&options.socket).await {
                Ok(mut client) => {
                    announce_allocatable(&mut client).await;
                    kubelet = Some(client);
                }
                Err(e) => {
                    report(&mut failing, &options.socket, &with_sources(&e));
                    tx.send_replace(None);
                    continue;
                }
            }
        }
        let Some(client) = kubelet.as_mut() else {
            continue;
        };
        let listed = match client.list(ListPodResourcesRequest {}).await {
            Ok(answer) => PodDevices::from_list(answer.get_ref()),
            Err(status) => {
                report(&mut failing, &options.socket, status.message());
                kubelet = None;
                tx.send_replace(None);
                continue;
            }
        };
        if failing {
            info!(socket = %options.socket.display(), "kubelet pod-resources answers again");
            failing = false;
        }
        let mut devices = listed;
        if !options.labels.is_empty() && !devices.is_empty() {
            let api = api.get_or_insert_with(|| {
                ApiServer::new(&options)
                    .inspect_err(|e| warn!("pod labels will not be read: {e}"))
                    .ok()
            });
            if let Some(api) = api.as_mut() {
                devices.labels = api.labels(&options, &devices.pods()).await;
            }
        }
        debug!(
            devices = devices.by_device.len(),
            "kubelet GPU allocations read"
        );
        tx.send_replace(Some(Arc::new(devices)));
    }
}

/// An error and its causes, as one line (tonic's transport error alone
/// says only "transport error").
fn with_sources(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        line.push_str(": ");
        line.push_str(&cause.to_string());
        source = cause.source();
    }
    line
}

/// Logs a kubelet failure once per outage.
fn report(failing: &mut bool, socket: &Path, why: &str) {
    if !*failing {
        warn!(
            socket = %socket.display(),
            "cannot ask the kubelet's pod-resources API ({why}); pods are attributed from cgroups \
             until it answers"
        );
        *failing = true;
    }
}

/// A gRPC channel to the kubelet's Unix socket.
async fn connect(
    socket: &Path,
) -> Result<PodResourcesListerClient<Channel>, tonic::transport::Error> {
    let socket = socket.to_owned();
    // The URI is required and ignored: the connector dials the socket.
    let channel = Endpoint::from_static("http://kubelet")
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(socket).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await?;
    Ok(PodResourcesListerClient::new(channel))
}

/// Logs the GPU devices the kubelet offers, once per connection.
async fn announce_allocatable(client: &mut PodResourcesListerClient<Channel>) {
    match client
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
    {
        Ok(answer) => {
            let ids = gpu_device_ids(&answer.get_ref().devices);
            info!(
                devices = ids.len(),
                ids = ?ids,
                "kubelet pod-resources: GPU devices the kubelet allocates"
            );
        }
        // Kubelets before 1.23 have no GetAllocatableResources; List is all
        // the agent needs.
        Err(status) => debug!(
            "kubelet GetAllocatableResources: {} ({:?})",
            status.message(),
            status.code()
        ),
    }
}

/// Why the API server cannot be asked for labels.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(
        "no API server: set --kube-api-server, or run in a pod (KUBERNETES_SERVICE_HOST unset)"
    )]
    NoServer,
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot build the API server client: {0}")]
    Client(#[from] reqwest::Error),
}

/// The API server, asked for the pods of this node.
#[derive(Debug)]
struct ApiServer {
    client: reqwest::Client,
    url: String,
    token_file: PathBuf,
    /// Logged the last failure (once per outage).
    failing: bool,
    /// The kept labels of every pod of the last list, and when it was read.
    cache: HashMap<(String, String), BTreeMap<String, String>>,
    listed_at: Option<tokio::time::Instant>,
}

#[derive(Debug, Deserialize)]
struct PodList {
    #[serde(default)]
    items: Vec<Pod>,
}

#[derive(Debug, Deserialize)]
struct Pod {
    metadata: PodMeta,
}

#[derive(Debug, Deserialize)]
struct PodMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

impl ApiServer {
    fn new(options: &KubeOptions) -> Result<Self, ApiError> {
        let url = match &options.api_server {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => {
                let host =
                    std::env::var("KUBERNETES_SERVICE_HOST").map_err(|_| ApiError::NoServer)?;
                let port =
                    std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
                // An IPv6 service address needs brackets in a URL.
                if host.contains(':') {
                    format!("https://[{host}]:{port}")
                } else {
                    format!("https://{host}:{port}")
                }
            }
        };
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut client = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .user_agent(concat!("gputel-agent/", env!("CARGO_PKG_VERSION")));
        if url.starts_with("https://") {
            let path = options.service_account_dir.join("ca.crt");
            let pem = std::fs::read(&path).map_err(|source| ApiError::Read { path, source })?;
            client = client.tls_certs_only([reqwest::Certificate::from_pem(&pem)?]);
        }
        Ok(ApiServer {
            client: client.build()?,
            url,
            token_file: options.service_account_dir.join("token"),
            failing: false,
            cache: HashMap::new(),
            listed_at: None,
        })
    }

    /// The kept labels of `pods`: from the last listing of the node's pods
    /// while it holds them all and is recent, else from a new one. When the
    /// API server cannot be asked (logged once per outage), the last
    /// listing's.
    async fn labels(
        &mut self,
        options: &KubeOptions,
        pods: &BTreeSet<(String, String)>,
    ) -> HashMap<(String, String), BTreeMap<String, String>> {
        let age = self.listed_at.map(|at| at.elapsed());
        let missing = pods.iter().any(|pod| !self.cache.contains_key(pod));
        let due = match age {
            None => true,
            Some(age) => age >= LABELS_MAX_AGE || (missing && age >= LABELS_RETRY),
        };
        if due {
            match self.list(options).await {
                Ok(list) => {
                    if self.failing {
                        info!(url = %self.url, "API server answers again: pod labels are read");
                        self.failing = false;
                    }
                    self.cache = keep_labels(list, &options.labels);
                    self.listed_at = Some(tokio::time::Instant::now());
                }
                Err(why) => {
                    if !self.failing {
                        warn!(url = %self.url, "cannot list this node's pods for their labels: {why}");
                        self.failing = true;
                    }
                }
            }
        }
        pods.iter()
            .filter_map(|pod| Some((pod.clone(), self.cache.get(pod)?.clone())))
            .collect()
    }

    async fn list(&self, options: &KubeOptions) -> Result<PodList, String> {
        let mut request = self
            .client
            .get(format!("{}/api/v1/pods", self.url))
            .query(&[
                ("fieldSelector", format!("spec.nodeName={}", options.node)),
                // Served from the API server's cache, not from etcd.
                ("resourceVersion", "0".to_owned()),
            ]);
        // The token is rotated by the kubelet: read it at every request.
        match std::fs::read_to_string(&self.token_file) {
            Ok(token) => request = request.bearer_auth(token.trim()),
            Err(e) if self.url.starts_with("https://") => {
                return Err(format!("cannot read {}: {e}", self.token_file.display()));
            }
            Err(_) => {}
        }
        let response = request.send().await.map_err(|e| e.to_string())?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            let body: String = body.chars().take(200).collect();
            return Err(format!("HTTP {status}: {body}"));
        }
        response.json().await.map_err(|e| e.to_string())
    }
}

/// The labels named in `keep` of every pod listed; a label whose key or
/// value the collector would refuse (too long, control characters) is left
/// out.
fn keep_labels(
    list: PodList,
    keep: &[String],
) -> HashMap<(String, String), BTreeMap<String, String>> {
    list.items
        .into_iter()
        .map(|pod| pod.metadata)
        .map(|meta| {
            let labels = meta
                .labels
                .into_iter()
                .filter(|(key, value)| {
                    keep.contains(key) && storable_label(key) && storable_label(value)
                })
                .collect();
            ((meta.namespace, meta.name), labels)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gputel_proto::podresources::{ContainerResources, ListPodResourcesResponse, PodResources};

    fn devices(resource: &str, ids: &[&str]) -> ContainerDevices {
        ContainerDevices {
            resource_name: resource.to_owned(),
            device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
            topology: None,
        }
    }

    fn pod(
        namespace: &str,
        name: &str,
        containers: Vec<(&str, Vec<ContainerDevices>)>,
    ) -> PodResources {
        PodResources {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            containers: containers
                .into_iter()
                .map(|(name, devices)| ContainerResources {
                    name: name.to_owned(),
                    devices,
                    ..ContainerResources::default()
                })
                .collect(),
            ..PodResources::default()
        }
    }

    fn gpu(index: u32, uuid: &str) -> GpuSample {
        GpuSample {
            gpu: index,
            uuid: uuid.to_owned(),
            ..GpuSample::default()
        }
    }

    fn mig(index: u32, uuid: &str, gi: u32, mig_uuid: &str) -> GpuSample {
        GpuSample {
            gpu_instance_id: Some(gi),
            compute_instance_id: Some(0),
            mig_uuid: Some(mig_uuid.to_owned()),
            ..gpu(index, uuid)
        }
    }

    fn pods_of(rows: &[GpuSample]) -> Vec<(Option<&str>, Option<&str>, Option<&str>)> {
        rows.iter()
            .map(|r| {
                (
                    r.pod_namespace.as_deref(),
                    r.pod_name.as_deref(),
                    r.container.as_deref(),
                )
            })
            .collect()
    }

    #[test]
    fn uuids_indices_replicas_and_mig_devices_name_their_pods() {
        let answer = ListPodResourcesResponse {
            pod_resources: vec![
                // Two GPUs by UUID to one container; a CPU-only container
                // beside it holds none.
                pod(
                    "train",
                    "llama-0",
                    vec![
                        (
                            "trainer",
                            vec![devices("nvidia.com/gpu", &["GPU-a", "GPU-b"])],
                        ),
                        ("sidecar", vec![devices("example.com/nic", &["GPU-c"])]),
                    ],
                ),
                // By index (DEVICE_ID_STRATEGY=index).
                pod(
                    "eval",
                    "e-1",
                    vec![("main", vec![devices("nvidia.com/gpu", &["2"])])],
                ),
                // Time-sliced replicas of one GPU in two pods: shared.
                pod(
                    "dev",
                    "nb-1",
                    vec![("nb", vec![devices("nvidia.com/gpu.shared", &["GPU-d::0"])])],
                ),
                pod(
                    "dev",
                    "nb-2",
                    vec![("nb", vec![devices("nvidia.com/gpu.shared", &["GPU-d::3"])])],
                ),
                // Both MIG devices of GPU 4 to one pod's two containers.
                pod(
                    "infer",
                    "srv",
                    vec![
                        ("a", vec![devices("nvidia.com/mig-1g.10gb", &["MIG-x"])]),
                        ("b", vec![devices("nvidia.com/mig-1g.10gb", &["MIG-y"])]),
                    ],
                ),
            ],
        };
        let kube = PodDevices::from_list(&answer);
        let mut rows = vec![
            gpu(0, "GPU-a"),
            gpu(1, "GPU-b"),
            gpu(2, "GPU-2"),
            gpu(3, "GPU-d"),
            gpu(4, "GPU-e"),
            mig(4, "GPU-e", 1, "MIG-x"),
            mig(4, "GPU-e", 2, "MIG-y"),
            gpu(5, "GPU-c"),
        ];
        kube.stamp(&mut rows);
        assert_eq!(
            pods_of(&rows),
            [
                (Some("train"), Some("llama-0"), Some("trainer")),
                (Some("train"), Some("llama-0"), Some("trainer")),
                (Some("eval"), Some("e-1"), Some("main")),
                (None, None, None),
                (Some("infer"), Some("srv"), None),
                (Some("infer"), Some("srv"), Some("a")),
                (Some("infer"), Some("srv"), Some("b")),
                (None, None, None),
            ]
        );
        assert_eq!(
            kube.pods().into_iter().collect::<Vec<_>>(),
            [
                ("dev".to_owned(), "nb-1".to_owned()),
                ("dev".to_owned(), "nb-2".to_owned()),
                ("eval".to_owned(), "e-1".to_owned()),
                ("infer".to_owned(), "srv".to_owned()),
                ("train".to_owned(), "llama-0".to_owned()),
            ]
        );
    }

    #[test]
    fn labels_kept_are_the_named_storable_ones() {
        let list: PodList = serde_json::from_str(
            r#"{"kind":"PodList","items":[
                {"metadata":{"name":"llama-0","namespace":"train","uid":"u1",
                  "labels":{"team":"pretrain","app":"llama","pod-template-hash":"abc"}}},
                {"metadata":{"name":"web","namespace":"train","labels":{"team":"web"}}},
                {"metadata":{"name":"e-1","namespace":"eval","labels":{"team":"x\u0007y"}}},
                {"metadata":{"name":"bare","namespace":"eval"}}
            ]}"#,
        )
        .unwrap();
        let kept = keep_labels(list, &["team".into(), "app".into()]);
        let get = |ns: &str, name: &str| kept.get(&(ns.to_owned(), name.to_owned())).cloned();
        assert_eq!(
            get("train", "llama-0"),
            Some(BTreeMap::from([
                ("app".to_owned(), "llama".to_owned()),
                ("team".to_owned(), "pretrain".to_owned()),
            ]))
        );
        assert_eq!(
            get("train", "web"),
            Some(BTreeMap::from([("team".to_owned(), "web".to_owned())]))
        );
        assert_eq!(
            get("eval", "e-1"),
            Some(BTreeMap::new()),
            "a control character"
        );
        assert_eq!(get("eval", "bare"), Some(BTreeMap::new()));
    }
}
