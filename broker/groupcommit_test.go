package broker

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// recordingGroup is a GroupCommit whose commits record how many calls
// each carried.
type recordingGroup struct {
	GroupCommit
	sizesMu sync.Mutex
	sizes   []int
}

func newRecordingGroup(linger time.Duration) *recordingGroup {
	r := &recordingGroup{}
	r.GroupCommit = GroupCommit{Max: 100, Linger: linger, Commit: func(fns []func(Tx) error) []error {
		r.sizesMu.Lock()
		r.sizes = append(r.sizes, len(fns))
		r.sizesMu.Unlock()
		return make([]error, len(fns))
	}}
	return r
}

func (r *recordingGroup) commits() []int {
	r.sizesMu.Lock()
	defer r.sizesMu.Unlock()
	return append([]int(nil), r.sizes...)
}

func nop(Tx) error { return nil }

// waitDone fails the test if done is not closed within a minute: a
// writer stuck waiting, not a timing bound (the lingers below are an hour
// or nothing).
func waitDone(t *testing.T, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("%s: still waiting after a minute", what)
	}
}

// TestPatientCommitJoinsTheNextSubmit: right after a submit's commit, a
// patient write (the broker's state change) waits for the next submit and
// shares its commit, however long that submit takes to come within
// Linger.
func TestPatientCommitJoinsTheNextSubmit(t *testing.T) {
	g := newRecordingGroup(time.Hour)
	ctx := context.Background()
	if err := g.Do(ctx, nop); err != nil { // a submit
		t.Fatal(err)
	}
	patientDone := make(chan struct{})
	go func() {
		defer close(patientDone)
		if err := g.Do(Patient(ctx), nop); err != nil {
			t.Error(err)
		}
	}()
	// Wait until the patient write is queued (and the writer lingers).
	for queued := false; !queued; {
		g.mu.Lock()
		queued = g.lingering != nil
		g.mu.Unlock()
		select {
		case <-patientDone:
			t.Fatal("the patient write committed alone right after a submit's commit")
		case <-time.After(time.Millisecond):
		}
	}
	if err := g.Do(ctx, nop); err != nil { // the next submit
		t.Fatal(err)
	}
	waitDone(t, patientDone, "patient write")
	got := g.commits()
	if len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("commit sizes %v, want [1 2]: the patient write shares the second submit's commit", got)
	}
}

// TestCommitWaitsForTheCallersItAnswered: callers that queued while a
// commit was in flight wait, before their own commit, until as many
// calls as that commit answered have queued again, so concurrent
// clients share one commit instead of taking turns in two.
func TestCommitWaitsForTheCallersItAnswered(t *testing.T) {
	ctx := context.Background()
	gate := make(chan struct{})
	var sizesMu sync.Mutex
	var sizes []int
	g := &GroupCommit{Max: 100, Linger: time.Hour, Commit: func(fns []func(Tx) error) []error {
		sizesMu.Lock()
		firstCommit := len(sizes) == 0
		sizesMu.Unlock()
		if firstCommit {
			<-gate // hold the first commit until the next calls queue
		}
		sizesMu.Lock()
		sizes = append(sizes, len(fns))
		sizesMu.Unlock()
		return make([]error, len(fns))
	}}
	do := func(n int) chan struct{} {
		done := make(chan struct{})
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				if err := g.Do(ctx, nop); err != nil {
					t.Error(err)
				}
			})
		}
		go func() { wg.Wait(); close(done) }()
		return done
	}
	queued := func(n int) {
		for {
			g.mu.Lock()
			q := len(g.queue)
			g.mu.Unlock()
			if q >= n {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	lingering := func(done <-chan struct{}, what string) {
		for {
			g.mu.Lock()
			l := g.lingering != nil
			g.mu.Unlock()
			if l {
				return
			}
			select {
			case <-done:
				t.Fatalf("%s committed without waiting for the callers answered before them", what)
			case <-time.After(time.Millisecond):
			}
		}
	}

	first := do(1)
	for { // the first call is in its commit, held at the gate
		g.mu.Lock()
		inFlight := g.running && len(g.queue) == 0
		g.mu.Unlock()
		if inFlight {
			break
		}
		time.Sleep(time.Millisecond)
	}
	second := do(2) // two calls queue while it is in flight
	queued(2)
	close(gate)
	waitDone(t, first, "first call")
	lingering(second, "the two calls queued during the first commit")
	third := do(1) // the first caller's next call
	waitDone(t, second, "the two calls")
	waitDone(t, third, "the first caller's next call")

	// That commit answered three: two coming back are not enough.
	fourth := do(2)
	queued(2)
	lingering(fourth, "two of three answered callers")
	fifth := do(1)
	waitDone(t, fourth, "two of three answered callers")
	waitDone(t, fifth, "the third")

	sizesMu.Lock()
	defer sizesMu.Unlock()
	if want := []int{1, 3, 3}; !slices.Equal(sizes, want) {
		t.Fatalf("commit sizes %v, want %v", sizes, want)
	}
}

// TestPatientCommitAloneDoesNotWait: with no submit committed within
// Linger, or with Linger 0, a patient write commits at once; so does a
// patient write queued with a submit.
func TestPatientCommitAloneDoesNotWait(t *testing.T) {
	ctx := context.Background()
	t.Run("no submit yet", func(t *testing.T) {
		g := newRecordingGroup(time.Hour)
		done := make(chan struct{})
		go func() { defer close(done); _ = g.Do(Patient(ctx), nop) }()
		waitDone(t, done, "patient write with no submit before it")
		if got := g.commits(); len(got) != 1 || got[0] != 1 {
			t.Fatalf("commit sizes %v, want [1]", got)
		}
	})
	t.Run("linger 0", func(t *testing.T) {
		g := newRecordingGroup(0)
		if err := g.Do(ctx, nop); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); _ = g.Do(Patient(ctx), nop) }()
		waitDone(t, done, "patient write with Linger 0")
		if got := g.commits(); len(got) != 2 {
			t.Fatalf("commit sizes %v, want two commits", got)
		}
	})
	t.Run("linger passes", func(t *testing.T) {
		g := newRecordingGroup(time.Millisecond)
		if err := g.Do(ctx, nop); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); _ = g.Do(Patient(ctx), nop) }()
		waitDone(t, done, "patient write after its linger")
		if got := g.commits(); len(got) != 2 || got[1] != 1 {
			t.Fatalf("commit sizes %v, want the patient write alone in the second", got)
		}
	})
}

func TestIsPatient(t *testing.T) {
	ctx := context.Background()
	if IsPatient(ctx) || !IsPatient(Patient(ctx)) {
		t.Fatal("IsPatient does not report Patient's mark")
	}
}
