//! The XID catalogue: what each XID code NVIDIA documents means, its failure
//! category, what usually causes it and what clears it.
//!
//! The data is one file, `schemas/xid/xids.csv`, compiled in here and read by
//! DuckDB as is (view `xid_catalogue` of `schemas/sql/views.sql`), so the
//! agent's `err_msg` label, the collector's alert categories and SQL analyses
//! all read the same rows. Its header comment names the sources.

use std::fmt;
use std::sync::LazyLock;

/// The catalogue file's text.
pub const CSV: &str = include_str!("../xid/xids.csv");

/// dcgm-exporter's `err_msg` for an XID it has no text for (NVML's 999,
/// "unknown XID", among them).
pub const UNKNOWN_ERR_MSG: &str = "Unknown Error";

/// Where a failure comes from, coarsely enough to count failures by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum XidCategory {
    /// The board, PCIe, InfoROM, copy and video engines.
    Hardware,
    /// NVLink, C2C and NVLink confidential-computing errors.
    Nvlink,
    /// ECC, row remapping, containment, resource retirement.
    Memory,
    /// Firmware, GSP, micro-controllers, GPU timeouts, vGPU.
    Driver,
    /// Faults of the program running on the GPU.
    Application,
    /// Auxiliary power and power smoothing.
    ThermalPower,
    /// Test messages, DLA, the recovery-action summary (154).
    Other,
}

impl XidCategory {
    /// Every category, in the catalogue's order of description.
    pub const ALL: [XidCategory; 7] = [
        XidCategory::Hardware,
        XidCategory::Nvlink,
        XidCategory::Memory,
        XidCategory::Driver,
        XidCategory::Application,
        XidCategory::ThermalPower,
        XidCategory::Other,
    ];

    /// The name the catalogue, the alert rules and SQL use.
    pub fn name(self) -> &'static str {
        match self {
            XidCategory::Hardware => "hardware",
            XidCategory::Nvlink => "nvlink",
            XidCategory::Memory => "memory",
            XidCategory::Driver => "driver",
            XidCategory::Application => "application",
            XidCategory::ThermalPower => "thermal_power",
            XidCategory::Other => "other",
        }
    }

    /// The category named `name`, if there is one.
    pub fn from_name(name: &str) -> Option<XidCategory> {
        XidCategory::ALL.into_iter().find(|c| c.name() == name)
    }
}

impl fmt::Display for XidCategory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One row of the catalogue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xid {
    pub code: u64,
    /// NVIDIA's identifier, e.g. `ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS`.
    pub mnemonic: String,
    /// NVIDIA's description, e.g. "GPU has fallen off the bus".
    pub name: String,
    pub category: XidCategory,
    /// Whether NVIDIA lists the code for A100, H100, B100 or GB200.
    pub ampere_plus: bool,
    /// What usually triggers it; may be empty.
    pub cause: String,
    /// NVIDIA's immediate resolution bucket (`RESET_GPU`, `RESTART_APP` …); may be empty.
    pub action: String,
    /// What clears it: one of [`RESETS`].
    pub reset: String,
}

/// The values of the `reset` column.
pub const RESETS: [&str; 5] = ["none", "gpu", "node", "conditional", "unknown"];

/// The catalogue's columns, in file order.
const COLUMNS: [&str; 8] = [
    "code",
    "mnemonic",
    "name",
    "category",
    "ampere_plus",
    "cause",
    "action",
    "reset",
];

/// Every row, by code, parsed once. The file is part of the program, and a
/// test parses it: a malformed row is a build defect, hence the panic.
static CATALOGUE: LazyLock<Vec<Xid>> = LazyLock::new(|| match parse(CSV) {
    Ok(rows) => rows,
    Err(e) => panic!("schemas/xid/xids.csv: {e}"),
});

/// Every XID of the catalogue, in code order.
pub fn catalogue() -> &'static [Xid] {
    &CATALOGUE
}

/// The catalogue's row for `code`.
pub fn lookup(code: u64) -> Option<&'static Xid> {
    let rows = catalogue();
    rows.binary_search_by_key(&code, |x| x.code)
        .ok()
        .map(|i| &rows[i])
}

/// dcgm-exporter's `err_msg` label for `code`: the catalogue's name, or
/// [`UNKNOWN_ERR_MSG`] for a code it lacks.
pub fn err_msg(code: u64) -> &'static str {
    lookup(code).map_or(UNKNOWN_ERR_MSG, |x| x.name.as_str())
}

/// The category of `code`; None for a code the catalogue lacks.
pub fn category(code: u64) -> Option<XidCategory> {
    lookup(code).map(|x| x.category)
}

/// Parses catalogue text: `#` comment lines, a header naming [`COLUMNS`],
/// then one row per code in increasing order.
fn parse(text: &str) -> Result<Vec<Xid>, String> {
    let mut reader = csv::ReaderBuilder::new()
        .comment(Some(b'#'))
        .from_reader(text.as_bytes());
    let header = reader.headers().map_err(|e| e.to_string())?;
    if header.iter().ne(COLUMNS) {
        return Err(format!("the header is {header:?}, expected {COLUMNS:?}"));
    }
    let mut rows: Vec<Xid> = Vec::new();
    for record in reader.records() {
        let record = record.map_err(|e| e.to_string())?;
        let line = record.position().map_or(0, |p| p.line());
        let field = |i: usize| record.get(i).unwrap_or_default().to_owned();
        let code: u64 = field(0)
            .parse()
            .map_err(|e| format!("line {line}: code {:?}: {e}", field(0)))?;
        let category = XidCategory::from_name(&field(3))
            .ok_or_else(|| format!("line {line}: unknown category {:?}", field(3)))?;
        let ampere_plus = match field(4).as_str() {
            "true" => true,
            "false" => false,
            other => {
                return Err(format!(
                    "line {line}: ampere_plus {other:?} is not true or false"
                ));
            }
        };
        let reset = field(7);
        if !RESETS.contains(&reset.as_str()) {
            return Err(format!(
                "line {line}: reset {reset:?} is not one of {RESETS:?}"
            ));
        }
        if rows.last().is_some_and(|prev| prev.code >= code) {
            return Err(format!(
                "line {line}: code {code} is out of order or repeated"
            ));
        }
        rows.push(Xid {
            code,
            mnemonic: field(1),
            name: field(2),
            category,
            ampere_plus,
            cause: field(5),
            action: field(6),
            reset,
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalogue_covers_every_documented_code_once() {
        let codes: Vec<u64> = catalogue().iter().map(|x| x.code).collect();
        assert_eq!(codes, (1..=172).collect::<Vec<u64>>());
        assert!(
            catalogue()
                .iter()
                .all(|x| !x.name.is_empty() && !x.mnemonic.is_empty())
        );
        // Each category is used.
        for category in XidCategory::ALL {
            assert!(
                catalogue().iter().any(|x| x.category == category),
                "{category} unused"
            );
        }
    }

    #[test]
    fn well_known_codes_read_as_nvidia_documents_them() {
        let row = |code| lookup(code).expect("in the catalogue");
        let x79 = row(79);
        assert_eq!(
            (
                x79.name.as_str(),
                x79.category,
                x79.action.as_str(),
                x79.reset.as_str(),
                x79.ampere_plus
            ),
            (
                "GPU has fallen off the bus",
                XidCategory::Hardware,
                "RESTART_BM",
                "node",
                true
            )
        );
        assert_eq!(
            row(79).mnemonic,
            "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
        );
        for (code, name, category, reset) in [
            (
                13,
                "Graphics Engine Exception",
                XidCategory::Application,
                "none",
            ),
            (
                31,
                "GPU memory page fault",
                XidCategory::Application,
                "none",
            ),
            (48, "Double Bit ECC Error", XidCategory::Memory, "gpu"),
            (
                63,
                "GPU memory remapping event",
                XidCategory::Memory,
                "none",
            ),
            (74, "NVLINK Error", XidCategory::Nvlink, "gpu"),
            (
                54,
                "Auxiliary power is not connected to the GPU board",
                XidCategory::ThermalPower,
                "none",
            ),
            (
                62,
                "Internal micro-controller halt (newer drivers)",
                XidCategory::Driver,
                "gpu",
            ),
            (94, "Contained memory error", XidCategory::Memory, "none"),
            (95, "Uncontained memory error", XidCategory::Memory, "gpu"),
            (119, "GSP RPC Timeout", XidCategory::Driver, "gpu"),
            (
                149,
                "NVLINK: NETIR Error",
                XidCategory::Nvlink,
                "conditional",
            ),
            (
                154,
                "GPU Recovery Action Changed",
                XidCategory::Other,
                "conditional",
            ),
        ] {
            let x = row(code);
            assert_eq!(
                (x.name.as_str(), x.category, x.reset.as_str()),
                (name, category, reset),
                "XID {code}"
            );
        }
        // A code NVIDIA no longer uses keeps its earlier description.
        assert_eq!(
            row(61).name,
            "Internal micro-controller breakpoint/warning (newer drivers)"
        );
        assert!(!row(61).ampere_plus);
        // A name with a comma is one field.
        assert!(
            row(45)
                .name
                .starts_with("Preemptive cleanup, due to previous errors")
        );
    }

    #[test]
    fn err_msg_is_the_name_or_dcgm_exporters_unknown_error() {
        assert_eq!(err_msg(79), "GPU has fallen off the bus");
        assert_eq!(err_msg(48), "Double Bit ECC Error");
        // NVML's "unknown XID", 0 ("no error") and codes past the catalogue.
        assert_eq!(err_msg(999), "Unknown Error");
        assert_eq!(err_msg(0), "Unknown Error");
        assert_eq!(err_msg(173), "Unknown Error");
        assert_eq!(category(79), Some(XidCategory::Hardware));
        assert_eq!(category(999), None);
    }

    #[test]
    fn categories_round_trip_by_name() {
        for category in XidCategory::ALL {
            assert_eq!(XidCategory::from_name(category.name()), Some(category));
        }
        assert_eq!(
            XidCategory::from_name("thermal_power"),
            Some(XidCategory::ThermalPower)
        );
        assert_eq!(XidCategory::from_name("Hardware"), None);
    }

    #[test]
    fn malformed_catalogues_are_refused_with_the_line() {
        let header = COLUMNS.join(",");
        let ok = format!("# comment\n{header}\n1,M,Name,other,false,,IGNORE,none\n");
        assert_eq!(parse(&ok).map(|r| r.len()), Ok(1));
        for (body, want) in [
            (
                "1,M,N,cosmic,false,,,none\n",
                "line 3: unknown category \"cosmic\"",
            ),
            (
                "1,M,N,other,yes,,,none\n",
                "line 3: ampere_plus \"yes\" is not true or false",
            ),
            (
                "1,M,N,other,false,,,soon\n",
                "line 3: reset \"soon\" is not one of",
            ),
            (
                "2,M,N,other,false,,,none\n1,M,N,other,false,,,none\n",
                "line 4: code 1 is out of order or repeated",
            ),
            ("x,M,N,other,false,,,none\n", "line 3: code \"x\""),
        ] {
            let err = parse(&format!("# comment\n{header}\n{body}")).expect_err(body);
            assert!(err.starts_with(want), "{body}: {err}");
        }
        let err = parse("code,name\n1,x\n").expect_err("bad header");
        assert!(err.starts_with("the header is"), "{err}");
    }
}
