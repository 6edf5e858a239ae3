#!/usr/bin/env bash
# Runs the RL job twice with the same flags and checks that every learning figure of every step
# (loss, gradient norm, rewards, accuracies, log-prob gaps, token counts, versions, staleness) is
# the same in both --metrics files, bit for bit. Timing figures are not compared.
#   rl_reproducible.sh BINARY FLAGS...
set -euo pipefail
bin=$1
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for run in 1 2; do
  if ! "$bin" "$@" --metrics "$dir/run$run.jsonl" >"$dir/run$run.log" 2>&1; then
    echo "FAILED: run $run exited non-zero"
    cat "$dir/run$run.log"
    exit 1
  fi
  grep -E '^summary:|held-out accuracy [0-9.]+ ->' "$dir/run$run.log"
  grep -E 'held-out accuracy' "$dir/run$run.log" | sed 's/ ([0-9.]* s)$//' >"$dir/evals$run.txt"
done
if ! diff "$dir/evals1.txt" "$dir/evals2.txt"; then
  echo "FAILED: the held-out evaluations differ between two runs of the same flags"
  exit 1
fi
python3 - "$dir/run1.jsonl" "$dir/run2.jsonl" <<'PY'
import json, sys
keys = ["step", "loss", "kl", "clip_fraction", "grad_norm", "lr", "reward_mean", "reward_std",
        "accuracy", "eval_accuracy", "logprob_gap_max", "logprob_gap_mean", "generated_tokens",
        "train_tokens", "is_weight_mean", "is_weight_max", "staleness_mean", "staleness_max",
        "groups_dropped", "weight_version", "engine_version"]
runs = [[json.loads(l) for l in open(p)] for p in sys.argv[1:]]
if len(runs[0]) != len(runs[1]) or not runs[0]:
    sys.exit(f"FAILED: {len(runs[0])} and {len(runs[1])} metric rows")
diffs = [(a["step"], k, a.get(k), b.get(k)) for a, b in zip(*runs) for k in keys if a.get(k) != b.get(k)]
for d in diffs[:10]:
    print("step %s %s: %r vs %r" % d)
if diffs:
    sys.exit(f"FAILED: {len(diffs)} figures differ between two runs of the same flags")
print(f"ok: {len(runs[0])} steps x {len(keys)} figures equal in both runs")
PY
