#!/usr/bin/env bash
# How far bytes per value are from the values' entropy, on the compacted
# hour of NODES simulated nodes that vs-victoriametrics.sh compares
# (hour_store in common.sh): each metric column's empirical entropy, of its
# values and of their first and second differences, with one code a column
# and one a series, beside the bytes its Parquet chunks take
# (entropy-floor.py says what the estimates can and cannot say).
#
#   benches/scripts/entropy-floor.sh [NODES] [VALUES]   # default 16 realistic
cd "$(dirname "$0")/../.."
source benches/scripts/common.sh
source scripts/lib/tools.sh

nodes=${1:-16}
values=${2:-realistic}
build_release
ensure_duckdb
command -v python3 >/dev/null || die "python3 is missing (Debian: apt-get install python3)"
hour_store "$nodes" 360 "$values"
machine
python3 benches/scripts/entropy-floor.py "$DUCKDB" "$compacted"
