//! Opens the object store named by `--store`: a local directory, or a URL.

use std::path::Path;
use std::sync::Arc;

use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use object_store::prefix::PrefixStore;

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
    #[error(
        "{store} is not a store URL this build supports ({source}); use a local directory or file:// URL"
    )]
    Url {
        store: String,
        #[source]
        source: object_store::Error,
    },
}

/// Opens `spec`: a path (created when missing) or an object_store URL such as
/// `file:///var/lib/gputel` or `memory://`.
pub fn open(spec: &str) -> Result<Arc<dyn ObjectStore>, StoreError> {
    if spec.contains("://") {
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
        let (store, prefix) = object_store::parse_url(&url).map_err(|source| StoreError::Url {
            store: spec.to_owned(),
            source,
        })?;
        return Ok(if prefix.as_ref().is_empty() {
            Arc::from(store)
        } else {
            Arc::new(PrefixStore::new(store, prefix))
        });
    }
    open_dir(Path::new(spec))
}

fn open_dir(path: &Path) -> Result<Arc<dyn ObjectStore>, StoreError> {
    std::fs::create_dir_all(path).map_err(|source| StoreError::CreateDir {
        path: path.display().to_string(),
        source,
    })?;
    let store = LocalFileSystem::new_with_prefix(path).map_err(|source| StoreError::Open {
        store: path.display().to_string(),
        source,
    })?;
    Ok(Arc::new(store))
}
