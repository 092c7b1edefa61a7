#!/usr/bin/env bash
# Collector ingest end to end: `gputel-loadgen` against a release collector on
# loopback (gRPC decode, validation, WAL, Arrow, Parquet), at 10, 100 and 1000
# simulated agents of 8 GPUs and 4 IB ports, the same number of batches each
# time. The collector runs under `/usr/bin/time -v`; "per core" is metric
# values over the collector's own CPU seconds (user + system, its final
# flush included), since the load generator shares the machine.
#
#   benches/scripts/ingest.sh [BATCHES] [AGENTS...]   # default 60000, 10 100 1000
#
# LOADGEN_FLAGS go to the load generator: LOADGEN_FLAGS=--every-field sends
# rows with every field a real HGX H100 node reports (about 450 values a
# batch instead of about 130). GPUTEL_BENCH_TLS=1: mutual TLS, as collector
# and agents speak at their defaults, instead of plaintext.
#
# The last column, the collector's CPU over the load generator's, compares
# runs on a machine whose speed moves: the generator does the same work in
# every run of the same arguments, so it is the yardstick (on the shared
# 2-vCPU VM its CPU for 300 000 batches moved by 40 % between runs, the
# ratio by a few %).
cd "$(dirname "$0")/../.."
source benches/scripts/common.sh

batches=${1:-60000}
shift || true
counts=("$@")
[[ ${#counts[@]} -gt 0 ]] || counts=(10 100 1000)
build_release
dir=$(mktemp -d)
trap 'set +e; pkill -P "${COLLECTOR_PID:-0}"; rm -rf "$dir"; true' EXIT

machine
printf '%-7s %7s %11s %9s %13s %11s %15s %10s %11s %10s\n' agents ticks values wall_s \
  "values/s wall" collector_s "values/s/core" "peak RSS" loadgen_cpu cpu_ratio
for agents in "${counts[@]}"; do
  ticks=$((batches / agents))
  run="$dir/$agents"
  start_collector "$run"
  # shellcheck disable=SC2086 # LOADGEN_FLAGS holds several flags
  loadgen_run "$run" "$agents" "$ticks" ${LOADGEN_FLAGS:-}
  stop_collector
  line=$(cat "$run/loadgen.out")
  values=$(sed -n 's/.* values=\([0-9]*\).*/\1/p' <<<"$line")
  elapsed=$(sed -n 's/.* elapsed_s=\([0-9.]*\).*/\1/p' <<<"$line")
  cpu=$(tv_cpu "$run/collector.time")
  loadgen_cpu=$(tv_cpu "$run/loadgen.time")
  printf '%-7s %7s %11s %9s %13s %11s %15s %7s MB %11s %10s\n' "$agents" "$ticks" "$values" \
    "$elapsed" "$(awk -v v="$values" -v e="$elapsed" 'BEGIN { printf "%.2fM", v / e / 1e6 }')" \
    "$cpu" "$(awk -v v="$values" -v c="$cpu" 'BEGIN { printf "%.2fM", v / c / 1e6 }')" \
    "$(tv_rss_mb "$run/collector.time")" "$loadgen_cpu" \
    "$(awk -v c="$cpu" -v l="$loadgen_cpu" 'BEGIN { printf "%.3f", c / l }')"
  rm -rf "$run"
done
