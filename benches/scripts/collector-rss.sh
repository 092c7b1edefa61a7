#!/usr/bin/env bash
# The collector at its default settings under a fleet's steady load: AGENTS
# simulated nodes (8 GPUs and 4 InfiniBand ports each) sending one tick a
# second, each tick at its time (`gputel-loadgen --pace`), for SECONDS. It
# reports the collector's resident memory sampled every second
# (/proc/PID/status VmRSS) and its peak (/usr/bin/time -v), its CPU per
# million values over the whole run (final flush included), and the files
# it wrote per table, with the load average.
#
#   benches/scripts/collector-rss.sh [AGENTS] [SECONDS] [COLLECTOR FLAGS...]   # default 1000 180
#
# Flags after SECONDS go to the collector, e.g. --flush-interval 2s, to see
# which part of its memory follows the buffered rows. LOADGEN_FLAGS go to
# the load generator, e.g. LOADGEN_FLAGS=--every-field for rows with every
# field a real H100 node reports.
#
# SEED_HOUR_NODES=N puts a closed hour of N nodes as a serving collector
# flushes it (360 files a table, `hour_store`) in the store before the
# collector starts, so that a compaction round runs during the load: give
# the collector a --compact-interval shorter than SECONDS, e.g.
#
#   SEED_HOUR_NODES=1000 benches/scripts/collector-rss.sh 1000 150 --compact-interval 30s
#
# GPUTEL_BENCH_TLS=1 has collector and agents speak mutual TLS, as they do
# at their defaults, each simulated node with its own certificate; without
# it they speak plaintext.
#
# SEED_HOUR_VALUES=every-field seeds an hour of rows with every field a
# real H100 node reports (`hour_store`'s VALUES), to go with
# LOADGEN_FLAGS=--every-field.
cd "$(dirname "$0")/../.."
source benches/scripts/common.sh

agents=${1:-1000}
seconds=${2:-180}
shift 2 || shift $#
build_release
dir=$(mktemp -d)
trap 'set +e; pkill -P "${COLLECTOR_PID:-0}"; rm -rf "$dir"; true' EXIT

machine
if [[ -n ${SEED_HOUR_NODES:-} ]]; then
  hour_store "$SEED_HOUR_NODES" 360 "${SEED_HOUR_VALUES:-realistic}"
  mkdir -p "$dir/store"
  cp -r "$flushed"/. "$dir/store/"
  say "the store holds a closed hour of $SEED_HOUR_NODES nodes ($(du -sh "$dir/store" | cut -f1) flushed) for compaction"
fi
start_collector "$dir" "$@"
# The collector itself: /usr/bin/time's child.
pid=$(pgrep -P "$COLLECTOR_PID" | head -1)
[[ -n $pid ]] || die "cannot find the collector's pid"
(
  while kill -0 "$pid" 2>/dev/null; do
    # VmRSS, and its anonymous (heap) and file-backed (the mapped
    # executable's pages) parts, in KiB.
    awk '/^VmRSS/ { r = $2 } /^RssAnon/ { a = $2 } /^RssFile/ { f = $2 }
      END { if (r) print r, a, f }' "/proc/$pid/status" 2>/dev/null
    sleep 1
  done
) >"$dir/rss.txt" &
sampler=$!
say "$agents agents${LOADGEN_FLAGS:+ ($LOADGEN_FLAGS)}, one tick a second each, for $seconds s, to a collector at its defaults${*:+ but $*}"
# shellcheck disable=SC2086 # LOADGEN_FLAGS holds several flags
loadgen_run "$dir" "$agents" "$seconds" --pace ${LOADGEN_FLAGS:-}
stop_collector
wait "$sampler" 2>/dev/null || true

# GPUTEL_BENCH_RSS_LOG=FILE keeps the samples: VmRSS, RssAnon, RssFile (KiB).
[[ -n ${GPUTEL_BENCH_RSS_LOG:-} ]] && cp "$dir/rss.txt" "$GPUTEL_BENCH_RSS_LOG"
line=$(cat "$dir/loadgen.out")
values=$(sed -n 's/.* values=\([0-9]*\).*/\1/p' <<<"$line")
cpu=$(tv_cpu "$dir/collector.time")
echo "$line"
printf 'load average at the end of the load: %s\n' "$LOAD_AT_END"
printf 'collector: %s CPU s for %s values: %s CPU s per million values, %s M values per CPU s\n' \
  "$cpu" "$values" "$(awk -v c="$cpu" -v v="$values" 'BEGIN { printf "%.3f", c / v * 1e6 }')" \
  "$(awk -v c="$cpu" -v v="$values" 'BEGIN { printf "%.2f", v / c / 1e6 }')"
printf 'collector peak RSS (time -v): %s MB; user %s s, system %s s\n' "$(tv_rss_mb "$dir/collector.time")" \
  "$(tv "$dir/collector.time" "User time (seconds)")" "$(tv "$dir/collector.time" "System time (seconds)")"
sort -n "$dir/rss.txt" | awk '{ r[NR] = $1 } END {
  printf "collector RSS sampled every second (%d samples): median %.1f MB, p90 %.1f MB, max %.1f MB\n",
    NR, r[int((NR + 1) / 2)] * 1024 / 1e6, r[int(NR * 0.9 + 0.5)] * 1024 / 1e6, r[NR] * 1024 / 1e6 }'
sort -n -k2 "$dir/rss.txt" | awk '{ a[NR] = $2; if ($3 > f) f = $3 } END {
  printf "  of it anonymous (heap): median %.1f MB, max %.1f MB; file-backed (the executable'"'"'s mapped pages): max %.1f MB\n",
    a[int((NR + 1) / 2)] * 1024 / 1e6, a[NR] * 1024 / 1e6, f * 1024 / 1e6 }'
printf 'load generator: %s CPU s\n' "$(tv_cpu "$dir/loadgen.time")"
echo "files per table (the run's hours, before compaction):"
find "$dir/store" -name '*.parquet' -not -path '*/date=2024-06-12/*' \
  | sed -E 's|.*/store/([a-z_]+)/.*|\1|' | sort | uniq -c | awk '{ printf "  %-12s %s files\n", $2, $1 }'
if [[ -n ${SEED_HOUR_NODES:-} ]]; then
  echo "the seeded hour's files after the run (compacted: a few a table):"
  find "$dir/store" -name '*.parquet' -path '*/date=2024-06-12/*' | sed -E 's|.*/store/([a-z_]+)/.*|\1|' \
    | sort | uniq -c | awk '{ printf "  %-12s %s files\n", $2, $1 }'
  grep -iE 'compact' "$dir/collector.log" | tail -5 || true
fi
