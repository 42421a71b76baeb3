//go:build !race

package state

import (
	"testing"

	"github.com/spillway-dev/spillway/broker"
)

// TestReadsDoNotAllocate: the scheduler's snapshot and the agents' syncs
// range over the view on every cycle and heartbeat, as they ranged over
// maps before; the iterators must cost no allocation.
func TestReadsDoNotAllocate(t *testing.T) {
	st := New()
	st.Apply([]*broker.Job{job("a", broker.StateRunning, "n1"), job("b", broker.StatePending)},
		[]*broker.Node{{Name: "n1"}}, nil)
	n := 0
	allocs := testing.AllocsPerRun(100, func() {
		for range st.Jobs() {
			n++
		}
		for range st.Nodes() {
			n++
		}
		for range st.Holders("n1") {
			n++
		}
		for range st.Held() {
			n++
		}
		if st.Job("a") != nil && st.Node("n1") != nil {
			n++
		}
	})
	if allocs != 0 {
		t.Fatalf("ranging over the view allocates %v times", allocs)
	}
	if n == 0 {
		t.Fatal("nothing ranged")
	}
}
