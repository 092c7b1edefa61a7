-- How often are the InfiniBand ports idle?
--
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c ".read schemas/sql/ib_idle_share.sql"
--
-- Time-weighted: every ib row (one port at one tick) counts for the time it
-- stands for (ib_weighted's weight_s). A port is idle while it moves less
-- than 1 MB/s in both directions together (rcv_bytes_per_s +
-- xmit_bytes_per_s < 1e6; change `idle_below` in the first CTE for another
-- threshold). Rows without rates (a port's first tick, a saturated 32-bit
-- counter) and ports not ACTIVE are left out. One row per node, then all
-- nodes together (node '(all)').
--
--   ports        distinct (node, device, port)
--   time_s       port-seconds observed with rates
--   idle_time_s  the idle ones
--   idle_share   idle_time_s / time_s
--
-- Reading it: idle_share is the part of the time a node's InfiniBand sat
-- unused. Compare nodes running multi-node jobs (which synchronize gradients
-- over IB) with single-node ones, which need it only for storage traffic.

WITH params AS (
    SELECT 1e6 AS idle_below
),
ticks AS (
    SELECT node, device, port, weight_s,
           rcv_bytes_per_s + xmit_bytes_per_s < idle_below AS idle
    FROM ib_weighted, params
    WHERE state = 'ACTIVE'
      AND rcv_bytes_per_s IS NOT NULL
      AND xmit_bytes_per_s IS NOT NULL
      AND weight_s > 0
)
SELECT coalesce(node, '(all)') AS node,
       count(DISTINCT (node, device, port)) AS ports,
       round(sum(weight_s), 3) AS time_s,
       round(coalesce(sum(weight_s) FILTER (WHERE idle), 0), 3) AS idle_time_s,
       round(coalesce(sum(weight_s) FILTER (WHERE idle), 0) / sum(weight_s), 4) AS idle_share
FROM ticks
GROUP BY ROLLUP (node)
ORDER BY node IS NULL, node;
