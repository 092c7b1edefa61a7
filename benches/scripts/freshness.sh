#!/usr/bin/env bash
# Freshness: from a sample's timestamp to its row being readable in Parquet,
# at the default settings (agent: 1 s interval; collector: 10 s flush
# interval), and the files each table's hours hold before compaction. A
# release agent on the fake NVML and the fixture trees streams to a release
# collector for DURATION seconds; a loop lists the store every 200 ms and
# notes when each Parquet file appears. DuckDB then reads every
# row of every file: freshness = the time its file was seen − the row's `ts`.
#
#   benches/scripts/freshness.sh [DURATION]   # seconds, default 300
#
# Needs the DuckDB CLI (on PATH, or $GPUTEL_DUCKDB; scripts/lib/tools.sh
# installs one).
cd "$(dirname "$0")/../.."
source benches/scripts/common.sh
source scripts/lib/tools.sh

duration=${1:-300}
build_release
if [[ -n ${GPUTEL_DUCKDB:-} ]]; then DUCKDB=$GPUTEL_DUCKDB; else ensure_duckdb; fi
dir=$(mktemp -d)
trap 'set +e; kill "${AGENT_PID:-}" 2>/dev/null; pkill -P "${COLLECTOR_PID:-0}"; rm -rf "$dir"; true' EXIT
start_collector "$dir"
"$AGENT" --nvml-lib "$FAKE_NVML" --procfs-root "$FIXTURES/proc" \
  --sysfs-root "$FIXTURES/sys" --node bench-node --plaintext \
  --collector "http://127.0.0.1:$COLLECTOR_PORT" --log warn >"$dir/agent.out" 2>"$dir/agent.log" &
AGENT_PID=$!

say "agent and collector at the defaults for $duration s; watching $dir/store"
declare -A seen
echo "filename,seen_us" >"$dir/seen.csv"
end=$((SECONDS + duration))
while ((SECONDS < end)); do
  now_us=$(date +%s%6N)
  while IFS= read -r f; do
    if [[ -z ${seen[$f]:-} ]]; then
      seen[$f]=1
      echo "$f,$now_us" >>"$dir/seen.csv"
    fi
  done < <(find "$dir/store" -name '*.parquet' 2>/dev/null)
  sleep 0.2
done
kill -TERM "$AGENT_PID"
wait "$AGENT_PID" || true
stop_collector

machine
echo "freshness: seconds from a row's ts to its file being listed, rows written while running"
"$DUCKDB" -c "
  WITH seen AS (FROM read_csv('$dir/seen.csv', types = {'seen_us': 'BIGINT'})),
  rows AS (
    SELECT regexp_extract(filename, 'store/([a-z_]+)/', 1) AS tbl,
           (seen_us - epoch_us(ts)) / 1e6 AS s
    FROM read_parquet('$dir/store/*/**/*.parquet', filename = true, union_by_name = true)
    JOIN seen USING (filename))
  SELECT tbl AS table, count(*) AS rows, round(min(s), 2) AS min,
         round(quantile_cont(s, 0.5), 2) AS p50, round(quantile_cont(s, 0.9), 2) AS p90,
         round(quantile_cont(s, 0.99), 2) AS p99, round(max(s), 2) AS max
  FROM rows GROUP BY ALL ORDER BY tbl"
echo "files per table and hour, before compaction (the run's hours):"
find "$dir/store" -name '*.parquet' \
  | sed -E 's|.*/store/([a-z_]+)/date=([^/]+)/hour=([0-9]+)/.*|\1 \2T\3|' | sort | uniq -c \
  | awk '{ printf "  %-12s %s: %s files\n", $2, $3, $1 }'
