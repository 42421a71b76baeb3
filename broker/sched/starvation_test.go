package sched

import (
	"fmt"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// starvationRun replays, in virtual time, a node of 8 GPUs under a steady
// stream of high-priority work — a 4-GPU job every 15 minutes, each
// running 30 minutes (timeout 1h), so the node is never idle — while one
// low-priority 8-GPU job waits from t0. One cycle a minute. It returns when
// the low job started, or the zero time if it had not after horizon.
func starvationRun(t *testing.T, starvationAge, horizon time.Duration) time.Time {
	t.Helper()
	s := &Snapshot{Now: t0, Nodes: nodes(MakeNode("n1")), Policy: DefaultPolicy()}
	s.Policy.StarvationAge = starvationAge
	low := MakeJob("low").GPUs(8).Priority("low").Waited(0).Obj()
	s.Jobs = []*broker.Job{low}
	const run = 30 * time.Minute
	next := 0
	sched := New()
	for s.Now = t0; s.Now.Before(t0.Add(horizon)); s.Now = s.Now.Add(time.Minute) {
		// Jobs that ran their 30 minutes succeed and leave.
		kept := s.Jobs[:0]
		for _, j := range s.Jobs {
			if j.State == broker.StateRunning && !s.Now.Before(j.StartedAt.Add(run)) {
				continue
			}
			kept = append(kept, j)
		}
		s.Jobs = kept
		if s.Now.Sub(t0)%(15*time.Minute) == 0 {
			w := MakeJob(fmt.Sprintf("high-%03d", next)).GPUs(4).Priority("high")
			w.j.SubmittedAt = s.Now
			s.Jobs = append(s.Jobs, w.Obj())
			next++
		}
		applyPlan(s, sched.Schedule(s))
		if low.State == broker.StateRunning {
			return *low.StartedAt
		}
	}
	return time.Time{}
}

// TestStarvationBound proves the guard: under a steady stream of
// high-priority work a low-priority job starts within starvationAge plus
// the longest timeout among the jobs it waits for (docs/scheduling.md),
// and without the guard it does not start at all.
func TestStarvationBound(t *testing.T) {
	const age, longestTimeout = 2 * time.Hour, time.Hour
	started := starvationRun(t, age, 24*time.Hour)
	if started.IsZero() || started.After(t0.Add(age+longestTimeout)) {
		t.Fatalf("low job started at %v; the bound is %v", started, t0.Add(age+longestTimeout))
	}
	t.Logf("with the guard the low job started after %s (bound %s)", started.Sub(t0), age+longestTimeout)
	if never := starvationRun(t, 0, 24*time.Hour); !never.IsZero() {
		t.Fatalf("without the guard the low job started at %v: the stream does not starve it, the test proves nothing", never)
	}
}
