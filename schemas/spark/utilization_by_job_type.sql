-- How well does each kind of job use its GPUs? Spark SQL version of
-- schemas/sql/utilization_by_job_type.sql (columns: there); the same rows on
-- the same store.
--
--   scripts/spark --store gputel-data utilization_by_job_type

SELECT coalesce(t.job_type, 'unknown') AS job_type,
       count(DISTINCT g.job_id) AS jobs,
       round(sum(g.weight_s) / 3600, 4) AS gpu_hours,
       round(sum(g.gpu_util_pct * g.weight_s)
             / sum(g.weight_s) FILTER (WHERE g.gpu_util_pct IS NOT NULL), 2) AS gpu_util_mean_pct,
       round(sum(g.sm_active_pct * g.weight_s)
             / sum(g.weight_s) FILTER (WHERE g.sm_active_pct IS NOT NULL), 2) AS sm_active_mean_pct,
       round(100 * coalesce(sum(g.weight_s) FILTER (WHERE g.gpu_util_pct < 5), 0)
             / sum(g.weight_s) FILTER (WHERE g.gpu_util_pct IS NOT NULL), 2) AS idle_share_pct
FROM gpu_weighted g
LEFT JOIN scheduler_job_latest t ON g.job_id = t.job_id
WHERE g.job_id IS NOT NULL
GROUP BY ALL
ORDER BY gpu_hours DESC, job_type;
