#!/usr/bin/env bash
# OpenBLAS's kernels follow the CPU (issue 53): where OpenBLAS chose kernels without AVX2 on a CPU
# with AVX2 (Debian's 0.3.21 runs SSE3 kernels on Intel Xeons it does not know), colocated-rl
# re-executes itself with better ones (the RL job says so once, a pipe's output stays clean);
# where OpenBLAS chose well nothing changes; a value the user set is never overridden. On whatever
# CPU CI has: with OpenBLAS's own choice, then with a preloaded openblas_get_corename answering
# "Prescott" as it does on those Xeons (fake_openblas_corename.cpp), so the raise runs everywhere.
set -uo pipefail
bin=$1 fake=$2
fail() { echo "FAILED: $*"; echo "$out"; exit 1; }
good='^(Haswell|Zen|SkylakeX|Cooperlake|SapphireRapids)$'  # OpenBLAS cores with AVX2 kernels

out=$(env -u OPENBLAS_CORETYPE -u CRL_CPU_ISA -u LD_PRELOAD OPENBLAS_VERBOSE=2 "$bin" tokenize --help 2>&1 >/dev/null)
cores=$(grep -o '^Core: .*' <<< "$out" | sed 's/^Core: //')
[ -n "$cores" ] || { echo "SKIPPED: this BLAS is not OpenBLAS (it printed no core)"; exit 77; }
first=$(head -1 <<< "$cores") last=$(tail -1 <<< "$cores")
said=$(grep -c 'OpenBLAS chose' <<< "$out")
if grep -q -w avx2 /proc/cpuinfo && ! [[ $last =~ $good ]]; then
  fail "OpenBLAS runs its $last kernels on a CPU with AVX2"
fi
[ "$said" = 0 ] || fail "a one-shot command announced a change of kernels"
if [[ $first =~ $good ]]; then
  [ "$last" = "$first" ] || fail "OpenBLAS chose $first, yet runs $last"
fi
echo "OpenBLAS: chose $first, runs $last"

# As on an Intel Xeon Debian's OpenBLAS does not know: raised to the project's path; a pipe's
# output stays clean, the RL job says it once.
out=$(env -u OPENBLAS_CORETYPE -u CRL_CPU_ISA LD_PRELOAD="$fake" OPENBLAS_VERBOSE=2 "$bin" tokenize --help 2>&1 >/dev/null)
want=Haswell
grep -q -w avx512f /proc/cpuinfo && grep -q -w avx512bw /proc/cpuinfo && want=SkylakeX
if grep -q -w avx2 /proc/cpuinfo; then
  [ "$(grep -o '^Core: .*' <<< "$out" | tail -1)" = "Core: $want" ] || fail "Prescott was not raised to $want"
  ! grep -q 'OpenBLAS chose' <<< "$out" || fail "a one-shot command announced the raise"
  out=$(env -u OPENBLAS_CORETYPE -u CRL_CPU_ISA LD_PRELOAD="$fake" "$bin" --gpus-infer 1 --gpus-train 1 \
        --steps 1 --sft-steps 0 --prompts-per-step 2 --n-samples 2 --eval-every 0 --timeout 30 2>&1) ||
    fail "the RL job on the raised kernels failed"
  [ "$(grep -c "^OpenBLAS chose its Prescott kernels on this CPU; running its $want kernels" <<< "$out")" = 1 ] ||
    fail "the RL job did not say the raise to $want exactly once"
  echo "OpenBLAS: Prescott raised to $want, said once by the RL job"
fi

[ "$(uname -m)" = x86_64 ] || { echo "PASS (the user's value: x86 core names only)"; exit 0; }
out=$(env -u LD_PRELOAD OPENBLAS_CORETYPE=Prescott OPENBLAS_VERBOSE=2 "$bin" tokenize --help 2>&1 >/dev/null)
last=$(grep -o '^Core: .*' <<< "$out" | tail -1)
[ "$last" = "Core: Prescott" ] || fail "the user's OPENBLAS_CORETYPE=Prescott became '$last'"
! grep -q 'OpenBLAS chose' <<< "$out" || fail "a change was announced over the user's value"
echo "PASS"
