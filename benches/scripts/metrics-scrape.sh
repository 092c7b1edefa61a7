#!/usr/bin/env bash
# Whole-process CPU per /metrics scrape: the release gputel agent (fake
# NVML's 8 H100s, the fixture trees, --interval 1s, streaming to a release
# collector whose CPU is not counted) beside Prometheus' node_exporter (the
# same fixture trees, default collectors), both scraped the same way in the
# same run: RATE times a second for DURATION seconds over a kept-alive
# connection with `Accept-Encoding: ENCODING` (Prometheus sends gzip). A
# second agent and a second node_exporter run beside them unscraped; the CPU
# per scrape is the difference over the scrapes (see scrape-cpu.py). A pair
# of nginx servers (Debian's package) serve the agent's own page as a file
# in the same run: the floor a scrape of those bytes costs on this machine.
#
#   benches/scripts/metrics-scrape.sh [DURATION] [RATE] [ENCODING]
#   # defaults: 300 s, 1 scrape/s, gzip; ENCODING identity for plain text
#
# GPUTEL_BENCH_AGENT=/path/to/gputel-agent measures another agent build
# (an older one, for a before/after) on the same fake NVML and fixtures.
cd "$(dirname "$0")/../.."
source benches/scripts/common.sh
source scripts/lib/tools.sh

duration=${1:-300}
rate=${2:-1}
encoding=${3:-gzip}
build_release
[[ -x $AGENT ]] || die "no agent at $AGENT"
ensure_node_exporter
ensure_nginx
command -v python3 >/dev/null || die "python3 is missing (Debian: apt-get install python3)"
dir=$(mktemp -d)
trap 'set +e; [[ -n ${COLLECTOR_PID:-} ]] && pkill -P "$COLLECTOR_PID"; rm -rf "$dir"; true' EXIT

start_collector "$dir"
say "$AGENT and $GPUTEL_NODE_EXPORTER, scraped $rate time(s) a second for $duration s (Accept-Encoding: $encoding)"
python3 benches/scripts/scrape-cpu.py --agent "$AGENT" --nvml-lib "$FAKE_NVML" \
  --fixtures "$FIXTURES" --node-exporter "$GPUTEL_NODE_EXPORTER" --nginx "$GPUTEL_NGINX" \
  --collector "http://127.0.0.1:$COLLECTOR_PORT" --duration "$duration" --rate "$rate" \
  --accept-encoding "$encoding" --logs "$dir" ${GPUTEL_BENCH_JSON:+--json "$GPUTEL_BENCH_JSON"}
stop_collector
machine
printf 'agent: %s; node_exporter: %s; %s\n' "$AGENT" \
  "$("$GPUTEL_NODE_EXPORTER" --version 2>&1 | head -1)" "$("$GPUTEL_NGINX" -v 2>&1)"
