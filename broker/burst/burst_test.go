package burst

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/providers"
)

var now = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func usd(s string) billing.Amount {
	a, err := billing.ParseAmount(s)
	if err != nil {
		panic(err)
	}
	return a
}

func offer(provider, typ string, gpus int, price string, spot bool) providers.Offer {
	return providers.Offer{Provider: provider, Region: "us-east-1", InstanceType: typ, GPUModel: "H100", GPUs: gpus,
		GPUMemoryBytes: 80 << 30, Spot: spot, PricePerHour: usd(price), Currency: "USD", Available: true}
}

var catalog = []providers.Offer{
	offer("aws", "p5.48xlarge", 8, "98.32", false),
	offer("aws", "p5.48xlarge", 8, "40.00", true),
	offer("gcp", "a3-highgpu-1g", 1, "13.00", false),
	offer("gcp", "a3-highgpu-8g", 8, "88.00", false),
}

// job is a builder: a 1-GPU medium job of team nlp waiting 5 minutes.
type job struct{ j Job }

func mk(id string) *job {
	return &job{Job{ID: id, Team: "nlp", Queue: "default", Priority: "medium", Burst: broker.BurstAllowed, GPUs: 1, Nodes: 1,
		Timeout: 2 * time.Hour, WaitingSince: now.Add(-5 * time.Minute)}}
}
func (b *job) gpus(n int) *job                 { b.j.GPUs = n; return b }
func (b *job) waited(d time.Duration) *job     { b.j.WaitingSince = now.Add(-d); return b }
func (b *job) burst(p broker.BurstPolicy) *job { b.j.Burst = p; return b }
func (b *job) preemptible() *job               { b.j.Preemptible = true; return b }
func (b *job) model(m string) *job             { b.j.GPUModel = m; return b }
func (b *job) team(t string) *job              { b.j.Team = t; return b }
func (b *job) obj() Job                        { return b.j }
func (b *job) nodes(n int) *job                { b.j.Nodes = n; return b }

func input(alloc int, jobs ...Job) *Input {
	return &Input{Now: now, Policy: DefaultPolicy(), OnPremGPUs: 100, OnPremAllocated: alloc, Pending: jobs,
		Offers: catalog, Currency: "USD",
		Budgets: map[string]Budget{broker.GlobalScope: {Limit: usd("100000")}}}
}

func launched(d Decision) map[string][]string {
	out := map[string][]string{}
	for _, l := range d.Launches {
		out[l.Offer.Key()] = append(out[l.Offer.Key()], l.Jobs...)
	}
	return out
}

func TestTrigger(t *testing.T) {
	cases := []struct {
		name   string
		alloc  int
		active bool
		job    Job
		launch bool
		code   string
	}{
		{"at the threshold, past the minimum wait: bursts", 80, false, mk("a").obj(), true, ""},
		{"below the threshold: stays home", 79, false, mk("a").obj(), false, CodeBelowThreshold},
		{"below the threshold but within hysteresis while active: bursts", 75, true, mk("a").obj(), true, ""},
		{"below threshold minus hysteresis while active: stops", 69, true, mk("a").obj(), false, CodeBelowThreshold},
		{"not yet past the minimum wait: waits", 95, false, mk("a").waited(time.Minute).obj(), false, CodeMinWait},
		{"burst: prefer goes out at once, below threshold too", 10, false, mk("a").waited(time.Second).burst(broker.BurstPrefer).obj(), true, ""},
		{"burst: never stays home", 100, false, mk("a").burst(broker.BurstNever).obj(), false, ""},
		{"gang jobs burst too", 100, false, mk("a").gpus(8).nodes(2).obj(), true, ""},
		{"gang jobs wait their minimum too", 100, false, mk("a").gpus(8).nodes(2).waited(time.Minute).obj(), false, CodeMinWait},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := input(tc.alloc, tc.job)
			in.Active = tc.active
			d := Decide(in)
			if got := len(d.Launches) > 0; got != tc.launch {
				t.Fatalf("launched=%v, want %v; reasons %v", got, tc.launch, d.Reasons)
			}
			if r := d.Reasons[tc.job.ID]; r.Code != tc.code {
				t.Fatalf("reason %+v, want code %q", r, tc.code)
			}
		})
	}
}

func TestHysteresisState(t *testing.T) {
	in := input(85)
	if d := Decide(in); !d.Active {
		t.Fatal("85% should activate")
	}
	in = input(75)
	in.Active = true
	if d := Decide(in); !d.Active {
		t.Fatal("75% keeps an active controller active")
	}
	in = input(65)
	in.Active = true
	if d := Decide(in); d.Active {
		t.Fatal("65% deactivates")
	}
	in = input(75)
	if d := Decide(in); d.Active {
		t.Fatal("75% does not activate an idle controller")
	}
}

func TestWaitTargetSkipsMinimumWait(t *testing.T) {
	j := mk("a").waited(30 * time.Second).obj()
	est := now.Add(3 * time.Hour)
	j.EstimatedStart = &est
	in := input(90, j)
	in.Policy.Queues = map[string]QueuePolicy{"default": {WaitTarget: time.Hour}}
	if d := Decide(in); len(d.Launches) != 1 {
		t.Fatalf("a job projected to miss its queue's wait target should burst at once: %v", d.Reasons)
	}
}

func TestPerJobMinWait(t *testing.T) {
	long := mk("long").waited(10 * time.Minute).obj()
	long.MinWait = time.Hour
	short := mk("short").waited(30 * time.Second).team("vision").obj()
	short.MinWait = 10 * time.Second
	plain := mk("plain").waited(time.Minute).team("infra").obj()
	d := Decide(input(90, long, short, plain))
	if got := launched(d); len(got) != 1 || len(got["gcp/us-east-1//a3-highgpu-1g/on-demand"]) != 1 || got["gcp/us-east-1//a3-highgpu-1g/on-demand"][0] != "short" {
		t.Fatalf("only the job past its own 10s minimum should go: launches %v, reasons %v", got, d.Reasons)
	}
	if r := d.Reasons["long"]; r.Code != CodeMinWait || !strings.Contains(r.Message, "of the 1h minimum") {
		t.Fatalf("a job's own minimum wait replaces the policy's: %+v", r)
	}
	if r := d.Reasons["plain"]; r.Code != CodeMinWait || !strings.Contains(r.Message, "of the 2m minimum") {
		t.Fatalf("a job without its own minimum keeps the policy's: %+v", r)
	}
}

func TestWaitPerGPUHour(t *testing.T) {
	// 1 minute per declared GPU-hour: the small, short job waits 30s, the
	// 8-GPU, 4-hour one 32 minutes; both have waited 5 minutes.
	small := mk("small").team("a").obj()
	small.Timeout = 30 * time.Minute
	large := mk("large").gpus(8).team("b").obj()
	large.Timeout = 4 * time.Hour
	pinned := mk("pinned").gpus(8).team("c").obj()
	pinned.Queue = "inference"
	in := input(90, small, large, pinned)
	in.Policy.WaitPerGPUHour = time.Minute
	in.Policy.Queues = map[string]QueuePolicy{"inference": {MinWait: time.Minute}}
	for j, want := range map[Job]time.Duration{small: 30 * time.Second, large: 32 * time.Minute, pinned: time.Minute} {
		if got := in.Policy.MinWaitFor(j); got != want {
			t.Errorf("%s: minimum wait %v, want %v", j.ID, got, want)
		}
	}
	d := Decide(in)
	var went []string
	for _, l := range d.Launches {
		went = append(went, l.Jobs...)
	}
	slices.Sort(went)
	if diff := cmp.Diff([]string{"pinned", "small"}, went); diff != "" {
		t.Fatalf("jobs past their own minimum should go (-want +got):\n%s", diff)
	}
	if r := d.Reasons["large"]; r.Code != CodeMinWait || !strings.Contains(r.Message, "of the 32m minimum") {
		t.Fatalf("the 8-GPU, 4-hour job waits 32 minutes: %+v", r)
	}

	// maxWait caps what waitPerGPUHour gives: the large job waits 4
	// minutes, has waited 5, and goes; the small one keeps its 30s, and a
	// queue's own minWait is no per-GPU-hour wait and is not capped.
	in.Policy.MaxWait = 4 * time.Minute
	in.Policy.Queues = map[string]QueuePolicy{"inference": {MinWait: time.Hour}}
	for j, want := range map[Job]time.Duration{small: 30 * time.Second, large: 4 * time.Minute, pinned: time.Hour} {
		if got := in.Policy.MinWaitFor(j); got != want {
			t.Errorf("with maxWait 4m, %s: minimum wait %v, want %v", j.ID, got, want)
		}
	}
	went = nil
	for _, l := range Decide(in).Launches {
		went = append(went, l.Jobs...)
	}
	slices.Sort(went)
	if diff := cmp.Diff([]string{"large", "small"}, went); diff != "" {
		t.Fatalf("with maxWait 4m (-want +got):\n%s", diff)
	}

	// maxWaitMultiNode caps a gang's wait alone: 2 × 8 GPUs for 4 hours
	// would wait 64 minutes, at most 10; the single-node job keeps maxWait.
	gang := large
	gang.ID, gang.Nodes = "gang", 2
	in.Policy.MaxWait, in.Policy.MaxWaitMultiNode = 0, 10*time.Minute
	for j, want := range map[Job]time.Duration{large: 32 * time.Minute, gang: 10 * time.Minute} {
		if got := in.Policy.MinWaitFor(j); got != want {
			t.Errorf("with maxWaitMultiNode 10m, %s: minimum wait %v, want %v", j.ID, got, want)
		}
	}
	in.Policy.MaxWait = 20 * time.Minute
	for j, want := range map[Job]time.Duration{large: 20 * time.Minute, gang: 10 * time.Minute} {
		if got := in.Policy.MinWaitFor(j); got != want {
			t.Errorf("with maxWait 20m and maxWaitMultiNode 10m, %s: minimum wait %v, want %v", j.ID, got, want)
		}
	}
}

func TestOfferChoice(t *testing.T) {
	cases := []struct {
		name string
		jobs []Job
		want map[string][]string
	}{
		{"one 1-GPU job: the cheapest small machine",
			[]Job{mk("a").obj()},
			map[string][]string{"gcp/us-east-1//a3-highgpu-1g/on-demand": {"a"}}},
		{"eight 1-GPU jobs of a team: one 8-GPU machine, cheaper per GPU-hour",
			[]Job{mk("a").obj(), mk("b").obj(), mk("c").obj(), mk("d").obj(), mk("e").obj(), mk("f").obj(), mk("g").obj(), mk("h").obj()},
			map[string][]string{"gcp/us-east-1//a3-highgpu-8g/on-demand": {"a", "b", "c", "d", "e", "f", "g", "h"}}},
		{"a preemptible 8-GPU job: spot",
			[]Job{mk("a").gpus(8).preemptible().obj()},
			map[string][]string{"aws/us-east-1//p5.48xlarge/spot": {"a"}}},
		{"a non-preemptible 8-GPU job never goes on spot",
			[]Job{mk("a").gpus(8).obj()},
			map[string][]string{"gcp/us-east-1//a3-highgpu-8g/on-demand": {"a"}}},
		{"two teams do not share a machine",
			[]Job{mk("a").obj(), mk("b").team("vision").obj()},
			map[string][]string{"gcp/us-east-1//a3-highgpu-1g/on-demand": {"a", "b"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(input(90, tc.jobs...))
			if diff := cmp.Diff(tc.want, launched(d)); diff != "" {
				t.Fatalf("launches (-want +got):\n%s\nreasons %v", diff, d.Reasons)
			}
		})
	}
}

func TestLeasedCapacityFirst(t *testing.T) {
	in := input(90, mk("a").obj())
	lease := offer("pool", "dgx-01", 8, "30.00", false)
	lease.Prepaid = true
	in.Offers = append(in.Offers, lease)
	d := Decide(in)
	if len(d.Launches) != 1 || !d.Launches[0].Offer.Prepaid {
		t.Fatalf("launches %+v", d.Launches)
	}
	if len(d.Launches[0].Fallbacks) == 0 {
		t.Fatal("no fallbacks for capacity errors")
	}
}

func TestFallbacksInPriceOrder(t *testing.T) {
	d := Decide(input(90, mk("a").gpus(8).obj()))
	var keys []string
	for _, o := range d.Launches[0].Fallbacks {
		keys = append(keys, o.Key())
	}
	want := []string{"aws/us-east-1//p5.48xlarge/on-demand"} // spot excluded: not preemptible; 1-GPU excluded: too small
	if diff := cmp.Diff(want, keys); diff != "" {
		t.Fatalf("fallbacks (-want +got):\n%s", diff)
	}
}

func TestNoOfferFitsModel(t *testing.T) {
	d := Decide(input(90, mk("a").model("H200").obj()))
	if r := d.Reasons["a"]; r.Code != CodeNoOffer || !strings.Contains(r.Message, "gpuModel=H200") {
		t.Fatalf("reason %+v", r)
	}
}

func TestBudgetBlocks(t *testing.T) {
	in := input(90, mk("a").gpus(8).obj())
	in.Budgets["nlp"] = Budget{Limit: usd("5000"), Committed: usd("4980")}
	d := Decide(in)
	r := d.Reasons["a"]
	if len(d.Launches) != 0 || r.Code != CodeBudget || !strings.Contains(r.Message, "budget nlp 4,980.00/5,000.00 USD this month") {
		t.Fatalf("launches %v reason %+v", d.Launches, r)
	}
	in = input(90, mk("a").obj())
	delete(in.Budgets, broker.GlobalScope)
	if d := Decide(in); d.Reasons["a"].Code != CodeBudget {
		t.Fatalf("without a global budget: %+v", d.Reasons["a"])
	}
}

func TestBudgetSharedWithinOneDecision(t *testing.T) {
	// Each 1-GPU launch projects 13 USD/h × 2h = 26 USD; 60 USD fits two.
	in := input(90, mk("a").obj(), mk("b").team("t2").obj(), mk("c").team("t3").obj())
	in.Budgets[broker.GlobalScope] = Budget{Limit: usd("60")}
	d := Decide(in)
	if len(d.Launches) != 2 || d.Reasons["c"].Code != CodeBudget {
		t.Fatalf("launches %d, reasons %v", len(d.Launches), d.Reasons)
	}
	if d.Launches[0].ProjectedCost != usd("26") {
		t.Fatalf("projected cost %s", d.Launches[0].ProjectedCost)
	}
}

func TestInFlightCap(t *testing.T) {
	in := input(90, mk("a").obj())
	in.Policy.MaxInFlight = 1
	in.Machines = []Machine{{ID: "m1", Provider: "aws", Team: "other", State: broker.MachineProvisioning, Offer: catalog[0]}}
	if d := Decide(in); d.Reasons["a"].Code != CodeCapped {
		t.Fatalf("reason %+v", d.Reasons["a"])
	}
}

func TestBindToMachineWithRoom(t *testing.T) {
	in := input(90, mk("a").obj())
	in.Machines = []Machine{{ID: "m1", Provider: "gcp", Team: "nlp", State: broker.MachineBootstrapping, Offer: catalog[3], Jobs: []string{"x"}, GPUsUsed: 4}}
	d := Decide(in)
	if len(d.Launches) != 0 || len(d.Binds) != 1 || d.Binds[0] != (Bind{Job: "a", Machine: "m1"}) {
		t.Fatalf("binds %v launches %v", d.Binds, d.Launches)
	}
	bound := mk("x").obj()
	bound.Machine = "m1"
	in = input(90, bound)
	in.Machines = []Machine{{ID: "m1", Provider: "gcp", Team: "nlp", State: broker.MachineBootstrapping, Offer: catalog[3], ReadyGPUs: 2}}
	if r := Decide(in).Reasons["x"]; r.Code != CodeInProgress || !strings.Contains(r.Message, "bootstrapping (2/8 GPUs ready)") {
		t.Fatalf("in-progress reason %+v", r)
	}
}

func TestScaleDown(t *testing.T) {
	in := input(50)
	in.Machines = []Machine{
		{ID: "idle", State: broker.MachineReady, Offer: catalog[0], LaunchedAt: now.Add(-time.Hour), IdleSince: now.Add(-11 * time.Minute)},
		{ID: "resting", State: broker.MachineReady, Offer: catalog[0], LaunchedAt: now.Add(-time.Hour), IdleSince: now.Add(-9 * time.Minute)},
		{ID: "busy", State: broker.MachineReady, Offer: catalog[0], LaunchedAt: now.Add(-2 * time.Hour), Jobs: []string{"j"}},
		{ID: "old", State: broker.MachineReady, Offer: catalog[0], LaunchedAt: now.Add(-25 * time.Hour), Jobs: []string{"k"}},
	}
	d := Decide(in)
	want := []Stop{
		{Machine: "idle", Reason: "idle", Detail: "no job for 11m (idle TTL 10m)"},
		{Machine: "old", Reason: "max_lifetime", Detail: "reached the 1d maximum lifetime"},
	}
	if diff := cmp.Diff(want, d.Stops); diff != "" {
		t.Fatalf("stops (-want +got):\n%s", diff)
	}
}

func TestMoney(t *testing.T) {
	for in, want := range map[string]string{"4980": "4,980.00", "1234567.891": "1,234,567.89", "5": "5.00", "-1000": "-1,000.00"} {
		if got := Money(usd(in)); got != want {
			t.Errorf("Money(%s) = %s, want %s", in, got, want)
		}
	}
}

// TestGangLaunch: a gang of N nodes gets N machines of one offer, each
// fitting one member (the cheapest per GPU-hour that fits a member, not
// the whole gang), all or none, its budget charge N × the projected cost;
// the fallbacks fit a member too.
func TestGangLaunch(t *testing.T) {
	g := mk("g").gpus(8).nodes(3).obj()
	d := Decide(input(100, g))
	if len(d.Launches) != 1 {
		t.Fatalf("launches %+v, reasons %v", d.Launches, d.Reasons)
	}
	l := d.Launches[0]
	if l.Nodes != 3 || l.GPUs != 8 || l.Offer.InstanceType != "a3-highgpu-8g" || !slices.Equal(l.Jobs, []string{"g"}) {
		t.Fatalf("launch %d × %s for %v (%d GPUs each), want 3 × a3-highgpu-8g for [g] (8)", l.Nodes, l.Offer.InstanceType, l.Jobs, l.GPUs)
	}
	if want := ProjectedCost(l.Offer, g.Timeout, DefaultPolicy().MaxLifetime) * 3; l.ProjectedCost != want {
		t.Fatalf("projected %s, want 3 machines' %s", Money(l.ProjectedCost), Money(want))
	}
	for _, f := range l.Fallbacks {
		if f.GPUs < 8 || f.Spot {
			t.Fatalf("fallback %s does not fit a member", f.Key())
		}
	}
	// 2 hours × 88 × 3 = 528: a budget with 500 left takes none of them.
	in := input(100, g)
	in.Budgets[broker.GlobalScope] = Budget{Limit: usd("500")}
	d = Decide(in)
	if len(d.Launches) != 0 || d.Reasons["g"].Code != CodeBudget {
		t.Fatalf("over budget for the whole gang: launches %+v, reason %+v", d.Launches, d.Reasons["g"])
	}
	// The gang's charge counts against the next job's budget.
	in = input(100, g, mk("x").waited(4*time.Minute).obj())
	in.Budgets[broker.GlobalScope] = Budget{Limit: usd("540")}
	d = Decide(in)
	if len(d.Launches) != 1 || d.Reasons["x"].Code != CodeBudget {
		t.Fatalf("the gang's 528 leaves 12 for x: launches %+v, reasons %v", d.Launches, d.Reasons)
	}
}

// TestGangCapsAndPacking: a gang's machines take nothing else, the caps
// count all of them, and a gang bigger than a cap starts only alone.
func TestGangCapsAndPacking(t *testing.T) {
	g := mk("g").gpus(4).nodes(2).obj()
	x := mk("x").waited(4 * time.Minute).gpus(1).obj()
	d := Decide(input(100, g, x))
	if len(d.Launches) != 2 {
		t.Fatalf("want a group for g and a machine for x: %+v", d.Launches)
	}
	for _, l := range d.Launches {
		if slices.Contains(l.Jobs, "g") && len(l.Jobs) != 1 {
			t.Fatalf("a job packed onto the gang's machines: %v", l.Jobs)
		}
	}
	// Machines starting count: 7 of 8 in flight leave no room for 2.
	in := input(100, g)
	for i := range 7 {
		in.Machines = append(in.Machines, Machine{ID: "m" + string(rune('a'+i)), Provider: "aws", Offer: catalog[0], State: broker.MachineProvisioning, Team: "other"})
	}
	if d := Decide(in); len(d.Launches) != 0 || d.Reasons["g"].Code != CodeCapped {
		t.Fatalf("7 in flight, cap 8, gang of 2: launches %+v, reason %+v", d.Launches, d.Reasons["g"])
	}
	// Alone, a gang larger than maxInFlight still goes.
	big := mk("big").gpus(1).nodes(12).obj()
	if d := Decide(input(100, big)); len(d.Launches) != 1 || d.Launches[0].Nodes != 12 {
		t.Fatalf("a 12-node gang with nothing starting: launches %+v, reasons %v", d.Launches, d.Reasons)
	}
	// A ready machine of a group takes no other job.
	in = input(100, x)
	in.Machines = []Machine{{ID: "ga", Provider: "gcp", Offer: catalog[3], State: broker.MachineReady, Team: "nlp", Group: "ga"}}
	if d := Decide(in); len(d.Binds) != 0 {
		t.Fatalf("x bound to a gang's machine: %+v", d.Binds)
	}
}

// TestGangGroupScalesDownTogether: when one machine of a group stops, the
// others stop with it.
func TestGangGroupScalesDownTogether(t *testing.T) {
	in := input(0)
	idle := now.Add(-time.Hour)
	in.Machines = []Machine{
		{ID: "ga", Provider: "gcp", Offer: catalog[3], State: broker.MachineReady, Team: "nlp", Group: "ga", IdleSince: idle},
		{ID: "gb", Provider: "gcp", Offer: catalog[3], State: broker.MachineReady, Team: "nlp", Group: "ga", IdleSince: now.Add(-time.Minute)},
		{ID: "solo", Provider: "gcp", Offer: catalog[3], State: broker.MachineReady, Team: "nlp", IdleSince: now.Add(-time.Minute)},
	}
	d := Decide(in)
	var got []string
	for _, s := range d.Stops {
		got = append(got, s.Machine+":"+s.Reason)
	}
	if !slices.Equal(got, []string{"ga:idle", "gb:idle"}) {
		t.Fatalf("stops %v, want ga and gb idle (the group together), solo kept", got)
	}
}
