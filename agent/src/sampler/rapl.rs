//! Host power from RAPL (Running Average Power Limit) energy counters, read
//! from the powercap zones under `<sysfs>/class/powercap/intel-rapl:*`. AMD
//! Zen processors register the same `intel-rapl` zones, so one reader covers
//! both. Part of the `node` source: its values are columns of the node row
//! (see [`super::node`]), not a table of their own.
//!
//! Two kinds are read, each summed over the sockets:
//!
//! - CPU package: every zone named `package-N` (one per socket);
//! - DRAM: every zone named `dram` (a subzone of its package on Intel
//!   servers; AMD has none, so null there).
//!
//! Other zones are left out: `core` and `uncore` are parts of their package
//! (adding them would count that energy twice), `psys` covers the whole
//! platform, and `intel-rapl-mmio:*` is a second view of the package zones
//! (same name, same energy), so only `intel-rapl:` directories are read.
//!
//! `energy_uj` is a counter in µJ that wraps at the zone's
//! `max_energy_range_uj` (about 262 kJ: some 40 minutes at 100 W). The sum
//! is reported as the kernel states the zones; the power over a tick is the
//! sum of each zone's increase, with a wrap taken as `max - previous +
//! current`. Since Linux 5.10, `energy_uj` is readable by root only (the
//! Platypus side channel, CVE-2020-8694); an agent that may not read it says
//! so once, in words, and reports the kind as null.

use std::collections::HashMap;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use super::{SampleError, read_attr};

/// Where the powercap zones live, relative to the sysfs root.
const CLASS_DIR: &str = "class/powercap";
/// The prefix of the RAPL zones read through MSRs (`intel-rapl:0`,
/// `intel-rapl:0:1`). The control-type directory `intel-rapl` and the MMIO
/// view `intel-rapl-mmio:0` do not match it.
const ZONE_PREFIX: &str = "intel-rapl:";

/// What the RAPL zones said at one tick; each field is None where the
/// machine has no zone of that kind or one of them could not be read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RaplReading {
    pub cpu_package_energy_uj: Option<u64>,
    pub dram_energy_uj: Option<u64>,
    pub cpu_package_power_w: Option<f64>,
    pub dram_power_w: Option<f64>,
}

/// The kinds of zone that are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Package,
    Dram,
}

impl Kind {
    fn of(name: &str) -> Option<Kind> {
        let name = name.trim();
        if name == "dram" {
            Some(Kind::Dram)
        } else if name
            .strip_prefix("package-")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        {
            Some(Kind::Package)
        } else {
            None
        }
    }
}

/// One zone's energy at one tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ZoneReading {
    energy_uj: u64,
    /// None where `max_energy_range_uj` is absent: a wrap cannot be measured.
    max_uj: Option<u64>,
    ts_us: i64,
}

/// Reads the RAPL zones at every tick, keeping each zone's last reading for
/// the power over the next tick.
#[derive(Debug)]
pub struct Rapl {
    root: PathBuf,
    /// Last reading per zone directory name.
    last: HashMap<String, ZoneReading>,
    /// Whether root-only energy files were already said to be unreadable.
    denied_logged: bool,
    /// Whether "no RAPL here" was already logged.
    absence_logged: bool,
}

impl Rapl {
    /// A reader of `<sysfs_root>/class/powercap` (the root is `/sys` in production).
    pub fn new(sysfs_root: impl Into<PathBuf>) -> Self {
        Self {
            root: sysfs_root.into(),
            last: HashMap::new(),
            denied_logged: false,
            absence_logged: false,
        }
    }

    /// The zones' energy sums and the power since the previous call. A file
    /// that cannot be read or parsed adds one error and leaves its kind
    /// None; a root-only `energy_uj` leaves it None without an error.
    pub fn read(&mut self, ts_us: i64, errors: &mut Vec<SampleError>) -> RaplReading {
        let class = self.root.join(CLASS_DIR);
        let entries = match fs::read_dir(&class) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                if !self.absence_logged {
                    tracing::debug!(
                        "{} does not exist: no RAPL energy counters to read",
                        class.display()
                    );
                    self.absence_logged = true;
                }
                self.last.clear();
                return RaplReading::default();
            }
            Err(source) => {
                errors.push(SampleError::Read {
                    path: class,
                    source,
                });
                return RaplReading::default();
            }
        };
        let mut zones: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with(ZONE_PREFIX))
            .collect();
        zones.sort();

        let mut package = Sum::default();
        let mut dram = Sum::default();
        let mut denied = None;
        let mut seen = Vec::new();
        for zone in zones {
            let dir = class.join(&zone);
            let kind = match read_attr(&dir.join("name")) {
                Ok(Some(name)) => Kind::of(&name),
                Ok(None) => None,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let Some(kind) = kind else { continue };
            let sum = match kind {
                Kind::Package => &mut package,
                Kind::Dram => &mut dram,
            };
            let now = match read_zone(&dir, ts_us) {
                Ok(now) => now,
                Err(ZoneError::Denied(path)) => {
                    denied.get_or_insert(path);
                    sum.broken = true;
                    continue;
                }
                Err(ZoneError::Other(e)) => {
                    errors.push(e);
                    sum.broken = true;
                    continue;
                }
            };
            sum.add(self.last.get(&zone).copied(), now);
            self.last.insert(zone.clone(), now);
            seen.push(zone);
        }
        // Zones that disappeared start afresh if they come back.
        self.last.retain(|zone, _| seen.contains(zone));

        match denied {
            Some(path) if !self.denied_logged => {
                tracing::info!(
                    "{} may be read by root only (Linux 5.10 and newer restrict RAPL energy \
                     counters to root): CPU package and DRAM energy and power stay null. To record \
                     them, let the agent's user read the energy_uj files of {} (for example with \
                     a udev rule or a systemd-tmpfiles 'z' line setting mode 0444)",
                    path.display(),
                    class.display()
                );
                self.denied_logged = true;
            }
            Some(_) => {}
            None => self.denied_logged = false,
        }

        RaplReading {
            cpu_package_energy_uj: package.energy(),
            dram_energy_uj: dram.energy(),
            cpu_package_power_w: package.power(),
            dram_power_w: dram.power(),
        }
    }
}

/// The zones of one kind at one tick.
#[derive(Debug, Default)]
struct Sum {
    zones: usize,
    energy_uj: u64,
    /// Each zone's increase over its own interval, in W (µJ per µs), summed.
    power_w: f64,
    /// A zone without an increase (first reading, unmeasurable wrap).
    no_increase: bool,
    /// A zone of this kind could not be read: the sum would be short.
    broken: bool,
}

impl Sum {
    fn add(&mut self, prev: Option<ZoneReading>, now: ZoneReading) {
        self.zones += 1;
        match self.energy_uj.checked_add(now.energy_uj) {
            Some(sum) => self.energy_uj = sum,
            None => self.broken = true,
        }
        match prev.and_then(|prev| increase(prev, now)) {
            Some((uj, elapsed_us)) => self.power_w += uj as f64 / elapsed_us as f64,
            None => self.no_increase = true,
        }
    }

    fn energy(&self) -> Option<u64> {
        (!self.broken && self.zones > 0).then_some(self.energy_uj)
    }

    fn power(&self) -> Option<f64> {
        (!self.broken && !self.no_increase && self.zones > 0).then_some(self.power_w)
    }
}

/// A zone's energy increase in µJ and the µs it took; None unless time
/// moved forward and, after a wrap, the zone's range is known.
fn increase(prev: ZoneReading, now: ZoneReading) -> Option<(u64, i64)> {
    let elapsed_us = now.ts_us.checked_sub(prev.ts_us).filter(|&dt| dt > 0)?;
    let uj = if now.energy_uj >= prev.energy_uj {
        now.energy_uj - prev.energy_uj
    } else {
        // Wrapped (at most once a tick: tens of minutes at full power).
        now.max_uj?
            .checked_sub(prev.energy_uj)?
            .checked_add(now.energy_uj)?
    };
    Some((uj, elapsed_us))
}

#[derive(Debug)]
enum ZoneError {
    /// `energy_uj` exists but the agent may not read it.
    Denied(PathBuf),
    Other(SampleError),
}

fn read_zone(dir: &Path, ts_us: i64) -> Result<ZoneReading, ZoneError> {
    let energy_path = dir.join("energy_uj");
    let energy_uj = match fs::read(&energy_path) {
        Ok(bytes) => parse_uj(&energy_path, &bytes).map_err(ZoneError::Other)?,
        Err(e) => return Err(zone_error(energy_path, e)),
    };
    let max_path = dir.join("max_energy_range_uj");
    let max_uj = match read_attr(&max_path).map_err(ZoneError::Other)? {
        Some(text) => Some(parse_uj(&max_path, text.as_bytes()).map_err(ZoneError::Other)?),
        None => None,
    };
    Ok(ZoneReading {
        energy_uj,
        max_uj,
        ts_us,
    })
}

/// Why `energy_uj` at `path` could not be read: root-only (EACCES, said
/// once and not an error) or anything else.
fn zone_error(path: PathBuf, e: std::io::Error) -> ZoneError {
    if e.kind() == ErrorKind::PermissionDenied {
        ZoneError::Denied(path)
    } else {
        ZoneError::Other(SampleError::Read { path, source: e })
    }
}

fn parse_uj(path: &Path, bytes: &[u8]) -> Result<u64, SampleError> {
    let text = String::from_utf8_lossy(bytes);
    let digits = text.trim_end();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SampleError::Parse {
            path: path.to_owned(),
            reason: format!("expected a whole number of microjoules, found {text:?}"),
        });
    }
    digits.parse().map_err(|_| SampleError::Parse {
        path: path.to_owned(),
        reason: format!("{digits} does not fit in 64 bits"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures");
    const TS: i64 = 1_718_208_000_000_000;
    const SECOND_US: i64 = 1_000_000;
    /// `max_energy_range_uj` of every zone of the captures.
    const MAX_UJ: u64 = 262_143_328_850;

    fn capture_sys(name: &str) -> PathBuf {
        Path::new(FIXTURES).join("captures").join(name).join("sys")
    }

    /// A temporary sysfs root holding a copy of capture `name`'s powercap zones.
    fn temp_capture(name: &str) -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("create temp dir");
        let from = capture_sys(name).join(CLASS_DIR);
        for zone in fs::read_dir(&from).expect("list powercap") {
            let zone = zone.expect("zone");
            let to = root.path().join(CLASS_DIR).join(zone.file_name());
            fs::create_dir_all(&to).expect("create zone dir");
            for file in fs::read_dir(zone.path()).expect("list zone") {
                let file = file.expect("file");
                fs::copy(file.path(), to.join(file.file_name())).expect("copy");
            }
        }
        root
    }

    fn zone_file(root: &Path, zone: &str, file: &str) -> PathBuf {
        root.join(CLASS_DIR).join(zone).join(file)
    }

    fn write(path: PathBuf, text: &str) {
        fs::write(path, text).expect("write file");
    }

    fn read(rapl: &mut Rapl, ts_us: i64) -> RaplReading {
        let mut errors = Vec::new();
        let reading = rapl.read(ts_us, &mut errors);
        assert!(errors.is_empty(), "{errors:?}");
        reading
    }

    #[test]
    fn node_exporter_capture_has_one_package_and_no_dram() {
        // package-0 counts; its subzone core and the control type do not.
        let reading = read(&mut Rapl::new(capture_sys("node_exporter-1.5.0")), TS);
        assert_eq!(
            reading,
            RaplReading {
                cpu_package_energy_uj: Some(240_422_366_267),
                ..RaplReading::default()
            }
        );
    }

    #[test]
    fn procfs_capture_sums_both_package_zones() {
        // intel-rapl:0 package-0 and intel-rapl:a package-10.
        let reading = read(&mut Rapl::new(capture_sys("procfs-3c943fd")), TS);
        assert_eq!(reading.cpu_package_energy_uj, Some(2 * 240_422_366_267));
        assert_eq!(reading.dram_energy_uj, None);
    }

    #[test]
    fn power_is_the_increase_over_the_tick_and_survives_a_wrap() {
        let root = temp_capture("node_exporter-1.5.0");
        let energy = zone_file(root.path(), "intel-rapl:0", "energy_uj");
        // A DRAM subzone, as Intel servers have.
        let dram = root.path().join(CLASS_DIR).join("intel-rapl:0:1");
        fs::create_dir_all(&dram).expect("create dram zone");
        write(dram.join("name"), "dram\n");
        write(dram.join("energy_uj"), "1000000\n");
        write(dram.join("max_energy_range_uj"), "65712999613\n");
        let mut rapl = Rapl::new(root.path());
        let first = read(&mut rapl, TS);
        assert_eq!(first.dram_energy_uj, Some(1_000_000));
        assert_eq!(
            (first.cpu_package_power_w, first.dram_power_w),
            (None, None)
        );

        // 2 s later: +300 J of package, +40 J of DRAM.
        write(energy.clone(), "240722366267\n");
        write(dram.join("energy_uj"), "41000000\n");
        let second = read(&mut rapl, TS + 2 * SECOND_US);
        assert_eq!(second.cpu_package_energy_uj, Some(240_722_366_267));
        assert_eq!(second.cpu_package_power_w, Some(150.0));
        assert_eq!(second.dram_power_w, Some(20.0));

        // The package counter wraps: 100 J before the end of its range, 150 J after.
        write(energy.clone(), &format!("{}\n", MAX_UJ - 100_000_000));
        read(&mut rapl, TS + 3 * SECOND_US);
        write(energy, "150000000\n");
        let wrapped = read(&mut rapl, TS + 4 * SECOND_US);
        assert_eq!(wrapped.cpu_package_energy_uj, Some(150_000_000));
        assert_eq!(wrapped.cpu_package_power_w, Some(250.0));
    }

    #[test]
    fn a_root_only_energy_file_is_not_an_error_but_other_failures_are() {
        let path = PathBuf::from("/sys/class/powercap/intel-rapl:0/energy_uj");
        let denied = zone_error(path.clone(), ErrorKind::PermissionDenied.into());
        assert!(matches!(denied, ZoneError::Denied(p) if p == path));
        let other = zone_error(path.clone(), ErrorKind::InvalidData.into());
        assert!(matches!(other, ZoneError::Other(SampleError::Read { path: p, .. }) if p == path));
    }

    #[test]
    fn an_unreadable_energy_file_is_an_error_and_leaves_the_kind_null() {
        let root = temp_capture("node_exporter-1.5.0");
        let energy = zone_file(root.path(), "intel-rapl:0", "energy_uj");
        // A directory in its place: unreadable as a file, for root too.
        fs::remove_file(&energy).expect("remove energy_uj");
        fs::create_dir(&energy).expect("dir in its place");
        let mut errors = Vec::new();
        let reading = Rapl::new(root.path()).read(TS, &mut errors);
        assert_eq!(reading, RaplReading::default());
        match errors.as_slice() {
            [SampleError::Read { path, .. }] => assert_eq!(*path, energy),
            other => panic!("expected one read error, got {other:?}"),
        }
    }

    #[test]
    fn garbage_energy_is_an_error_and_leaves_the_kind_null() {
        let root = temp_capture("procfs-3c943fd");
        let energy = zone_file(root.path(), "intel-rapl:a", "energy_uj");
        write(energy.clone(), "lots\n");
        let mut errors = Vec::new();
        let reading = Rapl::new(root.path()).read(TS, &mut errors);
        // One of two packages unreadable: no sum at all, rather than half of it.
        assert_eq!(reading.cpu_package_energy_uj, None);
        match errors.as_slice() {
            [SampleError::Parse { path, .. }] => assert_eq!(*path, energy),
            other => panic!("expected one parse error, got {other:?}"),
        }
    }

    #[test]
    fn no_powercap_is_null_and_no_error() {
        let root = tempfile::tempdir().expect("create temp dir");
        assert_eq!(
            read(&mut Rapl::new(root.path()), TS),
            RaplReading::default()
        );
    }

    #[test]
    fn zone_names_choose_the_kind() {
        assert_eq!(Kind::of("package-0\n"), Some(Kind::Package));
        assert_eq!(Kind::of("package-10"), Some(Kind::Package));
        assert_eq!(Kind::of("dram\n"), Some(Kind::Dram));
        assert_eq!(Kind::of("core"), None);
        assert_eq!(Kind::of("uncore"), None);
        assert_eq!(Kind::of("psys"), None);
        assert_eq!(Kind::of("package-"), None);
    }
}
