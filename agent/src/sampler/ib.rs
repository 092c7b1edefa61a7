//! InfiniBand sampler: one [`IbPortSample`] per port found under
//! `<sysfs>/class/infiniband/<device>/ports/<port>/`, with traffic counters
//! turned into per-second rates against the previous tick.
//!
//! A machine without InfiniBand has no `class/infiniband` directory; that is a
//! normal state, not an error. A port whose files cannot be read is reported
//! and the other ports are still sampled.

use std::collections::HashMap;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use gputel_proto::IbPortSample;

use super::{SampleError, Sampler, Source, Tick};

/// Where the devices live, relative to the sysfs root.
const CLASS_DIR: &str = "class/infiniband";
/// The legacy counters: 32 bits wide on old kernels and HCAs, where they
/// saturate at 2^32 - 1 instead of wrapping (IBA PortCounters). Newer
/// kernels show 64-bit values here when the HCA supports them.
const COUNTERS_DIR: &str = "counters";
/// 64-bit counters (IBA PortCountersExtended) that old kernels and drivers
/// publish beside the legacy ones; preferred when present.
const COUNTERS_EXT_DIR: &str = "counters_ext";
/// The value at which a 32-bit legacy counter stops counting. A 64-bit
/// counter that happens to read exactly this loses one tick's rate, no more.
const SATURATED_32: u64 = u32::MAX as u64;

/// One traffic counter: its file names and what one unit of it is worth.
#[derive(Debug)]
struct Counter {
    /// File name under `counters/`.
    legacy: &'static str,
    /// File name under `counters_ext/`.
    ext: &'static str,
    /// Bytes per unit: the data counters count 4-byte words, packets count 1.
    unit: u64,
}

/// The four counters, in the order [`Traffic`] uses: xmit bytes, rcv bytes,
/// xmit packets, rcv packets.
const COUNTERS: [Counter; 4] = [
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
];

/// One value per counter of [`COUNTERS`].
type Traffic<T> = [T; 4];

/// Samples every InfiniBand port on the machine.
#[derive(Debug)]
pub struct IbSampler {
    root: PathBuf,
    /// What each port's counters were at their last good reading, by (device, port).
    ports: HashMap<(String, u32), PortHistory>,
    /// Whether "no InfiniBand here" was already logged.
    absence_logged: bool,
}

#[derive(Debug, Default)]
struct PortHistory {
    /// Last good reading of each counter; None before the first one, or
    /// after the counter's file disappeared.
    last: Traffic<Option<Reading>>,
    /// Whether each counter's saturation was already logged.
    saturation_logged: Traffic<bool>,
}

/// A counter value in the kernel's units, and the tick it was read at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reading {
    value: u64,
    ts_us: i64,
}

/// A counter as read from sysfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RawCounter {
    value: u64,
    /// A legacy 32-bit counter stuck at 2^32 - 1: it no longer moves, so no rate.
    saturated: bool,
    from_ext: bool,
}

impl IbSampler {
    /// A sampler reading `<sysfs_root>/class/infiniband` (the root is `/sys` in production).
    pub fn new(sysfs_root: impl Into<PathBuf>) -> Self {
        Self {
            root: sysfs_root.into(),
            ports: HashMap::new(),
            absence_logged: false,
        }
    }

    /// Every (device, port, port directory), sorted; None when there are no
    /// InfiniBand devices at all or their directory cannot be listed.
    fn list_ports(&mut self, errors: &mut Vec<SampleError>) -> Option<Vec<(String, u32, PathBuf)>> {
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
                    Some(port) => ports.push((name.clone(), port, path)),
                    None => errors.push(SampleError::Parse {
                        path,
                        reason: "a port directory's name should be its port number".to_owned(),
                    }),
                }
            }
        }
        ports.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        Some(ports)
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
        self.ports.retain(|key, _| {
            ports
                .iter()
                .any(|(dev, port, _)| key.0 == *dev && key.1 == *port)
        });

        for (device, port, dir) in ports {
            let history = self.ports.entry((device.clone(), port)).or_default();
            if let Some(sample) =
                sample_port(tick.ts_us, device, port, &dir, history, &mut tick.errors)
            {
                tick.batch.ib.push(sample);
            }
        }
    }
}

/// Reads one port. None (and an error pushed) when its `state` cannot be
/// read, as a row without it would say nothing about the port. Any other file
/// that fails leaves its field unset, pushes its error, and keeps the
/// counter's last good reading for the next tick's rate.
fn sample_port(
    ts_us: i64,
    device: String,
    port: u32,
    dir: &Path,
    history: &mut PortHistory,
    errors: &mut Vec<SampleError>,
) -> Option<IbPortSample> {
    let state = match read_state(dir) {
        Ok(state) => state,
        Err(e) => {
            errors.push(e);
            return None;
        }
    };
    let rate_gbps = read_rate(dir).unwrap_or_else(|e| {
        errors.push(e);
        None
    });

    let mut totals: Traffic<Option<u64>> = [None; 4];
    let mut rates: Traffic<Option<f64>> = [None; 4];
    for (i, counter) in COUNTERS.iter().enumerate() {
        let raw = match read_counter(dir, counter) {
            Ok(Some(raw)) => raw,
            Ok(None) => {
                // Absent is not zero: the field stays unset.
                history.last[i] = None;
                continue;
            }
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        let Some(total) = raw.value.checked_mul(counter.unit) else {
            errors.push(SampleError::Parse {
                path: counter_path(dir, counter, raw.from_ext),
                reason: format!("{} is too large to be a byte count", raw.value),
            });
            continue;
        };
        totals[i] = Some(total);

        let now = Reading {
            value: raw.value,
            ts_us,
        };
        if raw.saturated {
            if !history.saturation_logged[i] {
                tracing::debug!(
                    "{} is saturated at 2^32-1 and no longer counts; no rate until the counter is reset",
                    counter_path(dir, counter, false).display()
                );
                history.saturation_logged[i] = true;
            }
        } else {
            history.saturation_logged[i] = false;
            rates[i] = history.last[i].and_then(|prev| per_second(prev, now, counter.unit));
        }
        history.last[i] = Some(now);
    }

    let [
        symbol_error,
        link_downed,
        link_error_recovery,
        port_rcv_errors,
        port_xmit_discards,
        port_xmit_wait,
    ] = ERROR_COUNTERS.map(|name| {
        read_plain_counter(&dir.join(COUNTERS_DIR).join(name)).unwrap_or_else(|e| {
            errors.push(e);
            None
        })
    });
    let [
        hw_out_of_buffer,
        hw_out_of_sequence,
        hw_packet_seq_err,
        hw_local_ack_timeout_err,
        hw_rnr_nak_retry_err,
        hw_implied_nak_seq_err,
    ] = HW_COUNTERS.map(|name| {
        read_plain_counter(&dir.join(HW_COUNTERS_DIR).join(name)).unwrap_or_else(|e| {
            errors.push(e);
            None
        })
    });
    let [xmit_bytes, rcv_bytes, xmit_packets, rcv_packets] = totals;
    let [
        xmit_bytes_per_s,
        rcv_bytes_per_s,
        xmit_packets_per_s,
        rcv_packets_per_s,
    ] = rates;
    Some(IbPortSample {
        ts_us,
        device,
        port,
        state,
        rate_gbps,
        xmit_bytes,
        rcv_bytes,
        xmit_packets,
        rcv_packets,
        xmit_bytes_per_s,
        rcv_bytes_per_s,
        xmit_packets_per_s,
        rcv_packets_per_s,
        symbol_error,
        link_downed,
        link_error_recovery,
        port_rcv_errors,
        port_xmit_discards,
        port_xmit_wait,
        hw_out_of_buffer,
        hw_out_of_sequence,
        hw_packet_seq_err,
        hw_local_ack_timeout_err,
        hw_rnr_nak_retry_err,
        hw_implied_nak_seq_err,
    })
}

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
/// Where drivers put their own counters, beside the IBA ones.
const HW_COUNTERS_DIR: &str = "hw_counters";

/// Error counters under `counters/`, in `IbPortSample` order. Reported as
/// read: they are small and rarely move, so no rates.
const ERROR_COUNTERS: [&str; 6] = [
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_xmit_discards",
    "port_xmit_wait",
];

/// One error counter; None when its file does not exist.
fn read_plain_counter(path: &Path) -> Result<Option<u64>, SampleError> {
    let Some(text) = read_attr(path)? else {
        return Ok(None);
    };
    parse_counter(&text)
        .map(Some)
        .ok_or_else(|| SampleError::Parse {
            reason: format!("expected an unsigned integer, found {text:?}"),
            path: path.to_owned(),
        })
}

/// Increase per second between two readings of one counter, in bytes (or
/// packets) given `unit` per counter step; None unless time moved forward.
///
/// A reading lower than the previous one means the counter was reset (port
/// reset, driver reload, `perfquery -R`) in between. As Prometheus' `rate()`
/// does, the new value is then taken as the whole increase since the reset:
/// a lower bound, since what was counted before the reset is lost.
fn per_second(prev: Reading, now: Reading, unit: u64) -> Option<f64> {
    let elapsed_us = now.ts_us.checked_sub(prev.ts_us).filter(|&dt| dt > 0)?;
    let increase = if now.value >= prev.value {
        now.value - prev.value
    } else {
        now.value
    };
    Some(increase as f64 * unit as f64 / (elapsed_us as f64 / 1_000_000.0))
}

/// The port's state name from `state`, e.g. "ACTIVE" from "4: ACTIVE".
fn read_state(dir: &Path) -> Result<String, SampleError> {
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

fn parse_state(text: &str) -> Option<String> {
    let (number, name) = text.trim_end().split_once(": ")?;
    number.parse::<u8>().ok()?;
    let well_formed = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    well_formed.then(|| name.to_owned())
}

/// The link rate in Gb/s from `rate`, e.g. 400 from "400 Gb/sec (4X NDR)";
/// None when the file does not exist.
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

/// Reads one counter, preferring `counters_ext/`; None when neither file exists.
fn read_counter(dir: &Path, counter: &Counter) -> Result<Option<RawCounter>, SampleError> {
    for from_ext in [true, false] {
        let path = counter_path(dir, counter, from_ext);
        if let Some(text) = read_attr(&path)? {
            let value = parse_counter(&text).ok_or_else(|| SampleError::Parse {
                reason: format!("expected an unsigned integer, found {text:?}"),
                path,
            })?;
            let saturated = !from_ext && value == SATURATED_32;
            return Ok(Some(RawCounter {
                value,
                saturated,
                from_ext,
            }));
        }
    }
    Ok(None)
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

/// Reads a sysfs attribute; None when the file does not exist.
fn read_attr(path: &Path) -> Result<Option<String>, SampleError> {
    match fs::read(path) {
        Ok(bytes) => String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| SampleError::Parse {
                path: path.to_owned(),
                reason: "the file is not text".to_owned(),
            }),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SampleError::Read {
            path: path.to_owned(),
            source,
        }),
    }
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

    fn rates(s: &IbPortSample) -> [Option<f64>; 4] {
        [
            s.xmit_bytes_per_s,
            s.rcv_bytes_per_s,
            s.xmit_packets_per_s,
            s.rcv_packets_per_s,
        ]
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
                rate_gbps: Some(400.0),
                xmit_bytes: Some(4 * 1_984_466_120_583_717),
                rcv_bytes: Some(4 * 1_984_460_973_326_841),
                xmit_packets: Some(9_412_287_715_021),
                rcv_packets: Some(9_412_301_880_214),
                xmit_bytes_per_s: None,
                rcv_bytes_per_s: None,
                xmit_packets_per_s: None,
                rcv_packets_per_s: None,
                symbol_error: Some(3),
                link_downed: Some(1),
                link_error_recovery: Some(2),
                port_rcv_errors: Some(7),
                port_xmit_discards: Some(11),
                port_xmit_wait: Some(8_231_947_811),
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
        assert!(out.iter().all(|s| rates(s) == [None; 4]));
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
        assert_eq!(
            rates(find(&second, "mlx5_3")),
            [Some(0.0), Some(0.0), Some(0.0), None]
        );
    }

    #[test]
    fn rates_are_per_second_over_the_time_between_samples() {
        let root = temp_sys();
        let mut sampler = IbSampler::new(root.path());
        sample(&mut sampler, TS);

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
        let s = find(&out, "mlx5_0");
        assert_eq!(
            rates(s),
            [Some(1e9), Some(5e8), Some(488_250.0), Some(244_125.0)]
        );
        assert_eq!(s.xmit_bytes, Some(4 * 1_984_466_370_583_717));
        assert_eq!(find(&out, "mlx5_2").rcv_bytes_per_s, Some(1e7));
        assert_eq!(rates(find(&out, "mlx5_1")), [Some(0.0); 4]);

        // Over 15 s the same kind of increase gives a fifteenth of the rate.
        write(mlx5_0.join("counters/port_xmit_data"), "1984470120583717\n"); // +3_750_000_000 words
        let (out, _) = sample(&mut sampler, TS + 16 * SECOND_US);
        assert_eq!(find(&out, "mlx5_0").xmit_bytes_per_s, Some(1e9));
    }

    #[test]
    fn a_counter_reset_counts_the_new_value_as_the_increase() {
        let root = temp_sys();
        let mut sampler = IbSampler::new(root.path());
        sample(&mut sampler, TS);
        let mlx5_1 = port_dir(root.path(), "mlx5_1");
        write(mlx5_1.join("counters/port_xmit_data"), "500000000\n");
        write(mlx5_1.join("counters/port_xmit_packets"), "40\n");
        let (out, _) = sample(&mut sampler, TS + 2 * SECOND_US);
        let s = find(&out, "mlx5_1");
        assert_eq!(s.xmit_bytes_per_s, Some(1e9)); // 4 × 500_000_000 / 2 s
        assert_eq!(s.xmit_packets_per_s, Some(20.0));
        assert_eq!(s.rcv_bytes_per_s, Some(0.0));
    }

    #[test]
    fn a_saturated_32_bit_counter_has_its_value_but_no_rate() {
        let root = temp_sys();
        let mut sampler = IbSampler::new(root.path());
        let mlx5_0 = port_dir(root.path(), "mlx5_0");
        write(mlx5_0.join("counters/port_rcv_data"), "4294967000\n");
        sample(&mut sampler, TS);
        write(mlx5_0.join("counters/port_rcv_data"), "4294967295\n");
        let (out, errors) = sample(&mut sampler, TS + SECOND_US);
        assert!(errors.is_empty(), "{errors:?}");
        let s = find(&out, "mlx5_0");
        assert_eq!(s.rcv_bytes, Some(4 * 4_294_967_295));
        assert_eq!(s.rcv_bytes_per_s, None);
        assert_eq!(s.xmit_bytes_per_s, Some(0.0));
        let (out, _) = sample(&mut sampler, TS + 2 * SECOND_US);
        assert_eq!(find(&out, "mlx5_0").rcv_bytes_per_s, None);

        // Cleared (e.g. `perfquery -R`): counting again, from the reset.
        write(mlx5_0.join("counters/port_rcv_data"), "1000\n");
        let (out, _) = sample(&mut sampler, TS + 3 * SECOND_US);
        assert_eq!(find(&out, "mlx5_0").rcv_bytes_per_s, Some(4000.0));
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
            assert_eq!((s.xmit_bytes, s.xmit_bytes_per_s), (None, None));
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
        // Back with lower counters: a first reading, not a reset.
        write(device.join("ports/1/counters/port_xmit_data"), "10\n");
        let (out, _) = sample(&mut sampler, TS + 2 * SECOND_US);
        assert_eq!(rates(find(&out, "mlx5_3")), [None; 4]);
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
        assert_eq!(parse_state("4: ACTIVE\n").as_deref(), Some("ACTIVE"));
        assert_eq!(parse_state("1: DOWN\n").as_deref(), Some("DOWN"));
        assert_eq!(
            parse_state("5: ACTIVE_DEFER\n").as_deref(),
            Some("ACTIVE_DEFER")
        );
        assert_eq!(parse_state(": ACTIVE"), None);
        assert_eq!(parse_state("x: ACTIVE"), None);
        assert_eq!(parse_state("4: active"), None);
    }
}
