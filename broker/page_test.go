package broker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestPageJobsMatchesListJobs: the leader answers folded listings of
// active jobs from memory (PageJobs) and a standby from the store
// (ListJobs); walked page by page, both give the same rows, the same
// cursors and the same folded elements, whatever the filter, the page
// size and the order the jobs come in.
func TestPageJobsMatchesListJobs(t *testing.T) {
	rng := rand.New(rand.NewPCG(20, 7))
	states := []State{StatePending, StateStarting, StateRunning, StatePreempted, StateSucceeded, StateFailed}
	for round := range 40 {
		var jobs []*Job
		n := 1 + rng.IntN(120)
		for i := range n {
			j := &Job{ID: fmt.Sprintf("01M93Y1BY5%012d%04d", i, 0), State: states[rng.IntN(len(states))],
				Spec: Spec{Team: []string{"nlp", "vision"}[rng.IntN(2)], Queue: []string{"default", "high"}[rng.IntN(2)]}}
			if rng.IntN(3) > 0 {
				// An element of one of five arrays; elements of one array
				// are not always next to each other in id order.
				a := rng.IntN(5)
				idx := i
				j.ArrayID, j.ArrayIndex = fmt.Sprintf("01M93Y1BY5%012dAAAA", a), &idx
				j.Spec.Team, j.Spec.Queue = "nlp", "default"
			}
			jobs = append(jobs, j)
		}
		s := NewMemStore()
		if err := s.Update(context.Background(), func(tx Tx) error {
			for _, j := range jobs {
				if err := PutJob(tx, j); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		active := slices.DeleteFunc(slices.Clone(jobs), func(j *Job) bool { return j.State.Terminal() })
		rng.Shuffle(len(active), func(a, b int) { active[a], active[b] = active[b], active[a] })
		f := JobFilter{States: []State{StatePending, StateStarting, StateRunning, StatePreempted},
			Limit: 1 + rng.IntN(12), FoldArrays: rng.IntN(4) > 0}
		switch rng.IntN(4) {
		case 1:
			f.Team = "nlp"
		case 2:
			f.Queue = "high"
		case 3:
			f.States = []State{StatePending}
		}
		for page := 0; ; page++ {
			var want JobPage
			if err := s.View(context.Background(), func(tx Tx) error {
				var err error
				want, err = ListJobs(tx, f)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			got := PageJobs(f, active)
			if w, g := describePage(want), describePage(got); w != g {
				t.Fatalf("round %d, filter %+v, page %d:\nListJobs %s\nPageJobs %s", round, f, page, w, g)
			}
			if want.Next == "" {
				break
			}
			f.Cursor = want.Next
		}
	}
}

// describePage spells a page with its folded elements sorted: PageJobs
// gives them in no particular order.
func describePage(pg JobPage) string {
	var b strings.Builder
	for _, j := range pg.Jobs {
		fmt.Fprintf(&b, "%s ", j.ID[len(j.ID)-8:])
		if f := pg.Folded[j.ArrayID]; j.ArrayID != "" && len(f) > 0 {
			var ids []string
			for _, e := range f {
				ids = append(ids, e.ID[len(e.ID)-8:])
			}
			slices.Sort(ids)
			fmt.Fprintf(&b, "(+%v) ", ids)
		}
	}
	fmt.Fprintf(&b, "next %q, %d folded arrays", pg.Next, len(pg.Folded))
	return b.String()
}
