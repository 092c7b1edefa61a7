//! InfiniBand sampler: one [`IbPortSample`] per port found under
//! `<sysfs>/class/infiniband/<device>/ports/<port>/`, with its counters as
//! the port states them (rates are derived from them where they are read:
//! the `ib` view, the fleet report).
//!
//! A machine without InfiniBand has no `class/infiniband` directory; that is a
//! normal state, not an error. A port whose files cannot be read is reported
//! and the other ports are still sampled.
//!
//! # Which file is the truth, per counter
//!
//! The IBA counters live in `counters/` (the PMA's PortCounters, 32 bits
//! wide on old kernels and HCAs, where they stop at 2^32 - 1). Kernels
//! before 4.5 and some drivers also publish the 64-bit PortCountersExtended
//! in `counters_ext/` (`port_xmit_data_64`, `port_unicast_rcv_packets`, …).
//! Newer kernels fill `counters/` itself from PortCountersExtended when the
//! HCA has it, so a legacy file may well hold a value above 2^32.
//!
//! Real captures show that `counters_ext/` cannot be trusted blindly:
//! node_exporter's mlx4 fixture has `counters_ext/port_rcv_packets_64` at 0
//! while `counters/port_rcv_packets` reads 6825908347, and port 2's whole
//! `counters_ext/` is byte-for-byte port 1's. Hence, for each of the eight
//! counters that exist in both places (data, packets, unicast and multicast
//! packets, each way):
//!
//! 1. `counters/<name>` when it holds a number other than 2^32 - 1: it is
//!    what the kernel states for this port, 64-bit where the HCA counts so.
//! 2. Otherwise (saturated, absent, or `N/A (no PMA)`), `counters_ext/<name>`
//!    unless it is untrustworthy: it reads 0 while the legacy counter is
//!    non-zero, or the port's whole `counters_ext/` set is byte-identical to
//!    another port's of the same device (then it cannot be told whose values
//!    they are, and neither port uses them). An untrustworthy file is
//!    ignored, said once per port at info level, and never reported as
//!    traffic.
//! 3. Otherwise the saturated legacy value (readers give it no rate), or null.
//!
//! Every other counter (errors, waits, discards) exists only in `counters/`,
//! and the driver's own in `hw_counters/`. A file that reads `N/A (no PMA)`
//! (iWARP and RoCE providers without a performance-management agent) is
//! absent, like a missing file: null, not zero and not an error. The data
//! counters count 4-byte words whatever the link width; the samples hold
//! bytes.
//!
//! Wherever node_exporter reports a port's counter in its non-legacy series
//! (`node_infiniband_*` without `legacy_`), the value here is the same; it
//! differs only for a saturated legacy counter with a trustworthy
//! `counters_ext` twin, where node_exporter shows 2^32 - 1 and this sampler
//! the 64-bit value (`tests/tests/node_exporter.rs` checks the captures).

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use gputel_proto::IbPortSample;

use super::{SampleError, Sampler, Source, Tick, read_attr};

/// Where the devices live, relative to the sysfs root.
const CLASS_DIR: &str = "class/infiniband";
/// The legacy counters (IBA PortCounters), and the only home of the error counters.
const COUNTERS_DIR: &str = "counters";
/// 64-bit counters (IBA PortCountersExtended) that old kernels and drivers
/// publish beside the legacy ones; see the module docs for when they are used.
const COUNTERS_EXT_DIR: &str = "counters_ext";
/// Where drivers put their own counters, beside the IBA ones.
const HW_COUNTERS_DIR: &str = "hw_counters";
/// The value at which a 32-bit legacy counter stops counting.
const SATURATED_32: u64 = u32::MAX as u64;
/// What a counter file holds when the port has no performance-management
/// agent to ask (iWARP providers such as i40iw).
const NO_PMA: &str = "N/A (no PMA)";
/// How long the device's identity files (firmware version, …) are kept
/// before they are read again.
const IDENTITY_REFRESH_US: i64 = 60_000_000;

/// One counter that exists in `counters/` and `counters_ext/`: its file
/// names and what one unit of it is worth.
#[derive(Debug)]
struct Counter {
    /// File name under `counters/`.
    legacy: &'static str,
    /// File name under `counters_ext/`.
    ext: &'static str,
    /// Bytes per unit: the data counters count 4-byte words, packets count 1.
    unit: u64,
}

/// The counters with a `counters_ext/` twin, in [`Traffic`] order: xmit
/// bytes, rcv bytes, xmit packets, rcv packets (these four get rates), then
/// unicast and multicast packets each way.
const COUNTERS: [Counter; 8] = [
    Counter {
        legacy: "port_xmit_data",
        ext: "port_xmit_data_64",
        unit: 4,
    },
    Counter {
        legacy: "port_rcv_data",
        ext: "port_rcv_data_64",
        unit: 4,
    },
    Counter {
        legacy: "port_xmit_packets",
        ext: "port_xmit_packets_64",
        unit: 1,
    },
    Counter {
        legacy: "port_rcv_packets",
        ext: "port_rcv_packets_64",
        unit: 1,
    },
    Counter {
        legacy: "unicast_xmit_packets",
        ext: "port_unicast_xmit_packets",
        unit: 1,
    },
    Counter {
        legacy: "unicast_rcv_packets",
        ext: "port_unicast_rcv_packets",
        unit: 1,
    },
    Counter {
        legacy: "multicast_xmit_packets",
        ext: "port_multicast_xmit_packets",
        unit: 1,
    },
    Counter {
        legacy: "multicast_rcv_packets",
        ext: "port_multicast_rcv_packets",
        unit: 1,
    },
];

/// One value per counter of [`COUNTERS`].
type Traffic<T> = [T; 8];

/// Counters under `counters/` only, in `IbPortSample` order. Reported as
/// read: they are small and rarely move, so no rates.
const ERROR_COUNTERS: [&str; 14] = [
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_xmit_discards",
    "port_xmit_wait",
    "port_rcv_constraint_errors",
    "port_xmit_constraint_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "port_rcv_discards",
];

/// Driver counters under `hw_counters/` (mlx5), in `IbPortSample` order:
/// receive buffer overruns and the causes of transport retransmissions.
const HW_COUNTERS: [&str; 6] = [
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "local_ack_timeout_err",
    "rnr_nak_retry_err",
    "implied_nak_seq_err",
];

/// Samples every InfiniBand port on the machine.
#[derive(Debug)]
pub struct IbSampler {
    root: PathBuf,
    /// What was already said about each port, by (device, port).
    ports: HashMap<(String, u32), PortHistory>,
    /// Each device's identity, and the tick it was read at.
    devices: HashMap<String, (Identity, i64)>,
    /// Whether "no InfiniBand here" was already logged.
    absence_logged: bool,
}

#[derive(Debug, Default)]
struct PortHistory {
    /// Whether each counter's saturation was already logged.
    saturation_logged: Traffic<bool>,
    /// Whether each counter's `counters_ext` twin was already said to read 0.
    ext_zero_logged: Traffic<bool>,
    /// Whether the port's `counters_ext` was already said to be a copy.
    ext_copy_logged: bool,
}

/// A device's identity files; None where a file is absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Identity {
    board_id: Option<String>,
    fw_ver: Option<String>,
    hca_type: Option<String>,
    node_guid: Option<String>,
}

/// A counter as chosen by the truth rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RawCounter {
    value: u64,
    /// A legacy 32-bit counter stuck at 2^32 - 1: it no longer moves.
    saturated: bool,
    from_ext: bool,
}

/// What one counter file says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileValue {
    /// No such file, or `N/A (no PMA)`.
    Absent,
    Value(u64),
}

/// The chosen reading of one counter, and whether its `counters_ext` twin
/// was passed over for reading 0 against a non-zero legacy counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Choice {
    raw: Option<RawCounter>,
    ext_zero_ignored: bool,
}

/// One port found under `class/infiniband`.
#[derive(Debug)]
struct PortDir {
    device: String,
    port: u32,
    dir: PathBuf,
}

impl IbSampler {
    /// A sampler reading `<sysfs_root>/class/infiniband` (the root is `/sys` in production).
    pub fn new(sysfs_root: impl Into<PathBuf>) -> Self {
        Self {
            root: sysfs_root.into(),
            ports: HashMap::new(),
            devices: HashMap::new(),
            absence_logged: false,
        }
    }

    /// Every port, sorted by (device, port); None when there are no
    /// InfiniBand devices at all or their directory cannot be listed.
    fn list_ports(&mut self, errors: &mut Vec<SampleError>) -> Option<Vec<PortDir>> {
        let class = self.root.join(CLASS_DIR);
        let devices = match fs::read_dir(&class) {
            Ok(devices) => devices,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                if !self.absence_logged {
                    tracing::debug!(
                        "{} does not exist: no InfiniBand ports to sample",
                        class.display()
                    );
                    self.absence_logged = true;
                }
                self.ports.clear();
                self.devices.clear();
                return None;
            }
            Err(source) => {
                errors.push(SampleError::Read {
                    path: class,
                    source,
                });
                return None;
            }
        };
        self.absence_logged = false;

        let mut ports = Vec::new();
        for device in devices {
            let device = match device {
                Ok(device) => device,
                Err(source) => {
                    errors.push(SampleError::Read {
                        path: class.clone(),
                        source,
                    });
                    continue;
                }
            };
            let name = device.file_name().to_string_lossy().into_owned();
            // Joining paths (rather than asking the DirEntry) follows the
            // symlinks sysfs puts in class/infiniband.
            let ports_dir = device.path().join("ports");
            let entries = match fs::read_dir(&ports_dir) {
                Ok(entries) => entries,
                Err(source) => {
                    errors.push(SampleError::Read {
                        path: ports_dir,
                        source,
                    });
                    continue;
                }
            };
            for entry in entries {
                let entry = match entry {
                    Ok(entry) => entry,
                    Err(source) => {
                        errors.push(SampleError::Read {
                            path: ports_dir.clone(),
                            source,
                        });
                        continue;
                    }
                };
                let path = entry.path();
                match entry
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<u32>().ok())
                {
                    Some(port) => ports.push(PortDir {
                        device: name.clone(),
                        port,
                        dir: path,
                    }),
                    None => errors.push(SampleError::Parse {
                        path,
                        reason: "a port directory's name should be its port number".to_owned(),
                    }),
                }
            }
        }
        ports.sort_by(|a, b| (&a.device, a.port).cmp(&(&b.device, b.port)));
        Some(ports)
    }

    /// The identity of `device`, read again once it is older than
    /// [`IDENTITY_REFRESH_US`] (a firmware update changes `fw_ver`).
    fn identity(&mut self, device: &str, ts_us: i64, errors: &mut Vec<SampleError>) -> Identity {
        if let Some((identity, read_at)) = self.devices.get(device)
            && ts_us.saturating_sub(*read_at) < IDENTITY_REFRESH_US
            && ts_us >= *read_at
        {
            return identity.clone();
        }
        let dir = self.root.join(CLASS_DIR).join(device);
        let mut read = |name: &str| {
            read_attr(&dir.join(name))
                .map(|text| text.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()))
                .unwrap_or_else(|e| {
                    errors.push(e);
                    None
                })
        };
        let identity = Identity {
            board_id: read("board_id"),
            fw_ver: read("fw_ver"),
            hca_type: read("hca_type"),
            node_guid: read("node_guid"),
        };
        self.devices
            .insert(device.to_owned(), (identity.clone(), ts_us));
        identity
    }
}

impl Sampler for IbSampler {
    fn source(&self) -> Source {
        Source::Ib
    }

    /// One IbPortSample per port found under `<root>/class/infiniband/*/ports/*/`,
    /// sorted by (device, port); none when there is no `class/infiniband`
    /// directory (no IB is normal, not an error). A broken port adds its error
    /// and the other ports are still sampled.
    fn sample(&mut self, tick: &mut Tick) {
        let Some(ports) = self.list_ports(&mut tick.errors) else {
            return;
        };
        // Ports that disappeared are forgotten: if one comes back, its first
        // reading starts afresh instead of looking like a counter reset.
        self.ports
            .retain(|key, _| ports.iter().any(|p| key.0 == p.device && key.1 == p.port));
        self.devices
            .retain(|device, _| ports.iter().any(|p| *device == p.device));

        let copied = copied_ext_sets(&ports);
        for p in ports {
            let identity = self.identity(&p.device, tick.ts_us, &mut tick.errors);
            let history = self.ports.entry((p.device.clone(), p.port)).or_default();
            let ext_copied = copied.contains(&(p.device.clone(), p.port));
            if ext_copied && !history.ext_copy_logged {
                tracing::info!(
                    "{} is byte-for-byte another port's of {}: it cannot be told whose values \
                     these are, so this port's counters come from counters/ only",
                    p.dir.join(COUNTERS_EXT_DIR).display(),
                    p.device
                );
            }
            history.ext_copy_logged = ext_copied;
            let port = PortRead {
                ts_us: tick.ts_us,
                dir: &p.dir,
                ext_copied,
            };
            if let Some(mut sample) = port.sample(history, &mut tick.errors) {
                sample.device = p.device;
                sample.port = p.port;
                sample.board_id = identity.board_id;
                sample.fw_ver = identity.fw_ver;
                sample.hca_type = identity.hca_type;
                sample.node_guid = identity.node_guid;
                tick.batch.ib.push(sample);
            }
        }
    }
}

/// The ports whose `counters_ext/` holds exactly the same files with exactly
/// the same bytes as another port's of the same device.
fn copied_ext_sets(ports: &[PortDir]) -> HashSet<(String, u32)> {
    let sets: Vec<_> = ports
        .iter()
        .map(|p| read_ext_set(&p.dir.join(COUNTERS_EXT_DIR)))
        .collect();
    let mut copied = HashSet::new();
    for (i, a) in ports.iter().enumerate() {
        for (j, b) in ports.iter().enumerate().skip(i + 1) {
            if a.device == b.device && sets[i].is_some() && sets[i] == sets[j] {
                copied.insert((a.device.clone(), a.port));
                copied.insert((b.device.clone(), b.port));
            }
        }
    }
    copied
}

/// Every file of a `counters_ext/` directory with its bytes, sorted by
/// name; None when there is no such directory, it is empty, or it cannot
/// be read whole (then the counters' own reads report what is wrong).
fn read_ext_set(dir: &Path) -> Option<Vec<(std::ffi::OsString, Vec<u8>)>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir).ok()? {
        let entry = entry.ok()?;
        files.push((entry.file_name(), fs::read(entry.path()).ok()?));
    }
    files.sort();
    (!files.is_empty()).then_some(files)
}

/// One port's directory at one tick.
struct PortRead<'a> {
    ts_us: i64,
    dir: &'a Path,
    /// Whether its `counters_ext/` is another port's copy (so never used).
    ext_copied: bool,
}

impl PortRead<'_> {
    /// Reads the port; `device` and `port` and the device's identity are
    /// left for the caller. None (and an error pushed) when its `state`
    /// cannot be read, as a row without it would say nothing about the port.
    /// Any other file that fails leaves its field unset and pushes its error.
    fn sample(
        &self,
        history: &mut PortHistory,
        errors: &mut Vec<SampleError>,
    ) -> Option<IbPortSample> {
        let dir = self.dir;
        let (state_id, state) = match read_state(dir) {
            Ok(state) => state,
            Err(e) => {
                errors.push(e);
                return None;
            }
        };
        let phys = read_phys_state(dir).unwrap_or_else(|e| {
            errors.push(e);
            None
        });
        let link_layer = read_attr(&dir.join("link_layer"))
            .map(|t| t.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()))
            .unwrap_or_else(|e| {
                errors.push(e);
                None
            });
        let rate_gbps = read_rate(dir).unwrap_or_else(|e| {
            errors.push(e);
            None
        });

        let mut totals: Traffic<Option<u64>> = [None; 8];
        for (i, counter) in COUNTERS.iter().enumerate() {
            let choice = match read_counter(dir, counter, self.ext_copied) {
                Ok(choice) => choice,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            if choice.ext_zero_ignored && !history.ext_zero_logged[i] {
                tracing::info!(
                    "{} reads 0 while {} does not: ignored, as it cannot be this port's count",
                    counter_path(dir, counter, true).display(),
                    counter_path(dir, counter, false).display()
                );
            }
            history.ext_zero_logged[i] = choice.ext_zero_ignored;
            let Some(raw) = choice.raw else {
                // Absent is not zero: the field stays unset.
                continue;
            };
            let Some(total) = raw.value.checked_mul(counter.unit) else {
                errors.push(SampleError::Parse {
                    path: counter_path(dir, counter, raw.from_ext),
                    reason: format!("{} is too large to be a byte count", raw.value),
                });
                continue;
            };
            totals[i] = Some(total);
            if raw.saturated && !history.saturation_logged[i] {
                tracing::debug!(
                    "{} is saturated at 2^32-1 and no longer counts until the port's counters are reset",
                    counter_path(dir, counter, false).display()
                );
            }
            history.saturation_logged[i] = raw.saturated;
        }

        let [
            symbol_error,
            link_downed,
            link_error_recovery,
            port_rcv_errors,
            port_xmit_discards,
            port_xmit_wait,
            port_rcv_constraint_errors,
            port_xmit_constraint_errors,
            port_rcv_remote_physical_errors,
            port_rcv_switch_relay_errors,
            local_link_integrity_errors,
            excessive_buffer_overrun_errors,
            vl15_dropped,
            port_rcv_discards,
        ] = read_plain_counters(&dir.join(COUNTERS_DIR), ERROR_COUNTERS, errors);
        let [
            hw_out_of_buffer,
            hw_out_of_sequence,
            hw_packet_seq_err,
            hw_local_ack_timeout_err,
            hw_rnr_nak_retry_err,
            hw_implied_nak_seq_err,
        ] = read_plain_counters(&dir.join(HW_COUNTERS_DIR), HW_COUNTERS, errors);
        let [
            xmit_bytes,
            rcv_bytes,
            xmit_packets,
            rcv_packets,
            unicast_xmit_packets,
            unicast_rcv_packets,
            multicast_xmit_packets,
            multicast_rcv_packets,
        ] = totals;
        let (phys_state_id, phys_state) = phys.unzip();
        Some(IbPortSample {
            ts_us: self.ts_us,
            state,
            state_id: Some(state_id),
            phys_state,
            phys_state_id,
            link_layer,
            rate_gbps,
            xmit_bytes,
            rcv_bytes,
            xmit_packets,
            rcv_packets,
            unicast_xmit_packets,
            unicast_rcv_packets,
            multicast_xmit_packets,
            multicast_rcv_packets,
            symbol_error,
            link_downed,
            link_error_recovery,
            port_rcv_errors,
            port_xmit_discards,
            port_xmit_wait,
            port_rcv_constraint_errors,
            port_xmit_constraint_errors,
            port_rcv_remote_physical_errors,
            port_rcv_switch_relay_errors,
            local_link_integrity_errors,
            excessive_buffer_overrun_errors,
            vl15_dropped,
            port_rcv_discards,
            hw_out_of_buffer,
            hw_out_of_sequence,
            hw_packet_seq_err,
            hw_local_ack_timeout_err,
            hw_rnr_nak_retry_err,
            hw_implied_nak_seq_err,
            ..IbPortSample::default()
        })
    }
}

/// The counters `names` under `dir`, each None when absent or unreadable
/// (its error added to `errors`).
fn read_plain_counters<const N: usize>(
    dir: &Path,
    names: [&str; N],
    errors: &mut Vec<SampleError>,
) -> [Option<u64>; N] {
    names.map(|name| {
        read_plain_counter(&dir.join(name)).unwrap_or_else(|e| {
            errors.push(e);
            None
        })
    })
}

/// One counter that exists only in one place; None when its file does not
/// exist or reads `N/A (no PMA)`.
fn read_plain_counter(path: &Path) -> Result<Option<u64>, SampleError> {
    match read_file_value(path)? {
        FileValue::Absent => Ok(None),
        FileValue::Value(v) => Ok(Some(v)),
    }
}

/// What a counter file says: absent (no file, or `N/A (no PMA)`) or its value.
fn read_file_value(path: &Path) -> Result<FileValue, SampleError> {
    let Some(text) = read_attr(path)? else {
        return Ok(FileValue::Absent);
    };
    if text.trim() == NO_PMA {
        return Ok(FileValue::Absent);
    }
    parse_counter(&text)
        .map(FileValue::Value)
        .ok_or_else(|| SampleError::Parse {
            reason: format!("expected an unsigned integer, found {text:?}"),
            path: path.to_owned(),
        })
}

/// The port's state number and name from `state`, e.g. (4, "ACTIVE") from "4: ACTIVE".
fn read_state(dir: &Path) -> Result<(u32, String), SampleError> {
    let path = dir.join("state");
    let text = read_attr(&path)?.ok_or_else(|| SampleError::Read {
        path: path.clone(),
        source: ErrorKind::NotFound.into(),
    })?;
    parse_state(&text).ok_or_else(|| SampleError::Parse {
        reason: format!("expected \"<number>: <NAME>\" such as \"4: ACTIVE\", found {text:?}"),
        path,
    })
}

fn parse_state(text: &str) -> Option<(u32, String)> {
    let (number, name) = parse_numbered(text)?;
    let well_formed = name
        .bytes()
        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    well_formed.then_some((number, name))
}

/// The physical state from `phys_state`, e.g. (5, "LinkUp") from "5: LinkUp";
/// None when the file does not exist.
fn read_phys_state(dir: &Path) -> Result<Option<(u32, String)>, SampleError> {
    let path = dir.join("phys_state");
    let Some(text) = read_attr(&path)? else {
        return Ok(None);
    };
    parse_numbered(&text)
        .map(Some)
        .ok_or_else(|| SampleError::Parse {
            reason: format!("expected \"<number>: <Name>\" such as \"5: LinkUp\", found {text:?}"),
            path,
        })
}

/// "<number>: <name>" as the kernel writes states ("7: Phy Test" has a space).
fn parse_numbered(text: &str) -> Option<(u32, String)> {
    let (number, name) = text.trim_end().split_once(": ")?;
    let number = number.parse::<u8>().ok()?;
    let well_formed = !name.is_empty()
        && !name.starts_with(' ')
        && name.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
    well_formed.then(|| (u32::from(number), name.to_owned()))
}

/// The link rate in Gb/s from `rate`; None when the file does not exist.
fn read_rate(dir: &Path) -> Result<Option<f64>, SampleError> {
    let path = dir.join("rate");
    let Some(text) = read_attr(&path)? else {
        return Ok(None);
    };
    match parse_rate(&text) {
        Some(gbps) => Ok(Some(gbps)),
        None => Err(SampleError::Parse {
            reason: format!(
                "expected \"<number> Gb/sec (<width> <speed>)\" such as \"400 Gb/sec (4X NDR)\", found {text:?}"
            ),
            path,
        }),
    }
}

fn parse_rate(text: &str) -> Option<f64> {
    let (number, rest) = text.trim_end().split_once(' ')?;
    if !rest.starts_with("Gb/sec") {
        return None;
    }
    number
        .parse::<f64>()
        .ok()
        .filter(|r| r.is_finite() && *r >= 0.0)
}

/// Reads one counter by the truth rule of the module docs.
fn read_counter(dir: &Path, counter: &Counter, ext_copied: bool) -> Result<Choice, SampleError> {
    let legacy = read_file_value(&counter_path(dir, counter, false))?;
    if let FileValue::Value(value) = legacy
        && value != SATURATED_32
    {
        return Ok(Choice {
            raw: Some(RawCounter {
                value,
                saturated: false,
                from_ext: false,
            }),
            ext_zero_ignored: false,
        });
    }
    let mut ext_zero_ignored = false;
    if !ext_copied {
        match read_file_value(&counter_path(dir, counter, true))? {
            // Only a saturated legacy counter gets here with a value, and it is non-zero.
            FileValue::Value(0) if legacy != FileValue::Absent => ext_zero_ignored = true,
            FileValue::Value(value) => {
                return Ok(Choice {
                    raw: Some(RawCounter {
                        value,
                        saturated: false,
                        from_ext: true,
                    }),
                    ext_zero_ignored: false,
                });
            }
            FileValue::Absent => {}
        }
    }
    let raw = match legacy {
        FileValue::Value(value) => Some(RawCounter {
            value,
            saturated: true,
            from_ext: false,
        }),
        FileValue::Absent => None,
    };
    Ok(Choice {
        raw,
        ext_zero_ignored,
    })
}

fn counter_path(dir: &Path, counter: &Counter, ext: bool) -> PathBuf {
    if ext {
        dir.join(COUNTERS_EXT_DIR).join(counter.ext)
    } else {
        dir.join(COUNTERS_DIR).join(counter.legacy)
    }
}

fn parse_counter(text: &str) -> Option<u64> {
    let digits = text.trim_end();
    // u64's parser accepts a leading '+', which the kernel never writes.
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures");
    /// 2024-06-12T16:00:00Z, an arbitrary tick.
    const TS: i64 = 1_718_208_000_000_000;
    const SECOND_US: i64 = 1_000_000;

    fn fixture_sys() -> PathBuf {
        Path::new(FIXTURES).join("sys")
    }

    /// A temporary sysfs root holding a copy of the fixture tree.
    fn temp_sys() -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("create temp dir");
        copy_tree(&fixture_sys(), root.path());
        root
    }

    fn copy_tree(from: &Path, to: &Path) {
        fs::create_dir_all(to).expect("create dir");
        for entry in fs::read_dir(from).expect("list fixture dir") {
            let entry = entry.expect("fixture dir entry");
            let target = to.join(entry.file_name());
            if entry.path().is_dir() {
                copy_tree(&entry.path(), &target);
            } else {
                fs::copy(entry.path(), target).expect("copy fixture file");
            }
        }
    }

    fn port_dir(root: &Path, device: &str) -> PathBuf {
        root.join(CLASS_DIR).join(device).join("ports/1")
    }

    fn write(path: PathBuf, text: &str) {
        fs::write(path, text).expect("write file");
    }

    /// One tick of `sampler` through the [`Sampler`] contract.
    fn sample(sampler: &mut IbSampler, ts_us: i64) -> (Vec<IbPortSample>, Vec<SampleError>) {
        let mut tick = Tick::new(ts_us);
        sampler.sample(&mut tick);
        (tick.batch.ib, tick.errors)
    }

    fn find<'a>(samples: &'a [IbPortSample], device: &str) -> &'a IbPortSample {
        samples
            .iter()
            .find(|s| s.device == device)
            .unwrap_or_else(|| panic!("no sample for {device} in {samples:?}"))
    }

    fn traffic(s: &IbPortSample) -> [Option<u64>; 4] {
        [s.xmit_bytes, s.rcv_bytes, s.xmit_packets, s.rcv_packets]
    }

    #[test]
    fn reads_every_fixture_port_in_order_with_bytes_from_words() {
        let (out, errors) = sample(&mut IbSampler::new(fixture_sys()), TS);
        assert!(errors.is_empty(), "{errors:?}");
        let keys: Vec<_> = out.iter().map(|s| (s.device.as_str(), s.port)).collect();
        assert_eq!(
            keys,
            [("mlx5_0", 1), ("mlx5_1", 1), ("mlx5_2", 1), ("mlx5_3", 1)]
        );
        assert_eq!(
            out[0],
            IbPortSample {
                ts_us: TS,
                device: "mlx5_0".to_owned(),
                port: 1,
                state: "ACTIVE".to_owned(),
                state_id: Some(4),
                phys_state: Some("LinkUp".to_owned()),
                phys_state_id: Some(5),
                link_layer: Some("InfiniBand".to_owned()),
                board_id: Some("MT_0000000838".to_owned()),
                fw_ver: Some("28.39.1002".to_owned()),
                hca_type: Some("MT4129".to_owned()),
                node_guid: Some("946d:ae03:00f1:2a3c".to_owned()),
                rate_gbps: Some(400.0),
                xmit_bytes: Some(4 * 1_984_466_120_583_717),
                rcv_bytes: Some(4 * 1_984_460_973_326_841),
                xmit_packets: Some(9_412_287_715_021),
                rcv_packets: Some(9_412_301_880_214),
                symbol_error: Some(3),
                link_downed: Some(1),
                link_error_recovery: Some(2),
                port_rcv_errors: Some(7),
                port_xmit_discards: Some(11),
                port_xmit_wait: Some(8_231_947_811),
                unicast_xmit_packets: Some(9_412_287_715_009),
                unicast_rcv_packets: Some(9_412_301_879_027),
                multicast_xmit_packets: Some(12),
                multicast_rcv_packets: Some(1187),
                port_rcv_constraint_errors: Some(0),
                port_xmit_constraint_errors: Some(0),
                port_rcv_remote_physical_errors: Some(0),
                port_rcv_switch_relay_errors: Some(0),
                local_link_integrity_errors: Some(0),
                excessive_buffer_overrun_errors: Some(0),
                vl15_dropped: Some(0),
                port_rcv_discards: None,
                hw_out_of_buffer: Some(41),
                hw_out_of_sequence: Some(5),
                hw_packet_seq_err: Some(2),
                hw_local_ack_timeout_err: Some(3),
                hw_rnr_nak_retry_err: Some(1),
                hw_implied_nak_seq_err: Some(4),
            }
        );
        assert!(
            out.iter()
                .all(|s| s.ts_us == TS && s.state == "ACTIVE" && s.rate_gbps == Some(400.0))
        );
    }

    #[test]
    fn counters_ext_is_preferred_over_saturated_legacy_counters() {
        // mlx5_2's counters/ hold 2^32-1 everywhere; counters_ext/ the real values.
        let (out, _) = sample(&mut IbSampler::new(fixture_sys()), TS);
        let s = find(&out, "mlx5_2");
        assert_eq!(s.xmit_bytes, Some(4 * 1_988_130_255_106_479));
        assert_eq!(s.rcv_bytes, Some(4 * 1_988_127_733_540_382));
        assert_eq!(s.xmit_packets, Some(9_427_519_846_660));
        assert_eq!(s.rcv_packets, Some(9_427_523_309_571));
    }

    #[test]
    fn an_absent_counter_is_none_not_zero_and_not_an_error() {
        let mut sampler = IbSampler::new(fixture_sys());
        let (first, errors) = sample(&mut sampler, TS);
        assert!(errors.is_empty(), "{errors:?}");
        let s = find(&first, "mlx5_3");
        assert_eq!(s.rcv_packets, None);
        assert_eq!(s.xmit_packets, Some(9_380_044_117_935));
        let (second, _) = sample(&mut sampler, TS + SECOND_US);
        assert_eq!(traffic(find(&second, "mlx5_3")), traffic(s));
    }

    #[test]
    fn each_tick_reads_the_counters_anew() {
        let root = temp_sys();
        let mut sampler = IbSampler::new(root.path());
        let (first, _) = sample(&mut sampler, TS);

        let mlx5_0 = port_dir(root.path(), "mlx5_0");
        write(mlx5_0.join("counters/port_xmit_data"), "1984466370583717\n"); // +250_000_000 words
        write(mlx5_0.join("counters/port_rcv_data"), "1984461098326841\n"); // +125_000_000 words
        write(mlx5_0.join("counters/port_xmit_packets"), "9412288203271\n"); // +488_250
        write(mlx5_0.join("counters/port_rcv_packets"), "9412302124339\n"); // +244_125
        let mlx5_2 = port_dir(root.path(), "mlx5_2");
        write(
            mlx5_2.join("counters_ext/port_rcv_data_64"),
            "1988127736040382\n",
        ); // +2_500_000 words

        let (out, errors) = sample(&mut sampler, TS + SECOND_US);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            traffic(find(&out, "mlx5_0")),
            [
                Some(4 * 1_984_466_370_583_717),
                Some(4 * 1_984_461_098_326_841),
                Some(9_412_288_203_271),
                Some(9_412_302_124_339)
            ]
        );
        assert_eq!(
            find(&out, "mlx5_2").rcv_bytes,
            Some(4 * 1_988_127_736_040_382)
        );
        assert_eq!(
            traffic(find(&out, "mlx5_1")),
            traffic(find(&first, "mlx5_1"))
        );
    }

    #[test]
    fn a_reset_or_saturated_counter_is_reported_as_the_port_states_it() {
        let root = temp_sys();
        let mut sampler = IbSampler::new(root.path());
        sample(&mut sampler, TS);
        let mlx5_0 = port_dir(root.path(), "mlx5_0");
        // Cleared (e.g. `perfquery -R`): the new, lower value.
        write(mlx5_0.join("counters/port_xmit_data"), "500000000\n");
        // A legacy counter stopped at 2^32-1, with no counters_ext twin.
        write(mlx5_0.join("counters/port_rcv_data"), "4294967295\n");
        let (out, errors) = sample(&mut sampler, TS + SECOND_US);
        assert!(errors.is_empty(), "{errors:?}");
        let s = find(&out, "mlx5_0");
        assert_eq!(s.xmit_bytes, Some(4 * 500_000_000));
        assert_eq!(s.rcv_bytes, Some(4 * 4_294_967_295));
    }

    #[test]
    fn no_infiniband_directory_is_zero_ports_and_no_error() {
        let root = tempfile::tempdir().expect("create temp dir");
        let mut sampler = IbSampler::new(root.path());
        for tick in 0..2 {
            let (out, errors) = sample(&mut sampler, TS + tick * SECOND_US);
            assert!(out.is_empty());
            assert!(errors.is_empty(), "{errors:?}");
        }
    }

    #[test]
    fn a_truncated_state_costs_only_that_port() {
        let root = temp_sys();
        let state = port_dir(root.path(), "mlx5_1").join("state");
        for truncated in ["4", "4:", "", "4: "] {
            write(state.clone(), truncated);
            let (out, errors) = sample(&mut IbSampler::new(root.path()), TS);
            match errors.as_slice() {
                [SampleError::Parse { path, .. }] => assert_eq!(*path, state, "{truncated:?}"),
                other => panic!("{truncated:?}: expected one parse error, got {other:?}"),
            }
            let devices: Vec<_> = out.iter().map(|s| s.device.as_str()).collect();
            assert_eq!(devices, ["mlx5_0", "mlx5_2", "mlx5_3"]);
        }
    }

    #[test]
    fn a_broken_counter_file_is_an_error_and_leaves_only_its_field_unset() {
        let root = temp_sys();
        let mut sampler = IbSampler::new(root.path());
        sample(&mut sampler, TS);
        let broken = port_dir(root.path(), "mlx5_0").join("counters/port_xmit_data");
        for content in ["", "\n", "12ab\n", "-5\n", "+5\n", "18446744073709551616\n"] {
            write(broken.clone(), content);
            let (out, errors) = sample(&mut sampler, TS + SECOND_US);
            match errors.as_slice() {
                [SampleError::Parse { path, .. }] => assert_eq!(*path, broken, "{content:?}"),
                other => panic!("{content:?}: expected one parse error, got {other:?}"),
            }
            assert_eq!(out.len(), 4);
            let s = find(&out, "mlx5_0");
            assert_eq!(s.xmit_bytes, None);
            assert_eq!(s.rcv_bytes, Some(4 * 1_984_460_973_326_841));
        }
    }

    #[test]
    fn a_disappeared_port_is_forgotten() {
        let root = temp_sys();
        let mut sampler = IbSampler::new(root.path());
        sample(&mut sampler, TS);
        let device = root.path().join(CLASS_DIR).join("mlx5_3");
        let parked = root.path().join("mlx5_3.parked");
        fs::rename(&device, &parked).expect("remove device");
        let (out, _) = sample(&mut sampler, TS + SECOND_US);
        assert_eq!(out.len(), 3);
        fs::rename(&parked, &device).expect("restore device");
        write(device.join("ports/1/counters/port_xmit_data"), "10\n");
        let (out, _) = sample(&mut sampler, TS + 2 * SECOND_US);
        assert_eq!(find(&out, "mlx5_3").xmit_bytes, Some(40));
    }

    #[test]
    fn symlinked_devices_are_followed() {
        // The real layout: class/infiniband/<dev> -> ../../devices/pci.../infiniband/<dev>.
        let root = tempfile::tempdir().expect("create temp dir");
        let real = root
            .path()
            .join("devices/pci0000:00/0000:00:01.0/0000:1a:00.0/infiniband/mlx5_0");
        copy_tree(&fixture_sys().join(CLASS_DIR).join("mlx5_0"), &real);
        let class = root.path().join(CLASS_DIR);
        fs::create_dir_all(&class).expect("create class dir");
        std::os::unix::fs::symlink(
            "../../devices/pci0000:00/0000:00:01.0/0000:1a:00.0/infiniband/mlx5_0",
            class.join("mlx5_0"),
        )
        .expect("create symlink");
        let (out, errors) = sample(&mut IbSampler::new(root.path()), TS);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].rcv_bytes, Some(4 * 1_984_460_973_326_841));
    }

    #[test]
    fn rates_parse_from_what_the_kernel_writes() {
        assert_eq!(parse_rate("400 Gb/sec (4X NDR)\n"), Some(400.0));
        assert_eq!(parse_rate("2.5 Gb/sec (1X SDR)\n"), Some(2.5));
        assert_eq!(parse_rate("200 Gb/sec (2X NDR)"), Some(200.0));
        assert_eq!(parse_rate(""), None);
        assert_eq!(parse_rate("400"), None);
        assert_eq!(parse_rate("fast Gb/sec (4X NDR)"), None);
        assert_eq!(parse_rate("400 Mb/sec"), None);
    }

    #[test]
    fn a_garbage_rate_is_an_error_and_the_port_is_still_sampled() {
        let root = temp_sys();
        let rate = port_dir(root.path(), "mlx5_0").join("rate");
        write(rate.clone(), "400 Gb");
        let (out, errors) = sample(&mut IbSampler::new(root.path()), TS);
        match errors.as_slice() {
            [SampleError::Parse { path, .. }] => assert_eq!(*path, rate),
            other => panic!("expected one parse error, got {other:?}"),
        }
        let s = find(&out, "mlx5_0");
        assert_eq!(s.rate_gbps, None);
        assert_eq!(s.state, "ACTIVE");
    }

    #[test]
    fn states_parse_from_what_the_kernel_writes() {
        let state = |text| parse_state(text);
        assert_eq!(state("4: ACTIVE\n"), Some((4, "ACTIVE".to_owned())));
        assert_eq!(state("1: DOWN\n"), Some((1, "DOWN".to_owned())));
        assert_eq!(
            state("5: ACTIVE_DEFER\n"),
            Some((5, "ACTIVE_DEFER".to_owned()))
        );
        assert_eq!(state(": ACTIVE"), None);
        assert_eq!(state("x: ACTIVE"), None);
        assert_eq!(state("4: active"), None);
    }

    #[test]
    fn physical_states_parse_from_what_the_kernel_writes() {
        let phys = |text| parse_numbered(text);
        assert_eq!(phys("5: LinkUp\n"), Some((5, "LinkUp".to_owned())));
        assert_eq!(phys("7: Phy Test\n"), Some((7, "Phy Test".to_owned())));
        assert_eq!(phys("2: Polling"), Some((2, "Polling".to_owned())));
        // procfs' mlx5_0 capture writes a port state here.
        assert_eq!(phys("4: ACTIVE\n"), Some((4, "ACTIVE".to_owned())));
        assert_eq!(phys("LinkUp"), None);
        assert_eq!(phys("5: "), None);
        assert_eq!(phys("5:  LinkUp"), None);
        assert_eq!(phys("300: LinkUp"), None);
        assert_eq!(phys("5: Link\tUp"), None);
    }

    // Real captures nobody on this project wrote (tests/fixtures/README.md,
    // "captures/"): node_exporter v1.5.0's and procfs 3c943fd's own fixtures.

    fn capture_sys(name: &str) -> PathBuf {
        Path::new(FIXTURES).join("captures").join(name).join("sys")
    }

    /// A temporary sysfs root holding a copy of capture `name`'s tree.
    fn temp_capture(name: &str) -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("create temp dir");
        copy_tree(&capture_sys(name), root.path());
        root
    }

    fn port_of<'a>(samples: &'a [IbPortSample], device: &str, port: u32) -> &'a IbPortSample {
        samples
            .iter()
            .find(|s| s.device == device && s.port == port)
            .unwrap_or_else(|| panic!("no sample for {device} port {port} in {samples:?}"))
    }

    /// A port row with only what every port of a capture has.
    fn bare_port(
        device: &str,
        port: u32,
        rate_gbps: f64,
        identity: [Option<&str>; 3],
    ) -> IbPortSample {
        let [board_id, fw_ver, hca_type] = identity.map(|v| v.map(str::to_owned));
        IbPortSample {
            ts_us: TS,
            device: device.to_owned(),
            port,
            state: "ACTIVE".to_owned(),
            state_id: Some(4),
            phys_state: Some("LinkUp".to_owned()),
            phys_state_id: Some(5),
            rate_gbps: Some(rate_gbps),
            board_id,
            fw_ver,
            hca_type,
            ..IbPortSample::default()
        }
    }

    const MLX4: [Option<&str>; 3] = [Some("SM_1141000001000"), Some("2.31.5050"), Some("MT4099")];

    #[test]
    fn node_exporter_capture_is_read_by_the_truth_rule() {
        let (out, errors) = sample(&mut IbSampler::new(capture_sys("node_exporter-1.5.0")), TS);
        assert!(errors.is_empty(), "{errors:?}");
        let keys: Vec<_> = out.iter().map(|s| (s.device.as_str(), s.port)).collect();
        assert_eq!(keys, [("i40iw0", 1), ("mlx4_0", 1), ("mlx4_0", 2)]);

        // Every counter of i40iw0 reads "N/A (no PMA)": absent, no error.
        assert_eq!(
            out[0],
            bare_port(
                "i40iw0",
                1,
                10.0,
                [Some("I40IW Board ID"), Some("0.2"), Some("I40IW")]
            )
        );

        // Port 1: counters/ is the truth. Its port_rcv_packets is above 2^32
        // while counters_ext/port_rcv_packets_64 reads 0; port_xmit_wait is
        // saturated and reported as the kernel states it.
        assert_eq!(
            out[1],
            IbPortSample {
                xmit_bytes: Some(4 * 3_733_440),
                rcv_bytes: Some(4 * 4_631_917),
                xmit_packets: Some(6_235_865),
                rcv_packets: Some(6_825_908_347),
                unicast_xmit_packets: Some(61_239),
                unicast_rcv_packets: Some(61_148),
                multicast_xmit_packets: Some(16),
                multicast_rcv_packets: Some(93),
                link_downed: Some(0),
                link_error_recovery: Some(0),
                port_rcv_errors: Some(0),
                port_xmit_discards: Some(5),
                port_xmit_wait: Some(4_294_967_295),
                port_rcv_constraint_errors: Some(0),
                port_xmit_constraint_errors: Some(0),
                port_rcv_discards: Some(0),
                ..bare_port("mlx4_0", 1, 40.0, MLX4)
            }
        );

        // Port 2: its counters_ext/ is port 1's, copied; its own counters/
        // read 0 and it has no packet counters, which stay absent.
        assert_eq!(
            out[2],
            IbPortSample {
                xmit_bytes: Some(0),
                rcv_bytes: Some(0),
                unicast_xmit_packets: Some(0),
                unicast_rcv_packets: Some(0),
                multicast_xmit_packets: Some(0),
                multicast_rcv_packets: Some(0),
                link_downed: Some(0),
                link_error_recovery: Some(0),
                ..bare_port("mlx4_0", 2, 40.0, MLX4)
            }
        );
        // Summed per node, port 1's traffic counts once.
        let rcv: u64 = out.iter().filter_map(|s| s.rcv_bytes).sum();
        assert_eq!(rcv, 18_527_668);
    }

    #[test]
    fn a_copied_counters_ext_is_never_used_even_for_a_saturated_counter() {
        let root = temp_capture("node_exporter-1.5.0");
        let port2 = root.path().join(CLASS_DIR).join("mlx4_0/ports/2");
        write(port2.join("counters/port_rcv_data"), "4294967295\n");
        let (out, errors) = sample(&mut IbSampler::new(root.path()), TS);
        assert!(errors.is_empty(), "{errors:?}");
        // Not port 1's 4631917 words from the copied counters_ext.
        assert_eq!(
            port_of(&out, "mlx4_0", 2).rcv_bytes,
            Some(4 * 4_294_967_295)
        );
        assert_eq!(port_of(&out, "mlx4_0", 1).rcv_bytes, Some(4 * 4_631_917));
    }

    #[test]
    fn counters_ext_stands_in_for_a_saturated_counter_unless_it_reads_zero() {
        let root = temp_capture("node_exporter-1.5.0");
        let mlx4 = root.path().join(CLASS_DIR).join("mlx4_0/ports");
        // Port 2 without counters_ext: port 1's is no longer a copy.
        fs::remove_dir_all(mlx4.join("2/counters_ext")).expect("remove counters_ext");
        write(mlx4.join("1/counters/port_rcv_data"), "4294967295\n");
        write(mlx4.join("1/counters_ext/port_rcv_data_64"), "5000000000\n");
        write(mlx4.join("1/counters/port_rcv_packets"), "4294967295\n");
        let mut sampler = IbSampler::new(root.path());
        let (out, errors) = sample(&mut sampler, TS);
        assert!(errors.is_empty(), "{errors:?}");
        let p1 = port_of(&out, "mlx4_0", 1);
        assert_eq!(p1.rcv_bytes, Some(4 * 5_000_000_000));
        // counters_ext/port_rcv_packets_64 reads 0: the saturated legacy
        // value stands.
        assert_eq!(p1.rcv_packets, Some(4_294_967_295));
        write(mlx4.join("1/counters_ext/port_rcv_data_64"), "5000000100\n");
        let (out, _) = sample(&mut sampler, TS + SECOND_US);
        let p1 = port_of(&out, "mlx4_0", 1);
        assert_eq!(p1.rcv_bytes, Some(4 * 5_000_000_100));
        assert_eq!(p1.rcv_packets, Some(4_294_967_295));
    }

    #[test]
    fn procfs_capture_reads_omni_path_mlx4_and_mlx5() {
        let (out, errors) = sample(&mut IbSampler::new(capture_sys("procfs-3c943fd")), TS);
        assert!(errors.is_empty(), "{errors:?}");
        let keys: Vec<_> = out.iter().map(|s| (s.device.as_str(), s.port)).collect();
        assert_eq!(
            keys,
            [("hfi1_0", 1), ("mlx4_0", 1), ("mlx4_0", 2), ("mlx5_0", 1)]
        );
        let zero = Some(0);
        let errors_zero = IbPortSample {
            symbol_error: zero,
            link_downed: zero,
            link_error_recovery: zero,
            port_rcv_errors: zero,
            port_xmit_discards: zero,
            port_rcv_constraint_errors: zero,
            port_xmit_constraint_errors: zero,
            port_rcv_remote_physical_errors: zero,
            port_rcv_switch_relay_errors: zero,
            local_link_integrity_errors: zero,
            excessive_buffer_overrun_errors: zero,
            vl15_dropped: zero,
            link_layer: Some("InfiniBand".to_owned()),
            ..IbPortSample::default()
        };
        let hfi1 = [
            Some("HPE 100Gb 1-port OP101 QSFP28 x16 PCIe Gen3 with Intel Omni-Path Adapter"),
            Some("1.27.0"),
            None,
        ];
        assert_eq!(
            out[0],
            IbPortSample {
                xmit_bytes: Some(4 * 273_558_326_543),
                rcv_bytes: Some(4 * 345_091_702_026),
                xmit_packets: Some(568_318_856),
                rcv_packets: Some(638_036_947),
                port_xmit_wait: zero,
                ..merge(&errors_zero, bare_port("hfi1_0", 1, 100.0, hfi1))
            }
        );
        assert_eq!(
            out[2],
            IbPortSample {
                xmit_bytes: Some(4 * 26_540_356_890),
                rcv_bytes: Some(4 * 2_460_436_784),
                xmit_packets: Some(88_622_850),
                rcv_packets: Some(89_332_064),
                port_xmit_wait: Some(3846),
                ..merge(&errors_zero, bare_port("mlx4_0", 2, 40.0, MLX4))
            }
        );
        let mlx5 = [Some("SM_2001000001034"), Some("14.28.2006"), Some("MT4118")];
        assert_eq!(
            out[3],
            IbPortSample {
                // phys_state reads "4: ACTIVE" in this capture.
                phys_state: Some("ACTIVE".to_owned()),
                phys_state_id: Some(4),
                node_guid: Some("0a7f:bc12:45ef:d23b".to_owned()),
                xmit_bytes: Some(4 * 2_880_761_508_848),
                rcv_bytes: Some(4 * 18_126_345_378),
                xmit_packets: Some(10_907_922_116),
                rcv_packets: Some(541_889_824),
                unicast_xmit_packets: Some(10_907_922_116),
                unicast_rcv_packets: Some(541_889_824),
                multicast_xmit_packets: zero,
                multicast_rcv_packets: zero,
                port_xmit_wait: zero,
                hw_out_of_buffer: zero,
                hw_out_of_sequence: Some(1),
                hw_packet_seq_err: Some(1),
                hw_local_ack_timeout_err: Some(131),
                hw_rnr_nak_retry_err: zero,
                hw_implied_nak_seq_err: zero,
                ..merge(&errors_zero, bare_port("mlx5_0", 1, 25.0, mlx5))
            }
        );
    }

    /// `base` with the error counters and link layer of `errors` set.
    fn merge(errors: &IbPortSample, base: IbPortSample) -> IbPortSample {
        IbPortSample {
            symbol_error: errors.symbol_error,
            link_downed: errors.link_downed,
            link_error_recovery: errors.link_error_recovery,
            port_rcv_errors: errors.port_rcv_errors,
            port_xmit_discards: errors.port_xmit_discards,
            port_rcv_constraint_errors: errors.port_rcv_constraint_errors,
            port_xmit_constraint_errors: errors.port_xmit_constraint_errors,
            port_rcv_remote_physical_errors: errors.port_rcv_remote_physical_errors,
            port_rcv_switch_relay_errors: errors.port_rcv_switch_relay_errors,
            local_link_integrity_errors: errors.local_link_integrity_errors,
            excessive_buffer_overrun_errors: errors.excessive_buffer_overrun_errors,
            vl15_dropped: errors.vl15_dropped,
            link_layer: errors.link_layer.clone(),
            ..base
        }
    }

    #[test]
    fn no_pma_is_absent_but_other_text_is_still_an_error() {
        let root = temp_capture("node_exporter-1.5.0");
        let counters = root.path().join(CLASS_DIR).join("i40iw0/ports/1/counters");
        write(counters.join("symbol_error"), "N/A (no PMA)");
        write(counters.join("link_downed"), "N/A\n");
        let (out, errors) = sample(&mut IbSampler::new(root.path()), TS);
        match errors.as_slice() {
            [SampleError::Parse { path, .. }] => assert_eq!(*path, counters.join("link_downed")),
            other => panic!("expected one parse error, got {other:?}"),
        }
        let s = port_of(&out, "i40iw0", 1);
        assert_eq!(
            (s.symbol_error, s.link_downed, s.xmit_bytes),
            (None, None, None)
        );
    }

    #[test]
    fn device_identity_is_read_again_after_a_minute() {
        let root = temp_sys();
        let mut sampler = IbSampler::new(root.path());
        let fw = root.path().join(CLASS_DIR).join("mlx5_1/fw_ver");
        sample(&mut sampler, TS);
        write(fw, "28.40.1000\n");
        let fw_of = |out: &[IbPortSample]| find(out, "mlx5_1").fw_ver.clone();
        let (out, _) = sample(&mut sampler, TS + 59 * SECOND_US);
        assert_eq!(fw_of(&out).as_deref(), Some("28.39.1002"));
        let (out, _) = sample(&mut sampler, TS + 60 * SECOND_US);
        assert_eq!(fw_of(&out).as_deref(), Some("28.40.1000"));
    }
}
