# Shared by the scripts in benches/scripts: builds the release programs, finds
# free ports, waits for them, and reads `/usr/bin/time -v` reports.
# Sourced from the repository root (each script cd's there first).

set -euo pipefail

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# GPUTEL_BENCH_PROFILE=dist measures the profile the packages are built with
# (Cargo.toml, profile.dist); the default is the release profile, quicker to
# build. The packaged collector is also compiled with profile-guided
# optimization: after scripts/package, measure it with
# GPUTEL_BENCH_COLLECTOR=target/pgo/dist/gputel-collector.
PROFILE="${GPUTEL_BENCH_PROFILE:-release}"
REL="$(pwd)/target/$PROFILE"
# GPUTEL_BENCH_COLLECTOR=/path/to/gputel-collector measures another collector
# build (an older commit's, say) with the same scripts and load generator.
COLLECTOR="${GPUTEL_BENCH_COLLECTOR:-$REL/gputel-collector}"
# GPUTEL_BENCH_AGENT does the same for the agent.
AGENT="${GPUTEL_BENCH_AGENT:-$REL/gputel-agent}"
LOADGEN="$REL/gputel-loadgen"
FAKE_NVML="$REL/libgputel_fake_nvml.so"
FIXTURES="$(pwd)/tests/fixtures"

# The release collector, agent, load generator and fake NVML. Set
# GPUTEL_BENCH_NO_BUILD=1 to use what target/release (target/$PROFILE)
# already holds.
build_release() {
  if [[ ${GPUTEL_BENCH_NO_BUILD:-} != 1 ]]; then
    say "building the programs (cargo build --profile $PROFILE)"
    cargo build --profile "$PROFILE" --quiet -p gputel-collector -p gputel-agent \
      -p gputel-benches -p gputel-fake-nvml
  fi
  for f in "$COLLECTOR" "$AGENT" "$LOADGEN" "$FAKE_NVML"; do
    [[ -e $f ]] || die "$f is missing: run without GPUTEL_BENCH_NO_BUILD=1 to build it"
  done
  [[ -x /usr/bin/time ]] || die "/usr/bin/time is missing (Debian: apt-get install time)"
}

# A TCP port nothing listens on now.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits (up to 60 s) until something accepts connections on 127.0.0.1:$1.
wait_port() {
  local i
  for ((i = 0; i < 600; i++)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  die "nothing listens on 127.0.0.1:$1 after 60 s"
}

# A field of a `/usr/bin/time -v` report, e.g. tv FILE "Maximum resident set size".
tv() {
  grep -F "$2" "$1" | head -1 | awk -F': ' '{print $2}'
}

# User plus system CPU seconds of a `/usr/bin/time -v` report.
tv_cpu() {
  awk -v u="$(tv "$1" "User time (seconds)")" -v s="$(tv "$1" "System time (seconds)")" \
    'BEGIN { printf "%.2f", u + s }' 
}

# Peak RSS of a `/usr/bin/time -v` report, in MB (10^6 bytes).
tv_rss_mb() {
  awk -v k="$(tv "$1" "Maximum resident set size")" 'BEGIN { printf "%.1f", k * 1024 / 1e6 }' 
}

# The machine, for the results: CPU model, CPUs, kernel, load average.
machine() {
  printf 'machine: %s, %s CPUs, Linux %s; load average now: %s\n' \
    "$(lscpu | sed -n 's/^Model name: *//p' | head -1)" "$(nproc)" "$(uname -r)" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"
}

# With GPUTEL_BENCH_TLS=1, collector and agents (ingest.sh, collector-rss.sh,
# capacity.sh, agent-rss.sh) speak mutual TLS,
# as they do by default, instead of plaintext: tls_pki makes a CA and the
# collector's certificate under $1/pki (OpenSSL, EC P-256, as the README's
# *Security* shows), and node_certs one certificate per simulated node.
tls_pki() {
  local pki=$1/pki
  command -v openssl >/dev/null || die "openssl is missing (Debian: apt-get install openssl)"
  mkdir -p "$pki"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=gputel bench CA" -keyout "$pki/ca.key" -out "$pki/ca.pem" 2>/dev/null
  leaf_cert "$pki" collector "subjectAltName=DNS:localhost,IP:127.0.0.1" serverAuth
  TLS_PKI=$pki
}

# A certificate NAME.pem (key NAME.key) in PKI signed by its CA, with the
# extension SAN and the extended key usage USAGE.
leaf_cert() {
  local pki=$1 name=$2 san=$3 usage=$4
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=$name" \
    -addext "$san" -addext "basicConstraints=critical,CA:FALSE" -addext "extendedKeyUsage=$usage" \
    -CA "$pki/ca.pem" -CAkey "$pki/ca.key" -keyout "$pki/$name.key" -out "$pki/$name.pem" 2>/dev/null \
    || die "openssl could not make the certificate of $name"
}

# Certificates in $TLS_PKI for the load generator's AGENTS nodes
# (loadgen-1 … or loadgen-0001 …, as it names them).
node_certs() {
  local agents=$1 width=${#1} i name
  for ((i = 1; i <= agents; i++)); do
    printf -v name 'loadgen-%0*d' "$width" "$i"
    [[ -e $TLS_PKI/$name.pem ]] || leaf_cert "$TLS_PKI" "$name" "subjectAltName=DNS:$name" clientAuth
  done
}

# Starts a collector on a free port with store and WAL under $1, extra flags
# after it (its log at COLLECTOR_LOG, default warn); sets COLLECTOR_PID,
# COLLECTOR_PORT and COLLECTOR_TIME (its
# `/usr/bin/time -v` report, written when it exits). Plaintext, or mutual
# TLS with GPUTEL_BENCH_TLS=1.
start_collector() {
  local dir=$1
  shift
  COLLECTOR_PORT=$(free_port)
  COLLECTOR_TIME="$dir/collector.time"
  mkdir -p "$dir"
  local security=(--plaintext)
  if [[ ${GPUTEL_BENCH_TLS:-0} == 1 ]]; then
    tls_pki "$dir"
    security=(--tls-cert "$TLS_PKI/collector.pem" --tls-key "$TLS_PKI/collector.key"
      --tls-client-ca "$TLS_PKI/ca.pem")
  fi
  /usr/bin/time -v -o "$COLLECTOR_TIME" "$COLLECTOR" --listen "127.0.0.1:$COLLECTOR_PORT" \
    --store "$dir/store" --wal-dir "$dir/wal" "${security[@]}" --log "${COLLECTOR_LOG:-warn}" "$@" \
    2>"$dir/collector.log" &
  COLLECTOR_PID=$!
  wait_port "$COLLECTOR_PORT"
}

# Stops the collector with SIGTERM (it writes what it buffered) and waits.
stop_collector() {
  # /usr/bin/time passes nothing on: signal its child, the collector.
  pkill -TERM -P "$COLLECTOR_PID" 2>/dev/null || true
  wait "$COLLECTOR_PID" || die "the collector failed: $(tail -5 "$(dirname "$COLLECTOR_TIME")/collector.log")"
}

# Runs gputel-loadgen against the collector of start_collector under
# `/usr/bin/time -v`: AGENTS nodes of 8 GPUs sending TICKS ticks, more flags
# after them (e.g. --pace); its report, summary line and log go to
# DIR/loadgen.{time,out,log}. Sets LOAD_AT_END to the load average as it
# finished.
loadgen_run() {
  local dir=$1 agents=$2 ticks=$3
  shift 3
  local target=(--collector "http://127.0.0.1:$COLLECTOR_PORT")
  if [[ ${GPUTEL_BENCH_TLS:-0} == 1 ]]; then
    node_certs "$agents"
    target=(--collector "https://localhost:$COLLECTOR_PORT" --tls-ca "$TLS_PKI/ca.pem"
      --tls-cert "$TLS_PKI/{node}.pem" --tls-key "$TLS_PKI/{node}.key")
  fi
  /usr/bin/time -v -o "$dir/loadgen.time" "$LOADGEN" "${target[@]}" --agents "$agents" --gpus 8 \
    --ticks "$ticks" "$@" >"$dir/loadgen.out" 2>"$dir/loadgen.log" \
    || die "gputel-loadgen failed: $(tail -5 "$dir/loadgen.log")"
  LOAD_AT_END=$(cut -d' ' -f1-3 /proc/loadavg)
}

# What the stores below were written from: the simulator's and the load
# generator's source. A store made by another simulator is written again.
simulator_stamp() {
  cat benches/src/lib.rs benches/src/loadgen.rs | sha256sum | cut -c1-16
}

# Whether the store in $1 was finished by the current simulator.
store_done() {
  [[ -e $1/done && $(cat "$1/done") == "$(simulator_stamp)" ]]
}

# One hour (2024-06-12T12) of NODES simulated nodes sampled every second,
# written by the real collector in FILES flushes (by rows, as many as 10 s
# flushes make of an hour: 360), as flushed (not compacted: a fresh hour's
# many files) in target/bench-query/NODESx1s-hour-FILES/flushed and
# compacted in .../compacted; VALUES is gputel-loadgen's --values
# (default realistic; other values add -VALUES to the directory), or
# every-field for its realistic values with every field a real H100 node
# reports (`--every-field`). Sets $flushed and $compacted.
hour_store() {
  local nodes=$1 files=$2 values=${3:-realistic}
  local base values_flags=(--values "$values")
  [[ $values != every-field ]] || values_flags=(--every-field)
  base="$(pwd)/target/bench-query/${nodes}x1s-hour-${files}"
  [[ $values == realistic ]] || base+="-$values"
  flushed="$base/flushed"
  compacted="$base/compacted"
  if ! store_done "$base"; then
    rm -rf "$base"
    trap 'set +e; pkill -P "${COLLECTOR_PID:-0}"; true' EXIT
    # 13 rows a node and tick (8 GPUs, the node, 4 ports); no compaction
    # while it writes, and no flush by time. Plaintext, whatever
    # GPUTEL_BENCH_TLS says: this only makes the data.
    GPUTEL_BENCH_TLS=0 start_collector "$base" --flush-rows $((nodes * 3600 * 13 / files)) \
      --flush-interval 1h --compact-interval 0
    say "writing an hour (3600 ticks of 1 s) of $nodes nodes through the collector"
    "$LOADGEN" --collector "http://127.0.0.1:$COLLECTOR_PORT" --agents "$nodes" --gpus 8 \
      --ticks 3600 --interval-ms 1000 --start-ts 2024-06-12T12:00:00Z "${values_flags[@]}" \
      >"$base/loadgen.out" 2>"$base/loadgen.log" \
      || die "gputel-loadgen failed: $(tail -5 "$base/loadgen.log")"
    stop_collector
    trap - EXIT
    mv "$base/store" "$flushed"
    cp -r "$flushed" "$compacted"
    say "compacting a copy of the hour"
    "$COLLECTOR" compact --store "$compacted" >"$base/compact.log" 2>&1 \
      || die "compaction failed: $(tail -5 "$base/compact.log")"
    rm -rf "$base/wal"
    simulator_stamp >"$base/done"
  fi
}

# The benchmark day: INTERVAL-second ticks of NODES simulated nodes (8 GPUs,
# 4 IB ports each) on 2024-06-12, written by the real collector from
# `gputel-loadgen` and compacted by `gputel-collector compact`, as a serving
# collector would. Kept in target/bench-query/NODESxINTERVALs and reused by
# later runs while the simulator is unchanged (delete it to regenerate).
# Sets $store.
day_store() {
  local interval=$1 nodes=$2
  local ticks=$((86400 / interval))
  local base day=2024-06-12
  base="$(pwd)/target/bench-query/${nodes}x${interval}s"
  store="$base/store"
  if ! store_done "$base"; then
    rm -rf "$base"
    trap 'set +e; pkill -P "${COLLECTOR_PID:-0}"; true' EXIT
    GPUTEL_BENCH_TLS=0 start_collector "$base" # plaintext: this only makes the data
    say "writing a day ($ticks ticks of $interval s) of $nodes nodes through the collector"
    "$LOADGEN" --collector "http://127.0.0.1:$COLLECTOR_PORT" --agents "$nodes" --gpus 8 \
      --ticks "$ticks" --interval-ms $((interval * 1000)) --start-ts "${day}T00:00:00Z" \
      >"$base/loadgen.out" 2>"$base/loadgen.log" \
      || die "gputel-loadgen failed: $(tail -5 "$base/loadgen.log")"
    stop_collector
    trap - EXIT
    say "compacting the day's hours"
    "$COLLECTOR" compact --store "$store" >"$base/compact.log" 2>&1 \
      || die "compaction failed: $(tail -5 "$base/compact.log")"
    rm -rf "$base/wal"
    simulator_stamp >"$base/done"
  fi
}
