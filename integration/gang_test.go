package integration

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// rendezvous is the job of the gang tests: a python3 (stdlib) program
// that meets the other members at MASTER_ADDR:MASTER_PORT the way a
// launcher's TCP store does, exchanges ranks and checks the contract.
const rendezvous = `
import os, socket, sys, time
env = os.environ
rank, nnodes = int(env["NODE_RANK"]), int(env["NNODES"])
assert int(env["WORLD_SIZE"]) == nnodes * int(env["GPUS_PER_NODE"]), "WORLD_SIZE"
assert len(env["SPILLWAY_GANG_HOSTS"].split(",")) == nnodes, "SPILLWAY_GANG_HOSTS"
addr = (env["MASTER_ADDR"], int(env["MASTER_PORT"]))
if rank == 0:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", addr[1])); s.listen(nnodes)
    seen = []
    for _ in range(nnodes - 1):
        c, _ = s.accept(); seen.append(int(c.recv(16).decode())); c.sendall(b"0"); c.close()
    print("rank 0 met ranks", sorted(seen), flush=True)
    sys.exit(0 if sorted(seen) == list(range(1, nnodes)) else 1)
deadline = time.time() + 60
while True:
    try:
        c = socket.create_connection(addr, timeout=5); break
    except OSError:
        if time.time() > deadline: raise
        time.sleep(0.2)
c.sendall(str(rank).encode()); got = c.recv(16).decode(); c.close()
print("rank", rank, "met rank", got, flush=True)
sys.exit(0 if got == "0" else 1)
`

func gangSpec(name string, cmd ...string) broker.Spec {
	return broker.Spec{
		Name: name, Resources: broker.Resources{GPUs: 2, Nodes: 2},
		Timeout:    broker.Duration(5 * time.Minute),
		Checkpoint: broker.Checkpoint{Signal: "SIGUSR1", Grace: broker.Duration(30 * time.Second)},
		Command:    cmd,
	}
}

// TestGangRendezvous runs a 2-node × 2-GPU gang on two simulated agents:
// both members start after the barrier and meet at MASTER_ADDR:MASTER_PORT.
func TestGangRendezvous(t *testing.T) {
	c := newCluster(t, "")
	c.agent("node-a", "sim:2xH100-80GB")
	c.agent("node-b", "sim:2xH100-80GB")
	c.waitNodes(2)
	ctx := context.Background()
	j, err := c.client(tokAlice).SubmitSpec(ctx, gangSpec("rdzv", "/usr/bin/python3", "-c", rendezvous))
	if err != nil {
		t.Fatal(err)
	}
	c.waitJob(j.ID, 90*time.Second, "succeeded", func(s string) bool { return s == "succeeded" })
	out, _, _ := c.cli(tokAlice, "logs", j.ID)
	if !strings.Contains(out, "met rank") {
		t.Fatalf("the members did not meet; log:\n%s", out)
	}
	got, err := c.client(tokAlice).Job(ctx, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Attempt != 1 || got.GangPort < 29500 || got.GangPort > 30499 {
		t.Fatalf("attempt %d, MASTER_PORT %d", got.Attempt, got.GangPort)
	}
}

// TestGangMemberKilled kills one member's process: the other gets the
// checkpoint signal (and its grace), and the gang goes back to the queue
// once, as one job, then succeeds.
func TestGangMemberKilled(t *testing.T) {
	c := newCluster(t, "")
	c.agent("node-a", "sim:2xH100-80GB")
	c.agent("node-b", "sim:2xH100-80GB")
	c.waitNodes(2)
	ctx := context.Background()
	pidFile := filepath.Join(c.dir, "rank1.pid")
	marker := filepath.Join(c.dir, "signalled")
	script := `if [ "$SPILLWAY_ATTEMPT" != 1 ]; then exit 0; fi
if [ "$NODE_RANK" = 1 ]; then echo $$ > "$PIDFILE"; exec sleep 600; fi
trap 'echo "rank $NODE_RANK got USR1" > "$MARKER"; exit 0' USR1
while true; do sleep 0.1; done`
	spec := gangSpec("killed", "sh", "-c", script)
	spec.RestartPolicy, spec.MaxRetries = broker.RestartOnFailure, 1
	spec.Env = map[string]string{"PIDFILE": pidFile, "MARKER": marker}
	j, err := c.client(tokAlice).SubmitSpec(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	c.waitJob(j.ID, 90*time.Second, "running", func(s string) bool { return s == "running" })
	var pid int
	deadline := time.Now().Add(60 * time.Second)
	for pid == 0 && time.Now().Before(deadline) {
		raw, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(raw)))
		if pid == 0 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if pid == 0 {
		t.Fatal("rank 1 never wrote its pid")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	c.waitJob(j.ID, 120*time.Second, "succeeded after one requeue", func(s string) bool { return s == "succeeded" })
	if raw, err := os.ReadFile(marker); err != nil || strings.TrimSpace(string(raw)) != "rank 0 got USR1" {
		t.Fatalf("rank 0 was not stopped with its checkpoint signal: %q, %v", raw, err)
	}
	got, err := c.client(tokAlice).Job(ctx, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	requeues := 0
	var why string
	for _, tr := range got.History {
		if tr.To == broker.StatePending && tr.From != "" {
			requeues++
			why = tr.Detail
		}
	}
	if requeues != 1 || got.Retries != 1 || got.Attempt != 2 || !strings.Contains(why, "gang member 1 on node-") {
		t.Fatalf("requeues=%d retries=%d attempt=%d (%q); history %+v", requeues, got.Retries, got.Attempt, why, got.History)
	}
}

// TestGangPreflightDriverMismatch: node-b's driver changed under its
// agent; the preflight fails naming the difference, no member's command
// runs, and the scheduler does not pair the two nodes again.
func TestGangPreflightDriverMismatch(t *testing.T) {
	c := newCluster(t, "")
	ctlB := filepath.Join(c.dir, "ctl-b")
	c.agent("node-a", "sim:2xH100-80GB")
	c.agent("node-b", "sim:2xH100-80GB,control="+ctlB)
	c.waitNodes(2)
	if err := os.WriteFile(filepath.Join(ctlB, "driver"), []byte("555.42\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ran := filepath.Join(c.dir, "ran")
	spec := gangSpec("preflight", "sh", "-c", `touch "$RAN-$NODE_RANK"`)
	spec.Env = map[string]string{"RAN": ran}
	j, err := c.client(tokAlice).SubmitSpec(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	var detail string
	deadline := time.Now().Add(90 * time.Second)
	for detail == "" && time.Now().Before(deadline) {
		got, err := c.client(tokAlice).Job(ctx, j.ID)
		if err == nil {
			for _, tr := range got.History {
				if tr.Reason == "preflight_failed" {
					detail = tr.Detail
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(detail, "member 1 on node-") || !strings.Contains(detail, "driver") ||
		!(strings.Contains(detail, "555.42") && strings.Contains(detail, "sim")) {
		t.Fatalf("preflight failure %q does not name the member and the driver difference", detail)
	}
	out, _, _ := c.cli(tokAlice, "explain", j.ID)
	if !strings.Contains(out, "555.42") {
		t.Fatalf("explain does not show the difference:\n%s", out)
	}
	c.waitJob(j.ID, 30*time.Second, "pending, not paired again", func(s string) bool { return s == "pending" })
	got, err := c.client(tokAlice).Job(ctx, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Attempt != 1 || len(got.AvoidPairs) != 1 || got.AvoidPairs[0] != broker.Pair("node-a", "node-b") {
		t.Fatalf("attempt %d, avoided pairs %v", got.Attempt, got.AvoidPairs)
	}
	for _, r := range []string{"-0", "-1"} {
		if _, err := os.Stat(ran + r); err == nil {
			t.Fatalf("member%s's command ran despite the failed preflight", r)
		}
	}
}
