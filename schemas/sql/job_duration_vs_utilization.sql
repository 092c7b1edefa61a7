-- Do long jobs use their GPUs better than short ones? (The Acme study,
-- NSDI'24: job duration against GPU utilization.)
--
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c ".read schemas/sql/job_duration_vs_utilization.sql"
--
-- One row per job seen on a GPU, to scatter duration_s against
-- gpu_util_mean_pct. Time-weighted (gpu_weighted's weight_s).
--
--   job_id             the scheduler's job id
--   job_type           the trace's type (null: not in the trace, or untyped)
--   gpus               distinct (node, GPU) pairs the job was seen on
--   duration_s         the trace's duration; without one, the observed span
--                      (first to last gpu row of the job)
--   observed_gpu_s     GPU time the telemetry observed, seconds
--   gpu_util_mean_pct  time-weighted mean NVML utilization, %
--   sm_active_mean_pct time-weighted mean SM activity, %

WITH per_job AS (
    SELECT job_id,
           count(DISTINCT (node, gpu)) AS gpus,
           (epoch_us(max(ts)) - epoch_us(min(ts))) / 1e6 AS span_s,
           sum(weight_s) AS observed_gpu_s,
           sum(gpu_util_pct * weight_s) / sum(weight_s) FILTER (gpu_util_pct IS NOT NULL)
               AS gpu_util_mean_pct,
           sum(sm_active_pct * weight_s) / sum(weight_s) FILTER (sm_active_pct IS NOT NULL)
               AS sm_active_mean_pct
    FROM gpu_weighted
    WHERE job_id IS NOT NULL
    GROUP BY job_id
)
SELECT p.job_id,
       t.job_type,
       p.gpus,
       coalesce(t.duration_s, p.span_s)::DOUBLE AS duration_s,
       round(p.observed_gpu_s, 2) AS observed_gpu_s,
       round(p.gpu_util_mean_pct, 2) AS gpu_util_mean_pct,
       round(p.sm_active_mean_pct, 2) AS sm_active_mean_pct
FROM per_job p
LEFT JOIN scheduler_job_latest t USING (job_id)
ORDER BY duration_s DESC, job_id;
