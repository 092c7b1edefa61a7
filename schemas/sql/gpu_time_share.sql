-- Which kinds of jobs use the GPU time, and how much of it goes to jobs that
-- fail or are cancelled? (The Acme study, NSDI'24: the GPU-time share per
-- job type and per final state.) Two views, told apart by `scope`: the whole
-- imported trace, as the study computes it, and the jobs the telemetry saw,
-- measured.
--
--   gputel-collector import-jobs --format acme trace_seren.csv --store gputel-data  # or --format sacct
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c ".read schemas/sql/gpu_time_share.sql"
--
--   scope       VARCHAR. 'trace': every GPU job of the imported trace
--               (scheduler_job_latest, the latest import of each job), with
--               or without telemetry, as the study's figures: a GPU job asks
--               for one GPU or more (gpus > 0; CPU-only jobs and jobs with
--               no GPU count are left out). A job's GPU time is the trace's
--               gpu_time_s, else gpus × duration_s, else 0 (a job still
--               running or never started).
--               'observed': the jobs the telemetry saw on a GPU (gpu rows
--               with a job_id; a GPU shared by several jobs, or a pod
--               without a job id, counts for no job), GPU time measured and
--               time-weighted: the sum of gpu_weighted's weight_s over the
--               job's rows (views.sql, "Time weighting"), so a GPU counts
--               for the time it was observed however often it was sampled.
--               Its type and state come from the trace (joined on job_id);
--               '(not in trace)' is a job no imported trace lists.
--   dimension   VARCHAR. 'job_type': value is the trace's job type exactly as the
--               trace writes it (AcmeTrace: Pretrain, SFT, Eval, MLLM,
--               Debug, Other; the paper's text says "Evaluation", the trace
--               and its notebook say Eval); '(untyped)' for a job the trace
--               lists without a type (sacct has none).
--               'state': value is the job's final state folded as the study
--               folds it (AcmeTrace README, note 1: "TIMEOUT and NODE_FAIL
--               are very rare in our traces, and are regarded as failed in
--               our analysis"): TIMEOUT and NODE_FAIL count as FAILED, so
--               the study's three are COMPLETED, CANCELLED and FAILED; any
--               other state (RUNNING, PENDING, PREEMPTED, OUT_OF_MEMORY, …)
--               is kept as written, '(unknown)' without one.
--               failure_share.sql folds them the same way.
--   value       VARCHAR, the job type or folded state
--   jobs        BIGINT, jobs in the group (each job once per dimension)
--   gpu_time_s  DOUBLE, GPU seconds in the group (divide by 3600 for GPU
--               hours); 'observed' to the millisecond
--   share       DOUBLE, the group's part of its scope's GPU time (0 to 1,
--               4 decimals); within a scope, each dimension adds up to 1.
--               Null when the scope has no GPU time at all.
--
-- Rows: 'observed' then 'trace'; within each, 'job_type' then 'state', the
-- largest GPU time first. A store without telemetry of any traced job has
-- only 'trace' rows; one without a trace has only 'observed' rows, all
-- '(not in trace)'.

WITH observed_jobs AS (
    SELECT job_id, sum(weight_s) AS gpu_s
    FROM gpu_weighted
    WHERE job_id IS NOT NULL
    GROUP BY job_id
),
observed AS (
    SELECT 'observed' AS scope,
           o.gpu_s,
           CASE WHEN t.job_id IS NULL THEN '(not in trace)'
                ELSE coalesce(t.job_type, '(untyped)') END AS job_type,
           CASE WHEN t.job_id IS NULL THEN '(not in trace)'
                WHEN t.state IN ('TIMEOUT', 'NODE_FAIL') THEN 'FAILED'
                ELSE coalesce(t.state, '(unknown)') END AS state
    FROM observed_jobs o
    LEFT JOIN scheduler_job_latest t USING (job_id)
),
traced AS (
    SELECT 'trace' AS scope,
           coalesce(gpu_time_s, gpus * duration_s, 0)::DOUBLE AS gpu_s,
           coalesce(job_type, '(untyped)') AS job_type,
           CASE WHEN state IN ('TIMEOUT', 'NODE_FAIL') THEN 'FAILED'
                ELSE coalesce(state, '(unknown)') END AS state
    FROM scheduler_job_latest
    WHERE gpus > 0
),
labelled AS (
    FROM observed
    UNION ALL
    FROM traced
),
grouped AS (
    SELECT scope, 'job_type' AS dimension, job_type AS value, count(*) AS jobs, sum(gpu_s) AS gpu_s
    FROM labelled GROUP BY scope, job_type
    UNION ALL
    SELECT scope, 'state', state, count(*), sum(gpu_s)
    FROM labelled GROUP BY scope, state
)
SELECT scope,
       dimension,
       value,
       jobs,
       round(gpu_s, 3) AS gpu_time_s,
       round(gpu_s / nullif(sum(gpu_s) OVER (PARTITION BY scope, dimension), 0), 4) AS share
FROM grouped
ORDER BY scope, dimension, gpu_s DESC, value;
