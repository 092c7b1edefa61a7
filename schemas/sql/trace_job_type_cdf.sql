-- How long does each type of job run and wait, and how many GPUs does it
-- take? (The Acme study, NSDI'24, from the scheduler trace alone: the CDFs
-- of job duration and of queue delay per job type, and the spread of GPUs
-- per job per type that its box plot draws.)
--
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c ".read schemas/sql/trace_job_type_cdf.sql"
--
-- Over the GPU jobs of the trace (scheduler_job_latest with gpus > 0), as
-- every figure of the study (its notebook keeps gpu_num > 0). One row per
-- job type and percentile, 0 to 100 in steps of 5; each job counts once.
-- The value at p is the smallest value with at least p % of the type's jobs
-- at or below it (p 0 is the minimum, 25/50/75 the box, 100 the maximum);
-- null where no job of the type has the value. The curves over all types:
-- trace_job_cdf.sql.
--
--   job_type    VARCHAR, the trace's job type as the trace writes it
--               (AcmeTrace: Pretrain, SFT, Eval, MLLM, Debug, Other);
--               'unknown' for jobs without one
--   pct         BIGINT, the percentile
--   jobs        BIGINT, GPU jobs of the type
--   duration_s  DOUBLE, job duration, seconds
--   queue_s     DOUBLE, queue delay, submit to start, seconds
--   gpus        DOUBLE, GPUs per job

WITH jobs AS (
    SELECT coalesce(job_type, 'unknown') AS job_type,
           duration_s::DOUBLE AS duration_s, queue_s::DOUBLE AS queue_s, gpus::DOUBLE AS gpus
    FROM scheduler_job_latest
    WHERE gpus > 0
),
samples AS (
    SELECT job_type, 'duration_s' AS metric, duration_s AS value FROM jobs
    UNION ALL SELECT job_type, 'queue_s', queue_s FROM jobs
    UNION ALL SELECT job_type, 'gpus', gpus FROM jobs
),
cumulative AS (
    SELECT job_type, metric, value,
           count(*) OVER (PARTITION BY job_type, metric ORDER BY value
                          ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum,
           count(*) OVER (PARTITION BY job_type, metric) AS total
    FROM samples
    WHERE value IS NOT NULL
),
quantiles AS (
    SELECT job_type, pct, metric, min(value) AS value
    FROM range(0, 101, 5) p(pct), cumulative
    WHERE cum * 100 >= pct * total
    GROUP BY job_type, pct, metric
),
types AS (
    SELECT job_type, count(*) AS jobs FROM jobs GROUP BY job_type
)
SELECT job_type,
       pct,
       any_value(jobs) AS jobs,
       any_value(value) FILTER (metric = 'duration_s') AS duration_s,
       any_value(value) FILTER (metric = 'queue_s') AS queue_s,
       any_value(value) FILTER (metric = 'gpus') AS gpus
FROM types
CROSS JOIN range(0, 101, 5) p(pct)
LEFT JOIN quantiles USING (job_type, pct)
GROUP BY job_type, pct
ORDER BY job_type, pct;
