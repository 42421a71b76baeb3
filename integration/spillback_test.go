package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/onprem/staging/s3server"
	"github.com/spillway-dev/spillway/providers/fakecloud"
	"github.com/spillway-dev/spillway/providers/fakecloud/fakecloudtest"
)

// TestSpillBackEndToEnd: a checkpointable job bursts to the fake EC2 (a
// real sshd host, the real agent) while the one owned card is taken. The
// owned job ends; with nothing else waiting, the spill-back rule weighs
// the job's remaining declared hour at the machine's price against the
// owned rate and moves it home: checkpoint signal, upload to versitygw,
// restore on the owned node, where it finishes. The burst machine is
// deleted. `spillway explain` shows the move with its expected saving, and
// `spillway instances` the machine's reason.
func TestSpillBackEndToEnd(t *testing.T) {
	fakecloudtest.RequireSSHD(t)
	ec2 := fakecloudtest.NewEC2(t, fakecloud.EC2Options{SSHD: true, BootTime: 200 * time.Millisecond})
	remote := burstHostDir(t)
	s3srv := s3server.Start(t)
	s3srv.Bucket("spill")
	creds := s3Credentials(t, remote)
	data := fmt.Sprintf(`{s3: {endpoint: "%s", region: us-east-1, pathStyle: true, credentialsFile: "%s"}, retry: {attempts: 3, backoff: 100000000, maxBackoff: 500000000}}`,
		s3srv.Endpoint, creds)
	// The owned H100 costs 0.50 an hour, the burst machine 9.00: an hour
	// left on the machine is worth moving.
	c := burstCluster(t, ec2, remote, withMachineDirs(), withConfig(nlpBucket), withOnPremRate("0.50"),
		withBurst("agentData: "+data, "spillBack: {enabled: true, margin: 0.5, minInterval: 1h, staging: 10s}"),
		withInstanceTypes(`{name: g6.xlarge, gpuModel: L4, gpus: 1, gpuMemoryGiB: 24, cpus: 4, memoryGiB: 16, onDemandPrice: "9.00"}`))
	agentCfg := filepath.Join(c.dir, "agent.yaml")
	if err := os.WriteFile(agentCfg, []byte("data: "+data+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	start(t, "agent onprem-1", "agent", "--config", agentCfg, "--broker", c.url, "--token", tokAgent, "--name", "onprem-1",
		"--gpus", "sim:1xH100-80GB,seed="+filepath.Base(c.dir), "--data-dir", filepath.Join(c.dir, "agent-onprem-1"))
	c.waitNodes(1)
	ctx := context.Background()

	// The owned card is taken.
	hold, release := c.holdCard(tokBob, "owned")

	script := fmt.Sprintf(`set -e
if [ "$SPILLWAY_RESUME" = 1 ]; then
  mkdir -p out
  echo "resumed from step $(cat ckpt/step) attempt $SPILLWAY_ATTEMPT" > out/result.txt
  exit 0
fi
mkdir -p ckpt
trap 'echo 7 > ckpt/step; exit 0' USR1
%s checkpoint 7
while :; do sleep 0.1; done`, bin)
	j, err := c.client(tokAlice).SubmitSpec(ctx, broker.Spec{
		Name: "long-train", Burst: broker.BurstAllowed,
		Resources: broker.Resources{GPUs: 1},
		Timeout:   broker.Duration(time.Hour),
		Checkpoint: broker.Checkpoint{Signal: "SIGUSR1", Grace: broker.Duration(20 * time.Second),
			Dir: "ckpt", To: "s3://spill/ckpt/long-train/", Keep: 2},
		Outputs: []broker.Output{{From: "out", To: "s3://spill/out/long-train/", When: "success"}},
		Command: []string{"sh", "-c", script},
	})
	if err != nil {
		t.Fatal(err)
	}
	c.waitJob(j.ID, 3*time.Minute, "running on a burst machine with its step reported", func(s string) bool {
		got, err := c.client(tokAlice).Job(ctx, j.ID)
		return err == nil && s == "running" && got.CheckpointStep != nil && len(got.Placements) == 1 && got.Placements[0].Node != "onprem-1"
	})
	got, _ := c.client(tokAlice).Job(ctx, j.ID)
	machine := got.Placements[0].Node
	if _, err := c.client(tokAdmin).Instance(ctx, machine); err != nil {
		t.Fatalf("the job runs on %s, not a burst machine: %v", machine, err)
	}
	// While the owned job runs, the machine stays. (The job can report
	// from the machine's agent a moment before the broker records the
	// bootstrap done.)
	waitFor(t, time.Minute, "machine "+machine+" to be ready while the owned card is taken", func() bool {
		m, err := c.client(tokAdmin).Instance(ctx, machine)
		return err == nil && m.State == broker.MachineReady
	})

	// The owned job ends: the card stands idle while the cloud one is paid.
	release()
	c.waitJob(hold.ID, 30*time.Second, "succeeded", func(s string) bool { return s == "succeeded" })
	c.waitJob(j.ID, 3*time.Minute, "succeeded at home", func(s string) bool { return s == "succeeded" })

	got, err = c.client(tokAlice).Job(ctx, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	var moves []broker.Transition
	for _, tr := range got.History {
		if tr.To == broker.StateStarting {
			nodes = append(nodes, tr.Detail)
		}
		if tr.To == broker.StatePreempted {
			moves = append(moves, tr)
		}
	}
	if len(nodes) != 2 || !strings.Contains(nodes[0], machine) || !strings.Contains(nodes[1], "onprem-1") {
		t.Fatalf("placements %v, want %s then onprem-1", nodes, machine)
	}
	if len(moves) != 1 || moves[0].Reason != burst.StopSpillBack || !strings.Contains(moves[0].Detail, "expected saving") {
		t.Fatalf("preemptions %+v, want one spill_back with its expected saving", moves)
	}
	// The saving is the hour left at 9.00 less the same GPU-time at the
	// owned 0.50: a little under 8.50 (the job ran some seconds).
	var saving float64
	if _, err := fmt.Sscanf(moves[0].Detail[strings.Index(moves[0].Detail, "expected saving"):], "expected saving %f USD", &saving); err != nil ||
		saving < 8.3 || saving > 8.5 {
		t.Fatalf("spill-back %q: want an expected saving of about 8.50 USD (9.00 less the owned 0.50 for the hour left)", moves[0].Detail)
	}
	if got.Data == nil || got.Data.Restored == "" {
		t.Fatalf("the home attempt restored no checkpoint: %+v", got.Data)
	}
	if out := jobOutput(t, s3srv, "long-train"); out != "resumed from step 7 attempt 2\n" {
		t.Fatalf("output %q, want the home attempt resumed from step 7", out)
	}

	// The burst machine is deleted.
	waitFor(t, time.Minute, "the burst machine to end", func() bool {
		m, err := c.client(tokAdmin).Instance(ctx, machine)
		return err == nil && m.State == broker.MachineTerminated
	})
	if ec2.Calls("TerminateInstances") == 0 {
		t.Fatal("no TerminateInstances call")
	}

	explain, _, code := c.cli(tokAlice, "explain", j.ID)
	if code != 0 || !strings.Contains(explain, "Moved home") || !strings.Contains(explain, "expected saving") {
		t.Fatalf("spillway explain (exit %d) does not show the move and its saving:\n%s", code, explain)
	}
	list, _, _ := c.cli(tokAdmin, "instances")
	var row string
	for _, l := range lines(list) {
		if strings.HasPrefix(l, machine+" ") {
			row = l
		}
	}
	if !strings.Contains(row, burst.StopSpillBack) || !strings.Contains(row, "expected saving") {
		t.Fatalf("spillway instances does not give %s's reason:\n%s", machine, list)
	}
	t.Logf("spillway explain:\n%s\nspillway instances:\n%s", explain, list)
}
