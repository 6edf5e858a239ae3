#!/usr/bin/env python3
"""`--tensorboard DIR` read back with TensorBoard's own reader (PyPI's tensorboard, in a venv the
test makes once): every numeric field of every row of the same run's --metrics JSONL is a scalar
grpo/<field> at the row's step with the same value (as float32), and the evaluations are there.

usage: tensorboard_readback.py TB_DIR METRICS_JSONL
"""
import json
import math
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main():
    tb_dir, metrics = sys.argv[1], sys.argv[2]
    acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    rows = [json.loads(l) for l in open(metrics) if l.strip()]
    if not rows:
        sys.exit("no metrics rows")
    checked = 0
    errors = []

    def walk(prefix, obj, step):
        nonlocal checked
        for k, v in obj.items():
            if isinstance(v, dict):
                walk(prefix + "/" + k, v, step)
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                tag = prefix + "/" + k
                if tag not in tags:
                    errors.append(f"missing tag {tag}")
                    continue
                got = {e.step: e.value for e in acc.Scalars(tag)}
                if step not in got:
                    errors.append(f"{tag}: no value at step {step}")
                elif not math.isclose(got[step], float(v), rel_tol=1e-6, abs_tol=1e-30) and not (
                        abs(got[step] - float(v)) <= 1e-6 * max(1.0, abs(float(v)))):
                    errors.append(f"{tag} at step {step}: {got[step]} != {v}")
                checked += 1

    for r in rows:
        walk("grpo", r, int(r["step"]))
    for tag in ("eval/held_out_accuracy_start", "eval/held_out_accuracy"):
        if tag not in tags:
            errors.append(f"missing tag {tag}")
    evals = {r["step"]: r["eval_accuracy"] for r in rows if r.get("eval_accuracy") is not None}
    if "eval/held_out_accuracy" in tags:
        got = {e.step: e.value for e in acc.Scalars("eval/held_out_accuracy")}
        for step, v in evals.items():
            if step not in got or abs(got[step] - v) > 1e-6:
                errors.append(f"eval/held_out_accuracy at step {step}: {got.get(step)} != {v}")
    print(f"{len(tags)} tags, {checked} scalar values compared with {len(rows)} metrics rows")
    if errors:
        sys.exit("\n".join(errors[:20]))


if __name__ == "__main__":
    main()
