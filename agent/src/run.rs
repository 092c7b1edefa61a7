//! The agent's wiring: the collector endpoint, the spool, the identity, the
//! local `/metrics` endpoint, the sampling thread, delivery, and systemd's
//! readiness and watchdog. `main` parses the command line and calls [`run`];
//! tests call it in-process.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tonic::transport::{Certificate, ClientTlsConfig, Identity as TlsIdentity};
use tracing::{error, info, warn};

use crate::client::{self, Delivery, Identity};
use crate::collectors::{Collectors, CollectorsError};
use crate::config::Config;
use crate::kube::{self, KubeOptions};
use crate::metrics::{self, Metrics};
use crate::sampling::{self, Gpus, Samplers};
use crate::spool::{Spool, SpoolError};
use crate::systemd::{self, Progress};

/// Batches buffered between the sampling thread and the network task.
const HANDOFF: usize = 64;
/// At shutdown, how long scrapes in progress may take to finish.
const METRICS_SHUTDOWN: Duration = Duration::from_secs(2);

/// Why the agent could not start or stopped early.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Collectors(#[from] CollectorsError),
    #[error("cannot read TLS file {path}: {source}")]
    TlsFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the spool in {dir}: {source}")]
    Spool {
        dir: std::path::PathBuf,
        #[source]
        source: SpoolError,
    },
    #[error(transparent)]
    Metrics(#[from] metrics::BindError),
    #[error("cannot start the sampling thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("the sampling thread panicked")]
    SamplerPanicked,
    #[error("the delivery task failed: {0}")]
    Delivery(#[source] tokio::task::JoinError),
}

/// What a run did: ticks sampled and what became of their batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub ticks: u64,
    pub delivery: Delivery,
}

impl Summary {
    /// The `key=value` line the agent logs and prints when it stops: this
    /// run's batches, then, when the spool held an earlier run's
    /// unacknowledged batches at the start, what became of those.
    pub fn line(&self) -> String {
        let delivery = &self.delivery;
        let mut line = format!(
            "ticks={} batches={} acknowledged={} rejected={} dropped={} unacknowledged={} \
             acknowledged_rows: gpu={} node={} ib={}",
            self.ticks,
            delivery.produced,
            delivery.acknowledged,
            delivery.rejected,
            delivery.dropped,
            delivery.unacknowledged,
            delivery.acknowledged_rows.gpu,
            delivery.acknowledged_rows.node,
            delivery.acknowledged_rows.ib,
        );
        let earlier = &delivery.earlier;
        if earlier.pending > 0 {
            line.push_str(&format!(
                " earlier_runs: earlier_pending={} earlier_acknowledged={} earlier_unacknowledged={}",
                earlier.pending, earlier.acknowledged, earlier.unacknowledged
            ));
        }
        line
    }

    /// Whether everything sampled, and everything left from before, was
    /// delivered.
    pub fn delivered_all(&self) -> bool {
        self.delivery.unacknowledged == 0
            && self.delivery.earlier.unacknowledged == 0
            && self.delivery.dropped == 0
            && self.delivery.rejected == 0
    }
}

/// Runs the agent until `shutdown` completes (or after `ticks` ticks), then
/// delivers what was sampled within the drain timeout. Call on a tokio
/// runtime: the network side runs on it, sampling on a thread of its own.
pub async fn run(
    config: Config,
    ticks: Option<u64>,
    shutdown: impl Future<Output = ()>,
) -> Result<Summary, RunError> {
    let samplers = Samplers::open(&config);
    // On a Kubernetes node, the kubelet says which pod holds each GPU.
    let (samplers, pod_watch) = match samplers.gpus() {
        Gpus::Sampled { .. } => {
            let (tx, rx) = tokio::sync::watch::channel(None);
            let options = KubeOptions {
                socket: config.kubelet_socket.clone(),
                every: config.process_interval,
                node: config.node.clone(),
                labels: config.pod_labels.clone(),
                api_server: config.kube_api_server.clone(),
                service_account_dir: kube::SERVICE_ACCOUNT_DIR.into(),
            };
            let socket_exists = options.socket.exists();
            let watch = tokio::spawn(kube::watch_pods(options, tx));
            // The first rows already name their pods: wait (a little) for
            // the kubelet's first answer.
            if socket_exists {
                let mut first = rx.clone();
                let _ = tokio::time::timeout(kube::FIRST_ANSWER_WAIT, first.changed()).await;
            }
            (samplers.with_pods(rx), Some(watch))
        }
        Gpus::Unavailable(_) | Gpus::Disabled => (samplers, None),
    };
    let tls = match &config.tls {
        Some(tls) => {
            let read = |path: &std::path::Path| {
                std::fs::read(path).map_err(|source| RunError::TlsFile {
                    path: path.to_owned(),
                    source,
                })
            };
            let mut client = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(read(&tls.ca)?))
                .identity(TlsIdentity::from_pem(read(&tls.cert)?, read(&tls.key)?));
            if let Some(name) = &tls.server_name {
                client = client.domain_name(name.clone());
            }
            Some(client)
        }
        None => None,
    };
    let collectors = Collectors::new(&config.collectors, tls, &config.node)?;
    // With a spool, the agent id and the sequence numbers outlive restarts,
    // so the collector recognises what it already has.
    let spool =
        match &config.spool_dir {
            Some(dir) => Some(Spool::open(dir, config.spool_max_bytes).map_err(|source| {
                RunError::Spool {
                    dir: dir.clone(),
                    source,
                }
            })?),
            None => None,
        };
    let first_seq = spool.as_ref().map_or(1, Spool::next_seq);
    let identity = Identity {
        node: config.node.clone(),
        agent_id: spool
            .as_ref()
            .map_or_else(new_agent_id, |s| s.agent_id().to_owned()),
        boot_id: read_trimmed(&config.procfs_root.join("sys/kernel/random/boot_id")),
    };
    if let Some(spool) = &spool
        && !spool.is_empty()
    {
        info!(
            batches = spool.len(),
            "spool holds unacknowledged batches from before; they are sent first"
        );
    }
    // Bound before sampling starts, so a taken port stops the agent at once.
    let metrics_endpoint = match config.metrics_listen {
        Some(addr) => {
            let driver_version = match samplers.gpus() {
                Gpus::Sampled { driver_version, .. } => driver_version.as_deref(),
                Gpus::Unavailable(_) | Gpus::Disabled => None,
            };
            let metrics = Metrics::new(&config.node)
                .with_hostname_label(config.metrics_hostname_label)
                .with_driver_version(driver_version)
                .with_slow_reads(config.slow_read_interval, config.interval);
            Some((metrics::bind(addr)?, Arc::new(metrics)))
        }
        None => None,
    };
    let recorder = metrics_endpoint.as_ref().map(|(_, m)| Arc::clone(m));
    let ready_status = format!(
        "sampling {} every {:?}; delivering to {}",
        samplers.describe(),
        config.interval,
        collectors.urls()
    );
    info!(node = %identity.node, agent_id = %identity.agent_id, collector = %collectors.urls(), interval = ?config.interval, "starting");

    let (batch_tx, batch_rx) = tokio::sync::mpsc::channel(HANDOFF);
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let interval = config.interval;
    let progress = Arc::new(Progress::new());
    let sampling_progress = Arc::clone(&progress);
    let sampler = std::thread::Builder::new()
        .name("sampler".into())
        .spawn(move || {
            sampling::run(
                samplers,
                interval,
                ticks,
                first_seq,
                &stop_rx,
                &sampling_progress,
                |batch| {
                    if let Some(metrics) = &recorder {
                        metrics.record(&batch);
                    }
                    batch_tx.blocking_send(batch).is_ok()
                },
            )
        })
        .map_err(RunError::Thread)?;

    let delivery = {
        let (stop_serving, serving_stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = metrics_endpoint.map(|(listener, metrics)| {
            tokio::spawn(async move {
                let stopped = async {
                    let _ = serving_stopped.await;
                };
                if let Err(e) = metrics::serve(listener, metrics, stopped).await {
                    error!("the /metrics endpoint stopped: {e}");
                }
            })
        });
        let delivering = tokio::spawn(async move {
            match spool {
                Some(spool) => {
                    client::run_with_spool(
                        collectors,
                        identity,
                        batch_rx,
                        spool,
                        config.max_pending_batches,
                        config.drain_timeout,
                    )
                    .await
                }
                None => {
                    client::run(
                        collectors,
                        identity,
                        batch_rx,
                        config.max_pending_batches,
                        config.drain_timeout,
                    )
                    .await
                }
            }
        });
        // NVML is loaded, the spool open, /metrics bound and the sampler
        // running: from here on the agent does its job.
        systemd::ready(&ready_status);
        let watchdog = systemd::watchdog_timeout().map(|timeout| {
            info!(
                ?timeout,
                "petting the systemd watchdog while the sampling loop makes progress"
            );
            tokio::spawn(async move { systemd::pet_watchdog(&progress, timeout).await })
        });
        tokio::pin!(delivering);
        let delivery = tokio::select! {
            delivery = &mut delivering => {
                systemd::stopping("stopping: sampling ended");
                delivery
            }
            () = shutdown => {
                info!("stopping: delivering what was sampled");
                systemd::stopping("stopping: delivering what was sampled");
                let _ = stop_tx.send(());
                delivering.await
            }
        };
        if let Some(watchdog) = watchdog {
            watchdog.abort();
        }
        // /metrics keeps answering while the agent drains, and stops with it.
        let _ = stop_serving.send(());
        if let Some(serving) = serving
            && tokio::time::timeout(METRICS_SHUTDOWN, serving)
                .await
                .is_err()
        {
            warn!("/metrics scrapes still running after {METRICS_SHUTDOWN:?}; cut off");
        }
        delivery.map_err(RunError::Delivery)?
    };
    let ticks = sampler.join().map_err(|_| RunError::SamplerPanicked)?;
    if let Some(pod_watch) = pod_watch {
        pod_watch.abort();
    }
    Ok(Summary { ticks, delivery })
}

/// A fresh id per process: sequence numbers restart at 1 with each start.
fn new_agent_id() -> String {
    let uuid = read_trimmed(std::path::Path::new("/proc/sys/kernel/random/uuid"));
    if uuid.is_empty() {
        format!("{}-{}", std::process::id(), crate::clock::now_us())
    } else {
        uuid
    }
}

fn read_trimmed(path: &std::path::Path) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}
