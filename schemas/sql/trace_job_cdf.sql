-- How long do jobs run, wait and how many GPUs do they take? (The Acme
-- study, NSDI'24, from the scheduler trace alone: the job duration CDF, the
-- queue delay CDF, and the CDFs of GPUs per job counted by jobs and by GPU
-- time.)
--
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c ".read schemas/sql/trace_job_cdf.sql"
--
-- One row per percentile, 0 to 100 in steps of 5, over the GPU jobs of the
-- trace (scheduler_job_latest with gpus > 0), as every figure of the study
-- (its notebook keeps gpu_num > 0): CPU-only jobs and jobs without a GPU
-- count are left out. The value at p is the smallest value with at least
-- p % of the jobs (of the GPU time, for gpus_by_gpu_time) at or below it.
-- The same curves per job type: trace_job_type_cdf.sql.
--
--   duration_s        job duration, seconds (by jobs)
--   queue_s           queue delay, submit to start, seconds (by jobs)
--   gpus_by_jobs      GPUs per job, each job counting once
--   gpus_by_gpu_time  GPUs per job, each job counting for its GPU time
--                     (gpu_time_s, else gpus × duration_s)

WITH jobs AS (
    SELECT duration_s::DOUBLE AS duration_s, queue_s::DOUBLE AS queue_s, gpus::DOUBLE AS gpus,
           coalesce(gpu_time_s, gpus * duration_s)::DOUBLE AS gpu_s
    FROM scheduler_job_latest
    WHERE gpus > 0
),
samples AS (
    SELECT 'duration_s' AS metric, duration_s AS value, 1.0 AS weight FROM jobs
    UNION ALL SELECT 'queue_s', queue_s, 1.0 FROM jobs
    UNION ALL SELECT 'gpus_by_jobs', gpus, 1.0 FROM jobs
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
quantiles AS (
    SELECT pct, metric, min(value) AS value
    FROM range(0, 101, 5) p(pct), cumulative
    WHERE cum * 100 >= pct * total
    GROUP BY pct, metric
)
SELECT pct,
       any_value(value) FILTER (metric = 'duration_s') AS duration_s,
       any_value(value) FILTER (metric = 'queue_s') AS queue_s,
       any_value(value) FILTER (metric = 'gpus_by_jobs') AS gpus_by_jobs,
       any_value(value) FILTER (metric = 'gpus_by_gpu_time') AS gpus_by_gpu_time
FROM range(0, 101, 5) p(pct)
LEFT JOIN quantiles USING (pct)
GROUP BY pct
ORDER BY pct;
