#!/usr/bin/env bash
# hwcheck-broker.sh runs the whole path on a real NVIDIA machine: a broker,
# an agent on the NVML backend, a PyTorch job submitted with `spillway run`
# that must see its card through CUDA_VISIBLE_DEVICES (a UUID), `spillway
# top` showing that job's process, memory and compute, and leak cleanup: a
# job whose grandchild escapes with setsid and keeps 2 GiB on the card; the
# agent must kill it when the job ends and give the card back clean.
#
#   onprem/gpu/nvml/hwcheck-broker.sh ./spillway 2>&1 | tee hwcheck-broker.log
#
# Prints everything; the last lines are PASS/FAIL per check.
set -uo pipefail
BIN=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
WORK=$(mktemp -d /tmp/hwcheck-broker.XXXXXX)
PORT=${HWCHECK_PORT:-18480}
RESULTS=()
result() { RESULTS+=("$1 $2"); echo "$1 $2"; }
section() { printf '\n===== %s =====\n' "$*"; }
cleanup() {
	[ -n "${AGENT:-}" ] && kill -INT "$AGENT" 2>/dev/null && sleep 2
	[ -n "${BROKER:-}" ] && kill -INT "$BROKER" 2>/dev/null
	[ -f "$WORK/leak.pid" ] && kill -9 "$(cat "$WORK/leak.pid")" 2>/dev/null
	sleep 1
}
trap cleanup EXIT
USER_TOKEN=hwcheck-user-token-0123456789
cat >"$WORK/broker.yaml" <<YAML
listen: 127.0.0.1:$PORT
dataDir: $WORK/data
scheduler: {interval: 200ms}
agents: {heartbeatInterval: 1s, lostAfter: 5}
auth:
  tokens:
    - {name: alice, role: user, team: nlp, token: $USER_TOKEN}
    - {name: agents, role: agent, token: hwcheck-agent-token-0123456789}
YAML
export SPILLWAY_SERVER=http://127.0.0.1:$PORT SPILLWAY_TOKEN=$USER_TOKEN SPILLWAY_CONFIG=/nonexistent

section "broker and agent (--gpus nvml)"
"$BIN" server --config "$WORK/broker.yaml" >"$WORK/broker.log" 2>&1 &
BROKER=$!
sleep 1
"$BIN" agent --broker "$SPILLWAY_SERVER" --token hwcheck-agent-token-0123456789 --name gpu-node \
	--gpus nvml --data-dir "$WORK/agent" >"$WORK/agent.log" 2>&1 &
AGENT=$!
for _ in $(seq 1 30); do "$BIN" nodes 2>/dev/null | grep -q ' ready ' && break; sleep 0.5; done
echo '$ spillway nodes'
"$BIN" nodes
if "$BIN" nodes 2>/dev/null | grep -q ' ready '; then result PASS agent-registered-with-nvml; else result FAIL agent-registered-with-nvml; cat "$WORK/agent.log"; fi

section "a PyTorch job through the broker"
cat >"$WORK/train.py" <<'PY'
import os, time, torch
print("CUDA_VISIBLE_DEVICES=" + os.environ["CUDA_VISIBLE_DEVICES"], flush=True)
print("device: " + torch.cuda.get_device_name(0), flush=True)
hold = torch.ones(3 * 2**30, dtype=torch.uint8, device="cuda")
a = torch.randn(8192, 8192, device="cuda")
end = time.time() + 15
n = 0
while time.time() < end:
    (a @ a).sum().item()
    n += 1
print(f"matmuls: {n}", flush=True)
PY
echo "\$ spillway run --gpus 1 --time 5m --wait -- python3 train.py"
"$BIN" run --gpus 1 --time 5m --name train --wait -- python3 "$WORK/train.py" >"$WORK/train.out" 2>&1 &
RUN=$!
sleep 9
echo '$ spillway top   (while the job runs)'
"$BIN" top | tee "$WORK/top.txt"
wait $RUN
RC=$?
cat "$WORK/train.out"
[ $RC -eq 0 ] && result PASS job-succeeded || result FAIL "job-succeeded (exit $RC)"
grep -q 'CUDA_VISIBLE_DEVICES=GPU-' "$WORK/train.out" && grep -q 'device: NVIDIA' "$WORK/train.out" \
	&& result PASS job-sees-its-card-by-uuid || result FAIL job-sees-its-card-by-uuid
if grep -E '[0-9]+ [0-9.]+GiB \(01' "$WORK/top.txt" | grep -v ' 0%' >/dev/null; then
	result PASS top-shows-job-process-memory-and-compute
else
	result FAIL top-shows-job-process-memory-and-compute
fi

section "leak cleanup: a grandchild that escapes with setsid and keeps the card"
cat >"$WORK/leak.py" <<PY
import os, time, torch
x = torch.ones(2 * 2**30, dtype=torch.uint8, device="cuda")
open("$WORK/leak.pid", "w").write(str(os.getpid()))
time.sleep(600)
PY
"$BIN" run --gpus 1 --time 5m --name leaky --wait -- sh -c "setsid python3 $WORK/leak.py & sleep 15; echo parent exits, grandchild \$(cat $WORK/leak.pid) keeps the card"
sleep 1
LEAK=$(cat "$WORK/leak.pid" 2>/dev/null)
echo "grandchild pid: $LEAK"
for _ in $(seq 1 20); do kill -0 "$LEAK" 2>/dev/null || break; sleep 0.5; done
if [ -n "$LEAK" ] && ! kill -0 "$LEAK" 2>/dev/null; then result PASS leaked-grandchild-killed; else result FAIL leaked-grandchild-killed; fi
grep -i 'left on a gpu' "$WORK/agent.log"
sleep 2
echo '$ nvidia-smi --query-compute-apps=pid,used_memory --format=csv'
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
echo '$ spillway top'
"$BIN" top
if "$BIN" nodes | grep -q UNHEALTHY\|unhealthy; then result FAIL card-back-in-pool; else result PASS card-back-in-pool; fi

section "agent log"
cat "$WORK/agent.log"
section summary
printf '%s\n' "${RESULTS[@]}"
! printf '%s\n' "${RESULTS[@]}" | grep -q ^FAIL
