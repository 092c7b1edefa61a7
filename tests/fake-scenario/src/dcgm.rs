//! The `[dcgm]` table of a scenario: what the fake DCGM library
//! (`tests/fake-dcgm`) presents besides the GPUs, which it takes from the
//! same `[[gpu]]` entries as the fake NVML. The format is documented in
//! `tests/fake-nvml/README.md`, under "DCGM".

use serde::Deserialize;

/// DCGM's default host engine address (`DCGM_HE_PORT_NUMBER` is 5555).
pub const DEFAULT_HOST_ENGINE: &str = "127.0.0.1:5555";
/// The version the fake reports when the scenario names none.
pub const DEFAULT_DCGM_VERSION: &str = "4.2.3";

/// What happens when a client watches profiling fields (1001 and up).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Profiler {
    /// The watch succeeds and the fields read the GPUs' activity.
    #[default]
    Free,
    /// Another DCGM, Nsight or a CUPTI tool holds the counters:
    /// `DCGM_ST_PROFILING_LIBRARY_ERROR`, what DCGM answers then.
    Busy,
    /// `DCGM_ST_IN_USE`.
    InUse,
    /// The profiling module cannot load (host engine not root):
    /// `DCGM_ST_MODULE_NOT_LOADED`.
    NoRoot,
    /// `DCGM_ST_PROFILING_NOT_SUPPORTED`.
    Unsupported,
    /// `DCGM_ST_PROFILING_MULTI_PASS`.
    MultiPass,
}

/// Where a host engine listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEngine {
    /// `host:port` over TCP.
    Tcp(String),
    /// A Unix socket's path.
    Unix(String),
}

impl HostEngine {
    /// Whether `dcgmConnect_v2(address, addressIsUnixSocket = unix)` reaches it.
    /// A TCP address without a port means DCGM's default port, 5555.
    pub fn accepts(&self, address: &str, unix: bool) -> bool {
        match self {
            HostEngine::Unix(path) => unix && address == path,
            HostEngine::Tcp(listen) => {
                let with_port = |a: &str| {
                    if a.contains(':') {
                        a.to_owned()
                    } else {
                        format!("{a}:5555")
                    }
                };
                !unix && with_port(address) == with_port(listen)
            }
        }
    }
}

/// The `[dcgm]` table, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DcgmScenario {
    /// `dcgmVersionInfo`'s `version`.
    pub version: String,
    /// Where nv-hostengine listens; None: no host engine runs.
    pub host_engine: Option<HostEngine>,
    /// Whether `dcgmStartEmbedded_v2` works.
    pub embedded: bool,
    /// What a watch of profiling fields meets.
    pub profiler: Profiler,
}

impl Default for DcgmScenario {
    fn default() -> Self {
        DcgmScenario {
            version: DEFAULT_DCGM_VERSION.to_owned(),
            host_engine: Some(HostEngine::Tcp(DEFAULT_HOST_ENGINE.to_owned())),
            embedded: true,
            profiler: Profiler::Free,
        }
    }
}

/// The `[dcgm]` table as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDcgm {
    version: Option<String>,
    host_engine: Option<String>,
    embedded: Option<bool>,
    profiler: Option<Profiler>,
}

impl RawDcgm {
    /// The table with defaults filled in; the error names the key and why.
    pub(crate) fn build(self) -> Result<DcgmScenario, (&'static str, String)> {
        let default = DcgmScenario::default();
        let version = self.version.unwrap_or(default.version);
        let major_ok = version
            .split('.')
            .next()
            .is_some_and(|m| m.parse::<u32>().is_ok());
        if !major_ok || version.len() > 100 || version.contains([';', '\0']) {
            return Err((
                "version",
                format!("\"{version}\" is not a DCGM version like \"4.2.3\""),
            ));
        }
        let host_engine = match self.host_engine.as_deref() {
            None => default.host_engine,
            Some("") => None,
            Some(address) => match address.strip_prefix("unix://") {
                Some(path) if path.starts_with('/') => Some(HostEngine::Unix(path.to_owned())),
                Some(_) => {
                    return Err((
                        "host_engine",
                        format!("\"{address}\": a Unix socket is written unix:///absolute/path"),
                    ));
                }
                None => Some(HostEngine::Tcp(address.to_owned())),
            },
        };
        Ok(DcgmScenario {
            version,
            host_engine,
            embedded: self.embedded.unwrap_or(default.embedded),
            profiler: self.profiler.unwrap_or(default.profiler),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_engines_accept_their_own_address() {
        let tcp = HostEngine::Tcp("127.0.0.1:5555".into());
        assert!(tcp.accepts("127.0.0.1:5555", false));
        assert!(tcp.accepts("127.0.0.1", false));
        assert!(!tcp.accepts("127.0.0.1:5556", false));
        assert!(!tcp.accepts("127.0.0.1:5555", true));
        let unix = HostEngine::Unix("/run/dcgm.sock".into());
        assert!(unix.accepts("/run/dcgm.sock", true));
        assert!(!unix.accepts("/run/dcgm.sock", false));
        assert!(!unix.accepts("/run/other.sock", true));
    }

    #[test]
    fn defaults_and_errors() {
        assert_eq!(RawDcgm::default().build(), Ok(DcgmScenario::default()));
        let none = RawDcgm {
            host_engine: Some(String::new()),
            ..RawDcgm::default()
        };
        assert_eq!(none.build().map(|d| d.host_engine), Ok(None));
        let bad = RawDcgm {
            host_engine: Some("unix://dcgm.sock".into()),
            ..RawDcgm::default()
        };
        assert_eq!(
            bad.build().map(|d| d.host_engine),
            Err((
                "host_engine",
                "\"unix://dcgm.sock\": a Unix socket is written unix:///absolute/path".into()
            ))
        );
        let old = RawDcgm {
            version: Some("v4".into()),
            ..RawDcgm::default()
        };
        assert_eq!(
            old.build().map(|d| d.version),
            Err((
                "version",
                "\"v4\" is not a DCGM version like \"4.2.3\"".into()
            ))
        );
    }
}
