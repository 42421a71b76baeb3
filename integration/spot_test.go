package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/onprem/agent/imdsmock"
	"github.com/spillway-dev/spillway/onprem/agentapi"
	"github.com/spillway-dev/spillway/onprem/staging/s3server"
	"github.com/spillway-dev/spillway/providers/fakecloud"
	"github.com/spillway-dev/spillway/providers/fakecloud/fakecloudtest"
)

// spotRig is a broker whose one provider is the fake EC2 offering one
// machine type at a spot and an on-demand price, with no owned GPUs, so a
// preemptible job bursts to a spot machine. The burst agents keep
// checkpoints in versitygw (reached at s3Endpoint) and read interruption
// notices from mdAddr, where nothing listens until the test starts the
// real amazon-ec2-metadata-mock there.
type spotRig struct {
	c      *cluster
	ec2    *fakecloud.EC2
	s3     *s3server.Server
	remote string
	mdAddr string
	// dead listens at mdAddr until the mock starts; polls counts the
	// connections it dropped.
	dead  net.Listener
	polls atomic.Int64
}

func newSpotRig(t *testing.T, s3srv *s3server.Server, s3Endpoint string) *spotRig {
	t.Helper()
	fakecloudtest.RequireSSHD(t)
	ec2 := fakecloudtest.NewEC2(t, fakecloud.EC2Options{SSHD: true, BootTime: 200 * time.Millisecond})
	remote := burstHostDir(t)
	creds := s3Credentials(t, remote)
	data := fmt.Sprintf(`{s3: {endpoint: "%s", region: us-east-1, pathStyle: true, credentialsFile: "%s"}, retry: {attempts: 3, backoff: 100000000, maxBackoff: 500000000}}`,
		s3Endpoint, creds)
	// Until the test starts the mock, the metadata endpoint takes each
	// connection and drops it: a metadata server that does not answer.
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &spotRig{ec2: ec2, s3: s3srv, remote: remote, mdAddr: dead.Addr().String(), dead: dead}
	t.Cleanup(func() { dead.Close() })
	go func() {
		for {
			conn, err := dead.Accept()
			if err != nil {
				return
			}
			r.polls.Add(1)
			conn.Close()
		}
	}()
	c := burstCluster(t, ec2, remote, withMachineDirs(), withConfig(nlpBucket), withBurst("agentData: "+data),
		withProvider("metadataEndpoint: http://"+r.mdAddr), withInstanceTypes(
			`{name: g6.xlarge, gpuModel: L4, gpus: 1, gpuMemoryGiB: 24, cpus: 4, memoryGiB: 16, onDemandPrice: "0.805", spotPrice: "0.30"}`))
	r.c = c
	return r
}

// spotJob is a preemptible job that saves step 10 in its checkpoint dir
// and reports it, and on its checkpoint signal saves step 42 and exits;
// resumed (SPILLWAY_RESUME=1) it writes the step it found to its output.
func (r *spotRig) spotJob(name string, interval time.Duration) *broker.Job {
	r.c.t.Helper()
	script := fmt.Sprintf(`set -e
if [ "$SPILLWAY_RESUME" = 1 ]; then
  mkdir -p out
  echo "resumed from step $(cat ckpt/step) attempt $SPILLWAY_ATTEMPT" > out/result.txt
  exit 0
fi
mkdir -p ckpt
echo 10 > ckpt/step
trap 'echo 42 > ckpt/step; exit 0' USR1
%s checkpoint 10
while :; do sleep 0.1; done`, bin)
	j, err := r.c.client(tokAlice).SubmitSpec(context.Background(), broker.Spec{
		Name: name, Preemptible: true, Burst: broker.BurstAllowed,
		Resources: broker.Resources{GPUs: 1},
		Timeout:   broker.Duration(10 * time.Minute),
		Checkpoint: broker.Checkpoint{Signal: "SIGUSR1", Grace: broker.Duration(20 * time.Second),
			Dir: "ckpt", To: "s3://spill/ckpt/" + name + "/", Keep: 2, Interval: broker.Duration(interval)},
		Outputs: []broker.Output{{From: "out", To: "s3://spill/out/" + name + "/", When: "success"}},
		Command: []string{"sh", "-c", script},
	})
	if err != nil {
		r.c.t.Fatal(err)
	}
	return j
}

// runningOnSpot waits until the job runs on a spot machine and cond holds,
// and returns that machine's record.
func (r *spotRig) runningOnSpot(j *broker.Job, what string, cond func(*broker.Job) bool) *api.InstanceView {
	t := r.c.t
	t.Helper()
	ctx := context.Background()
	r.c.waitJob(j.ID, 3*time.Minute, what, func(s string) bool {
		got, err := r.c.client(tokAlice).Job(ctx, j.ID)
		return err == nil && s == "running" && cond(got)
	})
	got, err := r.c.client(tokAlice).Job(ctx, j.ID)
	if err != nil || len(got.Placements) != 1 {
		t.Fatalf("job %+v %v", got, err)
	}
	m, err := r.c.client(tokAdmin).Instance(ctx, got.Placements[0].Node)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Offer.Spot {
		t.Fatalf("the preemptible job runs on %s %s, want the spot offer", m.ID, m.Offer.Key())
	}
	return m
}

// noFalseAlarm: while nothing answers at the metadata endpoint the spot
// machine's agent warns once in its log and the broker sees no notice.
func (r *spotRig) noFalseAlarm(j *broker.Job, m *api.InstanceView) {
	t := r.c.t
	t.Helper()
	ctx := context.Background()
	logPath := filepath.Join(r.remote, "opt", m.ID, "agent.log")
	waitFor(t, 2*time.Minute, "the agent's warning that it cannot read notices", func() bool {
		b, _ := os.ReadFile(logPath)
		return bytes.Contains(b, []byte("interruption notices cannot be read"))
	})
	// Three more reads (every 5 s) fail before looking again.
	from := r.polls.Load()
	waitFor(t, 2*time.Minute, "three more failed reads of the metadata endpoint", func() bool { return r.polls.Load() >= from+3 })
	if b, _ := os.ReadFile(logPath); bytes.Count(b, []byte("interruption notices cannot be read")) != 1 {
		t.Fatalf("want one warning for the outage; the agent's log:\n%s", b)
	}
	again, err := r.c.client(tokAdmin).Instance(ctx, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if again.Reclaim != nil || again.State != broker.MachineReady {
		t.Fatalf("false alarm: machine %s %s reclaim %+v with no metadata server", again.ID, again.State, again.Reclaim)
	}
	if got, _ := r.c.client(tokAlice).Job(ctx, j.ID); got.Stop != nil || got.State != broker.StateRunning {
		t.Fatalf("false alarm: job %s stop %+v", got.State, got.Stop)
	}
}

// reclaim starts the metadata mock serving EC2's spot interruption notice
// for two minutes from now, and returns the announced reclaim time.
func (r *spotRig) reclaim() time.Time {
	at := time.Now().Add(2 * time.Minute).UTC().Truncate(time.Second)
	r.dead.Close()
	imdsmock.Start(r.c.t, imdsmock.Options{Addr: r.mdAddr, Time: at})
	return at
}

// jobOutput reads a job's result.txt from its outputs in the bucket.
func jobOutput(t *testing.T, s3srv *s3server.Server, name string) string {
	t.Helper()
	o, err := s3srv.Client().GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String("spill"), Key: aws.String("out/" + name + "/result.txt")})
	if err != nil {
		t.Fatalf("output of %s not in the bucket: %v", name, err)
	}
	defer o.Body.Close()
	b, _ := io.ReadAll(o.Body)
	return string(b)
}

// reclaimedThenResumed checks the job's history: it started on first,
// was reclaimed there with detail containing lost, and started once more,
// on a machine other than first. It returns that machine.
func reclaimedThenResumed(t *testing.T, j *broker.Job, first, lost string) string {
	t.Helper()
	var nodes []string
	var reclaimed []broker.Transition
	for _, tr := range j.History {
		if tr.To == broker.StateStarting {
			nodes = append(nodes, tr.Detail)
		}
		if tr.To == broker.StatePreempted && tr.Reason == agentapi.ReasonSpotReclaim {
			reclaimed = append(reclaimed, tr)
		}
	}
	if len(nodes) != 2 || !strings.Contains(nodes[0], first) || strings.Contains(nodes[1], first) {
		t.Fatalf("placements %v, want one on %s and then one elsewhere", nodes, first)
	}
	if len(reclaimed) != 1 || !strings.Contains(reclaimed[0].Detail, lost) || !strings.Contains(reclaimed[0].Detail, "takes the machine back") {
		t.Fatalf("reclaims in the history %+v, want one whose detail says %q", reclaimed, lost)
	}
	if len(j.Placements) != 1 {
		t.Fatalf("placements %+v", j.Placements)
	}
	return j.Placements[0].Node
}

// noOverlap checks the ledger: the job's lines on the reclaimed machine
// all end before its first line on the next one, and nothing is charged
// on the reclaimed machine after the reclaim time.
func noOverlap(t *testing.T, c *cluster, job, first, second string, reclaimAt time.Time) {
	t.Helper()
	var firstEnd, secondStart time.Time
	var rows []ledgerRow
	waitFor(t, time.Minute, "the ledger to hold the job's lines on both machines", func() bool {
		rows = c.ledger()
		firstEnd, secondStart = time.Time{}, time.Time{}
		for _, r := range rows {
			if r.Job == nil || *r.Job != job || r.Node == nil {
				continue
			}
			start, _ := time.Parse(time.RFC3339Nano, r.Start)
			end, _ := time.Parse(time.RFC3339Nano, r.End)
			switch *r.Node {
			case first:
				if end.After(firstEnd) {
					firstEnd = end
				}
			case second:
				if secondStart.IsZero() || start.Before(secondStart) {
					secondStart = start
				}
			}
		}
		return !firstEnd.IsZero() && !secondStart.IsZero()
	})
	if firstEnd.After(secondStart) {
		t.Fatalf("the job's lines overlap: on %s until %s, on %s from %s", first, firstEnd, second, secondStart)
	}
	for _, r := range rows {
		end, _ := time.Parse(time.RFC3339Nano, r.End)
		if r.Node != nil && *r.Node == first && end.After(reclaimAt) {
			t.Errorf("%s charged past the reclaim at %s: %+v", first, reclaimAt, r)
		}
	}
	t.Logf("job %s: on %s until %s, on %s from %s (reclaim at %s)", job, first, firstEnd.Format(time.TimeOnly),
		second, secondStart.Format(time.TimeOnly), reclaimAt.Format(time.TimeOnly))
}

// machineEnded waits for the reclaimed machine's record to end and checks
// it closed no later than the reclaim.
func machineEnded(t *testing.T, c *cluster, id string, reclaimAt time.Time) {
	t.Helper()
	ctx := context.Background()
	var m *api.InstanceView
	waitFor(t, time.Minute, "the reclaimed machine to end", func() bool {
		var err error
		m, err = c.client(tokAdmin).Instance(ctx, id)
		return err == nil && m.State.Ended()
	})
	if m.Reclaim == nil || !m.Reclaim.At.Equal(reclaimAt) || m.Reclaim.Kind != agentapi.NoticeSpotInterruption {
		t.Fatalf("machine %s reclaim %+v, want the spot notice for %s", id, m.Reclaim, reclaimAt)
	}
	if m.TerminatedAt == nil || m.TerminatedAt.After(reclaimAt) {
		t.Fatalf("machine %s closed at %v, after the reclaim at %s", id, m.TerminatedAt, reclaimAt)
	}
	drained := false
	for _, tr := range m.History {
		drained = drained || (tr.To == broker.State(broker.MachineDraining) && tr.Reason == agentapi.ReasonSpotReclaim)
	}
	if !drained {
		t.Fatalf("machine %s history has no spot_reclaim drain: %+v", id, m.History)
	}
}

// TestSpotReclaimEndToEnd: a preemptible job bursts to a spot machine of
// the fake EC2 (a real sshd host, the real agent started by the
// bootstrap). While its metadata endpoint does not answer the agent warns
// once and nothing happens. Once the job has saved and reported its first
// checkpoint, the real amazon-ec2-metadata-mock starts serving a spot
// interruption notice there: the agent gives the job its checkpoint
// signal, uploads the checkpoint to versitygw, the broker requeues the job
// (no work lost), the spot offer cools down, and the job resumes on an
// on-demand machine from step 42 and finishes. The reclaimed machine
// closes before the reclaim time; the ledger's lines on the two machines
// do not overlap.
func TestSpotReclaimEndToEnd(t *testing.T) {
	s3srv := s3server.Start(t)
	s3srv.Bucket("spill")
	r := newSpotRig(t, s3srv, s3srv.Endpoint)
	ctx := context.Background()
	j := r.spotJob("spot-e2e", 0)
	m := r.runningOnSpot(j, "running on spot with step 10 reported", func(j *broker.Job) bool {
		return j.CheckpointStep != nil && *j.CheckpointStep == 10
	})
	r.noFalseAlarm(j, m)
	reclaimAt := r.reclaim()

	r.c.waitJob(j.ID, 4*time.Minute, "succeeded after resuming elsewhere", func(s string) bool { return s == "succeeded" })
	if out := jobOutput(t, s3srv, "spot-e2e"); out != "resumed from step 42 attempt 2\n" {
		t.Fatalf("output %q, want the resumed attempt from step 42", out)
	}
	got, err := r.c.client(tokAlice).Job(ctx, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	second := reclaimedThenResumed(t, got, m.ID, "no work lost")
	if got.Data == nil || got.Data.Restored == "" {
		t.Fatalf("the resumed attempt restored no checkpoint: %+v", got.Data)
	}
	sm, err := r.c.client(tokAdmin).Instance(ctx, second)
	if err != nil {
		t.Fatal(err)
	}
	if sm.Offer.Spot {
		t.Fatalf("replacement %s is the spot offer, which should be cooling down", sm.Offer.Key())
	}
	machineEnded(t, r.c, m.ID, reclaimAt)
	noOverlap(t, r.c, j.ID, m.ID, second, reclaimAt)
	status, _, _ := r.c.cli(tokAlice, "status", j.ID)
	for _, want := range []string{"spot_reclaim", "no work lost", "resumes from checkpoint"} {
		if !strings.Contains(status, want) {
			t.Errorf("spillway status lacks %q:\n%s", want, status)
		}
	}
}

// refusingBucket stands in front of versitygw and, once armed, answers
// every write under prefix with S3's AccessDenied, as a bucket policy
// denying s3:PutObject on that prefix does; reads pass through.
type refusingBucket struct {
	srv     *httptest.Server
	prefix  string
	armed   atomic.Bool
	refused atomic.Int64
}

func newRefusingBucket(t *testing.T, upstream, prefix string) *refusingBucket {
	u, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	rb := &refusingBucket{prefix: prefix}
	proxy := httputil.NewSingleHostReverseProxy(u)
	rb.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		write := req.Method == http.MethodPut || req.Method == http.MethodPost || req.Method == http.MethodDelete
		if write && rb.armed.Load() && strings.HasPrefix(req.URL.Path, prefix) {
			rb.refused.Add(1)
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>Access Denied</Message><Resource>%s</Resource></Error>`, req.URL.Path)
			return
		}
		proxy.ServeHTTP(w, req)
	}))
	t.Cleanup(rb.srv.Close)
	return rb
}

// TestSpotReclaimCheckpointUploadFails: the job's checkpoint interval
// commits step 10; then the bucket starts refusing checkpoint writes and
// the spot notice comes. The job saves step 42 on its signal, but the
// upload is refused before the reclaim: the job goes back to the queue
// with the lost work since its committed checkpoint in its history (and
// the refused upload), resumes elsewhere from step 10 and finishes.
func TestSpotReclaimCheckpointUploadFails(t *testing.T) {
	s3srv := s3server.Start(t)
	s3srv.Bucket("spill")
	rb := newRefusingBucket(t, s3srv.Endpoint, "/spill/ckpt/")
	r := newSpotRig(t, s3srv, rb.srv.URL)
	ctx := context.Background()
	j := r.spotJob("spot-fail", time.Minute)
	m := r.runningOnSpot(j, "running on spot with its interval checkpoint committed", func(j *broker.Job) bool {
		return j.Data != nil && j.Data.Checkpoint != ""
	})
	committed, _ := r.c.client(tokAlice).Job(ctx, j.ID)
	rb.armed.Store(true)
	reclaimAt := r.reclaim()

	r.c.waitJob(j.ID, 4*time.Minute, "succeeded after resuming elsewhere", func(s string) bool { return s == "succeeded" })
	if rb.refused.Load() == 0 {
		t.Fatal("the bucket refused no checkpoint write")
	}
	if out := jobOutput(t, s3srv, "spot-fail"); out != "resumed from step 10 attempt 2\n" {
		t.Fatalf("output %q, want the resumed attempt from the committed step 10", out)
	}
	got, err := r.c.client(tokAlice).Job(ctx, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	second := reclaimedThenResumed(t, got, m.ID, "lost work: ")
	if got.Data == nil || got.Data.Restored != committed.Data.Checkpoint {
		t.Fatalf("the resumed attempt restored %+v, want the committed checkpoint %s", got.Data, committed.Data.Checkpoint)
	}
	for _, tr := range got.History {
		if tr.To == broker.StatePreempted && !strings.Contains(tr.Detail, "checkpoint upload failed before the reclaim") {
			t.Errorf("the reclaim does not say the upload failed: %s", tr.Detail)
		}
	}
	machineEnded(t, r.c, m.ID, reclaimAt)
	noOverlap(t, r.c, j.ID, m.ID, second, reclaimAt)
	for _, args := range [][]string{{"status", j.ID}, {"explain", j.ID}} {
		out, _, _ := r.c.cli(tokAlice, args...)
		for _, want := range []string{"lost work: ", "checkpoint upload failed before the reclaim"} {
			if !strings.Contains(out, want) {
				t.Errorf("spillway %s lacks %q:\n%s", args[0], want, out)
			}
		}
	}
}
