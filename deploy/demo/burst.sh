#!/bin/sh
# Watch a burst: run against `spillway dev --burst` (make demo starts both).
set -e
S=${SPILLWAY:-./bin/spillway}
waitfor() { # waitfor WHAT COMMAND...: retry COMMAND each second, up to 3 minutes
  what=$1; shift; i=0
  until "$@" >/dev/null 2>&1; do
    i=$((i+1)); [ $i -lt 180 ] || { echo "gave up waiting for $what"; exit 1; }; sleep 1
  done
}

echo "== 1. Fill the owned fleet: one job on both owned GPUs"
fill=$($S run --no-upload --gpus 2 --time 10m --name fill -- sleep 600 | awk '{print $2}')
waitfor "the fill job to run" sh -c "$S status $fill | grep -q '^State: *running'"
$S nodes

echo "== 2. One more GPU job: it waits, bursts to the local cloud, runs there"
$S run --no-upload --gpus 1 --time 30m --wait --name burst-me -- \
  sh -c 'echo "hello from the burst machine, card $CUDA_VISIBLE_DEVICES"; sleep 8'
$S instances

echo "== 3. Idle, the rented machine is deleted"
waitfor "the machine to end" sh -c "$S instances | grep -q terminated"
$S instances

echo "== 4. A bigger burst: the budget says no, the job stays on-prem"
big=$($S run --no-upload --gpus 1 --time 2h --name too-big -- sleep 60 | awk '{print $2}')
waitfor "the budget to block" sh -c "$S status $big | grep -q 'burst blocked'"
$S status $big | grep '^Waiting:'
$S budget list
$S cancel $big $fill

echo "== 5. One ledger: owned, cloud and the rented machine's idle time"
waitfor "the ledger" sh -c "$S bill usage --by pool-kind,kind | grep -q overhead"
$S bill usage --by pool-kind,kind
