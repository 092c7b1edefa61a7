//! Opens the object store named by `--store`: a local directory, S3 (or any
//! S3-compatible server), or another object_store URL.
//!
//! A local store's writes exclude its compaction's directory swaps through a
//! lock file: every store is wrapped so that a partition file is put under
//! the lock's shared side, and [`Store::write_lock`] holds it across more than
//! one call (the flusher's check of compaction markers and its put).

use std::fmt;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use gputel_schemas::PartitionPath;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{
    BackoffConfig, ClientOptions, CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload,
    ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions,
    RetryConfig,
};

/// The lock file of a local store, at its root: writers hold it shared,
/// compaction and retention exclusively while they swap directories.
pub const LOCK_FILE: &str = ".gputel.lock";

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the store directory {path}: {source}")]
    CreateDir {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the store {store}: {source}")]
    Open {
        store: String,
        #[source]
        source: object_store::Error,
    },
    #[error("{0} names no bucket; write s3://BUCKET/PREFIX")]
    NoBucket(String),
    #[error(
        "{store} is not a store URL this build supports ({source}); use a local directory, \
         file://, s3:// or memory://"
    )]
    Url {
        store: String,
        #[source]
        source: object_store::Error,
    },
}

/// S3 settings given as flags; each overrides its environment variable.
#[derive(Debug, Clone, Default)]
pub struct S3Options {
    /// `AWS_ENDPOINT_URL`: the server, for S3-compatible stores (MinIO, Ceph, SeaweedFS).
    pub endpoint: Option<String>,
    /// `AWS_REGION`.
    pub region: Option<String>,
    /// `AWS_ALLOW_HTTP=true`: allow an `http://` endpoint.
    pub allow_http: bool,
    /// `AWS_VIRTUAL_HOSTED_STYLE_REQUEST=true`: `bucket.host` instead of `host/bucket`.
    pub virtual_hosted_style: bool,
}

/// Retries of one S3 request: 100 ms doubling to 5 s, at most 5 retries
/// within 30 s. Short on purpose: a failed flush keeps its rows (memory and
/// the write-ahead log) and is retried by the flush loop every 5 s, so a
/// long outage is absorbed there (and by the agents' spools once
/// `--max-unwritten-rows` stops acknowledgements), not inside one request.
pub fn s3_retry() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: 5,
        retry_timeout: Duration::from_secs(30),
    }
}

/// Longest one S3 request may take: an hour's compacted file can be hundreds
/// of megabytes.
pub const S3_REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest a connection to S3 may take to open.
pub const S3_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// An opened store.
#[derive(Debug, Clone)]
pub struct Store {
    /// Where files are read and written.
    pub objects: Arc<dyn ObjectStore>,
    /// The root directory of a local store; None for object stores.
    pub local: Option<PathBuf>,
}

impl Store {
    /// Takes the shared side of a local store's lock until the returned
    /// guard drops (None for object stores, which have no lock): compaction
    /// cannot swap a directory meanwhile.
    pub async fn write_lock(&self) -> std::io::Result<Option<StoreLock>> {
        let Some(root) = self.local.clone() else {
            return Ok(None);
        };
        tokio::task::spawn_blocking(move || lock(&root, false))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?
            .map(Some)
    }
}

/// Opens `spec` with S3 settings from the environment only; see [`open_store`].
pub fn open(spec: &str) -> Result<Arc<dyn ObjectStore>, StoreError> {
    Ok(open_store(spec, &S3Options::default())?.objects)
}

/// Opens `spec`: a path (created when missing) or a URL such as
/// `file:///var/lib/gputel`, `s3://bucket/prefix` or `memory://`.
pub fn open_store(spec: &str, s3: &S3Options) -> Result<Store, StoreError> {
    if !spec.contains("://") {
        return open_dir(Path::new(spec));
    }
    let url = url::Url::parse(spec).map_err(|e| StoreError::Url {
        store: spec.to_owned(),
        source: object_store::Error::Generic {
            store: "url",
            source: Box::new(e),
        },
    })?;
    if url.scheme() == "file" {
        return open_dir(Path::new(url.path()));
    }
    let (inner, prefix): (Arc<dyn ObjectStore>, ObjectPath) = match url.scheme() {
        "s3" | "s3a" => (Arc::new(open_s3(spec, &url, s3)?), prefix_of(&url)),
        _ => {
            let (store, prefix) =
                object_store::parse_url(&url).map_err(|source| StoreError::Url {
                    store: spec.to_owned(),
                    source,
                })?;
            (Arc::from(store), prefix)
        }
    };
    let inner: Arc<dyn ObjectStore> = if prefix.as_ref().is_empty() {
        inner
    } else {
        Arc::new(PrefixStore::new(inner, prefix))
    };
    Ok(Store {
        objects: Arc::new(Guarded { inner, lock: None }),
        local: None,
    })
}

fn prefix_of(url: &url::Url) -> ObjectPath {
    ObjectPath::from(url.path().trim_matches('/'))
}

fn open_s3(
    spec: &str,
    url: &url::Url,
    s3: &S3Options,
) -> Result<object_store::aws::AmazonS3, StoreError> {
    // reqwest's rustls needs a process-wide crypto provider; ring, as for
    // gRPC. Installing fails only when one is installed already, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let bucket = url.host_str().unwrap_or_default();
    if bucket.is_empty() {
        return Err(StoreError::NoBucket(spec.to_owned()));
    }
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_retry(s3_retry())
        .with_client_options(
            ClientOptions::new()
                .with_timeout(S3_REQUEST_TIMEOUT)
                .with_connect_timeout(S3_CONNECT_TIMEOUT)
                .with_allow_http(s3.allow_http || env_true("AWS_ALLOW_HTTP")),
        );
    if let Some(endpoint) = &s3.endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    if let Some(region) = &s3.region {
        builder = builder.with_region(region);
    }
    if s3.virtual_hosted_style {
        builder = builder.with_virtual_hosted_style_request(true);
    }
    builder.build().map_err(|source| StoreError::Open {
        store: spec.to_owned(),
        source,
    })
}

fn env_true(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

fn open_dir(path: &Path) -> Result<Store, StoreError> {
    let create = |source| StoreError::CreateDir {
        path: path.display().to_string(),
        source,
    };
    std::fs::create_dir_all(path).map_err(create)?;
    let path = std::fs::canonicalize(path).map_err(create)?;
    // Made at the first partition write, not here: a store that only ever
    // holds imported job traces stays free of it.
    let lock = path.join(LOCK_FILE);
    let store = LocalFileSystem::new_with_prefix(&path).map_err(|source| StoreError::Open {
        store: path.display().to_string(),
        source,
    })?;
    Ok(Store {
        objects: Arc::new(Guarded {
            inner: Arc::new(store),
            lock: Some(lock),
        }),
        local: Some(path),
    })
}

/// A held lock on a local store; released when dropped.
#[derive(Debug)]
pub struct StoreLock {
    _file: File,
}

/// Takes the lock of the local store at `root`: shared for writers,
/// exclusive for directory swaps. Blocks until granted.
pub fn lock(root: &Path, exclusive: bool) -> std::io::Result<StoreLock> {
    lock_file(&root.join(LOCK_FILE), exclusive)
}

fn lock_file(path: &Path, exclusive: bool) -> std::io::Result<StoreLock> {
    use rustix::fs::{FlockOperation, flock};
    let file = File::options().create(true).append(true).open(path)?;
    let op = if exclusive {
        FlockOperation::LockExclusive
    } else {
        FlockOperation::LockShared
    };
    flock(&file, op)?;
    Ok(StoreLock { _file: file })
}

/// The store every part of the collector writes through.
#[derive(Debug)]
struct Guarded {
    inner: Arc<dyn ObjectStore>,
    /// The local store's lock file.
    lock: Option<PathBuf>,
}

impl fmt::Display for Guarded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

#[async_trait::async_trait]
impl ObjectStore for Guarded {
    /// A partition file is put under the store's shared lock, so that it never
    /// lands in an hour directory that compaction is swapping out.
    async fn put_opts(
        &self,
        location: &ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if PartitionPath::parse(location.as_ref()).is_err() {
            return self.inner.put_opts(location, payload, opts).await;
        }
        let _guard = match &self.lock {
            Some(file) => {
                let file = file.clone();
                Some(
                    tokio::task::spawn_blocking(move || lock_file(&file, false))
                        .await
                        .map_err(|e| std::io::Error::other(e.to_string()))
                        .and_then(|r| r)
                        .map_err(|e| object_store::Error::Generic {
                            store: "LocalFileSystem",
                            source: format!("cannot lock the store to write {location}: {e}")
                                .into(),
                        })?,
                )
            }
            None => None,
        };
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjectPath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(
        &self,
        location: &ObjectPath,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<ObjectPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjectPath>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&ObjectPath>,
        offset: &ObjectPath,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &ObjectPath,
        to: &ObjectPath,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(
        &self,
        from: &ObjectPath,
        to: &ObjectPath,
        options: RenameOptions,
    ) -> object_store::Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_urls_keep_their_prefix_and_flags_override_the_environment() {
        let store = open_store(
            "s3://bucket/some/prefix",
            &S3Options {
                endpoint: Some("http://127.0.0.1:9".into()),
                region: Some("eu-west-1".into()),
                allow_http: true,
                virtual_hosted_style: false,
            },
        )
        .unwrap();
        assert!(store.local.is_none());
        assert_eq!(store.objects.to_string(), "PrefixObjectStore(some/prefix)");
        let err = open_store("s3:///no-bucket", &S3Options::default())
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "s3:///no-bucket names no bucket; write s3://BUCKET/PREFIX"
        );
    }

    #[test]
    fn a_local_store_has_its_root_and_a_lock_made_on_use() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        let store = open_store(root.to_str().unwrap(), &S3Options::default()).unwrap();
        assert_eq!(store.local, Some(std::fs::canonicalize(&root).unwrap()));
        assert!(!root.join(LOCK_FILE).exists());
        // Shared locks coexist; the exclusive one waits for them.
        let a = lock(&root, false).unwrap();
        let b = lock(&root, false).unwrap();
        drop((a, b));
        drop(lock(&root, true).unwrap());
    }
}
