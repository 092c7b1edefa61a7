-- How often are the InfiniBand ports idle? Spark SQL version of
-- schemas/sql/ib_idle_share.sql (threshold and columns: there); the same
-- rows on the same store.
--
--   scripts/spark --store gputel-data ib_idle_share

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
SELECT node, ports, time_s, idle_time_s, idle_share
FROM (
    SELECT coalesce(node, '(all)') AS node,
           count(DISTINCT struct(node, device, port)) AS ports,
           round(sum(weight_s), 3) AS time_s,
           round(coalesce(sum(weight_s) FILTER (WHERE idle), 0), 3) AS idle_time_s,
           round(coalesce(sum(weight_s) FILTER (WHERE idle), 0) / sum(weight_s), 4) AS idle_share,
           grouping(node) AS total
    FROM ticks
    GROUP BY ROLLUP (node)
)
-- The total row last (DuckDB orders by the grouping column, null there).
ORDER BY total, node;
