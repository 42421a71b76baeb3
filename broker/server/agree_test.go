package server

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/sim"
	"github.com/spillway-dev/spillway/onprem/agentapi"
	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/bootstrap"
	"github.com/spillway-dev/spillway/providers/fake"
)

// agreeBroker is the broker config the live broker and the simulator
// share: one step of virtual time is the scheduler's and the burst
// controller's interval; budget months are cut in Los Angeles.
const agreeBroker = `
scheduler: {interval: 10s}
agents: {heartbeatInterval: 10s, lostAfter: 3}
burst: {interval: 10s, minWait: 1m, idleTTL: 2m, maxLifetime: 24h, reconcileEvery: 1m, orphanGrace: 5m}
billing:
  timeZone: America/Los_Angeles
  onprem:
    rates:
      H100: [{perGPUHour: "2.50"}]
`

// agreeStep is the virtual time between two steps of the live broker.
const agreeStep = 10 * time.Second

// agreeLead is every burst machine's launch-to-ready time: the fake
// provider's machines register their agent this long after they were
// created, as the simulator's (p50 = p99 = max) do.
const agreeLead = 3 * time.Minute

// agreeOffers are the provider's offers: a one-GPU machine at 12 USD an
// hour and a dearer one. A launch reserves the price for the longest
// timeout among its jobs: 6.00 for a job declaring 30 minutes, 3.00 for
// one declaring 15; the global budget is 8.00 a month.
var agreeOffers = []providers.Offer{
	{Region: "r1", InstanceType: "small", GPUModel: "H100", GPUs: 1, GPUMemoryBytes: 80 << 30, PricePerHour: price("12.00"), Currency: "USD", Available: true},
	{Region: "r1", InstanceType: "small-b", GPUModel: "H100", GPUs: 1, GPUMemoryBytes: 80 << 30, PricePerHour: price("14.00"), Currency: "USD", Available: true},
}

const agreeBudget = "8.00"

// agreeStart is 23:40 on 30 November in Los Angeles: the trace crosses
// the budget month's end at 08:00 UTC.
var agreeStart = time.Date(2026, 12, 1, 7, 40, 0, 0, time.UTC)

// agreeJob is one job of the trace: when it is submitted (after the
// start), its GPUs and how long it runs.
type agreeJob struct {
	name string
	at   time.Duration
	gpus int
	run  time.Duration
}

// agreeTrace fills the owned node (two GPUs) for 40 minutes, so that
// one-GPU jobs wait and burst. j02's machine reserves 6.00 of November's
// 8.00; j03, past its minimum wait while that machine runs j02, is held
// back by the budget (6.00 + 3.00 > 8.00) until December begins in Los
// Angeles (08:00 UTC, 20 minutes in); then its own machine launches.
// j04 arrives when both machines are idle and is bound to one; both end
// after the idle TTL. j06 and j07 then find December's budget spent
// (5.13 + 3.00 > 8.00) and wait for the owned node, with j05: the start
// order there.
var agreeTrace = []agreeJob{
	{"j01", 0, 2, 40 * time.Minute},
	{"j02", 10 * time.Second, 1, 25 * time.Minute},
	{"j03", 2 * time.Minute, 1, 6 * time.Minute},
	{"j04", 29*time.Minute + 30*time.Second, 1, 2 * time.Minute},
	{"j05", 35 * time.Minute, 2, 3 * time.Minute},
	{"j06", 35*time.Minute + 10*time.Second, 1, 4 * time.Minute},
	{"j07", 36 * time.Minute, 1, 2 * time.Minute},
}

// agreeBoundary is when December begins in the billing zone.
var agreeBoundary = time.Date(2026, 12, 1, 0, 0, 0, 0, mustZone("America/Los_Angeles"))

func mustZone(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err)
	}
	return loc
}

// TestSimAgreesWithServer runs one trace with bursting through the live
// broker — its API, scheduler, burst controller, launch and terminate
// workers, a fake provider whose machines become ready at known virtual
// times, in-process agents, the billing meter and the budgets — on a
// fake clock, and through sim.Run, and checks that both make the same
// decisions at the same virtual instants: every start (job, time, node),
// every machine (offer, creation, launch, readiness, end, the jobs bound
// to it and each transition), the spend of each budget month, and the
// ledger's owned, cloud and overhead totals, all exactly (to the micro).
// Nothing waits on the wall clock to order events: the broker's workers
// are waited for by condition.
func TestSimAgreesWithServer(t *testing.T) {
	res := agreeSim(t)
	live := agreeLive(t)

	if got, want := agreeStarts(res.Starts, res.MachineRecords), live.starts; got != want {
		t.Errorf("starts differ\nbroker:    %s\nsimulator: %s", want, got)
	}
	if got, want := agreeMachines(res.MachineRecords, nil), live.machines; got != want {
		t.Errorf("machines differ\nbroker:\n%s\nsimulator:\n%s", want, got)
	}
	simSpent := map[string]billing.Amount{}
	for _, b := range res.Budgets {
		if b.Scope == broker.GlobalScope {
			simSpent[b.Month] = b.Spent
		}
	}
	for _, month := range []string{"2026-11", "2026-12"} {
		if got, want := simSpent[month], live.spent[month]; got != want {
			t.Errorf("global budget spent in %s: broker %s, simulator %s", month, want, got)
		}
	}
	sims := agreeTotals{owned: res.OwnedCost, cloud: res.UsageCost, overhead: res.OverheadCost}
	if sims != live.totals {
		t.Errorf("ledger totals differ: broker %s, simulator %s", live.totals, sims)
	}
	if live.totals.owned == 0 || live.totals.cloud == 0 || live.totals.overhead == 0 {
		t.Errorf("the trace does not exercise the ledger: %s", live.totals)
	}
	if bound := strings.Contains(live.machines, "jobs j02 j04\n") || strings.Contains(live.machines, "jobs j03 j04\n"); !bound || strings.Count(live.machines, "machine ") != 2 {
		t.Errorf("the trace does not exercise a bind and two launches:\n%s", live.machines)
	}
	if second := fmt.Sprintf("machine 2: cloud/r1//small/on-demand at +%s,", agreeBoundary.Sub(agreeStart)); !strings.Contains(live.machines, second) || res.BudgetBlockedJobs == 0 {
		t.Errorf("the budget did not hold j03's launch back until December (%d held back):\n%s", res.BudgetBlockedJobs, live.machines)
	}
	t.Logf("starts: %s", live.starts)
	t.Logf("machines:\n%s", live.machines)
	t.Logf("ledger: %s; budgets spent %v", live.totals, live.spent)
}

// agreeTotals are a ledger's totals.
type agreeTotals struct{ owned, cloud, overhead billing.Amount }

func (a agreeTotals) String() string {
	return fmt.Sprintf("owned %s, cloud %s, overhead %s", a.owned, a.cloud, a.overhead)
}

// agreeSim replays the trace in the simulator.
func agreeSim(t *testing.T) *sim.Result {
	t.Helper()
	var b strings.Builder
	b.WriteString("broker:\n")
	for _, line := range strings.Split(strings.TrimSpace(agreeBroker), "\n") {
		b.WriteString("  " + line + "\n")
	}
	fmt.Fprintf(&b, "nodes:\n  - {name: node, count: 1, gpus: 2, model: \"NVIDIA H100 80GB HBM3\", memory: 80Gi}\n")
	fmt.Fprintf(&b, "burst: {leadTime: {p50: %s, p99: %s, max: %s}}\n", agreeLead, agreeLead, agreeLead)
	b.WriteString("offers:\n")
	for _, o := range agreeOffers {
		fmt.Fprintf(&b, "  - {provider: cloud, region: %s, instanceType: %s, gpuModel: %s, gpus: %d, gpuMemory: 80Gi, pricePerHour: %q}\n",
			o.Region, o.InstanceType, o.GPUModel, o.GPUs, o.PricePerHour.String())
	}
	fmt.Fprintf(&b, "budgets: {global: %q}\njobs: {preemptible: []}\n", agreeBudget)
	clu, err := sim.ParseCluster([]byte(b.String()))
	if err != nil {
		t.Fatalf("cluster: %v\n%s", err, b.String())
	}
	pol, err := sim.ParsePolicy(sim.PolicySpillway, clu)
	if err != nil {
		t.Fatal(err)
	}
	tr := &sim.Trace{Location: time.UTC}
	for _, j := range agreeTrace {
		tr.Jobs = append(tr.Jobs, sim.Job{ID: j.name, Submit: agreeStart.Add(j.at), Duration: j.run, GPUs: j.gpus,
			Team: "nlp", Priority: "medium", Queue: "default"})
	}
	res, err := sim.Run(tr, clu, pol, sim.Options{RecordStarts: true, RecordMachines: true, MeterOwned: true})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// agreeResult is what the live broker did.
type agreeResult struct {
	starts, machines string
	spent            map[string]billing.Amount
	totals           agreeTotals
}

// agreeRig is the live broker for the agreement test: the harness's
// broker on a fake clock with the fake provider, the owned node's agent,
// and a bootstrap that holds each machine until its ready time.
type agreeRig struct {
	*harness
	cloud  *fake.Provider
	onprem *fakeAgent
	mu     sync.Mutex
	// boots are the machines in bootstrap, by record id; machines the
	// agents of machines that registered.
	boots    map[string]*agreeBoot
	machines map[string]*fakeAgent
	// names maps the broker's job ids to trace names; runs the trace's
	// run time by job id.
	names map[string]string
	runs  map[string]time.Duration
}

// agreeBoot is a machine whose bootstrap waits for its ready time.
type agreeBoot struct {
	at      time.Time
	release chan struct{}
}

func newAgreeRig(t *testing.T) *agreeRig {
	t.Helper()
	cfg, err := config.Parse([]byte(agreeBroker + fmt.Sprintf(`
listen: 127.0.0.1:0
dataDir: %s
auth:
  tokens:
    - {name: alice, role: user, team: nlp, token: %s}
    - {name: admin, role: operator, token: %s}
    - {name: agents, role: agent, token: %s}
`, t.TempDir(), tokAlice, tokAdmin, tokAgent)))
	if err != nil {
		t.Fatal(err)
	}
	r := &agreeRig{boots: map[string]*agreeBoot{}, machines: map[string]*fakeAgent{}, names: map[string]string{}, runs: map[string]time.Duration{}}
	r.cloud = fake.New("cloud", agreeOffers, nil)
	h := &harness{t: t, clock: clock.NewFake(agreeStart), path: filepath.Join(cfg.DataDir, "spillway.db")}
	r.cloud.Now = h.clock.Now
	r.cloud.Boot = func(ctx context.Context, inst providers.Instance, req providers.CreateRequest) (fake.Machine, error) {
		return fake.Machine{SSHHost: "127.0.0.1:22", SSHUser: "test"}, nil
	}
	h.opts = Options{Providers: []providers.Provider{r.cloud}, Bootstrap: r.bootstrap}
	h.open(cfg)
	t.Cleanup(func() {
		h.cancel()
		h.http.Close()
		h.store.Close()
	})
	r.harness = h
	r.onprem = h.agent("node-000", 2)
	if code := r.do("PUT", "/v1/budgets/"+broker.GlobalScope, tokAdmin, api.BudgetRequest{Limit: agreeBudget}, nil); code != 200 {
		t.Fatalf("set the budget: %d", code)
	}
	return r
}

// bootstrap stands in for SSH: the machine's agent registers once the
// test has moved the clock to the machine's launch time plus agreeLead.
func (r *agreeRig) bootstrap(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider, agent bootstrap.AgentConfig, registered func(context.Context) error) (*bootstrap.Transcript, error) {
	b := &agreeBoot{at: rec.LaunchedAt.Add(agreeLead), release: make(chan struct{})}
	r.mu.Lock()
	r.boots[rec.ID] = b
	r.mu.Unlock()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-b.release:
	}
	a := &fakeAgent{h: r.harness, name: agent.Name, jobs: map[agentapi.JobRef]*agentapi.JobReport{}, gpus: rec.Offer.GPUs, token: agent.Token}
	if err := a.tryRegister(rec.Offer.GPUs); err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.machines[agent.Name] = a
	r.mu.Unlock()
	return &bootstrap.Transcript{Addr: rec.SSHHost, User: rec.SSHUser}, registered(ctx)
}

// settle waits until every burst worker has either returned or is held
// in a bootstrap not yet released: until then the clock must not move,
// so that each step a worker records happens at the instant it began.
func (r *agreeRig) settle() {
	r.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		busy := ""
		r.srv.lock()
		r.mu.Lock()
		for _, rec := range r.srv.fleet.RecordsLocked() {
			if !r.srv.fleet.WorkingLocked(rec.ID) {
				continue
			}
			if b := r.boots[rec.ID]; b == nil || !isOpen(b.release) {
				busy = rec.ID
			}
		}
		r.mu.Unlock()
		r.srv.mu.Unlock()
		if busy == "" {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("the burst worker of %s is still busy after a minute", busy)
		}
		time.Sleep(time.Millisecond) // a poll of the condition, not a wait for time
	}
}

func isOpen(ch chan struct{}) bool {
	select {
	case <-ch:
		return false
	default:
		return true
	}
}

// ready releases the bootstraps due at now and waits until their
// machines are ready.
func (r *agreeRig) ready(now time.Time) {
	r.t.Helper()
	r.mu.Lock()
	var due []string
	for id, b := range r.boots {
		if !b.at.After(now) && isOpen(b.release) {
			close(b.release)
			due = append(due, id)
		}
	}
	r.mu.Unlock()
	if len(due) > 0 {
		r.settle()
	}
	r.srv.lock()
	defer r.srv.mu.Unlock()
	for _, id := range due {
		if st := r.srv.fleet.RecordLocked(id).State; st != broker.MachineReady {
			r.t.Fatalf("machine %s is %s after its bootstrap", id, st)
		}
	}
}

// agents are the owned node's agent and those of live machines.
func (r *agreeRig) agents() []*fakeAgent {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []*fakeAgent{r.onprem}
	for _, id := range slices.Sorted(mapKeys(r.machines)) {
		out = append(out, r.machines[id])
	}
	r.srv.lock()
	defer r.srv.mu.Unlock()
	return slices.DeleteFunc(out, func(a *fakeAgent) bool {
		rec := r.srv.fleet.RecordLocked(a.name)
		return rec != nil && (rec.State.Ended() || rec.State == broker.MachineTerminating)
	})
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// step runs one instant of the trace at now, in the simulator's order:
// submits, machines becoming ready, jobs ending (their agents' reports),
// a scheduling cycle (the agents then take their starts), and a burst
// decision with the workers it starts run up to where they wait.
func (r *agreeRig) step(now time.Time) {
	r.t.Helper()
	r.clock.Set(now)
	for _, j := range agreeTrace {
		if agreeStart.Add(j.at).Equal(now) {
			spec := fmt.Sprintf(`{"name": %q, "priority": "medium", "resources": {"gpus": %d}, "timeout": %q, "command": ["train"]}`,
				j.name, j.gpus, sim.DeclaredTimeout(j.run))
			got := r.submit(tokAlice, spec)
			r.names[got.ID], r.runs[got.ID] = j.name, j.run
		}
	}
	r.ready(now)
	for _, a := range r.agents() {
		for ref, rep := range a.jobs {
			if rep.State == agentapi.RunRunning && !rep.StartedAt.Add(r.runs[ref.Job]).After(now) {
				a.exit(ref.Job, 0, "")
			}
		}
		a.sync()
	}
	r.cycle()
	for _, a := range r.agents() {
		a.sync()
	}
	if err := r.srv.fleet.BurstCycle(r.ctx); err != nil {
		r.t.Fatal(err)
	}
	r.settle()
}

// done reports whether every job has ended and every machine is gone.
func (r *agreeRig) done() bool {
	r.srv.lock()
	defer r.srv.mu.Unlock()
	if r.srv.view.JobCount() > 0 || len(r.names) < len(agreeTrace) {
		return false
	}
	for _, rec := range r.srv.fleet.RecordsLocked() {
		if !rec.State.Ended() {
			return false
		}
	}
	return true
}

// agreeLive runs the trace through the live broker.
func agreeLive(t *testing.T) agreeResult {
	r := newAgreeRig(t)
	now := agreeStart
	for i := 0; !r.done(); i++ {
		if i > 1000 {
			t.Fatal("the trace did not finish in 1000 steps")
		}
		r.step(now)
		now = now.Add(agreeStep)
	}
	// Meter everything through its end.
	r.clock.Set(now.Add(time.Hour))
	r.cycle()

	var out agreeResult
	var jobs []*broker.Job
	for id := range r.names {
		jobs = append(jobs, r.job(id))
	}
	r.srv.lock()
	var rp []*broker.InstanceRecord
	for _, rec := range r.srv.fleet.RecordsLocked() {
		rp = append(rp, rec.Clone())
	}
	r.srv.mu.Unlock()
	var starts []sim.Start
	for _, j := range jobs {
		for _, h := range j.History {
			if h.To == broker.StateStarting {
				starts = append(starts, sim.Start{Job: j.Spec.Name, At: h.At, Nodes: j.Nodes()})
			}
		}
	}
	out.starts = agreeStarts(starts, rp)
	out.machines = agreeMachines(rp, r.names)

	out.spent = map[string]billing.Amount{}
	err := r.store.View(context.Background(), func(tx broker.Tx) error {
		for _, month := range []string{"2026-11", "2026-12"} {
			m, err := broker.GetBudgetMonth(tx, month, broker.GlobalScope)
			if err != nil {
				return err
			}
			if m.Reserved != 0 {
				return fmt.Errorf("%s: %s still reserved", month, m.Reserved)
			}
			out.spent[month] = m.Spent
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = broker.Ledger{Store: r.store}.Scan(context.Background(), time.Time{}, time.Time{}, func(e billing.Entry) error {
		switch {
		case e.Pool.Kind == billing.PoolOnPrem:
			out.totals.owned += e.Cost
		case e.Kind == billing.KindOverhead:
			out.totals.overhead += e.Cost
		default:
			out.totals.cloud += e.Cost
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// agreeStarts prints the starts in time order: job, offset from the
// start, and where (the owned node, or the burst machine by launch
// order).
func agreeStarts(ss []sim.Start, recs []*broker.InstanceRecord) string {
	ss = slices.Clone(ss)
	slices.SortStableFunc(ss, func(a, b sim.Start) int {
		if c := a.At.Compare(b.At); c != 0 {
			return c
		}
		return strings.Compare(a.Job, b.Job)
	})
	idx := machineIndex(recs)
	var parts []string
	for _, s := range ss {
		var where []string
		for _, n := range s.Nodes {
			if i, ok := idx[n]; ok {
				n = fmt.Sprintf("machine%d", i)
			}
			where = append(where, n)
		}
		parts = append(parts, fmt.Sprintf("%s@+%s:%s", s.Job, s.At.Sub(agreeStart), strings.Join(where, ",")))
	}
	return strings.Join(parts, " ")
}

// machineIndex numbers the machines by creation.
func machineIndex(recs []*broker.InstanceRecord) map[string]int {
	recs = slices.Clone(recs)
	slices.SortFunc(recs, func(a, b *broker.InstanceRecord) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	out := map[string]int{}
	for i, r := range recs {
		out[r.ID] = i + 1
	}
	return out
}

// agreeMachines prints each machine: its launch (offer, time, projected
// cost, jobs), its binds, its transitions and its end. names maps job
// ids to trace names (nil: the ids are the names).
func agreeMachines(recs []*broker.InstanceRecord, names map[string]string) string {
	idx := machineIndex(recs)
	recs = slices.Clone(recs)
	slices.SortFunc(recs, func(a, b *broker.InstanceRecord) int { return idx[a.ID] - idx[b.ID] })
	at := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return "+" + t.Sub(agreeStart).String()
	}
	var b strings.Builder
	for _, r := range recs {
		jobs := make([]string, 0, len(r.Jobs))
		for _, id := range r.Jobs {
			if n, ok := names[id]; ok {
				id = n
			}
			jobs = append(jobs, id)
		}
		fmt.Fprintf(&b, "machine %d: %s at +%s, projected %s, state %s, launched %s, ready %s, ended %s\n",
			idx[r.ID], r.Offer.Key(), r.CreatedAt.Sub(agreeStart), r.ProjectedCost, r.State, at(r.LaunchedAt), at(r.ReadyAt), at(r.TerminatedAt))
		fmt.Fprintf(&b, "  jobs %s\n", strings.Join(jobs, " "))
		for _, h := range r.History {
			fmt.Fprintf(&b, "  +%s %s (%s)\n", h.At.Sub(agreeStart), h.To, h.Reason)
		}
	}
	return b.String()
}
