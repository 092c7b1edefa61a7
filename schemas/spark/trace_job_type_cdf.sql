-- The CDFs of trace_job_cdf.sql per job type. Spark SQL version of
-- schemas/sql/trace_job_type_cdf.sql (columns: there); the same rows on the
-- same store.
--
--   scripts/spark --store gputel-data trace_job_type_cdf

WITH jobs AS (
    SELECT coalesce(job_type, 'unknown') AS job_type,
           CAST(duration_s AS DOUBLE) AS duration_s, CAST(queue_s AS DOUBLE) AS queue_s,
           CAST(gpus AS DOUBLE) AS gpus
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
points AS (
    SELECT id AS pct FROM range(0, 101, 5)
),
quantiles AS (
    SELECT job_type, pct, metric, min(value) AS value
    FROM points, cumulative
    WHERE cum * 100 >= pct * total
    GROUP BY job_type, pct, metric
),
types AS (
    SELECT job_type, count(*) AS jobs FROM jobs GROUP BY job_type
)
SELECT t.job_type,
       p.pct,
       first(t.jobs) AS jobs,
       max(q.value) FILTER (WHERE q.metric = 'duration_s') AS duration_s,
       max(q.value) FILTER (WHERE q.metric = 'queue_s') AS queue_s,
       max(q.value) FILTER (WHERE q.metric = 'gpus') AS gpus
FROM types t
CROSS JOIN points p
LEFT JOIN quantiles q ON q.job_type = t.job_type AND q.pct = p.pct
GROUP BY t.job_type, p.pct
ORDER BY job_type, pct;
