#!/usr/bin/env bash
# The engine against llama.cpp on the same model, machine and thread count, in turns.
#
#   bench/llamacpp/compare.sh [SHAPE] [THREADS] [DECODE_BATCH] [ROUNDS] [DTYPE]
#   (defaults: smollm2-135m 2 16 3 float32)
#
# Writes a SHAPE model with `colocated-rl make-model`, converts it to GGUF (to_gguf.py), and runs
# `colocated-rl bench rollout`'s probes and bench.mjs (llama.cpp through the prebuilt CPU build in
# npm's node-llama-cpp) alternately ROUNDS times. Prints each side's medians and the ratios:
# prefill tok/s, decode tok/s at DECODE_BATCH sequences, batch-1 decode tok/s, and the batch-1
# step against the weight-read bound that the engine's probe measures.
# Needs node and npm (apt: nodejs npm); node-llama-cpp is installed once under the work folder.
set -euo pipefail
shape=${1:-smollm2-135m}
threads=${2:-2}
batch=${3:-16}
rounds=${4:-3}
dtype=${5:-float32}
here=$(cd "$(dirname "$0")" && pwd)
bin=${CRL_BIN:-$here/../../build/app/colocated-rl}
work=${CRL_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/colocated-rl/llamacpp}
mkdir -p "$work"
if [ ! -d "$work/node_modules/node-llama-cpp" ]; then
  (cd "$work" && npm init -y >/dev/null && npm install --no-audit --no-fund node-llama-cpp@3.22.1 >/dev/null)
fi
cp "$here/bench.mjs" "$work/bench.mjs"
model="$work/$shape-$dtype"
if [ ! -f "$model/model.safetensors" ]; then
  "$bin" make-model --shape "$shape" --dtype "$dtype" --out "$model"
fi
if [ ! -f "$model.gguf" ] || [ "$model.gguf" -ot "$model/model.safetensors" ]; then
  python3 "$here/to_gguf.py" "$model" "$model.gguf"
fi
rm -f "$work/ours.jsonl" "$work/llama.jsonl"
for r in $(seq "$rounds"); do
  echo "round $r/$rounds"
  "$bin" bench rollout --model "$model" --dtype "$dtype" --threads "$threads" --prompts 1 --n 1 \
    --repeats 1 --modes continuous --decode-batch "$batch" --json-out "$work/ours.jsonl" >/dev/null
  (cd "$work" && node bench.mjs "$model.gguf" "$threads" "$batch") >>"$work/llama.jsonl"
done
python3 - "$work/ours.jsonl" "$work/llama.jsonl" <<'EOF'
import json, statistics, sys
ours = [json.loads(l) for l in open(sys.argv[1])]
theirs = [json.loads(l) for l in open(sys.argv[2])]
med = lambda rows, f: statistics.median(f(r) for r in rows)
print(f"cpu: {ours[0]['cpu']}; {ours[0]['threads']} threads, {len(ours)} rounds (medians), model {ours[0]['model']}")
b = ours[0]["probes"]["decode_batch"]
rows = [("prefill tok/s (8 x 512)", "prefill_tok_s"), (f"decode tok/s @{b} seqs", "decode_tok_s"),
        ("batch-1 decode tok/s", "batch1_tok_s")]
print(f"{'':<26}{'colocated-rl':>13}{'llama.cpp':>11}{'ratio':>8}")
for name, key in rows:
    a, c = med(ours, lambda r: r["probes"][key]), med(theirs, lambda r: r[key])
    print(f"{name:<26}{a:>13.1f}{c:>11.1f}{a / c:>7.2f}x")
bound = med(ours, lambda r: r["probes"]["batch1_bandwidth_bound_s"])
for name, step in (("colocated-rl", med(ours, lambda r: r["probes"]["batch1_step_s"])),
                   ("llama.cpp", med(theirs, lambda r: r["batch1_step_s"]))):
    print(f"batch-1 step {name}: {step * 1e3:.1f} ms = {step / bound:.2f}x the weight-read bound "
          f"({bound * 1e3:.1f} ms at the measured read bandwidth)")
EOF
