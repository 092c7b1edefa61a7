#!/usr/bin/env bash
# What one collector carries: the measurements behind the README's
# "Capacity" (collectors for a 10,000- and a 100,000-GPU cluster).
#
# 1. Streams: AGENTS simulated nodes (8 GPUs and 4 InfiniBand ports each)
#    sending one tick a second each, each tick at its time (`gputel-loadgen
#    --pace`), for SECONDS, to a release collector at its defaults with the
#    default alert rules (systemd/alerts.toml) evaluated on every row. The
#    collector's CPU (user + system, `/usr/bin/time -v`, its final flush
#    included) over the seconds of load is the cores it used; agents per
#    core follows. Peak RSS beside it.
# 2. Compaction: one hour of each HOUR_NODES nodes (as a serving collector
#    flushes it, 360 files a table; `hour_store`, kept under
#    target/bench-query), merged by `gputel-collector compact` under
#    `/usr/bin/time -v`: CPU seconds and peak RSS per hour, and CPU per
#    node-hour.
#
#   benches/scripts/capacity.sh [AGENTS] [SECONDS] [HOUR_NODES...]   # default 2000 120 200 1000
#   benches/scripts/capacity.sh 0 0 1000                             # compaction only
#   benches/scripts/capacity.sh 2000 120 0                           # streams only
#
# LOADGEN_FLAGS go to the load generator (LOADGEN_FLAGS=--every-field).
# GPUTEL_BENCH_TLS=1: the streams over mutual TLS, as agents and collector
# speak at their defaults, instead of plaintext.
# HOUR_VALUES=every-field compacts hours whose rows hold every field a real
# H100 node reports (`gputel-loadgen --every-field`) instead of the load
# generator's default rows; HOUR_VALUES=noise, random noise.
cd "$(dirname "$0")/../.."
source benches/scripts/common.sh

agents=${1:-2000}
seconds=${2:-120}
shift 2 || shift $#
hour_nodes=("$@")
[[ ${#hour_nodes[@]} -gt 0 ]] || hour_nodes=(200 1000)
build_release
dir=$(mktemp -d)
trap 'set +e; pkill -P "${COLLECTOR_PID:-0}"; rm -rf "$dir"; true' EXIT

machine
if ((agents > 0)); then
  say "$agents agents of 8 GPUs, one tick a second each, for $seconds s, with the default alert rules"
  start_collector "$dir/streams" --rules systemd/alerts.toml
  # shellcheck disable=SC2086 # LOADGEN_FLAGS holds several flags
  loadgen_run "$dir" "$agents" "$seconds" --pace ${LOADGEN_FLAGS:-}
  stop_collector
  cpu=$(tv_cpu "$dir/streams/collector.time")
  cat "$dir/loadgen.out"
  printf 'load average at the end of the load: %s\n' "$LOAD_AT_END"
  printf 'collector: %s CPU s over %s s: %s cores, %s agents per core; peak RSS %s MB\n' \
    "$cpu" "$seconds" "$(awk -v c="$cpu" -v s="$seconds" 'BEGIN { printf "%.3f", c / s }')" \
    "$(awk -v c="$cpu" -v s="$seconds" -v a="$agents" 'BEGIN { printf "%.0f", a * s / c }')" \
    "$(tv_rss_mb "$dir/streams/collector.time")"
  printf 'load generator: %s CPU s\n' "$(tv_cpu "$dir/loadgen.time")"
fi

for nodes in "${hour_nodes[@]}"; do
  ((nodes > 0)) || continue
  hour_store "$nodes" 360 "${HOUR_VALUES:-realistic}"
  rm -rf "$dir/hour"
  cp -r "$flushed" "$dir/hour"
  say "compacting one hour of $nodes nodes ($(du -sh "$dir/hour" | cut -f1) flushed)"
  /usr/bin/time -v -o "$dir/compact.time" "$COLLECTOR" compact --store "$dir/hour" \
    >"$dir/compact.out" 2>"$dir/compact.log" \
    || die "compaction failed: $(tail -5 "$dir/compact.log")"
  # Every hour merged: one left as it is (a file of an older schema) would
  # make the figure too small.
  ! grep -Eq ' [1-9][0-9]* hours? left as' "$dir/compact.out" \
    || die "an hour was left uncompacted: $(cat "$dir/compact.out") $(tail -3 "$dir/compact.log")"
  cpu=$(tv_cpu "$dir/compact.time")
  printf 'compaction of an hour of %s nodes: %s CPU s (%s per node-hour), %s s wall, peak RSS %s MB; load %s\n' \
    "$nodes" "$cpu" "$(awk -v c="$cpu" -v n="$nodes" 'BEGIN { printf "%.4f", c / n }')" \
    "$(tv "$dir/compact.time" "Elapsed (wall clock)")" "$(tv_rss_mb "$dir/compact.time")" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"
  sed 's/^/  /' "$dir/compact.out"
done
