package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// TestLostNodeAndReturn: the agent goes silent (SIGSTOP) past the node
// TTL; the broker declares the node lost and requeues its job. When the
// agent wakes up it still runs the old attempt: the broker orders it
// killed, and the job runs again as a new attempt.
func TestLostNodeAndReturn(t *testing.T) {
	c := newCluster(t, "")
	ag := c.agent("node-a", "sim:2xH100-80GB")
	c.waitNodes(1)
	ctx := context.Background()
	cl := c.client(tokAlice)
	pids := filepath.Join(c.dir, "pids")
	j, err := cl.SubmitSpec(ctx, broker.Spec{Resources: broker.Resources{GPUs: 1}, Timeout: broker.Duration(time.Minute),
		RestartPolicy: broker.RestartOnFailure, MaxRetries: 1,
		Command: []string{"sh", "-c", "echo $$ >> " + pids + "; sleep 300"}})
	if err != nil {
		t.Fatal(err)
	}
	c.waitJob(j.ID, 10*time.Second, "running", func(s string) bool { return s == "running" })
	if err := ag.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	c.waitJob(j.ID, 10*time.Second, "requeued", func(s string) bool { return s == "pending" })
	nodes, _ := c.client(tokAdmin).Nodes(ctx)
	if nodes[0].State != broker.NodeLost {
		t.Fatalf("node state %s", nodes[0].State)
	}
	ag.cmd.Process.Signal(syscall.SIGCONT)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		got, _ := cl.Job(ctx, j.ID)
		if got.State == broker.StateRunning && got.Attempt == 2 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	got, _ := cl.Job(ctx, j.ID)
	if got.State != broker.StateRunning || got.Attempt != 2 {
		t.Fatalf("after the node came back: %s attempt %d", got.State, got.Attempt)
	}
	var reasons []string
	for _, h := range got.History {
		reasons = append(reasons, h.Reason)
	}
	if !strings.Contains(strings.Join(reasons, ","), "node_lost,requeued") {
		t.Fatalf("history reasons %v", reasons)
	}
	raw, _ := os.ReadFile(pids)
	first := strings.Fields(string(raw))[0]
	var pid int
	for _, ch := range first {
		pid = pid*10 + int(ch-'0')
	}
	deadline = time.Now().Add(30 * time.Second)
	for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if syscall.Kill(pid, 0) == nil {
		t.Fatalf("the first attempt (pid %d) still runs after the broker gave the job away", pid)
	}
	cl.Cancel(ctx, j.ID)
}

// TestIdleReclaim: in a queue whose policy reclaims idle jobs, a job whose
// card computes nothing is ended with reason idle_reclaimed; a busy one in
// the same queue is left alone.
func TestIdleReclaim(t *testing.T) {
	c := newCluster(t, "idle: {threshold: 5, window: 3s, reclaim: [default]}\n")
	c.agent("node-a", "sim:2xH100-80GB")
	c.waitNodes(1)
	ctx := context.Background()
	cl := c.client(tokAlice)
	idle, _ := cl.SubmitSpec(ctx, broker.Spec{Resources: broker.Resources{GPUs: 1}, Timeout: broker.Duration(time.Minute),
		Env: map[string]string{"SIM_GPU_UTIL": "0", "SIM_GPU_MEMORY": "40Gi"}, Command: []string{"sleep", "300"}})
	busy, _ := cl.SubmitSpec(ctx, broker.Spec{Resources: broker.Resources{GPUs: 1}, Timeout: broker.Duration(time.Minute),
		Env: map[string]string{"SIM_GPU_UTIL": "90"}, Command: []string{"sleep", "300"}})
	c.waitJob(idle.ID, 20*time.Second, "reclaimed", func(s string) bool { return s == "failed" })
	got, _ := cl.Job(ctx, idle.ID)
	last := got.History[len(got.History)-1]
	if last.Reason != "idle_reclaimed" || got.IdleSince == nil {
		t.Fatalf("idle job ended with %+v (idleSince %v)", last, got.IdleSince)
	}
	b, _ := cl.Job(ctx, busy.ID)
	if b.State != broker.StateRunning || b.IdleSince != nil {
		t.Fatalf("busy job: %s idle=%v", b.State, b.IdleSince)
	}
	cl.Cancel(ctx, busy.ID)
}
