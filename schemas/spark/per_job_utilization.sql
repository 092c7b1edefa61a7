-- How hard does each job use its GPUs? Spark SQL version of
-- schemas/sql/per_job_utilization.sql (columns and reading: there); the same
-- rows on the same store.
--
--   scripts/spark --store gputel-data per_job_utilization

WITH samples AS (
    SELECT job_id,
           node,
           gpu,
           weight_s,
           CAST(gpu_util_pct AS DOUBLE) AS gpu_util_pct,
           CAST(sm_active_pct AS DOUBLE) AS sm_active_pct,
           fb_used_bytes / 1073741824D AS fb_used_gib,
           power_mw / 1e3 AS power_w
    FROM gpu_weighted
    WHERE job_id IS NOT NULL AND weight_s > 0
),
gpus AS (
    SELECT job_id, count(DISTINCT struct(node, gpu)) AS gpus FROM samples GROUP BY job_id
),
long AS (
    SELECT job_id, metric, value, weight_s
    FROM samples
    UNPIVOT (value FOR metric IN (gpu_util_pct, sm_active_pct, fb_used_gib, power_w))
),
-- Each value's cumulative weight within its job and metric, in value order.
cumulative AS (
    SELECT job_id, metric, value, weight_s,
           sum(weight_s) OVER (PARTITION BY job_id, metric ORDER BY value
                               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum_s,
           sum(weight_s) OVER (PARTITION BY job_id, metric) AS total_s
    FROM long
)
SELECT job_id,
       gpus,
       metric,
       round(sum(weight_s), 3) AS time_s,
       round(sum(value * weight_s) / sum(weight_s), 2) AS mean,
       -- A part in 10^9 of slack, as in the DuckDB query.
       round(min(value) FILTER (WHERE cum_s >= 0.5D * total_s * (1 - 1e-9)), 2) AS p50,
       round(min(value) FILTER (WHERE cum_s >= 0.95D * total_s * (1 - 1e-9)), 2) AS p95,
       round(max(value), 2) AS max
FROM cumulative
JOIN gpus USING (job_id)
GROUP BY job_id, gpus, metric
ORDER BY job_id,
         CASE metric WHEN 'gpu_util_pct' THEN 1 WHEN 'sm_active_pct' THEN 2
                     WHEN 'fb_used_gib' THEN 3 ELSE 4 END;
