-- Do a job's GPUs carry the same load, and how much of its GPU time is idle?
-- Spark SQL version of schemas/sql/job_imbalance.sql (columns: there); the
-- same rows on the same store.
--
--   scripts/spark --store gputel-data job_imbalance

WITH per_gpu AS (
    SELECT job_id, node, gpu,
           max(100 * fb_used_bytes / nullif(fb_total_bytes, 0)) AS mem_peak_pct,
           sum(weight_s) FILTER (WHERE gpu_util_pct < 5) AS idle_s,
           sum(weight_s) FILTER (WHERE gpu_util_pct IS NOT NULL) AS util_s
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
