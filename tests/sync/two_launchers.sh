#!/bin/sh
# Runs one colocated-rl command as two "nodes" on this machine: two launchers joined by
# MASTER_ADDR/MASTER_PORT/NNODES/NODE_RANK. Prints node 0's output; fails if either node fails.
#   two_launchers.sh BINARY ARGS...
# MASTER_PORT is chosen below the kernel's ephemeral range (32768+), where a port another test
# holds for a moment (a server on port 0, a client socket) cannot take it; if it is taken anyway,
# by a test that asked for it, the run is tried again on another port.
set -u
export MASTER_ADDR=127.0.0.1 NNODES=2
attempt=0
while :; do
  MASTER_PORT=$((20000 + ($$ * 7 + attempt * 977) % 12000))
  export MASTER_PORT
  log=$(mktemp)
  NODE_RANK=1 "$@" >/dev/null 2>&1 &
  node1=$!
  NODE_RANK=0 "$@" >"$log" 2>&1
  rc=$?
  attempt=$((attempt + 1))
  if [ $rc -ne 0 ] && [ $attempt -lt 3 ] && grep -q "cannot host the rendezvous store on port" "$log"; then
    # Node 1 may be waiting on whoever holds the port: stop it rather than wait out its timeout.
    kill $node1 2>/dev/null
    wait $node1
    echo "port $MASTER_PORT is taken; trying another"
    rm -f "$log"
    continue
  fi
  wait $node1 || rc=1
  cat "$log"
  rm -f "$log"
  exit $rc
done
