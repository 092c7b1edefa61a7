-- How hard does each job use its GPUs?
--
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c ".read schemas/sql/per_job_utilization.sql"
--
-- One row per job and metric, over every GPU sample attributed to the job
-- (gpu rows whose job_id is the job: the GPU was the job's alone at that tick;
-- GPUs shared by several jobs, and Kubernetes pods without a job id, are
-- left out). Time-weighted: every sample counts for the time it stands for
-- (gpu_weighted's weight_s), so a GPU sampled every second and one sampled
-- every 15 s count equally for equal time.
--
--   job_id   the scheduler's job id
--   gpus     distinct (node, GPU) pairs the job was seen on
--   metric   gpu_util_pct   NVML utilization: % of the interval any kernel ran
--            sm_active_pct  SM activity: % of SM cycles busy, from GPM (Hopper
--                           and newer; null on a GPU's first tick) or DCGM's
--                           profiling fields (A100 and other GPUs before
--                           Hopper; the gpu table's profiling_source says
--                           which); null on GPUs with neither
--            fb_used_gib    framebuffer memory used, GiB
--            power_w        power draw, W
--   time_s   GPU-seconds observed with a value for this metric
--   mean     the time-weighted mean: sum(value × weight_s) / sum(weight_s)
--   p50, p95 the smallest sampled value with at least 50 % (95 %) of the
--            job's observed time at or below it
--   max      the largest sampled value
--
-- Reading it: NVML's utilization counts an interval as busy when any kernel
-- ran in it, so gpu_util_pct near 100 with a low sm_active_pct is a job that
-- keeps kernels running on a few SMs and leaves the rest idle. A p50 well
-- below the mean is a job that idles most of the time and works in bursts.

WITH samples AS (
    SELECT job_id,
           node,
           gpu,
           weight_s,
           gpu_util_pct::DOUBLE AS gpu_util_pct,
           sm_active_pct::DOUBLE AS sm_active_pct,
           fb_used_bytes / 2^30 AS fb_used_gib,
           power_mw / 1e3 AS power_w
    FROM gpu_weighted
    WHERE job_id IS NOT NULL AND weight_s > 0
),
gpus AS (
    SELECT job_id, count(DISTINCT (node, gpu)) AS gpus FROM samples GROUP BY job_id
),
long AS (
    UNPIVOT samples
    ON gpu_util_pct, sm_active_pct, fb_used_gib, power_w
    INTO NAME metric VALUE value
),
-- Each value's cumulative weight within its job and metric, in value order.
cumulative AS (
    SELECT job_id, metric, value, weight_s,
           sum(weight_s) OVER (PARTITION BY job_id, metric ORDER BY value
                               ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum_s,
           sum(weight_s) OVER (PARTITION BY job_id, metric) AS total_s
    FROM long
)
SELECT job_id,
       gpus,
       metric,
       round(sum(weight_s), 3) AS time_s,
       round(sum(value * weight_s) / sum(weight_s), 2) AS mean,
       -- A part in 10^9 of slack, as in fleet_cdf.sql: an exact half must
       -- count as half whatever order the float sums were added in.
       round(min(value) FILTER (cum_s >= 0.5 * total_s * (1 - 1e-9)), 2) AS p50,
       round(min(value) FILTER (cum_s >= 0.95 * total_s * (1 - 1e-9)), 2) AS p95,
       round(max(value), 2) AS max
FROM cumulative
JOIN gpus USING (job_id)
GROUP BY job_id, gpus, metric
ORDER BY job_id,
         CASE metric WHEN 'gpu_util_pct' THEN 1 WHEN 'sm_active_pct' THEN 2
                     WHEN 'fb_used_gib' THEN 3 ELSE 4 END;
