-- Which jobs ran on a GPU that threw an XID error, overheated or hit its
-- power limit while they ran? Spark SQL version of
-- schemas/sql/jobs_with_gpu_events.sql (attribution, columns and reading:
-- there); the same rows on the same store.
--
--   scripts/spark --store gputel-data jobs_with_gpu_events

WITH attributed AS (
    SELECT ts, node, gpu, kind, code, job_id FROM event_attributed WHERE job_id IS NOT NULL
)
SELECT a.job_id,
       t.job_type,
       t.state,
       t.`user`,
       a.node,
       a.gpu,
       a.kind,
       a.code,
       count(*) AS events,
       min(a.ts) AS first_ts,
       max(a.ts) AS last_ts
FROM attributed a
LEFT JOIN scheduler_job_latest t ON a.job_id = t.job_id
GROUP BY ALL
-- NULLS LAST: DuckDB's order (node events have a null gpu).
ORDER BY job_id NULLS LAST, node NULLS LAST, gpu NULLS LAST, kind NULLS LAST, code NULLS LAST;
