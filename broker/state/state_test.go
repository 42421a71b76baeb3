package state

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/sched"
)

func job(id string, st broker.State, nodes ...string) *broker.Job {
	j := &broker.Job{ID: id, State: st}
	for _, n := range nodes {
		j.Placements = append(j.Placements, broker.Placement{Node: n, GPUs: []int{0}})
	}
	return j
}

// with returns a copy of j in state st, placed on nodes (none: the
// placements are dropped), as the server builds a change.
func with(j *broker.Job, st broker.State, nodes ...string) *broker.Job {
	return job(j.ID, st, nodes...)
}

func ids(js []*broker.Job) []string {
	var out []string
	for _, j := range js {
		out = append(out, j.ID)
	}
	return out
}

// held is every node → holding job ids pair, as the index has them.
func held(st *State) map[string][]string {
	out := map[string][]string{}
	for node, j := range st.Held() {
		out[node] = append(out[node], j.ID)
	}
	for _, v := range out {
		slices.Sort(v)
	}
	return out
}

func reason(code string) sched.Reason {
	return sched.FixedReason(broker.PendingReason{Code: code})
}

// TestApplyFollowsPlacements: the byNode index follows each job through
// start, move and end; a pending job holds nothing.
func TestApplyFollowsPlacements(t *testing.T) {
	st := New()
	a := job("a", broker.StatePending)
	st.Apply([]*broker.Job{a}, nil, nil)
	if got := held(st); len(got) != 0 {
		t.Fatalf("a pending job holds %v", got)
	}
	a = with(a, broker.StateStarting, "n1", "n2")
	st.Apply([]*broker.Job{a}, nil, nil)
	if got, want := held(st), map[string][]string{"n1": {"a"}, "n2": {"a"}}; !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("started on n1, n2: held %v, want %v", got, want)
	}
	// The attempt ends; the next one lands on n3 only.
	st.Apply([]*broker.Job{with(a, broker.StatePending)}, nil, nil)
	if got := held(st); len(got) != 0 {
		t.Fatalf("back in the queue, still held %v", got)
	}
	a = with(a, broker.StateRunning, "n3")
	st.Apply([]*broker.Job{a}, nil, nil)
	if got := ids(st.HoldingOn("n3")); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("HoldingOn(n3) = %v", got)
	}
	if got := st.HoldingOn("n1"); len(got) != 0 {
		t.Fatalf("HoldingOn(n1) = %v after the move", ids(got))
	}
	if st.Job("a") != a {
		t.Fatal("Job(a) is not the applied version")
	}
}

// TestApplyDropsTerminalJobs: a job that ends leaves the view with its
// holdings, reason and I/O reading; each still sees its last transition.
func TestApplyDropsTerminalJobs(t *testing.T) {
	st := New()
	a := job("a", broker.StateRunning, "n1")
	st.Load([]*broker.Job{a}, nil)
	st.SetReason("a", reason("resources"))
	st.NoteReasonSaved("a", time.Unix(1, 0))
	st.SetIO("a", IO{Attempt: 1, Bytes: 10})

	done := with(a, broker.StateSucceeded)
	var saw [][2]*broker.Job
	st.Apply([]*broker.Job{done}, nil, func(old, j *broker.Job) { saw = append(saw, [2]*broker.Job{old, j}) })
	if len(saw) != 1 || saw[0][0] != a || saw[0][1] != done {
		t.Fatalf("each saw %v, want (a running, a succeeded)", saw)
	}
	if st.Job("a") != nil || st.JobCount() != 0 {
		t.Fatal("a succeeded job stays in the view")
	}
	if got := held(st); len(got) != 0 {
		t.Fatalf("a succeeded job still holds %v", got)
	}
	if _, ok := st.Reason("a"); ok {
		t.Fatal("reason kept for a job that left")
	}
	if st.IO("a") != (IO{}) {
		t.Fatal("I/O reading kept for a job that left")
	}
	// Back in the view, it starts afresh.
	st.Apply([]*broker.Job{with(a, broker.StatePending)}, nil, nil)
	if n := st.NoteReason("a", reason("resources")); n.Saved {
		t.Fatal("reason's save time kept for a job that left")
	}
}

// TestApplyDropsReasonLeavingPending: a pending job's reason goes when it
// starts, and stays while it waits.
func TestApplyDropsReasonLeavingPending(t *testing.T) {
	st := New()
	a := job("a", broker.StatePending)
	b := job("b", broker.StatePending)
	st.Apply([]*broker.Job{a, b}, nil, nil)
	st.SetReason("a", reason("resources"))
	st.SetReason("b", reason("resources"))
	a2 := with(a, broker.StatePending)
	a2.Pending = &broker.PendingReason{Code: "resources"}
	st.Apply([]*broker.Job{a2, with(b, broker.StateStarting, "n1")}, nil, nil)
	if r, ok := st.Reason("a"); !ok || r.Code() != "resources" {
		t.Fatalf("a still pending: reason %q, %v", r.Code(), ok)
	}
	if _, ok := st.Reason("b"); ok {
		t.Fatal("b started but kept its pending reason")
	}
	if st.Job("b") == nil {
		t.Fatal("b left the view on starting")
	}
}

// TestApplyReplacesNodes: a node's new version replaces the old one; the
// others stay.
func TestApplyReplacesNodes(t *testing.T) {
	st := New()
	n1 := &broker.Node{Name: "n1", State: broker.NodeReady}
	n2 := &broker.Node{Name: "n2", State: broker.NodeReady}
	st.Load(nil, []*broker.Node{n1, n2})
	lost := &broker.Node{Name: "n1", State: broker.NodeLost}
	st.Apply(nil, []*broker.Node{lost}, nil)
	if st.Node("n1") != lost || st.Node("n2") != n2 || st.NodeCount() != 2 {
		t.Fatalf("nodes after replacing n1: n1 %v, n2 %v, %d in all", st.Node("n1"), st.Node("n2"), st.NodeCount())
	}
	st.DropNode("n2")
	var names []string
	for n := range st.Nodes() {
		names = append(names, n.Name)
	}
	if !slices.Equal(names, []string{"n1"}) {
		t.Fatalf("nodes after dropping n2: %v", names)
	}
}

// TestHoldingOnSortedByID: HoldingOn is by id whatever the order of
// arrival; Holders has the same jobs.
func TestHoldingOnSortedByID(t *testing.T) {
	st := New()
	var js []*broker.Job
	for _, id := range []string{"j3", "j1", "j4", "j2"} {
		js = append(js, job(id, broker.StateRunning, "n1"))
	}
	js = append(js, job("j0", broker.StateRunning, "n2"))
	st.Apply(js, nil, nil)
	want := []string{"j1", "j2", "j3", "j4"}
	if got := ids(st.HoldingOn("n1")); !slices.Equal(got, want) {
		t.Fatalf("HoldingOn(n1) = %v, want %v", got, want)
	}
	got := ids(slices.Collect(st.Holders("n1")))
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("Holders(n1) = %v, want %v", got, want)
	}
}

// TestAdmitAndReset: Admit adds a new job once; Reset empties the view.
func TestAdmitAndReset(t *testing.T) {
	st := New()
	first := job("a", broker.StatePending)
	if !st.Admit(first) {
		t.Fatal("Admit refused a new job")
	}
	if st.Admit(job("a", broker.StatePending)) || st.Job("a") != first {
		t.Fatal("Admit replaced a job already in the view")
	}
	st.Apply([]*broker.Job{job("b", broker.StateRunning, "n1")}, []*broker.Node{{Name: "n1"}}, nil)
	st.SetReason("a", reason("resources"))
	st.Reset()
	if st.JobCount() != 0 || st.NodeCount() != 0 || len(held(st)) != 0 {
		t.Fatal("Reset left jobs, nodes or holdings")
	}
	if _, ok := st.Reason("a"); ok {
		t.Fatal("Reset left a reason")
	}
}

// TestNoteReason: NoteReason records the reason and returns, in one
// lookup, the job, whether it waits, the code its record carries and when
// its reason was saved; they follow the record through Apply. A job not in
// the view (it ended after the cycle's snapshot) keeps no reason or I/O
// reading.
func TestNoteReason(t *testing.T) {
	st := New()
	a := job("a", broker.StatePending)
	st.Apply([]*broker.Job{a}, nil, nil)
	n := st.NoteReason("a", reason("resources"))
	if n.Job != a || !n.Waiting || n.HasCode || n.Saved {
		t.Fatalf("NoteReason(a) = %+v; want a, waiting, no code, not saved", n)
	}
	at := time.Unix(7, 0)
	st.NoteReasonSaved("a", at)
	a2 := with(a, broker.StatePending)
	a2.Pending = &broker.PendingReason{Code: "resources"}
	st.Apply([]*broker.Job{a2}, nil, nil)
	if n := st.NoteReason("a", reason("quota")); n.Job != a2 || !n.HasCode || n.Code != "resources" || !n.Saved || !n.SavedAt.Equal(at) {
		t.Fatalf("after saving and applying: %+v", n)
	}
	if r, ok := st.Reason("a"); !ok || r.Code() != "quota" {
		t.Fatalf("reason %q, %v; want quota", r.Code(), ok)
	}
	st.Apply([]*broker.Job{with(a2, broker.StateStarting, "n1")}, nil, nil)
	if n := st.NoteReason("a", reason("quota")); n.Waiting || n.HasCode {
		t.Fatalf("a starting job: %+v; want not waiting, no code", n)
	}
	if n := st.NoteReason("gone", reason("resources")); n.Job != nil {
		t.Fatal("NoteReason found a job not in the view")
	}
	st.SetReason("gone", reason("resources"))
	st.SetIO("gone", IO{Attempt: 1})
	if _, ok := st.Reason("gone"); ok || st.IO("gone") != (IO{}) {
		t.Fatal("a job not in the view kept a reason or an I/O reading")
	}
	st.DropReason("a")
	if _, ok := st.Reason("a"); ok {
		t.Fatal("DropReason kept the reason")
	}
}

// TestJobsOrderStable: Jobs lists every job once, in the same order from
// one walk to the next, and a job leaving moves only the last one into its
// place; after random arrivals and ends the list still matches the map.
func TestJobsOrderStable(t *testing.T) {
	st := New()
	var js []*broker.Job
	for i := range 6 {
		js = append(js, job(fmt.Sprintf("j%d", i), broker.StatePending))
	}
	st.Apply(js, nil, nil)
	walk := func() []string { return ids(slices.Collect(st.Jobs())) }
	first := walk()
	for range 3 {
		if got := walk(); !slices.Equal(got, first) {
			t.Fatalf("second walk %v, first %v", got, first)
		}
	}
	st.Apply([]*broker.Job{with(js[1], broker.StateSucceeded)}, nil, nil)
	if got, want := walk(), []string{"j0", "j5", "j2", "j3", "j4"}; !slices.Equal(got, want) {
		t.Fatalf("after j1 ended: %v, want %v (j5 in its place)", got, want)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	live := map[string]bool{"j0": true, "j2": true, "j3": true, "j4": true, "j5": true}
	for i := range 2000 {
		id := fmt.Sprintf("j%d", rng.IntN(40))
		if live[id] && rng.IntN(2) == 0 {
			st.Apply([]*broker.Job{job(id, broker.StateFailed)}, nil, nil)
			delete(live, id)
		} else {
			st.Apply([]*broker.Job{job(id, broker.StatePending)}, nil, nil)
			live[id] = true
		}
		if i%100 == 0 || i == 1999 {
			got := walk()
			slices.Sort(got)
			if want := slices.Sorted(maps.Keys(live)); !slices.Equal(got, want) || st.JobCount() != len(want) {
				t.Fatalf("step %d: Jobs %v, want %v", i, got, want)
			}
		}
	}
	st.Reset()
	if got := walk(); len(got) != 0 {
		t.Fatalf("after Reset: %v", got)
	}
}

// TestNoteReasonAt: a handle notes the reason of its job without a lookup,
// follows the record through Apply, and goes stale when the job leaves the
// view or the view is Reset, so that a plan applied late notes nothing for
// such a job.
func TestNoteReasonAt(t *testing.T) {
	st := New()
	a, b := job("a", broker.StatePending), job("b", broker.StatePending)
	st.Apply([]*broker.Job{a, b}, nil, nil)
	hs := map[string]Handle{}
	for j, h := range st.JobHandles() {
		if h.Job() != j {
			t.Fatalf("handle of %s carries %v", j.ID, h.Job())
		}
		hs[j.ID] = h
	}
	a2 := with(a, broker.StatePending)
	st.Apply([]*broker.Job{a2}, nil, nil)
	if n := st.NoteReasonAt(hs["a"], reason("quota")); n.Job != a2 || !n.Waiting {
		t.Fatalf("NoteReasonAt(a) = %+v; want the applied record, waiting", n)
	}
	if r, ok := st.Reason("a"); !ok || r.Code() != "quota" {
		t.Fatalf("reason %q, %v; want quota", r.Code(), ok)
	}
	st.Apply([]*broker.Job{with(b, broker.StateCancelled)}, nil, nil)
	if n := st.NoteReasonAt(hs["b"], reason("quota")); n.Job != nil {
		t.Fatal("a handle of a job that left noted a reason")
	}
	st.Reset()
	st.Apply([]*broker.Job{a2}, nil, nil)
	if n := st.NoteReasonAt(hs["a"], reason("resources")); n.Job != nil {
		t.Fatal("a handle from before Reset noted a reason")
	}
	if _, ok := st.Reason("a"); ok {
		t.Fatal("the stale handle's reason reached the new view")
	}
	if n := st.NoteReasonAt(Handle{}, reason("resources")); n.Job != nil {
		t.Fatal("the zero handle noted a reason")
	}
}
