-- gputel views: one view per table of a store, and the derived views the
-- characterization queries share. Read it into a DuckDB session, then query:
--
--   scripts/duckdb -c "SET VARIABLE store = '/var/lib/gputel/data'" \
--                  -c ".read schemas/sql/views.sql" \
--                  -c "FROM jobs_observed"
--
-- `store` is the store's directory (default: gputel-data, the collector's
-- default). The views take it from getvariable('store') when they are queried;
-- to switch a session to another store, set it and read views.sql again. For
-- an object store, set the URL DuckDB reads it by (S3: the httpfs extension
-- and a secret, then 's3://bucket/prefix'); the tests cover directories only.
--
-- Tables (columns: README.md, "Tables"; types: schemas/golden/*.schema), each
-- with the partition columns of its path appended:
--   gpu, node, ib, event, gpu_process, job, alert: `date` (DATE) and `hour` (INTEGER);
--   scheduler_job: `month` (VARCHAR, 'YYYY-MM' or 'unknown').
-- gpu and node must exist: a store without them is the wrong path, and the
-- error names the pattern that matched no file. The other tables are often
-- legitimately absent (no XID yet, no InfiniBand, no job trace imported, no
-- alert fired):
-- views.sql checks which of them have files when it is read, and a table
-- without any is an empty view with the table's columns, so every query runs.
-- Read views.sql again after a table appears for the first time.

SET VARIABLE store = coalesce(getvariable('store'), 'gputel-data');
-- The XID catalogue (schemas/xid/xids.csv), relative to the directory DuckDB
-- runs in: the repository root. From elsewhere, set xid_catalogue to its path
-- (an installed agent's copy is not needed: the file is all there is).
SET VARIABLE xid_catalogue = coalesce(getvariable('xid_catalogue'), 'schemas/xid/xids.csv');

-- Every file of a table, partition columns from the path.
CREATE OR REPLACE MACRO gputel_files(tbl) AS getvariable('store') || '/' || tbl || '/**/*.parquet';

-- union_by_name: files written before a column was added lack it, and
-- DuckDB would otherwise take the first file's columns for all of them.
-- hive_types: the partition columns' types are declared, not guessed;
-- guessed, `hour` is text when any hour read is zero-padded (hour=05) and a
-- number when all are 10 to 23, so a query's types would depend on the time
-- of day.
CREATE OR REPLACE MACRO gputel_scan(tbl) AS TABLE
    FROM read_parquet(gputel_files(tbl), hive_partitioning = true, union_by_name = true,
                      hive_types = {'date': DATE, 'hour': INTEGER});

-- Whether a table has any file. The views of the tables that may have none
-- choose, through query(), between their files and a zero-row SELECT with the
-- table's columns (read_parquet fails on a pattern that matches nothing, and
-- a table function's arguments cannot hold a subquery, hence the variables).
CREATE OR REPLACE MACRO gputel_has_files(tbl) AS
    (SELECT count(*) > 0 FROM glob(gputel_files(tbl)));

SET VARIABLE gputel_has_alert = gputel_has_files('alert');
SET VARIABLE gputel_has_event = gputel_has_files('event');
SET VARIABLE gputel_has_gpu_process = gputel_has_files('gpu_process');
SET VARIABLE gputel_has_ib = gputel_has_files('ib');
SET VARIABLE gputel_has_job = gputel_has_files('job');
SET VARIABLE gputel_has_scheduler_job = gputel_has_files('scheduler_job');

CREATE OR REPLACE VIEW gpu AS FROM gputel_scan('gpu');

-- Rates and shares are not stored: the node and ib tables hold counters, and
-- these views add what is derived from them, by the rules of
-- schemas/src/derive.rs (which the fleet report uses):
-- - each counter is compared with its own last non-null reading on the same
--   node or port (a row whose file could not be read is skipped over);
-- - a lower reading than the last is a reset, and the new value is the
--   increase since it (as Prometheus' rate());
-- - a legacy 32-bit IB counter stopped at 2^32 - 1 has no rate;
-- - CPU shares need every group of jiffies to have grown or held.
-- A first reading has nothing to compare with: null. The window spans each
-- node's or port's whole history, so a filter on ts, date or hour is applied
-- after it (the first row of a time range still has its share or rate).

-- Per second from the previous reading (prev_v at prev_ts) to v at ts.
CREATE OR REPLACE MACRO gputel_per_s(v, prev_v, ts, prev_ts, saturated) AS
    CASE WHEN v IS DISTINCT FROM saturated AND ts > prev_ts
         THEN (CASE WHEN v >= prev_v THEN v - prev_v ELSE v END) / epoch(ts - prev_ts)
    END;

-- The stored columns, then cpu_{user,system,iowait,idle,steal}_pct: shares
-- of all CPUs' time since the node's previous row, in percent (they add up
-- to 100); user is user + nice, system is system + irq + softirq. Files
-- written before the counters (gputel before 2026-11-25) hold the first
-- four shares themselves, and those are read as they are.
-- memory_{total,available,used}_bytes: the stored KiB (as /proc/meminfo
-- counts) in bytes, used = total - available; files written before memory
-- in KiB hold the three in bytes, and those are read as they are.
CREATE OR REPLACE VIEW node AS
WITH stored AS (
    FROM gputel_scan('node')
    -- Every column the shares need, null where no file has it.
    UNION ALL BY NAME
    SELECT NULL::BIGINT AS cpu_user_jiffies, NULL::BIGINT AS cpu_system_jiffies,
           NULL::BIGINT AS cpu_iowait_jiffies, NULL::BIGINT AS cpu_idle_jiffies,
           NULL::BIGINT AS cpu_steal_jiffies,
           NULL::FLOAT AS cpu_user_pct, NULL::FLOAT AS cpu_system_pct,
           NULL::FLOAT AS cpu_iowait_pct, NULL::FLOAT AS cpu_idle_pct,
           NULL::BIGINT AS memory_total_kib, NULL::BIGINT AS memory_available_kib,
           NULL::BIGINT AS memory_total_bytes, NULL::BIGINT AS memory_used_bytes,
           NULL::BIGINT AS memory_available_bytes
    WHERE false
),
deltas AS (
    SELECT *,
        cpu_user_jiffies - lag(cpu_user_jiffies IGNORE NULLS) OVER w AS d_user,
        cpu_system_jiffies - lag(cpu_system_jiffies IGNORE NULLS) OVER w AS d_system,
        cpu_iowait_jiffies - lag(cpu_iowait_jiffies IGNORE NULLS) OVER w AS d_iowait,
        cpu_idle_jiffies - lag(cpu_idle_jiffies IGNORE NULLS) OVER w AS d_idle,
        cpu_steal_jiffies - lag(cpu_steal_jiffies IGNORE NULLS) OVER w AS d_steal
    FROM stored
    WINDOW w AS (PARTITION BY node ORDER BY ts)
),
totals AS (
    SELECT *,
        CASE WHEN least(d_user, d_system, d_iowait, d_idle, d_steal) >= 0
             THEN d_user + d_system + d_iowait + d_idle + d_steal END AS d_total
    FROM deltas
)
SELECT * EXCLUDE (d_user, d_system, d_iowait, d_idle, d_steal, d_total,
                  cpu_user_pct, cpu_system_pct, cpu_iowait_pct, cpu_idle_pct,
                  memory_total_bytes, memory_used_bytes, memory_available_bytes),
    coalesce(memory_total_kib * 1024, memory_total_bytes) AS memory_total_bytes,
    coalesce((memory_total_kib - memory_available_kib) * 1024, memory_used_bytes)
        AS memory_used_bytes,
    coalesce(memory_available_kib * 1024, memory_available_bytes) AS memory_available_bytes,
    coalesce(CASE WHEN d_total > 0 THEN 100.0 * d_user / d_total END, cpu_user_pct)
        AS cpu_user_pct,
    coalesce(CASE WHEN d_total > 0 THEN 100.0 * d_system / d_total END, cpu_system_pct)
        AS cpu_system_pct,
    coalesce(CASE WHEN d_total > 0 THEN 100.0 * d_iowait / d_total END, cpu_iowait_pct)
        AS cpu_iowait_pct,
    coalesce(CASE WHEN d_total > 0 THEN 100.0 * d_idle / d_total END, cpu_idle_pct)
        AS cpu_idle_pct,
    CASE WHEN d_total > 0 THEN 100.0 * d_steal / d_total END AS cpu_steal_pct
FROM totals;

-- Every event: a GPU's (xid, gpu_lost, thermal_throttle, power_throttle),
-- or a whole node's (node_silent, node_back: raised by the collector, with a
-- null gpu and uuid; README, "Node silence").
CREATE OR REPLACE VIEW event AS FROM query(CASE WHEN getvariable('gputel_has_event')
    THEN 'FROM gputel_scan(''event'')'
    ELSE 'SELECT NULL::TIMESTAMPTZ AS ts, NULL::VARCHAR AS node, NULL::INTEGER AS gpu,
                 NULL::VARCHAR AS uuid, NULL::VARCHAR AS kind, NULL::BIGINT AS code,
                 NULL::VARCHAR AS detail, NULL::VARCHAR AS job_id,
                 NULL::INTEGER AS gpu_instance_id, NULL::INTEGER AS compute_instance_id,
                 NULL::DATE AS date, NULL::INTEGER AS hour
          LIMIT 0'
    END);

-- Every firing and every resolution of an alert rule (README, "Alerting").
CREATE OR REPLACE VIEW alert AS FROM query(CASE WHEN getvariable('gputel_has_alert')
    THEN 'FROM gputel_scan(''alert'')'
    ELSE 'SELECT NULL::TIMESTAMPTZ AS ts, NULL::VARCHAR AS node, NULL::INTEGER AS gpu,
                 NULL::VARCHAR AS uuid, NULL::VARCHAR AS model, NULL::VARCHAR AS job_id,
                 NULL::VARCHAR AS rule, NULL::VARCHAR AS severity, NULL::VARCHAR AS status,
                 NULL::VARCHAR AS metric, NULL::DOUBLE AS value, NULL::DOUBLE AS threshold,
                 NULL::TIMESTAMPTZ AS starts_at, NULL::VARCHAR AS reason,
                 NULL::DATE AS date, NULL::INTEGER AS hour
          LIMIT 0'
    END);

CREATE OR REPLACE VIEW gpu_process AS FROM query(CASE WHEN getvariable('gputel_has_gpu_process')
    THEN 'FROM gputel_scan(''gpu_process'')'
    ELSE 'SELECT NULL::TIMESTAMPTZ AS ts, NULL::VARCHAR AS node, NULL::INTEGER AS gpu,
                 NULL::VARCHAR AS uuid, NULL::INTEGER AS pid, NULL::BIGINT AS used_memory_bytes,
                 NULL::VARCHAR AS command, NULL::VARCHAR AS job_id, NULL::VARCHAR AS pod_uid,
                 NULL::INTEGER AS gpu_instance_id, NULL::INTEGER AS compute_instance_id,
                 NULL::DATE AS date, NULL::INTEGER AS hour
          LIMIT 0'
    END);

-- The stored columns, then {xmit,rcv}_{bytes,packets}_per_s: each data and
-- packet counter's rate since the port's previous reading of it. Files
-- written before 2026-11-25 hold these rates themselves, and those are read
-- as they are.
CREATE OR REPLACE VIEW ib AS
WITH stored AS (
    FROM query(CASE WHEN getvariable('gputel_has_ib')
        THEN 'FROM gputel_scan(''ib'')'
        ELSE 'SELECT NULL::TIMESTAMPTZ AS ts, NULL::VARCHAR AS node, NULL::VARCHAR AS device,
                     NULL::INTEGER AS port, NULL::VARCHAR AS state, NULL::VARCHAR AS phys_state,
                     NULL::VARCHAR AS link_layer, NULL::DOUBLE AS rate_gbps,
                     NULL::BIGINT AS xmit_bytes, NULL::BIGINT AS rcv_bytes,
                     NULL::BIGINT AS xmit_packets, NULL::BIGINT AS rcv_packets,
                     NULL::BIGINT AS unicast_xmit_packets, NULL::BIGINT AS unicast_rcv_packets,
                     NULL::BIGINT AS multicast_xmit_packets, NULL::BIGINT AS multicast_rcv_packets,
                     NULL::BIGINT AS symbol_error, NULL::BIGINT AS link_downed,
                     NULL::BIGINT AS link_error_recovery, NULL::BIGINT AS port_rcv_errors,
                     NULL::BIGINT AS port_xmit_discards, NULL::BIGINT AS port_xmit_wait,
                     NULL::BIGINT AS port_rcv_discards, NULL::BIGINT AS port_rcv_constraint_errors,
                     NULL::BIGINT AS port_xmit_constraint_errors,
                     NULL::BIGINT AS port_rcv_remote_physical_errors,
                     NULL::BIGINT AS port_rcv_switch_relay_errors,
                     NULL::BIGINT AS local_link_integrity_errors,
                     NULL::BIGINT AS excessive_buffer_overrun_errors, NULL::BIGINT AS vl15_dropped,
                     NULL::BIGINT AS hw_out_of_buffer, NULL::BIGINT AS hw_out_of_sequence,
                     NULL::BIGINT AS hw_packet_seq_err, NULL::BIGINT AS hw_local_ack_timeout_err,
                     NULL::BIGINT AS hw_rnr_nak_retry_err, NULL::BIGINT AS hw_implied_nak_seq_err,
                     NULL::VARCHAR AS board_id, NULL::VARCHAR AS fw_ver, NULL::VARCHAR AS hca_type,
                     NULL::VARCHAR AS node_guid,
                     NULL::DATE AS date, NULL::INTEGER AS hour
              LIMIT 0'
        END)
    -- Every column the rates need, null where no file has it.
    UNION ALL BY NAME
    SELECT NULL::BIGINT AS xmit_bytes, NULL::BIGINT AS rcv_bytes,
           NULL::BIGINT AS xmit_packets, NULL::BIGINT AS rcv_packets,
           NULL::DOUBLE AS xmit_bytes_per_s, NULL::DOUBLE AS rcv_bytes_per_s,
           NULL::DOUBLE AS xmit_packets_per_s, NULL::DOUBLE AS rcv_packets_per_s
    WHERE false
)
SELECT * EXCLUDE (xmit_bytes_per_s, rcv_bytes_per_s, xmit_packets_per_s, rcv_packets_per_s),
    coalesce(gputel_per_s(xmit_bytes, lag(xmit_bytes IGNORE NULLS) OVER w, ts,
                          lag(CASE WHEN xmit_bytes IS NOT NULL THEN ts END IGNORE NULLS) OVER w,
                          4 * 4294967295), xmit_bytes_per_s) AS xmit_bytes_per_s,
    coalesce(gputel_per_s(rcv_bytes, lag(rcv_bytes IGNORE NULLS) OVER w, ts,
                          lag(CASE WHEN rcv_bytes IS NOT NULL THEN ts END IGNORE NULLS) OVER w,
                          4 * 4294967295), rcv_bytes_per_s) AS rcv_bytes_per_s,
    coalesce(gputel_per_s(xmit_packets, lag(xmit_packets IGNORE NULLS) OVER w, ts,
                          lag(CASE WHEN xmit_packets IS NOT NULL THEN ts END IGNORE NULLS) OVER w,
                          4294967295), xmit_packets_per_s) AS xmit_packets_per_s,
    coalesce(gputel_per_s(rcv_packets, lag(rcv_packets IGNORE NULLS) OVER w, ts,
                          lag(CASE WHEN rcv_packets IS NOT NULL THEN ts END IGNORE NULLS) OVER w,
                          4294967295), rcv_packets_per_s) AS rcv_packets_per_s
FROM stored
WINDOW w AS (PARTITION BY node, device, port ORDER BY ts);

-- Every event with the job that held its GPU: the event's own job_id (the
-- job on the GPU at the tick that recorded it), else the job of the GPU's
-- last gpu row at or before the event (an ASOF join on node, GPU and time).
-- The second is what attributes a GPU that fell off the bus: it has no gpu
-- row at the tick that records its XID 79 and gpu_lost event, so those
-- events carry no job_id, and the last job seen on it is the job that lost
-- it. Events on an idle GPU, or on one shared by several jobs, keep a null
-- job_id.
CREATE OR REPLACE VIEW event_attributed AS
WITH unattributed AS (
    SELECT * FROM event WHERE job_id IS NULL
),
last_row AS (
    SELECT node, gpu, ts, job_id
    FROM gpu
    SEMI JOIN (SELECT DISTINCT node, gpu FROM unattributed) USING (node, gpu)
)
SELECT * FROM event WHERE job_id IS NOT NULL
UNION ALL BY NAME
SELECT e.* REPLACE (r.job_id AS job_id)
FROM unattributed e
ASOF LEFT JOIN last_row r ON e.node = r.node AND e.gpu = r.gpu AND e.ts >= r.ts;

-- The XID catalogue, one row per documented code (columns: the file's
-- header comment): code, mnemonic, name, category (hardware, nvlink, memory,
-- driver, application, thermal_power, other), ampere_plus, cause, action
-- (NVIDIA's immediate resolution bucket), reset (none, gpu, node,
-- conditional, unknown).
CREATE OR REPLACE VIEW xid_catalogue AS
FROM read_csv(getvariable('xid_catalogue'), auto_detect = false, header = true, comment = '#',
              delim = ',', quote = '"', escape = '"',
              columns = {'code': 'BIGINT', 'mnemonic': 'VARCHAR', 'name': 'VARCHAR',
                         'category': 'VARCHAR', 'ampere_plus': 'BOOLEAN', 'cause': 'VARCHAR',
                         'action': 'VARCHAR', 'reset': 'VARCHAR'});

-- Every XID event with its job (as event_attributed) and the catalogue's
-- name, category and reset; a code the catalogue lacks (NVML's 999, "unknown
-- XID", among them) has category 'unknown' and null name and reset.
CREATE OR REPLACE VIEW xid_event AS
SELECT e.ts, e.node, e.gpu, e.uuid, e.code, e.job_id,
       c.name, coalesce(c.category, 'unknown') AS category, c.reset,
       e.date, e.hour
FROM event_attributed e
LEFT JOIN xid_catalogue c USING (code)
WHERE e.kind = 'xid';

-- What the collector observed of each job on each GPU: one row per
-- (job, node, GPU) per written file, so a job has many rows.
CREATE OR REPLACE VIEW job AS FROM query(CASE WHEN getvariable('gputel_has_job')
    THEN 'FROM gputel_scan(''job'')'
    ELSE 'SELECT NULL::VARCHAR AS job_id, NULL::VARCHAR AS node, NULL::INTEGER AS gpu,
                 NULL::TIMESTAMPTZ AS ts, NULL::TIMESTAMPTZ AS last_ts, NULL::BIGINT AS samples,
                 NULL::DATE AS date, NULL::INTEGER AS hour
          LIMIT 0'
    END);

-- The columns of scheduler_job, typed, without rows: the view of a store
-- without any trace, and the frame every trace file is read into, so that
-- files written before a column existed (Kalos' fail_time, stop_time,
-- mem_per_pod_gb, shared_mem_per_pod) read with nulls in it, and every
-- store has every column in this order.
CREATE OR REPLACE MACRO gputel_scheduler_job_columns() AS TABLE
    SELECT NULL::VARCHAR AS job_id, NULL::VARCHAR AS source, NULL::VARCHAR AS "user",
           NULL::VARCHAR AS queue, NULL::VARCHAR AS state, NULL::VARCHAR AS job_type,
           NULL::TIMESTAMPTZ AS submit_time, NULL::TIMESTAMPTZ AS start_time,
           NULL::TIMESTAMPTZ AS end_time, NULL::BIGINT AS queue_s,
           NULL::BIGINT AS duration_s, NULL::INTEGER AS nodes, NULL::INTEGER AS gpus,
           NULL::INTEGER AS cpus, NULL::VARCHAR AS node_list, NULL::BIGINT AS gpu_time_s,
           NULL::TIMESTAMPTZ AS fail_time, NULL::TIMESTAMPTZ AS stop_time,
           NULL::DOUBLE AS mem_per_pod_gb, NULL::DOUBLE AS shared_mem_per_pod,
           NULL::TIMESTAMPTZ AS imported_at, NULL::VARCHAR AS filename,
           NULL::VARCHAR AS month
    LIMIT 0;

-- The scheduler's job trace (`gputel-collector import-jobs`), one row per
-- (source, job_id): importing overlapping dumps repeats jobs, and the latest
-- import of a job is its final word (a job RUNNING in one dump is COMPLETED in
-- the next). Imports at the same instant are ordered by file name.
CREATE OR REPLACE VIEW scheduler_job AS
SELECT * EXCLUDE (filename)
FROM query(CASE WHEN getvariable('gputel_has_scheduler_job')
    THEN 'FROM gputel_scheduler_job_columns()
          UNION ALL BY NAME
          FROM read_parquet(gputel_files(''scheduler_job''), hive_partitioning = true,
                            union_by_name = true, hive_types = {''month'': VARCHAR},
                            filename = true)'
    ELSE 'FROM gputel_scheduler_job_columns()'
    END)
QUALIFY row_number() OVER (PARTITION BY source, job_id
                           ORDER BY imported_at DESC, filename DESC) = 1;

-- One row per job_id, for joining telemetry to the trace: where two sources
-- (sacct and an Acme CSV) describe the same job id, the later import wins.
CREATE OR REPLACE VIEW scheduler_job_latest AS
FROM scheduler_job
QUALIFY row_number() OVER (PARTITION BY job_id ORDER BY imported_at DESC, source) = 1;

-- Each job as the telemetry saw it, over all files: when it was first and
-- last sampled, on which nodes, on how many GPUs, in how many GPU samples.
-- GPUs shared by several jobs carry no job_id and count for none of them.
CREATE OR REPLACE VIEW jobs_observed AS
SELECT job_id,
       min(ts) AS first_seen,
       max(last_ts) AS last_seen,
       list(DISTINCT node ORDER BY node) AS nodes,
       count(DISTINCT (node, gpu)) AS gpus,
       sum(samples)::BIGINT AS samples
FROM job
GROUP BY job_id;

-- Each node's sampling interval in microseconds: the most common gap between
-- its consecutive node rows (the agent's --interval; ticks skipped by a late
-- wake-up or an agent restart do not move the most common gap). A node with
-- a single row has none. Used to turn sample counts into GPU time.
CREATE OR REPLACE VIEW sample_interval AS
SELECT node, mode(gap_us) AS interval_us
FROM (SELECT node, epoch_us(ts) - lag(epoch_us(ts)) OVER (PARTITION BY node ORDER BY ts) AS gap_us
      FROM node)
WHERE gap_us > 0
GROUP BY node;

-- Time weighting. A sample stands for the time until its device's next
-- sample, so that a fleet mixing 1 s and 15 s agents weighs each GPU by the
-- time it was observed, not by how often it was sampled. The rule is the
-- per-job report's (`gputel-collector job`): each sample's weight is the gap
-- to the same device's next sample, at most 3 × the device's median gap (a
-- longer gap is an agent restart or an outage, not 10 minutes of the last
-- reading); the device's last sample weighs its median gap. The median is
-- the lower middle of an even count. A device sampled once weighs its node's
-- sampling interval (sample_interval), or nothing when that is unknown.
-- `weight_s` is that weight in seconds: sum(weight_s) is observed time, and
-- sum(x * weight_s) / sum(weight_s) (over rows where x is not null) is x's
-- time-weighted mean.
CREATE OR REPLACE MACRO gputel_weight_s(next_gap_us, median_gap_us, fallback_us) AS
    CASE WHEN next_gap_us IS NULL THEN coalesce(median_gap_us, fallback_us)
         ELSE least(next_gap_us, 3 * median_gap_us)
    END / 1e6;

-- Every gpu row with its weight_s; a device is (node, gpu, MIG instance).
CREATE OR REPLACE VIEW gpu_weighted AS
WITH gaps AS (
    SELECT *,
           epoch_us(lead(ts) OVER device) - epoch_us(ts) AS next_gap_us
    FROM gpu
    WINDOW device AS (PARTITION BY node, gpu, gpu_instance_id, compute_instance_id ORDER BY ts)
),
medians AS (
    SELECT *,
           quantile_disc(next_gap_us, 0.5)
               OVER (PARTITION BY node, gpu, gpu_instance_id, compute_instance_id)
               AS median_gap_us
    FROM gaps
)
SELECT m.* EXCLUDE (next_gap_us, median_gap_us),
       gputel_weight_s(m.next_gap_us, m.median_gap_us, i.interval_us) AS weight_s
FROM medians m
LEFT JOIN sample_interval i USING (node);

-- Every node row with its weight_s; a device is the node.
CREATE OR REPLACE VIEW node_weighted AS
WITH gaps AS (
    SELECT *,
           epoch_us(lead(ts) OVER (PARTITION BY node ORDER BY ts)) - epoch_us(ts) AS next_gap_us
    FROM node
)
SELECT * EXCLUDE (next_gap_us),
       gputel_weight_s(next_gap_us,
                       quantile_disc(next_gap_us, 0.5) OVER (PARTITION BY node),
                       NULL) AS weight_s
FROM gaps;

-- Every ib row with its weight_s; a device is (node, HCA, port).
CREATE OR REPLACE VIEW ib_weighted AS
WITH gaps AS (
    SELECT *,
           epoch_us(lead(ts) OVER device) - epoch_us(ts) AS next_gap_us
    FROM ib
    WINDOW device AS (PARTITION BY node, device, port ORDER BY ts)
),
medians AS (
    SELECT *,
           quantile_disc(next_gap_us, 0.5) OVER (PARTITION BY node, device, port) AS median_gap_us
    FROM gaps
)
SELECT m.* EXCLUDE (next_gap_us, median_gap_us),
       gputel_weight_s(m.next_gap_us, m.median_gap_us, i.interval_us) AS weight_s
FROM medians m
LEFT JOIN sample_interval i USING (node);
