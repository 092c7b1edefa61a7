#!/usr/bin/env bash
# Side by side with Prometheus' node_exporter: both read the same fixture
# /proc and /sys trees (tests/fixtures) once a second for DURATION seconds,
# one after the other, each under `/usr/bin/time -v`:
#
# - node_exporter (Debian's prometheus-node-exporter, unpacked under
#   target/tools without installing or starting the service), its default
#   collectors, scraped once a second by curl;
# - the release gputel agent at --interval 1s, streaming to a release
#   collector on loopback (whose CPU is not counted), once with GPUs off
#   (--nvml-lib pointing nowhere: host and IB only, node_exporter's scope)
#   and once on the fake NVML's 8 H100s.
#
#   benches/scripts/vs-node-exporter.sh [DURATION]   # seconds, default 300
cd "$(dirname "$0")/../.."
source benches/scripts/common.sh
source scripts/lib/tools.sh

duration=${1:-300}
build_release
ne="$tools_dir/node-exporter/usr/bin/prometheus-node-exporter"
if [[ ! -x $ne ]]; then
  command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null \
    || die "node_exporter is not unpacked at $ne and apt-get is missing to fetch it"
  say "fetching Debian's prometheus-node-exporter (unpacked in $tools_dir/node-exporter)"
  deb_dir=$(mktemp -d)
  (cd "$deb_dir" && apt-get download -qq prometheus-node-exporter >/dev/null 2>&1) \
    || die "apt-get download prometheus-node-exporter failed (run apt-get update?)"
  mkdir -p "$tools_dir/node-exporter"
  dpkg-deb -x "$deb_dir"/prometheus-node-exporter_*.deb "$tools_dir/node-exporter"
  rm -rf "$deb_dir"
fi
command -v curl >/dev/null || die "curl is missing (Debian: apt-get install curl)"
dir=$(mktemp -d)
# The programs run under /usr/bin/time: stop its children.
trap 'set +e; pkill -P "${NE_PID:-0}"; pkill -P "${COLLECTOR_PID:-0}"; rm -rf "$dir"; true' EXIT

say "node_exporter $("$ne" --version 2>&1 | head -1 | awk '{print $3}'), scraped at 1 Hz for $duration s"
port=$(free_port)
/usr/bin/time -v -o "$dir/ne.time" "$ne" --path.procfs "$FIXTURES/proc" \
  --path.sysfs "$FIXTURES/sys" --web.listen-address "127.0.0.1:$port" \
  --log.level warn 2>"$dir/ne.log" &
NE_PID=$!
wait_port "$port"
bytes=0
for ((i = 0; i < duration; i++)); do
  next=$(($(date +%s%N) + 1000000000))
  bytes=$(curl -sf "http://127.0.0.1:$port/metrics" | wc -c)
  sleep "$(awk -v n="$next" -v t="$(date +%s%N)" 'BEGIN { d = (n - t) / 1e9; printf "%.3f", (d > 0 ? d : 0) }')"
done
pkill -TERM -P "$NE_PID"
wait "$NE_PID" || true

start_collector "$dir"
run_agent() { # name, nvml library
  /usr/bin/time -v -o "$dir/$1.time" "$AGENT" --nvml-lib "$2" \
    --procfs-root "$FIXTURES/proc" --sysfs-root "$FIXTURES/sys" --node bench-node \
    --plaintext --collector "http://127.0.0.1:$COLLECTOR_PORT" --interval 1s \
    --ticks "$duration" --log error >"$dir/$1.out" 2>"$dir/$1.log" \
    || die "the agent failed: $(tail -5 "$dir/$1.log")"
}
say "gputel agent without GPUs, $duration ticks at 1 s"
run_agent agent-host "$dir/no-such-libnvidia-ml.so"
say "gputel agent with 8 fake GPUs, $duration ticks at 1 s"
run_agent agent-gpu "$FAKE_NVML"
stop_collector

machine
printf '%-40s %12s %14s %10s\n' "$duration s at 1 Hz" "CPU seconds" "CPU per tick" "peak RSS"
row() {
  local cpu
  cpu=$(tv_cpu "$2")
  printf '%-40s %12s %11s ms %7s MB\n' "$1" "$cpu" \
    "$(awk -v c="$cpu" -v d="$duration" 'BEGIN { printf "%.2f", c / d * 1e3 }')" "$(tv_rss_mb "$2")"
}
row "node_exporter ($bytes bytes a scrape)" "$dir/ne.time"
row "gputel agent, host and IB only" "$dir/agent-host.time"
row "gputel agent, host, IB and 8 GPUs" "$dir/agent-gpu.time"
