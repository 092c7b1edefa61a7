-- Which kinds of jobs use the GPU time, and how much of it goes to jobs that
-- fail or are cancelled?
--
--   gputel-collector import-jobs --format sacct jobs.txt --store gputel-data  # or --format acme
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c ".read schemas/sql/gpu_time_share.sql"
--
-- GPU time is measured, not taken from the trace: each gpu row with a job_id
-- is one GPU held by that job for one sampling interval, so a job's GPU time
-- is its samples times its node's interval. The interval is derived from the
-- data (view sample_interval: the most common gap between a node's
-- consecutive ticks, the agent's --interval). Jobs join to the imported
-- trace on job_id (view scheduler_job_latest: the latest import of each job).
-- GPUs shared by several jobs and pods without a job id count for no job.
--
-- Two groupings in one result, told apart by `dimension`:
--   'job_type'  value is the trace's job type as the trace writes it (Acme:
--               Pretrain, SFT, Evaluation, MLLM, Debug, Other); '(untyped)'
--               for a trace without types (sacct)
--   'state'     value is the job's final state in the trace (COMPLETED,
--               FAILED, CANCELLED, TIMEOUT, …)
-- In both, '(not in trace)' is the jobs the telemetry saw but no imported
-- trace lists.
--
--   jobs        distinct jobs in the group
--   gpu_time_s  GPU seconds (divide by 3600 for GPU hours)
--   share       the group's part of all job GPU time (0 to 1); each grouping
--               adds up to 1

WITH job_time AS (
    SELECT job_id, sum(interval_us) AS gpu_time_us
    FROM gpu
    JOIN sample_interval USING (node)
    WHERE job_id IS NOT NULL
    GROUP BY job_id
),
labelled AS (
    SELECT job_id,
           gpu_time_us,
           CASE WHEN t.job_id IS NULL THEN '(not in trace)'
                ELSE coalesce(t.job_type, '(untyped)') END AS job_type,
           CASE WHEN t.job_id IS NULL THEN '(not in trace)'
                ELSE coalesce(t.state, '(unknown)') END AS state
    FROM job_time
    LEFT JOIN scheduler_job_latest t USING (job_id)
),
grouped AS (
    SELECT 'job_type' AS dimension, job_type AS value, count(*) AS jobs, sum(gpu_time_us) AS gpu_time_us
    FROM labelled GROUP BY job_type
    UNION ALL
    SELECT 'state', state, count(*), sum(gpu_time_us)
    FROM labelled GROUP BY state
)
SELECT dimension,
       value,
       jobs,
       gpu_time_us / 1e6 AS gpu_time_s,
       round(gpu_time_us / sum(gpu_time_us) OVER (PARTITION BY dimension), 4) AS share
FROM grouped
ORDER BY dimension, gpu_time_us DESC, value;
