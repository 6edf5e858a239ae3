#!/usr/bin/env python3
"""The main job's learning over seeds, staleness, CPU kernel paths and thread counts (issues 24, 50).

Runs `colocated-rl --gpus-infer 1 --gpus-train 1` (the README's main job) once per cell of
seeds x --max-staleness K x kernel path x threads per rank, one run at a time, and prints per
(K, path, threads) the min / median / max held-out accuracy after the SFT warm-up and at the end,
the points GRPO added, the lowest held-out eval during GRPO, the largest fall of a 10-step window's
mean sampled reward below the window before, and the job's wall seconds. Every run is also a JSONL
row (--out), so two sweeps (say before and after a recipe change, each with its own binary) can be
tabled side by side later:

  scripts/learning_sweep.py build/app/colocated-rl --seeds 1-8 --out after.jsonl
  scripts/learning_sweep.py --report before.jsonl after.jsonl   # and a side-by-side table

Kernel paths: `native` is what the machine picks; `avx2` forces the project's kernels to their AVX2
path (CRL_CPU_ISA=avx2) and OpenBLAS to its Haswell kernels (OPENBLAS_CORETYPE=Haswell), which is
what an AVX2-only machine runs. Threads: OMP_NUM_THREADS per rank (the launcher's default here is
cores / ranks = 1 on a 2-core machine). Flags after `--` go to every run.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

PATHS = {"native": {}, "avx2": {"CRL_CPU_ISA": "avx2", "OPENBLAS_CORETYPE": "Haswell"}}


def parse_list(text, kind=int):
    out = []
    for part in text.split(","):
        if kind is int and "-" in part:
            lo, hi = part.split("-")
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(kind(part))
    return out


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def run_one(binary, seed, k, path, threads, flags):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **PATHS[path])
    cmd = [binary, "--gpus-infer", "1", "--gpus-train", "1", "--seed", str(seed),
           "--max-staleness", str(k), *flags]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.monotonic() - t0
    out = proc.stdout
    sft = re.findall(r"eval after the SFT warm-up .*held-out accuracy ([0-9.]+)", out)
    final = re.findall(r"held-out accuracy ([0-9.]+) -> ([0-9.]+)", out)
    gnorm = re.findall(r"sft step \d+/\d+ \| loss [0-9.]+ \| gnorm ([0-9.e+-]+)", out)
    # Each GRPO step's sampled (training) reward, and the held-out evals during GRPO.
    rewards = [float(x) for x in re.findall(r"^step \d+/\d+ \| reward ([0-9.]+)", out, re.M)]
    evals = [float(x) for x in
             re.findall(r"^eval after step \d+/\d+: held-out accuracy ([0-9.]+)", out, re.M)]
    windows = [statistics.mean(rewards[i:i + 10]) for i in range(0, len(rewards), 10)]
    # The summary's share of groups without GRPO signal (every sample scored the same), first and
    # last 10 steps; absent from builds before the metric.
    no_signal = re.findall(r"\(no GRPO signal\): (\d+)% -> (\d+)%", out)
    row = {"seed": seed, "k": k, "path": path, "threads": threads, "rc": proc.returncode,
           "seconds": round(seconds, 2), "sft_accuracy": float(sft[-1]) if sft else None,
           "sft_last_grad_norm": float(gnorm[-1]) if gnorm else None,
           "final_accuracy": float(final[-1][1]) if final else None,
           "grpo_eval_min": min(evals) if evals else None,
           "reward_windows": [round(w, 4) for w in windows],
           # The largest fall of one 10-step window's mean sampled reward below the one before.
           "reward_window_drop": max([0.0] + [a - b for a, b in zip(windows, windows[1:])]),
           "no_signal_first_last": [int(x) / 100 for x in no_signal[-1]] if no_signal else None,
           "warned_little_signal": "so GRPO has little to learn from" in out,
           "flags": flags, "cpu": cpu_model()}
    if proc.returncode != 0 or row["final_accuracy"] is None:
        row["tail"] = out.splitlines()[-5:]
    return row


def stats(values):
    v = [x for x in values if x is not None]
    if not v:
        return "-"
    return f"{min(v):.3f} / {statistics.median(v):.3f} / {max(v):.3f}"


def table(rows, title):
    print(f"\n{title}")
    print("| K | path | threads | runs | failed | SFT acc min / med / max | final acc min / med / max "
          "| GRPO added (points) min / med / max | lowest eval during GRPO | largest reward-window drop "
          "| seconds min / med / max |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    cells = sorted({(r["k"], r["path"], r["threads"]) for r in rows})
    for cell in cells + [(k, "all", "all") for k in sorted({r["k"] for r in rows})]:
        rs = [r for r in rows if (r["k"], r["path"], r["threads"]) == cell
              or (cell[1] == "all" and r["k"] == cell[0])]
        failed = sum(1 for r in rs if r["rc"] != 0 or r["final_accuracy"] is None)
        secs = [r["seconds"] for r in rs]
        added = [100 * (r["final_accuracy"] - r["sft_accuracy"]) for r in rs
                 if r.get("final_accuracy") is not None and r.get("sft_accuracy") is not None]
        lows = [r["grpo_eval_min"] for r in rs if r.get("grpo_eval_min") is not None]
        drops = [r["reward_window_drop"] for r in rs if "reward_window_drop" in r]
        added_s = (f"{min(added):.1f} / {statistics.median(added):.1f} / {max(added):.1f}"
                   if added else "-")
        low_s = f"{min(lows):.3f}" if lows else "-"
        drop_s = f"{max(drops):.3f}" if drops else "-"
        print(f"| {cell[0]} | {cell[1]} | {cell[2]} | {len(rs)} | {failed} | "
              f"{stats(r['sft_accuracy'] for r in rs)} | {stats(r['final_accuracy'] for r in rs)} | "
              f"{added_s} | {low_s} | {drop_s} | "
              f"{min(secs):.1f} / {statistics.median(secs):.1f} / {max(secs):.1f} |")


def side_by_side(before, after):
    """One row per (K, path, threads) cell: final accuracy and seconds, before and after."""
    print("\n| K | path | threads | final acc before (min / med / max) | final acc after (min / med / max) "
          "| seconds before (med) | seconds after (med) | after / before |")
    print("|---|---|---|---|---|---|---|---|")
    cells = sorted({(r["k"], r["path"], r["threads"]) for r in before + after})
    for cell in cells + [("all", "all", "all")]:
        pick = lambda rows: [r for r in rows if cell[0] == "all" or (r["k"], r["path"], r["threads"]) == cell]
        b, a = pick(before), pick(after)
        sb = statistics.median(r["seconds"] for r in b) if b else float("nan")
        sa = statistics.median(r["seconds"] for r in a) if a else float("nan")
        print(f"| {cell[0]} | {cell[1]} | {cell[2]} | {stats(r['final_accuracy'] for r in b)} | "
              f"{stats(r['final_accuracy'] for r in a)} | {sb:.1f} | {sa:.1f} | {sa / sb:.2f}x |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary", nargs="?")
    ap.add_argument("--seeds", default="1-8")
    ap.add_argument("--k", default="0,1", help="--max-staleness values")
    ap.add_argument("--paths", default="native,avx2", help="kernel paths: native, avx2")
    ap.add_argument("--threads", default="1,2", help="OMP_NUM_THREADS per rank")
    ap.add_argument("--out", help="append one JSON row per run")
    ap.add_argument("--report", nargs="+", metavar="JSONL", help="only print the tables of saved runs")
    argv = sys.argv[1:]
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if a.report:
        loaded = []
        for path in a.report:
            with open(path) as f:
                rows = [json.loads(l) for l in f if l.strip()]
            loaded.append(rows)
            table(rows, f"{path} ({rows[0]['cpu'] if rows else '?'}; flags {rows[0]['flags'] if rows else ''})")
        if len(loaded) == 2:
            side_by_side(*loaded)
        return
    if not a.binary:
        ap.error("a binary (or --report)")
    for p in parse_list(a.paths, str):
        if p not in PATHS:
            ap.error(f"unknown path {p} (native, avx2)")
    rows = []
    out = open(a.out, "a") if a.out else None
    print(f"cpu: {cpu_model()}; flags: {' '.join(flags) or '(defaults)'}", flush=True)
    # Seeds outermost, so a drift in the machine's load spreads over every cell.
    for seed in parse_list(a.seeds):
        for k in parse_list(a.k):
            for path in parse_list(a.paths, str):
                for threads in parse_list(a.threads):
                    r = run_one(a.binary, seed, k, path, threads, flags)
                    rows.append(r)
                    print(f"seed {seed} K={k} {path} threads {threads}: SFT {r['sft_accuracy']} "
                          f"(last grad norm {r['sft_last_grad_norm']}) -> final {r['final_accuracy']} "
                          f"in {r['seconds']:.1f} s (rc {r['rc']})", flush=True)
                    if "tail" in r:
                        print("\n".join("    " + l for l in r["tail"]), flush=True)
                    if out:
                        out.write(json.dumps(r) + "\n")
                        out.flush()
    table(rows, f"cpu: {rows[0]['cpu']}; flags: {' '.join(flags) or '(defaults)'}")
    sys.exit(1 if any(r["rc"] != 0 for r in rows) else 0)


if __name__ == "__main__":
    main()
