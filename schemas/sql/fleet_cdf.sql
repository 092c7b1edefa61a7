-- How are the fleet's GPU, host and network loads distributed over time?
-- (The Acme study, NSDI'24: the CDFs of GPU utilization, SM activity and
-- occupancy, GPU memory as a share of capacity, power as a share of the
-- limit, GPU and memory temperature, host CPU and host memory, and
-- InfiniBand bandwidth as a share of the link rate.)
--
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c ".read schemas/sql/fleet_cdf.sql"
--
-- One row per percentile, 0 to 100 in steps of 5 (see cdf_points). Time-weighted: every
-- sample counts for the time it stands for (weight_s of gpu_weighted,
-- node_weighted, ib_weighted), so a GPU sampled every second and one sampled
-- every 15 s count equally for equal time. The value at p is the smallest
-- sampled value with at least p % of the observed time at or below it
-- (p 0: the minimum, p 100: the maximum). A null reading (SM metrics without
-- GPM or DCGM, a missing limit) does not count for that metric.
--
-- Resampling, as the study plots (15 s): set cdf_window_s before reading
-- this file, and each device's samples are first averaged over windows of
-- that many seconds (aligned to the epoch; a window's value is its samples'
-- time-weighted mean, its weight their time). Unset (the default), every
-- sample counts as it is:
--
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c "SET VARIABLE cdf_window_s = 15" \
--                  -c ".read schemas/sql/fleet_cdf.sql"
--
-- The study's CDFs have 1000 points per metric: set cdf_points (default
-- 21: 0 to 100 in steps of 5 %) to 1000 for numpy's linspace(0, 100, 1000)
-- (`gputel-collector report --cdf-csv` writes the same points).
--
--   gpu_util_pct          NVML utilization, %
--   sm_active_pct         SM activity, %
--   sm_occupancy_pct      SM occupancy, %
--   tensor_active_pct     tensor core activity, %
--   gpu_mem_share_pct     framebuffer used / framebuffer total, %
--   power_share_pct       power draw / power limit, %
--   power_w               power draw, W
--   temperature_c         GPU temperature, °C
--   memory_temperature_c  HBM temperature, °C
--   cpu_busy_pct          host CPU user + system, %
--   host_mem_share_pct    host memory used / total, %
--   ib_xmit_share_pct     InfiniBand send rate / link rate, % (per port)
--   ib_rcv_share_pct      InfiniBand receive rate / link rate, % (per port)

WITH samples AS (
    SELECT metric, value, weight_s, node, gpu::VARCHAR || '/' || coalesce(gpu_instance_id, -1)
               || '/' || coalesce(compute_instance_id, -1) AS device, ts
    FROM (SELECT weight_s, node, gpu, gpu_instance_id, compute_instance_id, ts,
                 gpu_util_pct::DOUBLE AS gpu_util_pct,
                 sm_active_pct::DOUBLE AS sm_active_pct,
                 sm_occupancy_pct::DOUBLE AS sm_occupancy_pct,
                 tensor_active_pct::DOUBLE AS tensor_active_pct,
                 100 * fb_used_bytes / nullif(fb_total_bytes, 0) AS gpu_mem_share_pct,
                 100 * power_mw / nullif(power_limit_mw, 0) AS power_share_pct,
                 power_mw / 1e3 AS power_w,
                 temperature_c::DOUBLE AS temperature_c,
                 memory_temperature_c::DOUBLE AS memory_temperature_c
          FROM gpu_weighted)
    UNPIVOT (value FOR metric IN (gpu_util_pct, sm_active_pct, sm_occupancy_pct,
                                  tensor_active_pct, gpu_mem_share_pct, power_share_pct,
                                  power_w, temperature_c, memory_temperature_c))
    UNION ALL
    SELECT metric, value, weight_s, node, '' AS device, ts
    FROM (SELECT weight_s, node, ts,
                 (cpu_user_pct + cpu_system_pct)::DOUBLE AS cpu_busy_pct,
                 100 * memory_used_bytes / nullif(memory_total_bytes, 0) AS host_mem_share_pct
          FROM node_weighted)
    UNPIVOT (value FOR metric IN (cpu_busy_pct, host_mem_share_pct))
    UNION ALL
    -- bytes/s × 8 / 1e9 is Gb/s; ports with no known rate are left out.
    SELECT metric, value, weight_s, node, device || '/' || port AS device, ts
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
             CASE WHEN getvariable('cdf_window_s') IS NULL THEN epoch_us(ts)
                  ELSE epoch_us(ts) // (getvariable('cdf_window_s') * 1000000)::BIGINT END
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
    SELECT 100 * i / (coalesce(getvariable('cdf_points'), 21) - 1) AS pct
    FROM range(0, coalesce(getvariable('cdf_points'), 21)) r(i)
),
quantiles AS (
    SELECT pct, metric, min(value) AS value
    FROM points, cumulative
    -- A part in 10^9 of slack: float sums differ in their last bits with
    -- the order they are added in, and an exact 50 % must count as 50 %.
    WHERE cum_s * 100 >= pct * total_s * (1 - 1e-9)
    GROUP BY pct, metric
)
SELECT pct,
       round(any_value(value) FILTER (metric = 'gpu_util_pct'), 2) AS gpu_util_pct,
       round(any_value(value) FILTER (metric = 'sm_active_pct'), 2) AS sm_active_pct,
       round(any_value(value) FILTER (metric = 'sm_occupancy_pct'), 2) AS sm_occupancy_pct,
       round(any_value(value) FILTER (metric = 'tensor_active_pct'), 2) AS tensor_active_pct,
       round(any_value(value) FILTER (metric = 'gpu_mem_share_pct'), 2) AS gpu_mem_share_pct,
       round(any_value(value) FILTER (metric = 'power_share_pct'), 2) AS power_share_pct,
       round(any_value(value) FILTER (metric = 'power_w'), 2) AS power_w,
       round(any_value(value) FILTER (metric = 'temperature_c'), 2) AS temperature_c,
       round(any_value(value) FILTER (metric = 'memory_temperature_c'), 2) AS memory_temperature_c,
       round(any_value(value) FILTER (metric = 'cpu_busy_pct'), 2) AS cpu_busy_pct,
       round(any_value(value) FILTER (metric = 'host_mem_share_pct'), 2) AS host_mem_share_pct,
       round(any_value(value) FILTER (metric = 'ib_xmit_share_pct'), 2) AS ib_xmit_share_pct,
       round(any_value(value) FILTER (metric = 'ib_rcv_share_pct'), 2) AS ib_rcv_share_pct
FROM points
LEFT JOIN quantiles USING (pct)
GROUP BY pct
ORDER BY pct;
