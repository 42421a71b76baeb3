package sched

import (
	"testing"
	"time"
)

// TestArrayLimit: an array with a limit (--array 0-9%2) runs at most that
// many elements at once, counting those already running; the others wait
// with reason array_limit, neither taking the head's reservation nor
// asking for burst capacity, and other work (another array, a lone job)
// starts beside them.
func TestArrayLimit(t *testing.T) {
	two := []*NodeWrapper{MakeNode("n1").GPUs(2), MakeNode("n2").GPUs(2)}
	runCases(t, map[string]schedCase{
		"an array starts at most its limit": {
			nodes: two,
			jobs: []*JobWrapper{
				MakeJob("a0").Array("A", 2).Waited(4 * time.Hour),
				MakeJob("a1").Array("A", 2).Waited(4 * time.Hour),
				MakeJob("a2").Array("A", 2).Waited(4 * time.Hour),
				MakeJob("a3").Array("A", 2).Waited(4 * time.Hour),
				MakeJob("lone").Waited(time.Hour),
			},
			want: outcome{Starts: map[string]string{"a0": "n1:0", "a1": "n1:1", "lone": "n2:0"},
				Pending: map[string]string{"a2": ReasonArrayLimit, "a3": ReasonArrayLimit}},
		},
		"running elements count against the limit": {
			nodes: two,
			jobs: []*JobWrapper{
				MakeJob("r0").Array("A", 2).On("n1", 0),
				MakeJob("a1").Array("A", 2).Waited(4 * time.Hour),
				MakeJob("a2").Array("A", 2).Waited(4 * time.Hour),
			},
			want: outcome{Starts: map[string]string{"a1": "n1:1"},
				Pending: map[string]string{"a2": ReasonArrayLimit}},
		},
		"each array has its own limit, and an array without one has none": {
			nodes: two,
			jobs: []*JobWrapper{
				MakeJob("a0").Array("A", 1).Waited(4 * time.Hour),
				MakeJob("a1").Array("A", 1).Waited(4 * time.Hour),
				MakeJob("b0").Array("B", 0).Waited(3 * time.Hour),
				MakeJob("b1").Array("B", 0).Waited(3 * time.Hour),
				MakeJob("b2").Array("B", 0).Waited(3 * time.Hour),
			},
			want: outcome{Starts: map[string]string{"a0": "n1:0", "b0": "n1:1", "b1": "n2:0", "b2": "n2:1"},
				Pending: map[string]string{"a1": ReasonArrayLimit}},
		},
		"an element held by its limit does not hold the reservation: a later job starts": {
			nodes: []*NodeWrapper{MakeNode("n1").GPUs(2)},
			jobs: []*JobWrapper{
				MakeJob("r0").Array("A", 1).GPUs(1).On("n1", 0),
				MakeJob("a1").Array("A", 1).Waited(4 * time.Hour),
				MakeJob("late").Waited(time.Minute),
			},
			want: outcome{Starts: map[string]string{"late": "n1:1"},
				Pending: map[string]string{"a1": ReasonArrayLimit}},
		},
	})

	s := snap(nodes(MakeNode("n1").GPUs(1)), jobs(
		MakeJob("r0").Array("01M91HCAHEZW2WJNY1S27DA3C3", 1).On("n1", 0),
		MakeJob("a1").Array("01M91HCAHEZW2WJNY1S27DA3C3", 1).Waited(time.Hour),
		MakeJob("other").Waited(time.Minute)))
	plan := Schedule(s)
	var reason string
	for _, pe := range plan.Pending {
		if pe.Job == "a1" {
			reason = pe.Reason.Message()
		}
	}
	if want := "array 01M91HCAHEZW2WJNY1S27DA3C3 runs 1 element at once, its limit (%1); 1st in queue default"; reason != want {
		t.Errorf("reason %q, want %q", reason, want)
	}
	bd := plan.BurstDemand()
	if len(bd) != 1 || bd[0].Job != "other" {
		t.Errorf("burst demand %+v, want only the job that is not held by its array's limit", bd)
	}
}
