-- How long do jobs run, wait and how many GPUs do they take? Spark SQL
-- version of schemas/sql/trace_job_cdf.sql (columns: there); the same rows
-- on the same store. The value at p is the smallest value with at least p %
-- of the jobs (of the GPU time, for gpus_by_gpu_time) at or below it.
--
--   scripts/spark --store gputel-data trace_job_cdf

WITH jobs AS (
    SELECT CAST(duration_s AS DOUBLE) AS duration_s, CAST(queue_s AS DOUBLE) AS queue_s,
           CAST(gpus AS DOUBLE) AS gpus,
           CAST(coalesce(gpu_time_s, gpus * duration_s) AS DOUBLE) AS gpu_s
    FROM scheduler_job_latest
    WHERE gpus > 0
),
samples AS (
    SELECT 'duration_s' AS metric, duration_s AS value, 1D AS weight FROM jobs
    UNION ALL SELECT 'queue_s', queue_s, 1D FROM jobs
    UNION ALL SELECT 'gpus_by_jobs', gpus, 1D FROM jobs
    UNION ALL SELECT 'gpus_by_gpu_time', gpus, gpu_s FROM jobs
),
cumulative AS (
    SELECT metric, value,
           sum(weight) OVER (PARTITION BY metric ORDER BY value
                             ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum,
           sum(weight) OVER (PARTITION BY metric) AS total
    FROM samples
    WHERE value IS NOT NULL AND weight > 0
),
points AS (
    SELECT id AS pct FROM range(0, 101, 5)
),
quantiles AS (
    SELECT pct, metric, min(value) AS value
    FROM points, cumulative
    WHERE cum * 100 >= pct * total
    GROUP BY pct, metric
)
SELECT pct,
       max(value) FILTER (WHERE metric = 'duration_s') AS duration_s,
       max(value) FILTER (WHERE metric = 'queue_s') AS queue_s,
       max(value) FILTER (WHERE metric = 'gpus_by_jobs') AS gpus_by_jobs,
       max(value) FILTER (WHERE metric = 'gpus_by_gpu_time') AS gpus_by_gpu_time
FROM points
LEFT JOIN quantiles USING (pct)
GROUP BY pct
ORDER BY pct;
