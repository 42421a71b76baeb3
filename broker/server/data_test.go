package server

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/report"
	"github.com/spillway-dev/spillway/broker/state"
	"github.com/spillway-dev/spillway/onprem/agentapi"
	"github.com/spillway-dev/spillway/onprem/staging"
)

func dataHarness(t *testing.T) *harness {
	h := newHarness(t)
	h.srv.cfg().Teams = append(h.srv.cfg().Teams, config.Team{Name: "nlp", Share: 1, Buckets: []string{"s3://nlp-data/", "gs://nlp-ckpt"}})
	return h
}

const dataSpec = `{"resources": {"gpus": 1}, "timeout": "4h", "preemptible": true, "restartPolicy": "OnFailure", "maxRetries": 3,
	"inputs": [{"from": "s3://nlp-data/sets/v1/", "to": "data"}],
	"outputs": [{"from": "out", "to": "s3://nlp-data/runs/1/"}],
	"checkpoint": {"signal": "SIGUSR1", "grace": "1m", "dir": "ckpt", "to": "gs://nlp-ckpt/run1/", "keep": 2},
	"command": ["train"]}`

func TestSubmitRefusesLocationsOutsideTheTeamsBuckets(t *testing.T) {
	h := dataHarness(t)
	var body agentapi.ErrorBody
	code := h.do("POST", "/v1/jobs", tokAlice, `{"resources": {"gpus": 1}, "command": ["x"], "inputs": [{"from": "s3://finance/salaries.csv", "to": "x"}]}`, &body)
	if code != http.StatusBadRequest || !strings.Contains(body.Error.Message+body.Error.Field, "inputs[0].from") {
		t.Fatalf("%d %+v", code, body)
	}
	// Team vision has no buckets at all.
	code = h.do("POST", "/v1/jobs", tokBob, `{"resources": {"gpus": 1}, "command": ["x"], "checkpoint": {"dir": "c", "to": "gs://nlp-ckpt/x/"}}`, &body)
	if code != http.StatusBadRequest || !strings.Contains(body.Error.Message+body.Error.Field, "checkpoint.to") {
		t.Fatalf("%d %+v", code, body)
	}
}

func TestStagingIsReportedChargedApartAndTheJobReportsItsCheckpointStep(t *testing.T) {
	h := dataHarness(t)
	a := h.agent("n1", 1)
	j := h.submit(tokAlice, dataSpec)
	h.cycle()
	resp := a.sync()
	if len(resp.Start) != 1 {
		t.Fatalf("no start: %+v", resp)
	}
	as := resp.Start[0]
	want := &agentapi.Data{Inputs: []staging.Input{{From: "s3://nlp-data/sets/v1/", To: "data"}},
		Outputs:    []staging.Output{{From: "out", To: "s3://nlp-data/runs/1/", When: "always"}},
		Checkpoint: &agentapi.DataCheckpoint{Dir: "ckpt", To: "gs://nlp-ckpt/run1/", Keep: 2}}
	if as.Data == nil || len(as.Data.Inputs) != 1 || *as.Data.Checkpoint != *want.Checkpoint || as.Data.Outputs[0] != want.Outputs[0] {
		t.Fatalf("data order %+v", as.Data)
	}
	if _, ok := as.Env["SPILLWAY_RESUME"]; ok {
		t.Fatal("SPILLWAY_RESUME set by the broker for a checkpoint.to job")
	}
	// The agent stages for 90 s: progress shows on the job.
	start := h.clock.Now()
	rep := a.jobs[as.JobRef]
	rep.Data = &agentapi.DataReport{Phase: agentapi.PhaseInputs, Done: 3_100_000_000, Total: 10_000_000_000, Spans: []agentapi.Span{{Start: start}}}
	h.advance(90*time.Second, a)
	got := h.job(j.ID)
	if got.Data == nil || got.Data.Phase != "inputs" || got.Data.Done != 3_100_000_000 {
		t.Fatalf("job data %+v", got.Data)
	}
	rep.Data = &agentapi.DataReport{Phase: agentapi.PhaseRunning, InputBytes: 10_000_000_000,
		Spans: []agentapi.Span{{Start: start, End: h.clock.Now()}}}
	h.advance(150*time.Second, a)

	// "checkpoint saved at step 1200", with the job's token.
	var ans api.CheckpointAnswer
	if code := h.do("POST", "/v1/jobs/"+j.ID+"/checkpoint", as.Env["SPILLWAY_JOB_TOKEN"], `{"step": 1200}`, &ans); code != http.StatusOK || ans.Step != 1200 {
		t.Fatalf("checkpoint report: %d %+v", code, ans)
	}
	got = h.job(j.ID)
	if got.CheckpointStep == nil || *got.CheckpointStep != 1200 || got.LastCheckpointAt == nil || !got.LastCheckpointAt.Equal(h.clock.Now()) {
		t.Fatalf("checkpoint step %v at %v", got.CheckpointStep, got.LastCheckpointAt)
	}
	for _, bad := range []struct {
		tok, body string
		code      int
	}{
		{as.Env["SPILLWAY_JOB_TOKEN"], `{"step": -1}`, http.StatusBadRequest},
		{as.Env["SPILLWAY_JOB_TOKEN"], `{"step": "x"}`, http.StatusBadRequest},
		{jobTokenPrefix + j.ID + ".forged", `{"step": 5}`, http.StatusUnauthorized},
		{tokBob, `{"step": 5}`, http.StatusNotFound},
	} {
		if code := h.do("POST", "/v1/jobs/"+j.ID+"/checkpoint", bad.tok, bad.body, nil); code != bad.code {
			t.Errorf("%s: %d, want %d", bad.body, code, bad.code)
		}
	}

	a.exit(j.ID, 0, "")
	h.advance(3*time.Minute, a)
	if got := h.job(j.ID); got.State != broker.StateSucceeded {
		t.Fatalf("state %s", got.State)
	}
	var staged, computed int64
	_, entries := h.ledgerFor(j.ID)
	for _, e := range entries {
		switch e.Kind {
		case billing.KindStaging:
			staged += e.GPUMillis
		case billing.KindUsage:
			computed += e.GPUMillis
		}
	}
	if staged != 90_000 || computed < 150_000 {
		t.Fatalf("ledger: staging %d GPU-ms, usage %d GPU-ms", staged, computed)
	}
}

func TestAMissingInputFailsTheJobOnceWithItsURI(t *testing.T) {
	h := dataHarness(t)
	a := h.agent("n1", 1)
	j := h.submit(tokAlice, dataSpec)
	h.cycle()
	a.sync()
	for ref, r := range a.jobs {
		if ref.Job == j.ID {
			r.State, r.ExitCode, r.EndedAt = agentapi.RunFailedToStart, 127, h.clock.Now()
			r.Reason, r.Message = agentapi.ReasonInputMissing, "input not found: s3://nlp-data/sets/v1/"
		}
	}
	h.advance(5*time.Minute, a)
	got := h.job(j.ID)
	if got.State != broker.StateFailed || got.Retries != 0 || got.Attempt != 1 {
		t.Fatalf("state %s retries %d attempt %d", got.State, got.Retries, got.Attempt)
	}
	last := got.History[len(got.History)-1]
	if last.Reason != "input_missing" || !strings.Contains(last.Detail, "s3://nlp-data/sets/v1/") {
		t.Fatalf("last transition %+v", last)
	}
	var x api.Explanation
	if code := h.do("GET", "/v1/jobs/"+j.ID+"/explain", tokAlice, nil, &x); code != http.StatusOK {
		t.Fatal(code)
	}
	if x.Verdict.Code != report.VerdictInputMissing || !strings.Contains(x.Verdict.Sentence, "s3://nlp-data/sets/v1/") {
		t.Fatalf("verdict %+v", x.Verdict)
	}
}

func TestGPUWaitsOnDataIsFlagged(t *testing.T) {
	h := dataHarness(t)
	a := h.agent("n1", 1)
	util := 5
	a.util = &util
	j := h.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "4h", "command": ["train"]}`)
	h.cycle()
	resp := a.sync()
	rep := a.jobs[resp.Start[0].JobRef]
	// 100 MiB/s of reads at 5% compute, for two minutes.
	for i := 0; i < 120; i++ {
		rep.ReadBytes += 100 << 20
		h.advance(time.Second, a)
	}
	got := h.job(j.ID)
	if got.DataWait == nil || !got.DataWait.Active || got.DataWait.ReadBytesPerSec < 50<<20 {
		t.Fatalf("data wait %+v", got.DataWait)
	}
	var x api.Explanation
	h.do("GET", "/v1/jobs/"+j.ID+"/explain", tokAlice, nil, &x)
	if x.Verdict.Code != report.VerdictDataWait || !strings.Contains(x.Verdict.Sentence, "GPU waits on data") || !strings.Contains(x.Verdict.Sentence, "cache") {
		t.Fatalf("verdict %+v", x.Verdict)
	}
	var rep2 api.UtilizationReport
	if code := h.do("GET", "/v1/reports/utilization?from="+h.clock.Now().Add(-time.Hour).UTC().Format(time.RFC3339)+"&to="+h.clock.Now().Add(time.Hour).UTC().Format(time.RFC3339), tokAdmin, nil, &rep2); code != http.StatusOK {
		t.Fatalf("report: %d", code)
	}
	if len(rep2.DataWaits) != 1 || rep2.DataWaits[0].Job != j.ID || rep2.DataWaits[0].Flag != "GPU waits on data" || !strings.Contains(rep2.DataWaits[0].Hint, "cache") {
		t.Fatalf("report data waits %+v", rep2.DataWaits)
	}
	// Computing again clears it.
	util = 90
	for i := 0; i < 5; i++ {
		rep.ReadBytes += 100 << 20
		h.advance(time.Second, a)
	}
	if got := h.job(j.ID); got.DataWait == nil || got.DataWait.Active {
		t.Fatalf("data wait after compute resumed %+v", got.DataWait)
	}
}

func TestDataWaitStep(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	st := state.IO{}
	var waiting bool
	for i := 0; i <= 61; i++ {
		st, waiting, _ = dataWaitStep(st, 1, t0.Add(time.Duration(i)*time.Second), int64(i)*(30<<20), 10, true)
		if waiting != (i >= 60) {
			t.Fatalf("second %d: waiting %v", i, waiting)
		}
	}
	// Without telemetry, or on a new attempt, nothing is concluded.
	if _, w, _ := dataWaitStep(st, 1, t0.Add(62*time.Second), 62*(30<<20), 0, false); w {
		t.Fatal("waiting without telemetry")
	}
	if _, w, _ := dataWaitStep(st, 2, t0.Add(62*time.Second), 62*(30<<20), 10, true); w {
		t.Fatal("waiting carried to a new attempt")
	}
}

// TestAReportedCheckpointMakesTheCheaperVictim: two equal low jobs share a
// node; one reports "checkpoint saved at step N" with its job token. A
// high job that needs one card preempts that one: it loses the least work.
func TestAReportedCheckpointMakesTheCheaperVictim(t *testing.T) {
	h := dataHarness(t)
	a := h.agent("n1", 2)
	spec := `{"resources": {"gpus": 1}, "priority": "low", "preemptible": true, "timeout": "4h", "command": ["train"]}`
	j1 := h.submit(tokAlice, spec)
	j2 := h.submit(tokAlice, spec)
	h.cycle()
	resp := a.sync()
	if len(resp.Start) != 2 {
		t.Fatalf("starts %+v", resp.Start)
	}
	h.advance(10*time.Minute, a)
	for _, as := range resp.Start {
		if as.Job == j2.ID {
			if code := h.do("POST", "/v1/jobs/"+j2.ID+"/checkpoint", as.Env["SPILLWAY_JOB_TOKEN"], `{"step": 5000}`, nil); code != http.StatusOK {
				t.Fatalf("checkpoint report: %d", code)
			}
		}
	}
	h.advance(time.Minute, a)
	h.submit(tokBob, `{"resources": {"gpus": 1}, "priority": "high", "timeout": "1h", "command": ["urgent"]}`)
	h.cycle()
	if got := h.job(j2.ID); got.Stop == nil || got.Stop.Reason != "preempted" {
		t.Fatalf("the job that checkpointed a minute ago was not the victim: %+v", got.Stop)
	}
	if got := h.job(j1.ID); got.Stop != nil {
		t.Fatalf("the job with 11 minutes of unsaved work was stopped: %+v", got.Stop)
	}
}
