package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/bolt"
	"github.com/spillway-dev/spillway/broker/report"
	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// TestFinding3LogWedge: a job that prints more than agents.logLimit must
// not wedge its node. Every chunk is acknowledged (the offset the broker
// answers advances past it), the stored log ends with a truncation marker,
// and the job's end is recorded.
func TestFinding3LogWedge(t *testing.T) {
	h := newHarness(t)
	h.srv.cfg().Agents.LogLimit = broker.Quantity(1 << 10)
	a := h.agent("gpu-a", 1)
	j := h.submit(tokAlice, oneGPU)
	h.settle(a)
	ref := agentapi.JobRef{Job: j.ID, Attempt: 1}
	if a.jobs[ref] == nil {
		t.Fatalf("job %s not started on gpu-a", j.ID)
	}
	line := bytes.Repeat([]byte("x"), 511)
	line = append(line, '\n')
	var off int64
	for i := 0; i < 8; i++ {
		req := agentapi.SyncRequest{Node: a.name, Generation: a.gen,
			Jobs: []agentapi.JobReport{*a.jobs[ref]},
			Logs: []agentapi.LogChunk{{JobRef: ref, Offset: off, Data: line}}}
		var resp agentapi.SyncResponse
		if code := h.do("POST", agentapi.PathSync, tokAgent, req, &resp); code != http.StatusOK {
			t.Fatalf("sync %d: %d", i, code)
		}
		got := resp.LogOffsets[refKey(ref)]
		if got != off+int64(len(line)) {
			t.Fatalf("chunk %d at %d: broker answered offset %d, want %d (the agent would resend forever)", i, off, got, off+int64(len(line)))
		}
		off = got
	}
	a.exit(j.ID, 0, "")
	a.sync()
	if got := h.job(j.ID); got.State != broker.StateSucceeded {
		t.Fatalf("job state %s after its end was reported, want succeeded", got.State)
	}
	var buf []byte
	if err := h.store.View(ctxT(), func(tx broker.Tx) error {
		var err error
		buf, err = broker.ReadLog(tx, j.ID, 1, 0, 1<<20)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(buf), broker.LogTruncatedMarker(1<<10)) || len(buf) != 1<<10+len(broker.LogTruncatedMarker(1<<10)) {
		t.Fatalf("stored log is %d bytes ending %q; want 1 KiB and the marker", len(buf), buf[max(0, len(buf)-80):])
	}
}

// TestFinding8JobTokenEndsWithJob: a job token reports units while its job
// runs and gets 401 once the job has ended.
func TestFinding8JobTokenEndsWithJob(t *testing.T) {
	h := newHarness(t)
	a := h.agent("gpu-a", 1)
	j := h.submit(tokAlice, oneGPU)
	h.cycle()
	resp := a.sync()
	if len(resp.Start) != 1 {
		t.Fatalf("not started: %+v", resp)
	}
	tok := resp.Start[0].Env["SPILLWAY_JOB_TOKEN"]
	if code := h.do("POST", "/v1/jobs/"+j.ID+"/units", tok, `{"units": 5}`, nil); code != http.StatusCreated {
		t.Fatalf("running job's token: %d", code)
	}
	a.exit(j.ID, 0, "")
	a.sync()
	if got := h.job(j.ID); !got.State.Terminal() {
		t.Fatalf("job %s", got.State)
	}
	if code := h.do("POST", "/v1/jobs/"+j.ID+"/units", tok, `{"units": 5}`, nil); code != http.StatusUnauthorized {
		t.Fatalf("ended job's token: %d, want 401", code)
	}
}

// TestFinding8UnitsTotalOverflow: a units total that would pass int64 is
// refused, not wrapped negative.
func TestFinding8UnitsTotalOverflow(t *testing.T) {
	h := newHarness(t)
	j := h.submit(tokAlice, oneGPU)
	var ans api.UnitsAnswer
	if code := h.do("POST", "/v1/jobs/"+j.ID+"/units", tokAlice, `{"units": 1000000000000000}`, &ans); code != http.StatusCreated {
		t.Fatalf("report: %d", code)
	}
	// As after 9,223 such reports.
	if err := h.store.Update(ctxT(), func(tx broker.Tx) error {
		return tx.Put(report.BucketUnits, unitsSumKey(j.ID, "units"), []byte(fmt.Sprint(int64(math.MaxInt64)-999_999_999_999_999)))
	}); err != nil {
		t.Fatal(err)
	}
	var e struct{ Error struct{ Field string } }
	if code := h.do("POST", "/v1/jobs/"+j.ID+"/units", tokAlice, `{"units": 1000000000000000}`, &e); code != http.StatusBadRequest || e.Error.Field != "units" {
		t.Fatalf("overflowing report: %d %+v", code, e)
	}
	if code := h.do("POST", "/v1/jobs/"+j.ID+"/units", tokAlice, `{"units": 1}`, &ans); code != http.StatusCreated || ans.Total <= 0 {
		t.Fatalf("total after refusal: %d %d", code, ans.Total)
	}
}

// TestFinding8MetricLabelCap: units of ever new kinds do not add series
// without bound.
func TestFinding8MetricLabelCap(t *testing.T) {
	h := newHarness(t)
	j := h.submit(tokAlice, oneGPU)
	for i := 0; i < maxLabelSets+50; i++ {
		body := fmt.Sprintf(`{"units": 1, "kind": "k%d"}`, i)
		if code := h.do("POST", "/v1/jobs/"+j.ID+"/units", tokAlice, body, nil); code != http.StatusCreated {
			t.Fatalf("report %d: %d", i, code)
		}
	}
	series := 0
	for k := range h.scrape() {
		if strings.HasPrefix(k, "spillway_units_total{") || strings.HasPrefix(k, "spillway_job_units_total{") {
			series++
		}
	}
	if series == 0 || series > maxLabelSets+1 {
		t.Fatalf("%d units series after %d kinds; want at most %d", series, maxLabelSets+50, maxLabelSets+1)
	}
}

// TestFinding8MetricsNeedToken is in TestAuth (server_test.go): /metrics
// answers 401 without a token and 403 to a user.

// TestFinding8NodesHideOtherTeams: a user listing nodes sees that another
// team holds a card, not which job or which processes.
func TestFinding8NodesHideOtherTeams(t *testing.T) {
	h := newHarness(t)
	a := h.agent("gpu-a", 2)
	j := h.submit(tokBob, oneGPU)
	h.settle(a)
	var out struct{ Nodes []api.NodeView }
	h.do("GET", "/v1/nodes", tokAlice, nil, &out)
	raw := fmt.Sprint(out)
	if strings.Contains(raw, j.ID) {
		t.Fatalf("alice sees vision's job id: %s", raw)
	}
	if !strings.Contains(raw, HiddenJob) || !strings.Contains(raw, "vision") {
		t.Fatalf("alice does not see that vision holds a card: %s", raw)
	}
	out.Nodes = nil
	h.do("GET", "/v1/nodes", tokBob, nil, &out)
	if !strings.Contains(fmt.Sprint(out), j.ID) {
		t.Fatalf("bob does not see his own job: %v", out)
	}
	out.Nodes = nil
	h.do("GET", "/v1/nodes", tokAdmin, nil, &out)
	if !strings.Contains(fmt.Sprint(out), j.ID) {
		t.Fatalf("the operator does not see the job: %v", out)
	}
}

// TestFinding8NodeCardCap: a node may not claim more cards than
// agents.maxCardsPerNode, so a gpus: 4000 job is not accepted on its word.
func TestFinding8NodeCardCap(t *testing.T) {
	h := newHarness(t)
	var e struct{ Error struct{ Field string } }
	code := h.do("POST", agentapi.PathRegister, tokAgent, agentapi.RegisterRequest{Node: "big", Inventory: simInventory("big", 4096)}, &e)
	if code != http.StatusBadRequest || e.Error.Field != "inventory.devices" {
		t.Fatalf("4096-card node: %d %+v", code, e)
	}
	if code := h.do("POST", "/v1/jobs", tokAlice, `{"resources": {"gpus": 4000}, "command": ["true"]}`, nil); code != http.StatusBadRequest {
		t.Fatalf("gpus: 4000 accepted: %d", code)
	}
}

// TestFinding8DuplicateKeysOnTheWire: an agent body naming a key twice is
// refused (the spec parser's test is in the broker package).
func TestFinding8DuplicateKeysOnTheWire(t *testing.T) {
	h := newHarness(t)
	body := `{"node": "gpu-a", "node": "gpu-b", "inventory": {"devices": []}}`
	if code := h.do("POST", agentapi.PathRegister, tokAgent, body, nil); code != http.StatusBadRequest {
		t.Fatalf("duplicate keys: %d", code)
	}
	if code := h.do("POST", "/v1/jobs", tokAlice, `{"resources": {"gpus": 1}, "resources": {"gpus": 2}, "command": ["true"]}`, nil); code != http.StatusBadRequest {
		t.Fatalf("duplicate keys in a spec: %d", code)
	}
}

// TestFinding8StoreErrors503: a failing store answers 503 with
// Retry-After, not 500, and /healthz reports the failed write.
func TestFinding8StoreErrors503(t *testing.T) {
	h := newHarness(t)
	h.submit(tokAlice, oneGPU)
	h.store.Close() // the disk is gone
	req, _ := http.NewRequest("POST", h.http.URL+"/v1/jobs", strings.NewReader(oneGPU))
	req.Header.Set("Authorization", "Bearer "+tokAlice)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("submit on a failed store: %d Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	var hz api.Health
	if code := h.do("GET", "/healthz", "", nil, &hz); code != http.StatusServiceUnavailable || hz.Status != "unhealthy" || !strings.Contains(hz.Error, "store write failed") {
		t.Fatalf("healthz after a failed write: %d %+v", code, hz)
	}
	h.store, _ = reopen(h)
}

// TestFinding8IdempotencyKey: a submit sent again with the same key gets
// the same job; the same key with another spec is refused.
func TestFinding8IdempotencyKey(t *testing.T) {
	h := newHarness(t)
	send := func(body, key string) (int, broker.Job, http.Header) {
		req, _ := http.NewRequest("POST", h.http.URL+"/v1/jobs", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tokAlice)
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var j broker.Job
		_ = json.NewDecoder(resp.Body).Decode(&j)
		return resp.StatusCode, j, resp.Header
	}
	c1, j1, _ := send(oneGPU, "key-0123456789")
	c2, j2, hdr := send(oneGPU, "key-0123456789")
	if c1 != http.StatusCreated || c2 != http.StatusCreated || j1.ID == "" || j1.ID != j2.ID || hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("same key twice: %d %s, %d %s %v", c1, j1.ID, c2, j2.ID, hdr)
	}
	if c, _, _ := send(`{"resources": {"gpus": 2}, "command": ["true"]}`, "key-0123456789"); c != http.StatusConflict {
		t.Fatalf("same key, other spec: %d", c)
	}
	if c, _, _ := send(oneGPU, "bad key!"); c != http.StatusBadRequest {
		t.Fatalf("malformed key: %d", c)
	}
	var list api.JobList
	h.do("GET", "/v1/jobs", tokAlice, nil, &list)
	if len(list.Jobs) != 1 {
		t.Fatalf("%d jobs after a resent submit, want 1", len(list.Jobs))
	}
	// Bob's key space is his own.
	req, _ := http.NewRequest("POST", h.http.URL+"/v1/jobs", strings.NewReader(oneGPU))
	req.Header.Set("Authorization", "Bearer "+tokBob)
	req.Header.Set("Idempotency-Key", "key-0123456789")
	resp, _ := http.DefaultClient.Do(req)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("bob with alice's key: %d", resp.StatusCode)
	}
}

func reopen(h *harness) (broker.Store, error) {
	return bolt.Open(h.path)
}

// TestHealthzPastUnreachable: a failure to reach the store is over once
// the store answers a ping again (a Redis back after an outage, with no
// write since); a store refusing writes (a full disk) stays on /healthz
// until a write goes through, ping or not.
func TestHealthzPastUnreachable(t *testing.T) {
	h := newHarness(t)
	refused := fmt.Errorf("get logmeta: %w", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)})
	h.srv.noteStoreFailure(refused)
	if msg := h.srv.recentStoreFailure(false); !strings.Contains(msg, "connection refused") {
		t.Fatalf("unreachable, no ping since: %q", msg)
	}
	if msg := h.srv.recentStoreFailure(true); msg != "" {
		t.Fatalf("unreachable, then a ping answered: still %q", msg)
	}
	h.srv.noteStoreFailure(fmt.Errorf("commit: %w", &os.PathError{Op: "write", Path: "spillway.db", Err: syscall.ENOSPC}))
	if msg := h.srv.recentStoreFailure(true); !strings.Contains(msg, "no space left") {
		t.Fatalf("a full disk, a ping answered: %q", msg)
	}
	h.agent("n1", 1)
	h.submit(tokAlice, oneGPU)
	h.cycle() // a state commit that goes through
	if msg := h.srv.recentStoreFailure(false); msg != "" {
		t.Fatalf("after a commit: %q", msg)
	}
}
