//! The job trace of the Acme datacenter (Shanghai AI Lab, NSDI'24;
//! github.com/InternLM/AcmeTrace, `trace_seren.csv` and `trace_kalos.csv`):
//! a CSV with a header. Times look like `2023-03-01 00:18:22+08:00`; a time
//! without a zone is taken in `--utc-offset`. `duration`, `queue` and
//! `gpu_time` are seconds (`queue` is the wait from submit to start, not a
//! queue's name). The two clusters' files differ: Kalos' has four more
//! columns (`mem_per_pod_GB`, `shared_mem_per_pod`, `fail_time`,
//! `stop_time`), kept where the header has them, null where it does not
//! (Seren's). Job types are kept as the trace writes them (`Eval`, not
//! `Evaluation`), like every other text.

use chrono::FixedOffset;

use super::{
    HeaderError, Job, Rows, gpu_time_s, locate, locate_optional, parse_amount, parse_count,
    parse_seconds, parse_state, parse_time, span_s, text,
};

/// The columns an import needs, in any order; others are ignored.
const COLUMNS: [&str; 13] = [
    "job_id",
    "user",
    "node_num",
    "gpu_num",
    "cpu_num",
    "type",
    "state",
    "submit_time",
    "start_time",
    "end_time",
    "duration",
    "queue",
    "gpu_time",
];
const JOB_ID: usize = 0;
const USER: usize = 1;
const NODE_NUM: usize = 2;
const GPU_NUM: usize = 3;
const CPU_NUM: usize = 4;
const TYPE: usize = 5;
const STATE: usize = 6;
const SUBMIT_TIME: usize = 7;
const START_TIME: usize = 8;
const END_TIME: usize = 9;
const DURATION: usize = 10;
const QUEUE: usize = 11;
const GPU_TIME: usize = 12;

/// Kalos' own columns: read where the header has them, null where not.
const KALOS_COLUMNS: [&str; 4] = [
    "fail_time",
    "stop_time",
    "mem_per_pod_GB",
    "shared_mem_per_pod",
];
const FAIL_TIME: usize = 0;
const STOP_TIME: usize = 1;
const MEM_PER_POD_GB: usize = 2;
const SHARED_MEM_PER_POD: usize = 3;

/// Where each column is in the header.
struct At {
    required: [usize; COLUMNS.len()],
    kalos: [Option<usize>; KALOS_COLUMNS.len()],
}

/// Parses a whole Acme trace into `rows`.
pub(super) fn parse(
    bytes: &[u8],
    utc_offset: FixedOffset,
    rows: &mut Rows,
) -> Result<(), HeaderError> {
    let expected = || format!("expected a CSV header with {}", COLUMNS.join(","));
    // Headers are read as the first record, so that every record, the header
    // included, comes with the line it starts on.
    let mut records = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(bytes)
        .into_byte_records();
    let header = match records.next() {
        None => {
            return Err(HeaderError {
                line: 1,
                problem: format!("the file is empty; {}", expected()),
            });
        }
        Some(Err(e)) => {
            return Err(HeaderError {
                line: e.position().map_or(1, |p| p.line()),
                problem: format!("the header cannot be read ({e}); {}", expected()),
            });
        }
        Some(Ok(header)) => header,
    };
    let header_line = header.position().map_or(1, |p| p.line());
    let header_error = |problem: String| HeaderError {
        line: header_line,
        problem: format!("{problem}; {}", expected()),
    };
    let names = header
        .iter()
        .map(std::str::from_utf8)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| header_error("the header is not UTF-8 text".into()))?;
    let at = At {
        required: locate(&names, &COLUMNS).map_err(header_error)?,
        kalos: locate_optional(&names, &KALOS_COLUMNS).map_err(header_error)?,
    };
    for record in records {
        let (line, job) = match record {
            Ok(record) => {
                let line = record.position().map_or(0, |p| p.line());
                // A line of blanks; csv skips only lines that are truly empty.
                if record.len() == 1 && record[0].is_empty() {
                    continue;
                }
                if record.len() != names.len() {
                    let problem = format!(
                        "{} fields where the header has {}",
                        record.len(),
                        names.len()
                    );
                    (line, Err(problem))
                } else {
                    (line, job(&record, &at, utc_offset))
                }
            }
            // Reading from memory without UTF-8 checks cannot fail today;
            // should it, the record is skipped like any other bad line.
            Err(e) => (e.position().map_or(0, |p| p.line()), Err(e.to_string())),
        };
        rows.push(line, job);
    }
    Ok(())
}

/// One job from a record with as many fields as the header.
fn job(record: &csv::ByteRecord, at: &At, utc_offset: FixedOffset) -> Result<Job, String> {
    let field = |name: &str, at: usize| {
        std::str::from_utf8(record.get(at).unwrap_or_default())
            .map_err(|_| format!("{name} is not UTF-8 text"))
    };
    let mut fields = [""; COLUMNS.len()];
    for (column, value) in fields.iter_mut().enumerate() {
        *value = field(COLUMNS[column], at.required[column])?;
    }
    // An absent column reads as an empty field: null.
    let mut kalos = [""; KALOS_COLUMNS.len()];
    for (column, value) in kalos.iter_mut().enumerate() {
        if let Some(i) = at.kalos[column] {
            *value = field(KALOS_COLUMNS[column], i)?;
        }
    }
    let job_id = fields[JOB_ID];
    if job_id.is_empty() {
        return Err("job_id is empty".into());
    }
    let time = |column: usize| {
        parse_time(fields[column], utc_offset).map_err(|e| format!("{}: {e}", COLUMNS[column]))
    };
    let (submit_us, start_us, end_us) = (time(SUBMIT_TIME)?, time(START_TIME)?, time(END_TIME)?);
    let kalos_time = |column: usize| {
        parse_time(kalos[column], utc_offset).map_err(|e| format!("{}: {e}", KALOS_COLUMNS[column]))
    };
    let amount = |column: usize| parse_amount(KALOS_COLUMNS[column], kalos[column]);
    let gpus = parse_count(COLUMNS[GPU_NUM], fields[GPU_NUM])?;
    // The trace's own figures; derived from the times where it has none.
    let duration_s =
        parse_seconds(COLUMNS[DURATION], fields[DURATION])?.or_else(|| span_s(start_us, end_us));
    Ok(Job {
        job_id: job_id.to_owned(),
        user: text(fields[USER]),
        queue: None,
        state: parse_state(fields[STATE])?,
        job_type: text(fields[TYPE]),
        submit_us,
        start_us,
        end_us,
        queue_s: parse_seconds(COLUMNS[QUEUE], fields[QUEUE])?
            .or_else(|| span_s(submit_us, start_us)),
        duration_s,
        nodes: parse_count(COLUMNS[NODE_NUM], fields[NODE_NUM])?,
        gpus,
        cpus: parse_count(COLUMNS[CPU_NUM], fields[CPU_NUM])?,
        node_list: None,
        gpu_time_s: parse_seconds(COLUMNS[GPU_TIME], fields[GPU_TIME])?
            .or_else(|| gpu_time_s(duration_s, gpus)),
        fail_us: kalos_time(FAIL_TIME)?,
        stop_us: kalos_time(STOP_TIME)?,
        mem_per_pod_gb: amount(MEM_PER_POD_GB)?,
        shared_mem_per_pod: amount(SHARED_MEM_PER_POD)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import::{Format, Skipped, Trace};

    const HEADER: &str = "job_id,user,node_num,gpu_num,cpu_num,type,state,submit_time,start_time,end_time,duration,queue,gpu_time";

    fn parse(text: &str) -> Trace {
        Trace::parse(
            Format::Acme,
            text.as_bytes(),
            FixedOffset::east_opt(8 * 3600).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn seren_and_kalos_rows() {
        let trace = parse(&format!(
            "{HEADER}\n\
             6001234,u0042,2,16,256,Pretrain,COMPLETED,2023-04-02 09:00:00+08:00,2023-04-02 09:01:40+08:00,2023-04-02 10:01:40+08:00,3600,100,57600.0\n\
             dlc2x9,uf001,1,8,120,Eval,NODE_FAIL,2023-06-01 01:00:00+00:00,2023-06-01 01:00:10+00:00,2023-06-01 01:05:10+00:00,300,10.0,2400.0\n"
        ));
        assert_eq!(trace.skipped, vec![]);
        assert_eq!(
            trace.jobs[0],
            Job {
                job_id: "6001234".into(),
                user: Some("u0042".into()),
                state: Some("COMPLETED".into()),
                job_type: Some("Pretrain".into()),
                // 2023-04-02T01:00:00Z
                submit_us: Some(1_680_397_200_000_000),
                start_us: Some(1_680_397_300_000_000),
                end_us: Some(1_680_400_900_000_000),
                queue_s: Some(100),
                duration_s: Some(3600),
                nodes: Some(2),
                gpus: Some(16),
                cpus: Some(256),
                gpu_time_s: Some(57600),
                ..Job::default()
            }
        );
        let kalos = &trace.jobs[1];
        // 2023-06-01T01:00:00Z: the zone in the text, not the +08:00 option.
        assert_eq!(kalos.submit_us, Some(1_685_581_200_000_000));
        assert_eq!(kalos.queue_s, Some(10));
        assert_eq!(kalos.state.as_deref(), Some("NODE_FAIL"));
        // The trace's own spelling of the type, not the paper's.
        assert_eq!(kalos.job_type.as_deref(), Some("Eval"));
        // Seren's layout has none of Kalos' columns.
        assert_eq!(
            (kalos.fail_us, kalos.stop_us),
            (None, None),
            "no fail_time or stop_time column"
        );
        assert_eq!(
            (kalos.mem_per_pod_gb, kalos.shared_mem_per_pod),
            (None, None)
        );
    }

    /// Kalos' header (github.com/InternLM/AcmeTrace, README.md) and its two
    /// example rows, then rows with the optional fields empty or wrong.
    #[test]
    fn kalos_columns_are_kept() {
        let text = "job_id,user,node_num,gpu_num,cpu_num,mem_per_pod_GB,shared_mem_per_pod,type,state,submit_time,start_time,end_time,fail_time,stop_time,duration,queue,gpu_time\n\
            dlctk696s0jbvitv,uf794,8,64,960,1000,100.0,Other,FAILED,2023-05-17 11:00:58+00:00,2023-05-17 11:01:08+00:00,2023-05-17 11:01:16+00:00,2023-05-17 11:01:16+00:00,,18,10.0,1152.0\n\
            dlc1t2ypl09b8qtp,uf794,8,64,960,1000,100.0,Other,CANCELLED,2023-05-17 11:28:42+00:00,2023-05-17 11:28:54+00:00,2023-05-17 11:30:04+00:00,,2023-05-17 11:30:04+00:00,82,12.0,5248.0\n\
            k3,uf1,1,0,4,,,Debug,COMPLETED,2023-05-17 12:00:00,2023-05-17 12:00:01,2023-05-17 12:00:02,,,1,1.0,0.0\n\
            k4,uf1,1,8,4,-1,,Debug,COMPLETED,2023-05-17 12:00:00,2023-05-17 12:00:01,2023-05-17 12:00:02,,,1,1.0,8.0\n\
            k5,uf1,1,8,4,16,2,Debug,FAILED,2023-05-17 12:00:00,2023-05-17 12:00:01,2023-05-17 12:00:02,soon,,1,1.0,8.0\n";
        let trace = parse(text);
        let failed = &trace.jobs[0];
        // 2023-05-17T11:01:16Z
        let t = 1_684_321_276_000_000;
        assert_eq!(
            failed,
            &Job {
                job_id: "dlctk696s0jbvitv".into(),
                user: Some("uf794".into()),
                state: Some("FAILED".into()),
                job_type: Some("Other".into()),
                submit_us: Some(t - 18_000_000),
                start_us: Some(t - 8_000_000),
                end_us: Some(t),
                queue_s: Some(10),
                duration_s: Some(18),
                nodes: Some(8),
                gpus: Some(64),
                cpus: Some(960),
                gpu_time_s: Some(1152),
                fail_us: Some(t),
                stop_us: None,
                mem_per_pod_gb: Some(1000.0),
                shared_mem_per_pod: Some(100.0),
                ..Job::default()
            }
        );
        let cancelled = &trace.jobs[1];
        // 2023-05-17T11:30:04Z
        assert_eq!(
            (cancelled.fail_us, cancelled.stop_us),
            (None, Some(1_684_323_004_000_000))
        );
        // Empty is null; the --utc-offset (+08:00) is not applied to what is null.
        let cpu_job = &trace.jobs[2];
        assert_eq!(
            (
                cpu_job.mem_per_pod_gb,
                cpu_job.shared_mem_per_pod,
                cpu_job.fail_us
            ),
            (None, None, None)
        );
        let skipped = |line: u64, reason: &str| Skipped {
            line,
            reason: reason.into(),
        };
        assert_eq!(
            trace.skipped,
            vec![
                skipped(5, "mem_per_pod_GB \"-1\" is not a non-negative number"),
                skipped(
                    6,
                    "fail_time: \"soon\" is not a time like 2024-03-01T10:00:00"
                ),
            ]
        );
    }

    #[test]
    fn missing_figures_are_derived_from_the_times() {
        let trace = parse(&format!(
            "{HEADER}\n7,u1,1,4,16,SFT,COMPLETED,2023-04-02 09:00:00,2023-04-02 09:00:30,2023-04-02 09:10:30,,,\n"
        ));
        let job = &trace.jobs[0];
        assert_eq!(
            (job.queue_s, job.duration_s, job.gpu_time_s),
            (Some(30), Some(600), Some(2400))
        );
    }

    #[test]
    fn quoting_extra_columns_and_column_order() {
        let text = "\u{FEFF}queue,gpu_time,duration,end_time,start_time,submit_time,state,type,cpu_num,gpu_num,node_num,user,job_id,mem_per_pod_GB\n\
                    0,0.0,0,,,\"2023-04-02 09:00:00\",CANCELLED,\"Debug, interactive\",4,0,1,\"u\"\"q\",\"a,b\",16\n";
        let trace = parse(text);
        assert_eq!(trace.skipped, vec![]);
        let job = &trace.jobs[0];
        assert_eq!(job.job_id, "a,b");
        assert_eq!(job.user.as_deref(), Some("u\"q"));
        assert_eq!(job.job_type.as_deref(), Some("Debug, interactive"));
        assert_eq!((job.start_us, job.end_us, job.gpus), (None, None, Some(0)));
        // Kalos' column, read wherever it stands.
        assert_eq!(job.mem_per_pod_gb, Some(16.0));
    }

    #[test]
    fn bad_records_are_skipped_with_their_line_numbers() {
        let mut bytes = format!(
            "{HEADER}\n\
             1,u,1,8,64,SFT,COMPLETED,2023-04-02 09:00:00,2023-04-02 09:00:00,2023-04-02 09:00:00,0,0,0\n\
             2,u,1,8,64,\"Multi\nline\",COMPLETED,2023-04-02 09:00:00,2023-04-02 09:00:00,2023-04-02 09:00:00,0,0,0\n\
             3,u,1,eight,64,SFT,COMPLETED,2023-04-02 09:00:00,2023-04-02 09:00:00,2023-04-02 09:00:00,0,0,0\n\
             \x20\x20\n\
             4,u,1,8,64,SFT,COMPLETED\n\
             ,u,1,8,64,SFT,COMPLETED,2023-04-02 09:00:00,2023-04-02 09:00:00,2023-04-02 09:00:00,0,0,0\n\
             5,u,1,8,64,SFT,COMPLETED,2023-02-30 09:00:00,2023-04-02 09:00:00,2023-04-02 09:00:00,0,0,0\n\
             6,u,1,8,64,SFT,COMPLETED,2023-04-02 09:00:00,2023-04-02 09:00:00,2023-04-02 09:00:00,-5,0,0\n"
        )
        .into_bytes();
        bytes.extend_from_slice(b"7,\xff,1,8,64,SFT,COMPLETED,,,,0,0,0\n\"8,u,1,8\n");
        let trace = Trace::parse(Format::Acme, &bytes, FixedOffset::east_opt(0).unwrap()).unwrap();
        assert_eq!(
            trace
                .jobs
                .iter()
                .map(|j| j.job_id.as_str())
                .collect::<Vec<_>>(),
            ["1", "2"]
        );
        let skipped = |line: u64, reason: &str| Skipped {
            line,
            reason: reason.into(),
        };
        assert_eq!(
            trace.skipped,
            vec![
                skipped(5, "gpu_num \"eight\" is not a count"),
                skipped(7, "7 fields where the header has 13"),
                skipped(8, "job_id is empty"),
                skipped(
                    9,
                    "submit_time: \"2023-02-30 09:00:00\" is not a date in the calendar"
                ),
                skipped(10, "duration \"-5\" is not a number of seconds"),
                skipped(11, "user is not UTF-8 text"),
                // An unclosed quote runs to the end of the file.
                skipped(12, "1 fields where the header has 13"),
            ]
        );
    }

    #[test]
    fn header_errors() {
        let utc = FixedOffset::east_opt(0).unwrap();
        let err = |text: &[u8]| Trace::parse(Format::Acme, text, utc).unwrap_err();
        assert!(err(b"").problem.starts_with("the file is empty"));
        let e = err(b"job_id,user,state\n1,u,COMPLETED\n");
        assert_eq!(e.line, 1);
        assert!(
            e.problem
                .starts_with("the header lacks node_num, gpu_num, cpu_num, type, submit_time"),
            "{e:?}"
        );
        let e = err(format!("{HEADER},user\n").as_bytes());
        assert!(
            e.problem.starts_with("the header names column user twice"),
            "{e:?}"
        );
        let e = err(format!("{HEADER},fail_time,FAIL_TIME\n").as_bytes());
        assert!(
            e.problem
                .starts_with("the header names column fail_time twice"),
            "{e:?}"
        );
    }
}
