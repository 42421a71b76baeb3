#!/usr/bin/env bash
# hwcheck.sh checks Spillway's NVML backend on a real NVIDIA machine: the
# probe sees the cards, and while a short PyTorch (or CuPy) job holds about
# 2 GiB on a card and runs matmuls, the probe lists that job's PID with its
# memory and nonzero utilisation; after the job ends the PID is gone.
#
# The machine needs no Go toolchain and no network: build first, then copy.
#
#   make build   (or: CGO_CFLAGS=-Wno-deprecated-declarations go build -o spillway ./cmd/spillway)
#   go test -c -o nvml.test ./onprem/gpu/nvml        # optional: adapter tests on real NVML
#   onprem/gpu/nvml/hwcheck.sh ./spillway [./nvml.test] 2>&1 | tee hwcheck.log
#
# Everything is printed; the last lines are PASS/FAIL per check, and the
# exit status is 0 only when all pass.
#
# Knobs (environment): HWCHECK_GPU (card index for the job, default 0),
# HWCHECK_GIB (memory the job allocates, default 2), HWCHECK_SECONDS (job
# length, default 20), HWCHECK_GPUS (backend spec, default nvml). To
# rehearse on a machine without a GPU, HWCHECK_GPUS=sim:1xH200-141GB runs
# the same steps against the simulated backend with a job that only sleeps.
set -uo pipefail

if [ $# -lt 1 ] || [ ! -x "$1" ]; then
	echo "usage: $0 /path/to/spillway [/path/to/nvml.test]" >&2
	exit 2
fi
BIN=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
TESTBIN=${2:-}
GPUS=${HWCHECK_GPUS:-nvml}
GPU_INDEX=${HWCHECK_GPU:-0}
GIB=${HWCHECK_GIB:-2}
SECONDS_JOB=${HWCHECK_SECONDS:-20}
WORK=$(mktemp -d /tmp/hwcheck.XXXXXX)
JOB_PID=
RESULTS=()

cleanup() {
	if [ -n "$JOB_PID" ] && kill -0 "$JOB_PID" 2>/dev/null; then
		kill "$JOB_PID" 2>/dev/null
	fi
	rm -rf "$WORK"
}
trap cleanup EXIT

section() { printf '\n===== %s =====\n' "$*"; }
result() { RESULTS+=("$1 $2"); echo "$1 $2"; }

# probe NAME: runs the probe, keeps stdout (the JSON) in $WORK/NAME.json.
probe() {
	local name=$1 rc
	echo "\$ spillway agent --probe --gpus $GPUS"
	"$BIN" agent --probe --gpus "$GPUS" >"$WORK/$name.json" 2>"$WORK/$name.err"
	rc=$?
	cat "$WORK/$name.json"
	if [ -s "$WORK/$name.err" ]; then
		echo "--- stderr:"
		cat "$WORK/$name.err"
	fi
	echo "--- exit status $rc"
	return $rc
}

cat >"$WORK/job.py" <<'EOF'
import os, sys, time

seconds, gib, mode = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
if mode == "sim":
    # Rehearsal: the simulated backend reads SIM_GPU_MEMORY from our env.
    lib, step = "sim (sleep)", lambda: time.sleep(0.1)
else:
    try:
        import torch
        dev = torch.device("cuda:0")
        hold = torch.ones(int(gib * 2**30), dtype=torch.uint8, device=dev)
        a = torch.randn(4096, 4096, device=dev)
        def step():
            (a @ a).sum().item()
        lib = "torch " + torch.__version__ + " on " + torch.cuda.get_device_name(0)
    except ImportError:
        import cupy as cp
        hold = cp.ones(int(gib * 2**30), dtype=cp.uint8)
        a = cp.random.rand(4096, 4096, dtype=cp.float32)
        def step():
            float((a @ a).sum())
        lib = "cupy " + cp.__version__
print(f"READY pid={os.getpid()} lib={lib} gib={gib}", flush=True)
end, n = time.time() + seconds, 0
while time.time() < end:
    step()
    n += 1
print(f"DONE steps={n}", flush=True)
EOF

cat >"$WORK/verify.py" <<'EOF'
import json, sys

mode, pid, gib = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
probes = [json.load(open(p)) for p in sys.argv[4:]]

def holders(probe):
    for d in probe["sample"]["devices"]:
        for p in d.get("processes") or []:
            yield d, p

if mode in ("busy", "sim"):
    found = [(d, p) for pr in probes for d, p in holders(pr) if p["pid"] == pid]
    if not found:
        big = [(d["index"], p) for pr in probes for d, p in holders(pr) if p["usedMemoryBytes"] >= gib * 2**30]
        print(f"FAIL nvml-sees-job-pid: PID {pid} not in any probe; processes with >= {gib} GiB: {big} "
              "(a different PID here means a PID namespace between the job and NVML)")
        sys.exit(1)
    d, p = found[-1]
    print(f"PASS nvml-sees-job-pid: PID {pid} ({p.get('name', '?')}) on GPU {d['index']} {d['uuid']}")
    ok = True
    mem = max(p["usedMemoryBytes"] for _, p in found)
    if mem >= gib * 2**30:
        print(f"PASS nvml-sees-job-memory: {mem / 2**30:.2f} GiB >= {gib} GiB")
    else:
        print(f"FAIL nvml-sees-job-memory: {mem / 2**30:.2f} GiB < {gib} GiB")
        ok = False
    util = max(d["smUtil"] for d, _ in found)
    card_mem = max(d["memoryUsedBytes"] for d, _ in found)
    print(f"INFO card while busy: smUtil up to {util}%, memory used up to {card_mem / 2**30:.2f} GiB, "
          f"power {d['powerWatts']} W, {d['temperatureC']} C")
    if util > 0 or mode == "sim":
        print(f"PASS nvml-sees-utilisation: {util}%")
    else:
        print("FAIL nvml-sees-utilisation: 0% in every busy probe")
        ok = False
    sys.exit(0 if ok else 1)

if mode == "after":
    left = [(d["index"], p) for pr in probes for d, p in holders(pr) if p["pid"] == pid]
    if left:
        print(f"FAIL job-pid-gone: still listed after the job ended: {left}")
        sys.exit(1)
    print(f"PASS job-pid-gone: PID {pid} no longer listed")

if mode == "inventory":
    inv = probes[0]["inventory"]
    n = len(inv["devices"])
    topo = inv.get("topology") or []
    print(f"INFO backend={inv['backend']} driver={inv.get('driverVersion')} cuda={inv.get('cudaVersion')} gpus={n}")
    for dev in inv["devices"]:
        print(f"INFO GPU {dev['index']}: {dev['model']} {dev['memoryBytes'] / 2**30:.1f} GiB {dev['uuid']} "
              f"bus {dev.get('pciBusId')} nvlinks {dev.get('nvlinks', 0)} mig {dev.get('mig', False)}")
    good = n > 0 and all(d["uuid"].startswith(("GPU-", "MIG-")) and d["memoryBytes"] > 0 for d in inv["devices"])
    good = good and len(topo) == n and all(len(r) == n and r[i] == "X" for i, r in enumerate(topo))
    print(("PASS" if good else "FAIL") + " inventory: cards with UUIDs, memory and an n x n topology")
    sys.exit(0 if good else 1)
EOF

section host
uname -a
date -u +%FT%TZ
echo "spillway: $BIN"
"$BIN" version 2>/dev/null || true

section nvidia-smi
if command -v nvidia-smi >/dev/null; then
	nvidia-smi
	nvidia-smi topo -m
else
	echo "nvidia-smi not found"
fi

section "probe, idle"
if probe idle; then
	result PASS probe-runs
else
	result FAIL probe-runs
	section summary
	printf '%s\n' "${RESULTS[@]}"
	exit 1
fi
python3 "$WORK/verify.py" inventory 0 0 "$WORK/idle.json"
[ $? -eq 0 ] && RESULTS+=("PASS inventory") || RESULTS+=("FAIL inventory")

section "job: ${GIB} GiB and matmuls for ${SECONDS_JOB}s on GPU $GPU_INDEX"
if [[ $GPUS == sim:* ]]; then
	UUID=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["inventory"]["devices"][int(sys.argv[2])]["uuid"])' "$WORK/idle.json" "$GPU_INDEX")
	CUDA_VISIBLE_DEVICES=$UUID SIM_GPU_MEMORY=${GIB}Gi SIM_GPU_UTIL=90 \
		python3 "$WORK/job.py" "$SECONDS_JOB" "$GIB" sim >"$WORK/job.log" 2>&1 &
else
	CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=$GPU_INDEX \
		python3 "$WORK/job.py" "$SECONDS_JOB" "$GIB" gpu >"$WORK/job.log" 2>&1 &
fi
JOB_PID=$!
echo "job PID $JOB_PID"
for _ in $(seq 1 180); do
	grep -q '^READY' "$WORK/job.log" && break
	kill -0 "$JOB_PID" 2>/dev/null || break
	sleep 0.5
done
cat "$WORK/job.log"
if ! grep -q '^READY' "$WORK/job.log"; then
	result FAIL job-started
	section summary
	printf '%s\n' "${RESULTS[@]}"
	exit 1
fi
sleep 2 # let utilisation register over NVML's sampling window

section "probe, job running (1 of 2)"
probe busy1
if command -v nvidia-smi >/dev/null; then
	echo "\$ nvidia-smi --query-compute-apps=pid,process_name,used_gpu_memory --format=csv"
	nvidia-smi --query-compute-apps=pid,process_name,used_gpu_memory --format=csv
fi
sleep 3
section "probe, job running (2 of 2)"
probe busy2
section "verify, job running"
python3 "$WORK/verify.py" "$([[ $GPUS == sim:* ]] && echo sim || echo busy)" "$JOB_PID" "$GIB" "$WORK/busy1.json" "$WORK/busy2.json" | tee "$WORK/verify-busy.txt"
while read -r verdict name _; do
	[[ $verdict == PASS || $verdict == FAIL ]] && RESULTS+=("$verdict ${name%:}")
done <"$WORK/verify-busy.txt"

section "wait for the job"
wait "$JOB_PID"
echo "job exit status $?"
cat "$WORK/job.log"
sleep 1
section "probe, after the job"
probe after
python3 "$WORK/verify.py" after "$JOB_PID" "$GIB" "$WORK/after.json"
[ $? -eq 0 ] && RESULTS+=("PASS job-pid-gone") || RESULTS+=("FAIL job-pid-gone")

if [ -n "$TESTBIN" ]; then
	section "adapter tests against the real NVML library"
	if [[ $GPUS == sim:* ]]; then
		"$TESTBIN" -test.v -test.count=1 -test.run 'TestOpenRealLibrary'
	else
		SPILLWAY_REQUIRE_NVML=1 "$TESTBIN" -test.v -test.count=1 -test.run 'TestOpenRealLibrary'
	fi
	[ $? -eq 0 ] && result PASS adapter-tests || result FAIL adapter-tests
fi

section summary
printf '%s\n' "${RESULTS[@]}"
for r in "${RESULTS[@]}"; do
	[[ $r == FAIL* ]] && exit 1
done
exit 0
