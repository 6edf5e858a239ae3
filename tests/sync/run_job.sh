#!/usr/bin/env bash
# Runs a multi-process colocated-rl job and checks how it ended.
#   run_job.sh pass|fail MAX_SECONDS REGEX -- command...
# pass: exit code 0; fail: non-zero. In both cases the output must match REGEX (grep -E; several
# patterns separated by ' ;; ' must each match some line, in any order; a pattern written !P must
# match no line), the job
# must end within MAX_SECONDS, and no process of the job may outlive it (found by an environment
# marker that only the job's processes carry).
set -u
expect=$1 max=$2 regex=$3
shift 4
marker="job-$$-$RANDOM$RANDOM"
log=$(mktemp)
start=$(date +%s.%N)
env TEST_JOB_MARKER="$marker" "$@" >"$log" 2>&1
rc=$?
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
sleep 0.3
survivors=""
for p in /proc/[0-9]*; do
  if { tr '\0' '\n' <"$p/environ"; } 2>/dev/null | grep -qx "TEST_JOB_MARKER=$marker"; then
    survivors="$survivors ${p#/proc/}"
  fi
done
fail() {
  echo "FAILED: $1 (exit code $rc, ${elapsed}s)"
  echo "----- output -----"
  cat "$log"
  rm -f "$log"
  [ -n "$survivors" ] && kill -9 $survivors 2>/dev/null
  exit 1
}
[ "$expect" = pass ] && [ $rc -ne 0 ] && fail "expected exit code 0"
[ "$expect" = fail ] && [ $rc -eq 0 ] && fail "expected a non-zero exit code"
rest=$regex
while [ -n "$rest" ]; do
  pattern=${rest%% ;; *}
  if [ "$pattern" = "$rest" ]; then rest=""; else rest=${rest#* ;; }; fi
  if [ "${pattern#!}" != "$pattern" ]; then
    ! grep -Eq -- "${pattern#!}" "$log" || fail "output matches /${pattern#!}/: $(grep -E -- "${pattern#!}" "$log" | head -1 | cut -c1-200)"
  else
    grep -Eq -- "$pattern" "$log" || fail "output does not match /$pattern/"
  fi
done
[ -n "$survivors" ] && fail "processes outlived the job:$survivors"
if [ "$(echo "$elapsed > $max" | bc)" = 1 ]; then fail "took longer than ${max}s"; fi
grep -E -- "${regex%% ;; *}" "$log" | head -3
echo "ok: exit code $rc in ${elapsed}s, no process left"
rm -f "$log"
