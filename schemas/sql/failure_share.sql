-- Which failures cost the most GPU time? (The Acme study, NSDI'24: failure
-- categories with their job count and GPU-time share: few failed jobs, most
-- of the GPU time.)
--
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c ".read schemas/sql/failure_share.sql"
--
-- Over the GPU jobs of the scheduler trace (scheduler_job_latest with
-- gpus > 0, as every figure of the study and gpu_time_share.sql's 'trace'
-- scope count them), GPU time being the trace's gpu_time_s (else gpus ×
-- duration_s). Two groupings, one row per category:
--
--   grouping     'state': the job's final state folded as the study folds
--                it (TIMEOUT and NODE_FAIL count as FAILED; '(unknown)'
--                without a state), every job in exactly one row; for the
--                states as written: SELECT state, count(*) FROM
--                scheduler_job_latest GROUP BY state;
--                'xid_category': the XID catalogue's category (hardware,
--                nvlink, memory, driver, application, thermal_power, other,
--                unknown) of an XID recorded on one of the job's GPUs
--                (xid_event); a job with XIDs of several categories counts
--                in each, a job without any in none
--   category     the folded state or the XID category
--   jobs         jobs in the category
--   job_share_pct       jobs / the trace's GPU jobs, %
--   gpu_time_share_pct  their GPU time / all GPU time of the trace, %

WITH jobs AS (
    SELECT job_id,
           CASE WHEN state IN ('TIMEOUT', 'NODE_FAIL') THEN 'FAILED'
                ELSE coalesce(state, '(unknown)') END AS state,
           coalesce(gpu_time_s, gpus * duration_s, 0)::DOUBLE AS gpu_s
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
    JOIN xid_event x USING (job_id)
)
SELECT grouping,
       category,
       count(*) AS jobs,
       round(100 * count(*) / any_value(all_jobs), 2) AS job_share_pct,
       round(100 * sum(gpu_s) / nullif(any_value(all_gpu_s), 0), 2) AS gpu_time_share_pct
FROM categorized, total
GROUP BY grouping, category
ORDER BY grouping DESC, gpu_time_share_pct DESC, category;
