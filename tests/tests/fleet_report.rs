//! `gputel-collector report`: the fleet report's numbers against DuckDB
//! running the shipped SQL on the same store (exact for times, counts and
//! sums; within one hundredth, the report's resolution, for quantiles), the
//! page well-formed and self-contained, and every figure drawn by a real
//! headless browser with no console error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use gputel_tests::{collector_bin, provided_path};
use serde_json::Value;

/// Two nodes over two hours (08:58 to 09:03, crossing an hour): n1's two
/// GPUs sampled every second, n2's two every 15 s, with values spread by a
/// hash so that the CDFs have thousands of steps; n1's GPU 1 misses a
/// minute (a gap the weights cap at 3 samples). Jobs a (n1), b (n2 GPU 0)
/// and a stretch of nothing on n2 GPU 1; a pod on n2 GPU 1's last minute;
/// throttling reasons on some samples; XIDs: one with its job, one without
/// (attributed through the GPU's last row), one on an idle GPU; a trace
/// typing a and b, with a TIMEOUT job (folded into FAILED) and a CPU-only
/// one (left out of GPU-time shares) the telemetry never saw.
const STORE_SQL: &str = r#"
SET TimeZone = 'UTC';
CREATE TABLE g AS
SELECT TIMESTAMPTZ '2026-11-02 08:58:00+00' + to_seconds(s * step) AS ts, node, gpu, s
FROM (VALUES ('n1', 0, 1, 300), ('n1', 1, 1, 300), ('n2', 0, 15, 20), ('n2', 1, 15, 20))
     AS t(node, gpu, step, n),
     range(n) AS r(s)
WHERE NOT (node = 'n1' AND gpu = 1 AND s BETWEEN 100 AND 159);
COPY (
    SELECT ts, node, gpu, node || '-' || gpu AS uuid,
           (hash(node, gpu, s) % 101)::INTEGER AS gpu_util_pct,
           ((hash(s, node, gpu) % 1000) / 10.0)::FLOAT AS sm_active_pct,
           ((hash(gpu, s, node) % 500) / 10.0)::FLOAT AS sm_occupancy_pct,
           CASE WHEN node = 'n2' THEN NULL ELSE ((hash(s, gpu) % 300) / 10.0) END::FLOAT
               AS tensor_active_pct,
           ((hash(node, s) % 80) * 2^30)::BIGINT AS fb_used_bytes,
           (80 * 2^30)::BIGINT AS fb_total_bytes,
           (60000 + hash(s, node, gpu, 1) % 640000)::BIGINT AS power_mw,
           700000::BIGINT AS power_limit_mw,
           (30 + hash(s, 2, node) % 50)::INTEGER AS temperature_c,
           (40 + hash(s, 3, gpu) % 45)::INTEGER AS memory_temperature_c,
           (CASE hash(s, gpu, 4) % 10 WHEN 0 THEN 32 WHEN 1 THEN 4 WHEN 2 THEN 8 ELSE 0 END)::BIGINT
               AS clock_event_reasons,
           CASE WHEN node = 'n1' THEN 'a' WHEN gpu = 0 THEN 'b' END AS job_id,
           (CASE WHEN node = 'n1' OR gpu = 0 THEN 1 ELSE 0 END)::INTEGER AS job_count,
           CASE WHEN node = 'n2' AND gpu = 1 AND s >= 16 THEN 'pod-1' END AS pod_uid,
           NULL::INTEGER AS gpu_instance_id, NULL::INTEGER AS compute_instance_id,
           ts::DATE AS date, lpad(hour(ts)::VARCHAR, 2, '0') AS hour
    FROM g
) TO 'store/gpu' (FORMAT parquet, COMPRESSION zstd, PARTITION_BY (date, hour));
-- CPU counters of 1 CPU (100 jiffies a second), user and system shares
-- spread by a hash; n2's aggregate iowait goes back once (no shares for
-- that row, as the kernel allows) and its stat is unreadable once (the
-- next row's shares span both intervals).
COPY (
    SELECT TIMESTAMPTZ '2026-11-02 08:58:00+00' + to_seconds(s * step) AS ts, node,
           CASE WHEN NOT unread THEN sum(u * step) OVER w END::BIGINT AS cpu_user_jiffies,
           CASE WHEN NOT unread THEN sum(sy * step) OVER w END::BIGINT AS cpu_system_jiffies,
           CASE WHEN NOT unread THEN 50 - (node = 'n2' AND s = 7)::INTEGER END::BIGINT
               AS cpu_iowait_jiffies,
           CASE WHEN NOT unread THEN sum((100 - u - sy) * step) OVER w END::BIGINT
               AS cpu_idle_jiffies,
           CASE WHEN NOT unread THEN 0 END::BIGINT AS cpu_steal_jiffies,
           (512 * 2^20)::BIGINT AS memory_total_kib,
           ((512 - hash(s, 5, node) % 400) * 2^20)::BIGINT AS memory_available_kib,
           ts::DATE AS date, lpad(hour(ts)::VARCHAR, 2, '0') AS hour
    FROM (SELECT *, (hash(node, s) % 60)::INTEGER AS u, (hash(s, node) % 20)::INTEGER AS sy,
                 node = 'n2' AND s = 11 AS unread
          FROM (VALUES ('n1', 1, 300), ('n2', 15, 20)) AS t(node, step, n), range(n) AS r(s))
    WINDOW w AS (PARTITION BY node ORDER BY s)
) TO 'store/node' (FORMAT parquet, COMPRESSION zstd, PARTITION_BY (date, hour));
-- Data counters in bytes growing by a hash; mlx5_0's xmit is unreadable at
-- 100 s, stuck at the legacy 32-bit maximum from 200 s, and cleared at
-- 210 s (counting again from 0); mlx5_1's counters are reset at 150 s.
COPY (
    SELECT TIMESTAMPTZ '2026-11-02 08:58:00+00' + to_seconds(s) AS ts, 'n1' AS node,
           'mlx5_' || p AS device, 1 AS port, 'ACTIVE' AS state, 400.0::DOUBLE AS rate_gbps,
           CASE WHEN p = 0 AND s = 100 THEN NULL
                WHEN p = 0 AND s BETWEEN 200 AND 209 THEN 4 * 4294967295
                ELSE sum(x) OVER (PARTITION BY p, epoch ORDER BY s) END::BIGINT AS xmit_bytes,
           sum(r) OVER (PARTITION BY p, epoch ORDER BY s)::BIGINT AS rcv_bytes,
           ts::DATE AS date, lpad(hour(ts)::VARCHAR, 2, '0') AS hour
    FROM (SELECT s, p, (hash(s, p) % 50000000000)::BIGINT AS x,
                 (hash(p, s) % 20000000000)::BIGINT AS r,
                 CASE WHEN p = 0 AND s >= 210 THEN 1 WHEN p = 1 AND s >= 150 THEN 1 ELSE 0 END
                     AS epoch
          FROM range(300) r(s), range(2) q(p))
) TO 'store/ib' (FORMAT parquet, COMPRESSION zstd, PARTITION_BY (date, hour));
-- mlx5_2 as a file written before the counters-only schema: its rates stored.
COPY (
    SELECT TIMESTAMPTZ '2026-11-02 08:58:00+00' + to_seconds(s) AS ts, 'n1' AS node,
           'mlx5_2' AS device, 1 AS port, 'ACTIVE' AS state, 400.0::DOUBLE AS rate_gbps,
           (hash(s, 2) % 50e9)::DOUBLE AS xmit_bytes_per_s,
           (hash(2, s) % 20e9)::DOUBLE AS rcv_bytes_per_s
    FROM range(120) r(s)
) TO 'store/ib/date=2026-11-02/hour=08/rates.parquet' (FORMAT parquet, COMPRESSION zstd);
-- And n2's first three minutes of node rows, with CPU shares stored and
-- memory in bytes, as files written before the counters and KiB hold them.
COPY (
    SELECT TIMESTAMPTZ '2026-11-02 08:55:00+00' + to_seconds(s * 15) AS ts, 'n2' AS node,
           (hash('n2', s) % 60)::FLOAT AS cpu_user_pct, (hash(s, 'n2') % 20)::FLOAT AS cpu_system_pct,
           (512 * 2^30)::BIGINT AS memory_total_bytes,
           ((hash(s, 6) % 400) * 2^30)::BIGINT AS memory_used_bytes
    FROM range(12) r(s)
) TO 'store/node/date=2026-11-02/hour=08/shares.parquet' (FORMAT parquet, COMPRESSION zstd);
COPY (
    SELECT TIMESTAMPTZ '2026-11-02 08:58:00+00' + to_seconds(at_s) AS ts, node, gpu,
           node || '-' || gpu AS uuid, 'xid' AS kind, code::BIGINT AS code, job_id,
           ts::DATE AS date, lpad(hour(ts)::VARCHAR, 2, '0') AS hour
    FROM (VALUES (30, 'n1', 0, 79, 'a'), (130, 'n1', 1, 48, NULL), (61, 'n2', 1, 13, NULL),
                 (200, 'n2', 0, 13, 'b'))
         AS v(at_s, node, gpu, code, job_id)
) TO 'store/event' (FORMAT parquet, COMPRESSION zstd, PARTITION_BY (date, hour));
COPY (
    SELECT job_id, 'acme' AS source, state, job_type,
           TIMESTAMPTZ '2026-11-02 07:00:00+00' AS submit_time,
           duration_s::BIGINT AS duration_s, gpus, (gpus * duration_s)::BIGINT AS gpu_time_s,
           TIMESTAMPTZ '2026-11-03 00:00:00+00' AS imported_at, '2026-11' AS month
    FROM (VALUES ('a', 'COMPLETED', 'Pretrain', 400, 2), ('b', 'FAILED', 'Eval', 30, 1),
                 ('c', 'TIMEOUT', 'Pretrain', 100, 4), ('d', 'COMPLETED', 'Debug', 50, 0))
         AS t(job_id, state, job_type, duration_s, gpus)
) TO 'store/scheduler_job' (FORMAT parquet, COMPRESSION zstd, PARTITION_BY (month));
"#;

fn build_store(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir.join("store")).expect("mkdir store");
    gputel_tests::duckdb(dir, STORE_SQL);
    dir.join("store")
}

/// Runs a shipped query on `store`, `before` set first (variables).
fn query(store: &Path, before: &str, file: &str) -> Vec<Value> {
    gputel_tests::shipped_query(store, before, file, "")
}

/// Runs the report; returns its JSON and the page.
fn report(store: &Path, out: &Path, extra: &[&str]) -> (Value, String) {
    let run = Command::new(collector_bin())
        .arg("report")
        .arg("--store")
        .arg(store)
        .arg("--out")
        .arg(out)
        .arg("--json")
        .args(extra)
        .output()
        .expect("run gputel-collector report");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "report: {}\n{stdout}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let mut lines = stdout.lines();
    let json: Value = serde_json::from_str(lines.next().expect("a JSON line")).expect("JSON");
    let said = lines.next().expect("a summary line");
    assert!(
        said.starts_with(&format!("wrote {}: ", out.display())),
        "{said}"
    );
    (json, std::fs::read_to_string(out).expect("read the page"))
}

fn num(v: &Value) -> Option<f64> {
    v.as_f64()
}

#[track_caller]
fn close(what: &str, got: Option<f64>, want: Option<f64>, tolerance: f64) {
    match (got, want) {
        (Some(g), Some(w)) => assert!(
            (g - w).abs() <= tolerance,
            "{what}: report {g}, DuckDB {w} (tolerance {tolerance})"
        ),
        (None, None) => {}
        _ => panic!("{what}: report {got:?}, DuckDB {want:?}"),
    }
}

/// fleet_cdf.sql's rows against the report's quantiles (0, 5, ... 100 %).
fn check_cdfs(fleet: &Value, rows: &[Value], what: &str) {
    assert_eq!(rows.len(), 21, "{what}: fleet_cdf rows");
    let cdfs = fleet["cdfs"].as_object().expect("cdfs");
    let columns: Vec<&str> = rows[0]
        .as_object()
        .expect("row")
        .keys()
        .map(String::as_str)
        .filter(|k| *k != "pct")
        .collect();
    assert_eq!(columns.len(), 13, "{what}: {columns:?}");
    for column in columns {
        let curve = cdfs
            .get(column)
            .unwrap_or_else(|| panic!("{what}: no {column} in the report: {:?}", cdfs.keys()));
        let quantiles = curve["quantiles"].as_array().expect("quantiles");
        for (i, row) in rows.iter().enumerate() {
            close(
                &format!("{what} {column} p{}", i * 5),
                num(&quantiles[i]),
                num(&row[column]),
                0.0101,
            );
        }
    }
}

#[test]
fn the_report_states_what_the_shipped_sql_computes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = build_store(tmp.path());
    let (fleet, page) = report(
        &store,
        &tmp.path().join("report.html"),
        &[
            "--cdf-csv",
            tmp.path().join("cdf.csv").to_str().expect("utf-8"),
        ],
    );
    assert_eq!(fleet["nodes"], 2);
    assert_eq!(fleet["gpus"], 4);
    // 300 + 240 + 20 + 20 gpu rows.
    assert_eq!(fleet["gpu_rows"], 580);

    // The CDFs, as recorded and in 15 s windows.
    check_cdfs(&fleet, &query(&store, "", "fleet_cdf.sql"), "native");
    let (fleet15, _) = report(
        &store,
        &tmp.path().join("report15.html"),
        &["--resample", "15s"],
    );
    check_cdfs(
        &fleet15,
        &query(&store, "SET VARIABLE cdf_window_s = 15", "fleet_cdf.sql"),
        "15 s windows",
    );
    assert_ne!(
        fleet["cdfs"]["gpu_util_pct"]["quantiles"], fleet15["cdfs"]["gpu_util_pct"]["quantiles"],
        "averaging 1 s samples over 15 s changes the distribution"
    );

    // The 1000-point export against fleet_cdf.sql at 1000 points.
    let csv = std::fs::read_to_string(tmp.path().join("cdf.csv")).expect("cdf.csv");
    let mut exported: BTreeMap<(String, usize), f64> = BTreeMap::new();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("metric,acme_metric,percentile,value"));
    let mut per_metric: BTreeMap<String, usize> = BTreeMap::new();
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        let i = per_metric.entry(f[0].to_owned()).or_default();
        exported.insert((f[0].to_owned(), *i), f[3].parse().expect("value"));
        *i += 1;
    }
    assert!(per_metric.values().all(|n| *n == 1000), "{per_metric:?}");
    assert!(
        csv.contains("\ngpu_util_pct,GPU_UTIL,0.0000,"),
        "AcmeTrace names"
    );
    let thousand = query(&store, "SET VARIABLE cdf_points = 1000", "fleet_cdf.sql");
    assert_eq!(thousand.len(), 1000);
    for (i, row) in thousand.iter().enumerate() {
        for metric in per_metric.keys() {
            close(
                &format!("1000-point {metric} #{i}"),
                exported.get(&(metric.clone(), i)).copied(),
                num(&row[metric.as_str()]),
                0.0101,
            );
        }
    }

    // Idle GPU power: the '(all)' rows.
    let power = query(&store, "", "idle_gpu_power.sql");
    let all: Vec<&Value> = power.iter().filter(|r| r["node"] == "(all)").collect();
    let states = fleet["power_states"].as_array().expect("power_states");
    assert_eq!(all.len(), states.len());
    assert_eq!(
        states.len(),
        3,
        "unallocated, allocated idle and active all occur"
    );
    for (row, state) in all.iter().zip(states) {
        assert_eq!(row["state"], state["state"]);
        let s = state["state"].as_str().unwrap_or_default();
        close(
            &format!("{s} time_s"),
            num(&state["time_s"]),
            num(&row["time_s"]),
            0.005,
        );
        for (report, sql, tolerance) in [
            ("time_share", "time_share", 0.00005),
            ("energy_share", "energy_share", 0.00005),
            ("power_w_mean", "power_w_mean", 0.005),
            ("power_w_p50", "power_w_p50", 0.0101),
            ("power_w_max", "power_w_max", 0.0101),
        ] {
            close(
                &format!("{s} {report}"),
                num(&state[report]),
                num(&row[sql]),
                tolerance,
            );
        }
    }

    // Throttled time per GPU.
    let throttle = query(&store, "", "throttle_time.sql");
    let reported = fleet["throttle"].as_array().expect("throttle");
    assert_eq!(throttle.len(), 4);
    assert_eq!(reported.len(), 4);
    for row in &throttle {
        let r = reported
            .iter()
            .find(|t| t["node"] == row["node"] && t["gpu"] == row["gpu"])
            .expect("the GPU in the report");
        for column in [
            "time_s",
            "thermal_s",
            "power_s",
            "hw_slowdown_s",
            "throttled_s",
        ] {
            close(column, num(&r[column]), num(&row[column]), 0.005);
        }
    }
    assert!(num(&reported[0]["throttled_s"]) > Some(0.0));

    // Jobs: duration against utilization, imbalance, by type.
    let durations = query(&store, "", "job_duration_vs_utilization.sql");
    let imbalance = query(&store, "", "job_imbalance.sql");
    let jobs = fleet["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 2);
    for (row, job) in durations.iter().zip(jobs) {
        assert_eq!(row["job_id"], job["job_id"]);
        assert_eq!(row["job_type"], job["job_type"]);
        assert_eq!(row["gpus"], job["gpus"]);
        close(
            "duration_s",
            num(&job["duration_s"]),
            num(&row["duration_s"]),
            0.0,
        );
        for column in ["observed_gpu_s", "gpu_util_mean_pct", "sm_active_mean_pct"] {
            close(column, num(&job[column]), num(&row[column]), 0.005);
        }
        let i = imbalance
            .iter()
            .find(|r| r["job_id"] == job["job_id"])
            .expect("job in job_imbalance");
        for column in ["mem_peak_min_pct", "mem_peak_max_pct", "idle_share_pct"] {
            close(column, num(&job[column]), num(&i[column]), 0.005);
        }
    }
    // per_job_utilization.sql weighs the same way: its means and observed
    // time are the report's (n1 GPU 1's minute-long gap capped at 3 s).
    let per_job = query(&store, "", "per_job_utilization.sql");
    for job in jobs {
        let metric = |name: &str| {
            per_job
                .iter()
                .find(|r| r["job_id"] == job["job_id"] && r["metric"] == name)
                .unwrap_or_else(|| panic!("no {name} of {} in per_job_utilization", job["job_id"]))
        };
        close(
            "time_s",
            num(&job["observed_gpu_s"]),
            num(&metric("gpu_util_pct")["time_s"]),
            0.0005,
        );
        for (name, column) in [
            ("gpu_util_pct", "gpu_util_mean_pct"),
            ("sm_active_pct", "sm_active_mean_pct"),
        ] {
            close(column, num(&job[column]), num(&metric(name)["mean"]), 0.005);
        }
    }
    let by_type = query(&store, "", "utilization_by_job_type.sql");
    let types = fleet["job_types"].as_array().expect("job_types");
    assert_eq!(by_type.len(), types.len());
    for (row, t) in by_type.iter().zip(types) {
        assert_eq!(row["job_type"], t["job_type"]);
        assert_eq!(row["jobs"], t["jobs"]);
        for column in [
            "gpu_hours",
            "gpu_util_mean_pct",
            "sm_active_mean_pct",
            "idle_share_pct",
        ] {
            close(
                column,
                num(&t[column]),
                num(&row[column]),
                0.00005_f64.max(0.005),
            );
        }
    }

    // XIDs by category: counts exact, jobs from the per-job rows.
    let xids = query(&store, "", "xid_failures.sql");
    let categories = fleet["xids"].as_array().expect("xids");
    let totals: Vec<&Value> = xids.iter().filter(|r| r["job_id"] == "(all)").collect();
    assert_eq!(totals.len(), categories.len());
    for (row, c) in totals.iter().zip(categories) {
        assert_eq!(row["category"], c["category"]);
        assert_eq!(row["events"], c["events"]);
        assert_eq!(row["gpus"], c["gpus"]);
        assert_eq!(row["codes"], c["codes"]);
        let jobs = xids
            .iter()
            .filter(|r| {
                r["category"] == c["category"]
                    && r["job_id"] != "(all)"
                    && r["job_id"] != "(no job)"
            })
            .count();
        assert_eq!(c["jobs"], jobs, "{}", c["category"]);
    }
    // The XID 48 without a job_id is job a's (the GPU's last row before it).
    let memory = categories
        .iter()
        .find(|c| c["category"] == "memory")
        .expect("XID 48 is a memory error");
    assert_eq!(memory["jobs"], 1);

    // The trace's GPU-time shares: gpu_time_share.sql's 'trace' scope.
    let reported = fleet["trace_shares"].as_array().expect("trace_shares");
    check_trace_shares(&query(&store, "", "gpu_time_share.sql"), reported);
    assert_eq!(
        reported.len(),
        4,
        "Pretrain, Eval; FAILED (with TIMEOUT), COMPLETED"
    );

    // The page: every figure with its SQL.
    for id in [
        "gpu_util",
        "sm",
        "gpu_memory",
        "gpu_power_share",
        "gpu_power",
        "temperature",
        "host_cpu",
        "host_memory",
        "infiniband",
        "idle_power",
        "utilization_by_job_type",
        "job_duration_vs_utilization",
        "job_imbalance",
        "xids",
        "trace_job_types",
        "trace_states",
        "throttling",
    ] {
        assert!(
            page.contains(&format!("<section id=\"{id}\">")),
            "no figure {id}"
        );
    }
    check_self_contained(&page);
}

/// gpu_time_share.sql's 'trace' rows against the report's `trace_shares`:
/// the same groups in the same order, GPU time exactly, shares to the
/// SQL's four decimals.
fn check_trace_shares(sql: &[Value], reported: &[Value]) {
    let trace: Vec<&Value> = sql.iter().filter(|r| r["scope"] == "trace").collect();
    assert_eq!(trace.len(), reported.len());
    for (row, r) in trace.iter().zip(reported) {
        for column in ["dimension", "value", "jobs"] {
            assert_eq!(row[column], r[column], "{column}");
        }
        close(
            "gpu_time_s",
            num(&r["gpu_time_s"]),
            num(&row["gpu_time_s"]),
            0.0,
        );
        close("share", num(&r["share"]), num(&row["share"]), 0.00005);
    }
}

/// Well-formed (parsed as XML), with nothing fetched from anywhere.
fn check_self_contained(page: &str) {
    let doc = roxmltree::Document::parse_with_options(
        page,
        roxmltree::ParsingOptions {
            allow_dtd: true,
            ..roxmltree::ParsingOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("the page is not well-formed: {e}"));
    let sections = doc
        .descendants()
        .filter(|n| n.has_tag_name("section"))
        .count();
    let svgs = doc
        .descendants()
        .filter(|n| n.tag_name().name() == "svg")
        .count();
    assert!(
        sections > 0 && svgs == sections,
        "{sections} sections, {svgs} figures"
    );
    for node in doc.descendants().filter(|n| n.is_element()) {
        let tag = node.tag_name().name();
        assert!(
            ![
                "script", "img", "link", "iframe", "object", "embed", "image", "use"
            ]
            .contains(&tag),
            "the page has a <{tag}>"
        );
        for attr in node.attributes() {
            let external = match attr.name() {
                "href" => !attr.value().starts_with('#'),
                "src" => true,
                _ => false,
            };
            assert!(!external, "<{tag} {}=\"{}\">", attr.name(), attr.value());
        }
    }
    assert!(!page.contains("url("), "the style fetches nothing");
}

/// `--jobs FILE` types the jobs and draws the trace's figures from a trace
/// file, in place of the store's imported trace, with exactly the numbers
/// the same file gives once imported: the JSON of both reports agrees, and
/// both agree with gpu_time_share.sql on the imported store.
#[test]
fn a_trace_file_types_the_jobs_as_its_import_would() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // The store's trace says job a is Pretrain; this file says SFT, b failed
    // with its node (folded into FAILED) and adds e, which the telemetry
    // never saw.
    let trace = tmp.path().join("trace.csv");
    std::fs::write(
        &trace,
        "job_id,user,node_num,gpu_num,cpu_num,type,state,submit_time,start_time,end_time,\
         duration,queue,gpu_time\n\
         a,u1,1,2,16,SFT,COMPLETED,2026-11-02 08:57:00+00:00,2026-11-02 08:58:00+00:00,\
         2026-11-02 09:03:00+00:00,300,60,600\n\
         b,u2,1,1,8,Eval,NODE_FAIL,2026-11-02 08:58:00+00:00,2026-11-02 08:58:00+00:00,\
         2026-11-02 09:03:00+00:00,300,0,300\n\
         e,u1,2,16,64,Pretrain,COMPLETED,2026-11-01 00:00:00+00:00,2026-11-01 00:00:00+00:00,\
         2026-11-01 01:00:00+00:00,3600,0,57600\n",
    )
    .expect("write the trace");
    let trace_arg = trace.to_str().expect("utf-8");

    let store = build_store(&tmp.path().join("with-file"));
    let (from_file, page) = report(
        &store,
        &tmp.path().join("from-file.html"),
        &["--jobs", trace_arg, "--jobs-format", "acme"],
    );
    assert_eq!(from_file["trace_from"], trace_arg);
    assert!(
        page.contains("not imported"),
        "the page says where the jobs came from"
    );
    let job_a = from_file["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .find(|j| j["job_id"] == "a")
        .expect("job a");
    assert_eq!(job_a["job_type"], "SFT", "the file's type, not the store's");
    let shares = from_file["trace_shares"].as_array().expect("trace_shares");
    let share_of = |dimension: &str, value: &str| {
        shares
            .iter()
            .find(|s| s["dimension"] == dimension && s["value"] == value)
            .map(|s| (s["jobs"].as_u64().expect("jobs"), num(&s["gpu_time_s"])))
    };
    assert_eq!(share_of("job_type", "Pretrain"), Some((1, Some(57600.0))));
    assert_eq!(share_of("state", "FAILED"), Some((1, Some(300.0))));
    assert_eq!(share_of("state", "NODE_FAIL"), None);

    // The same file imported into a store without a trace.
    let imported = build_store(&tmp.path().join("imported"));
    std::fs::remove_dir_all(imported.join("scheduler_job")).expect("drop the trace");
    let run = Command::new(collector_bin())
        .args(["import-jobs", "--format", "acme", "--store"])
        .arg(&imported)
        .arg(&trace)
        .output()
        .expect("run import-jobs");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let (from_store, _) = report(&imported, &tmp.path().join("imported.html"), &[]);
    assert_eq!(from_store["trace_from"], "scheduler_job");
    for key in ["jobs", "job_types", "trace_shares"] {
        assert_eq!(from_file[key], from_store[key], "{key}");
    }
    check_trace_shares(&query(&imported, "", "gpu_time_share.sql"), shares);

    // A file that cannot be read is an error, and no page is written.
    let bad = tmp.path().join("bad.csv");
    std::fs::write(&bad, "no,such,columns\n1,2,3\n").expect("write");
    let run = Command::new(collector_bin())
        .args(["report", "--store"])
        .arg(&store)
        .arg("--out")
        .arg(tmp.path().join("bad.html"))
        .arg("--jobs")
        .arg(&bad)
        .output()
        .expect("run report");
    assert_eq!(run.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("bad.csv:1:"), "{stderr}");
    assert!(!tmp.path().join("bad.html").exists());
}

#[test]
fn an_empty_store_says_so() {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(tmp.path().join("store")).expect("mkdir");
    let run = Command::new(collector_bin())
        .args(["report", "--store"])
        .arg(tmp.path().join("store"))
        .arg("--out")
        .arg(tmp.path().join("r.html"))
        .output()
        .expect("run report");
    assert_eq!(run.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("holds no telemetry"), "{stderr}");
    assert!(!tmp.path().join("r.html").exists());
    let missing = Command::new(collector_bin())
        .args(["report", "--store"])
        .arg(tmp.path().join("nowhere"))
        .output()
        .expect("run report");
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no such directory"));
}

/// Opens the page in headless Chromium with a checker appended: every
/// figure's SVG must have a size on the page, no resource may be fetched,
/// and no error may reach the console.
#[test]
fn every_figure_renders_in_a_real_browser() {
    let Some(chromium) = provided_path(
        "GPUTEL_CHROMIUM",
        "scripts/test installs Debian's chromium and sets it",
    ) else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = build_store(tmp.path());
    let (_, page) = report(&store, &tmp.path().join("report.html"), &[]);
    let checker = r#"<script>
window.addEventListener('load', () => {
  const sections = [...document.querySelectorAll('section')];
  const drawn = sections.filter(s => {
    const svg = s.querySelector('svg');
    if (!svg) return false;
    const box = svg.getBoundingClientRect();
    return box.width > 100 && box.height > 50 && svg.querySelectorAll('path,circle,rect').length > 2;
  }).length;
  const fetched = performance.getEntriesByType('resource').length;
  const out = document.createElement('pre');
  out.id = 'gputel-check';
  out.textContent = `sections=${sections.length} drawn=${drawn} fetched=${fetched}`;
  document.body.appendChild(out);
});
</script></body>"#;
    let checked = page.replace("</body>", checker);
    let path = tmp.path().join("checked.html");
    std::fs::write(&path, checked).expect("write");
    let out = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            "--dump-dom",
        ])
        .arg(format!("file://{}", path.display()))
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&out.stdout);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "chromium: {}\n{log}", out.status);
    let result = dom
        .split("<pre id=\"gputel-check\">")
        .nth(1)
        .and_then(|r| r.split("</pre>").next())
        .unwrap_or_else(|| panic!("the checker did not run:\n{log}"));
    let sections = page.matches("<section id=").count();
    assert_eq!(
        result,
        format!("sections={sections} drawn={sections} fetched=0")
    );
    let console: Vec<&str> = log.lines().filter(|l| l.contains("CONSOLE")).collect();
    assert!(console.is_empty(), "console messages: {console:#?}");
}
