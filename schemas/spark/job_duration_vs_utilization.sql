-- Do long jobs use their GPUs better than short ones? Spark SQL version of
-- schemas/sql/job_duration_vs_utilization.sql (columns: there); the same
-- rows on the same store.
--
--   scripts/spark --store gputel-data job_duration_vs_utilization

WITH per_job AS (
    SELECT job_id,
           count(DISTINCT struct(node, gpu)) AS gpus,
           (unix_micros(max(ts)) - unix_micros(min(ts))) / 1e6 AS span_s,
           sum(weight_s) AS observed_gpu_s,
           sum(gpu_util_pct * weight_s) / sum(weight_s) FILTER (WHERE gpu_util_pct IS NOT NULL)
               AS gpu_util_mean_pct,
           sum(sm_active_pct * weight_s) / sum(weight_s) FILTER (WHERE sm_active_pct IS NOT NULL)
               AS sm_active_mean_pct
    FROM gpu_weighted
    WHERE job_id IS NOT NULL
    GROUP BY job_id
)
SELECT p.job_id,
       t.job_type,
       p.gpus,
       CAST(coalesce(t.duration_s, p.span_s) AS DOUBLE) AS duration_s,
       round(p.observed_gpu_s, 2) AS observed_gpu_s,
       round(p.gpu_util_mean_pct, 2) AS gpu_util_mean_pct,
       round(p.sm_active_mean_pct, 2) AS sm_active_mean_pct
FROM per_job p
LEFT JOIN scheduler_job_latest t ON p.job_id = t.job_id
ORDER BY duration_s DESC, job_id;
