#!/usr/bin/env python3
"""Rewards beyond the first line through the real job (issue 52).

  reward_job.py data OUT FORM   a task the embedded model learns in its warm-up: copy a number,
                                the demonstration a line of "reasoning" and then the answer in
                                FORM: "gsm8k" ("#### 47") or "boxed" ("\\boxed{47}")
  reward_job.py parquet OUT     the same task as verl's GSM8K preprocessing writes it: Parquet (needs
                                pyarrow), "prompt" a list of chat messages, "reward_model" and
                                "extra_info" structs
  reward_job.py check TRACES METRICS
                                every traced sample's reward is what examples/rewards/gsm8k.py's
                                rule gives its completion (recomputed here, from verl's pattern),
                                some are right and some wrong; the metrics carry the program's
                                extra metric and no reward error
"""
import json
import random
import re
import sys


def data(out, form):
    rng = random.Random(1)
    with open(out, "w") as f:
        for _ in range(400):
            n = rng.randint(10, 99)
            answer = f"#### {n}" if form == "gsm8k" else f"\\boxed{{{n}}}"
            row = {"prompt": f"Copy the number {n}. Answer:", "demonstration": f"so {n}\n{answer}"}
            # verl's row fields for the program; the built-in rewards read "answer"
            if form == "gsm8k":
                row.update({"data_source": "copy-number", "extra_info": {"n": n},
                            "reward_model": {"style": "rule", "ground_truth": str(n)}})
            else:
                row["answer"] = str(n)
            f.write(json.dumps(row) + "\n")


def parquet(out):
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = random.Random(2)
    rows = []
    for i in range(40):
        n = rng.randint(10, 99)
        rows.append({"data_source": "openai/gsm8k",
                     "prompt": [{"role": "user", "content": f"Copy the number {n}."}],
                     "ability": "math",
                     "reward_model": {"style": "rule", "ground_truth": str(n)},
                     "extra_info": {"split": "train", "index": i, "answer": f"#### {n}"}})
    pq.write_table(pa.Table.from_pylist(rows), out)


def gsm8k_rule(completion, truth):
    found = re.findall(r"#### (\-?[0-9\.\,]+)", completion[-300:])
    return 1.0 if found and found[-1].replace(",", "").replace("$", "") == truth else 0.0


def check(traces, metrics):
    lines = [json.loads(l) for l in open(traces)]
    errors = []
    if not lines:
        errors.append("no traced samples")
    rewards = []
    for t in lines:
        truth = re.search(r"Copy the number (\d+)", t["prompt"]).group(1)
        completion = t["completion"].replace("</s>", "")
        want = gsm8k_rule(completion, truth)
        rewards.append(t["reward"])
        if t["reward"] != want:
            errors.append(f"step {t['step']}: {completion!r} scored {t['reward']}, the rule {want}")
    if len(set(rewards)) < 2:
        errors.append(f"every sample scored {rewards[:1]}: the check cannot tell right from wrong")
    rows = [r["data"] for r in map(json.loads, open(metrics))
            if "data" in r and not ({"config", "eval", "phase"} & r.keys())]
    if not rows:
        errors.append("no GRPO rows in the metrics")
    for d in rows:
        if d.get("crl/reward_errors") != 0:
            errors.append(f"crl/reward_errors {d.get('crl/reward_errors')}")
        if not 0 <= d.get("reward_extra/has_answer/mean", -1) <= 1:
            errors.append("no reward_extra/has_answer/mean in a metrics row")
    if errors:
        sys.exit("\n".join(errors[:20]))
    print(f"{len(lines)} traced samples scored as gsm8k.py's rule, mean reward "
          f"{sum(rewards) / len(rewards):.3f}")


if __name__ == "__main__":
    if sys.argv[1] == "data":
        data(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "parquet":
        parquet(sys.argv[2])
    else:
        check(sys.argv[2], sys.argv[3])
