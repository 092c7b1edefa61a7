-- How are SM activity, GPU memory, power and temperature distributed over
-- the fleet's GPUs?
--
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c ".read schemas/sql/gpu_cdf.sql"
--
-- The CDFs as a table: one row per percentile, 0 to 100 in steps of 5. Every
-- gpu row (one GPU at one tick) is one point, busy or idle; a row whose metric
-- is null (SM activity before Hopper, or on a GPU's first tick) does not count
-- for that metric.
--
--   pct            the percentile p
--   sm_active_pct  GPM SM activity, %
--   fb_used_gib    framebuffer memory used, GiB
--   power_w        power draw, W
--   temperature_c  GPU temperature, °C
--
-- Each value is a sampled value, not interpolated: the smallest one with at
-- least p % of the GPU samples at or below it. pct 0 is the minimum, 50 the
-- median, 100 the maximum. Plot a column against pct for the CDF; add a WHERE
-- to the first CTE (a date range, some nodes, the GPUs of one job type
-- through scheduler_job_latest) to compare groups.

WITH points AS (
    SELECT sm_active_pct::DOUBLE AS sm_active_pct,
           fb_used_bytes / 2^30 AS fb_used_gib,
           power_mw / 1e3 AS power_w,
           temperature_c
    FROM gpu
),
pcts AS (
    SELECT range AS pct FROM range(0, 101, 5)
),
quantiles AS (
    SELECT quantile_disc(sm_active_pct, [pct / 100 FOR pct IN range(0, 101, 5)]) AS sm,
           quantile_disc(fb_used_gib, [pct / 100 FOR pct IN range(0, 101, 5)]) AS fb,
           quantile_disc(power_w, [pct / 100 FOR pct IN range(0, 101, 5)]) AS power,
           quantile_disc(temperature_c, [pct / 100 FOR pct IN range(0, 101, 5)]) AS temp
    FROM points
)
SELECT pct,
       round(sm[pct // 5 + 1], 2) AS sm_active_pct,
       round(fb[pct // 5 + 1], 2) AS fb_used_gib,
       round(power[pct // 5 + 1], 2) AS power_w,
       temp[pct // 5 + 1] AS temperature_c
FROM pcts, quantiles
ORDER BY pct;
