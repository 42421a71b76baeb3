package integration

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/client"
	"github.com/spillway-dev/spillway/onprem/staging/s3server"
	"github.com/spillway-dev/spillway/providers/fakecloud"
	"github.com/spillway-dev/spillway/providers/fakecloud/fakecloudtest"
)

// TestCheckpointFollowsThePreemptedJobToTheCloud is preempt-to-cloud for
// real. A low-priority job on the one on-prem card stages its input from
// versitygw (a real S3 server), reports "checkpoint saved at step 42" with
// its job token, and is preempted by a high-priority job: on its
// checkpoint signal it writes the checkpoint, which the agent uploads
// under a manifest. The high job keeps the card, so the low job bursts to
// the fake EC2; the bootstrapped agent there restores the checkpoint
// (SPILLWAY_RESUME=1), the job finishes from step 42 and its output lands
// in the bucket. The ledger shows the job's staging overhead apart from
// its on-prem and its cloud GPU-hours.
func TestCheckpointFollowsThePreemptedJobToTheCloud(t *testing.T) {
	fakecloudtest.RequireSSHD(t)
	s3srv := s3server.Start(t)
	s3srv.Bucket("spill")
	ctx := context.Background()
	if _, err := s3srv.Client().PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("spill"), Key: aws.String("in/words.txt"),
		Body: strings.NewReader("tokens for training")}); err != nil {
		t.Fatal(err)
	}
	ec2 := fakecloudtest.NewEC2(t, fakecloud.EC2Options{SSHD: true, BootTime: 200 * time.Millisecond})
	remote := burstHostDir(t)
	creds := s3Credentials(t, remote)
	data := fmt.Sprintf(`{s3: {endpoint: "%s", region: us-east-1, pathStyle: true, credentialsFile: "%s"}, cacheBytes: 104857600, retry: {backoff: 100000000, maxBackoff: 1000000000}}`,
		s3srv.Endpoint, creds)
	c := burstCluster(t, ec2, remote, withConfig(nlpBucket), withBurst("agentData: "+data))
	agentCfg := filepath.Join(c.dir, "agent.yaml")
	if err := os.WriteFile(agentCfg, []byte("data: "+data+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	start(t, "agent onprem-1", "agent", "--config", agentCfg, "--broker", c.url, "--token", tokAgent, "--name", "onprem-1",
		"--gpus", "sim:1xH100-80GB,seed="+filepath.Base(c.dir), "--data-dir", filepath.Join(c.dir, "agent-onprem-1"))
	c.waitNodes(1)

	script := fmt.Sprintf(`set -e
if [ "$SPILLWAY_RESUME" = 1 ]; then
  mkdir -p out
  echo "resumed from step $(cat ckpt/step) on $SPILLWAY_JOB_ID attempt $SPILLWAY_ATTEMPT; input: $(cat input/words.txt)" > out/result.txt
  exit 0
fi
mkdir -p ckpt
cat input/words.txt
trap 'echo 42 > ckpt/step; exit 0' USR1
%s checkpoint 42
while :; do sleep 0.1; done`, bin)
	low, err := c.client(tokAlice).SubmitSpec(ctx, broker.Spec{
		Name: "train-low", Priority: "low", Preemptible: true, Burst: broker.BurstAllowed,
		Resources: broker.Resources{GPUs: 1},
		Timeout:   broker.Duration(5 * time.Minute),
		Checkpoint: broker.Checkpoint{Signal: "SIGUSR1", Grace: broker.Duration(20 * time.Second),
			Dir: "ckpt", To: "s3://spill/ckpt/train-low/", Keep: 2},
		Inputs:  []broker.Input{{From: "s3://spill/in/", To: "input"}},
		Outputs: []broker.Output{{From: "out", To: "s3://spill/out/train-low/", When: "success"}},
		Command: []string{"sh", "-c", script},
	})
	if err != nil {
		t.Fatal(err)
	}
	c.waitJob(low.ID, 30*time.Second, "running on-prem with its step reported", func(s string) bool {
		j, err := c.client(tokAlice).Job(ctx, low.ID)
		return err == nil && s == "running" && j.CheckpointStep != nil && *j.CheckpointStep == 42
	})

	release := filepath.Join(c.dir, "release-high")
	defer os.WriteFile(release, nil, 0o600)
	high, err := c.client(tokBob).SubmitSpec(ctx, broker.Spec{
		Name: "urgent", Priority: "high", Burst: broker.BurstNever,
		Resources: broker.Resources{GPUs: 1},
		Timeout:   broker.Duration(3 * time.Minute),
		Command:   []string{"sh", "-c", "while [ ! -e " + release + " ]; do sleep 0.1; done"},
	})
	if err != nil {
		t.Fatal(err)
	}
	c.waitJob(high.ID, 30*time.Second, "running", func(s string) bool { return s == "running" })
	c.waitJob(low.ID, 90*time.Second, "succeeded after resuming in the cloud", func(s string) bool { return s == "succeeded" })
	_ = os.WriteFile(release, nil, 0o600)

	// The output, written by the resumed attempt from the restored step.
	o, err := s3srv.Client().GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("spill"), Key: aws.String("out/train-low/result.txt")})
	if err != nil {
		t.Fatalf("output not in the bucket: %v", err)
	}
	out, _ := io.ReadAll(o.Body)
	o.Body.Close()
	if want := "resumed from step 42 on " + low.ID + " attempt 2; input: tokens for training\n"; string(out) != want {
		t.Fatalf("output %q, want %q", out, want)
	}
	// The checkpoint was committed by a manifest.
	lst, err := s3srv.Client().ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String("spill"), Prefix: aws.String("ckpt/train-low/")})
	if err != nil {
		t.Fatal(err)
	}
	manifests := 0
	for _, ob := range lst.Contents {
		if strings.HasSuffix(*ob.Key, ".manifest.json") {
			manifests++
		}
	}
	if manifests == 0 {
		t.Fatalf("no committed checkpoint under ckpt/train-low/: %d objects", len(lst.Contents))
	}

	got, err := c.client(tokAlice).Job(ctx, low.ID)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	preempted := false
	for _, tr := range got.History {
		if tr.To == broker.StateStarting {
			nodes = append(nodes, tr.Detail)
		}
		preempted = preempted || tr.To == broker.StatePreempted
	}
	if !preempted || len(nodes) != 2 || !strings.Contains(nodes[0], "onprem-1") || strings.Contains(nodes[1], "onprem-1") {
		t.Fatalf("low job placements %v (preempted %v)", nodes, preempted)
	}
	if got.Data == nil || got.Data.Restored == "" {
		t.Fatalf("the cloud attempt restored no checkpoint: %+v", got.Data)
	}

	status, _, _ := c.cli(tokAlice, "status", low.ID)
	for _, want := range []string{"resumed from checkpoint", "inputs 0.0 GB", "saved at step 42"} {
		if !strings.Contains(status, want) {
			t.Errorf("spillway status lacks %q:\n%s", want, status)
		}
	}
	nodesOut, _, _ := c.cli(tokAdmin, "nodes")
	if !strings.Contains(nodesOut, "hit ratio") {
		t.Errorf("spillway nodes shows no cache:\n%s", nodesOut)
	}

	// The ledger: staging overhead, on-prem and cloud GPU-hours of the job.
	deadline := time.Now().Add(30 * time.Second)
	var byKind map[string]int64
	for {
		rep, err := c.client(tokAdmin).Usage(ctx, client.BillingQuery{By: "job,pool-kind,kind"})
		if err != nil {
			t.Fatal(err)
		}
		byKind = map[string]int64{}
		for _, row := range rep.Rows {
			if row.Key[0] == low.ID {
				byKind[strings.Join(row.Key[1:], "/")] += row.GPUMillis
			}
		}
		if byKind["onprem/usage"] > 0 && byKind["cloud/usage"] > 0 && byKind["onprem/staging"]+byKind["cloud/staging"] > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ledger of job %s by pool kind and kind: %v", low.ID, byKind)
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Logf("ledger of %s (GPU-ms): %v", low.ID, byKind)
}
