package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/onprem/agentapi"
	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/bootstrap"
	"github.com/spillway-dev/spillway/providers/fake"
)

func price(s string) billing.Amount {
	a, err := billing.ParseAmount(s)
	if err != nil {
		panic(err)
	}
	return a
}

var testOffers = []providers.Offer{
	{Region: "r1", InstanceType: "big-ondemand", GPUModel: "H100", GPUs: 8, GPUMemoryBytes: 80 << 30, PricePerHour: price("80.00"), Currency: "USD", Available: true},
	{Region: "r1", InstanceType: "big-spot", GPUModel: "H100", GPUs: 8, GPUMemoryBytes: 80 << 30, Spot: true, PricePerHour: price("30.00"), Currency: "USD", Available: true},
	{Region: "r1", InstanceType: "small", GPUModel: "H100", GPUs: 1, GPUMemoryBytes: 80 << 30, PricePerHour: price("12.00"), Currency: "USD", Available: true},
	{Region: "r1", InstanceType: "small-b", GPUModel: "H100", GPUs: 1, GPUMemoryBytes: 80 << 30, PricePerHour: price("14.00"), Currency: "USD", Available: true},
}

// burstRig is a broker with one owned 8-GPU node, a fake cloud and a fake
// bootstrap whose "machines" register as fake agents with their own token.
type burstRig struct {
	*harness
	cloud    *fake.Provider
	onprem   *fakeAgent
	mu       sync.Mutex
	machines map[string]*fakeAgent
	// bootFail, when set, is the error the next bootstrap returns;
	// bootHang makes the next bootstrap hang until the broker dies.
	bootFail error
	bootHang bool
	boots    int
	// lastCA is the broker CA the last bootstrap handed the machine.
	lastCA string
	// bootNotices are the provider notices the next machine's agent
	// reports from its first heartbeat (reclaim_test.go).
	bootNotices []agentapi.Notice
}

// newBurstRig's cloud offers testOffers, or offers when given.
func newBurstRig(t *testing.T, offers ...providers.Offer) *burstRig {
	t.Helper()
	cfg := testConfig(t)
	cfg.Burst.MinWait = broker.Duration(2 * time.Minute)
	cfg.Burst.IdleTTL = broker.Duration(10 * time.Minute)
	cfg.Burst.MaxLifetime = broker.Duration(24 * time.Hour)
	cfg.Burst.ReconcileEvery = broker.Duration(time.Minute)
	cfg.Burst.OrphanGrace = broker.Duration(2 * time.Minute)
	r := &burstRig{machines: map[string]*fakeAgent{}}
	if offers == nil {
		offers = testOffers
	}
	r.cloud = fake.New("cloud", offers, nil)
	r.cloud.Boot = func(ctx context.Context, inst providers.Instance, req providers.CreateRequest) (fake.Machine, error) {
		return fake.Machine{SSHHost: "127.0.0.1:22", SSHUser: "test"}, nil
	}
	h := &harness{t: t, clock: clock.NewFake(t0), path: filepath.Join(cfg.DataDir, "spillway.db")}
	h.opts = Options{Providers: []providers.Provider{r.cloud}, Bootstrap: r.bootstrap}
	h.open(cfg)
	t.Cleanup(func() {
		h.cancel()
		h.http.Close()
		h.store.Close()
	})
	r.harness = h
	r.onprem = h.agent("onprem-1", 8)
	r.setBudget(broker.GlobalScope, "10000")
	return r
}

func (r *burstRig) setBudget(scope, limit string) {
	r.t.Helper()
	if code := r.do("PUT", "/v1/budgets/"+scope, tokAdmin, api.BudgetRequest{Limit: limit}, nil); code != http.StatusOK {
		r.t.Fatalf("set budget %s: %d", scope, code)
	}
}

// bootstrap stands in for SSH: the "machine" registers as an agent with
// the machine's own token and as many cards as its offer.
func (r *burstRig) bootstrap(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider, agent bootstrap.AgentConfig, registered func(context.Context) error) (*bootstrap.Transcript, error) {
	r.mu.Lock()
	r.boots++
	r.lastCA = agent.CA
	fail, hang := r.bootFail, r.bootHang
	r.bootFail, r.bootHang = nil, false
	r.mu.Unlock()
	if hang {
		unpark := r.srv.park() // an unreachable machine: a wait, not work
		<-ctx.Done()
		unpark()
		return nil, ctx.Err()
	}
	tr := &bootstrap.Transcript{Addr: rec.SSHHost, User: rec.SSHUser, StartedAt: time.Now()}
	if fail != nil {
		tr.Error = fail.Error()
		return tr, fail
	}
	a := &fakeAgent{h: r.harness, name: agent.Name, jobs: map[agentapi.JobRef]*agentapi.JobReport{}, gpus: rec.Offer.GPUs, token: agent.Token}
	r.mu.Lock()
	a.notices, r.bootNotices = r.bootNotices, nil
	r.mu.Unlock()
	if err := a.tryRegister(rec.Offer.GPUs); err != nil {
		return tr, err
	}
	sum := sha256.Sum256([]byte(agent.Token))
	a.stale = func() bool { return r.rec(agent.Name).TokenSHA256 != hex.EncodeToString(sum[:]) }
	r.mu.Lock()
	r.machines[agent.Name] = a
	r.mu.Unlock()
	tr.Steps = append(tr.Steps, bootstrap.Step{Name: "start agent"})
	return tr, registered(ctx)
}

func (r *burstRig) machine(id string) *fakeAgent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.machines[id]
}

// step advances the clock one second: every agent syncs, a scheduling
// cycle and a burst cycle run.
func (r *burstRig) step() {
	r.t.Helper()
	r.clock.Step(time.Second)
	r.onprem.sync()
	r.mu.Lock()
	ms := make([]*fakeAgent, 0, len(r.machines))
	for _, a := range r.machines {
		ms = append(ms, a)
	}
	r.mu.Unlock()
	for _, a := range ms {
		if st := broker.MachineState(r.rec(a.name).State); !st.Ended() && st != broker.MachineTerminating {
			a.sync()
		}
	}
	r.cycle()
	if err := r.srv.fleet.BurstCycle(r.ctx); err != nil {
		r.t.Fatal(err)
	}
}

func (r *burstRig) run(d time.Duration) {
	r.t.Helper()
	for ; d > 0; d -= time.Second {
		r.step()
	}
}

// until steps until cond holds (at most max steps).
func (r *burstRig) until(what string, max int, cond func() bool) {
	r.t.Helper()
	for i := 0; i < max; i++ {
		if cond() {
			return
		}
		r.step()
		<-r.srv.workersSettled() // the step's workers are done or waiting
	}
	r.t.Fatalf("%s: not reached in %d steps", what, max)
}

func (r *burstRig) rec(id string) broker.InstanceRecord {
	r.srv.lock()
	defer r.srv.mu.Unlock()
	return *r.srv.fleet.RecordLocked(id)
}

func (r *burstRig) records() []broker.InstanceRecord {
	r.srv.lock()
	defer r.srv.mu.Unlock()
	var out []broker.InstanceRecord
	for _, rec := range r.srv.fleet.RecordsLocked() {
		out = append(out, *rec)
	}
	return out
}

// fill occupies the on-prem node completely with one long job.
func (r *burstRig) fill() *broker.Job {
	j := r.submit(tokBob, `{"resources": {"gpus": 8}, "timeout": "24h", "command": ["sleep", "1d"]}`)
	r.cycle()
	r.onprem.sync()
	r.onprem.sync()
	return j
}

func TestBurstWaitsThenLaunchesAndRuns(t *testing.T) {
	r := newBurstRig(t)
	r.fill()
	j := r.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "2h", "command": ["train"]}`)
	r.run(time.Minute)
	got := r.job(j.ID)
	if got.State != broker.StatePending || got.Pending.Code != burst.CodeMinWait || len(r.cloud.CreateCalls) != 0 {
		t.Fatalf("before the minimum wait: %s %+v, %d creates", got.State, got.Pending, len(r.cloud.CreateCalls))
	}
	r.until("the job runs on a burst machine", 200, func() bool { return r.job(j.ID).State == broker.StateRunning })
	got = r.job(j.ID)
	recs := r.records()
	if len(recs) != 1 || recs[0].Offer.InstanceType != "small" || recs[0].State != broker.MachineReady {
		t.Fatalf("records %+v", recs)
	}
	if got.Placements[0].Node != recs[0].ID {
		t.Fatalf("job placed on %s, machine is %s", got.Placements[0].Node, recs[0].ID)
	}
	var hist []string
	for _, h := range got.History {
		hist = append(hist, string(h.To))
	}
	if !strings.Contains(strings.Join(hist, ","), "pending,provisioning,starting,running") {
		t.Fatalf("history %v", hist)
	}
	var v api.InstanceView
	if code := r.do("GET", "/v1/instances/"+recs[0].ID, tokAdmin, nil, &v); code != 200 || len(v.Bootstrap) == 0 {
		t.Fatalf("describe: %d %s", code, v.Bootstrap)
	}
}

func TestBurstBelowThresholdStaysHome(t *testing.T) {
	r := newBurstRig(t)
	j := r.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "2h", "command": ["train"]}`)
	r.run(5 * time.Minute)
	if got := r.job(j.ID); got.State != broker.StateRunning || got.Placements[0].Node != "onprem-1" || len(r.cloud.CreateCalls) != 0 {
		t.Fatalf("job %s on %v, creates %d", got.State, got.Placements, len(r.cloud.CreateCalls))
	}
}

func TestBurstFallsBackOnCapacityError(t *testing.T) {
	r := newBurstRig(t)
	r.fill()
	r.cloud.NextCreateErr = providers.NewError(providers.ErrInsufficientCapacity, "cloud", "create", "InsufficientInstanceCapacity", nil)
	j := r.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "2h", "command": ["train"]}`)
	r.until("running", 300, func() bool { return r.job(j.ID).State == broker.StateRunning })
	rec := r.records()[0]
	if rec.Offer.InstanceType != "small-b" || len(r.cloud.CreateCalls) != 2 {
		t.Fatalf("offer %s after %d creates", rec.Offer.InstanceType, len(r.cloud.CreateCalls))
	}
	if rec.History[1].Reason != "next_offer" {
		t.Fatalf("history %+v", rec.History)
	}
}

func TestBurstSpotOnlyForPreemptible(t *testing.T) {
	r := newBurstRig(t)
	r.fill()
	safe := r.submit(tokAlice, `{"resources": {"gpus": 8}, "timeout": "2h", "command": ["a"]}`)
	cheap := r.submit(tokBob, `{"resources": {"gpus": 8}, "timeout": "2h", "preemptible": true, "command": ["b"]}`)
	r.until("both run", 300, func() bool {
		return r.job(safe.ID).State == broker.StateRunning && r.job(cheap.ID).State == broker.StateRunning
	})
	for _, rec := range r.records() {
		spot := rec.Offer.Spot
		if rec.Jobs[0] == safe.ID && spot {
			t.Fatal("a non-preemptible job went to spot")
		}
		if rec.Jobs[0] == cheap.ID && !spot {
			t.Fatal("the preemptible job did not take the cheaper spot offer")
		}
	}
}

func TestBurstIdleScaleDownAndBilling(t *testing.T) {
	r := newBurstRig(t)
	r.fill()
	r.setBudget("nlp", "500")
	j := r.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "2h", "command": ["train"]}`)
	r.until("running", 300, func() bool { return r.job(j.ID).State == broker.StateRunning })
	id := r.records()[0].ID
	r.run(20 * time.Minute)
	r.machine(id).exit(j.ID, 0, "")
	r.step()
	if r.job(j.ID).State != broker.StateSucceeded {
		t.Fatal("job did not end")
	}
	r.run(9 * time.Minute)
	if st := r.rec(id).State; st != broker.MachineReady {
		t.Fatalf("scaled down before the idle TTL: %s", st)
	}
	r.until("terminated", 200, func() bool { return r.rec(id).State == broker.MachineTerminated })
	if len(r.cloud.DeleteCalls) == 0 {
		t.Fatal("no delete")
	}
	r.run(2 * time.Minute) // final slices
	// The scale-down is logged as an ended machine at INFO, never as a
	// WARN "node lost" (issue #21).
	if logs := r.logs.String(); !strings.Contains(logs, `level=INFO msg="burst machine ended" record=`+id) || strings.Contains(logs, `msg="node lost"`) {
		t.Errorf("the scale-down's log:\n%s", logs)
	}
	var usage, overhead int64
	var cost billing.Amount
	broker.Ledger{Store: r.store}.Scan(context.Background(), time.Time{}, time.Time{}, func(e billing.Entry) error {
		if e.Pool.InstanceID != id {
			return nil
		}
		cost += e.Cost
		if e.Kind == billing.KindOverhead {
			overhead += e.GPUMillis
		} else {
			usage += e.GPUMillis
		}
		return nil
	})
	if usage < 19*60_000 || overhead < 9*60_000 {
		t.Fatalf("cloud usage %d ms, overhead %d ms", usage, overhead)
	}
	var budgets struct {
		Budgets []api.BudgetView `json:"budgets"`
	}
	r.do("GET", "/v1/budgets", tokAdmin, nil, &budgets)
	for _, b := range budgets.Budgets {
		if b.Scope == broker.GlobalScope && (b.Spent != cost || b.Reserved != 0) {
			t.Fatalf("global budget %+v, ledger cost %s", b, cost)
		}
	}
}

func TestBurstMaxLifetime(t *testing.T) {
	r := newBurstRig(t)
	r.srv.cfg().Burst.MaxLifetime = broker.Duration(30 * time.Minute)
	r.fill()
	j := r.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "10h", "preemptible": true, "command": ["train"]}`)
	r.until("running", 300, func() bool { return r.job(j.ID).State == broker.StateRunning })
	id := r.records()[0].ID
	r.until("draining", 2000, func() bool { return r.rec(id).State == broker.MachineDraining })
	got := r.job(j.ID)
	if got.Stop == nil || got.Stop.Reason != "preempted" {
		t.Fatalf("job stop %+v", got.Stop)
	}
	r.machine(id).exit(j.ID, 143, "SIGTERM")
	r.until("terminated", 100, func() bool { return r.rec(id).State == broker.MachineTerminated })
	if st := r.job(j.ID).State; st.Terminal() {
		t.Fatalf("job ended (%s) instead of returning to the queue", st)
	}
}

func TestBurstBudgetBlocks(t *testing.T) {
	r := newBurstRig(t)
	r.fill()
	r.setBudget("nlp", "1")
	j := r.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "2h", "command": ["train"]}`)
	r.run(3 * time.Minute)
	got := r.job(j.ID)
	if got.State != broker.StatePending || len(r.cloud.CreateCalls) != 0 || !strings.Contains(got.Pending.Message, "burst blocked: budget nlp 0.00/1.00 USD this month") {
		t.Fatalf("job %s %+v", got.State, got.Pending)
	}
	var audit struct {
		Audit []broker.AuditRecord `json:"audit"`
	}
	r.do("GET", "/v1/audit", tokAdmin, nil, &audit)
	if n := len(audit.Audit); n < 2 || audit.Audit[n-1].Target != "nlp" || audit.Audit[n-1].By != "admin" || audit.Audit[n-1].Old != "unset" {
		t.Fatalf("audit %+v", audit.Audit)
	}
	if code := r.do("PUT", "/v1/budgets/nlp", tokAlice, api.BudgetRequest{Limit: "9"}, nil); code != http.StatusForbidden {
		t.Fatalf("user setting a budget: %d", code)
	}
	if code := r.do("PUT", "/v1/budgets/nlp", tokAdmin, api.BudgetRequest{Limit: "-5"}, nil); code != http.StatusBadRequest {
		t.Fatalf("negative budget: %d", code)
	}
}

func TestBurstHostKeyMismatchDeletesMachine(t *testing.T) {
	r := newBurstRig(t)
	r.fill()
	r.bootFail = providers.NewError(providers.ErrHostKeyMismatch, "cloud", "bootstrap", "", nil)
	j := r.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "2h", "command": ["train"]}`)
	r.until("a failed record", 300, func() bool {
		recs := r.records()
		return len(recs) > 0 && recs[0].State == broker.MachineFailed
	})
	rec := r.records()[0]
	if !strings.Contains(rec.Reason, "host key mismatch") || len(r.cloud.DeleteCalls) == 0 {
		t.Fatalf("record %+v, deletes %v", rec, r.cloud.DeleteCalls)
	}
	if got := r.job(j.ID); got.State != broker.StatePending && got.State != broker.StateProvisioning {
		t.Fatalf("job %s", got.State)
	}
}

// TestBurstCrashSafety kills the broker (restarts it on the same store,
// its workers cancelled) at each step of a machine's life; after the
// restart and one reconcile there is no machine without a record, every
// record is one machine or failed, and no reservation is stuck.
func TestBurstCrashSafety(t *testing.T) {
	steps := []struct {
		name  string
		crash func(r *burstRig) bool // true once the crash point is reached
	}{
		{"before create", func(r *burstRig) bool { return len(r.records()) > 0 }},
		{"after create, before the record says so", func(r *burstRig) bool { return len(r.cloud.CreateCalls) > 0 }},
		{"during bootstrap", func(r *burstRig) bool {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.boots > 0
		}},
		{"during delete", func(r *burstRig) bool { return len(r.cloud.DeleteCalls) > 0 }},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			r := newBurstRig(t)
			r.fill()
			j := r.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "2h", "command": ["train"]}`)
			if st.name == "during delete" {
				r.until("running", 300, func() bool { return r.job(j.ID).State == broker.StateRunning })
				id := r.records()[0].ID
				r.machine(id).exit(j.ID, 0, "")
				r.cloud.NextDeleteErr = fmt.Errorf("connection reset")
			}
			if st.name == "during bootstrap" {
				r.bootHang = true // the broker dies mid-bootstrap
			}
			r.until("the crash point", 2000, func() bool { return st.crash(r) })
			r.restart()
			r.srv.fleet.Resume(r.ctx)
			r.run(3 * time.Minute) // a reconcile, and the machine's life goes on
			r.srv.fleet.Reconcile(r.ctx)
			machines, _ := r.cloud.List(context.Background())
			recs := r.records()
			byID := map[string]broker.InstanceRecord{}
			for _, rec := range recs {
				byID[rec.ID] = rec
			}
			for _, m := range machines {
				rec, ok := byID[m.RecordID]
				if !ok || rec.State.Ended() {
					t.Fatalf("machine %s (record %s) has no live record", m.ID, m.RecordID)
				}
			}
			if len(recs) != 1 {
				t.Fatalf("%d records", len(recs))
			}
			creates := map[string]bool{}
			for _, c := range r.cloud.CreateCalls {
				creates[c.RecordID] = true
			}
			if len(machines) > 1 {
				t.Fatalf("%d machines for one record", len(machines))
			}
			r.store.View(context.Background(), func(tx broker.Tx) error {
				for _, rec := range recs {
					res, err := broker.GetReservation(tx, rec.ID)
					if err == nil && res.Open && rec.State.Ended() {
						t.Errorf("reservation of ended record %s still open", rec.ID)
					}
				}
				return nil
			})
		})
	}
}

// tryRegister registers a fake agent without failing the test (it runs on
// a worker goroutine).
func (a *fakeAgent) tryRegister(gpus int) error {
	raw, _ := json.Marshal(agentapi.RegisterRequest{Node: a.name, Inventory: simInventory(a.name, gpus)})
	req, _ := http.NewRequest("POST", a.h.http.URL+agentapi.PathRegister, bytes.NewReader(raw))
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("register: %d", resp.StatusCode)
	}
	var rr agentapi.RegisterResponse
	if err := json.NewDecoder(resp.Body).Decode(&rr); err != nil {
		return err
	}
	a.gen = rr.Generation
	return nil
}

var _ = config.RoleAgent

// TestPreemptToCloud: a preemptible job preempted by high-priority work
// resumes on burst capacity right after its checkpoint, without waiting
// the minimum again.
func TestPreemptToCloud(t *testing.T) {
	r := newBurstRig(t)
	low := r.submit(tokBob, `{"resources": {"gpus": 8}, "priority": "low", "preemptible": true, "timeout": "4h", "checkpoint": {"grace": "10s"}, "command": ["train"]}`)
	r.cycle()
	r.onprem.sync()
	r.onprem.sync()
	r.clock.Step(10 * time.Minute) // it has run a while; its wait is long past
	r.onprem.sync()
	high := r.submit(tokAlice, `{"resources": {"gpus": 8}, "priority": "high", "timeout": "1h", "command": ["serve"]}`)
	r.until("a stop order for the low job", 20, func() bool { return r.job(low.ID).Stop != nil })
	r.onprem.exit(low.ID, 0, "SIGTERM")
	r.onprem.sync()
	if st := r.job(low.ID).State; st != broker.StatePending {
		t.Fatalf("low job after its checkpoint: %s", st)
	}
	requeued := r.clock.Now()
	r.until("the low job runs on a burst machine", 300, func() bool { return r.job(low.ID).State == broker.StateRunning })
	got := r.job(low.ID)
	if got.Placements[0].Node == "onprem-1" {
		t.Fatal("resumed on-prem")
	}
	var bound time.Time
	for _, h := range got.History {
		if h.To == broker.StateProvisioning {
			bound = h.At
		}
	}
	if bound.Sub(requeued) >= 2*time.Minute {
		t.Fatalf("waited %s after its preemption before bursting", bound.Sub(requeued))
	}
	if r.job(high.ID).State != broker.StateRunning {
		t.Fatal("the high job is not running on-prem")
	}
}

func TestBudgetAlerts(t *testing.T) {
	got := make(chan map[string]any, 4)
	hook := newWebhook(t, got)
	r := newBurstRig(t)
	r.srv.cfg().Burst.AlertWebhook = hook
	r.fill()
	r.setBudget("nlp", "30") // one 1-GPU launch projects 24.00: 80%
	j := r.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "2h", "command": ["train"]}`)
	r.until("a launch", 300, func() bool { return r.job(j.ID).State != broker.StatePending })
	r.step()
	select {
	case a := <-got:
		if a["scope"] != "nlp" || a["level"].(float64) != 0.8 {
			t.Fatalf("alert %v", a)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no webhook for crossing 80%")
	}
	r.run(5 * time.Second)
	if n := len(got); n != 0 {
		t.Fatalf("%d repeated alerts", n)
	}
	// A restart does not raise it again: the alert was recorded.
	r.until("the alert recorded", 300, func() bool {
		found := false
		_ = r.srv.store.View(context.Background(), func(tx broker.Tx) error {
			return tx.Scan(broker.BucketMeta, "budget-alert/", broker.PrefixEnd("budget-alert/"), func(string, []byte) error {
				found = true
				return nil
			})
		})
		return found
	})
	r.restart()
	r.srv.fleet.Resume(r.ctx)
	r.run(5 * time.Second)
	if n := len(got); n != 0 {
		t.Fatalf("%d alerts repeated after a restart", n)
	}
}

// TestPreemptedOffBurstMachineIsUnbound: a job that leaves a burst machine
// for the queue is no longer bound to it, so the burst controller may send
// it out again.
func TestPreemptedOffBurstMachineIsUnbound(t *testing.T) {
	r := newBurstRig(t)
	r.srv.cfg().Burst.MaxLifetime = broker.Duration(30 * time.Minute)
	r.fill()
	j := r.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "10h", "preemptible": true, "command": ["train"]}`)
	r.until("running", 300, func() bool { return r.job(j.ID).State == broker.StateRunning })
	id := r.records()[0].ID
	r.until("draining", 2000, func() bool { return r.rec(id).State == broker.MachineDraining })
	r.machine(id).exit(j.ID, 143, "SIGTERM")
	r.step()
	got := r.job(j.ID)
	if got.Machine == id {
		t.Fatalf("requeued job still bound to the machine it left (%s)", got.State)
	}
	r.until("running again on a new machine", 600, func() bool {
		g := r.job(j.ID)
		return g.State == broker.StateRunning && g.Placements[0].Node != id
	})
}
