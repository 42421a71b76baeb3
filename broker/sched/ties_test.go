package sched

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestTieKeyOrdersAsStrings: the packed words of two ids compare as
// strings.Compare compares the ids, for ids that share prefixes, are
// prefixes of each other, hold NUL bytes, or fill all 32 bytes; a longer
// id is not packed.
func TestTieKeyOrdersAsStrings(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ\x00\xff"
	gen := func() string {
		var b strings.Builder
		for range rng.IntN(33) {
			b.WriteByte(alphabet[rng.IntN(len(alphabet))])
		}
		return b.String()
	}
	ids := []string{"", "A", "A\x00", "AB", "01M93Y1BY5WQZR7HX1VGEQZ2T9", "01M93Y1BY5WQZR7HX1VGEQZ2TA",
		"01M93Y1BY5WQZR7HX1VGEQZ2T9-7", strings.Repeat("Z", 32), strings.Repeat("Z", 31)}
	for range 2000 {
		ids = append(ids, gen())
	}
	// Shared prefixes: each id and one edited near its end.
	for _, id := range ids[:len(ids)/2] {
		if id != "" {
			b := []byte(id)
			b[len(b)-1] ^= 1
			ids = append(ids, string(b), id+"0")
		}
	}
	for i, a := range ids {
		for _, b := range []string{ids[(i*7+3)%len(ids)], ids[(i+1)%len(ids)], a} {
			wa, oka := packID(a)
			wb, okb := packID(b)
			if !oka || !okb {
				continue // longer than 32 bytes (id+"0" of a 32-byte id)
			}
			got := cmpTie(tieKey{sub: 5, id: wa, n: int32(len(a))}, tieKey{sub: 5, id: wb, n: int32(len(b))})
			if want := strings.Compare(a, b); got != want {
				t.Fatalf("cmpTie(%q, %q) = %d, strings.Compare = %d", a, b, got, want)
			}
		}
	}
	if _, ok := packID(strings.Repeat("x", 33)); ok {
		t.Fatal("a 33-byte id was packed")
	}
	// Submit time comes first.
	w, _ := packID("B")
	v, _ := packID("A")
	if cmpTie(tieKey{sub: 1, id: w, n: 1}, tieKey{sub: 2, id: v, n: 1}) != -1 {
		t.Fatal("an earlier submit did not sort first")
	}
}

// TestRadixTies: radixTies orders as cmpTie does, for groups sharing a
// submit time and id prefix (an array's elements), and for mixed ones
// (submit times on both sides of zero, ids of every length).
func TestRadixTies(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 40 {
		n := radixTiesMin + rng.IntN(3000)
		a := make([]tieKey, n)
		for i := range a {
			var id string
			sub := int64(1_700_000_000_000_000_000)
			if round%2 == 0 {
				id = fmt.Sprintf("01M93Y1BY5WQZR7HX1V%07d", rng.IntN(n)) // an array: one prefix
			} else {
				b := make([]byte, rng.IntN(33))
				for k := range b {
					b[k] = byte(rng.IntN(256))
				}
				id, sub = string(b), rng.Int64N(2000)-1000
			}
			w, _ := packID(id)
			a[i] = tieKey{sub: sub, id: w, n: int32(len(id)), idx: int32(i)}
		}
		want := slices.Clone(a)
		slices.SortStableFunc(want, cmpTie)
		got, _ := radixTies(slices.Clone(a), nil)
		if !slices.Equal(got, want) {
			t.Fatalf("round %d (%d keys): radixTies differs from a stable sort by cmpTie", round, n)
		}
	}
}

// TestPendingSnapshotJob: each pending entry of a plan names its job's
// index in the snapshot and the snapshot's record, across cycles of one
// Scheduler whose snapshots list the jobs in different orders.
func TestPendingSnapshotJob(t *testing.T) {
	var js []*JobWrapper
	for i := range 50 {
		js = append(js, MakeJob(fmt.Sprintf("j%02d", i)).GPUs(1+i%3))
	}
	s := snap(nodes(MakeNode("n1").GPUs(2)), jobs(js...))
	sc := New()
	rng := rand.New(rand.NewPCG(7, 8))
	for cycle := range 3 {
		plan := sc.Schedule(s)
		if len(plan.Pending) == 0 {
			t.Fatal("no job waits")
		}
		for i := range plan.Pending {
			pe := &plan.Pending[i]
			j, k := pe.SnapshotJob()
			if k < 0 || k >= len(s.Jobs) || s.Jobs[k] != j || j.ID != pe.Job {
				t.Fatalf("cycle %d: %s names index %d (%v)", cycle, pe.Job, k, j)
			}
		}
		rng.Shuffle(len(s.Jobs), func(a, b int) { s.Jobs[a], s.Jobs[b] = s.Jobs[b], s.Jobs[a] })
	}
}
