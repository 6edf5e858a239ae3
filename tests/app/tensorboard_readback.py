#!/usr/bin/env python3
"""`--tensorboard DIR` read back with TensorBoard's own reader (PyPI's tensorboard, in a venv the
test makes once) against the same run's --metrics JSONL (verl's file-logger form, {"step": N,
"data": {...}}): the first row holds the run's configuration; every number of every GRPO row is a
scalar of the same name at the row's step with the same value (as float32); each SFT warm-up row
is there as sft/loss, sft/grad_norm and sft/lr (the first train rank's own event file, in
TB_DIR/sft), SFT_STEPS of them; and the start and after-warm-up evaluations are there.

usage: tensorboard_readback.py TB_DIR METRICS_JSONL SFT_STEPS
"""
import json
import math
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

HELD_OUT = "val-core/held_out/acc/mean@1"


def main():
    tb_dir, metrics, sft_steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    accs = {}
    for sub in ("", "/sft"):
        accs[sub] = EventAccumulator(tb_dir + sub, size_guidance={"scalars": 0})
        accs[sub].Reload()
    tags = {t: a for a in accs.values() for t in a.Tags()["scalars"]}
    rows = [json.loads(l) for l in open(metrics) if l.strip()]
    errors = []
    if not rows or "config" not in rows[0] or rows[0]["config"].get("steps") is None:
        sys.exit(f"the first metrics row is not the run's configuration: {rows[:1]}")
    checked = 0

    def check(tag, step, value):
        nonlocal checked
        if tag not in tags:
            errors.append(f"missing tag {tag}")
            return
        got = {e.step: e.value for e in tags[tag].Scalars(tag)}
        if step not in got:
            errors.append(f"{tag}: no value at step {step}")
        elif abs(got[step] - float(value)) > 1e-6 * max(1.0, abs(float(value))):
            errors.append(f"{tag} at step {step}: {got[step]} != {value}")
        checked += 1

    grpo = [r for r in rows if "data" in r and not ({"config", "eval", "phase"} & r.keys())]
    sft = [r for r in rows if r.get("phase") == "sft"]
    evals = {r["eval"]: r["data"][HELD_OUT] for r in rows if "eval" in r}
    if not grpo:
        errors.append("no GRPO rows")
    for r in grpo:
        for name, v in r["data"].items():
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                errors.append(f"step {r['step']}: {name} = {v!r} is not a finite number")
                continue
            check(name, int(r["step"]), v)
    if [r["step"] for r in sft] != list(range(1, sft_steps + 1)):
        errors.append(f"SFT rows at steps {[r['step'] for r in sft]}, not 1..{sft_steps}")
    for r in sft:
        for name, v in r["data"].items():
            check(name, int(r["step"]), v)
    if any(t.startswith("sft/") for t in accs[""].Tags()["scalars"]):
        errors.append("SFT scalars in the top folder: they belong in TB_DIR/sft")
    for name, tag in (("start", "eval/held_out_accuracy_start"),
                      ("after_sft", "eval/held_out_accuracy_after_sft")):
        if name not in evals:
            errors.append(f"no {name} eval row")
        else:
            check(tag, 0, evals[name])
    print(f"{len(tags)} tags, {checked} scalar values compared with {len(rows)} metrics rows "
          f"({len(grpo)} GRPO, {len(sft)} SFT)")
    if errors:
        sys.exit("\n".join(errors[:20]))


if __name__ == "__main__":
    main()
