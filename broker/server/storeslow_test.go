package server

import (
	"log/slog"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// TestStoreCommitObserved: every store write the broker waits on (a
// submit, an array submit, the state commits of scheduling and of an
// agent's report) is in spillway_store_commit_duration_seconds by kind,
// and one that reaches the slow threshold is logged with its kind, its
// duration and the jobs it carried. The threshold is zero here so that
// every commit counts as slow without the test depending on the disk.
func TestStoreCommitObserved(t *testing.T) {
	h, reg := newRegistryHarness(t)
	var logs logBuffer
	h.srv.log = slog.New(slog.NewTextHandler(&logs, nil))
	h.srv.slowCommit = 0
	a := h.agent("n1", 2)
	j := h.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "1h", "command": ["a"]}`)
	var arr struct{ Jobs []string }
	if code := h.do("POST", "/v1/jobs", tokAlice, `{"resources": {"gpus": 1}, "timeout": "1h", "command": ["a"], "array": "0-2"}`, &arr); code != 201 || len(arr.Jobs) != 3 {
		t.Fatalf("array submit: %d, %v", code, arr.Jobs)
	}
	h.settle(a)
	a.exit(j.ID, 0, "")
	a.sync()

	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, f := range fams {
		if f.GetName() != "spillway_store_commit_duration_seconds" {
			continue
		}
		if f.GetType() != dto.MetricType_HISTOGRAM {
			t.Fatalf("type %v, want a histogram", f.GetType())
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" {
					counts[l.GetValue()] += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	if counts[commitSubmit] != 2 {
		t.Errorf("submit commits observed: %d, want 2 (one job, one array)", counts[commitSubmit])
	}
	if counts[commitState] < 2 {
		t.Errorf("state commits observed: %d, want the cycle's starts and the agent's report at least", counts[commitState])
	}

	out := logs.String()
	var submit, state, array int
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, "level=WARN") || !strings.Contains(line, "slow store commit") {
			continue
		}
		if !strings.Contains(line, "took=") {
			t.Errorf("slow commit logged without its duration: %s", line)
		}
		switch {
		case strings.Contains(line, "kind=submit") && strings.Contains(line, "jobs=3"):
			array++
		case strings.Contains(line, "kind=submit"):
			submit++
		case strings.Contains(line, "kind=state"):
			state++
		}
	}
	if submit != 1 || array != 1 || uint64(state) != counts[commitState] {
		t.Errorf("slow commits logged: submit %d, array %d, state %d (observed %d); want 1, 1, %d:\n%s",
			submit, array, state, counts[commitState], counts[commitState], out)
	}
}
