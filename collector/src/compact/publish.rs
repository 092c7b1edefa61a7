//! Making a compacted hour visible: on object stores the new file, then the
//! markers, then the deletes; on a local store one directory exchange.

use super::*;

/// S3 and other object stores: markers first, then the compacted files,
/// then the merged files are deleted. Between the uploads and the deletions
/// a listing sees the merged rows twice, never none. A round cut short is
/// finished by the next one: a merged file whose marker names a compacted
/// file that exists is deleted, not merged again.
pub(super) async fn publish_objects(
    store: &dyn ObjectStore,
    table: Table,
    key: PartitionKey,
    markers: &[(PartitionPath, String)],
    outputs: Vec<Output>,
    removed: &[&PartitionPath],
) -> Result<(), CompactError> {
    for (path, marker) in markers {
        put_file(
            store,
            marker_path(path).to_string(),
            Bytes::from(marker.clone()),
        )
        .await?;
    }
    for output in outputs {
        let path = PartitionPath::new(table, key, &output.stem).expect("compacted stems are valid");
        let bytes = tokio::fs::read(&output.path)
            .await
            .map_err(|e| PersistError::Encode {
                path: output.path.display().to_string(),
                source: ParquetError::External(Box::new(e)),
            })?;
        put_file(store, path.to_string(), Bytes::from(bytes)).await?;
    }
    for path in removed {
        let path = path.to_string();
        match store.delete(&ObjectPath::from(path.as_str())).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(source) => return Err(CompactError::Delete { path, source }),
        }
    }
    Ok(())
}

pub(super) fn write_synced(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

pub(super) fn sync_dir(path: &Path) -> io::Result<()> {
    std::fs::File::open(path)?.sync_all()
}

/// A new, empty directory under the store's staging directory.
pub(super) fn staging_dir(root: &Path) -> io::Result<PathBuf> {
    let parent = root.join(STAGING_DIR);
    std::fs::create_dir_all(&parent)?;
    let dir = parent.join(uuid::Uuid::new_v4().simple().to_string());
    std::fs::create_dir(&dir)?;
    Ok(dir)
}

/// Local store: completes the new hour directory `staging` (under the
/// store's staging directory, holding the compacted files) and exchanges it
/// with the live one, then deletes it. Returns false (and changes nothing)
/// when a merged file changed since it was read.
pub(super) fn swap_local(
    root: &Path,
    hour: &str,
    removed: &[(String, Option<Identity>)],
    markers: &[(String, String)],
    staging: &Path,
) -> io::Result<bool> {
    let live = root.join(hour);
    let built = (|| {
        // The new hour directory takes the live one's permissions (a
        // temporary directory is made readable by its owner only).
        std::fs::set_permissions(staging, std::fs::metadata(&live)?.permissions())?;
        for (stem, marker) in markers {
            write_synced(
                &staging.join(format!("{stem}.{MARKER_EXTENSION}")),
                marker.as_bytes(),
            )?;
        }
        Ok::<_, io::Error>(())
    })();
    if let Err(e) = built {
        let _ = std::fs::remove_dir_all(staging);
        return Err(e);
    }
    let merged: HashSet<String> = removed
        .iter()
        .map(|(s, _)| format!("{s}.parquet"))
        .collect();
    let swapped = {
        let _lock = store::lock(root, true)?;
        (|| {
            for (stem, identity) in removed {
                let now = local_identity(&live.join(format!("{stem}.parquet"))).ok();
                if now != *identity {
                    return Ok(false);
                }
            }
            // Whatever else the hour holds (files flushed since the listing,
            // earlier markers) moves along; abandoned uploads ('#') do not.
            for entry in std::fs::read_dir(&live)? {
                let name = entry?.file_name();
                let Some(name) = name.to_str() else { continue };
                if merged.contains(name) || name.contains('#') || staging.join(name).exists() {
                    continue;
                }
                std::fs::hard_link(live.join(name), staging.join(name))?;
            }
            sync_dir(staging)?;
            rustix::fs::renameat_with(
                rustix::fs::CWD,
                &live,
                rustix::fs::CWD,
                staging,
                rustix::fs::RenameFlags::EXCHANGE,
            )?;
            if let Some(parent) = live.parent() {
                sync_dir(parent)?;
            }
            Ok::<_, io::Error>(true)
        })()
    };
    // After the exchange `staging` holds the old hour; before it, the unused new one.
    let removed = std::fs::remove_dir_all(staging);
    let swapped = swapped?;
    removed?;
    Ok(swapped)
}
