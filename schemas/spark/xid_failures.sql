-- How do XID failures split by cause, and which jobs did each kind hit? Spark
-- SQL version of schemas/sql/xid_failures.sql (columns and reading: there);
-- the same rows on the same store.
--
--   scripts/spark --store gputel-data xid_failures

WITH per_job AS (
    SELECT category, coalesce(job_id, '(no job)') AS job_id,
           count(*) AS events,
           count(DISTINCT struct(node, gpu)) AS gpus,
           sort_array(collect_set(code)) AS codes
    FROM xid_event
    GROUP BY ALL
),
per_category AS (
    SELECT category, '(all)' AS job_id,
           count(*) AS events,
           count(DISTINCT struct(node, gpu)) AS gpus,
           sort_array(collect_set(code)) AS codes
    FROM xid_event
    GROUP BY ALL
)
SELECT r.category, r.job_id, t.job_type, t.state, r.events, r.gpus, r.codes
FROM (SELECT * FROM per_category UNION ALL SELECT * FROM per_job) r
LEFT JOIN scheduler_job_latest t ON r.job_id = t.job_id
ORDER BY r.category, r.job_id = '(all)' DESC, r.job_id = '(no job)', r.job_id;
