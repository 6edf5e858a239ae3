#!/usr/bin/env bash
# Runs the RL job twice with the same flags and checks that every learning figure of every step
# (loss, gradient norm, rewards, accuracies, log-prob gaps, token counts, versions, staleness) is
# the same in both --metrics files, bit for bit. Timing figures are not compared.
#   rl_reproducible.sh BINARY FLAGS...
# CRL_RUN1_FLAGS / CRL_RUN2_FLAGS (split on spaces) add flags to one run only: two ways of running
# that must learn the same (the colocated hand-over against the fan-out, say).
set -euo pipefail
bin=$1
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for run in 1 2; do
  extra=CRL_RUN${run}_FLAGS
  # shellcheck disable=SC2086  # the extra flags are words
  if ! "$bin" "$@" ${!extra:-} --metrics "$dir/run$run.jsonl" >"$dir/run$run.log" 2>&1; then
    echo "FAILED: run $run exited non-zero"
    cat "$dir/run$run.log"
    exit 1
  fi
  grep -E '^summary:|^weight sync: (paired|fan-out)|^colocated:|memory hand-over|held-out accuracy [0-9.]+ ->|^ZeRO-3 weight updates' "$dir/run$run.log"
  grep -E 'held-out accuracy' "$dir/run$run.log" | sed -E 's/ \([0-9.]* s\)$//; s/, [0-9.]* s\)$/)/' >"$dir/evals$run.txt"
done
if ! diff "$dir/evals1.txt" "$dir/evals2.txt"; then
  echo "FAILED: the held-out evaluations differ between two runs of the same flags"
  exit 1
fi
python3 - "$dir/run1.jsonl" "$dir/run2.jsonl" <<'PY'
import json, sys
# The learning figures (verl's names and the project's), not the timing ones.
keys = ["training/global_step", "actor/pg_loss", "actor/kl_loss", "actor/pg_clipfrac",
        "actor/grad_norm", "actor/lr", "critic/score/mean", "crl/reward_std", "crl/accuracy",
        "val-core/held_out/acc/mean@1", "crl/logprob_gap_max", "crl/logprob_gap_mean",
        "rollout_corr/kl", "rollout_corr/k3_kl", "response_length/mean", "crl/generated_tokens",
        "actor/entropy", "response_length/max", "response_length/min",
        "perf/total_num_tokens", "crl/is_weight_mean", "crl/is_weight_max", "crl/staleness_mean",
        "crl/staleness_max", "crl/groups_dropped", "crl/weight_version", "crl/engine_version",
        "crl/frac_reward_zero_std"]
runs = [[r["data"] for r in map(json.loads, open(p)) if not ({"config", "eval", "phase"} & r.keys())]
        for p in sys.argv[1:]]
if len(runs[0]) != len(runs[1]) or not runs[0]:
    sys.exit(f"FAILED: {len(runs[0])} and {len(runs[1])} metric rows")
absent = [k for k in keys if k != "val-core/held_out/acc/mean@1" and any(k not in d for d in runs[0])]
if absent:
    sys.exit(f"FAILED: metrics rows without {absent}")
diffs = [(a["training/global_step"], k, a.get(k), b.get(k))
         for a, b in zip(*runs) for k in keys if a.get(k) != b.get(k)]
# The SFT warm-up's rows too (loss, grad norm, lr per step).
sft = [[r for r in map(json.loads, open(p)) if r.get("phase") == "sft"] for p in sys.argv[1:]]
if len(sft[0]) != len(sft[1]):
    sys.exit(f"FAILED: {len(sft[0])} and {len(sft[1])} SFT rows")
diffs += [(a["step"], "sft " + k, a["data"][k], b["data"][k])
          for a, b in zip(*sft) for k in a["data"] if a["data"][k] != b["data"].get(k)]
for d in diffs[:10]:
    print("step %s %s: %r vs %r" % d)
if diffs:
    sys.exit(f"FAILED: {len(diffs)} figures differ between the two runs")
print(f"ok: {len(runs[0])} steps x {len(keys)} figures and {len(sft[0])} SFT steps equal in both runs")
PY
