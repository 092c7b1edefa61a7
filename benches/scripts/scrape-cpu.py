#!/usr/bin/env python3
"""Whole-process CPU per /metrics scrape, the gputel agent beside node_exporter and nginx.

Run by benches/scripts/metrics-scrape.sh, which builds the programs and
starts the collector. Starts four processes at once, so that they share the
machine's load: two agents (fake NVML, fixture trees, --interval 1s) and two
node_exporters (the same fixture trees). One of each pair is scraped RATE
times a second for DURATION seconds over a kept-alive HTTP/1.1 connection,
as Prometheus scrapes; the other is never scraped. Each process's user +
system CPU comes from wait4() when it exits (all its threads, to the
microsecond), and

    CPU per scrape = (CPU scraped - CPU not scraped) / scrapes

so the sampling every agent does, and whatever else is not a scrape, cancels
out. Prints a table and writes the figures as JSON to --json.

With --nginx, two nginx servers (single process, no access log) join
them, serving the agent's own page as a file, captured from the scraped
agent after its first tick in the encoding asked for: the floor, what a
C web server pays in the same run to send the same cached bytes over the
same kind of connection.
"""

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, name, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"error: {name} exited ({proc.returncode}) before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"error: {name} does not listen on 127.0.0.1:{port} after {timeout:.0f} s")


def vm_hwm_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 1e6
    return float("nan")


NGINX_CONF = """daemon off;
master_process off;
worker_processes 1;
pid {root}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 16; }}
http {{
  access_log off;
  default_type "text/plain; version=0.0.4; charset=utf-8";
  client_body_temp_path {root}/tmp;
  proxy_temp_path {root}/tmp;
  fastcgi_temp_path {root}/tmp;
  uwsgi_temp_path {root}/tmp;
  scgi_temp_path {root}/tmp;
  open_file_cache max=8 inactive=1h;
  open_file_cache_valid 1h;
  server {{
    listen 127.0.0.1:{port};
    root {root}/www;
    location = /metrics {{ gzip_static {gzip_static}; }}
  }}
}}
"""


def nginx_serving(root, port, page, gzipped):
    """The argv of an nginx serving `page` at /metrics from `root`, which
    it creates: as metrics.gz with gzip_static when `gzipped`."""
    os.makedirs(os.path.join(root, "www"), exist_ok=True)
    os.makedirs(os.path.join(root, "tmp"), exist_ok=True)
    name = "metrics.gz" if gzipped else "metrics"
    with open(os.path.join(root, "www", name), "wb") as f:
        f.write(page)
    conf = os.path.join(root, "nginx.conf")
    with open(conf, "w") as f:
        f.write(NGINX_CONF.format(root=root, port=port,
                                  gzip_static="always" if gzipped else "off"))
    return ["-p", root, "-e", "stderr", "-c", conf]


def agent_argv(agent, nvml_lib, fixtures, collector, port, node="bench-node"):
    """The agent on the fake NVML and the fixture trees, one tick a second,
    serving /metrics on 127.0.0.1:PORT."""
    return [
        agent, "--nvml-lib", nvml_lib,
        "--procfs-root", os.path.join(fixtures, "proc"),
        "--sysfs-root", os.path.join(fixtures, "sys"),
        "--node", node, "--plaintext", "--collector", collector, "--interval", "1s",
        "--metrics-listen", f"127.0.0.1:{port}", "--log", "error",
    ]


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


class Scraper:
    """GET /metrics over one kept-alive connection (reopened if it closes)."""

    def __init__(self, port, encoding):
        self.port = port
        self.headers = {"Accept-Encoding": encoding}
        self.conn = None
        self.scrapes = 0
        self.wire_bytes = 0
        self.encodings = set()

    def scrape(self):
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            try:
                self.conn.request("GET", "/metrics", headers=self.headers)
                resp = self.conn.getresponse()
                body = resp.read()
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise
                continue
            if resp.status != 200:
                sys.exit(f"error: GET /metrics on {self.port}: HTTP {resp.status}")
            self.scrapes += 1
            self.wire_bytes += len(body)
            self.encodings.add(resp.getheader("Content-Encoding") or "identity")
            return body


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agent", required=True)
    ap.add_argument("--nvml-lib", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--node-exporter", required=True)
    ap.add_argument("--nginx", help="nginx to serve the agent's page from, as the floor")
    ap.add_argument("--collector", required=True, help="the agents' collector URL")
    ap.add_argument("--duration", type=float, default=300)
    ap.add_argument("--rate", type=float, default=1.0, help="scrapes per second")
    ap.add_argument("--accept-encoding", default="gzip")
    ap.add_argument("--logs", required=True, help="directory for the processes' stderr")
    ap.add_argument("--json")
    args = ap.parse_args()

    proc_root = os.path.join(args.fixtures, "proc")
    sys_root = os.path.join(args.fixtures, "sys")
    procs = {}

    def start(name, argv, port):
        log = open(os.path.join(args.logs, f"{name}.log"), "w")
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
        procs[name] = (p, port)

    for name in ("agent_scraped", "agent_idle"):
        port = free_port()
        start(name, agent_argv(args.agent, args.nvml_lib, args.fixtures, args.collector, port), port)
    for name in ("ne_scraped", "ne_idle"):
        port = free_port()
        start(name, [
            args.node_exporter, "--path.procfs", proc_root, "--path.sysfs", sys_root,
            "--web.listen-address", f"127.0.0.1:{port}", "--log.level", "warn",
        ], port)

    try:
        for name, (p, port) in procs.items():
            wait_port(port, p, name)
        # The agents' first tick; node_exporter has values from the start.
        time.sleep(2)
        scrapers = {
            "agent": Scraper(procs["agent_scraped"][1], args.accept_encoding),
            "ne": Scraper(procs["ne_scraped"][1], args.accept_encoding),
        }
        if args.nginx:
            page = scrapers["agent"].scrape()
            gzipped = scrapers["agent"].encodings == {"gzip"}
            for name in ("nginx_scraped", "nginx_idle"):
                port = free_port()
                root = os.path.join(args.logs, name)
                start(name, [args.nginx] + nginx_serving(root, port, page, gzipped), port)
                wait_port(port, procs[name][0], name)
            scrapers["nginx"] = Scraper(procs["nginx_scraped"][1], args.accept_encoding)
        load_start = loadavg()
        n = int(round(args.duration * args.rate))
        t0 = time.monotonic()
        for i in range(n):
            delay = t0 + i / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            for s in scrapers.values():
                s.scrape()
        wall = time.monotonic() - t0
        load_end = loadavg()
        # Peak RSS since exec (wait4's ru_maxrss would count the forked
        # Python before the exec).
        hwm = {name: vm_hwm_mb(p.pid) for name, (p, _) in procs.items()}
    finally:
        for p, _ in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    usage = {}
    for name, (p, _) in procs.items():
        _, status, ru = os.wait4(p.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        # node_exporter exits 0 on SIGTERM only in newer releases.
        if name.startswith("agent") and code != 0:
            sys.exit(f"error: {name} exited with {code}; see {args.logs}/{name}.log")
        usage[name] = {
            "cpu_s": ru.ru_utime + ru.ru_stime,
            "user_s": ru.ru_utime,
            "sys_s": ru.ru_stime,
            "peak_rss_mb": hwm[name],
            "minor_faults": ru.ru_minflt,
            "voluntary_switches": ru.ru_nvcsw,
        }

    def per_scrape_ms(prefix, scraper):
        return (usage[f"{prefix}_scraped"]["cpu_s"] - usage[f"{prefix}_idle"]["cpu_s"]) \
            / scraper.scrapes * 1e3

    agent_ms = per_scrape_ms("agent", scrapers["agent"])
    ne_ms = per_scrape_ms("ne", scrapers["ne"])
    nginx_ms = per_scrape_ms("nginx", scrapers["nginx"]) if args.nginx else None
    result = {
        "duration_s": args.duration,
        "rate_hz": args.rate,
        "accept_encoding": args.accept_encoding,
        "scrape_wall_s": wall,
        "loadavg_start": load_start,
        "loadavg_end": load_end,
        "processes": usage,
        "scrapes": {k: s.scrapes for k, s in scrapers.items()},
        "wire_bytes_per_scrape": {k: s.wire_bytes / max(s.scrapes, 1) for k, s in scrapers.items()},
        "content_encoding": {k: sorted(s.encodings) for k, s in scrapers.items()},
        "agent_ms_per_scrape": agent_ms,
        "node_exporter_ms_per_scrape": ne_ms,
        "nginx_ms_per_scrape": nginx_ms,
    }

    print(f"{args.duration:.0f} s, {args.rate:g} scrape(s)/s, Accept-Encoding: "
          f"{args.accept_encoding!r}; load average {load_start} at the start, {load_end} at the end")
    print(f"{'process':<30} {'CPU s':>9} {'user s':>8} {'sys s':>8} {'CPU ms/s':>9} "
          f"{'peak RSS':>9} {'page faults':>12} {'wake-ups':>9}")
    labels = {
        "agent_scraped": "gputel agent, scraped",
        "agent_idle": "gputel agent, not scraped",
        "ne_scraped": "node_exporter, scraped",
        "ne_idle": "node_exporter, not scraped",
        "nginx_scraped": "nginx (the page), scraped",
        "nginx_idle": "nginx (the page), not scraped",
    }
    for name, label in labels.items():
        if name not in usage:
            continue
        u = usage[name]
        print(f"{label:<30} {u['cpu_s']:9.3f} {u['user_s']:8.3f} {u['sys_s']:8.3f} "
              f"{u['cpu_s'] / wall * 1e3:9.3f} {u['peak_rss_mb']:6.1f} MB "
              f"{u['minor_faults']:12d} {u['voluntary_switches']:9d}")
    for key, label in (("agent", "gputel agent"), ("ne", "node_exporter"), ("nginx", "nginx")):
        if key not in scrapers:
            continue
        s = scrapers[key]
        print(f"{label}: {s.scrapes} scrapes, {s.wire_bytes / max(s.scrapes, 1):.0f} bytes "
              f"each on the wire ({', '.join(sorted(s.encodings))})")
    ratio = ne_ms / agent_ms if agent_ms > 0 else float("inf")
    print(f"CPU per scrape: gputel agent {agent_ms:.3f} ms, node_exporter {ne_ms:.3f} ms "
          f"(node_exporter / agent = {ratio:.1f}x)")
    if nginx_ms is not None:
        print(f"nginx sending the agent's page: {nginx_ms:.3f} ms a scrape "
              f"(agent / nginx = {agent_ms / nginx_ms:.2f}x; the agent's own part "
              f"above that floor: {agent_ms - nginx_ms:.3f} ms)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
