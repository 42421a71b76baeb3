package sched

import (
	"math"
	"testing"
	"time"
)

// TestLedgerCountsHeldAndReleasedOnce: an attempt holding cards is
// counted up to each Advance, its release only for the part after the
// last one, and a clock that goes back changes nothing.
func TestLedgerCountsHeldAndReleasedOnce(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	l := NewLedger(0, nil, t0)
	holding := true
	held := func(add func(team string, gpus int, from time.Time)) {
		if holding {
			add("nlp", 2, t0)
		}
	}
	if !l.Advance(t0.Add(10*time.Second), held) {
		t.Fatal("a held attempt added nothing")
	}
	if got := l.Values(nil)["nlp"]; got != 20 {
		t.Fatalf("after 10 s of 2 GPUs: %g GPU-seconds, want 20", got)
	}
	// The attempt ends at 15 s; only 10..15 s is new.
	holding = false
	l.Release("nlp", 2, t0, t0.Add(15*time.Second))
	l.Advance(t0.Add(20*time.Second), held)
	if got := l.Values(nil)["nlp"]; got != 30 {
		t.Fatalf("after the release: %g GPU-seconds, want 30", got)
	}
	if l.Advance(t0.Add(5*time.Second), held) || l.At != t0.Add(20*time.Second) {
		t.Fatalf("an advance into the past changed the ledger (at %s)", l.At)
	}
	if l.Advance(t0.Add(30*time.Second), held) {
		t.Fatal("nothing held, yet usage was added")
	}

	// With a half-life the usage decays between advances.
	d := NewLedger(time.Hour, map[string]Usage{"nlp": {GPUSeconds: 100, At: t0}}, t0)
	d.Advance(t0.Add(time.Hour), nil)
	if got := d.Values(nil)["nlp"]; math.Abs(got-50) > 1e-9 {
		t.Fatalf("after one half-life: %g, want 50", got)
	}
}
