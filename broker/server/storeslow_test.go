package server

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestStoreCommitObserved: every store write the broker makes is in
// spillway_store_commit_duration_seconds by kind (a submit and an array
// submit as submit; the state commits of scheduling and of an agent's
// report as state; the rest, such as the ledger's lines, as other), and
// one that reaches the slow threshold is logged with its kind, its
// duration and the jobs it carried. The threshold is zero here so that
// every commit counts as slow without the test depending on the disk, and
// the warnings' interval is zero so that each is logged.
func TestStoreCommitObserved(t *testing.T) {
	h, reg := newRegistryHarness(t)
	var logs logBuffer
	h.srv.log = slog.New(slog.NewTextHandler(&logs, nil))
	h.srv.slowCommits.threshold = 0
	h.srv.slowCommits.every = 0
	base := commitCounts(t, reg) // the broker's start wrote before the threshold was set
	a := h.agent("n1", 2)
	j := h.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "1h", "command": ["a"]}`)
	var arr struct{ Jobs []string }
	if code := h.do("POST", "/v1/jobs", tokAlice, `{"resources": {"gpus": 1}, "timeout": "1h", "command": ["a"], "array": "0-2"}`, &arr); code != 201 || len(arr.Jobs) != 3 {
		t.Fatalf("array submit: %d, %v", code, arr.Jobs)
	}
	h.settle(a)
	a.exit(j.ID, 0, "")
	a.sync()

	counts := commitCounts(t, reg)
	for k, n := range base {
		counts[k] -= n
	}
	if counts[commitSubmit] != 2 {
		t.Errorf("submit commits observed: %d, want 2 (one job, one array)", counts[commitSubmit])
	}
	if counts[commitState] < 2 {
		t.Errorf("state commits observed: %d, want the cycle's starts and the agent's report at least", counts[commitState])
	}
	if counts[commitOther] == 0 {
		t.Errorf("no other writes observed; the ended job's ledger lines are one")
	}

	out := logs.String()
	var submit, state, array, other int
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
		case strings.Contains(line, "kind=other"):
			other++
		}
	}
	if submit != 1 || array != 1 || uint64(state) != counts[commitState] || uint64(other) != counts[commitOther] {
		t.Errorf("slow commits logged: submit %d, array %d, state %d, other %d (observed %d, %d); want 1, 1, %d, %d:\n%s",
			submit, array, state, other, counts[commitState], counts[commitOther], counts[commitState], counts[commitOther], out)
	}
}

// TestSlowCommitWarningsLimited: on a store that stays slow, the warning
// is logged once per interval of the broker's clock, and the next one
// counts the slow writes it did not log, while the histogram still counts
// every write.
func TestSlowCommitWarningsLimited(t *testing.T) {
	h, reg := newRegistryHarness(t)
	var logs logBuffer
	h.srv.log = slog.New(slog.NewTextHandler(&logs, nil))
	h.srv.slowCommits.threshold = 0
	warnings := func() []string {
		var out []string
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, "slow store commit") {
				out = append(out, line)
			}
		}
		return out
	}
	writes := func() (n uint64) {
		for _, c := range commitCounts(t, reg) {
			n += c
		}
		return n
	}
	before := writes() // the broker's start wrote before the threshold was set
	for i := 0; i < 5; i++ {
		h.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "1h", "command": ["a"]}`)
	}
	if n := writes() - before; n != 5 {
		t.Fatalf("writes observed: %d, want the 5 submits", n)
	}
	if w := warnings(); len(w) != 1 || !strings.Contains(w[0], "unlogged=0") {
		t.Fatalf("warnings within one interval: %d, want 1 with unlogged=0:\n%s", len(w), logs.String())
	}

	h.clock.Step(defaultSlowCommitEvery)
	h.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "1h", "command": ["a"]}`)
	w := warnings()
	if len(w) != 2 {
		t.Fatalf("warnings after the interval: %d, want 2:\n%s", len(w), logs.String())
	}
	if want := "unlogged=4"; !strings.Contains(w[1], want) {
		t.Errorf("second warning does not count the writes it stands for (%s): %s", want, w[1])
	}
}

// commitCounts is spillway_store_commit_duration_seconds' count by kind.
func commitCounts(t *testing.T, reg *prometheus.Registry) map[string]uint64 {
	t.Helper()
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
	return counts
}
