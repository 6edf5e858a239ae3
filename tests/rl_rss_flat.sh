#!/usr/bin/env bash
# Streaming rollouts: a train rank's peak RSS must not grow with prompts x samples at a fixed
# micro-batch size. Runs the RL job at 1x and 4x the prompts per step and compares the peak
# train-rank RSS both report (within 20%).
#   rl_rss_flat.sh BINARY
set -euo pipefail
bin=$1
common=(--gpus-infer 1 --gpus-train 1 --steps 2 --sft-steps 0 --n-samples 8 --max-tokens 24
        --temperature 1.5 --micro-batch-tokens 512 --eval-every 0 --eval-rows 8 --timeout 60)
rss() {
  "$bin" "${common[@]}" --prompts-per-step "$1" 2>&1 | tee /dev/stderr |
    sed -n 's/.*peak train-rank RSS \([0-9.]*\) MiB.*/\1/p'
}
small=$(rss 8)
large=$(rss 32)
echo "peak train-rank RSS: 8 prompts x 8 samples ${small} MiB, 32 prompts x 8 samples ${large} MiB"
awk -v a="$small" -v b="$large" 'BEGIN { r = b / a; printf "ratio %.3f\n", r; exit (a > 0 && r <= 1.2) ? 0 : 1 }'
