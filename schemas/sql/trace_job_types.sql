-- What kinds of job does the cluster run, and what does each cost? (The
-- Acme study, NSDI'24, from the scheduler trace alone: count share and
-- GPU-time share per job type, queue delay and GPU count per type.)
--
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c ".read schemas/sql/trace_job_types.sql"
--
-- Over the GPU jobs of the trace (scheduler_job_latest with gpus > 0), as
-- every figure of the study (its notebook keeps gpu_num > 0): CPU-only jobs
-- and jobs without a GPU count are left out. One row per job type (untyped
-- jobs: 'unknown'), then 'all'. GPU time is the trace's gpu_time_s (else
-- gpus × duration_s). Medians are interpolated (quantile_cont). The whole
-- distributions per type (the study's CDFs of duration and queue delay per
-- type, its box plot of GPUs per type): trace_job_type_cdf.sql. The
-- GPU-time share by type and by final state, beside the share the
-- telemetry measured: gpu_time_share.sql.
--
--   job_type            the trace's job type, as the trace writes it
--                       (AcmeTrace: Pretrain, SFT, Eval, MLLM, Debug, Other)
--   jobs                jobs of that type
--   job_share_pct       jobs / all jobs, %
--   gpu_time_share_pct  their GPU time / all GPU time, %
--   gpus_mean           mean GPUs per job
--   gpus_p50            median GPUs per job
--   queue_p50_s         median queue delay (submit to start), seconds
--   queue_p95_s         95th percentile queue delay, seconds
--   duration_p50_s      median duration, seconds

WITH jobs AS (
    SELECT coalesce(job_type, 'unknown') AS job_type, gpus, queue_s, duration_s,
           coalesce(gpu_time_s, gpus * duration_s, 0)::DOUBLE AS gpu_s
    FROM scheduler_job_latest
    WHERE gpus > 0
),
total AS (
    SELECT count(*) AS all_jobs, sum(gpu_s) AS all_gpu_s FROM jobs
)
SELECT coalesce(job_type, 'all') AS job_type,
       count(*) AS jobs,
       round(100 * count(*) / any_value(all_jobs), 2) AS job_share_pct,
       round(100 * sum(gpu_s) / nullif(any_value(all_gpu_s), 0), 2) AS gpu_time_share_pct,
       round(avg(gpus), 2) AS gpus_mean,
       round(quantile_cont(gpus, 0.5), 2) AS gpus_p50,
       round(quantile_cont(queue_s, 0.5), 2) AS queue_p50_s,
       round(quantile_cont(queue_s, 0.95), 2) AS queue_p95_s,
       round(quantile_cont(duration_s, 0.5), 2) AS duration_p50_s
FROM jobs, total
GROUP BY GROUPING SETS ((job_type), ())
ORDER BY job_type IS NULL, gpu_time_share_pct DESC, job_type;
