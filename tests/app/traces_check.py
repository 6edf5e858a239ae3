#!/usr/bin/env python3
"""--traces FILE against the same run's --metrics FILE (every group traced, --trace-rate 1): one
line per rollout sample with its text, ids, reward, advantage and per-token log-probs and
versions; each step's samples average to the metrics row's reward and response length; each
group's advantages average to 0; no token was sampled by weights newer than the step trains.

usage: traces_check.py TRACES METRICS STEPS SAMPLES_PER_STEP N_SAMPLES
"""
import collections
import json
import sys


def main():
    traces, metrics = sys.argv[1], sys.argv[2]
    steps, per_step, n = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    lines = [json.loads(l) for l in open(traces)]
    rows = {r["step"]: r["data"] for r in map(json.loads, open(metrics))
            if "data" in r and not ({"config", "eval", "phase"} & r.keys())}
    errors = []
    if len(rows) != steps or len(lines) != steps * per_step:
        sys.exit(f"{len(rows)} GRPO rows and {len(lines)} trace lines, not {steps} and "
                 f"{steps * per_step}")
    by_step = collections.defaultdict(list)
    groups = collections.defaultdict(list)
    for t in lines:
        missing = {"step", "infer_rank", "group", "prompt_index", "sample", "dropped", "reward", "advantage",
                   "prompt", "completion", "prompt_ids", "completion_ids", "logprobs",
                   "versions"} - t.keys()
        if missing:
            errors.append(f"a line without {sorted(missing)}")
            continue
        if not (len(t["completion_ids"]) == len(t["logprobs"]) == len(t["versions"]) > 0):
            errors.append(f"step {t['step']}: ids, log-probs and versions differ in length")
        if not t["prompt"] or not t["prompt_ids"]:
            errors.append(f"step {t['step']}: empty prompt")
        by_step[t["step"]].append(t)
        groups[(t["infer_rank"], t["group"])].append(t)
    if sorted(by_step) != sorted(rows):
        errors.append(f"traced steps {sorted(by_step)}, metrics steps {sorted(rows)}")
    for step, ts in by_step.items():
        if len(ts) != per_step:
            errors.append(f"step {step}: {len(ts)} lines, not {per_step}")
            continue
        data = rows.get(step, {})
        reward = sum(t["reward"] for t in ts) / len(ts)
        length = sum(len(t["completion_ids"]) for t in ts) / len(ts)
        if abs(reward - data.get("critic/score/mean", -1)) > 1e-9:
            errors.append(f"step {step}: traced reward {reward} != critic/score/mean "
                          f"{data.get('critic/score/mean')}")
        if abs(length - data.get("response_length/mean", -1)) > 1e-9:
            errors.append(f"step {step}: traced length {length} != response_length/mean "
                          f"{data.get('response_length/mean')}")
        lengths = [len(t["completion_ids"]) for t in ts]
        for name, want in (("response_length/max", max(lengths)), ("response_length/min", min(lengths))):
            if data.get(name) != want:
                errors.append(f"step {step}: traced {name} {want} != {data.get(name)}")
        # crl/weight_version is the version the step sends; its tokens are older.
        newest = max(v for t in ts for v in t["versions"])
        if newest >= data.get("crl/weight_version", -1):
            errors.append(f"step {step}: a token of version {newest}, not older than the "
                          f"step's new weights {data.get('crl/weight_version')}")
    for (rank, gid), g in groups.items():
        where = f"rank {rank} group {gid} (step {g[0]['step']}, prompt {g[0]['prompt_index']})"
        if len(g) != n or sorted(t["sample"] for t in g) != list(range(n)):
            errors.append(f"{where}: samples {[t['sample'] for t in g]}")
        if len({(t["step"], t["prompt_index"]) for t in g}) != 1:
            errors.append(f"{where}: lines of several steps or prompts")
        if not g[0]["dropped"] and abs(sum(t["advantage"] for t in g) / len(g)) > 1e-6:
            errors.append(f"{where}: advantages do not average to 0")
    print(f"{len(lines)} trace lines over {len(by_step)} steps and {len(groups)} groups; "
          f"{sum(1 for t in lines if t['reward'] > 0)} rewarded")
    if errors:
        sys.exit("\n".join(errors[:20]))


if __name__ == "__main__":
    main()
