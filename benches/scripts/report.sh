#!/usr/bin/env bash
# The fleet report (`gputel-collector report`) over the benchmark day of
# 1,000 simulated nodes (see day_store in common.sh: 11.5 M gpu rows at one
# sample per 60 s), native and resampled to 15 s windows, and one job's
# report (`gputel-collector job`); then one hour of HOUR_NODES nodes sampled
# every second (see hour_store: 5.76 M gpu rows at the default 200), as
# flushed in 360 files (an hour of 10 s flushes) and compacted (one): wall time,
# whole-process CPU and peak RSS from /usr/bin/time -v, best of three, with
# the load average beside them.
#
# The peer, DuckDB (the CLI scripts/duckdb runs), computes fleet_cdf.sql
# alone on the day.
#
#   benches/scripts/report.sh [INTERVAL] [NODES] [HOUR_NODES]   # default 60 1000 200
cd "$(dirname "$0")/../.."
source benches/scripts/common.sh

interval=${1:-60}
nodes=${2:-1000}
hour_nodes=${3:-200}
build_release
day_store "$interval" "$nodes"
hour_store "$hour_nodes" 360
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

machine
printf 'store: %s, %s gpu files, %s in all\n' "$store" \
  "$(find "$store/gpu" -name '*.parquet' | wc -l)" "$(du -sh "$store" | cut -f1)"
# Best of three (the files are in the page cache after the first), or of
# $runs.
measure() {
  local what=$1
  shift
  local best_wall= best_line=
  for ((run = 0; run < ${runs:-3}; run++)); do
    /usr/bin/time -v -o "$out/time" "$@" >"$out/stdout" 2>"$out/stderr" \
      || die "$what failed: $(tail -3 "$out/stderr")"
    local wall cpu rss
    wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$out/time" \
      | awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; print s }')
    cpu=$(awk -F': ' '/User time|System time/ { s += $2 } END { printf "%.2f", s }' "$out/time")
    rss=$(awk -F': ' '/Maximum resident set size/ { printf "%.0f", $2 / 1024 }' "$out/time")
    if [[ -z $best_wall ]] || awk -v a="$wall" -v b="$best_wall" 'BEGIN { exit !(a < b) }'; then
      best_wall=$wall
      best_line=$(printf '%-34s %6.2f s wall, %6s s CPU, %5s MB peak RSS' "$what:" "$wall" "$cpu" "$rss")
    fi
  done
  printf '%s (load average %s)\n' "$best_line" "$(cut -d' ' -f1 /proc/loadavg)"
}
measure "report, whole day" "$COLLECTOR" report --store "$store" --out "$out/r.html"
measure "report, whole day, 15 s windows" "$COLLECTOR" report --store "$store" --out "$out/r.html" \
  --resample 15s
# The peer: DuckDB running the shipped SQL of the CDF figures alone on the
# same store (once: it takes over a minute).
runs=1 measure "DuckDB, fleet_cdf.sql, whole day" scripts/duckdb \
  -c "SET VARIABLE store = '$store'" -c ".read schemas/sql/views.sql" \
  -c ".read schemas/sql/fleet_cdf.sql"
measure "report, one hour" "$COLLECTOR" report --store "$store" --out "$out/r.html" \
  --from 2024-06-12T12:00:00Z --to 2024-06-12T12:59:59Z
job=$("$COLLECTOR" report --store "$store" --out "$out/r.html" --from 2024-06-12T12:00:00Z \
  --to 2024-06-12T12:09:59Z --json | head -1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["jobs"][0]["job_id"])')
measure "job $job" "$COLLECTOR" job "$job" --store "$store"
tail -1 "$out/stdout"
files() {
  printf '%s gpu files, %s' "$(find "$1/gpu" -name '*.parquet' | wc -l)" "$(du -sh "$1" | cut -f1)"
}
printf 'hour store: %s nodes at 1 s; flushed: %s; compacted: %s\n' "$hour_nodes" \
  "$(files "$flushed")" "$(files "$compacted")"
measure "report, hour at 1 s, flushed" "$COLLECTOR" report --store "$flushed" --out "$out/r.html"
measure "report, hour at 1 s, compacted" "$COLLECTOR" report --store "$compacted" --out "$out/r.html"
