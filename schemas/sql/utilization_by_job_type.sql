-- How hard does each type of job use its GPUs? (The Acme study, NSDI'24:
-- GPU utilization per job type.)
--
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c ".read schemas/sql/utilization_by_job_type.sql"
--
-- One row per job type of the scheduler trace (scheduler_job_latest), over
-- the gpu rows attributed to its jobs (a GPU shared by several jobs belongs
-- to none); jobs the trace lacks, or lists without a type, are 'unknown'.
-- Time-weighted (gpu_weighted's weight_s): each GPU counts for the time it
-- was observed, however often its agent sampled it.
--
--   job_type           the trace's job type
--   jobs               jobs of that type seen on a GPU
--   gpu_hours          observed GPU time, hours
--   gpu_util_mean_pct  time-weighted mean NVML utilization, %
--   sm_active_mean_pct time-weighted mean SM activity, % (null without GPM/DCGM)
--   idle_share_pct     share of the GPU time under 5 % utilization, %

SELECT coalesce(t.job_type, 'unknown') AS job_type,
       count(DISTINCT g.job_id) AS jobs,
       round(sum(g.weight_s) / 3600, 4) AS gpu_hours,
       round(sum(g.gpu_util_pct * g.weight_s) / sum(g.weight_s) FILTER (g.gpu_util_pct IS NOT NULL), 2)
           AS gpu_util_mean_pct,
       round(sum(g.sm_active_pct * g.weight_s) / sum(g.weight_s) FILTER (g.sm_active_pct IS NOT NULL), 2)
           AS sm_active_mean_pct,
       round(100 * coalesce(sum(g.weight_s) FILTER (g.gpu_util_pct < 5), 0)
             / sum(g.weight_s) FILTER (g.gpu_util_pct IS NOT NULL), 2) AS idle_share_pct
FROM gpu_weighted g
LEFT JOIN scheduler_job_latest t USING (job_id)
WHERE g.job_id IS NOT NULL
GROUP BY ALL
ORDER BY gpu_hours DESC, job_type;
