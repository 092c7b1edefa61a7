//! Which collector sharing the store each node streams to: every collector
//! writes the nodes it has a stream from into the store, and reads the
//! others' before it calls a node silent.
//!
//! A node that fails over (its collector died or restarted, a network path
//! broke) goes quiet on the collector it left while it streams on to
//! another. Without this, the one it left would call it silent after its
//! threshold: a `node_silent` event, the `up` rules' alerts firing for a
//! node that is fine, and its other alerts resolved while the new collector
//! fires them again (a second notification). With it, a quiet node that
//! another collector lists is *moved*: no longer watched here and its
//! alerts handed over (see [`crate::silence::NodeChange::Moved`]).
//!
//! Each collector puts `_gputel/sessions/<collector id>.json` every
//! [`PUBLISH_INTERVAL`] (its nodes and when it wrote them), and an empty
//! list when it stops. A list older than [`FRESH`] is ignored: its writer
//! is gone, and so are its streams.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use gputel_runtime::time::duration_us;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use tokio::sync::{Mutex, watch};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::clock::Clock;
use crate::write::WritePath;

/// Where the lists are, under the store's root (or prefix).
pub const SESSIONS_PREFIX: &str = "_gputel/sessions";
/// How often a collector writes its list.
pub const PUBLISH_INTERVAL: Duration = Duration::from_secs(10);
/// A list older than this is its dead writer's.
pub const FRESH: Duration = Duration::from_secs(60);
/// Lists read within this long are not read again.
const REFRESH: Duration = Duration::from_secs(5);
/// Longest the node watch waits for the lists: a slow store must not hold
/// up the silence of every other node.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// One collector's list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sessions {
    pub collector: String,
    /// When it was written, µs since the epoch by its writer's clock.
    pub written_us: i64,
    /// The nodes it has a stream from, canonical names.
    pub nodes: Vec<String>,
}

/// The lists of the collectors sharing a store.
#[derive(Debug)]
pub struct Peers {
    objects: Arc<dyn ObjectStore>,
    own: String,
    clock: Clock,
    /// Node → the other collector streaming it, and when that was read.
    read: Mutex<Option<(Instant, HashMap<String, String>)>>,
}

impl Peers {
    pub fn new(objects: Arc<dyn ObjectStore>, collector_id: &str, clock: Clock) -> Peers {
        Peers {
            objects,
            own: collector_id.to_owned(),
            clock,
            read: Mutex::new(None),
        }
    }

    fn path(collector: &str) -> ObjectPath {
        ObjectPath::from(format!("{SESSIONS_PREFIX}/{collector}.json"))
    }

    /// Writes this collector's list.
    pub async fn publish(&self, mut nodes: Vec<String>) -> object_store::Result<()> {
        nodes.sort();
        let sessions = Sessions {
            collector: self.own.clone(),
            written_us: self.clock.now_us(),
            nodes,
        };
        let body = serde_json::to_vec(&sessions).expect("a list serializes");
        self.objects
            .put(&Self::path(&self.own), PutPayload::from(Bytes::from(body)))
            .await
            .map(|_| ())
    }

    /// Of `nodes`, those another collector streams now, with its id. A
    /// store that cannot be read says none (the nodes count as silent).
    pub async fn elsewhere(&self, nodes: &[String]) -> HashMap<String, String> {
        let mut read = self.read.lock().await;
        let stale = read.as_ref().is_none_or(|(at, _)| at.elapsed() >= REFRESH);
        if stale {
            match tokio::time::timeout(READ_TIMEOUT, self.read_lists()).await {
                Ok(Ok(lists)) => *read = Some((Instant::now(), lists)),
                Ok(Err(e)) => {
                    warn!(error = %e, "cannot read the other collectors' node lists; quiet nodes count as silent");
                    return HashMap::new();
                }
                Err(_) => {
                    warn!(
                        "the other collectors' node lists took over {READ_TIMEOUT:?} to read; quiet nodes count as silent"
                    );
                    return HashMap::new();
                }
            }
        }
        let Some((_, lists)) = read.as_ref() else {
            return HashMap::new();
        };
        nodes
            .iter()
            .filter_map(|n| lists.get(n).map(|c| (n.clone(), c.clone())))
            .collect()
    }

    async fn read_lists(&self) -> object_store::Result<HashMap<String, String>> {
        let listed: Vec<_> = self
            .objects
            .list(Some(&ObjectPath::from(SESSIONS_PREFIX)))
            .try_collect()
            .await?;
        let fresh_after = self.clock.now_us().saturating_sub(duration_us(FRESH));
        let mut nodes = HashMap::new();
        for meta in listed {
            if meta.location == Self::path(&self.own) {
                continue;
            }
            let bytes = match self.objects.get(&meta.location).await {
                Ok(got) => got.bytes().await?,
                // Removed since the listing.
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(e),
            };
            let Ok(list) = serde_json::from_slice::<Sessions>(&bytes) else {
                debug!(path = %meta.location, "a node list that does not parse is ignored");
                continue;
            };
            if list.written_us < fresh_after || list.collector == self.own {
                continue;
            }
            for node in list.nodes {
                nodes.insert(node, list.collector.clone());
            }
        }
        Ok(nodes)
    }

    /// Writes this collector's list every [`PUBLISH_INTERVAL`] until `stop`,
    /// then an empty one.
    pub async fn run(self: Arc<Self>, shared: Arc<WritePath>, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(PUBLISH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            match self.publish(shared.streaming_nodes()).await {
                Ok(()) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    warn!(error = %e, "cannot write this collector's node list to the store; retried every {PUBLISH_INTERVAL:?}");
                }
                Err(_) => {}
            }
        }
        if let Err(e) = self.publish(Vec::new()).await {
            debug!(error = %e, "cannot clear this collector's node list; it goes stale by itself");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicI64, Ordering};

    use object_store::memory::InMemory;

    use super::*;

    const T0: i64 = 1_767_916_800_000_000;

    #[tokio::test]
    async fn a_node_another_collector_streams_is_elsewhere_until_its_list_goes_stale() {
        let objects: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let now = Arc::new(AtomicI64::new(T0));
        let clock = Clock::Manual(Arc::clone(&now));
        let a = Peers::new(Arc::clone(&objects), "a", clock.clone());
        let b = Peers::new(Arc::clone(&objects), "b", clock.clone());
        a.publish(vec!["n2".into(), "n1".into()]).await.unwrap();
        b.publish(vec!["n3".into()]).await.unwrap();
        let asked = ["n1".to_owned(), "n3".to_owned(), "n9".to_owned()];
        // a's own list does not count for a.
        assert_eq!(
            a.elsewhere(&asked).await,
            HashMap::from([("n3".to_owned(), "b".to_owned())])
        );
        assert_eq!(
            b.elsewhere(&asked).await,
            HashMap::from([("n1".to_owned(), "a".to_owned())])
        );
        // A minute later b's list is stale (b is gone): nothing is elsewhere.
        now.store(T0 + 61_000_000, Ordering::SeqCst);
        let c = Peers::new(Arc::clone(&objects), "c", clock);
        assert!(c.elsewhere(&asked).await.is_empty());
    }
}
