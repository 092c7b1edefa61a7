#!/usr/bin/env python3
"""Splits the collector's peak heap by what the allocating code does.

Reads heaptrack_print's `--flamegraph-cost-type peak -F FILE` output (one
call stack per line, root first, frames separated by ';', then the bytes
that stack held at the peak) and gives each stack to the first part below
that one of its frames names, walking from the allocation towards the root,
so that a buffer is counted where it was asked for (a tonic buffer that
BytesMut grows is tonic's, not the bytes crate's).

    collector-heap.py PEAK_FILE [AGENTS]
"""

import sys

# (part, substrings of a frame), tried in this order on each frame.
PARTS = [
    ("zstd contexts of Parquet column writers (C)", ["ZSTD_"]),
    ("HTTP/2 connections (h2, hyper)", ["h2::", "hyper::"]),
    ("gRPC stream buffers (tonic)", ["tonic::codec"]),
    ("rows waiting in the write buffer", ["WriteBuffer::append", "Rows::push", "Rows::with_capacity"]),
    ("a flush: assembling, sorting, encoding", ["WriteBuffer::take", "sort_and_encode", "parquet::", "arrow_select::"]),
    ("write-ahead log", ["gputel_collector::wal::"]),
    ("tasks and futures (tokio)", ["tokio::"]),
]
# Parts that one agent's connection holds, shown per agent too.
PER_CONNECTION = {PARTS[1][0], PARTS[2][0], PARTS[6][0]}


def part_of(frames):
    for frame in reversed(frames):
        for part, needles in PARTS:
            if any(n in frame for n in needles):
                return part
    return "other"


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    agents = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    totals = {}
    for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
        stack, _, cost = line.rstrip("\n").rpartition(" ")
        if not cost.isdigit():
            continue
        part = part_of(stack.split(";"))
        totals[part] = totals.get(part, 0) + int(cost)
    whole = sum(totals.values())
    print(f"heap at its peak: {whole / 1e6:.1f} MB")
    for part, cost in sorted(totals.items(), key=lambda kv: -kv[1]):
        per_agent = f", {cost / agents / 1e3:.1f} KB an agent" if agents and part in PER_CONNECTION else ""
        print(f"  {part:46s} {cost / 1e6:7.1f} MB ({100 * cost / whole:4.1f} %{per_agent})")


if __name__ == "__main__":
    main()
