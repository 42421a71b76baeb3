package billing_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/billing"
)

// world is a random fleet history: on-prem jobs, burst machines and the
// jobs on them, with telemetry, over a few hours of virtual time.
type world struct {
	allocs   []billing.Allocation
	machines []billing.Machine
	end      time.Time // every allocation and machine that ends has ended by then
}

func randomWorld(seed uint64) world {
	rng := rand.New(rand.NewPCG(seed, 7))
	dur := func(lo, hi time.Duration) time.Duration {
		// whole milliseconds, like the broker's clock readings after Truncate
		return (lo + time.Duration(rng.Int64N(int64(hi-lo)))).Truncate(time.Millisecond)
	}
	w := world{end: at(4 * time.Hour)}
	util := func(from, to time.Time) []billing.UtilSample {
		var s []billing.UtilSample
		for t := from.Add(dur(0, time.Minute)); t.Before(to); t = t.Add(dur(10*time.Second, 3*time.Minute)) {
			s = append(s, billing.UtilSample{At: t, Permille: int32(rng.IntN(1001))})
		}
		return s
	}
	job := 0
	// lane fills one GPU (or a share of one) of a node with back-to-back
	// jobs between from and to; the last may still be running.
	lane := func(pool billing.Pool, milli int64, from, to time.Time, running bool) {
		for t := from.Add(dur(0, 20*time.Minute)); t.Before(to); {
			job++
			a := billing.Allocation{
				Job: fmt.Sprintf("job-%03d", job), Attempt: 1 + rng.IntN(3),
				Team: []string{"nlp", "vision", "research"}[rng.IntN(3)], Project: "p", User: "u", Queue: "default",
				Pool: pool, GPUModel: "H100", GPUMilli: milli, Start: t,
			}
			end := t.Add(dur(10*time.Second, 50*time.Minute))
			if end.After(to) {
				if running {
					end = time.Time{}
				} else {
					end = to
				}
			}
			a.End = end
			uEnd := end
			if uEnd.IsZero() {
				uEnd = w.end
			}
			a.Util = util(t, uEnd)
			w.allocs = append(w.allocs, a)
			if end.IsZero() {
				return
			}
			t = end.Add(dur(0, 10*time.Minute))
		}
	}
	for n := range 3 {
		pool := billing.Pool{Kind: billing.PoolOnPrem, Node: fmt.Sprintf("gpu-%d", n)}
		for range 4 {
			lane(pool, 1000, at(0), at(3*time.Hour), rng.IntN(3) == 0)
		}
		// two sharers of one card, each a quarter
		lane(pool, 250, at(0), at(3*time.Hour), false)
		lane(pool, 250, at(0), at(3*time.Hour), false)
	}
	for m := range 3 {
		start := at(dur(0, time.Hour))
		end := start.Add(dur(30*time.Minute, 2*time.Hour))
		running := m == 2
		price, _ := billing.InstancePrice(usd("98.32"), 4)
		mach := billing.Machine{
			Pool:     billing.Pool{Kind: billing.PoolCloud, Provider: "aws", Region: "us-east-1", InstanceType: "p4d", InstanceID: fmt.Sprintf("i-%d", m), Node: fmt.Sprintf("burst-%d", m)},
			GPUModel: "H100", GPUs: 4, Spot: m == 1,
			Prices: billing.PriceSchedule{{PerGPUHour: price}, {From: start.Add(37*time.Minute + 123*time.Millisecond), PerGPUHour: price + usd("1.5")}},
			Start:  start, DemandTeam: "nlp",
		}
		if !running {
			mach.End = end
		}
		w.machines = append(w.machines, mach)
		// jobs only between boot (first minutes) and drain
		for range 4 {
			lane(mach.Pool, 1000, start.Add(dur(time.Minute, 8*time.Minute)), end.Add(-dur(0, 5*time.Minute)), running)
		}
	}
	return w
}

// view is what the broker knows at now: allocations and machines that have
// started, with ends only once they have happened, and only those running
// or ended after the cursor.
func (w world) view(now, cursor time.Time) ([]billing.Allocation, []billing.Machine) {
	var as []billing.Allocation
	for _, a := range w.allocs {
		if a.Start.After(now) || (!a.End.IsZero() && !a.End.After(cursor)) {
			continue
		}
		if a.End.After(now) {
			a.End = time.Time{}
		}
		as = append(as, a)
	}
	var ms []billing.Machine
	for _, m := range w.machines {
		if m.Start.After(now) || (!m.End.IsZero() && !m.End.After(cursor)) {
			continue
		}
		if m.End.After(now) {
			m.End = time.Time{}
		}
		ms = append(ms, m)
	}
	return as, ms
}

func cfgForWorld() billing.MeterConfig {
	c := meterConfig()
	c.OnPrem.ByModel["H100"] = billing.PriceSchedule{{PerGPUHour: usd("2.10")}, {From: at(50*time.Minute + 17*time.Second), PerGPUHour: usd("2.35")}}
	c.Overhead.ChargeTo = billing.ChargeDemandTeam
	return c
}

// runCycles meters the world with irregular cycle times up to stop, through
// the given store and marks; hook may make a cycle fail (a crash).
func runCycles(t *testing.T, seed uint64, w world, stop time.Time, store billing.Store, marks billing.Watermarks) (crashes int) {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 99))
	cfg := cfgForWorld()
	var times []time.Time
	for now := at(0); now.Before(stop); now = now.Add(time.Duration(20_000+rng.IntN(130_000)) * time.Millisecond) {
		times = append(times, now)
	}
	for _, now := range append(times, stop) {
		cursor, err := marks.Watermark(ctx, billing.MeterMark)
		if err != nil {
			t.Fatal(err)
		}
		as, ms := w.view(now, cursor)
		res, err := billing.MeterCycle(ctx, store, marks, cfg, as, ms, now)
		if errors.Is(err, errCrash) {
			crashes++
			continue
		}
		if err != nil {
			t.Fatalf("cycle at %s: %v", now.Sub(t0), err)
		}
		if len(res.Problems) > 0 {
			t.Fatalf("cycle at %s: problems %v", now.Sub(t0), res.Problems)
		}
	}
	return crashes
}

func TestMeterGPUTimeEqualsAllocationTimeTimesGPUs(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			w := randomWorld(seed)
			store := billing.NewMemStore()
			stop := w.end.Add(10 * time.Minute)
			runCycles(t, seed, w, stop, store, store)
			through, _ := store.Watermark(t.Context(), billing.MeterMark)

			type key struct {
				job      string
				attempt  int
				resource string
			}
			got := map[key]int64{}
			pieces := map[key]int64{}
			usageOn := map[string]int64{}
			overheadOn := map[string]int64{}
			for _, e := range scan(t, store, billing.Period{From: at(-time.Hour), To: at(24 * time.Hour)}) {
				if e.Kind == billing.KindOverhead {
					overheadOn[e.Pool.InstanceID] += e.GPUMillis
					continue
				}
				k := key{e.Job, e.Attempt, e.Pool.ResourceID()}
				got[k] += e.GPUMillis
				pieces[k]++
				usageOn[e.Pool.InstanceID] += e.GPUMillis
			}
			for _, a := range w.allocs {
				end := a.End
				if end.IsZero() {
					end = through // a running job is metered to the last complete slice
				}
				want := end.Sub(a.Start).Milliseconds() * a.GPUMilli / 1000
				k := key{a.Job, a.Attempt, a.Pool.ResourceID()}
				diff := got[k] - want
				// Each piece rounds to the nearest GPU-ms; far inside the
				// "± one slice" the issue allows.
				if diff < -pieces[k] || diff > pieces[k] {
					t.Errorf("%s: metered %d GPU-ms, allocation time × GPUs is %d (%d pieces)", a.Job, got[k], want, pieces[k])
				}
			}
			for _, m := range w.machines {
				end := m.End
				if end.IsZero() {
					end = through
				}
				capacity := end.Sub(m.Start).Milliseconds() * int64(m.GPUs)
				id := m.Pool.InstanceID
				if usageOn[id]+overheadOn[id] != capacity {
					t.Errorf("machine %s: usage %d + overhead %d GPU-ms != lifetime × GPUs %d", id, usageOn[id], overheadOn[id], capacity)
				}
				if overheadOn[id] == 0 || usageOn[id] == 0 {
					t.Errorf("machine %s: usage %d, overhead %d; the world should have both", id, usageOn[id], overheadOn[id])
				}
			}
		})
	}
}

var errCrash = errors.New("simulated crash")

// crashy wraps a store and its marks and fails at chosen points: before
// the append, after part of it, or after it but before the cursor moves,
// the ways a kill -9 can cut a cycle.
type crashy struct {
	*billing.MemStore
	rng        *rand.Rand
	prob       float64
	afterWrite bool // the last Append "succeeded" but the process died
}

func (c *crashy) Append(ctx context.Context, es []billing.Entry) (int, error) {
	c.afterWrite = false
	if c.rng.Float64() >= c.prob {
		n, err := c.MemStore.Append(ctx, es)
		if err == nil && c.rng.Float64() < c.prob {
			c.afterWrite = true // die before SetWatermark
		}
		return n, err
	}
	// die after a random prefix reached the disk
	cut := c.rng.IntN(len(es) + 1)
	if _, err := c.MemStore.Append(ctx, es[:cut]); err != nil {
		return 0, err
	}
	return 0, errCrash
}

func (c *crashy) SetWatermark(ctx context.Context, key string, t time.Time) error {
	if c.afterWrite {
		c.afterWrite = false
		return errCrash
	}
	return c.MemStore.SetWatermark(ctx, key, t)
}

func TestMeterCrashAtAnyPointLosesAndDuplicatesNothing(t *testing.T) {
	for seed := range uint64(10) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			w := randomWorld(seed)
			stop := w.end.Add(10 * time.Minute)

			ref := billing.NewMemStore()
			runCycles(t, seed, w, stop, ref, ref)

			c := &crashy{MemStore: billing.NewMemStore(), rng: rand.New(rand.NewPCG(seed, 1234)), prob: 0.3}
			crashes := runCycles(t, seed, w, stop, c, c)
			// one clean cycle after the last crash, at the same stop time
			// the reference ended at
			c.prob = 0
			as, ms := w.view(stop, mustMark(t, c))
			if _, err := billing.MeterCycle(t.Context(), c, c, cfgForWorld(), as, ms, stop); err != nil {
				t.Fatal(err)
			}
			if crashes < 10 {
				t.Fatalf("only %d crashes; the test would prove little", crashes)
			}
			all := billing.Period{From: at(-time.Hour), To: at(24 * time.Hour)}
			want, got := scan(t, ref, all), scan(t, c.MemStore, all)
			if diff := gocmp.Diff(want, got); diff != "" {
				t.Fatalf("after %d crashes the ledger differs from the crash-free one (-want +got):\n%s", crashes, diff)
			}
		})
	}
}

func mustMark(t *testing.T, w billing.Watermarks) time.Time {
	t.Helper()
	m, err := w.Watermark(t.Context(), billing.MeterMark)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// batchSizes records the size of every Append.
type batchSizes struct {
	*billing.MemStore
	sizes []int
}

func (b *batchSizes) Append(ctx context.Context, es []billing.Entry) (int, error) {
	b.sizes = append(b.sizes, len(es))
	return b.MemStore.Append(ctx, es)
}

func TestMeterCycleCatchesUpAnOutageInWindows(t *testing.T) {
	w := randomWorld(4)
	stop := w.end.Add(10 * time.Minute)
	ref := billing.NewMemStore()
	runCycles(t, 4, w, stop, ref, ref)

	// The broker meters once at 10 minutes, is down, and comes back at stop.
	b := &batchSizes{MemStore: billing.NewMemStore()}
	for _, now := range []time.Time{at(10 * time.Minute), stop} {
		as, ms := w.view(now, mustMark(t, b))
		res, err := billing.MeterCycle(t.Context(), b, b, cfgForWorld(), as, ms, now)
		if err != nil || len(res.Problems) > 0 {
			t.Fatalf("cycle at %s: %v %v", now.Sub(t0), err, res.Problems)
		}
	}
	all := billing.Period{From: at(-time.Hour), To: at(24 * time.Hour)}
	if diff := gocmp.Diff(scan(t, ref, all), scan(t, b.MemStore, all)); diff != "" {
		t.Fatalf("ledger after an outage differs from the regular one (-want +got):\n%s", diff)
	}
	if len(b.sizes) < 4 {
		t.Errorf("the 4-hour outage was appended in %d batches %v, want one per hour", len(b.sizes), b.sizes)
	}
	// 3 nodes × 6 lanes + 3 machines × (4 lanes + overhead), one hour of
	// minutes plus rate splits: far below a day's worth.
	for _, n := range b.sizes {
		if n > 60*40 {
			t.Errorf("a batch of %d entries: more than an hour's worth", n)
		}
	}
}
