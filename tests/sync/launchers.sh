#!/bin/sh
# Runs one colocated-rl command as NNODES "nodes" on this machine (default 2): one launcher per
# node, joined by MASTER_ADDR/MASTER_PORT/NNODES/NODE_RANK. Prints node 0's output; fails if any
# node fails.
#   [NNODES=N] launchers.sh BINARY ARGS...
# MASTER_PORT is chosen below the kernel's ephemeral range (32768+), where a port another test
# holds for a moment (a server on port 0, a client socket) cannot take it; if it is taken anyway,
# by a test that asked for it, the run is tried again on another port.
set -u
export MASTER_ADDR=127.0.0.1 NNODES="${NNODES:-2}"
attempt=0
while :; do
  MASTER_PORT=$((20000 + ($$ * 7 + attempt * 977) % 12000))
  export MASTER_PORT
  log=$(mktemp)
  others=""
  node=1
  while [ "$node" -lt "$NNODES" ]; do
    NODE_RANK=$node "$@" >/dev/null 2>&1 &
    others="$others $!"
    node=$((node + 1))
  done
  NODE_RANK=0 "$@" >"$log" 2>&1
  rc=$?
  attempt=$((attempt + 1))
  if [ $rc -ne 0 ] && [ $attempt -lt 3 ] && grep -q "cannot host the rendezvous store on port" "$log"; then
    # The other nodes may be waiting on whoever holds the port: stop them rather than wait out
    # their timeout.
    kill $others 2>/dev/null
    for p in $others; do wait "$p"; done
    echo "port $MASTER_PORT is taken; trying another"
    rm -f "$log"
    continue
  fi
  for p in $others; do wait "$p" || rc=1; done
  cat "$log"
  rm -f "$log"
  exit $rc
done
