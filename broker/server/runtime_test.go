package server

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/report"
	"github.com/spillway-dev/spillway/onprem/agentapi"
)

func TestMountOutsideAllowListIs400NamingTheSource(t *testing.T) {
	h := newHarness(t)
	h.srv.cfg().Mounts = []broker.MountRule{{Source: "/data/datasets", ReadOnly: true}}
	var e struct {
		Error struct{ Code, Message, Field string } `json:"error"`
	}
	code := h.do("POST", "/v1/jobs", tokAlice, `{"resources": {"gpus": 1}, "command": ["true"], "mounts": [{"source": "/data/datasets/x", "target": "/d", "readOnly": true}, {"source": "/etc", "target": "/etc2"}]}`, &e)
	if code != http.StatusBadRequest || e.Error.Field != "mounts[1].source" || !strings.Contains(e.Error.Message, "allow-list") {
		t.Fatalf("got %d %+v", code, e)
	}
	// Allowed: accepted, and the assignment carries it.
	j := h.submit(tokAlice, `{"resources": {"gpus": 1, "memory": "1Gi"}, "command": ["true"], "image": "registry.example.com/nlp/train:1", "mounts": [{"source": "/data/datasets/x", "target": "/d", "readOnly": true}]}`)
	a := h.agent("n1", 8)
	a.sync()
	h.cycle()
	resp := a.sync()
	if len(resp.Start) != 1 || resp.Start[0].Job != j.ID {
		t.Fatalf("no start: %+v", resp)
	}
	s := resp.Start[0]
	if s.Image != "registry.example.com/nlp/train:1" || s.Memory != 1<<30 || s.User != "alice" || len(s.Mounts) != 1 || s.Mounts[0] != (agentapi.Mount{Source: "/data/datasets/x", Target: "/d", ReadOnly: true}) {
		t.Fatalf("assignment %+v", s)
	}
}

func TestUploadsByContentHash(t *testing.T) {
	h := newHarness(t)
	body := []byte("not really a tarball, the broker only stores it")
	sum := sha256.Sum256(body)
	hash := "sha256:" + hex.EncodeToString(sum[:])
	if code := h.do("HEAD", "/v1/uploads/"+hash, tokAlice, nil, nil); code != http.StatusNotFound {
		t.Fatalf("head before upload: %d", code)
	}
	// A job may not name an archive the broker does not hold.
	var e struct {
		Error struct{ Field string } `json:"error"`
	}
	if code := h.do("POST", "/v1/jobs", tokAlice, `{"resources": {"gpus": 1}, "command": ["true"], "workdirUpload": "`+hash+`"}`, &e); code != http.StatusBadRequest || e.Error.Field != "workdirUpload" {
		t.Fatalf("submit naming a missing upload: %d %+v", code, e)
	}
	put := func(data []byte, hash string) int {
		req, _ := http.NewRequest("PUT", h.http.URL+"/v1/uploads/"+hash, bytes.NewReader(data))
		req.Header.Set("Authorization", "Bearer "+tokAlice)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := put([]byte("other bytes"), hash); code != http.StatusBadRequest {
		t.Fatalf("a body that does not match its hash: %d", code)
	}
	if code := put(body, hash); code != http.StatusCreated {
		t.Fatalf("put: %d", code)
	}
	if code := put(body, hash); code != http.StatusOK {
		t.Fatalf("second put: %d", code)
	}
	if code := h.do("HEAD", "/v1/uploads/"+hash, tokAlice, nil, nil); code != http.StatusOK {
		t.Fatalf("head after upload: %d", code)
	}
	if code := h.do("HEAD", "/v1/uploads/sha256:../../etc", tokAlice, nil, nil); code != http.StatusBadRequest && code != http.StatusNotFound {
		t.Fatalf("a bad hash: %d", code)
	}
	h.submit(tokAlice, `{"resources": {"gpus": 1}, "command": ["true"], "workdirUpload": "`+hash+`"}`)
	// Agents fetch it; people cannot.
	if code := h.do("GET", agentapi.PathUploads+hash, tokAlice, nil, nil); code != http.StatusForbidden {
		t.Fatalf("a user fetching an upload: %d", code)
	}
	req, _ := http.NewRequest("GET", h.http.URL+agentapi.PathUploads+hash, nil)
	req.Header.Set("Authorization", "Bearer "+tokAgent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	got.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Equal(got.Bytes(), body) {
		t.Fatalf("agent fetch: %d %q", resp.StatusCode, got.String())
	}
}

func TestImageNotFoundFailsAtOnceAndExplainSaysSo(t *testing.T) {
	h := newHarness(t)
	j := h.submit(tokAlice, `{"resources": {"gpus": 1}, "command": ["true"], "image": "registry.example.com/nlp/nope:1", "restartPolicy": "OnFailure", "maxRetries": 3}`)
	a := h.agent("n1", 8)
	a.sync()
	h.cycle()
	a.sync()
	// The agent pulls: the job stays starting and shows the progress.
	for ref, r := range a.jobs {
		if ref.Job == j.ID {
			r.Progress = "pulling image 0.3/1.0 GB"
		}
	}
	a.sync()
	var got broker.Job
	h.do("GET", "/v1/jobs/"+j.ID, tokAlice, nil, &got)
	if got.State != broker.StateStarting || got.Progress != "pulling image 0.3/1.0 GB" {
		t.Fatalf("while pulling: state %s progress %q", got.State, got.Progress)
	}
	for ref, r := range a.jobs {
		if ref.Job == j.ID {
			r.State, r.ExitCode, r.Reason, r.Progress = agentapi.RunFailedToStart, 127, agentapi.ReasonImageNotFound, ""
			r.Message = "image not found: registry.example.com/nlp/nope:1 is not in the node's image cache and could not be pulled (manifest unknown)"
			r.EndedAt = h.clock.Now()
		}
	}
	a.sync()
	got = *h.job(j.ID)
	if got.State != broker.StateFailed || got.Retries != 0 {
		t.Fatalf("state %s retries %d; want failed without a retry", got.State, got.Retries)
	}
	last := got.History[len(got.History)-1]
	if last.Reason != agentapi.ReasonImageNotFound || !strings.Contains(last.Detail, "image not found") {
		t.Fatalf("last transition %+v", last)
	}
	x := h.explain(tokAlice, j.ID)
	if x.Verdict.Code != report.VerdictImageNotFound || !strings.Contains(x.Exit.Runtime, "image not found") {
		t.Fatalf("explain %+v %+v", x.Verdict, x.Exit)
	}
	steps := strings.Join(x.Steps, "\n")
	if !strings.Contains(steps, "runtime: image not found") {
		t.Fatalf("steps:\n%s", steps)
	}
}

func TestOOMByLimitInExplainBeforeTheLog(t *testing.T) {
	h := newHarness(t)
	j := h.submit(tokAlice, `{"resources": {"gpus": 1, "memory": "32Mi"}, "command": ["true"]}`)
	a := h.agent("n1", 8)
	a.sync()
	h.cycle()
	a.sync()
	a.sync()
	h.writeLog(j.ID, "allocating\nKilled\n")
	for ref, r := range a.jobs {
		if ref.Job == j.ID {
			r.State, r.ExitCode, r.Signal, r.Reason = agentapi.RunExited, 137, "SIGKILL", agentapi.ReasonOOMLimit
			r.Message, r.EndedAt = "OOM-killed by its memory limit (resources.memory 32Mi)", h.clock.Now()
		}
	}
	a.sync()
	x := h.explain(tokAlice, j.ID)
	if x.Verdict.Code != report.VerdictMemoryLimit || x.Exit.OOM != "limit" {
		t.Fatalf("explain %+v %+v", x.Verdict, x.Exit)
	}
	steps := strings.Join(x.Steps, "\n")
	rt, lg := strings.Index(steps, "runtime: OOM-killed by its memory limit (resources.memory 32Mi)"), strings.Index(steps, "| allocating")
	if rt < 0 || lg < 0 || rt > lg {
		t.Fatalf("the runtime's account should come before the log:\n%s", steps)
	}
}
