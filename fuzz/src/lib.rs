//! What the fuzz targets share.

use std::path::{Path, PathBuf};

/// Where targets that write files make their scratch directories: tmpfs when
/// there is one, since the log and the spool fsync and the fuzzer runs them
/// many thousand times.
pub fn scratch_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_owned()
    } else {
        std::env::temp_dir()
    }
}
