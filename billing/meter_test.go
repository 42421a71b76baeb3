package billing_test

import (
	"cmp"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/spillway-dev/spillway/billing"
)

var t0 = time.Date(2026, 11, 5, 10, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func usd(s string) billing.Amount {
	a, err := billing.ParseAmount(s)
	if err != nil {
		panic(err) // test constants only
	}
	return a
}

func meterConfig() billing.MeterConfig {
	return billing.MeterConfig{
		Slice:    time.Minute,
		Currency: "USD",
		OnPrem:   billing.RateTable{ByModel: map[string]billing.PriceSchedule{"H100": billing.FlatPrice(usd("2.10"))}},
		Overhead: billing.OverheadPolicy{ChargeTo: billing.ChargeAccount},
	}
}

// alloc builds an on-prem allocation: alloc("j1").GPUs(2).From(..).To(..).
type allocB struct{ a billing.Allocation }

func alloc(job string) *allocB {
	return &allocB{billing.Allocation{
		Job: job, Attempt: 1, Team: "nlp", Project: "chat-v2", User: "ana", Queue: "default",
		Pool:     billing.Pool{Kind: billing.PoolOnPrem, Node: "gpu-a1"},
		GPUModel: "H100", GPUMilli: 1000, Start: t0,
	}}
}

func (b *allocB) GPUs(n int64) *allocB         { b.a.GPUMilli = n * 1000; return b }
func (b *allocB) Milli(n int64) *allocB        { b.a.GPUMilli = n; return b }
func (b *allocB) From(d time.Duration) *allocB { b.a.Start = at(d); return b }
func (b *allocB) To(d time.Duration) *allocB   { b.a.End = at(d); return b }
func (b *allocB) On(p billing.Pool) *allocB    { b.a.Pool = p; return b }
func (b *allocB) Util(s ...billing.UtilSample) *allocB {
	b.a.Util = s
	return b
}
func (b *allocB) Obj() billing.Allocation { return b.a }

// slice is the part of an entry a table test states.
type slice struct {
	Start, End time.Duration
	Kind       billing.Kind
	Team       string
	GPUMillis  int64
	Rate       string
	Cost       string
	Util       int32
}

func slicesOf(es []billing.Entry) []slice {
	out := make([]slice, len(es))
	for i, e := range es {
		out[i] = slice{e.Start.Sub(t0), e.End.Sub(t0), e.Kind, e.Team, e.GPUMillis, e.Rate.String(), e.Cost.String(), e.UtilPermille}
	}
	// Entries of one start come in id order; tables list overhead first.
	slices.SortStableFunc(out, func(a, b slice) int {
		if a.Start != b.Start {
			return cmp.Compare(a.Start, b.Start)
		}
		return strings.Compare(string(a.Kind), string(b.Kind))
	})
	return out
}

var burstPool = billing.Pool{Kind: billing.PoolCloud, Provider: "aws", Region: "us-east-1", InstanceType: "p5.48xlarge", InstanceID: "i-0abc", Node: "burst-1"}

func TestMeter(t *testing.T) {
	const unk = billing.UtilUnknown
	machine := billing.Machine{
		Pool: burstPool, GPUModel: "H100", GPUs: 8,
		Prices: billing.FlatPrice(usd("12.29")), Start: at(0), End: at(5 * time.Minute),
		DemandTeam: "vision", DemandProject: "detector", DemandQueue: "default",
	}
	cases := []struct {
		name     string
		cfg      func(*billing.MeterConfig)
		from     time.Duration
		now      time.Duration
		allocs   []billing.Allocation
		machines []billing.Machine
		want     []slice
		through  time.Duration
		problems []error
	}{
		{
			name:   "a running job emits only its complete slices",
			now:    3*time.Minute + 30*time.Second,
			allocs: []billing.Allocation{alloc("j1").From(10 * time.Second).Obj()},
			want: []slice{
				{10 * time.Second, time.Minute, billing.KindUsage, "nlp", 50_000, "2.10", "0.029167", unk},
				{time.Minute, 2 * time.Minute, billing.KindUsage, "nlp", 60_000, "2.10", "0.035", unk},
				{2 * time.Minute, 3 * time.Minute, billing.KindUsage, "nlp", 60_000, "2.10", "0.035", unk},
			},
			through: 3 * time.Minute,
		},
		{
			name:   "a job that ended gets a final partial slice",
			now:    5 * time.Minute,
			allocs: []billing.Allocation{alloc("j1").GPUs(2).To(2*time.Minute + 15*time.Second).Obj()},
			want: []slice{
				{0, time.Minute, billing.KindUsage, "nlp", 120_000, "2.10", "0.07", unk},
				{time.Minute, 2 * time.Minute, billing.KindUsage, "nlp", 120_000, "2.10", "0.07", unk},
				{2 * time.Minute, 2*time.Minute + 15*time.Second, billing.KindUsage, "nlp", 30_000, "2.10", "0.0175", unk},
			},
			through: 5 * time.Minute,
		},
		{
			name:    "a shared card is counted by its memory share",
			now:     time.Minute,
			allocs:  []billing.Allocation{alloc("j1").Milli(billing.ShareMilli(20<<30, 80<<30)).Obj()},
			want:    []slice{{0, time.Minute, billing.KindUsage, "nlp", 15_000, "2.10", "0.00875", unk}},
			through: time.Minute,
		},
		{
			name: "metering resumes at the cursor",
			from: 2 * time.Minute,
			now:  3*time.Minute + time.Second,
			allocs: []billing.Allocation{
				alloc("j1").Obj(),
				alloc("old").To(90 * time.Second).Obj(), // ended before the cursor: nothing left
			},
			want:    []slice{{2 * time.Minute, 3 * time.Minute, billing.KindUsage, "nlp", 60_000, "2.10", "0.035", unk}},
			through: 3 * time.Minute,
		},
		{
			name: "utilisation is the time-weighted mean of the samples covering the slice",
			now:  3 * time.Minute,
			allocs: []billing.Allocation{alloc("j1").Util(
				billing.UtilSample{At: at(-time.Hour), Permille: 100},
				billing.UtilSample{At: at(0), Permille: 500},
				billing.UtilSample{At: at(30 * time.Second), Permille: 1000},
				billing.UtilSample{At: at(2 * time.Minute), Permille: 0},
			).To(150 * time.Second).Obj()},
			want: []slice{
				{0, time.Minute, billing.KindUsage, "nlp", 60_000, "2.10", "0.035", 750},
				{time.Minute, 2 * time.Minute, billing.KindUsage, "nlp", 60_000, "2.10", "0.035", 1000},
				{2 * time.Minute, 150 * time.Second, billing.KindUsage, "nlp", 30_000, "2.10", "0.0175", 0},
			},
			through: 3 * time.Minute,
		},
		{
			name: "a burst machine's unallocated GPU-time is overhead on the overhead account",
			now:  10 * time.Minute,
			allocs: []billing.Allocation{
				alloc("j1").On(burstPool).GPUs(4).From(90 * time.Second).To(3 * time.Minute).Obj(),
			},
			machines: []billing.Machine{machine},
			want: []slice{
				{0, time.Minute, billing.KindOverhead, "burst-overhead", 480_000, "12.29", "1.638667", 0},
				{time.Minute, 2 * time.Minute, billing.KindOverhead, "burst-overhead", 360_000, "12.29", "1.229", 0},
				{90 * time.Second, 2 * time.Minute, billing.KindUsage, "nlp", 120_000, "12.29", "0.409667", unk},
				{2 * time.Minute, 3 * time.Minute, billing.KindOverhead, "burst-overhead", 240_000, "12.29", "0.8193330", 0},
				{2 * time.Minute, 3 * time.Minute, billing.KindUsage, "nlp", 240_000, "12.29", "0.819333", unk},
				{3 * time.Minute, 4 * time.Minute, billing.KindOverhead, "burst-overhead", 480_000, "12.29", "1.638667", 0},
				{4 * time.Minute, 5 * time.Minute, billing.KindOverhead, "burst-overhead", 480_000, "12.29", "1.638667", 0},
			},
			through: 10 * time.Minute,
		},
		{
			name:     "overhead goes to the demanding team when configured so",
			cfg:      func(c *billing.MeterConfig) { c.Overhead.ChargeTo = billing.ChargeDemandTeam },
			now:      time.Minute,
			machines: []billing.Machine{machine},
			want:     []slice{{0, time.Minute, billing.KindOverhead, "vision", 480_000, "12.29", "1.638667", 0}},
			through:  time.Minute,
		},
		{
			name:     "GPU-time without a rate is kept at rate 0 and reported",
			now:      time.Minute,
			allocs:   []billing.Allocation{func() billing.Allocation { a := alloc("j1").Obj(); a.GPUModel = "B200"; return a }()},
			want:     []slice{{0, time.Minute, billing.KindUsage, "nlp", 60_000, "0.00", "0.00", unk}},
			through:  time.Minute,
			problems: []error{billing.ErrNoRate},
		},
		{
			name:     "a malformed allocation is reported, not metered",
			now:      time.Minute,
			allocs:   []billing.Allocation{alloc("j1").Milli(0).Obj()},
			through:  time.Minute,
			problems: []error{errors.New("GPUMilli 0 outside 1..1000000")},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := meterConfig()
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatalf("config: %v", err)
			}
			var from time.Time
			if c.from != 0 {
				from = at(c.from)
			}
			res := billing.Meter(cfg, billing.MeterInput{From: from, Now: at(c.now), Allocations: c.allocs, Machines: c.machines})
			if diff := gocmp.Diff(c.want, slicesOf(res.Entries), cmpopts.EquateEmpty(), gocmp.Comparer(sameMoney)); diff != "" {
				t.Errorf("entries (-want +got):\n%s", diff)
			}
			if !res.Through.Equal(at(c.through)) {
				t.Errorf("through = %v, want %v", res.Through.Sub(t0), c.through)
			}
			if len(res.Problems) != len(c.problems) {
				t.Fatalf("problems = %v, want %d", res.Problems, len(c.problems))
			}
			for i, p := range c.problems {
				if !errors.Is(res.Problems[i], p) && !containsMsg(res.Problems[i], p) {
					t.Errorf("problem %d = %v, want %v", i, res.Problems[i], p)
				}
			}
			for _, e := range res.Entries {
				if err := e.Validate(); err != nil {
					t.Errorf("meter produced an invalid entry: %v", err)
				}
			}
		})
	}
}

// sameMoney compares the Rate and Cost strings of slice as amounts, so a
// table may write "0.8193330" or "0.819333".
func sameMoney(a, b string) bool {
	x, errA := billing.ParseAmount(a)
	y, errB := billing.ParseAmount(b)
	if errA != nil || errB != nil {
		return a == b
	}
	return x == y
}

// containsMsg matches a problem whose text the test states, for the
// malformed-input problems that carry no sentinel.
func containsMsg(err, want error) bool {
	return err != nil && want != nil && len(err.Error()) >= len(want.Error()) &&
		err.Error()[len(err.Error())-len(want.Error()):] == want.Error()
}

func TestRateChangeAppliesFromItsEffectiveTimeOnly(t *testing.T) {
	change := 90 * time.Second
	withChange := meterConfig()
	withChange.OnPrem.ByModel["H100"] = billing.PriceSchedule{
		{PerGPUHour: usd("2.10")},
		{From: at(change), PerGPUHour: usd("3.00")},
	}
	job := alloc("j1").To(3 * time.Minute).Obj()

	t.Run("a slice crossing the change is split at the effective time", func(t *testing.T) {
		res := billing.Meter(withChange, billing.MeterInput{Now: at(5 * time.Minute), Allocations: []billing.Allocation{job}})
		want := []slice{
			{0, time.Minute, billing.KindUsage, "nlp", 60_000, "2.10", "0.035", billing.UtilUnknown},
			{time.Minute, change, billing.KindUsage, "nlp", 30_000, "2.10", "0.0175", billing.UtilUnknown},
			{change, 2 * time.Minute, billing.KindUsage, "nlp", 30_000, "3.00", "0.025", billing.UtilUnknown},
			{2 * time.Minute, 3 * time.Minute, billing.KindUsage, "nlp", 60_000, "3.00", "0.05", billing.UtilUnknown},
		}
		if diff := gocmp.Diff(want, slicesOf(res.Entries), gocmp.Comparer(sameMoney)); diff != "" {
			t.Errorf("entries (-want +got):\n%s", diff)
		}
	})

	t.Run("a change configured late never reprices what was metered", func(t *testing.T) {
		store := billing.NewMemStore()
		ctx := t.Context()
		// Cycle 1 runs at 2m with the old rate only.
		if _, err := billing.MeterCycle(ctx, store, store, meterConfig(), []billing.Allocation{job}, nil, at(2*time.Minute)); err != nil {
			t.Fatal(err)
		}
		// The operator then adds a rate effective at 1m30s, in the past.
		if _, err := billing.MeterCycle(ctx, store, store, withChange, []billing.Allocation{job}, nil, at(5*time.Minute)); err != nil {
			t.Fatal(err)
		}
		want := []slice{
			{0, time.Minute, billing.KindUsage, "nlp", 60_000, "2.10", "0.035", billing.UtilUnknown},
			{time.Minute, 2 * time.Minute, billing.KindUsage, "nlp", 60_000, "2.10", "0.035", billing.UtilUnknown},
			{2 * time.Minute, 3 * time.Minute, billing.KindUsage, "nlp", 60_000, "3.00", "0.05", billing.UtilUnknown},
		}
		if diff := gocmp.Diff(want, slicesOf(scan(t, store, billing.Period{From: t0, To: at(time.Hour)})), gocmp.Comparer(sameMoney)); diff != "" {
			t.Errorf("ledger (-want +got):\n%s", diff)
		}
	})
}

func TestShareMilli(t *testing.T) {
	for _, c := range []struct{ mem, card, want int64 }{
		{20 << 30, 80 << 30, 250},
		{40 << 30, 80 << 30, 500},
		{80 << 30, 80 << 30, 1000},
		{100 << 30, 80 << 30, 1000},
		{1, 80 << 30, 1},
		{10 << 30, 24 << 30, 417},
		{0, 80 << 30, 1},
	} {
		if got := billing.ShareMilli(c.mem, c.card); got != c.want {
			t.Errorf("ShareMilli(%d, %d) = %d, want %d", c.mem, c.card, got, c.want)
		}
	}
}

func TestMeterConfigValidate(t *testing.T) {
	for _, s := range []time.Duration{0, time.Second, 60 * time.Second, 15 * time.Minute, time.Hour} {
		c := meterConfig()
		c.Slice = s
		if err := c.Validate(); err != nil {
			t.Errorf("slice %s refused: %v", s, err)
		}
	}
	for _, s := range []time.Duration{500 * time.Millisecond, 7 * time.Minute, 2 * time.Hour} {
		c := meterConfig()
		c.Slice = s
		if err := c.Validate(); !errors.Is(err, billing.ErrInvalidConfig) {
			t.Errorf("slice %s: err = %v, want ErrInvalidConfig", s, err)
		}
	}
}

func TestStagingTimeIsMeteredApartFromCompute(t *testing.T) {
	a := alloc("j1").a
	a.End = at(10 * time.Minute)
	// 90 s of inputs at the start, 30 s of outputs at the end (open span).
	a.Staging = []billing.Span{{Start: t0, End: at(90 * time.Second)}, {Start: at(570 * time.Second)}}
	res := billing.Meter(meterConfig(), billing.MeterInput{Now: at(time.Hour), Allocations: []billing.Allocation{a}})
	if len(res.Problems) > 0 {
		t.Fatal(res.Problems)
	}
	var staging, usage int64
	for _, e := range res.Entries {
		if err := e.Validate(); err != nil {
			t.Fatal(err)
		}
		switch e.Kind {
		case billing.KindStaging:
			staging += e.GPUMillis
		case billing.KindUsage:
			usage += e.GPUMillis
		}
	}
	if staging != 120_000 || usage != 480_000 {
		t.Fatalf("staging %d usage %d GPU-ms", staging, usage)
	}
	// Metering the same window again derives the same ids.
	again := billing.Meter(meterConfig(), billing.MeterInput{Now: at(time.Hour), Allocations: []billing.Allocation{a}})
	for i := range res.Entries {
		if res.Entries[i].ID != again.Entries[i].ID {
			t.Fatal("ids differ between runs")
		}
	}
}
