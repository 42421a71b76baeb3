package server

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// TestFinding3LogWedge: a job that prints more than agents.logLimit must
// not wedge its node. Every chunk is acknowledged (the offset the broker
// answers advances past it), the stored log ends with a truncation marker,
// and the job's end is recorded.
func TestFinding3LogWedge(t *testing.T) {
	h := newHarness(t)
	h.srv.cfg.Agents.LogLimit = broker.Quantity(1 << 10)
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
