-- How much power do idle GPUs draw, and what share of the energy is that?
-- Spark SQL version of schemas/sql/idle_gpu_power.sql (states, columns and
-- reading: there); the same rows on the same store.
--
--   scripts/spark --store gputel-data idle_gpu_power

WITH samples AS (
    SELECT node,
           CASE WHEN job_count = 0 AND pod_uid IS NULL THEN 'unallocated'
                WHEN gpu_util_pct = 0 THEN 'allocated, idle'
                ELSE 'allocated, active' END AS state,
           power_mw / 1e3 AS power_w,
           weight_s
    FROM gpu_weighted
    WHERE weight_s > 0
),
-- Each power value's cumulative time within its (node, state) and overall;
-- "at least half" allows a part in 10^9, as in the DuckDB query.
cumulative AS (
    SELECT node, state, power_w, weight_s,
           sum(weight_s) OVER (PARTITION BY node, state ORDER BY power_w
                               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS node_cum_s,
           sum(weight_s) OVER (PARTITION BY node, state) AS node_total_s,
           sum(weight_s) OVER (PARTITION BY state ORDER BY power_w
                               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS all_cum_s,
           sum(weight_s) OVER (PARTITION BY state) AS all_total_s
    FROM samples
    WHERE power_w IS NOT NULL
),
grouped AS (
    SELECT coalesce(node, '(all)') AS node,
           state,
           sum(weight_s) AS time_s,
           sum(power_w * weight_s) FILTER (WHERE power_w IS NOT NULL)
               / sum(weight_s) FILTER (WHERE power_w IS NOT NULL) AS power_w_mean,
           max(power_w) AS power_w_max,
           sum(power_w * weight_s) AS energy_j
    FROM samples
    GROUP BY GROUPING SETS ((node, state), (state))
),
medians AS (
    SELECT node, state, min(power_w) AS power_w_p50
    FROM cumulative
    WHERE node_cum_s * 2 >= node_total_s * (1 - 1e-9)
    GROUP BY node, state
    UNION ALL
    SELECT '(all)', state, min(power_w)
    FROM cumulative
    WHERE all_cum_s * 2 >= all_total_s * (1 - 1e-9)
    GROUP BY state
)
SELECT node,
       state,
       round(time_s, 2) AS time_s,
       round(time_s / sum(time_s) OVER (PARTITION BY node), 4) AS time_share,
       round(power_w_mean, 2) AS power_w_mean,
       round(power_w_p50, 2) AS power_w_p50,
       round(power_w_max, 2) AS power_w_max,
       round(energy_j / sum(energy_j) OVER (PARTITION BY node), 4) AS energy_share
FROM grouped
LEFT JOIN medians USING (node, state)
ORDER BY node = '(all)', node,
         CASE state WHEN 'unallocated' THEN 1 WHEN 'allocated, idle' THEN 2 ELSE 3 END;
