//! Samplers: one file per source. Each turns what it reads into protocol rows
//! stamped with the tick's shared timestamp. A failing sampler is logged and
//! counted; the others carry on.

pub mod gpu;
pub mod ib;
pub mod node;

use std::path::PathBuf;

/// Why a source could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    /// A file under /proc or /sys could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A file was read but its content is not what the kernel writes there
    /// (truncated, empty, or of another format).
    #[error("cannot parse {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
}
