//! One compactor per store: maintenance (retention and compaction) runs only
//! while its caller holds the store's compaction lease.
//!
//! On an object store the lease is one small object, [`LEASE_PATH`], naming
//! its holder and when it expires. It is taken and renewed by conditional
//! writes only: created with `If-None-Match: *` when absent, replaced with
//! `If-Match: <the ETag read>` when expired (or held by the same holder), and
//! renewed with `If-Match: <the ETag of our last write>`. Of two collectors
//! racing for it, S3 lets exactly one write succeed; a holder whose renewal
//! fails has lost it and stops before publishing anything more. Compaction
//! renews before publishing each hour, so a holder that stalled past its
//! expiry (and was replaced) never publishes after it.
//!
//! Expiry is judged by the reader's wall clock against the time the holder
//! wrote, so it assumes clocks that agree to well within the lease's length
//! (minutes; NTP keeps a cluster within milliseconds). Should two compactors
//! still overlap, nothing is lost: compacted files are named after what they
//! merge, merged files are deleted only after their rows are published, and
//! the rows two overlapping rounds both publish are removed by the next
//! round, which keeps one row per key.
//!
//! A local store is one machine's directory: there the lease is an advisory
//! lock (`flock`) on [`LOCAL_LEASE_FILE`] at its root, released with the
//! process, which needs no expiry.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use serde::{Deserialize, Serialize};

use crate::clock::Clock;
use crate::store::Store;

/// The lease object, under the store's root (or prefix). A leading `_`
/// keeps it out of every table's glob and out of Spark's and Hive's listings.
pub const LEASE_PATH: &str = "_gputel/compaction.lease";
/// A local store's lease: a lock file at its root.
pub const LOCAL_LEASE_FILE: &str = ".gputel.compactor.lock";
/// Attempts at taking a lease that other writers keep changing under us.
const ATTEMPTS: usize = 3;

/// What the lease object holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// Who holds it: a collector's id and host, or `compact` and its host and pid.
    pub holder: String,
    /// When it expires unless renewed, µs since the epoch by the holder's clock.
    pub expires_us: i64,
}

/// Why the lease could not be taken or kept.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error(
        "the compaction lease of this store is held by {holder} until {}; \
         that compactor maintains the store",
        crate::alert::notify::rfc3339_us(*expires_us)
    )]
    Held { holder: String, expires_us: i64 },
    #[error(
        "the compaction lease of this store is held by another process on this host ({holder})"
    )]
    HeldLocally { holder: String },
    #[error("lost the compaction lease of this store to {holder}")]
    Lost { holder: String },
    #[error(
        "the store cannot write conditionally ({source}), so one compactor per store cannot be \
         enforced; use S3 or a server with conditional writes (If-None-Match, If-Match)"
    )]
    Unsupported {
        #[source]
        source: object_store::Error,
    },
    #[error("cannot read or write the compaction lease {LEASE_PATH}: {source}")]
    Store {
        #[source]
        source: object_store::Error,
    },
    #[error("cannot lock {path}: {source}")]
    Local {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl LeaseError {
    /// Another compactor holds the lease: not a failure, someone else's turn.
    pub fn is_held(&self) -> bool {
        matches!(
            self,
            LeaseError::Held { .. } | LeaseError::HeldLocally { .. }
        )
    }
}

/// A held compaction lease.
#[derive(Debug)]
pub struct Lease {
    holder: String,
    ttl: Duration,
    clock: Clock,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Object {
        objects: Arc<dyn ObjectStore>,
        /// The version of our last write: renewals are conditional on it.
        version: UpdateVersion,
    },
    /// The locked file: held until dropped.
    Local { _locked: File },
}

impl Lease {
    /// Takes the lease of `store` for `ttl`, unless another holder's is
    /// still running ([`LeaseError::Held`]).
    pub async fn acquire(
        store: &Store,
        holder: &str,
        ttl: Duration,
        clock: Clock,
    ) -> Result<Lease, LeaseError> {
        if let Some(root) = &store.local {
            let file = lock_local(root, holder)?;
            return Ok(Lease {
                holder: holder.to_owned(),
                ttl,
                clock,
                kind: Kind::Local { _locked: file },
            });
        }
        let objects = Arc::clone(&store.objects);
        let path = ObjectPath::from(LEASE_PATH);
        for _ in 0..ATTEMPTS {
            let now_us = clock.now_us();
            let mode = match read(objects.as_ref(), &path).await? {
                None => PutMode::Create,
                Some((record, version)) => {
                    let ours = record.as_ref().is_some_and(|r| r.holder == holder);
                    match record {
                        Some(r) if !ours && r.expires_us > now_us => {
                            return Err(LeaseError::Held {
                                holder: r.holder,
                                expires_us: r.expires_us,
                            });
                        }
                        // Expired, ours from before a restart, or unreadable
                        // (a holder cannot renew what it cannot parse either).
                        _ => PutMode::Update(version),
                    }
                }
            };
            let record = LeaseRecord {
                holder: holder.to_owned(),
                expires_us: now_us.saturating_add(gputel_runtime::time::duration_us(ttl)),
            };
            match write(objects.as_ref(), &path, &record, mode).await {
                Ok(version) => {
                    return Ok(Lease {
                        holder: holder.to_owned(),
                        ttl,
                        clock,
                        kind: Kind::Object { objects, version },
                    });
                }
                // Another writer came between our read and our write.
                Err(object_store::Error::AlreadyExists { .. })
                | Err(object_store::Error::Precondition { .. }) => continue,
                Err(e) => return Err(classify(e)),
            }
        }
        // Still changing under us: whoever changed it holds it now.
        match read(objects.as_ref(), &path).await? {
            Some((Some(r), _)) => Err(LeaseError::Held {
                holder: r.holder,
                expires_us: r.expires_us,
            }),
            _ => Err(LeaseError::Lost {
                holder: "another compactor".to_owned(),
            }),
        }
    }

    /// Who holds this lease.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Extends the lease by its length from now; [`LeaseError::Lost`] when
    /// another holder took it meanwhile (the caller must stop).
    pub async fn renew(&mut self) -> Result<(), LeaseError> {
        let expires_us = self
            .clock
            .now_us()
            .saturating_add(gputel_runtime::time::duration_us(self.ttl));
        self.rewrite(expires_us).await
    }

    /// Gives the lease up at once (it is written expired), so that another
    /// compactor need not wait for it to run out.
    pub async fn release(mut self) -> Result<(), LeaseError> {
        match self.rewrite(0).await {
            // Taken meanwhile: it is not ours to release.
            Ok(()) | Err(LeaseError::Lost { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Writes our record with `expires_us`, conditional on our last write.
    /// Where that condition fails but the lease still names us (a write of
    /// ours whose answer never came: a round cancelled at shutdown, a lost
    /// response), the version read is ours and is written over once.
    async fn rewrite(&mut self, expires_us: i64) -> Result<(), LeaseError> {
        let Kind::Object { objects, version } = &mut self.kind else {
            return Ok(());
        };
        let record = LeaseRecord {
            holder: self.holder.clone(),
            expires_us,
        };
        let path = ObjectPath::from(LEASE_PATH);
        for _ in 0..2 {
            match write(
                objects.as_ref(),
                &path,
                &record,
                PutMode::Update(version.clone()),
            )
            .await
            {
                Ok(new) => {
                    *version = new;
                    return Ok(());
                }
                Err(object_store::Error::Precondition { .. }) => {
                    match read(objects.as_ref(), &path).await? {
                        Some((Some(r), current)) if r.holder == self.holder => *version = current,
                        Some((Some(r), _)) => return Err(LeaseError::Lost { holder: r.holder }),
                        _ => {
                            return Err(LeaseError::Lost {
                                holder: "another compactor".to_owned(),
                            });
                        }
                    }
                }
                Err(e) => return Err(classify(e)),
            }
        }
        Err(LeaseError::Lost {
            holder: "another compactor".to_owned(),
        })
    }
}

/// The lease object and its version; the record is None when it cannot be
/// parsed.
async fn read(
    objects: &dyn ObjectStore,
    path: &ObjectPath,
) -> Result<Option<(Option<LeaseRecord>, UpdateVersion)>, LeaseError> {
    let got = match objects.get(path).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(source) => return Err(LeaseError::Store { source }),
    };
    let version = UpdateVersion {
        e_tag: got.meta.e_tag.clone(),
        version: got.meta.version.clone(),
    };
    let bytes = got
        .bytes()
        .await
        .map_err(|source| LeaseError::Store { source })?;
    let record = serde_json::from_slice(&bytes).ok();
    if record.is_none() {
        tracing::warn!(
            path = LEASE_PATH,
            "the compaction lease does not parse; it is taken over"
        );
    }
    Ok(Some((record, version)))
}

async fn write(
    objects: &dyn ObjectStore,
    path: &ObjectPath,
    record: &LeaseRecord,
    mode: PutMode,
) -> object_store::Result<UpdateVersion> {
    let body = serde_json::to_vec(record).expect("a lease record serializes");
    let put = objects
        .put_opts(
            path,
            PutPayload::from(Bytes::from(body)),
            PutOptions {
                mode,
                ..PutOptions::default()
            },
        )
        .await?;
    Ok(UpdateVersion {
        e_tag: put.e_tag,
        version: put.version,
    })
}

fn classify(source: object_store::Error) -> LeaseError {
    match source {
        object_store::Error::NotImplemented { .. } | object_store::Error::NotSupported { .. } => {
            LeaseError::Unsupported { source }
        }
        source => LeaseError::Store { source },
    }
}

/// Locks the local store's lease file without waiting, and writes the
/// holder into it for the next one to name.
fn lock_local(root: &Path, holder: &str) -> Result<File, LeaseError> {
    use rustix::fs::{FlockOperation, flock};
    let path = root.join(LOCAL_LEASE_FILE);
    let err = |source| LeaseError::Local {
        path: path.display().to_string(),
        source,
    };
    let mut file = File::options()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(err)?;
    if let Err(e) = flock(&file, FlockOperation::NonBlockingLockExclusive) {
        if e == rustix::io::Errno::WOULDBLOCK {
            let holder = std::fs::read_to_string(&path)
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "unknown".to_owned());
            return Err(LeaseError::HeldLocally { holder });
        }
        return Err(err(e.into()));
    }
    file.set_len(0).map_err(err)?;
    writeln!(file, "{holder}").map_err(err)?;
    Ok(file)
}

/// A holder name for this process: `<what>@<host>`.
pub fn holder_name(what: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    if host.is_empty() {
        what.to_owned()
    } else {
        format!("{what}@{host}")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicI64, Ordering};

    use object_store::memory::InMemory;

    use super::*;

    const T0: i64 = 1_767_916_800_000_000;
    const TTL: Duration = Duration::from_secs(60);

    fn memory_store() -> Store {
        Store {
            objects: Arc::new(InMemory::new()),
            local: None,
        }
    }

    fn clock(at: &Arc<AtomicI64>) -> Clock {
        Clock::Manual(Arc::clone(at))
    }

    async fn stored(store: &Store) -> LeaseRecord {
        let bytes = store
            .objects
            .get(&ObjectPath::from(LEASE_PATH))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn one_holder_at_a_time_until_it_expires_or_is_released() {
        let store = memory_store();
        let now = Arc::new(AtomicI64::new(T0));
        let mut a = Lease::acquire(&store, "a", TTL, clock(&now)).await.unwrap();
        assert_eq!(
            stored(&store).await,
            LeaseRecord {
                holder: "a".into(),
                expires_us: T0 + 60_000_000
            }
        );
        match Lease::acquire(&store, "b", TTL, clock(&now)).await {
            Err(LeaseError::Held { holder, expires_us }) => {
                assert_eq!((holder.as_str(), expires_us), ("a", T0 + 60_000_000));
            }
            other => panic!("b took a held lease: {other:?}"),
        }
        // Renewed 50 s on, it runs to 110 s: b still cannot take it at 100 s.
        now.store(T0 + 50_000_000, Ordering::SeqCst);
        a.renew().await.unwrap();
        now.store(T0 + 100_000_000, Ordering::SeqCst);
        assert!(matches!(
            Lease::acquire(&store, "b", TTL, clock(&now)).await,
            Err(LeaseError::Held { .. })
        ));
        // Past its expiry b takes it, and a's next renewal finds it lost.
        now.store(T0 + 111_000_000, Ordering::SeqCst);
        let b = Lease::acquire(&store, "b", TTL, clock(&now)).await.unwrap();
        match a.renew().await {
            Err(LeaseError::Lost { holder }) => assert_eq!(holder, "b"),
            other => panic!("a renewed a lease b holds: {other:?}"),
        }
        // a's release of what it lost leaves b's lease alone.
        a.release().await.unwrap();
        assert_eq!(stored(&store).await.holder, "b");
        // b releases it: c takes it at once.
        b.release().await.unwrap();
        assert_eq!(stored(&store).await.expires_us, 0);
        let c = Lease::acquire(&store, "c", TTL, clock(&now)).await.unwrap();
        assert_eq!(c.holder(), "c");
    }

    #[tokio::test]
    async fn a_holder_retakes_its_own_lease_after_a_restart() {
        let store = memory_store();
        let now = Arc::new(AtomicI64::new(T0));
        let first = Lease::acquire(&store, "a", TTL, clock(&now)).await.unwrap();
        drop(first);
        now.store(T0 + 1_000_000, Ordering::SeqCst);
        Lease::acquire(&store, "a", TTL, clock(&now)).await.unwrap();
        assert_eq!(stored(&store).await.expires_us, T0 + 61_000_000);
    }

    #[tokio::test]
    async fn racing_compactors_get_one_lease_between_them() {
        let store = memory_store();
        let now = Arc::new(AtomicI64::new(T0));
        let mut tasks = Vec::new();
        for i in 0..8 {
            let (store, clock) = (store.clone(), clock(&now));
            tasks.push(tokio::spawn(async move {
                Lease::acquire(&store, &format!("c{i}"), TTL, clock).await
            }));
        }
        let mut held = Vec::new();
        for task in tasks {
            match task.await.unwrap() {
                Ok(lease) => held.push(lease.holder().to_owned()),
                Err(LeaseError::Held { .. }) => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!(stored(&store).await.holder, held[0]);
    }

    #[tokio::test]
    async fn a_write_of_ours_whose_answer_was_lost_does_not_lose_the_lease() {
        let store = memory_store();
        let now = Arc::new(AtomicI64::new(T0));
        let mut a = Lease::acquire(&store, "a", TTL, clock(&now)).await.unwrap();
        // A renewal that reached the store, its answer never read (a round
        // cancelled at shutdown): the lease's version is no longer a's last.
        let ours = LeaseRecord {
            holder: "a".into(),
            expires_us: T0 + 90_000_000,
        };
        store
            .objects
            .put(
                &ObjectPath::from(LEASE_PATH),
                PutPayload::from(serde_json::to_vec(&ours).unwrap()),
            )
            .await
            .unwrap();
        now.store(T0 + 10_000_000, Ordering::SeqCst);
        a.renew().await.unwrap();
        assert_eq!(stored(&store).await.expires_us, T0 + 70_000_000);
        a.release().await.unwrap();
        assert_eq!(stored(&store).await.expires_us, 0);
    }

    #[tokio::test]
    async fn an_unreadable_lease_is_taken_over() {
        let store = memory_store();
        store
            .objects
            .put(&ObjectPath::from(LEASE_PATH), PutPayload::from_static(b"{"))
            .await
            .unwrap();
        let now = Arc::new(AtomicI64::new(T0));
        Lease::acquire(&store, "a", TTL, clock(&now)).await.unwrap();
        assert_eq!(stored(&store).await.holder, "a");
    }

    #[tokio::test]
    async fn a_local_store_is_leased_by_a_lock_that_names_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            crate::store::open_store(dir.path().to_str().unwrap(), &Default::default()).unwrap();
        let now = Arc::new(AtomicI64::new(T0));
        let a = Lease::acquire(&store, "compact@host", TTL, clock(&now))
            .await
            .unwrap();
        match Lease::acquire(&store, "b", TTL, clock(&now)).await {
            Err(LeaseError::HeldLocally { holder }) => assert_eq!(holder, "compact@host"),
            other => panic!("{other:?}"),
        }
        drop(a);
        Lease::acquire(&store, "b", TTL, clock(&now)).await.unwrap();
    }
}
