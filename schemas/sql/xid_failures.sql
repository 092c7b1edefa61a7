-- How do XID failures split by cause, and which jobs did each kind hit?
--
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c ".read schemas/sql/xid_failures.sql"
--
-- Every XID event (view xid_event: the job that held its GPU, the XID
-- catalogue's category) counted per category, then per job within it.
-- Categories: hardware (PCIe, fallen off the bus, engines), nvlink, memory
-- (ECC, row remapping, containment), driver (firmware, GSP, timeouts),
-- application (faults of the program itself), thermal_power, other, and
-- unknown for codes the catalogue lacks (NVML's 999).
--
-- One row per category and job, the category's total first:
--   category          as above
--   job_id            '(all)': every XID of the category, with or without a
--                     job; '(no job)': those on idle or shared GPUs
--   job_type, state   the imported trace's type and final state of the job
--                     (null when no trace lists it; view scheduler_job_latest)
--   events            XID events
--   gpus              distinct (node, GPU) pairs they came from
--   codes             the distinct XIDs, ascending
--
-- Reading it: application XIDs (13, 31, 43, 45) are the job's own fault and
-- leave the GPU healthy; hardware, memory and nvlink ones end the job and
-- often need a GPU reset or a reboot (xid_catalogue.reset) before the GPU can
-- be trusted again. A FAILED job with only hardware or memory XIDs most
-- likely died of the machine, not of its code.

WITH per_job AS (
    SELECT category, coalesce(job_id, '(no job)') AS job_id,
           count(*) AS events,
           count(DISTINCT (node, gpu)) AS gpus,
           list(DISTINCT code ORDER BY code) AS codes
    FROM xid_event
    GROUP BY ALL
),
per_category AS (
    SELECT category, '(all)' AS job_id,
           count(*) AS events,
           count(DISTINCT (node, gpu)) AS gpus,
           list(DISTINCT code ORDER BY code) AS codes
    FROM xid_event
    GROUP BY ALL
)
SELECT r.category, r.job_id, t.job_type, t.state, r.events, r.gpus, r.codes
FROM (FROM per_category UNION ALL FROM per_job) r
LEFT JOIN scheduler_job_latest t USING (job_id)
ORDER BY r.category, r.job_id = '(all)' DESC, r.job_id = '(no job)', r.job_id;
