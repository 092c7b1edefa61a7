#!/usr/bin/env bash
# Records gputel on a machine with NVIDIA GPUs, beside nvidia-smi.
#
#   benches/scripts/real-gpu.sh BIN_DIR OUT_DIR [TICKS]
#
# BIN_DIR holds release gputel-agent and gputel-collector (built elsewhere is
# fine: the script needs no Rust toolchain); OUT_DIR receives what it
# records. Needs nvidia-smi, python3 with nvidia-ml-py (pynvml) and, for the
# load, PyTorch with CUDA. Runs, all at once, for TICKS seconds (default
# 300):
#
#   - a collector (--plaintext on loopback, the default flush interval) and
#     an agent at 1 s with --hpc-job-mapping-dir and --metrics-listen;
#   - nvidia-smi --query-gpu, every 250 ms, with every field this driver
#     knows of those the agent also reads (nvidia-smi.csv);
#   - gpu-load.py on GPU 0: idle, bf16 products, memory held, a duty cycle,
#     copies, fp32 products, freed (load.csv gives each phase's start); it
#     writes job 4242 into the job-mapping file while it holds the GPU.
#
# and, before and during the load, nvml-calls.py (each per-tick NVML call
# timed, GPM and XID registration checked), `gputel-agent --once`,
# `nvidia-smi -q -x`, and a /metrics page. The agent's and collector's CPU
# and peak RSS come from wait4() (rusage.txt), the load average at the start
# and end of the run from /proc/loadavg (loadavg.txt). The store is packed into
# store.tar.gz; benches/scripts/vs-nvidia-smi.sh compares it with
# nvidia-smi.csv.gz.
set -euo pipefail

bin=$(cd "${1:?usage: real-gpu.sh BIN_DIR OUT_DIR [TICKS]}" && pwd)
out=${2:?usage: real-gpu.sh BIN_DIR OUT_DIR [TICKS]}
ticks=${3:-300}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT

say() { printf '==> %s\n' "$*" >&2; }

# Runs a command, writing its pid to $1.pid and, once it exits, its user and
# system CPU seconds and peak RSS (wait4) to $1.rusage.
rusage() {
  local name=$1
  shift
  python3 -c '
import os, resource, subprocess, sys
p = subprocess.Popen(sys.argv[2:])
open(sys.argv[1] + ".pid", "w").write(str(p.pid))
_, status, ru = os.wait4(p.pid, 0)
open(sys.argv[1] + ".rusage", "w").write(
    f"user_s={ru.ru_utime:.3f} sys_s={ru.ru_stime:.3f} maxrss_kb={ru.ru_maxrss} status={status}\n")
' "$work/$name" "$@"
}

scrape() {
  python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:9400/metrics").read().decode(), end="")'
}

say "machine"
{
  nvidia-smi
  uname -a
  grep -m1 'model name' /proc/cpuinfo
  nproc
  python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))' || true
} >"$out/machine.txt" 2>&1
nvidia-smi -q -x >"$out/nvidia-smi-q-idle.xml" || true
"$bin/gputel-agent" --once >"$out/once-idle.json" 2>"$out/once-idle.log" || true

# The nvidia-smi fields this driver knows, of those the agent reads.
fields=()
for f in timestamp index uuid name pci.bus_id temperature.gpu temperature.memory \
  power.draw power.draw.instant power.draw.average enforced.power.limit clocks.sm \
  clocks.mem clocks.gr clocks.video utilization.gpu utilization.memory \
  utilization.encoder utilization.decoder memory.total memory.reserved memory.used \
  memory.free pstate clocks_event_reasons.active ecc.errors.corrected.volatile.total \
  ecc.errors.uncorrected.volatile.total pcie.link.gen.gpucurrent pcie.link.gen.max \
  pcie.link.width.current pcie.link.width.max fan.speed mig.mode.current; do
  if nvidia-smi --query-gpu="$f" --format=csv,noheader >/dev/null 2>&1; then fields+=("$f"); fi
done
query=$(IFS=,; echo "${fields[*]}")
echo "$query" >"$out/nvidia-smi-fields.txt"

say "NVML calls, idle"
python3 "$here/nvml-calls.py" --label idle >"$out/nvml-calls-idle.json" || true

say "collector and agent, $ticks ticks"
echo "start $(cat /proc/loadavg)" >"$out/loadavg.txt"
mkdir -p "$work/jobmap"
rusage collector "$bin/gputel-collector" --plaintext --listen 127.0.0.1:7117 \
  --store "$work/store" --wal-dir "$work/wal" 2>"$out/collector.log" &
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/7117) 2>/dev/null && break; sleep 0.1; done
nvidia-smi --query-gpu="$query" --format=csv,nounits -lms 250 >"$out/nvidia-smi.csv" &
smi_job=$!
rusage agent "$bin/gputel-agent" --collector http://127.0.0.1:7117 --plaintext \
  --ticks "$ticks" --hpc-job-mapping-dir "$work/jobmap" --metrics-listen 127.0.0.1:9400 \
  2>"$out/agent.log" &
agent_job=$!
python3 "$here/gpu-load.py" --jobmap "$work/jobmap/0" >"$out/load.csv" 2>"$out/load.log" &
load_job=$!

sleep 15
scrape >"$out/metrics-idle.prom" || true
sleep 45
say "NVML calls, under bf16 products"
scrape >"$out/metrics-loaded.prom" || true
python3 "$here/nvml-calls.py" --label loaded >"$out/nvml-calls-loaded.json" || true
nvidia-smi -q -x >"$out/nvidia-smi-q-loaded.xml" || true
"$bin/gputel-agent" --once >"$out/once-loaded.json" 2>"$out/once-loaded.log" || true

wait "$load_job" || say "the load exited with $?"
wait "$agent_job" || say "the agent exited with $?"
echo "end $(cat /proc/loadavg)" >>"$out/loadavg.txt"
kill -TERM "$smi_job" "$(cat "$work/collector.pid")"
wait
sed 's/^/agent /' "$work/agent.rusage" >"$out/rusage.txt"
sed 's/^/collector /' "$work/collector.rusage" >>"$out/rusage.txt"
tar -C "$work" -czf "$out/store.tar.gz" store
gzip -9f "$out/nvidia-smi.csv"
say "done: $out"
