-- Which kinds of jobs use the GPU time, and how much of it goes to jobs that
-- fail or are cancelled? Spark SQL version of schemas/sql/gpu_time_share.sql
-- (scopes, dimensions, columns: there); the same rows on the same store.
--
--   scripts/spark --store gputel-data gpu_time_share

WITH observed_jobs AS (
    SELECT job_id, sum(weight_s) AS gpu_s
    FROM gpu_weighted
    WHERE job_id IS NOT NULL
    GROUP BY job_id
),
observed AS (
    SELECT 'observed' AS scope,
           o.gpu_s,
           CASE WHEN t.job_id IS NULL THEN '(not in trace)'
                ELSE coalesce(t.job_type, '(untyped)') END AS job_type,
           CASE WHEN t.job_id IS NULL THEN '(not in trace)'
                WHEN t.state IN ('TIMEOUT', 'NODE_FAIL') THEN 'FAILED'
                ELSE coalesce(t.state, '(unknown)') END AS state
    FROM observed_jobs o
    LEFT JOIN scheduler_job_latest t ON o.job_id = t.job_id
),
traced AS (
    SELECT 'trace' AS scope,
           CAST(coalesce(gpu_time_s, gpus * duration_s, 0) AS DOUBLE) AS gpu_s,
           coalesce(job_type, '(untyped)') AS job_type,
           CASE WHEN state IN ('TIMEOUT', 'NODE_FAIL') THEN 'FAILED'
                ELSE coalesce(state, '(unknown)') END AS state
    FROM scheduler_job_latest
    WHERE gpus > 0
),
labelled AS (
    SELECT * FROM observed
    UNION ALL
    SELECT * FROM traced
),
grouped AS (
    SELECT scope, 'job_type' AS dimension, job_type AS value, count(*) AS jobs, sum(gpu_s) AS gpu_s
    FROM labelled GROUP BY scope, job_type
    UNION ALL
    SELECT scope, 'state', state, count(*), sum(gpu_s)
    FROM labelled GROUP BY scope, state
)
SELECT scope,
       dimension,
       value,
       jobs,
       round(gpu_s, 3) AS gpu_time_s,
       round(gpu_s / nullif(sum(gpu_s) OVER (PARTITION BY scope, dimension), 0), 4) AS share
FROM grouped
ORDER BY scope, dimension, gpu_s DESC, value;
