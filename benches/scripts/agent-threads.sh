#!/usr/bin/env bash
# Where the agent's CPU goes on a real GPU, thread by thread.
#
#   benches/scripts/agent-threads.sh BIN_DIR OUT_DIR [IDLE_S] [LOADED_S]
#
# BIN_DIR holds release gputel-agent and gputel-collector. Runs a collector
# (--plaintext on loopback) and an agent with `--sources gpu` at 1 s, and
# reads each of the agent's threads' time on a CPU (/proc/PID/task/TID/
# schedstat, nanoseconds; utime and stime from stat, in clock ticks) after a
# 5 s start, after IDLE_S more seconds (default 30) with the GPU idle, and
# after LOADED_S seconds (default 30) of bf16 matrix products on GPU 0
# (PyTorch). threads.txt holds one line per thread and reading:
# `reading seconds_since_start comm tid run_ns utime stime`.
#
# Before the agent starts, event-wait.json gives what NVML's XID wait costs
# alone (nvidia-ml-py): the calling thread's CPU over 8 s of
# nvmlEventSetWait_v2 at the agent's 500 ms timeout and at 5 s. Needs
# python3 with nvidia-ml-py, and PyTorch with CUDA for the load.
set -euo pipefail

bin=$(cd "${1:?usage: agent-threads.sh BIN_DIR OUT_DIR [IDLE_S] [LOADED_S]}" && pwd)
out=${2:?usage: agent-threads.sh BIN_DIR OUT_DIR [IDLE_S] [LOADED_S]}
idle=${3:-30}
loaded=${4:-30}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/../.."
source benches/scripts/common.sh
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT

say "NVML's XID wait alone"
python3 - >"$out/event-wait.json" <<'EOF'
import json, time
import pynvml as N

N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
es = N.nvmlEventSetCreate()
N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError, es)
out = {}
for timeout_ms in (500, 5000):
    waits = 0
    cpu0, wall0 = time.thread_time(), time.monotonic()
    while time.monotonic() - wall0 < 8:
        try:
            N.nvmlEventSetWait_v2(es, timeout_ms)
        except N.NVMLError_Timeout:
            pass
        waits += 1
    cpu, wall = time.thread_time() - cpu0, time.monotonic() - wall0
    out[f"timeout_{timeout_ms}ms"] = {
        "waits": waits,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 4),
        "cpu_ms_per_s": round(1000 * cpu / wall, 3),
    }
N.nvmlEventSetFree(es)
print(json.dumps(out, indent=1))
EOF
cat "$out/event-wait.json" >&2

say "collector and agent (--sources gpu)"
"$bin/gputel-collector" --plaintext --listen 127.0.0.1:7117 \
  --store "$work/store" --wal-dir "$work/wal" 2>"$out/collector.log" &
wait_port 7117
"$bin/gputel-agent" --collector http://127.0.0.1:7117 --plaintext --sources gpu \
  2>"$out/agent.log" &
agent=$!
start=$(date +%s.%N)

threads() {
  local now t
  now=$(date +%s.%N)
  for t in /proc/"$agent"/task/*; do
    printf '%s %.1f %s %s %s %s\n' "$1" "$(awk -v a="$now" -v b="$start" 'BEGIN { print a - b }')" "$(cat "$t/comm")" \
      "${t##*/}" "$(cut -d' ' -f1 "$t/schedstat")" "$(awk '{print $14, $15}' "$t/stat")"
  done >>"$out/threads.txt"
}

sleep 5
threads started
sleep "$idle"
threads idle
say "bf16 products for ${loaded} s"
python3 - "$((loaded + 10))" <<'EOF' &
import sys, time
import torch

a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
deadline = time.time() + float(sys.argv[1])
while time.time() < deadline:
    a @ b
    torch.cuda.synchronize()
EOF
load=$!
sleep 5
threads load_started
sleep "$loaded"
threads loaded
kill -INT "$agent"
wait "$agent" || true
wait "$load" || true
echo "loadavg $(cat /proc/loadavg)" >>"$out/threads.txt"

# CPU milliseconds per second of each thread over each interval.
python3 - "$out/threads.txt" <<'EOF' | tee "$out/summary.txt" >&2
import collections, sys
rows = collections.defaultdict(dict)
at = {}
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "loadavg":
        print(line.strip())
        continue
    reading, t, comm, tid, ns = f[0], float(f[1]), f[2], f[3], int(f[4])
    rows[(comm, tid)][reading] = ns
    at[reading] = t
for a, b, name in (("started", "idle", "idle"), ("load_started", "loaded", "bf16 products")):
    span = at[b] - at[a]
    total = 0.0
    print(f"{name}: {span:.1f} s")
    for (comm, tid), r in sorted(rows.items()):
        if a in r and b in r:
            ms = (r[b] - r[a]) / 1e6 / span
            total += ms
            print(f"  {comm:<16} {tid:>7} {ms:8.3f} ms CPU per s")
    print(f"  {'all threads':<24} {total:8.3f} ms CPU per s")
EOF
