package broker

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/billing"
)

// storeContents is every key and value of the budgets bucket.
func storeContents(t *testing.T, s *MemStore) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := s.View(context.Background(), func(tx Tx) error {
		return tx.Scan(BucketBudgets, "", "", func(k string, v []byte) error {
			out[k] = string(v)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// SettleAll must leave the store exactly as settling the entries one by
// one does: spend per team and month, reservations covered (one past its
// amount, where Remaining stops at zero), machines without a reservation,
// on-prem and free entries skipped, entries across a month boundary.
func TestSettleAllMatchesSettleOneByOne(t *testing.T) {
	loc := time.UTC
	oct := time.Date(2017, 10, 31, 23, 58, 0, 0, loc)
	setup := func(t *testing.T) *MemStore {
		s := NewMemStore()
		err := s.Update(context.Background(), func(tx Tx) error {
			if _, err := SetBudget(tx, GlobalScope, billing.Amount(1_000*billing.MicrosPerUnit), "USD", "test", oct); err != nil {
				return err
			}
			if _, err := Reserve(tx, "i-a", "vision", billing.Amount(3*billing.MicrosPerUnit), oct, loc); err != nil {
				return err
			}
			_, err := Reserve(tx, "i-b", "speech", billing.Amount(50*billing.MicrosPerUnit), oct, loc)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	cloud := func(id string) billing.Pool { return billing.Pool{Kind: billing.PoolCloud, InstanceID: id} }
	var entries []billing.Entry
	for i := range 4 {
		start := oct.Add(time.Duration(i) * time.Minute) // two in October, two in November
		entries = append(entries,
			billing.Entry{ID: "a" + string(rune('0'+i)), Start: start, Team: "vision", Pool: cloud("i-a"), Cost: billing.Amount(1_250_000)},
			billing.Entry{ID: "b" + string(rune('0'+i)), Start: start, Team: "speech", Pool: cloud("i-b"), Cost: billing.Amount(700_001)},
			billing.Entry{ID: "c" + string(rune('0'+i)), Start: start, Team: "vision", Pool: cloud("i-unreserved"), Cost: billing.Amount(10)},
			billing.Entry{ID: "d" + string(rune('0'+i)), Start: start, Team: "vision", Pool: billing.Pool{Kind: billing.PoolOnPrem}, Cost: billing.Amount(99)},
			billing.Entry{ID: "e" + string(rune('0'+i)), Start: start, Team: "speech", Pool: cloud("i-b")},
			billing.Entry{ID: "f" + string(rune('0'+i)), Start: start, Team: "speech", Pool: billing.Pool{Kind: billing.PoolLease}, Cost: billing.Amount(5)},
		)
	}

	one := setup(t)
	for _, e := range entries {
		if err := one.Update(context.Background(), func(tx Tx) error { return Settle(tx, e, loc) }); err != nil {
			t.Fatal(err)
		}
	}
	all := setup(t)
	if err := all.Update(context.Background(), func(tx Tx) error { return SettleAll(tx, entries, loc) }); err != nil {
		t.Fatal(err)
	}
	want, got := storeContents(t, one), storeContents(t, all)
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("SettleAll left the store unlike Settle one by one (-one by one +all):\n%s", d)
	}
	// The reservation of i-a is covered past its amount, and October's
	// and November's spend both landed.
	err := all.View(context.Background(), func(tx Tx) error {
		r, err := GetReservation(tx, "i-a")
		if err != nil {
			return err
		}
		if r.Remaining() != 0 || r.Settled != billing.Amount(5*billing.MicrosPerUnit) {
			t.Errorf("reservation i-a: settled %v, remaining %v; want 5.00 and 0", r.Settled, r.Remaining())
		}
		for _, month := range []string{"2017-10", "2017-11"} {
			m, err := GetBudgetMonth(tx, month, GlobalScope)
			if err != nil {
				return err
			}
			if want := billing.Amount(2 * (1_250_000 + 700_001 + 10 + 5)); m.Spent != want {
				t.Errorf("%s global spent %v, want %v", month, m.Spent, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
