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
--
--   samples         GPU samples in that state
--   sample_share    their share of the node's GPU samples, which is their
--                   share of its GPU time (a node samples every GPU each tick)
--   power_w_mean, power_w_p50, power_w_max   power draw in that state, W
--   energy_share    that state's share of the node's GPU energy: power times
--                   the node's sampling interval (view sample_interval), summed
--
-- Reading it: the unallocated and allocated-idle rows are what idle GPUs
-- cost; their energy_share is the part of the GPU power bill that did no work.

WITH samples AS (
    SELECT node,
           CASE WHEN job_count = 0 AND pod_uid IS NULL THEN 'unallocated'
                WHEN gpu_util_pct = 0 THEN 'allocated, idle'
                ELSE 'allocated, active' END AS state,
           power_mw / 1e3 AS power_w,
           power_mw / 1e3 * interval_us / 1e6 AS energy_j
    FROM gpu
    LEFT JOIN sample_interval USING (node)
),
grouped AS (
    SELECT coalesce(node, '(all)') AS node,
           state,
           count(*) AS samples,
           avg(power_w) AS power_w_mean,
           quantile_cont(power_w, 0.5) AS power_w_p50,
           max(power_w) AS power_w_max,
           sum(energy_j) AS energy_j
    FROM samples
    GROUP BY GROUPING SETS ((node, state), (state))
)
SELECT node,
       state,
       samples,
       round(samples / sum(samples) OVER (PARTITION BY node), 4) AS sample_share,
       round(power_w_mean, 2) AS power_w_mean,
       round(power_w_p50, 2) AS power_w_p50,
       round(power_w_max, 2) AS power_w_max,
       round(energy_j / sum(energy_j) OVER (PARTITION BY node), 4) AS energy_share
FROM grouped
ORDER BY node = '(all)', node,
         CASE state WHEN 'unallocated' THEN 1 WHEN 'allocated, idle' THEN 2 ELSE 3 END;
