#!/usr/bin/env bash
# Where the collector's heap goes at its peak under a fleet's steady load:
# the collector built with the system allocator (feature `system-allocator`,
# into target/heap-profile, so the release build stays as it is) runs under
# heaptrack at its default settings while AGENTS simulated nodes (8 GPUs, 4
# InfiniBand ports each) send one tick a second for SECONDS (`gputel-loadgen
# --pace`). Prints heaptrack's peak heap and that peak split by what the
# allocating code does, from the peak's call stacks (collector-heap.py).
#
#   benches/scripts/collector-heap.sh [AGENTS] [SECONDS] [COLLECTOR FLAGS...]   # default 1000 60
#
# LOADGEN_FLAGS go to the load generator (LOADGEN_FLAGS=--every-field for
# rows with every field a real H100 node reports). heaptrack counts what was
# allocated, including capacity never touched; the resident memory of the
# jemalloc build is measured by collector-rss.sh.
#
# GPUTEL_BENCH_HEAP_PEAK=FILE keeps the peak's call stacks (heaptrack's
# flame graph lines, `frame;frame;... bytes`), to look past the parts.
cd "$(dirname "$0")/../.."
source benches/scripts/common.sh

agents=${1:-1000}
seconds=${2:-60}
shift 2 || shift $#
command -v heaptrack >/dev/null || die "heaptrack is missing (Debian: apt-get install heaptrack)"
command -v python3 >/dev/null || die "python3 is missing (Debian: apt-get install python3)"
build_release
heap_target="$(pwd)/target/heap-profile"
say "building the collector with the system allocator into $heap_target"
CARGO_TARGET_DIR="$heap_target" cargo build --release --quiet -p gputel-collector \
  --features system-allocator
dir=$(mktemp -d)
# heaptrack's script starts the collector, its own interpreter and a
# compressor: only the collector is signalled, so the others finish the data.
stop_profiled() { pkill -TERM -P "$HEAPTRACK_PID" -f "$heap_target/release/gputel-collector"; }
trap 'set +e; [[ -n ${HEAPTRACK_PID:-} ]] && stop_profiled; rm -rf "$dir"; true' EXIT

machine
COLLECTOR_PORT=$(free_port)
heaptrack -o "$dir/collector" "$heap_target/release/gputel-collector" \
  --listen "127.0.0.1:$COLLECTOR_PORT" --store "$dir/store" --wal-dir "$dir/wal" --plaintext \
  --log warn "$@" >"$dir/heaptrack.log" 2>&1 &
HEAPTRACK_PID=$!
wait_port "$COLLECTOR_PORT"
say "$agents agents${LOADGEN_FLAGS:+ ($LOADGEN_FLAGS)}, one tick a second each, for $seconds s, to the collector under heaptrack${*:+ with $*}"
# shellcheck disable=SC2086 # LOADGEN_FLAGS holds several flags
"$LOADGEN" --collector "http://127.0.0.1:$COLLECTOR_PORT" --agents "$agents" --gpus 8 \
  --ticks "$seconds" --pace ${LOADGEN_FLAGS:-} >"$dir/loadgen.out" 2>"$dir/loadgen.log" \
  || die "gputel-loadgen failed: $(tail -5 "$dir/loadgen.log")"
cat "$dir/loadgen.out"
printf 'load average at the end of the load: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
# The collector flushes and exits; heaptrack then writes out its data.
stop_profiled || true
wait "$HEAPTRACK_PID" || die "the collector failed under heaptrack: $(tail -5 "$dir/heaptrack.log")"
HEAPTRACK_PID=
data=$(ls "$dir"/collector.* 2>/dev/null | head -1)
[[ -n $data ]] || die "heaptrack wrote no data: $(tail -5 "$dir/heaptrack.log")"
heaptrack_print -f "$data" --flamegraph-cost-type peak -F "$dir/peak.txt" >"$dir/summary.txt"
grep -E '^(peak heap memory consumption|peak RSS)' "$dir/summary.txt"
[[ -n ${GPUTEL_BENCH_HEAP_PEAK:-} ]] && cp "$dir/peak.txt" "$GPUTEL_BENCH_HEAP_PEAK"
python3 benches/scripts/collector-heap.py "$dir/peak.txt" "$agents"
