-- Which jobs ran on a GPU that threw an XID error, overheated or hit its power
-- limit while they ran?
--
--   scripts/duckdb -c ".read schemas/sql/views.sql" -c ".read schemas/sql/jobs_with_gpu_events.sql"
--
-- Every event row (kinds: xid, gpu_lost, thermal_throttle, power_throttle; see
-- README.md, `event`) goes to the job that held its GPU at that moment (view
-- event_attributed: the event's own job_id, else the job of the GPU's last
-- gpu row before it, which is what attributes a GPU that fell off the bus).
-- Events on an idle GPU, or on one shared by several jobs, have no job and
-- are not listed. A node that fell silent under a job (node_silent, and
-- node_back when it returned) is listed with a null gpu: the whole node.
--
-- One row per job, GPU and kind of event (kind and code):
--   job_id, job_type, state, user   the job, with the imported trace's type,
--                                   final state and user (null when no trace
--                                   lists it; view scheduler_job_latest)
--   node, gpu                       where (gpu null for node events)
--   kind, code                      the XID for kind 'xid'; the clock event
--                                   reasons bitmask for throttling (32 SW
--                                   thermal, 64 HW thermal, 4 SW power cap,
--                                   128 HW power brake …); milliseconds of
--                                   silence for node_silent and node_back
--   events                          how many such events
--   first_ts, last_ts               the first and the last of them
--
-- Reading it: a FAILED job with an XID on one of its GPUs most likely died of
-- the hardware, not the code; repeated throttling on one GPU of a many-GPU
-- job slows every other GPU of it at each synchronization.

WITH attributed AS (
    SELECT ts, node, gpu, kind, code, job_id FROM event_attributed WHERE job_id IS NOT NULL
)
SELECT job_id,
       t.job_type,
       t.state,
       t."user",
       node,
       gpu,
       kind,
       code,
       count(*) AS events,
       min(ts) AS first_ts,
       max(ts) AS last_ts
FROM attributed
LEFT JOIN scheduler_job_latest t USING (job_id)
GROUP BY ALL
ORDER BY job_id, node, gpu, kind, code;
