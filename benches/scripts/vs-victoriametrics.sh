#!/usr/bin/env bash
# Stored size side by side with VictoriaMetrics: one hour of NODES simulated
# nodes (8 GPUs, 4 InfiniBand ports each) at 1 Hz, written by the release
# collector from `gputel-loadgen` in 360 flushes, as 10 s flushes make an
# hour, and compacted into one file per table (hour_store in common.sh,
# kept in target/bench-query); the same values exported
# from the compacted Parquet with DuckDB and imported into Debian's
# VictoriaMetrics (installed when missing), flushed and merged. Prints bytes
# per metric value per table for both, and the ratio.
#
#   benches/scripts/vs-victoriametrics.sh [NODES] [realistic|noise]   # default 16 realistic
#
# A metric value is a non-null value of a numeric, non-key column (those
# the simulator fills: 12 per gpu row and the energy counter every 10 s,
# 11 per node row, 5 per ib row; benches/README.md), read from the
# compacted file's own schema, so both stores get the same columns:
# counters, not rates, where the table holds counters. In VictoriaMetrics
# each column is a metric, labelled by node and GPU, or by node, device
# and port; job ids are left out (as labels they would only add series).
# Its size is its whole storage directory (data and index) after a forced
# merge.
cd "$(dirname "$0")/../.."
source benches/scripts/common.sh

nodes=${1:-16}
values=${2:-realistic}
DUCKDB=${GPUTEL_DUCKDB:-$(pwd)/target/tools/venv/bin/duckdb}
[[ -x $DUCKDB ]] || die "the DuckDB CLI is missing: run scripts/test once, or set GPUTEL_DUCKDB"
if ! command -v victoria-metrics >/dev/null; then
  say "installing VictoriaMetrics (apt-get install victoria-metrics)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q victoria-metrics >/dev/null \
    || die "cannot install victoria-metrics"
fi
build_release
# 360 files: an hour of one file is not compacted, and would be measured
# with the flush files' settings.
hour_store "$nodes" 360 "$values"
dir=$(mktemp -d)
trap 'set +e; [[ -n ${VM_PID:-} ]] && kill "$VM_PID"; wait; rm -rf "$dir"; true' EXIT

machine
echo "VictoriaMetrics $(dpkg-query -W -f '${Version}' victoria-metrics 2>/dev/null || echo "(not from a Debian package)")"

declare -A keys
keys[gpu]="node gpu"
keys[node]="node"
keys[ib]="node device port"

# The metric columns of a file: numeric, not a key, with a value somewhere.
metric_columns() { # FILE KEYS...
  local file=$1 names counts
  shift
  local keys_in
  # date and hour: the partition columns DuckDB reads from the file's path.
  keys_in=$(printf "'%s'," ts date hour "$@")
  names=$("$DUCKDB" -noheader -list -c "SELECT column_name FROM (DESCRIBE SELECT * FROM '$file')
    WHERE (column_type IN ('TINYINT', 'SMALLINT', 'INTEGER', 'BIGINT', 'UTINYINT', 'USMALLINT',
                           'UINTEGER', 'UBIGINT', 'FLOAT', 'DOUBLE')
           OR column_type LIKE 'DECIMAL%')
      AND column_name NOT IN (${keys_in%,})")
  [[ -n $names ]] || die "$file: no numeric columns"
  read -ra names <<<"$(echo $names)"
  counts=$("$DUCKDB" -noheader -list -c "SELECT $(printf 'count(%s) > 0,' "${names[@]}" | sed 's/,$//') FROM '$file'")
  IFS='|' read -ra counts <<<"$counts"
  for i in "${!names[@]}"; do
    [[ ${counts[$i]} == true ]] && printf '%s ' "${names[$i]}"
  done
}

vm_port=$(free_port)
victoria-metrics -storageDataPath "$dir/vm" -httpListenAddr "127.0.0.1:$vm_port" \
  -retentionPeriod 100y -loggerLevel ERROR >"$dir/vm.log" 2>&1 &
VM_PID=$!
wait_port "$vm_port"

declare -A gputel_bytes table_values
for t in gpu node ib; do
  files=("$compacted/$t"/date=*/hour=*/c-*.parquet)
  [[ ${#files[@]} -eq 1 ]] || die "$t: expected one compacted file (c-*.parquet), found ${#files[@]}"
  gputel_bytes[$t]=$(stat -c %s "${files[0]}")
  read -ra k <<<"${keys[$t]}"
  read -ra c <<<"$(metric_columns "${files[0]}" "${k[@]}")"
  echo "$t: ${#c[@]} metric columns: ${c[*]}"
  count=$(printf 'count(%s)+' "${c[@]}")
  table_values[$t]=$("$DUCKDB" -noheader -list -c "SELECT ${count%+} FROM '${files[0]}'")
  # node, [gpu | device, port], time in ms, then the value: one CSV per
  # metric, of the rows that hold it (VictoriaMetrics skips a CSV line with
  # an empty field, and the energy counter is read every tenth tick).
  label_format="" i=1
  for name in "${k[@]}"; do label_format+="$i:label:$name,"; i=$((i + 1)); done
  for name in "${c[@]}"; do
    select=$(IFS=,; echo "${k[*]},epoch_ms(ts),$name")
    "$DUCKDB" -c "COPY (SELECT $select FROM '${files[0]}' WHERE $name IS NOT NULL)
      TO '$dir/$t.csv' (HEADER false)"
    format="${label_format}$i:time:unix_ms,$((i + 1)):metric:${t}_$name"
    curl -sf --data-binary "@$dir/$t.csv" "http://127.0.0.1:$vm_port/api/v1/import/csv?format=$format" \
      || die "VictoriaMetrics refused the import of $t.$name: $(tail -3 "$dir/vm.log")"
  done
done
curl -sf "http://127.0.0.1:$vm_port/internal/force_flush" >/dev/null
curl -sf "http://127.0.0.1:$vm_port/internal/force_merge?partition_prefix=2024_06" >/dev/null
# The merge runs in the background: wait until the directory stops changing.
last=-1
for ((i = 0; i < 120; i++)); do
  sleep 2
  now=$(du -sb "$dir/vm" | cut -f1)
  [[ $now == "$last" ]] && break
  last=$now
done
# Every value imported? VictoriaMetrics counts the rows it stored.
stored=$(curl -sf "http://127.0.0.1:$vm_port/metrics" \
  | awk '/^vm_rows\{type="storage\/(big|small)"\}/ { s += $2 } END { print s + 0 }')
vm_bytes=$(du -sb "$dir/vm" | cut -f1)
kill "$VM_PID"
wait "$VM_PID" 2>/dev/null || true
VM_PID=

total_values=$((table_values[gpu] + table_values[node] + table_values[ib]))
total_bytes=$((gputel_bytes[gpu] + gputel_bytes[node] + gputel_bytes[ib]))
echo "values ($values): gpu ${table_values[gpu]}, node ${table_values[node]}, ib ${table_values[ib]}; all $total_values; stored by VictoriaMetrics: $stored"
[[ $stored -eq $total_values ]] \
  || die "VictoriaMetrics stored $stored values of $total_values: the sizes would not compare"
for t in gpu node ib; do
  awk -v t="$t" -v b="${gputel_bytes[$t]}" -v v="${table_values[$t]}" \
    'BEGIN { printf "gputel %-4s  %10d bytes  %.3f bytes/value\n", t, b, b / v }'
done
awk -v b="$total_bytes" -v v="$total_values" -v m="$vm_bytes" 'BEGIN {
  printf "gputel all   %10d bytes  %.3f bytes/value (compacted Parquet, gpu + node + ib)\n", b, b / v
  printf "VictoriaMetrics %7d bytes  %.3f bytes/value (storage directory after a forced merge)\n", m, m / v
  printf "ratio VictoriaMetrics / gputel: %.2f\n", m / b
}'
