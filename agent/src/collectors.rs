//! The collectors an agent may stream to, and which one to try next.
//!
//! Each `--collector` URL names one collector, or, where its host is a DNS
//! name, every address the name resolves to (resolved again at the start of
//! each round of attempts, so a name that moves is followed). The agent
//! streams to one address at a time. When a connection fails or a stream is
//! lost it tries the next address at once; only once every address has
//! failed since the last connection does it wait (the caller's back-off)
//! before the next round. Agents start at an address picked by a hash of
//! their node name, so a fleet spreads over the collectors, and stay where
//! they are connected until that connection is lost.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tonic::transport::{ClientTlsConfig, Endpoint, Uri};
use tracing::warn;
use twox_hash::XxHash64;

/// How long a connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the collector URLs are unusable.
#[derive(Debug, thiserror::Error)]
pub enum CollectorsError {
    #[error("no collector given")]
    None,
    #[error("invalid collector URL {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error(
        "collector URLs mix http:// and https:// ({first}, {other}): give every collector \
         with TLS or every one without"
    )]
    MixedSchemes { first: String, other: String },
    #[error("invalid TLS settings for {url}: {source}")]
    Tls {
        url: String,
        #[source]
        source: tonic::transport::Error,
    },
}

/// One configured URL.
#[derive(Debug, Clone)]
struct Target {
    /// As given.
    url: String,
    uri: Uri,
    scheme: String,
    /// Without IPv6 brackets.
    host: String,
    port: u16,
    /// An address already: nothing to resolve.
    literal: bool,
}

/// One address to try.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// For logs: the URL, and the address where it was resolved.
    pub name: String,
    pub endpoint: Endpoint,
}

/// The configured collectors and where the agent is in trying them.
#[derive(Debug, Clone)]
pub struct Collectors {
    targets: Vec<Target>,
    tls: Option<ClientTlsConfig>,
    connect_timeout: Duration,
    /// The addresses of the current round; resolved at its start.
    candidates: Vec<Candidate>,
    /// Index into `candidates` of the next to try.
    next: usize,
    /// Failed attempts since the last connection.
    failed: usize,
    /// Where a fleet's agents start: a hash of the node name.
    spread: u64,
    resolved_once: bool,
}

impl Collectors {
    /// Parses `urls` (a bare `host:port` means `http://host:port`). `tls`,
    /// when given, is used for every address; its server name defaults to
    /// each URL's host. `spread_key` (the node name) picks the first address.
    pub fn new(
        urls: &[String],
        tls: Option<ClientTlsConfig>,
        spread_key: &str,
    ) -> Result<Collectors, CollectorsError> {
        if urls.is_empty() {
            return Err(CollectorsError::None);
        }
        let targets = urls
            .iter()
            .map(|url| parse(url))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(other) = targets.iter().find(|t| t.scheme != targets[0].scheme) {
            return Err(CollectorsError::MixedSchemes {
                first: targets[0].url.clone(),
                other: other.url.clone(),
            });
        }
        let collectors = Collectors {
            targets,
            tls,
            connect_timeout: CONNECT_TIMEOUT,
            candidates: Vec::new(),
            next: 0,
            failed: 0,
            spread: XxHash64::oneshot(0, spread_key.as_bytes()),
            resolved_once: false,
        };
        // Fails on bad TLS settings now rather than at the first connection.
        for target in &collectors.targets {
            collectors.endpoint(target, None)?;
        }
        Ok(collectors)
    }

    /// How long each connection attempt may take [default: 10 s].
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The URLs as given, for logs.
    pub fn urls(&self) -> String {
        self.targets
            .iter()
            .map(|t| t.url.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The address to try now; None when no URL resolves to any address
    /// (logged; the caller waits and asks again).
    pub async fn next(&mut self) -> Option<Candidate> {
        if self.candidates.is_empty() {
            self.resolve().await;
        }
        if self.candidates.is_empty() {
            return None;
        }
        self.next %= self.candidates.len();
        let candidate = self.candidates[self.next].clone();
        self.next = (self.next + 1) % self.candidates.len();
        Some(candidate)
    }

    /// The address last returned by [`Collectors::next`] took the stream.
    pub fn connected(&mut self) {
        self.failed = 0;
    }

    /// The address last returned failed, or its stream was lost. True when
    /// every address has failed since the last connection: the caller backs
    /// off before the next round (addresses are resolved again for it).
    pub fn failed(&mut self) -> bool {
        self.failed += 1;
        if self.failed >= self.candidates.len().max(1) {
            self.failed = 0;
            self.candidates.clear();
            true
        } else {
            false
        }
    }

    /// Resolves every URL into this round's addresses, keeping the place
    /// in the list where it can.
    async fn resolve(&mut self) {
        let mut candidates = Vec::new();
        for target in &self.targets {
            if target.literal {
                match self.endpoint(target, None) {
                    Ok(endpoint) => candidates.push(Candidate {
                        name: target.url.clone(),
                        endpoint,
                    }),
                    Err(e) => warn!(error = %e, "collector skipped"),
                }
                continue;
            }
            let addrs = match tokio::net::lookup_host((target.host.as_str(), target.port)).await {
                Ok(addrs) => addrs.collect::<Vec<SocketAddr>>(),
                Err(e) => {
                    warn!(collector = %target.url, error = %e, "cannot resolve the collector's host name");
                    continue;
                }
            };
            let mut seen = Vec::new();
            for addr in addrs {
                if seen.contains(&addr) {
                    continue;
                }
                seen.push(addr);
                match self.endpoint(target, Some(addr)) {
                    Ok(endpoint) => candidates.push(Candidate {
                        name: format!("{} ({addr})", target.url),
                        endpoint,
                    }),
                    Err(e) => warn!(error = %e, "collector address skipped"),
                }
            }
        }
        if !self.resolved_once && !candidates.is_empty() {
            self.next = (self.spread % candidates.len() as u64) as usize;
            self.resolved_once = true;
        }
        self.candidates = candidates;
    }

    /// The endpoint of `target`, at `addr` when it was resolved: the
    /// connection goes to the address, while TLS checks the certificate
    /// against the URL's host and requests carry the URL's authority.
    fn endpoint(
        &self,
        target: &Target,
        addr: Option<SocketAddr>,
    ) -> Result<Endpoint, CollectorsError> {
        let uri = match addr {
            Some(addr) => format!("{}://{addr}", target.scheme),
            None => target.uri.to_string(),
        };
        let tls_err = |source| CollectorsError::Tls {
            url: target.url.clone(),
            source,
        };
        let mut endpoint = Endpoint::from_shared(uri)
            .map_err(tls_err)?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true);
        if addr.is_some() {
            endpoint = endpoint.origin(target.uri.clone());
        }
        if let Some(tls) = &self.tls {
            let mut tls = tls.clone();
            if addr.is_some() {
                tls = tls.domain_name(target.host.clone());
            }
            endpoint = endpoint.tls_config(tls).map_err(tls_err)?;
        }
        Ok(endpoint)
    }
}

fn parse(url: &str) -> Result<Target, CollectorsError> {
    let bad = |reason: &str| CollectorsError::Url {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let full = if url.contains("://") {
        url.to_owned()
    } else {
        format!("http://{url}")
    };
    let uri = full.parse::<Uri>().map_err(|e| bad(&e.to_string()))?;
    let scheme = uri.scheme_str().unwrap_or_default().to_owned();
    if scheme != "http" && scheme != "https" {
        return Err(bad("the scheme must be http or https"));
    }
    let host = uri
        .host()
        .ok_or_else(|| bad("no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    if !matches!(uri.path(), "" | "/") {
        return Err(bad("a collector URL has no path"));
    }
    let port = uri
        .port_u16()
        .unwrap_or(if scheme == "https" { 443 } else { 80 });
    Ok(Target {
        url: url.to_owned(),
        literal: host.parse::<IpAddr>().is_ok(),
        uri,
        scheme,
        host,
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    async fn names(c: &mut Collectors, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(c.next().await.expect("an address").name);
        }
        out
    }

    #[tokio::test]
    async fn fails_over_to_the_next_address_and_backs_off_after_a_full_round() {
        let mut c = Collectors::new(
            &urls(&[
                "http://127.0.0.1:7001",
                "http://127.0.0.2:7001",
                "http://[::1]:7001",
            ]),
            None,
            "node-a",
        )
        .unwrap();
        let first = c.next().await.unwrap().name;
        // Two failures move on at once; the third completes the round.
        assert!(!c.failed());
        let second = c.next().await.unwrap().name;
        assert!(!c.failed());
        let third = c.next().await.unwrap().name;
        let mut round = vec![first.clone(), second, third];
        round.sort();
        assert_eq!(
            round,
            [
                "http://127.0.0.1:7001",
                "http://127.0.0.2:7001",
                "http://[::1]:7001"
            ]
        );
        assert!(c.failed());
        // The next round goes on from where the last one ended.
        assert_eq!(c.next().await.unwrap().name, first);
        // Connected, then lost: the next address at once.
        c.connected();
        assert!(!c.failed());
    }

    #[tokio::test]
    async fn one_collector_backs_off_after_each_failure() {
        let mut c = Collectors::new(&urls(&["127.0.0.1:7117"]), None, "n").unwrap();
        assert_eq!(c.next().await.unwrap().name, "127.0.0.1:7117");
        assert!(c.failed());
        c.next().await.unwrap();
        c.connected();
        assert!(c.failed());
    }

    #[tokio::test]
    async fn agents_start_spread_over_the_collectors() {
        let list = urls(&[
            "http://127.0.0.1:1",
            "http://127.0.0.1:2",
            "http://127.0.0.1:3",
        ]);
        let mut firsts = std::collections::BTreeMap::new();
        for i in 0..300 {
            let mut c = Collectors::new(&list, None, &format!("gpu-{i:04}")).unwrap();
            *firsts.entry(names(&mut c, 1).await.remove(0)).or_insert(0) += 1;
        }
        assert_eq!(firsts.len(), 3, "{firsts:?}");
        assert!(
            firsts.values().all(|&n| (70..=130).contains(&n)),
            "{firsts:?}"
        );
    }

    #[tokio::test]
    async fn a_host_name_is_every_address_it_resolves_to() {
        let mut c = Collectors::new(&urls(&["http://localhost:7117"]), None, "n").unwrap();
        let candidate = c.next().await.expect("localhost resolves");
        assert!(
            candidate.name == "http://localhost:7117 (127.0.0.1:7117)"
                || candidate.name == "http://localhost:7117 ([::1]:7117)",
            "{}",
            candidate.name
        );
        assert_eq!(
            candidate.endpoint.uri().host(),
            Some(
                candidate
                    .name
                    .split(" (")
                    .nth(1)
                    .unwrap()
                    .trim_end_matches(')')
                    .rsplit_once(':')
                    .unwrap()
                    .0
            )
        );
    }

    #[test]
    fn bad_lists_are_refused_in_words() {
        let err = |list: &[&str]| {
            Collectors::new(&urls(list), None, "n")
                .unwrap_err()
                .to_string()
        };
        assert_eq!(err(&[]), "no collector given");
        assert_eq!(
            err(&["http://a:1", "https://b:1"]),
            "collector URLs mix http:// and https:// (http://a:1, https://b:1): give every \
             collector with TLS or every one without"
        );
        assert_eq!(
            err(&["ftp://a:1"]),
            "invalid collector URL \"ftp://a:1\": the scheme must be http or https"
        );
        assert_eq!(
            err(&["http://a:1/v1"]),
            "invalid collector URL \"http://a:1/v1\": a collector URL has no path"
        );
    }
}
