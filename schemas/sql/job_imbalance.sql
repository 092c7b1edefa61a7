-- Do a job's GPUs carry the same load, and how much of its GPU time is idle?
-- (The Acme study, NSDI'24: per-job GPU memory imbalance and idle GPU time.)
--
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c ".read schemas/sql/job_imbalance.sql"
--
-- One row per job seen on a GPU.
--
--   job_id                 the scheduler's job id
--   gpus                   distinct (node, GPU) pairs the job was seen on
--   mem_peak_min_pct       lowest per-GPU peak of framebuffer used / total, %
--   mem_peak_max_pct       highest per-GPU peak, %
--   mem_imbalance_pct      max − min of those peaks, percentage points: 0 is
--                          a job that fills all its GPUs alike
--   idle_share_pct         time-weighted share of the job's GPU time with
--                          NVML utilization under 5 %, %

WITH per_gpu AS (
    SELECT job_id, node, gpu,
           max(100 * fb_used_bytes / nullif(fb_total_bytes, 0)) AS mem_peak_pct,
           sum(weight_s) FILTER (gpu_util_pct < 5) AS idle_s,
           sum(weight_s) FILTER (gpu_util_pct IS NOT NULL) AS util_s
    FROM gpu_weighted
    WHERE job_id IS NOT NULL
    GROUP BY job_id, node, gpu
)
SELECT job_id,
       count(*) AS gpus,
       round(min(mem_peak_pct), 2) AS mem_peak_min_pct,
       round(max(mem_peak_pct), 2) AS mem_peak_max_pct,
       round(max(mem_peak_pct) - min(mem_peak_pct), 2) AS mem_imbalance_pct,
       round(100 * coalesce(sum(idle_s), 0) / sum(util_s), 2) AS idle_share_pct
FROM per_gpu
GROUP BY job_id
ORDER BY mem_imbalance_pct DESC, job_id;
