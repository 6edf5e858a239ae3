#!/usr/bin/env python3
"""Summarises `bench rollout --profile/--step-trace` output: per Kineto trace, the device time by
kernel (top N), the window's wall time and the device's busy share; per step trace, wall time by
step kind (prefill-carrying vs pure decode) and the host phases.

  scripts/profile_summary.py [--top N] TRACE.json... [--steps STEPS.jsonl]
"""
import argparse
import collections
import json
import re
import statistics


def short(name):
    name = name.replace("(anonymous namespace)::", "")  # else cut as an argument list
    name = re.sub(r"\(.*", "", name)          # argument lists
    name = re.sub(r"<.*>", "<>", name)         # template arguments
    return name[:90]


def trace_summary(path, top):
    events = json.load(open(path)).get("traceEvents", [])
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    runtime = [e for e in events if e.get("cat") == "cuda_runtime" and "dur" in e]
    timed = [e for e in events if "dur" in e and "ts" in e]
    if not timed:
        print(f"{path}: no timed events")
        return
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + e["dur"] for e in timed)
    wall = t1 - t0
    busy = sum(e["dur"] for e in kernels)
    print(f"== {path}: window {wall / 1e3:.2f} ms, device busy {busy / 1e3:.2f} ms "
          f"({100 * busy / max(wall, 1e-9):.0f}%), {len(kernels)} device ops")
    by = collections.defaultdict(lambda: [0.0, 0])
    for e in kernels:
        b = by[short(e["name"])]
        b[0] += e["dur"]
        b[1] += 1
    for name, (dur, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {dur / 1e3:8.3f} ms {100 * dur / max(busy, 1e-9):5.1f}%  x{n:<5d} {dur / n:8.1f} us  {name}")
    rt = collections.defaultdict(lambda: [0.0, 0])
    for e in runtime:
        b = rt[e["name"]]
        b[0] += e["dur"]
        b[1] += 1
    line = ", ".join(f"{k} {v[0] / 1e3:.2f} ms x{v[1]}" for k, v in sorted(rt.items(), key=lambda kv: -kv[1][0])[:6])
    print(f"  host runtime calls: {line}")


def steps_summary(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    if not rows:
        return
    kinds = {"prefill": [r for r in rows if r["prefill"] > 0], "decode": [r for r in rows if r["prefill"] == 0]}
    total = sum(r["wall_s"] for r in rows)
    print(f"== {path}: {len(rows)} steps, {total:.2f} s")
    for kind, rs in kinds.items():
        if not rs:
            continue
        wall = sum(r["wall_s"] for r in rs)
        phases = {p: sum(r[p + "_s"] for r in rs) for p in ("schedule", "forward", "sample", "finish")}
        other = wall - sum(phases.values())
        print(f"  {kind:8s} {len(rs):5d} steps {wall:7.2f} s ({100 * wall / total:4.1f}%), median "
              f"{1e3 * statistics.median(r['wall_s'] for r in rs):6.2f} ms; host: " +
              ", ".join(f"{p} {v:.2f} s" for p, v in phases.items()) + f", other {other:.2f} s")
    dec = kinds["decode"]
    if dec:
        buckets = collections.defaultdict(list)
        for r in dec:
            buckets[min(256, 1 << (max(r["seqs"], 1) - 1).bit_length())].append(r)
        print("  decode by batch: " + "; ".join(
            f"<={b}: {len(rs)} x {1e3 * statistics.median(r['wall_s'] for r in rs):.2f} ms "
            f"(sample {1e3 * statistics.median(r['sample_s'] for r in rs):.2f})"
            for b, rs in sorted(buckets.items())))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("traces", nargs="*")
    ap.add_argument("--steps", action="append", default=[])
    ap.add_argument("--top", type=int, default=22)
    a = ap.parse_args()
    for s in a.steps:
        steps_summary(s)
    for t in a.traces:
        try:
            trace_summary(t, a.top)
        except Exception as e:  # a broken trace should not hide the others
            print(f"{t}: {e}")


if __name__ == "__main__":
    main()
