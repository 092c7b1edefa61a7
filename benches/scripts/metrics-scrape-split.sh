#!/usr/bin/env bash
# CPU of the agent's network thread per /metrics scrape: the first scrape of
# a tick (render, gzip, exchange) and a second one of the same tick (the
# exchange alone), for one or more agent builds side by side (see
# scrape-split.py). Builds the release programs unless GPUTEL_BENCH_NO_BUILD=1.
#
#   benches/scripts/metrics-scrape-split.sh [SCRAPES] [AGENT...]
#   # defaults: 60 ticks, the release agent
cd "$(dirname "$0")/../.."
source benches/scripts/common.sh

scrapes=${1:-60}
shift || true
build_release
(($# > 0)) || set -- "$AGENT"
command -v python3 >/dev/null || die "python3 is missing (Debian: apt-get install python3)"
dir=$(mktemp -d)
trap 'set +e; [[ -n ${COLLECTOR_PID:-} ]] && pkill -P "$COLLECTOR_PID"; rm -rf "$dir"; true' EXIT

start_collector "$dir"
say "$*: $scrapes ticks, two gzip scrapes a tick"
python3 benches/scripts/scrape-split.py --nvml-lib "$FAKE_NVML" --fixtures "$FIXTURES" \
  --collector "http://127.0.0.1:$COLLECTOR_PORT" --scrapes "$scrapes" "$@"
stop_collector
machine
