-- How much power do idle GPUs draw, and what share of the energy is that?
--
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c ".read schemas/sql/idle_gpu_power.sql"
--
-- Every gpu row (one GPU at one tick) falls in one state:
--   unallocated         no job and no Kubernetes pod on the GPU (job_count = 0,
--                       pod_uid null)
--   allocated, idle     a job or pod holds the GPU, and utilization is 0 %
--   allocated, active   a job or pod holds the GPU, utilization above 0 %
--                       (or unknown)
-- One row per node and state, then the same for all nodes (node '(all)').
-- Time-weighted (gpu_weighted's weight_s): each sample counts for the time
-- it stands for, so nodes sampled every second and every 15 s add up right.
--
--   time_s          observed GPU time in that state, seconds
--   time_share      its share of the node's observed GPU time
--   power_w_mean    time-weighted mean power draw, W
--   power_w_p50     time-weighted median: the smallest power with at least
--                   half of the state's time at or below it, W
--   power_w_max     highest power draw, W
--   energy_share    that state's share of the node's GPU energy (power ×
--                   time, summed)
--
-- Reading it: the unallocated and allocated-idle rows are what idle GPUs
-- cost; their energy_share is the part of the GPU power bill that did no work.

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
-- Each power value's cumulative time within its (node, state) and overall.
-- Sums of float weights differ in their last bits with the order they are
-- added in, so "at least half" allows a part in 10^9: an exact half is half.
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
           sum(power_w * weight_s) FILTER (power_w IS NOT NULL)
               / sum(weight_s) FILTER (power_w IS NOT NULL) AS power_w_mean,
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
