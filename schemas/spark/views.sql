-- gputel views for Apache Spark SQL: the same views as schemas/sql/views.sql
-- (DuckDB), over the same store as the collector wrote it, local or on S3.
-- scripts/spark reads this file and then a query of schemas/spark/:
--
--   scripts/spark --store /var/lib/gputel/data per_job_utilization
--   scripts/spark --store s3a://telemetry/cluster-a --s3-endpoint http://10.0.0.5:9000 fleet_cdf
--
-- Statements end with a semicolon at the end of a line; ${store} (the store's
-- URL: a directory, file:/…, s3a://bucket/prefix) and ${xid_catalogue} (the
-- path of schemas/xid/xids.csv) are Spark SQL variables (SET store = …).
--
-- Tables: each is a temporary view over its directory with the table's
-- columns declared (schemas/golden/*.schema; tests/tests/spark.rs checks that
-- they match), so that
-- - files written before a column existed read it as null (DuckDB's
--   union_by_name), and columns of older versions (node's cpu_*_pct and
--   memory_*_bytes, ib's *_per_s) are declared too;
-- - the partition columns taken from the path have fixed types: `date` DATE
--   and `hour` INT (DuckDB's hive_types), scheduler_job's `month` STRING;
-- - basePath makes them partition columns, so a filter on them prunes
--   directories (PartitionFilters in EXPLAIN), and pathGlobFilter skips the
--   compaction's `.compacted` markers beside the Parquet files.
-- A table directory without any Parquet file (no XID yet, no InfiniBand, no
-- job trace imported) cannot be read by Spark: scripts/spark then makes that
-- view empty with the declared columns. gpu and node must have files.
--
-- Differences from DuckDB, none of which changes a result:
-- - Spark SQL has no macros, ASOF join, QUALIFY or SELECT * EXCLUDE: the
--   same rules are written out (event_attributed takes the last gpu row at or
--   before each event with a window over events and gpu rows together).
-- - The median gap of a device (DuckDB: quantile_disc(x, 0.5)) is the lower
--   middle of the sorted non-null gaps, written out.
-- - The most common gap of a node (DuckDB: mode()) takes the smallest gap
--   among equally common ones; DuckDB's mode() takes whichever it met first.
-- - Timestamps are TIMESTAMP (instants; the session time zone is UTC).

-- The stored tables.
CREATE OR REPLACE TEMPORARY VIEW gpu (
    ts TIMESTAMP, node STRING, gpu INT, uuid STRING, model STRING, pci_bus_id STRING,
    temperature_c INT, memory_temperature_c INT, power_mw BIGINT, energy_mj BIGINT,
    sm_clock_mhz INT, memory_clock_mhz INT, gpu_util_pct INT, memory_copy_util_pct INT,
    enc_util_pct INT, dec_util_pct INT, fb_used_bytes BIGINT, fb_free_bytes BIGINT,
    fb_total_bytes BIGINT, fb_reserved_bytes BIGINT, sm_active_pct FLOAT,
    sm_occupancy_pct FLOAT, tensor_active_pct FLOAT, dram_active_pct FLOAT,
    gr_engine_active_pct FLOAT, profiling_source STRING, power_limit_mw BIGINT,
    power_avg_mw BIGINT, clock_event_reasons BIGINT, throttle_gpu_idle BOOLEAN,
    throttle_sw_power_cap BOOLEAN, throttle_hw_slowdown BOOLEAN,
    throttle_sync_boost BOOLEAN, throttle_sw_thermal BOOLEAN, throttle_hw_thermal BOOLEAN,
    throttle_hw_power_brake BOOLEAN, ecc_corrected_volatile BIGINT,
    ecc_uncorrected_volatile BIGINT, ecc_corrected_aggregate BIGINT,
    ecc_uncorrected_aggregate BIGINT, retired_pages_sbe BIGINT, retired_pages_dbe BIGINT,
    retired_pages_pending BOOLEAN, remapped_rows_corrected INT,
    remapped_rows_uncorrected INT, remapped_rows_pending BOOLEAN,
    remapped_rows_failure BOOLEAN, pcie_replay_count BIGINT, pcie_tx_bytes_per_s BIGINT,
    pcie_rx_bytes_per_s BIGINT, nvlink_tx_bytes_per_s BIGINT, nvlink_rx_bytes_per_s BIGINT,
    xid_count INT, job_id STRING, pod_uid STRING, job_count INT, gpu_instance_id INT,
    compute_instance_id INT, mig_profile STRING, mig_uuid STRING, mig_mode BOOLEAN,
    pcie_link_gen INT, pcie_link_gen_max INT, pcie_link_width INT, pcie_link_width_max INT,
    fan_speed_pct INT, performance_state INT, pod_namespace STRING, pod_name STRING,
    container STRING, pod_labels MAP<STRING, STRING>,
    date DATE, hour INT
) USING parquet
OPTIONS (path '${store}/gpu', basePath '${store}/gpu', pathGlobFilter '*.parquet');

-- The node table as stored, with the columns of files written before the
-- CPU counters and memory in KiB.
CREATE OR REPLACE TEMPORARY VIEW node_stored (
    ts TIMESTAMP, node STRING, cpu_count INT, cpu_user_jiffies BIGINT,
    cpu_system_jiffies BIGINT, cpu_iowait_jiffies BIGINT, cpu_idle_jiffies BIGINT,
    cpu_steal_jiffies BIGINT, memory_total_kib BIGINT, memory_available_kib BIGINT,
    load1 FLOAT, load5 FLOAT, load15 FLOAT, jobs ARRAY<STRING>,
    cpu_package_energy_uj BIGINT, dram_energy_uj BIGINT, cpu_package_power_w DOUBLE,
    dram_power_w DOUBLE,
    cpu_user_pct FLOAT, cpu_system_pct FLOAT, cpu_iowait_pct FLOAT, cpu_idle_pct FLOAT,
    memory_total_bytes BIGINT, memory_used_bytes BIGINT, memory_available_bytes BIGINT,
    date DATE, hour INT
) USING parquet
OPTIONS (path '${store}/node', basePath '${store}/node', pathGlobFilter '*.parquet');

-- The ib table as stored, with the rates of files written before 2026-11-25.
CREATE OR REPLACE TEMPORARY VIEW ib_stored (
    ts TIMESTAMP, node STRING, device STRING, port INT, state STRING, phys_state STRING,
    link_layer STRING, rate_gbps DOUBLE, xmit_bytes BIGINT, rcv_bytes BIGINT,
    xmit_packets BIGINT, rcv_packets BIGINT, unicast_xmit_packets BIGINT,
    unicast_rcv_packets BIGINT, multicast_xmit_packets BIGINT,
    multicast_rcv_packets BIGINT, symbol_error BIGINT, link_downed BIGINT,
    link_error_recovery BIGINT, port_rcv_errors BIGINT, port_xmit_discards BIGINT,
    port_xmit_wait BIGINT, port_rcv_discards BIGINT, port_rcv_constraint_errors BIGINT,
    port_xmit_constraint_errors BIGINT, port_rcv_remote_physical_errors BIGINT,
    port_rcv_switch_relay_errors BIGINT, local_link_integrity_errors BIGINT,
    excessive_buffer_overrun_errors BIGINT, vl15_dropped BIGINT, hw_out_of_buffer BIGINT,
    hw_out_of_sequence BIGINT, hw_packet_seq_err BIGINT, hw_local_ack_timeout_err BIGINT,
    hw_rnr_nak_retry_err BIGINT, hw_implied_nak_seq_err BIGINT, board_id STRING,
    fw_ver STRING, hca_type STRING, node_guid STRING,
    xmit_bytes_per_s DOUBLE, rcv_bytes_per_s DOUBLE, xmit_packets_per_s DOUBLE,
    rcv_packets_per_s DOUBLE,
    date DATE, hour INT
) USING parquet
OPTIONS (path '${store}/ib', basePath '${store}/ib', pathGlobFilter '*.parquet');

-- Every event: a GPU's (xid, gpu_lost, thermal_throttle, power_throttle),
-- or a whole node's (node_silent, node_back, with a null gpu and uuid).
CREATE OR REPLACE TEMPORARY VIEW event (
    ts TIMESTAMP, node STRING, gpu INT, uuid STRING, kind STRING, code BIGINT,
    detail STRING, job_id STRING, gpu_instance_id INT, compute_instance_id INT,
    date DATE, hour INT
) USING parquet
OPTIONS (path '${store}/event', basePath '${store}/event', pathGlobFilter '*.parquet');

-- Every firing and every resolution of an alert rule.
CREATE OR REPLACE TEMPORARY VIEW alert (
    ts TIMESTAMP, node STRING, gpu INT, uuid STRING, model STRING, job_id STRING,
    rule STRING, severity STRING, status STRING, metric STRING, value DOUBLE,
    threshold DOUBLE, starts_at TIMESTAMP, reason STRING,
    date DATE, hour INT
) USING parquet
OPTIONS (path '${store}/alert', basePath '${store}/alert', pathGlobFilter '*.parquet');

CREATE OR REPLACE TEMPORARY VIEW gpu_process (
    ts TIMESTAMP, node STRING, gpu INT, uuid STRING, pid INT, used_memory_bytes BIGINT,
    command STRING, job_id STRING, pod_uid STRING, gpu_instance_id INT,
    compute_instance_id INT,
    date DATE, hour INT
) USING parquet
OPTIONS (path '${store}/gpu_process', basePath '${store}/gpu_process', pathGlobFilter '*.parquet');

-- What the collector observed of each job on each GPU: one row per
-- (job, node, GPU) per written file.
CREATE OR REPLACE TEMPORARY VIEW job (
    job_id STRING, node STRING, gpu INT, ts TIMESTAMP, last_ts TIMESTAMP, samples BIGINT,
    date DATE, hour INT
) USING parquet
OPTIONS (path '${store}/job', basePath '${store}/job', pathGlobFilter '*.parquet');

-- The imported scheduler traces as stored, every import of every job.
CREATE OR REPLACE TEMPORARY VIEW scheduler_job_stored (
    job_id STRING, source STRING, `user` STRING, queue STRING, state STRING,
    job_type STRING, submit_time TIMESTAMP, start_time TIMESTAMP, end_time TIMESTAMP,
    queue_s BIGINT, duration_s BIGINT, nodes INT, gpus INT, cpus INT, node_list STRING,
    gpu_time_s BIGINT, fail_time TIMESTAMP, stop_time TIMESTAMP, mem_per_pod_gb DOUBLE,
    shared_mem_per_pod DOUBLE, imported_at TIMESTAMP,
    month STRING
) USING parquet
OPTIONS (path '${store}/scheduler_job', basePath '${store}/scheduler_job', pathGlobFilter '*.parquet');

-- The XID catalogue (schemas/xid/xids.csv).
CREATE OR REPLACE TEMPORARY VIEW xid_catalogue (
    code BIGINT, mnemonic STRING, name STRING, category STRING, ampere_plus BOOLEAN,
    cause STRING, action STRING, reset STRING
) USING csv
OPTIONS (path '${xid_catalogue}', header 'true', comment '#', quote '"', escape '"');

-- The stored node columns, then memory_{total,used,available}_bytes and
-- cpu_{user,system,iowait,idle,steal}_pct, by the rules of views.sql: each
-- jiffies counter against its own last non-null reading on the node; shares
-- only when every group grew or held; older files' own shares and bytes
-- where there are no counters.
CREATE OR REPLACE TEMPORARY VIEW node AS
WITH deltas AS (
    SELECT *,
        cpu_user_jiffies - lag(cpu_user_jiffies) IGNORE NULLS OVER w AS d_user,
        cpu_system_jiffies - lag(cpu_system_jiffies) IGNORE NULLS OVER w AS d_system,
        cpu_iowait_jiffies - lag(cpu_iowait_jiffies) IGNORE NULLS OVER w AS d_iowait,
        cpu_idle_jiffies - lag(cpu_idle_jiffies) IGNORE NULLS OVER w AS d_idle,
        cpu_steal_jiffies - lag(cpu_steal_jiffies) IGNORE NULLS OVER w AS d_steal
    FROM node_stored
    WINDOW w AS (PARTITION BY node ORDER BY ts)
),
totals AS (
    SELECT *,
        CASE WHEN least(d_user, d_system, d_iowait, d_idle, d_steal) >= 0
             THEN d_user + d_system + d_iowait + d_idle + d_steal END AS d_total
    FROM deltas
)
SELECT ts, node, cpu_count, cpu_user_jiffies, cpu_system_jiffies, cpu_iowait_jiffies,
    cpu_idle_jiffies, cpu_steal_jiffies, memory_total_kib, memory_available_kib,
    load1, load5, load15, jobs, cpu_package_energy_uj, dram_energy_uj,
    cpu_package_power_w, dram_power_w, date, hour,
    coalesce(memory_total_kib * 1024, memory_total_bytes) AS memory_total_bytes,
    coalesce((memory_total_kib - memory_available_kib) * 1024, memory_used_bytes)
        AS memory_used_bytes,
    coalesce(memory_available_kib * 1024, memory_available_bytes) AS memory_available_bytes,
    coalesce(CASE WHEN d_total > 0 THEN 100D * d_user / d_total END, cpu_user_pct)
        AS cpu_user_pct,
    coalesce(CASE WHEN d_total > 0 THEN 100D * d_system / d_total END, cpu_system_pct)
        AS cpu_system_pct,
    coalesce(CASE WHEN d_total > 0 THEN 100D * d_iowait / d_total END, cpu_iowait_pct)
        AS cpu_iowait_pct,
    coalesce(CASE WHEN d_total > 0 THEN 100D * d_idle / d_total END, cpu_idle_pct)
        AS cpu_idle_pct,
    CASE WHEN d_total > 0 THEN 100D * d_steal / d_total END AS cpu_steal_pct
FROM totals;

-- The stored ib columns, then {xmit,rcv}_{bytes,packets}_per_s: each
-- counter's rate since the port's previous reading of it (a lower reading is
-- a reset: the new value is the increase; a 32-bit counter stopped at
-- 2^32 - 1 has no rate); older files' own rates where there are no counters.
CREATE OR REPLACE TEMPORARY VIEW ib AS
WITH previous AS (
    SELECT *,
        lag(xmit_bytes) IGNORE NULLS OVER w AS prev_xmit_bytes,
        lag(CASE WHEN xmit_bytes IS NOT NULL THEN ts END) IGNORE NULLS OVER w AS prev_xmit_bytes_ts,
        lag(rcv_bytes) IGNORE NULLS OVER w AS prev_rcv_bytes,
        lag(CASE WHEN rcv_bytes IS NOT NULL THEN ts END) IGNORE NULLS OVER w AS prev_rcv_bytes_ts,
        lag(xmit_packets) IGNORE NULLS OVER w AS prev_xmit_packets,
        lag(CASE WHEN xmit_packets IS NOT NULL THEN ts END) IGNORE NULLS OVER w AS prev_xmit_packets_ts,
        lag(rcv_packets) IGNORE NULLS OVER w AS prev_rcv_packets,
        lag(CASE WHEN rcv_packets IS NOT NULL THEN ts END) IGNORE NULLS OVER w AS prev_rcv_packets_ts
    FROM ib_stored
    WINDOW w AS (PARTITION BY node, device, port ORDER BY ts)
)
SELECT ts, node, device, port, state, phys_state, link_layer, rate_gbps,
    xmit_bytes, rcv_bytes, xmit_packets, rcv_packets, unicast_xmit_packets,
    unicast_rcv_packets, multicast_xmit_packets, multicast_rcv_packets, symbol_error,
    link_downed, link_error_recovery, port_rcv_errors, port_xmit_discards, port_xmit_wait,
    port_rcv_discards, port_rcv_constraint_errors, port_xmit_constraint_errors,
    port_rcv_remote_physical_errors, port_rcv_switch_relay_errors,
    local_link_integrity_errors, excessive_buffer_overrun_errors, vl15_dropped,
    hw_out_of_buffer, hw_out_of_sequence, hw_packet_seq_err, hw_local_ack_timeout_err,
    hw_rnr_nak_retry_err, hw_implied_nak_seq_err, board_id, fw_ver, hca_type, node_guid,
    date, hour,
    coalesce(CASE WHEN xmit_bytes IS DISTINCT FROM 4 * 4294967295 AND ts > prev_xmit_bytes_ts
                  THEN (CASE WHEN xmit_bytes >= prev_xmit_bytes THEN xmit_bytes - prev_xmit_bytes
                             ELSE xmit_bytes END)
                       / ((unix_micros(ts) - unix_micros(prev_xmit_bytes_ts)) / 1e6) END,
             xmit_bytes_per_s) AS xmit_bytes_per_s,
    coalesce(CASE WHEN rcv_bytes IS DISTINCT FROM 4 * 4294967295 AND ts > prev_rcv_bytes_ts
                  THEN (CASE WHEN rcv_bytes >= prev_rcv_bytes THEN rcv_bytes - prev_rcv_bytes
                             ELSE rcv_bytes END)
                       / ((unix_micros(ts) - unix_micros(prev_rcv_bytes_ts)) / 1e6) END,
             rcv_bytes_per_s) AS rcv_bytes_per_s,
    coalesce(CASE WHEN xmit_packets IS DISTINCT FROM 4294967295 AND ts > prev_xmit_packets_ts
                  THEN (CASE WHEN xmit_packets >= prev_xmit_packets
                             THEN xmit_packets - prev_xmit_packets ELSE xmit_packets END)
                       / ((unix_micros(ts) - unix_micros(prev_xmit_packets_ts)) / 1e6) END,
             xmit_packets_per_s) AS xmit_packets_per_s,
    coalesce(CASE WHEN rcv_packets IS DISTINCT FROM 4294967295 AND ts > prev_rcv_packets_ts
                  THEN (CASE WHEN rcv_packets >= prev_rcv_packets
                             THEN rcv_packets - prev_rcv_packets ELSE rcv_packets END)
                       / ((unix_micros(ts) - unix_micros(prev_rcv_packets_ts)) / 1e6) END,
             rcv_packets_per_s) AS rcv_packets_per_s
FROM previous;

-- Every event with the job that held its GPU: its own job_id, else the job
-- of the GPU's last gpu row at or before the event (DuckDB's ASOF join: here
-- a window over the events and those gpu rows in time order, a gpu row
-- before an event of the same instant). Events on an idle GPU, on one
-- shared by several jobs, and node events keep a null job_id.
CREATE OR REPLACE TEMPORARY VIEW event_attributed AS
WITH unattributed AS (
    SELECT * FROM event WHERE job_id IS NULL
),
last_row AS (
    SELECT g.node, g.gpu, g.ts, g.job_id
    FROM gpu g
    LEFT SEMI JOIN (SELECT DISTINCT node, gpu FROM unattributed) u
        ON g.node = u.node AND g.gpu = u.gpu
),
timeline AS (
    SELECT ts, node, gpu, uuid, kind, code, detail, gpu_instance_id, compute_instance_id,
           date, hour, 1 AS is_event, CAST(NULL AS STRUCT<job_id: STRING>) AS gpu_row
    FROM unattributed
    UNION ALL
    SELECT ts, node, gpu, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0,
           named_struct('job_id', job_id)
    FROM last_row
),
matched AS (
    SELECT *,
           last(gpu_row, true) OVER (PARTITION BY node, gpu ORDER BY ts, is_event
                                     ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS asof
    FROM timeline
)
SELECT ts, node, gpu, uuid, kind, code, detail, job_id, gpu_instance_id,
       compute_instance_id, date, hour
FROM event WHERE job_id IS NOT NULL
UNION ALL
SELECT ts, node, gpu, uuid, kind, code, detail, asof.job_id, gpu_instance_id,
       compute_instance_id, date, hour
FROM matched
WHERE is_event = 1;

-- Every XID event with its job (as event_attributed) and the catalogue's
-- name, category and reset; a code the catalogue lacks has category
-- 'unknown'.
CREATE OR REPLACE TEMPORARY VIEW xid_event AS
SELECT e.ts, e.node, e.gpu, e.uuid, e.code, e.job_id,
       c.name, coalesce(c.category, 'unknown') AS category, c.reset,
       e.date, e.hour
FROM event_attributed e
LEFT JOIN xid_catalogue c ON e.code = c.code
WHERE e.kind = 'xid';

-- The scheduler's job trace, one row per (source, job_id): the latest
-- import of a job (imports at the same instant ordered by file name).
CREATE OR REPLACE TEMPORARY VIEW scheduler_job AS
SELECT job_id, source, `user`, queue, state, job_type, submit_time, start_time, end_time,
       queue_s, duration_s, nodes, gpus, cpus, node_list, gpu_time_s, fail_time, stop_time,
       mem_per_pod_gb, shared_mem_per_pod, imported_at, month
FROM (
    SELECT *, row_number() OVER (PARTITION BY source, job_id
                                 ORDER BY imported_at DESC, filename DESC) AS latest
    FROM (SELECT *, input_file_name() AS filename FROM scheduler_job_stored)
)
WHERE latest = 1;

-- One row per job_id: where two sources describe the same job id, the later
-- import wins.
CREATE OR REPLACE TEMPORARY VIEW scheduler_job_latest AS
SELECT job_id, source, `user`, queue, state, job_type, submit_time, start_time, end_time,
       queue_s, duration_s, nodes, gpus, cpus, node_list, gpu_time_s, fail_time, stop_time,
       mem_per_pod_gb, shared_mem_per_pod, imported_at, month
FROM (
    SELECT *, row_number() OVER (PARTITION BY job_id ORDER BY imported_at DESC, source)
              AS latest
    FROM scheduler_job
)
WHERE latest = 1;

-- Each job as the telemetry saw it, over all files.
CREATE OR REPLACE TEMPORARY VIEW jobs_observed AS
SELECT job_id,
       min(ts) AS first_seen,
       max(last_ts) AS last_seen,
       sort_array(collect_set(node)) AS nodes,
       count(DISTINCT struct(node, gpu)) AS gpus,
       CAST(sum(samples) AS BIGINT) AS samples
FROM job
GROUP BY job_id;

-- Each node's sampling interval in microseconds: the most common gap between
-- its consecutive node rows (the smallest of equally common ones).
CREATE OR REPLACE TEMPORARY VIEW sample_interval AS
SELECT node, gap_us AS interval_us
FROM (
    SELECT node, gap_us,
           row_number() OVER (PARTITION BY node ORDER BY count(*) DESC, gap_us) AS place
    FROM (SELECT node, unix_micros(ts) - lag(unix_micros(ts)) OVER (PARTITION BY node ORDER BY ts)
                     AS gap_us
          FROM node_stored)
    WHERE gap_us > 0
    GROUP BY node, gap_us
)
WHERE place = 1;

-- Time weighting (views.sql, "Time weighting"): a sample weighs the gap to
-- its device's next sample, at most 3 × the device's median gap (the lower
-- middle of an even count); a device's last sample weighs the median gap; a
-- device sampled once weighs its node's sampling interval (sample_interval),
-- or nothing when that is unknown. weight_s is that weight in seconds.
-- The median gap of every GPU device (node, gpu, MIG instance).
CREATE OR REPLACE TEMPORARY VIEW gpu_median_gap AS
SELECT node, gpu, gpu_instance_id, compute_instance_id,
       CASE WHEN count(next_gap_us) > 0
            THEN element_at(sort_array(collect_list(next_gap_us)),
                            CAST((count(next_gap_us) + 1) DIV 2 AS INT)) END AS median_gap_us
FROM (SELECT node, gpu, gpu_instance_id, compute_instance_id,
             unix_micros(lead(ts) OVER (PARTITION BY node, gpu, gpu_instance_id,
                                                     compute_instance_id ORDER BY ts))
                 - unix_micros(ts) AS next_gap_us
      FROM gpu)
GROUP BY node, gpu, gpu_instance_id, compute_instance_id;

-- Every gpu row with its weight_s.
CREATE OR REPLACE TEMPORARY VIEW gpu_weighted AS
SELECT g.*,
       CASE WHEN lead(g.ts) OVER device IS NULL THEN coalesce(m.median_gap_us, i.interval_us)
            ELSE least(unix_micros(lead(g.ts) OVER device) - unix_micros(g.ts),
                       3 * m.median_gap_us)
       END / 1e6 AS weight_s
FROM gpu g
LEFT JOIN gpu_median_gap m
    ON g.node = m.node AND g.gpu = m.gpu
   AND g.gpu_instance_id <=> m.gpu_instance_id
   AND g.compute_instance_id <=> m.compute_instance_id
LEFT JOIN sample_interval i ON g.node = i.node
WINDOW device AS (PARTITION BY g.node, g.gpu, g.gpu_instance_id, g.compute_instance_id
                  ORDER BY g.ts);

-- The median gap of every node.
CREATE OR REPLACE TEMPORARY VIEW node_median_gap AS
SELECT node,
       CASE WHEN count(next_gap_us) > 0
            THEN element_at(sort_array(collect_list(next_gap_us)),
                            CAST((count(next_gap_us) + 1) DIV 2 AS INT)) END AS median_gap_us
FROM (SELECT node,
             unix_micros(lead(ts) OVER (PARTITION BY node ORDER BY ts)) - unix_micros(ts)
                 AS next_gap_us
      FROM node_stored)
GROUP BY node;

-- Every node row with its weight_s; a device is the node.
CREATE OR REPLACE TEMPORARY VIEW node_weighted AS
SELECT n.*,
       CASE WHEN lead(n.ts) OVER device IS NULL THEN m.median_gap_us
            ELSE least(unix_micros(lead(n.ts) OVER device) - unix_micros(n.ts),
                       3 * m.median_gap_us)
       END / 1e6 AS weight_s
FROM node n
LEFT JOIN node_median_gap m ON n.node = m.node
WINDOW device AS (PARTITION BY n.node ORDER BY n.ts);

-- The median gap of every InfiniBand port (node, HCA, port).
CREATE OR REPLACE TEMPORARY VIEW ib_median_gap AS
SELECT node, device, port,
       CASE WHEN count(next_gap_us) > 0
            THEN element_at(sort_array(collect_list(next_gap_us)),
                            CAST((count(next_gap_us) + 1) DIV 2 AS INT)) END AS median_gap_us
FROM (SELECT node, device, port,
             unix_micros(lead(ts) OVER (PARTITION BY node, device, port ORDER BY ts))
                 - unix_micros(ts) AS next_gap_us
      FROM ib_stored)
GROUP BY node, device, port;

-- Every ib row with its weight_s.
CREATE OR REPLACE TEMPORARY VIEW ib_weighted AS
SELECT b.*,
       CASE WHEN lead(b.ts) OVER device IS NULL THEN coalesce(m.median_gap_us, i.interval_us)
            ELSE least(unix_micros(lead(b.ts) OVER device) - unix_micros(b.ts),
                       3 * m.median_gap_us)
       END / 1e6 AS weight_s
FROM ib b
LEFT JOIN ib_median_gap m ON b.node = m.node AND b.device = m.device AND b.port = m.port
LEFT JOIN sample_interval i ON b.node = i.node
WINDOW device AS (PARTITION BY b.node, b.device, b.port ORDER BY b.ts);
