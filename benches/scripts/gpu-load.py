#!/usr/bin/env python3
"""A GPU load in phases, for recording gputel beside nvidia-smi on real GPUs.

Run by benches/scripts/real-gpu.sh. Needs PyTorch with CUDA. Loads GPU 0
(CUDA_VISIBLE_DEVICES picks another) through phases that exercise what the
agent reads: idle without a CUDA context, bf16 matrix products (tensor
cores, full power), idle with memory held, a training-like duty cycle
(compute, then a pause as for data loading or communication), memory-bound
copies (DRAM busy, tensor cores not), fp32 products with TF32 off (SMs
busy, tensor cores not), then idle again after the memory is freed.

Prints one CSV line per phase as it starts (`phase,start_unix_s`) and
`end,<t>` at the end, so that each sample can be put in its phase. With
--jobmap FILE, writes the job id into FILE for the time the GPU is held
(dcgm-exporter's job-mapping format: the file of a GPU index holds the job
ids on it), as a Slurm prolog would, and removes it at the end.
"""

import argparse
import os
import sys
import time

PHASES = [
    # name, seconds
    ("idle", 25),
    ("bf16_matmul", 60),
    ("hold_memory", 25),
    ("duty_cycle", 65),
    ("memory_copy", 30),
    ("fp32_matmul", 40),
    ("freed", 0),
]


def mark(name):
    print(f"{name},{time.time():.3f}", flush=True)


def run_until(deadline, step):
    import torch

    while time.time() < deadline:
        step()
        torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobmap", help="job-mapping file to write while the GPU is held")
    ap.add_argument("--job", default="4242", help="job id written to --jobmap")
    ap.add_argument("--hold-gib", type=float, default=40.0, help="memory held from the first product on")
    args = ap.parse_args()

    print("phase,start_unix_s", flush=True)
    mark("idle")
    time.sleep(PHASES[0][1])

    import torch

    dev = torch.device("cuda", 0)
    start = time.time()
    if args.jobmap:
        with open(args.jobmap + ".tmp", "w") as f:
            f.write(args.job + "\n")
        os.replace(args.jobmap + ".tmp", args.jobmap)
    held = torch.empty(int(args.hold_gib * 2**30), dtype=torch.uint8, device=dev)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    mark("bf16_matmul")
    run_until(start + PHASES[1][1], lambda: a @ b)

    mark("hold_memory")
    time.sleep(PHASES[2][1])

    mark("duty_cycle")
    end = time.time() + PHASES[3][1]
    while time.time() < end:
        busy_until = time.time() + 0.6
        run_until(busy_until, lambda: a @ b)
        time.sleep(0.4)

    mark("memory_copy")
    src = torch.empty(4 * 2**30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    run_until(time.time() + PHASES[4][1], lambda: dst.copy_(src))
    del src, dst

    mark("fp32_matmul")
    torch.backends.cuda.matmul.allow_tf32 = False
    x = torch.randn(8192, 8192, dtype=torch.float32, device=dev)
    y = torch.randn(8192, 8192, dtype=torch.float32, device=dev)
    run_until(time.time() + PHASES[5][1], lambda: x @ y)

    del a, b, x, y, held
    torch.cuda.empty_cache()
    if args.jobmap:
        os.remove(args.jobmap)
    mark("freed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
