#!/usr/bin/env bash
# Every command-line mistake a new user makes gets one line that names the flag, file or command,
# a non-zero exit and no stack trace (issue 52); --version, bare help and --config work.
#   cli_errors.sh BINARY WORKDIR
set -u
bin=$1 work=$2
mkdir -p "$work"
failed=0
# expect_error REGEX ARGS...: exit code non-zero, exactly one line of output, matching REGEX.
expect_error() {
  local regex=$1
  shift
  local out rc
  out=$("$bin" "$@" 2>&1 </dev/null)
  rc=$?
  local lines
  lines=$(printf '%s\n' "$out" | grep -c .)
  if [ $rc -eq 0 ] || [ "$lines" -ne 1 ] || ! printf '%s' "$out" | grep -Eq -- "$regex"; then
    echo "FAILED: colocated-rl $* (exit $rc, $lines lines), expected one line matching /$regex/:"
    printf '%s\n' "$out" | head -20
    failed=1
  fi
}
expect_error "unknown command 'trian' \(did you mean 'train'\?\)" trian
expect_error "unknown flag --stepz \(did you mean --steps\?\); not understood: --stepz 3 --lrr 1" --stepz 3 --lrr 1
expect_error "unknown flag --max-tokenz \(did you mean --max-tokens\?\)" generate --max-tokenz 3
expect_error "^--gpus-infer: 0 is out of range: give a whole number >= 1" --gpus-infer 0
expect_error "^--steps: -5 is out of range: give a whole number >= 0" --steps -5
expect_error "^--ppo-mini-batches: 0 is out of range: give a whole number >= 1" --ppo-mini-batches 0
expect_error "--tis-cap with --ppo-mini-batches or --ppo-epochs above 1: .*use --tis-cap 0" --ppo-epochs 2 --tis-cap 2
expect_error "^--reward-timeout: 0 is out of range: give a number from 0.001 to 86400" --reward-timeout 0
expect_error "--model Qwen/Qwen3-0.6B: no such directory; it looks like a Hugging Face hub id.*huggingface-cli download Qwen/Qwen3-0.6B --local-dir qwen3-0.6b" --model Qwen/Qwen3-0.6B
expect_error "--model Qwen/Qwen3-0.6B: no such directory; it looks like a Hugging Face hub id" generate --model Qwen/Qwen3-0.6B
expect_error "--model Qwen/Qwen3-0.6B: no such directory; it looks like a Hugging Face hub id" serve --model Qwen/Qwen3-0.6B
expect_error "--model $work: no config.json there" --model "$work"
expect_error "--config $work/none.toml: .*not readable" --config "$work/none.toml"
expect_error "--config is given twice" --config a.toml --config b.toml
# --device cuda where there is no CUDA: one line from every command (skipped on a CUDA build).
if "$bin" --version | grep -q "no CUDA"; then
  expect_error "^.*--device cuda: this build has no CUDA" generate --device cuda --max-tokens 2
  expect_error "^.*--device cuda: this build has no CUDA" serve --device cuda
fi
out=$(printf 'hello world\n' | "$bin" tokenize 2>&1)
if [ $? -eq 0 ] || ! printf '%s' "$out" | grep -q "<stdin>:1: not JSON: each line is an object such as {\"text\": \"...\"}"; then
  echo "FAILED: tokenize of a plain text line: $out"; failed=1
fi
# --version names the commit; bare colocated-rl prints help and exits 0.
v=$("$bin" --version) || { echo "FAILED: --version exit $?"; failed=1; }
printf '%s' "$v" | grep -Eq '^colocated-rl [0-9]+\.[0-9]+\.[0-9]+ \(commit [0-9a-f]{7,}' || { echo "FAILED: --version said: $v"; failed=1; }
h=$("$bin") || { echo "FAILED: bare colocated-rl exit $?"; failed=1; }
printf '%s' "$h" | grep -q "Usage: colocated-rl \[OPTIONS\] \[SUBCOMMAND\]" || { echo "FAILED: bare colocated-rl: $h" | head -5; failed=1; }
# --help: option groups, lines of at most 100 columns, for every command.
for cmd in train generate serve bench sync-check make-model merge-lora tokenize; do
  long=$("$bin" $cmd --help | awk 'length($0) > 100' | head -3)
  [ -z "$long" ] || { echo "FAILED: $cmd --help has lines over 100 columns: $long"; failed=1; }
done
"$bin" train --help | grep -q "^Data and rewards:" || { echo "FAILED: train --help has no 'Data and rewards' group"; failed=1; }
# --config FILE: its flags; the command line wins.
printf 'steps = 2\nsft-steps = 2\neval-every = 0\nprompts-per-step = 2\nn-samples = 2\neval-rows = 2\n[serve]\nport = 1\n' > "$work/run.toml"
out=$("$bin" --gpus-infer 1 --gpus-train 1 --config "$work/run.toml" --steps 1 --timeout 60 2>&1)
printf '%s' "$out" | grep -q "sft step 2/2" && printf '%s' "$out" | grep -q "summary: 1 node(s) x (1 infer + 1 train ranks), 1 GRPO steps" || { echo "FAILED: --config: $out" | tail -5; failed=1; }
# A nested command's flags and section, and a flag turned off by the file.
printf '[bench.rollout]\nshape = "nonesuch"\n' > "$work/bench.toml"
out=$("$bin" bench rollout --config "$work/bench.toml" 2>&1)
printf '%s' "$out" | grep -q "nonesuch" || { echo "FAILED: --config [bench.rollout]: $out" | head -3; failed=1; }
printf 'deterministic = false\nsteps = 0\nsft-steps = 1\neval-rows = 2\n' > "$work/off.toml"
out=$("$bin" --gpus-infer 1 --gpus-train 1 --config "$work/off.toml" --timeout 60 2>&1)
printf '%s' "$out" | grep -q "summary: 1 node(s) x (1 infer + 1 train ranks), 0 GRPO steps" || { echo "FAILED: --config with a false flag: $out" | tail -3; failed=1; }
[ $failed -eq 0 ] && echo "cli errors: PASS"
exit $failed
