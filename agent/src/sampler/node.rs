//! Host sampler: CPU time counters from `/proc/stat`, memory from `/proc/meminfo`,
//! load averages from `/proc/loadavg`, all read under a configurable procfs root,
//! and CPU package and DRAM energy and power from RAPL under the sysfs root
//! ([`super::rapl`]).
//!
//! The sources are independent: one that cannot be read or parsed leaves
//! its fields unset and is reported, and the others still fill theirs.
//!
//! Memory is sent as /proc/meminfo counts it, in KiB: MemTotal and
//! MemAvailable, the kernel's own estimate of what could be handed out
//! without swapping; used memory is their difference, derived where it is
//! read (the `node` view, `/metrics`). Kernels before 3.14 have no
//! MemAvailable; there available is MemFree + Buffers + Cached +
//! SReclaimable (the classic `free` view: page cache and reclaimable slab
//! are not in use by anyone). procps-ng 4's `free` counts all cache as used
//! there, which would make an idle node with a warm page cache look full.

use std::fs;
use std::path::{Path, PathBuf};

use gputel_proto::NodeSample;
use gputel_schemas::derive::CpuJiffies;
use procfs::{CpuTime, FromRead, FromReadSI, KernelStats, LoadAverage, Meminfo, ProcError};

use super::rapl::Rapl;
use super::{SampleError, Sampler, Source, Tick};

/// File names under the procfs root.
const STAT: &str = "stat";
const MEMINFO: &str = "meminfo";
const LOADAVG: &str = "loadavg";

/// Samples the host: one [`NodeSample`] per tick.
#[derive(Debug)]
pub struct NodeSampler {
    root: PathBuf,
    /// RAPL energy, where a sysfs root was given.
    rapl: Option<Rapl>,
}

impl NodeSampler {
    /// A sampler reading `<procfs_root>/stat`, `meminfo` and `loadavg` (the root is `/proc` in production).
    pub fn new(procfs_root: impl Into<PathBuf>) -> Self {
        Self {
            root: procfs_root.into(),
            rapl: None,
        }
    }

    /// Also reads RAPL energy under `<sysfs_root>/class/powercap` (the root
    /// is `/sys` in production); without it the energy and power fields stay unset.
    pub fn with_rapl(mut self, sysfs_root: impl Into<PathBuf>) -> Self {
        self.rapl = Some(Rapl::new(sysfs_root));
        self
    }

    /// The tick's NodeSample.
    fn read(&mut self, ts_us: i64, errors: &mut Vec<SampleError>) -> NodeSample {
        let mut sample = NodeSample {
            ts_us,
            ..NodeSample::default()
        };

        match self.read_stat() {
            Ok(stat) => {
                sample.cpu_count = u32::try_from(stat.cpu_time.len()).unwrap_or(u32::MAX);
                cpu_jiffies(&stat.total).write_to(&mut sample);
            }
            Err(e) => errors.push(e),
        }

        match self.read_meminfo() {
            Ok(mem) => {
                sample.memory_total_kib = Some(mem.mem_total / 1024);
                sample.memory_available_kib = Some(memory_available(&mem) / 1024);
            }
            Err(e) => errors.push(e),
        }

        match self.read_loadavg() {
            Ok(load) => {
                sample.load1 = Some(load.one);
                sample.load5 = Some(load.five);
                sample.load15 = Some(load.fifteen);
            }
            Err(e) => errors.push(e),
        }

        if let Some(rapl) = &mut self.rapl {
            let power = rapl.read(ts_us, errors);
            sample.cpu_package_energy_uj = power.cpu_package_energy_uj;
            sample.dram_energy_uj = power.dram_energy_uj;
            sample.cpu_package_power_w = power.cpu_package_power_w;
            sample.dram_power_w = power.dram_power_w;
        }

        sample
    }
}

impl Sampler for NodeSampler {
    fn source(&self) -> Source {
        Source::Node
    }

    /// One [`NodeSample`]. A file that cannot be read or parsed leaves its
    /// fields unset (`cpu_count` 0 for `stat`) and adds one error; the other
    /// files still fill theirs.
    fn sample(&mut self, tick: &mut Tick) {
        let sample = self.read(tick.ts_us, &mut tick.errors);
        tick.batch.node.push(sample);
    }
}

impl NodeSampler {
    fn read_stat(&self) -> Result<KernelStats, SampleError> {
        let path = self.root.join(STAT);
        let text = read_kernel_text(&path)?;
        // The system info only supplies ticks per second for procfs' *_ms
        // helpers; the row keeps raw jiffies.
        KernelStats::from_read(text.as_bytes(), procfs::current_system_info())
            .map_err(|e| procfs_parse_error(&path, e))
    }

    fn read_meminfo(&self) -> Result<Meminfo, SampleError> {
        let path = self.root.join(MEMINFO);
        let text = read_kernel_text(&path)?;
        check_meminfo_values(&text).map_err(|reason| SampleError::Parse {
            path: path.clone(),
            reason,
        })?;
        // procfs converts the kernel's "kB" (KiB) values to bytes.
        Meminfo::from_read(text.as_bytes()).map_err(|e| procfs_parse_error(&path, e))
    }

    fn read_loadavg(&self) -> Result<LoadAverage, SampleError> {
        let path = self.root.join(LOADAVG);
        let text = read_kernel_text(&path)?;
        LoadAverage::from_read(text.as_bytes()).map_err(|e| procfs_parse_error(&path, e))
    }
}

/// Bytes available, as the module docs say: MemAvailable, or without it
/// MemFree + Buffers + Cached + SReclaimable (a line the kernel does not
/// write counts 0). Should that exceed MemTotal, as it cannot on a
/// consistent file, MemFree, as procps does; never more than MemTotal.
/// procfs has turned the kernel's KiB into bytes (× 1024).
fn memory_available(mem: &Meminfo) -> u64 {
    let available = mem.mem_available.unwrap_or_else(|| {
        let reclaimable = [mem.buffers, mem.cached, mem.s_reclaimable.unwrap_or(0)]
            .into_iter()
            .fold(mem.mem_free, u64::saturating_add);
        if reclaimable <= mem.mem_total {
            reclaimable
        } else {
            mem.mem_free
        }
    });
    available.min(mem.mem_total)
}

/// The aggregate `cpu` line of `/proc/stat` in the five groups the node row
/// stores, in jiffies (USER_HZ ticks): user + nice, system + irq + softirq,
/// iowait, idle, steal. Fields older kernels do not write count as 0; a sum
/// that would overflow saturates (it cannot, on a kernel's 64-bit counters,
/// in the lifetime of a machine).
///
/// guest and guest_nice are left out: the kernel already counts guest time
/// inside user (and guest_nice inside nice), so adding them would count it
/// twice. The five add up to all the CPU time.
fn cpu_jiffies(t: &CpuTime) -> CpuJiffies {
    CpuJiffies {
        user: t.user.saturating_add(t.nice),
        system: t
            .system
            .saturating_add(t.irq.unwrap_or(0))
            .saturating_add(t.softirq.unwrap_or(0)),
        iowait: t.iowait.unwrap_or(0),
        idle: t.idle,
        steal: t.steal.unwrap_or(0),
    }
}

/// Reads a procfs text file whole. The kernel writes these files in ASCII, so
/// anything else is reported as a parse error rather than handed to procfs.
fn read_kernel_text(path: &Path) -> Result<String, SampleError> {
    let bytes = fs::read(path).map_err(|source| SampleError::Read {
        path: path.to_owned(),
        source,
    })?;
    let parse_error = |reason: &str| SampleError::Parse {
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    if bytes.is_empty() {
        return Err(parse_error("the file is empty"));
    }
    if !bytes.is_ascii() {
        return Err(parse_error(
            "the file holds bytes that are not ASCII, which the kernel never writes here",
        ));
    }
    String::from_utf8(bytes).map_err(|_| parse_error("the file is not UTF-8"))
}

/// Rejects meminfo values too large to convert to bytes. procfs multiplies
/// each value by its unit unchecked, which panics in debug builds; no kernel
/// writes such values, so they mean a corrupt file.
fn check_meminfo_values(text: &str) -> Result<(), String> {
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(name), Some(value), Some(unit)) = (words.next(), words.next(), words.next())
        else {
            continue;
        };
        // The units procfs knows; it rejects any other itself.
        let bytes_per_unit: u64 = match unit {
            "KiB" | "kiB" | "kB" | "KB" => 1 << 10,
            "MiB" | "miB" | "MB" | "mB" => 1 << 20,
            "GiB" | "giB" | "GB" | "gB" => 1 << 30,
            _ => 1,
        };
        if let Ok(value) = value.parse::<u64>()
            && value.checked_mul(bytes_per_unit).is_none()
        {
            return Err(format!(
                "{name} {value} {unit} does not fit in 64 bits as bytes"
            ));
        }
    }
    Ok(())
}

/// procfs reports a malformed file as an "internal error, please report this
/// procfs bug"; say what it is instead: a file not in the kernel's format.
fn procfs_parse_error(path: &Path, err: ProcError) -> SampleError {
    let detail = match &err {
        ProcError::InternalError(e) => e
            .msg
            .trim_start_matches("Internal Unwrap Error: ")
            .trim_end_matches("NoneError")
            .trim_end_matches(": ")
            .to_owned(),
        other => other.to_string(),
    };
    let reason = if detail.is_empty() {
        "truncated or not in the format the kernel writes".to_owned()
    } else {
        format!("truncated or not in the format the kernel writes: {detail}")
    };
    SampleError::Parse {
        path: path.to_owned(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures");
    /// 2024-06-12T16:00:00Z, an arbitrary tick.
    const TS: i64 = 1_718_208_000_000_000;

    /// KiB from the fixture's `proc/meminfo`.
    const TOTAL_KIB: u64 = 2_113_389_424;
    const AVAILABLE_KIB: u64 = 1_876_542_180;

    /// One tick of `sampler` through the [`Sampler`] contract: its one row,
    /// its errors added to `errors`.
    fn sample(sampler: &mut NodeSampler, ts_us: i64, errors: &mut Vec<SampleError>) -> NodeSample {
        let mut tick = Tick::new(ts_us);
        sampler.sample(&mut tick);
        errors.append(&mut tick.errors);
        assert_eq!(tick.batch.node.len(), 1, "one node row per tick");
        tick.batch.node.pop().expect("one row")
    }

    fn fixture(dir: &str) -> PathBuf {
        Path::new(FIXTURES).join(dir)
    }

    /// A temporary procfs root holding copies of `stat`, `meminfo` and `loadavg` from fixture `dir`.
    fn temp_root(dir: &str) -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("create temp dir");
        copy_files(dir, root.path());
        root
    }

    fn copy_files(dir: &str, to: &Path) {
        for name in [STAT, MEMINFO, LOADAVG] {
            fs::copy(fixture(dir).join(name), to.join(name)).expect("copy fixture file");
        }
    }

    fn fixture_text(dir: &str, name: &str) -> String {
        fs::read_to_string(fixture(dir).join(name)).expect("read fixture")
    }

    fn write(root: &Path, name: &str, text: &str) {
        fs::write(root.join(name), text).expect("write file");
    }

    /// The path of the one parse error in `errors`.
    fn only_parse_error(errors: &[SampleError]) -> &Path {
        match errors {
            [SampleError::Parse { path, .. }] => path,
            other => panic!("expected one parse error, got {other:?}"),
        }
    }

    #[test]
    fn a_sample_reads_the_fixture_with_cpu_counters_grouped() {
        let mut sampler = NodeSampler::new(fixture("proc"));
        let mut errors = Vec::new();
        let s = sample(&mut sampler, TS, &mut errors);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(
            s,
            NodeSample {
                ts_us: TS,
                cpu_count: 8,
                // cpu  416699676 365035 54608094 146625695 1057559 181864 2542077 0 0 0
                cpu_user_jiffies: Some(416_699_676 + 365_035),
                cpu_system_jiffies: Some(54_608_094 + 181_864 + 2_542_077),
                cpu_iowait_jiffies: Some(1_057_559),
                cpu_idle_jiffies: Some(146_625_695),
                cpu_steal_jiffies: Some(0),
                memory_total_kib: Some(TOTAL_KIB),
                memory_available_kib: Some(AVAILABLE_KIB),
                load1: Some(23.41),
                load5: Some(22.87),
                load15: Some(21.96),
                jobs: Vec::new(),
                ..NodeSample::default()
            }
        );
    }

    #[test]
    fn a_later_snapshot_gives_the_later_counters() {
        // proc → proc-later is one second on 8 CPUs: user 432 + nice 8, system
        // 64 + irq 4 + softirq 12, iowait 8, idle 272 jiffies more.
        let root = temp_root("proc");
        let mut sampler = NodeSampler::new(root.path());
        let mut errors = Vec::new();
        let before = sample(&mut sampler, TS, &mut errors);
        copy_files("proc-later", root.path());
        let s = sample(&mut sampler, TS + 1_000_000, &mut errors);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(s.cpu_count, 8);
        let increase = |f: fn(&NodeSample) -> Option<u64>| f(&s).unwrap() - f(&before).unwrap();
        assert_eq!(increase(|n| n.cpu_user_jiffies), 440);
        assert_eq!(increase(|n| n.cpu_system_jiffies), 80);
        assert_eq!(increase(|n| n.cpu_iowait_jiffies), 8);
        assert_eq!(increase(|n| n.cpu_idle_jiffies), 272);
        assert_eq!(increase(|n| n.cpu_steal_jiffies), 0);
        assert_eq!(s.memory_available_kib, Some(1_876_525_796));
        assert_eq!(
            (s.load1, s.load5, s.load15),
            (Some(23.52), Some(22.90), Some(21.97))
        );
    }

    /// One reading of a synthetic one-CPU `stat` whose lines hold `cpu_fields`.
    fn counters_of(cpu_fields: &str) -> [Option<u64>; 5] {
        let stat = format!(
            "cpu  {cpu_fields}\ncpu0 {cpu_fields}\nintr 0\nctxt 10\nbtime 1717430400\nprocesses 5\n\
             procs_running 1\nprocs_blocked 0\nsoftirq 0 0 0 0 0 0 0 0 0 0 0\n"
        );
        let root = temp_root("proc");
        write(root.path(), STAT, &stat);
        let mut errors = Vec::new();
        let s = sample(&mut NodeSampler::new(root.path()), TS, &mut errors);
        assert!(errors.is_empty(), "{errors:?}");
        [
            s.cpu_user_jiffies,
            s.cpu_system_jiffies,
            s.cpu_iowait_jiffies,
            s.cpu_idle_jiffies,
            s.cpu_steal_jiffies,
        ]
    }

    #[test]
    fn guest_time_is_not_counted_twice_and_steal_is_its_own_counter() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        assert_eq!(
            counters_of("350 7 100 1000 10 3 5 60 140 2"),
            [Some(357), Some(108), Some(10), Some(1000), Some(60)]
        );
    }

    #[test]
    fn fields_an_old_kernel_does_not_write_count_as_zero() {
        // Linux 2.4: user nice system idle only.
        assert_eq!(
            counters_of("350 7 100 1000"),
            [Some(357), Some(100), Some(0), Some(1000), Some(0)]
        );
    }

    #[test]
    fn empty_stat_is_a_parse_error_and_memory_and_load_are_still_read() {
        let root = temp_root("proc");
        write(root.path(), STAT, "");
        let mut errors = Vec::new();
        let s = sample(&mut NodeSampler::new(root.path()), TS, &mut errors);
        assert_eq!(only_parse_error(&errors), root.path().join(STAT));
        assert_eq!(s.cpu_count, 0);
        assert_eq!(s.memory_total_kib, Some(TOTAL_KIB));
        assert_eq!(s.memory_available_kib, Some(AVAILABLE_KIB));
        assert_eq!(s.load1, Some(23.41));
    }

    #[test]
    fn stat_cut_inside_a_cpu_line_is_a_parse_error() {
        let root = temp_root("proc");
        let text = fixture_text("proc", STAT);
        let cut = text.find("cpu3 ").expect("cpu3 line") + "cpu3 51364897 449".len();
        write(root.path(), STAT, &text[..cut]);
        let mut errors = Vec::new();
        let s = sample(&mut NodeSampler::new(root.path()), TS, &mut errors);
        assert_eq!(only_parse_error(&errors), root.path().join(STAT));
        assert_eq!(s.cpu_count, 0);
        assert_eq!(s.memory_total_kib, Some(TOTAL_KIB));
    }

    #[test]
    fn meminfo_cut_mid_line_is_a_parse_error_and_cpu_is_still_read() {
        let root = temp_root("proc");
        let text = fixture_text("proc", MEMINFO);
        let cut = text.find("MemAvailable").expect("MemAvailable line") + "MemAvail".len();
        write(root.path(), MEMINFO, &text[..cut]);
        let mut errors = Vec::new();
        let s = sample(&mut NodeSampler::new(root.path()), TS, &mut errors);
        assert_eq!(only_parse_error(&errors), root.path().join(MEMINFO));
        assert_eq!(s.memory_total_kib, None);
        assert_eq!(s.memory_available_kib, None);
        assert_eq!(s.cpu_count, 8);
        assert_eq!(s.load15, Some(21.96));
    }

    #[test]
    fn meminfo_without_memavailable_counts_cache_and_reclaimable_slab_as_free() {
        let root = temp_root("proc");
        let text: String = fixture_text("proc", MEMINFO)
            .lines()
            .filter(|l| !l.starts_with("MemAvailable:"))
            .map(|l| format!("{l}\n"))
            .collect();
        write(root.path(), MEMINFO, &text);
        let mut errors = Vec::new();
        let s = sample(&mut NodeSampler::new(root.path()), TS, &mut errors);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(s.memory_total_kib, Some(TOTAL_KIB));
        // MemFree 1602114732 + Buffers 1204588 + Cached 279337416
        // + SReclaimable 21987300 kB: MemTotal − 208745388 kB used.
        assert_eq!(s.memory_available_kib, Some(1_904_644_036));
        assert_eq!(TOTAL_KIB - 1_904_644_036, 208_745_388);
    }

    /// The node row of capture `name` (tests/fixtures/README.md, "captures/"),
    /// RAPL included.
    fn capture_sample(name: &str, ts_us: i64, sampler: Option<&mut NodeSampler>) -> NodeSample {
        let capture = Path::new(FIXTURES).join("captures").join(name);
        let mut own = NodeSampler::new(capture.join("proc")).with_rapl(capture.join("sys"));
        let mut errors = Vec::new();
        let s = sample(sampler.unwrap_or(&mut own), ts_us, &mut errors);
        assert!(errors.is_empty(), "{errors:?}");
        s
    }

    #[test]
    fn captures_without_memavailable_give_the_classic_used() {
        // node_exporter v1.5.0's meminfo: MemFree 225472 + Buffers 22040 +
        // Cached 930888 + SReclaimable 44772 kB available, so used is
        // 3742148 − 1223172 = 2518976 kB.
        let s = capture_sample("node_exporter-1.5.0", TS, None);
        assert_eq!(s.memory_total_kib, Some(3_742_148));
        assert_eq!(s.memory_available_kib, Some(1_223_172));
        // procfs': 440324 + 1020128 + 12007640 + 1738124 kB of 15666184:
        // 459968 kB used.
        let s = capture_sample("procfs-3c943fd", TS, None);
        assert_eq!(s.memory_total_kib, Some(15_666_184));
        assert_eq!(s.memory_available_kib, Some(15_206_216));
    }

    #[test]
    fn rapl_energy_is_in_the_node_row() {
        let s = capture_sample("node_exporter-1.5.0", TS, None);
        assert_eq!(s.cpu_package_energy_uj, Some(240_422_366_267));
        assert_eq!(s.dram_energy_uj, None);
        assert_eq!(s.cpu_package_power_w, None);
        let capture = Path::new(FIXTURES).join("captures/procfs-3c943fd");
        let mut sampler = NodeSampler::new(capture.join("proc")).with_rapl(capture.join("sys"));
        capture_sample("procfs-3c943fd", TS, Some(&mut sampler));
        let s = capture_sample("procfs-3c943fd", TS + 1_000_000, Some(&mut sampler));
        assert_eq!(s.cpu_package_energy_uj, Some(480_844_732_534));
        // Unchanged counters over one second: 0 W, not null.
        assert_eq!(s.cpu_package_power_w, Some(0.0));
        assert_eq!(s.dram_power_w, None);
    }

    #[test]
    fn memory_available_never_exceeds_the_total() {
        // Cached as large as MemTotal, as no consistent file has it: MemFree.
        let text: String = fixture_text("proc", MEMINFO)
            .lines()
            .filter(|l| !l.starts_with("MemAvailable:"))
            .map(|l| {
                if l.starts_with("Cached:") {
                    "Cached:         2113389424 kB\n".to_owned()
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        let mem = Meminfo::from_read(text.as_bytes()).expect("meminfo");
        assert_eq!(memory_available(&mem), 1_602_114_732 * 1024);
        // MemAvailable above MemTotal: MemTotal, so used is 0, not negative.
        let text = fixture_text("proc", MEMINFO).replace(
            "MemAvailable:   1876542180 kB",
            "MemAvailable:   2113389425 kB",
        );
        let mem = Meminfo::from_read(text.as_bytes()).expect("meminfo");
        assert_eq!(memory_available(&mem), 2_113_389_424 * 1024);
    }

    #[test]
    fn garbage_meminfo_is_an_error_not_a_panic() {
        let full = fixture_text("proc", MEMINFO);
        for garbage in [
            // procfs would slice the name inside 'ö'.
            format!("{full}Foö 1 kB\n"),
            // 2^54 KiB does not fit in u64 bytes.
            full.replacen(
                "MemTotal:       2113389424 kB",
                "MemTotal: 18014398509481984 kB",
                1,
            ),
            "\u{0}\u{1}\u{2}".to_owned(),
            "MemTotal: many kB\n".to_owned(),
        ] {
            let root = temp_root("proc");
            write(root.path(), MEMINFO, &garbage);
            let mut errors = Vec::new();
            let s = sample(&mut NodeSampler::new(root.path()), TS, &mut errors);
            assert_eq!(
                only_parse_error(&errors),
                root.path().join(MEMINFO),
                "{garbage:?}"
            );
            assert_eq!(s.memory_total_kib, None);
        }
    }

    #[test]
    fn missing_loadavg_is_a_read_error_naming_it() {
        let root = temp_root("proc");
        fs::remove_file(root.path().join(LOADAVG)).expect("remove loadavg");
        let mut errors = Vec::new();
        let s = sample(&mut NodeSampler::new(root.path()), TS, &mut errors);
        match errors.as_slice() {
            [SampleError::Read { path, source }] => {
                assert_eq!(*path, root.path().join(LOADAVG));
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("expected one read error, got {other:?}"),
        }
        assert_eq!((s.load1, s.load5, s.load15), (None, None, None));
        assert_eq!(s.cpu_count, 8);
        assert_eq!(s.memory_total_kib, Some(TOTAL_KIB));
    }

    #[test]
    fn truncated_loadavg_is_a_parse_error() {
        let root = temp_root("proc");
        write(root.path(), LOADAVG, "23.41 22.8");
        let mut errors = Vec::new();
        let s = sample(&mut NodeSampler::new(root.path()), TS, &mut errors);
        assert_eq!(only_parse_error(&errors), root.path().join(LOADAVG));
        assert_eq!(s.load1, None);
    }

    #[test]
    fn parse_errors_name_the_file_and_say_what_is_wrong() {
        let root = temp_root("proc");
        write(root.path(), STAT, "");
        let mut errors = Vec::new();
        sample(&mut NodeSampler::new(root.path()), TS, &mut errors);
        let message = errors.first().map(ToString::to_string).unwrap_or_default();
        assert_eq!(
            message,
            format!(
                "cannot parse {}: the file is empty",
                root.path().join(STAT).display()
            )
        );
    }
}
