#!/usr/bin/env bash
# Where the collector's CPU goes under load: `perf record` on a release
# collector while `gputel-loadgen` streams AGENTS × TICKS batches of 8 GPUs
# to it; --flush-rows 200000 makes it write Parquet during the run, as a busy
# collector does. Prints the share per binary and the top symbols.
#
#   benches/scripts/profile-collector.sh [AGENTS] [TICKS]   # default 100 1200
#
# Needs `perf` (Debian: linux-perf) and perf_event_paranoid ≤ 1 or root.
# KEEP_PERF=FILE keeps the recording (perf.data) there for `perf report -i`.
cd "$(dirname "$0")/../.."
source benches/scripts/common.sh

agents=${1:-100}
ticks=${2:-1200}
command -v perf >/dev/null || die "perf is missing (Debian: apt-get install linux-perf)"
build_release
dir=$(mktemp -d)
port=$(free_port)
perf record -q -F 999 -g -o "$dir/perf.data" -- "$COLLECTOR" --listen "127.0.0.1:$port" \
  --store "$dir/store" --wal-dir "$dir/wal" --plaintext --log warn --flush-rows 200000 \
  2>"$dir/collector.log" &
PERF_PID=$!
trap 'set +e; pkill -P "$PERF_PID"; [[ -n ${KEEP_PERF:-} ]] && cp "$dir/perf.data" "$KEEP_PERF"; rm -rf "$dir"; true' EXIT
wait_port "$port"
"$LOADGEN" --collector "http://127.0.0.1:$port" --agents "$agents" --gpus 8 --ticks "$ticks" \
  2>"$dir/loadgen.log" || die "gputel-loadgen failed: $(tail -5 "$dir/loadgen.log")"
pkill -TERM -P "$PERF_PID"
wait "$PERF_PID" || die "perf or the collector failed: $(tail -5 "$dir/collector.log")"
machine
perf report -i "$dir/perf.data" --no-children --sort dso --stdio -g none 2>/dev/null \
  | grep '%' | head -5
perf report -i "$dir/perf.data" --no-children --sort symbol --stdio -g none 2>/dev/null \
  | grep '%' | head -30 | cut -c1-120
