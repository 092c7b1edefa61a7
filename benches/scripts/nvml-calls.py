#!/usr/bin/env python3
"""Times the NVML calls the gputel agent makes at each tick, on real GPUs.

Run by benches/scripts/real-gpu.sh. Needs nvidia-ml-py (`import pynvml`).
Each call the agent's GPU sampler makes per GPU and tick
(agent/src/sampler/gpu.rs) is made REPEAT times on each GPU; prints, as
JSON, its median and 99th percentile in microseconds and its result or
error, and the sum of the medians (one GPU's tick, NVML's share). Also
checks what no fake can: whether the GPU supports GPM and which event
types it reports, and whether an XID event set can be registered.

The times include about a microsecond of Python ctypes overhead a call.
"""

import argparse
import json
import statistics
import sys
import time

import pynvml as N

# NVML field ids the agent reads in one nvmlDeviceGetFieldValues call.
FIELDS = [82, 3, 4, 5, 6, 29, 30, 31, 94, 138, 139, 142, 143, 144, 145, 197, 198]
# GPM metric ids: SM activity, SM occupancy, tensor activity (any), DRAM
# bandwidth utilization, graphics engine activity.
GPM_METRICS = [2, 3, 5, 10, 1]


def calls(h):
    """(name, thunk) for each per-tick call, in the agent's order."""
    out = [
        ("nvmlDeviceGetFieldValues(17 ids)", lambda: N.nvmlDeviceGetFieldValues(h, FIELDS)),
        ("nvmlDeviceGetTemperature", lambda: N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU)),
        ("nvmlDeviceGetUtilizationRates", lambda: N.nvmlDeviceGetUtilizationRates(h)),
        ("nvmlDeviceGetEncoderUtilization", lambda: N.nvmlDeviceGetEncoderUtilization(h)),
        ("nvmlDeviceGetDecoderUtilization", lambda: N.nvmlDeviceGetDecoderUtilization(h)),
        ("nvmlDeviceGetMemoryInfo_v2", lambda: N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)),
        ("nvmlDeviceGetPowerUsage", lambda: N.nvmlDeviceGetPowerUsage(h)),
        ("nvmlDeviceGetTotalEnergyConsumption", lambda: N.nvmlDeviceGetTotalEnergyConsumption(h)),
        ("nvmlDeviceGetCurrentClocksEventReasons", lambda: N.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
        ("nvmlDeviceGetClockInfo(SM)", lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM)),
        ("nvmlDeviceGetClockInfo(MEM)", lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_MEM)),
        ("nvmlDeviceGetEnforcedPowerLimit", lambda: N.nvmlDeviceGetEnforcedPowerLimit(h)),
        ("nvmlDeviceGetMigMode", lambda: N.nvmlDeviceGetMigMode(h)),
        ("nvmlDeviceGetCurrPcieLinkGeneration", lambda: N.nvmlDeviceGetCurrPcieLinkGeneration(h)),
        ("nvmlDeviceGetMaxPcieLinkGeneration", lambda: N.nvmlDeviceGetMaxPcieLinkGeneration(h)),
        ("nvmlDeviceGetCurrPcieLinkWidth", lambda: N.nvmlDeviceGetCurrPcieLinkWidth(h)),
        ("nvmlDeviceGetMaxPcieLinkWidth", lambda: N.nvmlDeviceGetMaxPcieLinkWidth(h)),
        ("nvmlDeviceGetFanSpeed_v2", lambda: N.nvmlDeviceGetFanSpeed_v2(h, 0)),
        ("nvmlDeviceGetPerformanceState", lambda: N.nvmlDeviceGetPerformanceState(h)),
    ]
    try:
        sample = N.nvmlGpmSampleAlloc()
        out.append(("nvmlGpmSampleGet", lambda: N.nvmlGpmSampleGet(h, sample)))
    except N.NVMLError as e:
        # No sample to take: each timed call reports the allocation's error.
        def failed(e=e):
            raise e
        out.append(("nvmlGpmSampleGet", failed))
    return out


def slow_calls(h):
    """Calls the agent makes every --process-interval (10 s), not every tick."""
    return [
        ("nvmlDeviceGetComputeRunningProcesses", lambda: N.nvmlDeviceGetComputeRunningProcesses(h)),
    ]


def describe(value):
    if isinstance(value, (int, float, str)):
        return value
    if isinstance(value, list):
        return f"{len(value)} entries"
    return type(value).__name__


def time_call(thunk, repeat):
    """Wall-clock median and p99, and the calling thread's mean CPU time
    (user + system: what the call costs the machine, not only the wait)."""
    times, result = [], None
    cpu0 = time.thread_time_ns()
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        try:
            result = describe(thunk())
        except N.NVMLError as e:
            result = f"error: {e}"
        times.append((time.perf_counter_ns() - t0) / 1000)
    cpu_us = (time.thread_time_ns() - cpu0) / 1000 / repeat
    times.sort()
    return {
        "median_us": round(statistics.median(times), 1),
        "p99_us": round(times[min(len(times) - 1, int(len(times) * 0.99))], 1),
        "cpu_us": round(cpu_us, 1),
        "result": result,
    }


def field_calls(h):
    """Each field id alone, and the agent's 17 with the energy counter (83)."""
    out = [(f"nvmlDeviceGetFieldValues([{f}])", lambda f=f: N.nvmlDeviceGetFieldValues(h, [f]))
           for f in FIELDS + [83]]
    out.append(("nvmlDeviceGetFieldValues(17 ids + 83)",
                lambda: N.nvmlDeviceGetFieldValues(h, FIELDS + [83])))
    return out


def gpm_check(h):
    """GPM support, and one second's SM and tensor activity through it."""
    try:
        support = N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice
    except N.NVMLError as e:
        return {"supported": f"error: {e}"}
    out = {"supported": bool(support)}
    if not support:
        return out
    try:
        s1, s2 = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
        N.nvmlGpmSampleGet(h, s1)
        time.sleep(1)
        N.nvmlGpmSampleGet(h, s2)
        get = N.c_nvmlGpmMetricsGet_t()
        get.version = N.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(GPM_METRICS)
        get.sample1, get.sample2 = s1, s2
        for i, m in enumerate(GPM_METRICS):
            get.metrics[i].metricId = m
        out["metrics_get"] = time_call(lambda: N.nvmlGpmMetricsGet(get), 20)
        for m in GPM_METRICS:
            one = N.c_nvmlGpmMetricsGet_t()
            one.version = N.NVML_GPM_METRICS_GET_VERSION
            one.numMetrics = 1
            one.sample1, one.sample2 = s1, s2
            one.metrics[0].metricId = m
            out[f"metrics_get_{m}_alone"] = time_call(lambda one=one: N.nvmlGpmMetricsGet(one), 20)
        out["values"] = {
            str(GPM_METRICS[i]): (round(get.metrics[i].value, 2) if get.metrics[i].nvmlReturn == 0
                                 else f"error {get.metrics[i].nvmlReturn}")
            for i in range(len(GPM_METRICS))
        }
    except (N.NVMLError, AttributeError) as e:
        out["error"] = str(e)
    return out


def events_check(h):
    out = {}
    try:
        out["supported_event_types"] = hex(N.nvmlDeviceGetSupportedEventTypes(h))
    except N.NVMLError as e:
        out["supported_event_types"] = f"error: {e}"
    try:
        es = N.nvmlEventSetCreate()
        N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError, es)
        out["xid_registration"] = "ok"
        N.nvmlEventSetFree(es)
    except N.NVMLError as e:
        out["xid_registration"] = f"error: {e}"
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--label", default="", help="put into the JSON (e.g. idle, loaded)")
    ap.add_argument("--repeat", type=int, default=200, help="times each per-tick call is made")
    ap.add_argument("--fields", action="store_true", help="also time each field id alone")
    args = ap.parse_args()

    t0 = time.perf_counter_ns()
    N.nvmlInit()
    init_ms = (time.perf_counter_ns() - t0) / 1e6
    report = {
        "label": args.label,
        "driver": N.nvmlSystemGetDriverVersion(),
        "nvml": N.nvmlSystemGetNVMLVersion(),
        "init_ms": round(init_ms, 1),
        "gpus": [],
    }
    for i in range(N.nvmlDeviceGetCount()):
        h = N.nvmlDeviceGetHandleByIndex(i)
        per_tick = {name: time_call(f, args.repeat) for name, f in calls(h)}
        slow = {name: time_call(f, max(args.repeat // 10, 5)) for name, f in slow_calls(h)}
        fields = {name: time_call(f, max(args.repeat // 4, 5)) for name, f in field_calls(h)} if args.fields else {}
        report["gpus"].append({
            "index": i,
            "name": N.nvmlDeviceGetName(h),
            "per_tick": per_tick,
            "per_tick_sum_median_us": round(sum(c["median_us"] for c in per_tick.values()), 1),
            "slow": slow,
            "fields": fields,
            "gpm": gpm_check(h),
            "events": events_check(h),
        })
    N.nvmlShutdown()
    json.dump(report, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
