-- How are the fleet's GPU, host and network loads distributed over time?
-- Spark SQL version of schemas/sql/fleet_cdf.sql (columns and reading:
-- there); the same rows on the same store. Time-weighted; the value at p is
-- the smallest sampled value with at least p % of the observed time at or
-- below it. Resampling and the number of points are variables:
--
--   scripts/spark --store gputel-data fleet_cdf
--   scripts/spark --store gputel-data --set cdf_window_s=15 --set cdf_points=1000 fleet_cdf

WITH samples AS (
    SELECT metric, value, weight_s, node,
           CAST(gpu AS STRING) || '/' || CAST(coalesce(gpu_instance_id, -1) AS STRING)
               || '/' || CAST(coalesce(compute_instance_id, -1) AS STRING) AS device, ts
    FROM (SELECT weight_s, node, gpu, gpu_instance_id, compute_instance_id, ts,
                 CAST(gpu_util_pct AS DOUBLE) AS gpu_util_pct,
                 CAST(sm_active_pct AS DOUBLE) AS sm_active_pct,
                 CAST(sm_occupancy_pct AS DOUBLE) AS sm_occupancy_pct,
                 CAST(tensor_active_pct AS DOUBLE) AS tensor_active_pct,
                 100 * fb_used_bytes / nullif(fb_total_bytes, 0) AS gpu_mem_share_pct,
                 100 * power_mw / nullif(power_limit_mw, 0) AS power_share_pct,
                 power_mw / 1e3 AS power_w,
                 CAST(temperature_c AS DOUBLE) AS temperature_c,
                 CAST(memory_temperature_c AS DOUBLE) AS memory_temperature_c
          FROM gpu_weighted)
    UNPIVOT (value FOR metric IN (gpu_util_pct, sm_active_pct, sm_occupancy_pct,
                                  tensor_active_pct, gpu_mem_share_pct, power_share_pct,
                                  power_w, temperature_c, memory_temperature_c))
    UNION ALL
    SELECT metric, value, weight_s, node, '' AS device, ts
    FROM (SELECT weight_s, node, ts,
                 CAST(cpu_user_pct + cpu_system_pct AS DOUBLE) AS cpu_busy_pct,
                 100 * memory_used_bytes / nullif(memory_total_bytes, 0) AS host_mem_share_pct
          FROM node_weighted)
    UNPIVOT (value FOR metric IN (cpu_busy_pct, host_mem_share_pct))
    UNION ALL
    -- bytes/s × 8 / 1e9 is Gb/s; ports with no known rate are left out.
    SELECT metric, value, weight_s, node, device || '/' || CAST(port AS STRING) AS device, ts
    FROM (SELECT weight_s, node, device, port, ts,
                 100 * xmit_bytes_per_s * 8 / 1e9 / rate_gbps AS ib_xmit_share_pct,
                 100 * rcv_bytes_per_s * 8 / 1e9 / rate_gbps AS ib_rcv_share_pct
          FROM ib_weighted
          WHERE rate_gbps > 0)
    UNPIVOT (value FOR metric IN (ib_xmit_share_pct, ib_rcv_share_pct))
),
-- Each device's samples, or its windows' time-weighted means.
windows AS (
    SELECT metric,
           sum(value * weight_s) / sum(weight_s) AS value,
           sum(weight_s) AS weight_s
    FROM samples
    WHERE value IS NOT NULL AND weight_s > 0
    GROUP BY metric, node, device,
             CASE WHEN ${cdf_window_s} IS NULL THEN unix_micros(ts)
                  ELSE unix_micros(ts) DIV CAST(${cdf_window_s} * 1000000 AS BIGINT) END
),
-- Each value's cumulative weight, in value order, and the metric's total.
cumulative AS (
    SELECT metric, value,
           sum(weight_s) OVER (PARTITION BY metric ORDER BY value
                               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum_s,
           sum(weight_s) OVER (PARTITION BY metric) AS total_s
    FROM windows
),
points AS (
    SELECT 100 * id / (${cdf_points} - 1) AS pct
    FROM range(0, ${cdf_points})
),
quantiles AS (
    SELECT pct, metric, min(value) AS value
    FROM points, cumulative
    -- A part in 10^9 of slack, as in the DuckDB query.
    WHERE cum_s * 100 >= pct * total_s * (1 - 1e-9)
    GROUP BY pct, metric
)
SELECT pct,
       round(max(value) FILTER (WHERE metric = 'gpu_util_pct'), 2) AS gpu_util_pct,
       round(max(value) FILTER (WHERE metric = 'sm_active_pct'), 2) AS sm_active_pct,
       round(max(value) FILTER (WHERE metric = 'sm_occupancy_pct'), 2) AS sm_occupancy_pct,
       round(max(value) FILTER (WHERE metric = 'tensor_active_pct'), 2) AS tensor_active_pct,
       round(max(value) FILTER (WHERE metric = 'gpu_mem_share_pct'), 2) AS gpu_mem_share_pct,
       round(max(value) FILTER (WHERE metric = 'power_share_pct'), 2) AS power_share_pct,
       round(max(value) FILTER (WHERE metric = 'power_w'), 2) AS power_w,
       round(max(value) FILTER (WHERE metric = 'temperature_c'), 2) AS temperature_c,
       round(max(value) FILTER (WHERE metric = 'memory_temperature_c'), 2) AS memory_temperature_c,
       round(max(value) FILTER (WHERE metric = 'cpu_busy_pct'), 2) AS cpu_busy_pct,
       round(max(value) FILTER (WHERE metric = 'host_mem_share_pct'), 2) AS host_mem_share_pct,
       round(max(value) FILTER (WHERE metric = 'ib_xmit_share_pct'), 2) AS ib_xmit_share_pct,
       round(max(value) FILTER (WHERE metric = 'ib_rcv_share_pct'), 2) AS ib_rcv_share_pct
FROM points
LEFT JOIN quantiles USING (pct)
GROUP BY pct
ORDER BY pct;
