package integration

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// TestPreemptCheckpointResume runs the real broker and a simulated agent
// with 2 GPUs. A preemptible low-priority job holds both; a high-priority
// job arrives and preempts it. The low job receives its checkpoint signal
// (SIGUSR1: it writes a marker file and exits), goes back to the queue,
// and after the high job has run it starts again with SPILLWAY_RESUME=1.
func TestPreemptCheckpointResume(t *testing.T) {
	c := newCluster(t, "")
	c.agent("node-a", "sim:2xH100-80GB")
	c.waitNodes(1)
	ctx := context.Background()
	marker := filepath.Join(c.dir, "checkpointed")
	resumed := filepath.Join(c.dir, "resumed")
	script := `trap 'echo checkpoint > "$MARKER"; exit 0' USR1
if [ "$SPILLWAY_RESUME" = 1 ]; then echo resumed > "$RESUMED"; exit 0; fi
echo training
while true; do sleep 0.1; done`
	low, err := c.client(tokAlice).SubmitSpec(ctx, broker.Spec{
		Name: "train-low", Priority: "low", Preemptible: true,
		Resources:  broker.Resources{GPUs: 2},
		Timeout:    broker.Duration(5 * time.Minute),
		Checkpoint: broker.Checkpoint{Signal: "SIGUSR1", Grace: broker.Duration(20 * time.Second)},
		Env:        map[string]string{"MARKER": marker, "RESUMED": resumed},
		Command:    []string{"sh", "-c", script},
	})
	if err != nil {
		t.Fatal(err)
	}
	c.waitJob(low.ID, 15*time.Second, "running", func(s string) bool { return s == "running" })

	high, err := c.client(tokBob).SubmitSpec(ctx, broker.Spec{
		Name: "urgent", Priority: "high",
		Resources: broker.Resources{GPUs: 2},
		Timeout:   broker.Duration(time.Minute),
		Command:   []string{"sh", "-c", "echo high ran; sleep 1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	c.waitJob(high.ID, 20*time.Second, "succeeded", func(s string) bool { return s == "succeeded" })
	if raw, err := os.ReadFile(marker); err != nil || strings.TrimSpace(string(raw)) != "checkpoint" {
		t.Fatalf("the low job did not checkpoint on its signal: %q, %v", raw, err)
	}
	c.waitJob(low.ID, 20*time.Second, "succeeded after resuming", func(s string) bool { return s == "succeeded" })
	if raw, err := os.ReadFile(resumed); err != nil || strings.TrimSpace(string(raw)) != "resumed" {
		t.Fatalf("the low job did not resume with SPILLWAY_RESUME=1: %q, %v", raw, err)
	}

	got, err := c.client(tokAlice).Job(ctx, low.ID)
	if err != nil {
		t.Fatal(err)
	}
	var path []broker.State
	var stop string
	for _, tr := range got.History {
		path = append(path, tr.To)
		if tr.To == broker.StatePreempted {
			stop = tr.Detail
		}
	}
	want := []broker.State{broker.StatePending, broker.StateStarting, broker.StateRunning, broker.StatePreempted,
		broker.StatePending, broker.StateStarting, broker.StateRunning, broker.StateSucceeded}
	if !slices.Equal(path, want) {
		t.Fatalf("low job's history: %v, want %v", path, want)
	}
	if !strings.Contains(stop, "preempted by job "+high.ID) || got.Retries != 0 || got.Attempt != 2 {
		t.Fatalf("preemption record: %q retries=%d attempt=%d", stop, got.Retries, got.Attempt)
	}
}
