#!/usr/bin/env bash
# How far bytes per value are from the values' entropy: for the compacted hour of NODES simulated
# nodes that vs-victoriametrics.sh compares (hour_store in common.sh), each
# metric column's empirical entropy per series, of its values and of their
# first and second differences, beside the bytes its Parquet chunks take
# (entropy-floor.py says what the floor is a floor for).
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
