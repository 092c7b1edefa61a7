#!/usr/bin/env bash
# The agent's CPU per tick and its peak resident memory over an hour's worth
# of ticks: the release agent on the fake NVML (8 H100s) and the fixture
# /proc and /sys trees (4 IB ports), ticking every 10 ms instead of every
# second, streaming to a release collector on loopback.
#
#   benches/scripts/agent-rss.sh [TICKS]     # default 3600: an hour at 1 Hz
#
# CPU per tick is the agent's user + system CPU seconds over TICKS: it
# includes start-up, NVML's (fake) calls, the gRPC client and HTTP/2
# framing, so it is an upper bound on criterion's `agent_tick` figure.
# Plaintext, or with GPUTEL_BENCH_TLS=1 mutual TLS, as agent and collector
# speak at their defaults (the agent with a certificate of its own).
cd "$(dirname "$0")/../.."
source benches/scripts/common.sh

ticks=${1:-3600}
build_release
dir=$(mktemp -d)
trap 'set +e; pkill -P "${COLLECTOR_PID:-0}"; rm -rf "$dir"; true' EXIT
start_collector "$dir"

target=(--plaintext --collector "http://127.0.0.1:$COLLECTOR_PORT")
if [[ ${GPUTEL_BENCH_TLS:-0} == 1 ]]; then
  leaf_cert "$TLS_PKI" bench-node "subjectAltName=DNS:bench-node" clientAuth
  target=(--collector "https://localhost:$COLLECTOR_PORT" --tls-ca "$TLS_PKI/ca.pem"
    --tls-cert "$TLS_PKI/bench-node.pem" --tls-key "$TLS_PKI/bench-node.key")
fi

say "agent: $ticks ticks at 10 ms on the fixtures and 8 fake GPUs${TLS_PKI:+, over mutual TLS}"
/usr/bin/time -v -o "$dir/agent.time" "$AGENT" --nvml-lib "$FAKE_NVML" \
  --procfs-root "$FIXTURES/proc" --sysfs-root "$FIXTURES/sys" --node bench-node \
  "${target[@]}" --interval 10ms \
  --ticks "$ticks" --log warn >"$dir/agent.out" 2>"$dir/agent.log" &
timed=$!
# The resident memory's two parts, from the agent's /proc status every
# 500 ms: anonymous (heap, stacks) and file-backed (its executable's and
# libraries' pages mapped from the page cache).
# The agent is /usr/bin/time's child: found once time has started it.
pid=
while [[ -z $pid ]] && kill -0 "$timed" 2>/dev/null; do
  pid=$(pgrep -P "$timed" | head -1) || true
  [[ -n $pid ]] || sleep 0.05
done
while [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; do
  awk '/^RssAnon/ { a = $2 } /^RssFile/ { f = $2 } END { if (a) print a, f }' \
    "/proc/$pid/status" 2>/dev/null || true
  sleep 0.5
done >"$dir/rss.txt"
wait "$timed" || die "the agent failed: $(tail -5 "$dir/agent.log")"
stop_collector

cpu=$(tv_cpu "$dir/agent.time")
machine
printf 'agent: %s ticks, %s CPU seconds (%s µs per tick), peak RSS %s MB, wall %s\n' \
  "$ticks" "$cpu" "$(awk -v c="$cpu" -v t="$ticks" 'BEGIN { printf "%.0f", c / t * 1e6 }')" \
  "$(tv_rss_mb "$dir/agent.time")" "$(tv "$dir/agent.time" "Elapsed (wall clock)")"
[[ -s $dir/rss.txt ]] || die "no sample of the agent's /proc status was taken"
awk '{ if ($1 > a) a = $1; if ($2 > f) f = $2 } END {
  printf "  of it at most: anonymous %.1f MB, file-backed (the executable and libraries mapped) %.1f MB\n",
    a * 1024 / 1e6, f * 1024 / 1e6 }' "$dir/rss.txt"
