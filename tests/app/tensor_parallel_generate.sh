#!/bin/sh
# `generate --tp 2` against `--tp 1` on the embedded default model: the same token ids for greedy
# and seeded samples, log-probs within float rounding. Usage: tensor_parallel_generate.sh BINARY
set -eu
bin=$1
run() {
  "$bin" generate --prompt 'Question: what is 3 plus 4? Answer:' --n 3 --max-tokens 24 --seed 3 \
    --ignore-eos --json --tp "$1" | grep '^{'
  "$bin" generate --prompt 'Question: what is 3 plus 4? Answer:' --max-tokens 24 --temperature 0 \
    --ignore-eos --json --tp "$1" | grep '^{'
}
one=$(run 1)
two=$(run 2)
python3 - "$one" "$two" <<'PY'
import json, sys
a = [json.loads(l) for l in sys.argv[1].splitlines()]
b = [json.loads(l) for l in sys.argv[2].splitlines()]
assert len(a) == len(b) == 2, (len(a), len(b))
for x, y in zip(a, b):
    for ox, oy in zip(x["outputs"], y["outputs"], strict=True):
        assert ox["token_ids"] == oy["token_ids"], (ox["token_ids"], oy["token_ids"])
        assert len(ox["token_ids"]) == 24
        worst = max(abs(p - q) for p, q in zip(ox["logprobs"], oy["logprobs"], strict=True))
        assert worst < 1e-3, worst
print("tp 2 == tp 1: %d samples, tokens equal, log-probs within 1e-3" % sum(len(x["outputs"]) for x in a))
PY
