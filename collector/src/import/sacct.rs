//! Slurm's `sacct --parsable2 --allocations --format=JobID,User,Partition,State,Submit,Start,End,NNodes,AllocTRES,NodeList`:
//! `|`-separated, a header naming the columns, no quoting. `--parsable`
//! (a trailing `|` on every line) is read too.

use chrono::FixedOffset;

use super::{
    HeaderError, Job, Rows, gpu_time_s, locate, parse_count, parse_state, parse_time, span_s, text,
};

/// The columns an import needs, in any order; others are ignored.
const COLUMNS: [&str; 10] = [
    "JobID",
    "User",
    "Partition",
    "State",
    "Submit",
    "Start",
    "End",
    "NNodes",
    "AllocTRES",
    "NodeList",
];
const JOB_ID: usize = 0;
const USER: usize = 1;
const PARTITION: usize = 2;
const STATE: usize = 3;
const SUBMIT: usize = 4;
const START: usize = 5;
const END: usize = 6;
const NNODES: usize = 7;
const ALLOC_TRES: usize = 8;
const NODE_LIST: usize = 9;

const COMMAND: &str = "sacct --parsable2 --allocations \
     --format=JobID,User,Partition,State,Submit,Start,End,NNodes,AllocTRES,NodeList";

/// Parses a whole sacct dump into `rows`.
pub(super) fn parse(
    bytes: &[u8],
    utc_offset: FixedOffset,
    rows: &mut Rows,
) -> Result<(), HeaderError> {
    let mut lines = bytes
        .split(|b| *b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
        .zip(1_u64..)
        .filter(|(line, _)| !line.trim_ascii().is_empty());
    let Some((header, header_line)) = lines.next() else {
        return Err(HeaderError {
            line: 1,
            problem: format!("the file is empty; expected the output of {COMMAND}"),
        });
    };
    let header_error = |problem: String| HeaderError {
        line: header_line,
        problem: format!("{problem}; expected the output of {COMMAND}"),
    };
    let header = std::str::from_utf8(header)
        .map_err(|_| header_error("the header is not UTF-8 text".into()))?;
    let mut names: Vec<&str> = header.split('|').map(str::trim).collect();
    // `--parsable` ends every line with a `|`.
    let trailing = names.len() > 1 && names.last() == Some(&"");
    if trailing {
        names.pop();
    }
    let at = locate(&names, &COLUMNS).map_err(header_error)?;
    for (line, number) in lines {
        let job = std::str::from_utf8(line)
            .map_err(|_| "the line is not UTF-8 text".to_owned())
            .and_then(|line| {
                let line = if trailing {
                    line.strip_suffix('|').unwrap_or(line)
                } else {
                    line
                };
                let fields: Vec<&str> = line.split('|').collect();
                if fields.len() != names.len() {
                    return Err(format!(
                        "{} fields where the header has {}",
                        fields.len(),
                        names.len()
                    ));
                }
                job(|column| fields[at[column]], utc_offset)
            });
        rows.push(number, job);
    }
    Ok(())
}

/// One allocation line; `field` gives the value of one of [`COLUMNS`].
fn job<'a>(field: impl Fn(usize) -> &'a str, utc_offset: FixedOffset) -> Result<Job, String> {
    let job_id = field(JOB_ID).trim();
    if job_id.is_empty() {
        return Err("JobID is empty".into());
    }
    if job_id.contains('.') {
        return Err(format!(
            "{job_id} is a job step, not an allocation; run sacct with --allocations"
        ));
    }
    let time = |column: usize| {
        parse_time(field(column), utc_offset).map_err(|e| format!("{}: {e}", COLUMNS[column]))
    };
    let (submit_us, start_us, end_us) = (time(SUBMIT)?, time(START)?, time(END)?);
    let tres = parse_alloc_tres(field(ALLOC_TRES))?;
    let duration_s = span_s(start_us, end_us);
    Ok(Job {
        job_id: job_id.to_owned(),
        user: text(field(USER)),
        queue: text(field(PARTITION)),
        state: parse_state(field(STATE))?,
        job_type: None,
        submit_us,
        start_us,
        end_us,
        queue_s: span_s(submit_us, start_us),
        duration_s,
        nodes: parse_count("NNodes", field(NNODES))?,
        gpus: tres.gpus,
        cpus: tres.cpus,
        node_list: text(field(NODE_LIST)).filter(|n| n != "None assigned"),
        gpu_time_s: gpu_time_s(duration_s, tres.gpus),
        // Kalos' columns; sacct has nothing like them.
        ..Job::default()
    })
}

/// What an allocation holds, from `AllocTRES`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tres {
    pub cpus: Option<i32>,
    pub gpus: Option<i32>,
}

/// Parses `AllocTRES`, e.g. `billing=8,cpu=64,gres/gpu=8,mem=512G,node=1`.
/// GPUs come from `gres/gpu=N`, or else the sum of the typed
/// `gres/gpu:TYPE=N` entries (Slurm often lists both, the untyped one being
/// the total); an allocation without GPUs has 0. An empty `AllocTRES` (a job
/// that never ran) leaves both null.
pub fn parse_alloc_tres(value: &str) -> Result<Tres, String> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(Tres::default());
    }
    let mut cpus = None;
    let mut gpus = None;
    let mut typed_gpus: Option<i32> = None;
    for entry in value.split(',') {
        let Some((name, count)) = entry.split_once('=').filter(|(n, _)| !n.is_empty()) else {
            return Err(format!("AllocTRES entry {entry:?} is not name=value"));
        };
        let count = || {
            parse_count(&format!("AllocTRES {name}"), count)?
                .ok_or_else(|| format!("AllocTRES {name} has no count"))
        };
        if name == "cpu" {
            cpus = Some(count()?);
        } else if name == "gres/gpu" {
            gpus = Some(count()?);
        } else if name.starts_with("gres/gpu:") {
            let sum = typed_gpus.unwrap_or(0).checked_add(count()?);
            typed_gpus = Some(sum.ok_or_else(|| format!("AllocTRES {value:?} has too many GPUs"))?);
        }
    }
    Ok(Tres {
        cpus,
        gpus: gpus.or(typed_gpus).or(Some(0)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import::{Format, Skipped, Trace};

    fn tres(cpus: Option<i32>, gpus: Option<i32>) -> Tres {
        Tres { cpus, gpus }
    }

    #[test]
    fn alloc_tres() {
        assert_eq!(
            parse_alloc_tres("billing=8,cpu=64,gres/gpu=8,mem=512G,node=1"),
            Ok(tres(Some(64), Some(8)))
        );
        assert_eq!(
            parse_alloc_tres("billing=16,cpu=128,gres/gpu:h100=16,mem=1T,node=2"),
            Ok(tres(Some(128), Some(16)))
        );
        // Typed and untyped together: the untyped entry is the total.
        assert_eq!(
            parse_alloc_tres("cpu=32,gres/gpu:a100=4,gres/gpu=4,mem=256G,node=1"),
            Ok(tres(Some(32), Some(4)))
        );
        assert_eq!(
            parse_alloc_tres("cpu=32,gres/gpu:a100=2,gres/gpu:v100=2"),
            Ok(tres(Some(32), Some(4)))
        );
        // GPU memory and utilisation TRES are not GPUs.
        assert_eq!(
            parse_alloc_tres("cpu=4,gres/gpumem=40G,gres/gpuutil=0,mem=16G,node=1"),
            Ok(tres(Some(4), Some(0)))
        );
        assert_eq!(parse_alloc_tres(""), Ok(tres(None, None)));
        for bad in [
            "cpu=64,,node=1",
            "cpu",
            "=4",
            "cpu=lots",
            "cpu=",
            "gres/gpu=-1",
            "gres/gpu:a=2147483647,gres/gpu:b=1",
        ] {
            assert!(parse_alloc_tres(bad).is_err(), "{bad:?}");
        }
    }

    const HEADER: &str = "JobID|User|Partition|State|Submit|Start|End|NNodes|AllocTRES|NodeList";

    #[test]
    fn columns_in_any_order_and_extra_columns() {
        let text = "JobName|NodeList|AllocTRES|NNodes|End|Start|Submit|State|Partition|User|JobID\n\
                    train|gpu-[01-02]|cpu=8,gres/gpu=2|2|2024-03-01T11:00:00|2024-03-01T10:00:00|2024-03-01T09:59:00|COMPLETED|gpu|ann|77\n";
        let trace = Trace::parse(
            Format::Sacct,
            text.as_bytes(),
            FixedOffset::east_opt(0).unwrap(),
        )
        .unwrap();
        assert_eq!(trace.skipped, vec![]);
        let job = &trace.jobs[0];
        assert_eq!(job.job_id, "77");
        assert_eq!(job.user.as_deref(), Some("ann"));
        assert_eq!(job.node_list.as_deref(), Some("gpu-[01-02]"));
        assert_eq!(
            (
                job.nodes,
                job.gpus,
                job.cpus,
                job.queue_s,
                job.duration_s,
                job.gpu_time_s
            ),
            (Some(2), Some(2), Some(8), Some(60), Some(3600), Some(7200))
        );
    }

    #[test]
    fn parsable_with_trailing_bars() {
        let text = format!(
            "{HEADER}|\n5|u|p|PENDING|2024-03-01T10:00:00|Unknown|Unknown|1||None assigned|\r\n"
        );
        let trace = Trace::parse(
            Format::Sacct,
            text.as_bytes(),
            FixedOffset::east_opt(0).unwrap(),
        )
        .unwrap();
        assert_eq!(trace.skipped, vec![]);
        let job = &trace.jobs[0];
        assert_eq!(job.state.as_deref(), Some("PENDING"));
        assert_eq!(
            (job.start_us, job.end_us, job.node_list.as_deref()),
            (None, None, None)
        );
        assert_eq!((job.gpus, job.cpus, job.duration_s), (None, None, None));
    }

    #[test]
    fn header_errors() {
        let utc = FixedOffset::east_opt(0).unwrap();
        let err = |text: &[u8]| Trace::parse(Format::Sacct, text, utc).unwrap_err();
        let e = err(b"");
        assert_eq!(e.line, 1);
        assert!(e.problem.starts_with("the file is empty"), "{e:?}");
        let e = err(b"JobID|User|State\n1|a|COMPLETED\n");
        assert_eq!(e.line, 1);
        assert!(
            e.problem.starts_with(
                "the header lacks Partition, Submit, Start, End, NNodes, AllocTRES, NodeList; expected the output of sacct --parsable2"
            ),
            "{e:?}"
        );
        // --noheader output: the first job is taken for a header, and fails.
        let e = err(b"\n\n1|a|gpu|COMPLETED|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T10:00:00|1||n\n");
        assert_eq!(e.line, 3);
        assert!(e.problem.starts_with("the header lacks JobID"), "{e:?}");
        let e = err(b"JobID|User|\xff\n");
        assert!(e.problem.starts_with("the header is not UTF-8"), "{e:?}");
    }

    #[test]
    fn bad_lines_are_skipped_with_their_numbers() {
        let text = format!(
            "{HEADER}\n\
             1|a|p|COMPLETED|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T10:00:00|1||n\n\
             \n\
             1.batch|a|p|COMPLETED|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T10:00:00|1||n\n\
             2|a|p|COMPLETED|2024-03-01T10:00:00\n\
             |a|p|COMPLETED|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T10:00:00|1||n\n\
             3|a|p|COMPLETED|yesterday|2024-03-01T10:00:00|2024-03-01T10:00:00|1||n\n\
             4|a|p|COMPLETED|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T10:00:00|one||n\n\
             5|a|p|\u{1F600}|2024-03-01T10:00:00|2024-03-01T10:00:00|2024-03-01T10:00:00|1||n\n"
        );
        let mut bytes = text.into_bytes();
        bytes.extend_from_slice(b"6|\xff|p|COMPLETED|||||||\n");
        let trace = Trace::parse(Format::Sacct, &bytes, FixedOffset::east_opt(0).unwrap()).unwrap();
        assert_eq!(trace.jobs.len(), 1);
        assert_eq!(trace.records, 8);
        let skipped = |line: u64, reason: &str| Skipped {
            line,
            reason: reason.into(),
        };
        assert_eq!(
            trace.skipped,
            vec![
                skipped(
                    4,
                    "1.batch is a job step, not an allocation; run sacct with --allocations"
                ),
                skipped(5, "5 fields where the header has 10"),
                skipped(6, "JobID is empty"),
                skipped(
                    7,
                    "Submit: \"yesterday\" is not a time like 2024-03-01T10:00:00"
                ),
                skipped(8, "NNodes \"one\" is not a count"),
                skipped(
                    9,
                    "state \"\u{1F600}\" is not a job state such as COMPLETED"
                ),
                skipped(10, "the line is not UTF-8 text"),
            ]
        );
    }
}
