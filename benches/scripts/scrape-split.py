#!/usr/bin/env python3
"""What one /metrics scrape costs the agent's network thread, split into the
first scrape of a tick (render, compression and the HTTP exchange) and a
second scrape of the same tick (the exchange alone, the page cached).

Run by benches/scripts/metrics-scrape-split.sh, which builds the programs and
starts the collector. Starts one agent per path given (fake NVML, fixture
trees, --interval 1s) and, N times, once a tick each: reads the CPU time of
the agent's main thread, which runs its tokio runtime and so serves
/metrics (`/proc/PID/task/PID/schedstat`, nanoseconds), scrapes once with
`Accept-Encoding: gzip`, waits 20 ms and reads it again; then scrapes again
the same way. The agents are scraped in turn, a quarter of a second apart,
away from their ticks. Prints the median and the 10th and 90th percentiles of
each, per agent: a per-thread figure with less noise than the difference of
two whole processes that `scrape-cpu.py` reports, for comparing builds.
"""

import argparse
import http.client
import importlib.util
import os
import statistics
import subprocess
import sys
import time

# How scrape-cpu.py starts an agent and waits for its port, shared.
_spec = importlib.util.spec_from_file_location(
    "scrape_cpu", os.path.join(os.path.dirname(os.path.abspath(__file__)), "scrape-cpu.py"))
scrape_cpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scrape_cpu)


def thread_cpu_ns(pid):
    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nvml-lib", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--collector", required=True, help="the agents' collector URL")
    ap.add_argument("--scrapes", type=int, default=60)
    ap.add_argument("agents", nargs="+")
    args = ap.parse_args()

    procs = []
    try:
        for i, agent in enumerate(args.agents):
            port = scrape_cpu.free_port()
            argv = scrape_cpu.agent_argv(agent, args.nvml_lib, args.fixtures, args.collector,
                                         port, node=f"bench-node-{i}")
            procs.append((agent, subprocess.Popen(argv, stdout=subprocess.DEVNULL), port))
        for agent, p, port in procs:
            scrape_cpu.wait_port(port, p, agent)
        conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=10) for _, _, port in procs]

        def scrape(pid, conn):
            before = thread_cpu_ns(pid)
            conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                sys.exit(f"error: /metrics answered {response.status}")
            time.sleep(0.02)
            return (thread_cpu_ns(pid) - before) / 1e6

        figures = [([], []) for _ in procs]
        start = int(time.time()) + 1
        # Two rounds to warm up, left out.
        for k in range(args.scrapes + 2):
            for i, ((_, p, _), conn) in enumerate(zip(procs, conns)):
                if p.poll() is not None:
                    sys.exit(f"error: {args.agents[i]} exited with {p.returncode}")
                time.sleep(max(0.0, start + k + 0.25 * (i + 1) - time.time()))
                first = scrape(p.pid, conn)
                cached = scrape(p.pid, conn)
                if k >= 2:
                    figures[i][0].append(first)
                    figures[i][1].append(cached)
    finally:
        for _, p, _ in procs:
            p.terminate()
            p.wait()

    print(f"{args.scrapes} ticks; CPU of the agent's network thread per scrape, ms "
          "(median, 10th-90th percentile)")
    for (agent, _, _), (first, cached) in zip(procs, figures):
        def fmt(xs):
            deciles = statistics.quantiles(xs, n=10)
            return f"{statistics.median(xs):.3f} ({deciles[0]:.3f}-{deciles[-1]:.3f})"
        print(f"{agent}: first of a tick {fmt(first)}; again, cached {fmt(cached)}")
    print("load average at the end:", scrape_cpu.loadavg())


if __name__ == "__main__":
    main()
