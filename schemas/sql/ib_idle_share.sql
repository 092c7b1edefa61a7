-- How often are the InfiniBand ports idle?
--
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c ".read schemas/sql/ib_idle_share.sql"
--
-- A port-tick is one ib row: one ACTIVE port at one tick. It is idle when the
-- port moved less than 1 MB/s in both directions together
-- (rcv_bytes_per_s + xmit_bytes_per_s < 1e6; change `idle_below` in the first
-- CTE for another threshold). Rows without rates (a port's first tick, a
-- saturated 32-bit counter) and ports not ACTIVE are left out.
-- One row per node, then all nodes together (node '(all)').
--
--   ports            distinct (node, device, port)
--   port_ticks       port-ticks with rates
--   idle_port_ticks  the idle ones
--   idle_share       idle_port_ticks / port_ticks
--
-- Reading it: idle_share is the part of the time a node's InfiniBand sat
-- unused. Compare nodes running multi-node jobs (which synchronize gradients
-- over IB) with single-node ones, which need it only for storage traffic.

WITH params AS (
    SELECT 1e6 AS idle_below
),
ticks AS (
    SELECT node, device, port,
           rcv_bytes_per_s + xmit_bytes_per_s < idle_below AS idle
    FROM ib, params
    WHERE state = 'ACTIVE'
      AND rcv_bytes_per_s IS NOT NULL
      AND xmit_bytes_per_s IS NOT NULL
)
SELECT coalesce(node, '(all)') AS node,
       count(DISTINCT (node, device, port)) AS ports,
       count(*) AS port_ticks,
       count(*) FILTER (WHERE idle) AS idle_port_ticks,
       round(count(*) FILTER (WHERE idle) / count(*), 4) AS idle_share
FROM ticks
GROUP BY ROLLUP (node)
ORDER BY node IS NULL, node;
