//! Samplers: one file per source, each behind the one [`Sampler`] contract.
//! At every tick each enabled sampler adds its rows, stamped with the tick's
//! shared timestamp, and its failures to the same [`Tick`]. A failure costs
//! only the readings it concerns: the sampler fills the rest, and the other
//! samplers carry on. Logging them is the sampling loop's job, not theirs.

pub mod dcgm;
pub mod gpu;
pub mod ib;
pub mod node;
pub mod rapl;

use std::path::PathBuf;

use gputel_proto::Batch;

/// A source of samples, named as in the `sources` setting.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Every GPU, through NVML.
    Gpu,
    /// The host's CPU, memory and load, through /proc.
    Node,
    /// InfiniBand ports, through /sys.
    Ib,
}

impl Source {
    /// Every source, in the order they are sampled.
    pub const ALL: [Source; 3] = [Source::Gpu, Source::Node, Source::Ib];

    /// The name used in the configuration and in log lines.
    pub fn name(self) -> &'static str {
        match self {
            Source::Gpu => "gpu",
            Source::Node => "node",
            Source::Ib => "ib",
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One source's reader. It keeps what it needs between ticks (previous
/// counters for rates, open handles) and adds one tick's rows to `tick`.
pub trait Sampler: Send + std::fmt::Debug {
    /// Which source this is.
    fn source(&self) -> Source;
    /// Adds this tick's rows to `tick.batch`, stamped `tick.ts_us`, and every
    /// reading that failed to `tick.errors`, one error each; a reading that
    /// failed leaves its field unset, never zero.
    fn sample(&mut self, tick: &mut Tick);
}

/// What the samplers found at one tick: the rows (the batch's `seq` is left
/// at 0) and what could not be read.
#[derive(Debug, Default)]
pub struct Tick {
    /// The tick's one timestamp, in microseconds since the epoch.
    pub ts_us: i64,
    pub batch: Batch,
    pub errors: Vec<SampleError>,
    /// Whether every GPU's compute processes were listed at this tick, so
    /// that a GPU without one is known to be idle (they are listed at a
    /// slower cadence than the metrics).
    pub processes_listed: bool,
}

impl Tick {
    /// An empty tick at `ts_us`.
    pub fn new(ts_us: i64) -> Self {
        Self {
            ts_us,
            ..Self::default()
        }
    }
}

/// Why a reading could not be taken.
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
    /// NVML failed to give a GPU metric, for a reason other than "not supported".
    #[error(transparent)]
    Gpu(#[from] gpu::GpuError),
    /// DCGM failed to give the profiling fields.
    #[error("DCGM: {0}")]
    Dcgm(#[from] dcgm::DcgmError),
}

/// A sysfs or procfs attribute as text; None when the file does not exist
/// (an absent attribute is not an error, and not zero).
pub(crate) fn read_attr(path: &std::path::Path) -> Result<Option<String>, SampleError> {
    match std::fs::read(path) {
        Ok(bytes) => String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| SampleError::Parse {
                path: path.to_owned(),
                reason: "the file is not text".to_owned(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SampleError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}
