//! Delivery: Alertmanager's v2 API (`POST /api/v2/alerts`, to every
//! configured instance, as Prometheus does for an HA pair) and an optional
//! plain JSON webhook.
//!
//! Each target has its own worker and outbox, so a slow or failing target
//! never holds up another, nor the evaluation. An outbox keeps the latest
//! version of each alert: while a POST is retried, newer changes wait and go
//! out next, in order. Firing alerts are re-sent every resend interval with
//! `endsAt` four intervals ahead, so Alertmanager resolves them by itself if
//! the collector stops sending; resolved ones carry their real end and are
//! re-sent for [`RESOLVED_RETENTION`], in case an Alertmanager missed them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

/// How long a resolved alert is re-sent after it resolved.
pub const RESOLVED_RETENTION: Duration = Duration::from_secs(15 * 60);
/// Longest time one POST may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Tries per delivery before the outbox moves on (firing alerts come back
/// with the next resend).
const MAX_RETRIES: usize = 5;
/// How long workers get at shutdown to deliver what is queued.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// One alert as Alertmanager's v2 API takes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AmAlert {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    #[serde(rename = "startsAt")]
    pub starts_at: String,
    #[serde(rename = "endsAt")]
    pub ends_at: String,
    #[serde(rename = "generatorURL", skip_serializing_if = "String::is_empty")]
    pub generator_url: String,
}

/// An alert change for the plain webhook.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WebhookAlert {
    /// "firing" or "resolved".
    pub status: &'static str,
    #[serde(flatten)]
    pub alert: AmAlert,
}

/// RFC 3339 with milliseconds, UTC, as Alertmanager prints times.
pub fn rfc3339_us(us: i64) -> String {
    DateTime::<Utc>::from_timestamp_micros(us)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Why a POST failed.
#[derive(Debug, thiserror::Error)]
enum PostError {
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    #[error("answered {status}: {body}")]
    Status {
        status: reqwest::StatusCode,
        body: String,
    },
}

impl PostError {
    /// Whether trying again may help: network errors, 5xx and 429.
    fn retryable(&self) -> bool {
        match self {
            PostError::Http(_) => true,
            PostError::Status { status, .. } => {
                status.is_server_error() || *status == reqwest::StatusCode::TOO_MANY_REQUESTS
            }
        }
    }
}

/// What a worker sends to its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// A JSON array of alerts, as `POST /api/v2/alerts` takes it.
    Alertmanager,
    /// `{"version": "1", "source": "gputel-collector", "alerts": [...]}`.
    Webhook,
}

/// Alerts waiting for one target, latest version per key.
#[derive(Debug, Default)]
struct Outbox {
    queue: Mutex<BTreeMap<String, serde_json::Value>>,
    wake: Notify,
}

impl Outbox {
    fn put(&self, key: String, value: serde_json::Value) {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, value);
        self.wake.notify_one();
    }

    fn remove(&self, key: &str) {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    fn take(&self) -> Vec<serde_json::Value> {
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()))
            .into_values()
            .collect()
    }
}

/// Posts what lands in `outbox` to `url`, with retries, until stopped.
async fn work(
    client: reqwest::Client,
    url: reqwest::Url,
    format: Format,
    outbox: Arc<Outbox>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let stopping = tokio::select! {
            _ = outbox.wake.notified() => false,
            _ = stop.wait_for(|s| *s) => true,
        };
        loop {
            let alerts = outbox.take();
            if alerts.is_empty() {
                break;
            }
            let count = alerts.len();
            let body = match format {
                Format::Alertmanager => serde_json::Value::Array(alerts),
                Format::Webhook => serde_json::json!({
                    "version": "1",
                    "source": "gputel-collector",
                    "alerts": alerts,
                }),
            };
            let body = body.to_string();
            let post = || post(&client, &url, &body);
            let backoff = ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(200))
                .with_max_delay(Duration::from_secs(5))
                .with_max_times(if stopping { 0 } else { MAX_RETRIES })
                .with_jitter();
            let result = post
                .retry(backoff)
                .when(PostError::retryable)
                .notify(
                    |e, after| debug!(%url, error = %e, ?after, "alert delivery failed; retrying"),
                )
                .await;
            match result {
                Ok(()) => debug!(%url, alerts = count, "alerts delivered"),
                Err(e) => warn!(
                    %url, alerts = count, error = %e,
                    "cannot deliver alerts; firing ones are sent again at the next resend"
                ),
            }
        }
        if stopping {
            return;
        }
    }
}

async fn post(client: &reqwest::Client, url: &reqwest::Url, body: &str) -> Result<(), PostError> {
    let response = client
        .post(url.clone())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body.to_owned())
        .send()
        .await?;
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    let body = response.text().await.unwrap_or_default();
    Err(PostError::Status {
        status,
        body: body.chars().take(200).collect(),
    })
}

/// Why the notifier could not start.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("invalid alert target URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("cannot build the HTTP client for alerts: {0}")]
    Client(#[from] reqwest::Error),
}

/// `base` + `/api/v2/alerts`, keeping any path prefix of `base`.
pub fn alertmanager_endpoint(base: &str) -> Result<reqwest::Url, NotifyError> {
    let invalid = |reason: String| NotifyError::Url {
        url: base.to_owned(),
        reason,
    };
    let mut url = reqwest::Url::parse(base).map_err(|e| invalid(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("the scheme must be http or https".into()));
    }
    let path = url.path().trim_end_matches('/').to_owned();
    let path = if path.ends_with("/api/v2/alerts") {
        path
    } else {
        format!("{path}/api/v2/alerts")
    };
    url.set_path(&path);
    Ok(url)
}

fn webhook_endpoint(url: &str) -> Result<reqwest::Url, NotifyError> {
    let parsed = reqwest::Url::parse(url).map_err(|e| NotifyError::Url {
        url: url.to_owned(),
        reason: e.to_string(),
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(NotifyError::Url {
            url: url.to_owned(),
            reason: "the scheme must be http or https".into(),
        });
    }
    Ok(parsed)
}

/// Keeps Alertmanager and the webhook told: what fires, what resolved.
#[derive(Debug)]
pub struct Notifier {
    alertmanagers: Vec<Arc<Outbox>>,
    webhook: Option<Arc<Outbox>>,
    /// Firing alerts by key; `endsAt` is set when they are sent.
    firing: BTreeMap<String, AmAlert>,
    /// Resolved alerts by key, with when they resolved (for the retention).
    resolved: BTreeMap<String, (Instant, AmAlert)>,
    resend_interval: Duration,
    stop: watch::Sender<bool>,
    workers: Vec<JoinHandle<()>>,
}

impl Notifier {
    /// Starts one worker per Alertmanager URL and one for the webhook.
    pub fn start(
        alertmanager_urls: &[String],
        webhook: Option<&str>,
        resend_interval: Duration,
    ) -> Result<Notifier, NotifyError> {
        // reqwest's rustls needs a process-wide crypto provider; ring is the
        // one tonic's TLS already uses. Installing twice is harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("gputel-collector/", env!("CARGO_PKG_VERSION")))
            .build()?;
        let (stop, stop_rx) = watch::channel(false);
        let mut workers = Vec::new();
        let mut spawn = |url: reqwest::Url, format| {
            let outbox = Arc::new(Outbox::default());
            workers.push(tokio::spawn(work(
                client.clone(),
                url,
                format,
                Arc::clone(&outbox),
                stop_rx.clone(),
            )));
            outbox
        };
        let mut alertmanagers = Vec::new();
        for base in alertmanager_urls {
            alertmanagers.push(spawn(alertmanager_endpoint(base)?, Format::Alertmanager));
        }
        let webhook = match webhook {
            Some(url) => Some(spawn(webhook_endpoint(url)?, Format::Webhook)),
            None => None,
        };
        if !alertmanager_urls.is_empty() || webhook.is_some() {
            info!(
                alertmanagers = alertmanager_urls.len(),
                webhook = webhook.is_some(),
                "alerts go to Alertmanager {:?}",
                alertmanager_urls
            );
        }
        Ok(Notifier {
            alertmanagers,
            webhook,
            firing: BTreeMap::new(),
            resolved: BTreeMap::new(),
            resend_interval,
            stop,
            workers,
        })
    }

    /// When a firing alert sent now lapses unless sent again.
    fn firing_ends_at(&self) -> String {
        let ahead = chrono::Duration::from_std(self.resend_interval * 4)
            .unwrap_or(chrono::Duration::hours(1));
        rfc3339(Utc::now() + ahead)
    }

    /// An alert fires (or fired before a restart): sent at once.
    pub fn fire(&mut self, key: String, mut alert: AmAlert) {
        self.resolved.remove(&key);
        alert.ends_at = self.firing_ends_at();
        self.send(&key, &alert);
        if let Some(webhook) = &self.webhook {
            let body = WebhookAlert {
                status: "firing",
                alert: alert.clone(),
            };
            webhook.put(format!("{key} firing {}", alert.starts_at), json(&body));
        }
        self.firing.insert(key, alert);
    }

    /// An alert resolved; `alert.ends_at` holds when.
    pub fn resolve(&mut self, key: String, alert: AmAlert) {
        self.firing.remove(&key);
        self.send(&key, &alert);
        if let Some(webhook) = &self.webhook {
            let body = WebhookAlert {
                status: "resolved",
                alert: alert.clone(),
            };
            webhook.put(format!("{key} resolved {}", alert.starts_at), json(&body));
        }
        self.resolved.insert(key, (Instant::now(), alert));
    }

    /// Another collector took the alert's node over: it is no longer sent
    /// from here, neither firing nor resolved. Alertmanager keeps it until
    /// the `endsAt` last sent, by which time the new collector sends it
    /// (the same labels: one alert, no second notification) if it still
    /// holds.
    pub fn hand_over(&mut self, key: &str) {
        self.firing.remove(key);
        self.resolved.remove(key);
        for outbox in &self.alertmanagers {
            outbox.remove(key);
        }
    }

    /// The alert sent under `key` while it fires.
    pub fn firing(&self, key: &str) -> Option<&AmAlert> {
        self.firing.get(key)
    }

    fn send(&self, key: &str, alert: &AmAlert) {
        let value = json(alert);
        for outbox in &self.alertmanagers {
            outbox.put(key.to_owned(), value.clone());
        }
    }

    /// Sends every firing alert again (with a new `endsAt`), and the
    /// resolved ones still within [`RESOLVED_RETENTION`].
    pub fn resend(&mut self) {
        let ends_at = self.firing_ends_at();
        for alert in self.firing.values_mut() {
            alert.ends_at = ends_at.clone();
        }
        self.resolved
            .retain(|_, (when, _)| when.elapsed() < RESOLVED_RETENTION);
        for (key, alert) in &self.firing {
            self.send(key, alert);
        }
        for (key, (_, alert)) in &self.resolved {
            self.send(key, alert);
        }
    }

    /// Gives the workers a moment to deliver what is queued, then stops them.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for worker in self.workers {
            let abort = worker.abort_handle();
            if tokio::time::timeout(STOP_GRACE, worker).await.is_err() {
                abort.abort();
            }
        }
    }
}

fn json<T: Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_keep_a_path_prefix() {
        let url = |s| alertmanager_endpoint(s).unwrap().to_string();
        assert_eq!(url("http://am:9093"), "http://am:9093/api/v2/alerts");
        assert_eq!(url("http://am:9093/"), "http://am:9093/api/v2/alerts");
        assert_eq!(
            url("https://ops.example/alertmanager/"),
            "https://ops.example/alertmanager/api/v2/alerts"
        );
        assert_eq!(
            url("http://am:9093/api/v2/alerts"),
            "http://am:9093/api/v2/alerts"
        );
        let e = alertmanager_endpoint("am:9093").unwrap_err().to_string();
        assert!(e.starts_with("invalid alert target URL \"am:9093\""), "{e}");
    }

    #[test]
    fn alerts_serialize_as_alertmanager_expects() {
        let alert = AmAlert {
            labels: BTreeMap::from([("alertname".into(), "GpuHot".into())]),
            annotations: BTreeMap::new(),
            starts_at: rfc3339_us(1_795_240_800_123_456),
            ends_at: rfc3339_us(1_795_240_900_000_000),
            generator_url: String::new(),
        };
        assert_eq!(
            serde_json::to_string(&alert).unwrap(),
            r#"{"labels":{"alertname":"GpuHot"},"annotations":{},"startsAt":"2026-11-21T06:00:00.123Z","endsAt":"2026-11-21T06:01:40.000Z"}"#
        );
    }
}
