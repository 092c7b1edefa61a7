//! Compaction markers: for each flushed file that compaction merged, a small
//! `<stem>.compacted` object beside it names the hash of the merged bytes and
//! the compacted file that now holds them. Compaction writes them; the store
//! reads them so that a flush retried or replayed after a compaction does not
//! write the same rows a second time.

use gputel_schemas::PartitionPath;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use tracing::{info, warn};
use twox_hash::XxHash3_128;

/// Extension of the marker left for each merged file.
pub const MARKER_EXTENSION: &str = "compacted";
/// The marker of a merged file: `<table>/date=…/hour=…/<stem>.compacted`.
pub fn marker_path(path: &PartitionPath) -> ObjectPath {
    ObjectPath::from(format!(
        "{}/{}/{}.{MARKER_EXTENSION}",
        path.table().name(),
        path.key(),
        path.stem()
    ))
}

pub(crate) fn hash_hex(bytes: &[u8]) -> String {
    format!("{:032x}", XxHash3_128::oneshot(bytes))
}

/// Whether `bytes` for `path` are exactly a file that compaction already
/// merged (so writing it again would duplicate its rows).
pub(crate) async fn already_compacted(
    store: &dyn ObjectStore,
    path: &PartitionPath,
    bytes: &[u8],
) -> object_store::Result<bool> {
    let marker = match store.get(&marker_path(path)).await {
        Ok(got) => got.bytes().await?,
        Err(object_store::Error::NotFound { .. }) => return Ok(false),
        Err(e) => return Err(e),
    };
    if merged_into(&marker, &hash_hex(bytes)).is_some() {
        info!(file = %path, "already merged into a compacted file; not written again");
        return Ok(true);
    }
    warn!(
        file = %path,
        "a file of a compacted hour is written again with other rows (a log replay after a \
         crash); rows it shares with the compacted file are now stored twice"
    );
    Ok(false)
}

/// The compacted file a marker names, when the marker is for bytes hashing
/// to `hash`.
pub(crate) fn merged_into<'a>(marker: &'a [u8], hash: &str) -> Option<&'a str> {
    let text = std::str::from_utf8(marker).ok()?;
    let (marked, output) = text.split_once(' ')?;
    (marked == hash).then_some(output.trim())
}
