-- How long was each GPU slowed down, and why? Spark SQL version of
-- schemas/sql/throttle_time.sql (reasons, columns and reading: there); the
-- same rows on the same store.
--
--   scripts/spark --store gputel-data throttle_time

WITH reasons AS (
    SELECT node, gpu, weight_s,
           coalesce((clock_event_reasons & 96) != 0, false) AS thermal,
           coalesce((clock_event_reasons & 132) != 0, false) AS power,
           coalesce((clock_event_reasons & 8) != 0, false) AS hw_slowdown
    FROM gpu_weighted
    WHERE weight_s > 0
)
SELECT node, gpu,
       round(sum(weight_s), 2) AS time_s,
       round(coalesce(sum(weight_s) FILTER (WHERE thermal), 0), 2) AS thermal_s,
       round(coalesce(sum(weight_s) FILTER (WHERE power), 0), 2) AS power_s,
       round(coalesce(sum(weight_s) FILTER (WHERE hw_slowdown), 0), 2) AS hw_slowdown_s,
       round(coalesce(sum(weight_s) FILTER (WHERE thermal OR power OR hw_slowdown), 0), 2)
           AS throttled_s,
       round(100 * coalesce(sum(weight_s) FILTER (WHERE thermal OR power OR hw_slowdown), 0)
             / sum(weight_s), 2) AS throttled_pct
FROM reasons
GROUP BY node, gpu
ORDER BY throttled_pct DESC, node, gpu;
