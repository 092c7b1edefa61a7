-- Which failures cost the most GPU time? Spark SQL version of
-- schemas/sql/failure_share.sql (groupings and columns: there); the same rows
-- on the same store.
--
--   scripts/spark --store gputel-data failure_share

WITH jobs AS (
    SELECT job_id,
           CASE WHEN state IN ('TIMEOUT', 'NODE_FAIL') THEN 'FAILED'
                ELSE coalesce(state, '(unknown)') END AS state,
           CAST(coalesce(gpu_time_s, gpus * duration_s, 0) AS DOUBLE) AS gpu_s
    FROM scheduler_job_latest
    WHERE gpus > 0
),
total AS (
    SELECT count(*) AS all_jobs, sum(gpu_s) AS all_gpu_s FROM jobs
),
categorized AS (
    SELECT 'state' AS grouping, state AS category, job_id, gpu_s
    FROM jobs
    UNION ALL
    SELECT DISTINCT 'xid_category', x.category, j.job_id, j.gpu_s
    FROM jobs j
    JOIN xid_event x ON j.job_id = x.job_id
)
SELECT grouping,
       category,
       count(*) AS jobs,
       round(100 * count(*) / first(all_jobs), 2) AS job_share_pct,
       round(100 * sum(gpu_s) / nullif(first(all_gpu_s), 0), 2) AS gpu_time_share_pct
FROM categorized, total
GROUP BY grouping, category
ORDER BY grouping DESC, gpu_time_share_pct DESC, category;
