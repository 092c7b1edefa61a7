-- How hard does each job use its GPUs?
--
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c ".read schemas/sql/per_job_utilization.sql"
--
-- One row per job and metric, over every GPU sample attributed to the job
-- (gpu rows whose job_id is the job: the GPU was the job's alone at that tick;
-- GPUs shared by several jobs, and Kubernetes pods without a job id, are
-- left out).
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
--   samples  samples with a value for this metric
--   mean, p50, p95, max   over those samples (p50/p95 interpolated)
--
-- Reading it: NVML's utilization counts an interval as busy when any kernel
-- ran in it, so gpu_util_pct near 100 with a low sm_active_pct is a job that
-- keeps kernels running on a few SMs and leaves the rest idle. A p50 well
-- below the mean is a job that idles most of the time and works in bursts.

WITH samples AS (
    SELECT job_id,
           node,
           gpu,
           gpu_util_pct::DOUBLE AS gpu_util_pct,
           sm_active_pct::DOUBLE AS sm_active_pct,
           fb_used_bytes / 2^30 AS fb_used_gib,
           power_mw / 1e3 AS power_w
    FROM gpu
    WHERE job_id IS NOT NULL
),
gpus AS (
    SELECT job_id, count(DISTINCT (node, gpu)) AS gpus FROM samples GROUP BY job_id
),
long AS (
    UNPIVOT samples
    ON gpu_util_pct, sm_active_pct, fb_used_gib, power_w
    INTO NAME metric VALUE value
)
SELECT job_id,
       gpus,
       metric,
       count(value) AS samples,
       round(avg(value), 2) AS mean,
       round(quantile_cont(value, 0.5), 2) AS p50,
       round(quantile_cont(value, 0.95), 2) AS p95,
       round(max(value), 2) AS max
FROM long
JOIN gpus USING (job_id)
GROUP BY job_id, gpus, metric
ORDER BY job_id,
         CASE metric WHEN 'gpu_util_pct' THEN 1 WHEN 'sm_active_pct' THEN 2
                     WHEN 'fb_used_gib' THEN 3 ELSE 4 END;
