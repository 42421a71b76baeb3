package storetest

import (
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
)

// testBudgetRace: 20 concurrent reservations against one budget, for many
// seeds: what is reserved never exceeds the limit, the month's Reserved
// equals the sum of the successful reservations, and settling actual cost
// through the ledger and releasing keeps committed = spent + remaining.
func testBudgetRace(t *testing.T, h Harness) {
	seeds := 12
	if testing.Short() {
		seeds = 3
	}
	for seed := int64(1); seed <= int64(seeds); seed++ {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
			s, _ := h.Open(t)
			rng := rand.New(rand.NewSource(seed))
			now := time.Date(2026, 11, 15, 12, 0, 0, 0, time.UTC)
			global := billing.Amount(rng.Int63n(5000)+1000) * billing.MicrosPerUnit
			team := billing.Amount(rng.Int63n(4000)+500) * billing.MicrosPerUnit
			must(t, s.Update(ctx, func(tx broker.Tx) error {
				if _, err := broker.SetBudget(tx, broker.GlobalScope, global, "USD", "ops", now); err != nil {
					return err
				}
				_, err := broker.SetBudget(tx, "nlp", team, "USD", "ops", now)
				return err
			}))
			const n = 20
			amounts := make([]billing.Amount, n)
			for i := range amounts {
				amounts[i] = billing.Amount(rng.Int63n(900)+100) * billing.MicrosPerUnit
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			var granted []int
			start := make(chan struct{})
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					<-start
					err := s.Update(ctx, func(tx broker.Tx) error {
						_, err := broker.Reserve(tx, fmt.Sprintf("m-%02d", i), "nlp", amounts[i], now, time.UTC)
						return err
					})
					switch {
					case err == nil:
						mu.Lock()
						granted = append(granted, i)
						mu.Unlock()
					case errors.Is(err, broker.ErrBudgetExceeded):
					default:
						t.Error(err)
					}
				}(i)
			}
			close(start)
			wg.Wait()
			var sum billing.Amount
			for _, i := range granted {
				sum += amounts[i]
			}
			if sum > team || sum > global {
				t.Fatalf("reserved %s against limits team %s / global %s", sum, team, global)
			}
			if len(granted) == 0 {
				t.Fatal("nothing was granted")
			}
			month := func(scope string) broker.BudgetMonth {
				var m broker.BudgetMonth
				must(t, s.View(ctx, func(tx broker.Tx) error {
					var err error
					m, err = broker.GetBudgetMonth(tx, "2026-11", scope)
					return err
				}))
				return m
			}
			if m := month("nlp"); m.Reserved != sum || m.Spent != 0 {
				t.Fatalf("team month %+v, want reserved %s", m, sum)
			}
			// Meter some actual cost for the granted machines, then end them.
			ledger := broker.Ledger{Store: s, Budgets: time.UTC}
			var entries []billing.Entry
			var spent billing.Amount
			for k, i := range granted {
				cost := amounts[i] / 3
				if k%2 == 0 {
					cost = amounts[i] * 2 // ran past its projection
				}
				e := burstEntry(fmt.Sprintf("m-%02d", i), now.Add(time.Duration(k)*time.Minute), cost)
				entries = append(entries, e)
				spent += e.Cost
			}
			if _, err := ledger.Append(ctx, entries); err != nil {
				t.Fatal(err)
			}
			if _, err := ledger.Append(ctx, entries); err != nil { // again: no double settle
				t.Fatal(err)
			}
			var remaining billing.Amount
			for k, i := range granted {
				e := entries[k]
				if e.Cost < amounts[i] {
					remaining += amounts[i] - e.Cost
				}
			}
			if m := month("nlp"); m.Spent != spent || m.Reserved != remaining {
				t.Fatalf("after settling: %+v, want spent %s reserved %s", m, spent, remaining)
			}
			must(t, s.Update(ctx, func(tx broker.Tx) error {
				for _, i := range granted {
					if err := broker.Release(tx, fmt.Sprintf("m-%02d", i)); err != nil {
						return err
					}
				}
				return nil
			}))
			if m := month(broker.GlobalScope); m.Reserved != 0 || m.Spent != spent {
				t.Fatalf("after release: %+v", m)
			}
		})
	}
}

// burstEntry is one cloud ledger slice of machine id costing cost.
func burstEntry(id string, start time.Time, cost billing.Amount) billing.Entry {
	const gpuMillis = 60_000
	// Price the slice so that rate × GPU-time is exactly cost.
	rate := cost.MulDiv(billing.MillisPerHour, gpuMillis)
	e := billing.Entry{Start: start, End: start.Add(time.Minute), Kind: billing.KindUsage, Team: "nlp", Job: "j-" + id,
		Attempt: 1, Queue: "default", Pool: billing.Pool{Kind: billing.PoolCloud, Provider: "aws", InstanceID: id, Node: id},
		GPUModel: "H100", GPUMillis: gpuMillis, Rate: rate, Currency: "USD", UtilPermille: -1}
	e.Cost = rate.MulDiv(gpuMillis, billing.MillisPerHour)
	e.ID = billing.DeriveID(e.Kind, e.Job, e.Attempt, id, start)
	return e
}
