-- How long was each GPU slowed down, and why?
--
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c ".read schemas/sql/throttle_time.sql"
--
-- From the clock event reasons NVML reports with every sample
-- (clock_event_reasons): thermal (software or hardware thermal slowdown,
-- bits 0x20 and 0x40), power (software power cap or hardware power brake,
-- bits 0x4 and 0x80) and hardware slowdown (bit 0x8, which the driver also
-- sets for thermal and power-brake events). Time-weighted (gpu_weighted's
-- weight_s). One row per GPU (node, gpu; MIG devices together), the most
-- throttled first.
--
--   time_s             observed time, seconds
--   thermal_s          time with a thermal reason set
--   power_s            time with a power reason set
--   hw_slowdown_s      time with hardware slowdown set
--   throttled_s        time with any of them set
--   throttled_pct      throttled_s / time_s, %
--
-- Reading it: a GPU that is power-capped while busy is working as its limit
-- allows; one that is thermally throttled for more than a few percent of
-- its time needs its cooling looked at, and so do its neighbours.

WITH reasons AS (
    SELECT node, gpu, weight_s,
           coalesce(clock_event_reasons & 96 != 0, false) AS thermal,
           coalesce(clock_event_reasons & 132 != 0, false) AS power,
           coalesce(clock_event_reasons & 8 != 0, false) AS hw_slowdown
    FROM gpu_weighted
    WHERE weight_s > 0
)
SELECT node, gpu,
       round(sum(weight_s), 2) AS time_s,
       round(coalesce(sum(weight_s) FILTER (thermal), 0), 2) AS thermal_s,
       round(coalesce(sum(weight_s) FILTER (power), 0), 2) AS power_s,
       round(coalesce(sum(weight_s) FILTER (hw_slowdown), 0), 2) AS hw_slowdown_s,
       round(coalesce(sum(weight_s) FILTER (thermal OR power OR hw_slowdown), 0), 2) AS throttled_s,
       round(100 * coalesce(sum(weight_s) FILTER (thermal OR power OR hw_slowdown), 0)
             / sum(weight_s), 2) AS throttled_pct
FROM reasons
GROUP BY node, gpu
ORDER BY throttled_pct DESC, node, gpu;
