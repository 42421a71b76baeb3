package broker

import (
	"context"
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
