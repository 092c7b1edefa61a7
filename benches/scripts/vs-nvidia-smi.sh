#!/usr/bin/env bash
# Compares what gputel stored with what nvidia-smi printed at the same
# moments, from a directory benches/scripts/real-gpu.sh wrote (such as
# tests/fixtures/h200-recording):
#
#   benches/scripts/vs-nvidia-smi.sh DIR
#
# Each agent row (whole seconds) is paired with the nvidia-smi row (every
# 250 ms) nearest before its time plus 125 ms, so the two are at most about
# 0.4 s apart (the pairs' largest gap is printed). For each reading both
# give: how many pairs, the share that are equal, and the median, 99th
# percentile and largest absolute difference. Then, per phase of the load
# (DIR/load.csv), the means of what only the agent reads (GPM's SM, tensor
# and DRAM activity) beside utilization and power. Needs the DuckDB CLI
# (scripts/duckdb installs it).
set -euo pipefail
dir=$(cd "${1:?usage: vs-nvidia-smi.sh DIR (written by real-gpu.sh)}" && pwd)
cd "$(dirname "$0")/../.."
store=$(mktemp -d)
trap 'rm -rf "$store"' EXIT
tar -C "$store" -xzf "$dir/store.tar.gz"
# nvidia-smi's columns, named as queried ('.' as '_').
names=$(tr ',' '\n' <"$dir/nvidia-smi-fields.txt" | sed "s/.*/'&'/; s/\./_/g" | paste -sd,)

scripts/duckdb -c "
SET TimeZone = 'UTC';
CREATE TEMP TABLE smi AS
SELECT strptime(timestamp, '%Y/%m/%d %H:%M:%S.%g')::TIMESTAMPTZ AS ts, * EXCLUDE (timestamp)
FROM read_csv('$dir/nvidia-smi.csv.gz', header = false, skip = 1, all_varchar = true,
              delim = ', ', nullstr = '[N/A]', names = [$names]);
CREATE TEMP TABLE agent AS
SELECT * FROM read_parquet('$store/store/gpu/**/*.parquet', hive_partitioning = true);
CREATE TEMP TABLE phases AS
SELECT phase, to_timestamp(start_unix_s) AS start_ts,
       lead(to_timestamp(start_unix_s), 1, 'infinity'::TIMESTAMPTZ) OVER (ORDER BY start_unix_s) AS end_ts
FROM read_csv('$dir/load.csv');
CREATE TEMP TABLE pairs AS
SELECT a.ts, s.ts AS smi_ts
FROM agent a ASOF JOIN smi s
  ON s.uuid = a.uuid AND s.ts <= a.ts + INTERVAL 125 MILLISECOND;

SELECT count(*) AS pairs,
       round(max(abs(epoch(ts) - epoch(smi_ts))), 3) AS largest_gap_s
FROM pairs;

-- One row per tick and reading on each side, as (ts, reading, value).
CREATE TEMP TABLE agent_long AS
SELECT ts, r.ord, r.reading, r.v FROM (
  SELECT ts, unnest(list_zip(range(25), [
      'temperature_c · temperature.gpu', 'memory_temperature_c · temperature.memory',
      'power_mw · power.draw (W)', 'power_mw · power.draw.instant (W)',
      'power_avg_mw · power.draw.average (W)', 'power_limit_mw · enforced.power.limit (W)',
      'sm_clock_mhz · clocks.sm', 'memory_clock_mhz · clocks.mem',
      'gpu_util_pct · utilization.gpu', 'memory_copy_util_pct · utilization.memory',
      'enc_util_pct · utilization.encoder', 'dec_util_pct · utilization.decoder',
      'fb_total_bytes · memory.total (MiB, rounded up)',
      'fb_reserved_bytes · memory.reserved (MiB, rounded up)',
      'fb_used_bytes · memory.used (MiB, rounded up)',
      'fb_free_bytes · memory.free (MiB, rounded up)',
      'performance_state · pstate', 'clock_event_reasons · clocks_event_reasons.active',
      'ecc_corrected_volatile · ecc.errors.corrected.volatile.total',
      'ecc_uncorrected_volatile · ecc.errors.uncorrected.volatile.total',
      'pcie_link_gen · pcie.link.gen.gpucurrent', 'pcie_link_gen_max · pcie.link.gen.max',
      'pcie_link_width · pcie.link.width.current', 'pcie_link_width_max · pcie.link.width.max',
      'mig_mode · mig.mode.current'],
    [temperature_c, memory_temperature_c, power_mw / 1000, power_mw / 1000,
     power_avg_mw / 1000, power_limit_mw / 1000, sm_clock_mhz, memory_clock_mhz,
     gpu_util_pct, memory_copy_util_pct, enc_util_pct, dec_util_pct,
     ceil(fb_total_bytes / 1048576), ceil(fb_reserved_bytes / 1048576),
     ceil(fb_used_bytes / 1048576), ceil(fb_free_bytes / 1048576),
     performance_state, clock_event_reasons, ecc_corrected_volatile, ecc_uncorrected_volatile,
     pcie_link_gen, pcie_link_gen_max, pcie_link_width, pcie_link_width_max,
     mig_mode::INT]::DOUBLE[]), recursive := true)
  FROM agent) AS r(ts, ord, reading, v);
CREATE TEMP TABLE smi_long AS
SELECT ts, r.reading, r.v FROM (
  SELECT ts, unnest(list_zip(
    (SELECT list(reading ORDER BY ord) FROM (SELECT DISTINCT ord, reading FROM agent_long)),
    [temperature_gpu, temperature_memory, power_draw, power_draw_instant, power_draw_average,
     enforced_power_limit, clocks_sm, clocks_mem, utilization_gpu, utilization_memory,
     utilization_encoder, utilization_decoder, memory_total, memory_reserved, memory_used,
     memory_free, ltrim(pstate, 'P'), clocks_event_reasons_active::BIGINT::VARCHAR,
     ecc_errors_corrected_volatile_total, ecc_errors_uncorrected_volatile_total,
     pcie_link_gen_gpucurrent, pcie_link_gen_max, pcie_link_width_current,
     pcie_link_width_max, (mig_mode_current = 'Enabled')::INT::VARCHAR]::DOUBLE[]), recursive := true)
  FROM smi) AS r(ts, reading, v);

-- Steady: nvidia-smi printed the same value for the reading from 0.5 s
-- before the tick to 0.5 s after it, so a difference is not the moment.
SELECT a.reading, count(*) AS pairs,
       round(100 * avg((a.v = s.v)::INT), 1) AS equal_pct,
       round(median(abs(a.v - s.v)), 2) AS median_diff,
       round(max(abs(a.v - s.v)), 2) AS max_diff,
       count(*) FILTER (steady) AS steady_pairs,
       round(100 * avg((a.v = s.v)::INT) FILTER (steady), 1) AS steady_equal_pct,
       round(max(abs(a.v - s.v)) FILTER (steady), 2) AS steady_max_diff
FROM agent_long a
ASOF JOIN smi_long s ON s.reading = a.reading AND s.ts <= a.ts + INTERVAL 125 MILLISECOND
CROSS JOIN LATERAL (
  SELECT min(w.v) = max(w.v) AS steady FROM smi_long w
  WHERE w.reading = a.reading
    AND w.ts BETWEEN a.ts - INTERVAL 500 MILLISECOND AND a.ts + INTERVAL 500 MILLISECOND)
WHERE a.v IS NOT NULL AND s.v IS NOT NULL
GROUP BY a.reading ORDER BY min(a.ord);

SELECT p.phase, count(*) AS ticks,
       round(avg(gpu_util_pct), 1) AS gpu_util,
       round(avg(sm_active_pct), 1) AS sm_active,
       round(avg(sm_occupancy_pct), 1) AS sm_occupancy,
       round(avg(tensor_active_pct), 1) AS tensor_active,
       round(avg(dram_active_pct), 1) AS dram_active,
       round(avg(gr_engine_active_pct), 1) AS gr_engine,
       round(avg(power_mw) / 1000, 1) AS power_w,
       max(temperature_c) AS temp_max_c,
       round(max(fb_used_bytes) / 2^30, 1) AS fb_used_gib,
       string_agg(DISTINCT job_id, ',') AS jobs
FROM agent a JOIN phases p ON a.ts >= p.start_ts + INTERVAL 2 SECOND AND a.ts < p.end_ts
GROUP BY p.phase ORDER BY min(a.ts);
"
