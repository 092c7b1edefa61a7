//! The job trace of the Acme datacenter (Shanghai AI Lab, NSDI'24;
//! github.com/InternLM/AcmeTrace, `trace_seren.csv` and `trace_kalos.csv`):
//! a CSV with a header. Times look like `2023-03-01 00:18:22+08:00`; a time
//! without a zone is taken in `--utc-offset`. `duration`, `queue` and
//! `gpu_time` are seconds (`queue` is the wait from submit to start, not a
//! queue's name). Kalos' extra columns (`mem_per_pod_GB`, `fail_time`, ...)
//! are ignored.

use chrono::FixedOffset;

use super::{
    HeaderError, Job, Rows, gpu_time_s, locate, parse_count, parse_seconds, parse_state,
    parse_time, span_s, text,
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
    let at = locate(&names, &COLUMNS).map_err(header_error)?;
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
fn job(record: &csv::ByteRecord, at: &[usize; 13], utc_offset: FixedOffset) -> Result<Job, String> {
    let mut fields = [""; 13];
    for (column, field) in fields.iter_mut().enumerate() {
        let bytes = record.get(at[column]).unwrap_or_default();
        *field = std::str::from_utf8(bytes)
            .map_err(|_| format!("{} is not UTF-8 text", COLUMNS[column]))?;
    }
    let job_id = fields[JOB_ID];
    if job_id.is_empty() {
        return Err("job_id is empty".into());
    }
    let time = |column: usize| {
        parse_time(fields[column], utc_offset).map_err(|e| format!("{}: {e}", COLUMNS[column]))
    };
    let (submit_us, start_us, end_us) = (time(SUBMIT_TIME)?, time(START_TIME)?, time(END_TIME)?);
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
             dlc2x9,uf001,1,8,120,Evaluation,NODE_FAIL,2023-06-01 01:00:00+00:00,2023-06-01 01:00:10+00:00,2023-06-01 01:05:10+00:00,300,10.0,2400.0\n"
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
    }
}
