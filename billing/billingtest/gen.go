// Package billingtest holds what tests of billing and of the broker's
// ledger stores share: the Store conformance suite, a generator of random
// valid ledgers and a virtual clock.
package billingtest

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/billing"
)

var (
	teams    = []string{"nlp", "vision", "research", "speech", "burst-overhead"}
	projects = []string{"", "chat-v2", "detector", "asr", "eval"}
	users    = []string{"ana", "bo", "chen", "dee", "eli"}
	queues   = []string{"default", "inference", "high_perf"}
	models   = []string{"H100", "A100", "L40S"}
	pools    = []billing.Pool{
		{Kind: billing.PoolOnPrem, Name: "rack-a", Node: "gpu-a1"},
		{Kind: billing.PoolOnPrem, Name: "rack-a", Node: "gpu-a2"},
		{Kind: billing.PoolOnPrem, Node: "gpu-b1"},
		{Kind: billing.PoolCloud, Provider: "aws", Region: "us-east-1", InstanceType: "p5.48xlarge", InstanceID: "i-0abc", Node: "burst-1"},
		{Kind: billing.PoolCloud, Provider: "gcp", Region: "europe-west4", InstanceType: "a3-highgpu-8g", InstanceID: "gce-77"},
		{Kind: billing.PoolLease, Provider: "lambda", InstanceType: "8xH100", InstanceID: "lease-9", Node: "lease-9"},
	}
	rates = []string{"0", "1.20", "2.10", "12.29", "3.141593", "98.32"}
)

// Entries returns n random valid entries with starts inside p, a mix of
// usage and overhead, pools, rates, shared cards and unknown utilisation,
// some sharing a start. The same seed gives the same entries.
func Entries(seed uint64, n int, p billing.Period, currency string) []billing.Entry {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	span := p.To.Sub(p.From).Milliseconds()
	out := make([]billing.Entry, 0, n)
	seen := make(map[string]bool, n)
	for i := 0; len(out) < n; i++ {
		start := p.From.UTC().Add(time.Duration(rng.Int64N(span)) * time.Millisecond).Truncate(time.Millisecond)
		if i > 0 && rng.IntN(5) == 0 {
			start = out[rng.IntN(len(out))].Start // share a start
		}
		end := start.Add(time.Duration(1+rng.Int64N(60_000)) * time.Millisecond)
		pool := pools[rng.IntN(len(pools))]
		kind := billing.KindUsage
		if pool.Kind != billing.PoolOnPrem && rng.IntN(4) == 0 {
			kind = billing.KindOverhead
		}
		rate, _ := billing.ParseAmount(rates[rng.IntN(len(rates))])
		gpuMillis := end.Sub(start).Milliseconds() * int64(1+rng.IntN(8))
		if rng.IntN(4) == 0 {
			gpuMillis = gpuMillis * int64(1+rng.IntN(999)) / 1000
		}
		util := int32(rng.IntN(1001))
		if rng.IntN(6) == 0 {
			util = billing.UtilUnknown
		}
		e := billing.Entry{
			Start: start, End: end, Kind: kind,
			Team: teams[rng.IntN(len(teams))], Pool: pool,
			GPUModel: models[rng.IntN(len(models))], Spot: pool.Kind == billing.PoolCloud && rng.IntN(3) == 0,
			GPUMillis: gpuMillis, Rate: rate, Cost: billing.CostOf(rate, gpuMillis),
			Currency: currency, UtilPermille: util,
		}
		if kind == billing.KindUsage {
			e.Project = projects[rng.IntN(len(projects))]
			e.User = users[rng.IntN(len(users))]
			e.Job = fmt.Sprintf("job-%03d", rng.IntN(200))
			e.Attempt = 1 + rng.IntN(3)
			e.Queue = queues[rng.IntN(len(queues))]
			e.ID = billing.DeriveID(kind, e.Job, e.Attempt, pool.ResourceID(), start)
		} else {
			e.ID = billing.DeriveID(kind, "", 0, pool.InstanceID, start)
		}
		if seen[e.ID] {
			continue // the rare repeat of a slice; ids stay unique
		}
		seen[e.ID] = true
		out = append(out, e)
	}
	return out
}

// VirtualClock is a clock for code that only reads the time and sleeps:
// After moves the clock forward by d and fires at once, so retries with
// backoff run instantly in virtual time. It is safe for concurrent use.
type VirtualClock struct {
	mu    sync.Mutex
	now   time.Time
	slept []time.Duration
}

// NewVirtualClock returns a clock reading t.
func NewVirtualClock(t time.Time) *VirtualClock { return &VirtualClock{now: t} }

// Now returns the virtual time.
func (c *VirtualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t.
func (c *VirtualClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// After advances the clock by d and returns a channel that already holds
// the new time.
func (c *VirtualClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.slept = append(c.slept, d)
	ch := make(chan time.Time, 1)
	ch <- c.now
	return ch
}

// Slept returns every duration After was called with, in order.
func (c *VirtualClock) Slept() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.slept...)
}
