-- What kinds of jobs does the trace hold, how big and how long? Spark SQL
-- version of schemas/sql/trace_job_types.sql (columns: there); the same rows
-- on the same store. Medians and the 95th percentile interpolate between the
-- two nearest values (DuckDB's quantile_cont, Spark's percentile).
--
--   scripts/spark --store gputel-data trace_job_types

WITH jobs AS (
    SELECT coalesce(job_type, 'unknown') AS job_type, gpus, queue_s, duration_s,
           CAST(coalesce(gpu_time_s, gpus * duration_s, 0) AS DOUBLE) AS gpu_s
    FROM scheduler_job_latest
    WHERE gpus > 0
),
total AS (
    SELECT count(*) AS all_jobs, sum(gpu_s) AS all_gpu_s FROM jobs
)
SELECT job_type, jobs, job_share_pct, gpu_time_share_pct, gpus_mean, gpus_p50, queue_p50_s,
       queue_p95_s, duration_p50_s
FROM (
    SELECT coalesce(job_type, 'all') AS job_type,
           count(*) AS jobs,
           round(100 * count(*) / first(all_jobs), 2) AS job_share_pct,
           round(100 * sum(gpu_s) / nullif(first(all_gpu_s), 0), 2) AS gpu_time_share_pct,
           round(avg(gpus), 2) AS gpus_mean,
           round(percentile(gpus, 0.5), 2) AS gpus_p50,
           round(percentile(queue_s, 0.5), 2) AS queue_p50_s,
           round(percentile(queue_s, 0.95), 2) AS queue_p95_s,
           round(percentile(duration_s, 0.5), 2) AS duration_p50_s,
           grouping(job_type) AS total
    FROM jobs, total
    GROUP BY GROUPING SETS ((job_type), ())
)
-- The total row last (DuckDB orders by the grouping column, null there).
ORDER BY total, gpu_time_share_pct DESC, job_type;
