package agent

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/spillway-dev/spillway/onprem/agentapi"
	"github.com/spillway-dev/spillway/onprem/gpu/sim"
	"github.com/spillway-dev/spillway/onprem/staging"
	"github.com/spillway-dev/spillway/onprem/staging/s3server"
)

// newDataRig is a rig whose agent reaches a versitygw with bucket "data".
func newDataRig(t *testing.T) (*rig, *s3server.Server) {
	t.Helper()
	s3srv := s3server.Start(t)
	s3srv.Bucket("data")
	for _, kv := range s3srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	fb := newFakeBroker()
	srv := httptest.NewServer(fb)
	t.Cleanup(srv.Close)
	be, err := sim.New("2xH100-80GB", "node-"+strings.ToLower(t.Name()), sim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ag, err := New(Config{Broker: srv.URL, Token: "t", Name: "n1", DataDir: t.TempDir(),
		Data: staging.Config{S3: staging.S3Config{Endpoint: s3srv.Endpoint, PathStyle: true}, CacheBytes: 1 << 30,
			Retry: staging.Retry{Backoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}}},
		be, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &rig{t: t, fb: fb, ag: ag, sim: be, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		ag.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return r, s3srv
}

func (r *rig) assignData(job string, attempt int, data *agentapi.Data, script string) {
	r.fb.mu.Lock()
	defer r.fb.mu.Unlock()
	r.fb.pending = append(r.fb.pending, agentapi.Assignment{
		JobRef: agentapi.JobRef{Job: job, Attempt: attempt}, Argv: []string{"sh", "-c", script},
		Env: map[string]string{"SPILLWAY_JOB_ID": job}, GPUs: []int{0}, UUIDs: []string{r.sim.UUIDs()[0]},
		Timeout: time.Minute, Signal: "SIGTERM", Grace: 5 * time.Second, Data: data,
	})
}

func (r *rig) reportOf(ref agentapi.JobRef) (agentapi.JobReport, bool) {
	r.fb.mu.Lock()
	defer r.fb.mu.Unlock()
	rep, ok := r.fb.reports[ref]
	return rep, ok
}

func (r *rig) waitFor(what string, cond func() bool) {
	r.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			r.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func s3Get(t *testing.T, srv *s3server.Server, key string) string {
	t.Helper()
	o, err := srv.Client().GetObject(t.Context(), &s3.GetObjectInput{Bucket: aws.String("data"), Key: aws.String(key)})
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	defer o.Body.Close()
	b, _ := io.ReadAll(o.Body)
	return string(b)
}

func TestAgentStagesInputsUploadsOutputsAndCarriesTheCheckpoint(t *testing.T) {
	r, srv := newDataRig(t)
	_, err := srv.Client().PutObject(t.Context(), &s3.PutObjectInput{Bucket: aws.String("data"), Key: aws.String("in/words.txt"), Body: strings.NewReader("hello data")})
	if err != nil {
		t.Fatal(err)
	}
	data := &agentapi.Data{
		Inputs:     []staging.Input{{From: "s3://data/in/", To: "input"}},
		Outputs:    []staging.Output{{From: "out", To: "s3://data/runs/j1/", When: staging.WhenSuccess}},
		Checkpoint: &agentapi.DataCheckpoint{Dir: "ckpt", To: "s3://data/ckpt/j1/", Keep: 2},
	}
	// Attempt 1 saves step 7 and waits; it is stopped as a preemption.
	r.assignData("j1", 1, data, `mkdir -p ckpt; echo "resume=${SPILLWAY_RESUME:-0}" ; trap 'echo 7 > ckpt/step; exit 0' TERM; cat input/words.txt; while :; do sleep 0.05; done`)
	ref1 := agentapi.JobRef{Job: "j1", Attempt: 1}
	r.waitFor("attempt 1 to run", func() bool {
		rep, ok := r.reportOf(ref1)
		return ok && rep.Data != nil && rep.Data.Phase == agentapi.PhaseRunning
	})
	rep, _ := r.reportOf(ref1)
	if rep.Data.InputBytes != int64(len("hello data")) || len(rep.Data.Spans) != 1 || rep.Data.Spans[0].End.IsZero() {
		t.Fatalf("staging report %+v", rep.Data)
	}
	// Its trap is set before it prints the input: stop it only then, or
	// a loaded machine may deliver the signal before the trap exists.
	r.waitFor("attempt 1 to print its input", func() bool {
		r.fb.mu.Lock()
		defer r.fb.mu.Unlock()
		return strings.Contains(string(r.fb.logs[ref1]), "hello data")
	})
	r.fb.mu.Lock()
	r.fb.stops = append(r.fb.stops, agentapi.StopOrder{JobRef: ref1, Signal: "SIGTERM", Grace: 5 * time.Second, Reason: "preempted"})
	r.fb.mu.Unlock()
	r.waitFor("attempt 1 to end", func() bool { rep, ok := r.reportOf(ref1); return ok && rep.State != agentapi.RunRunning })
	rep, _ = r.reportOf(ref1)
	if rep.Data.Checkpoint == "" {
		t.Fatalf("no checkpoint committed: %+v", rep.Data)
	}
	// Attempt 2 (on this node; the integration test moves it) restores
	// step 7, is told to resume, and succeeds; its output is uploaded
	// before its end is reported.
	r.assignData("j1", 2, data, `echo "resume=$SPILLWAY_RESUME step=$(cat ckpt/step)"; mkdir -p out; echo "done from $(cat ckpt/step)" > out/result.txt`)
	ref2 := agentapi.JobRef{Job: "j1", Attempt: 2}
	r.waitFor("attempt 2 to end", func() bool { rep, ok := r.reportOf(ref2); return ok && rep.State != agentapi.RunRunning })
	rep, _ = r.reportOf(ref2)
	if rep.ExitCode != 0 || rep.Data.Restored == "" {
		t.Fatalf("attempt 2: %+v data %+v", rep, rep.Data)
	}
	r.fb.mu.Lock()
	log := string(r.fb.logs[ref2])
	log1 := string(r.fb.logs[ref1])
	r.fb.mu.Unlock()
	if !strings.Contains(log1, "resume=0") || !strings.Contains(log1, "hello data") || !strings.Contains(log, "resume=1 step=7") {
		t.Fatalf("logs: attempt 1 %q, attempt 2 %q", log1, log)
	}
	if got := s3Get(t, srv, "runs/j1/result.txt"); got != "done from 7\n" {
		t.Fatalf("output %q", got)
	}
	// The second attempt read the node's cache.
	if s := r.ag.cacheStats(); s == nil || s.Hits != 1 {
		t.Fatalf("cache %+v", s)
	}
}

func TestAMissingInputFailsTheStartWithItsURI(t *testing.T) {
	r, _ := newDataRig(t)
	r.assignData("miss", 1, &agentapi.Data{Inputs: []staging.Input{{From: "s3://data/no/such.bin", To: "x"}}}, "true")
	rep := r.waitEnded("miss", 60*time.Second)
	if rep.State != agentapi.RunFailedToStart || rep.Reason != agentapi.ReasonInputMissing || !strings.Contains(rep.Message, "s3://data/no/such.bin") {
		t.Fatalf("report %+v", rep)
	}
}

func TestParseReadBytes(t *testing.T) {
	if n := parseReadBytes("rchar: 10\nwchar: 3\nread_bytes: 4096\nwrite_bytes: 0\n"); n != 4096 {
		t.Fatalf("got %d", n)
	}
}

// One walk of /proc sums read_bytes per process group: the test's own
// group counts at least this process's bytes read so far, and a group
// with no process counts nothing.
func TestReadBytesByGroup(t *testing.T) {
	raw, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Fatal(err)
	}
	own := parseReadBytes(string(raw))
	pg := syscall.Getpgrp()
	groups := map[int]int64{pg: 0, 1 << 30: 0}
	readBytesByGroup(groups)
	if groups[pg] < own {
		t.Fatalf("group %d read %d bytes, less than this process alone (%d)", pg, groups[pg], own)
	}
	if groups[1<<30] != 0 || len(groups) != 2 {
		t.Fatalf("groups %v", groups)
	}
}

func TestTheCheckpointIsUploadedOnItsIntervalWhileTheJobRuns(t *testing.T) {
	r, srv := newDataRig(t)
	r.assignData("tick", 1, &agentapi.Data{Checkpoint: &agentapi.DataCheckpoint{Dir: "ckpt", To: "s3://data/ckpt/tick/", Keep: 2, Interval: 100 * time.Millisecond}},
		`mkdir -p ckpt; i=0; while :; do i=$((i+1)); echo $i > ckpt/step; sleep 0.05; done`)
	ref := agentapi.JobRef{Job: "tick", Attempt: 1}
	r.waitFor("a checkpoint uploaded while running", func() bool {
		rep, ok := r.reportOf(ref)
		return ok && rep.State == agentapi.RunRunning && rep.Data != nil && rep.Data.Checkpoint != ""
	})
	out, err := srv.Client().ListObjectsV2(t.Context(), &s3.ListObjectsV2Input{Bucket: aws.String("data"), Prefix: aws.String("ckpt/tick/")})
	if err != nil || len(out.Contents) == 0 {
		t.Fatalf("nothing under ckpt/tick/: %v", err)
	}
	r.fb.mu.Lock()
	r.fb.stops = append(r.fb.stops, agentapi.StopOrder{JobRef: ref, Signal: "SIGKILL", Reason: "cancelled"})
	r.fb.mu.Unlock()
	r.waitFor("the end", func() bool { rep, ok := r.reportOf(ref); return ok && rep.State != agentapi.RunRunning })
}
