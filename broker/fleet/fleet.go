// Package fleet is the burst controller's live side: the providers built
// from the config, the machine records in memory, the launch and
// terminate workers, reconciliation with the providers, offers, price
// tables, cool-downs and spot reclaims, budget alerts, and the burst loop
// that asks burst.Decide and carries the decision out through burstctl
// (the executor the simulator shares). It never imports broker/server:
// what it needs of the broker's state it reaches through Broker.
package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/ssh"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/adapters"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/broker/burstctl"
	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/broker/config"
	jobrt "github.com/spillway-dev/spillway/onprem/runtime"
	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/bootstrap"
	"github.com/spillway-dev/spillway/providers/sshpool"
)

// BootstrapFunc brings up the agent on a machine that is running: it gets
// the record (with SSHHost and SSHUser), the provider (for its host keys)
// and the machine's agent config (with its own token), and returns once
// the agent has registered — or why it could not. The default runs the SSH
// bootstrap; tests may replace it.
type BootstrapFunc func(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider, agent bootstrap.AgentConfig, registered func(context.Context) error) (*bootstrap.Transcript, error)

// Broker is what the fleet needs of the broker (broker/server's
// fleetview.go): its state lock, which guards the fleet's memory too, the
// jobs and nodes read under it, the one applier that commits jobs with
// the fleet's records, the scheduler's wake-up, the term's work group and
// the parts of a machine's agent config the broker owns. Methods said to
// run "under the lock" expect the caller to hold it.
type Broker interface {
	// Lock and Unlock take and release the broker's state lock.
	Lock()
	Unlock()
	// MayDecide reports whether the broker may act now: it leads and its
	// store answers (under the lock).
	MayDecide() bool
	// Job, Waiting, OnPrem, MachineJobs and OnMachine are burstctl.Fleet's
	// reads of the broker's jobs and nodes (under the lock).
	Job(id string) *broker.Job
	Waiting() []burstctl.Waiting
	OnPrem() (gpus, held int)
	MachineJobs(id string) ([]string, int)
	OnMachine(id string) (waiting, holding []*broker.Job)
	// Node is a registered node by name (under the lock).
	Node(name string) (*broker.Node, bool)
	// HomeNodes are the on-prem nodes a burst job may spill back to
	// (under the lock).
	HomeNodes() []burst.HomeNode
	// Commit writes jobs, drops the nodes of ended machines and runs tx,
	// in one transaction, then applies the jobs and the dropped nodes to
	// memory (under the lock). When it fails nothing changed.
	Commit(ctx context.Context, jobs []*broker.Job, dropNodes []string, tx func(broker.Tx) error) error
	// WakeNode tells a node's waiting sync that it has new orders (under
	// the lock).
	WakeNode(name string)
	// OffersChanged tells the broker the providers' offers changed, so
	// that what a spec may ask for is published again (under the lock).
	OffersChanged()
	// NoteReasons keeps the last decision's word on each waiting job, for
	// the API's pending reasons (under the lock).
	NoteReasons(reasons map[string]broker.PendingReason)
	// Kick asks for a scheduling cycle soon.
	Kick()
	// Go runs fn in a goroutine owned by the leader's term, whose end
	// waits for it; fn gets the term's context.
	Go(fn func(ctx context.Context))
	// Park marks the calling work goroutine as waiting on something
	// outside the broker until unpark is called.
	Park() (unpark func())
	// NewRecordID names a new machine record.
	NewRecordID(now time.Time) string
	// BrokerCA is the CA bundle a machine's agent trusts the broker by.
	BrokerCA() string
	// AgentRuntime is the runtime a machine's agent gets.
	AgentRuntime(provider string) *jobrt.Config
	// SlurmBootstrap brings up slurmd on a Slurm node's machine instead of
	// the agent; SlurmDown sets a node DOWN with a reason (both
	// broker/slurmdoor's, wired by the server).
	SlurmBootstrap(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider) error
	SlurmDown(ctx context.Context, node, reason string)
}

// Metrics are the broker's metrics the fleet feeds.
type Metrics struct {
	BurstLead    *prometheus.HistogramVec
	BudgetUsed   *prometheus.GaugeVec
	BudgetAlerts *prometheus.CounterVec
}

// Options are what a fleet is built from.
type Options struct {
	Broker  Broker
	Store   broker.Store
	Clock   clock.Clock
	Logger  *slog.Logger
	Metrics Metrics
	// Config and Adapters are the configuration in force and its adapter
	// sections; a reload swaps them, so the fleet reads them at each use.
	Config   func() *config.Config
	Adapters func() *adapters.Config
	// Providers are added to the configured ones (tests use fakes).
	Providers []providers.Provider
	// Bootstrap replaces the SSH bootstrap of burst machines (tests).
	Bootstrap BootstrapFunc
}

// Fleet is the live side of bursting: the providers, the machine records
// in memory, the launch and terminate workers, reconciliation with the
// providers, offers, prices and cool-downs, and the burst loop that asks
// burst.Decide and carries the decision out through burstctl. Its memory
// is guarded by the broker's state lock (Broker.Lock).
type Fleet struct {
	st      Broker
	store   broker.Store
	clock   clock.Clock
	log     *slog.Logger
	metrics Metrics
	cfg     func() *config.Config
	adapt   func() *adapters.Config

	// providers, kinds (each provider's billing pool kind, cloud or
	// lease), signer and bootstrap come from the config and stay across
	// terms.
	providers map[string]providers.Provider
	kinds     map[string]billing.PoolKind
	signer    ssh.Signer
	bootstrap BootstrapFunc
	// working holds the records a worker goroutine is carrying forward.
	// It stays across terms: workers of the last term end with its
	// context and take their own ids out, and until then no second worker
	// starts for the same machine.
	working map[string]bool

	instances  map[string]*broker.InstanceRecord
	active     bool
	offers     map[string][]providers.Offer // by provider, last good answer
	offersAt   time.Time
	orphans    map[string]time.Time
	reconciled time.Time
	alerted    map[string]bool
	// coolDowns by offer key (reclaim.go); they outlive a term.
	coolDowns map[string]burst.CoolDown
	// refreshing serialises price refreshes (prices.go), so the table a
	// provider uses is the one stored last; it is held without the state
	// lock while the price lists answer.
	refreshing sync.Mutex
}

// offerRefresh is how long provider offers are cached.
const offerRefresh = 30 * time.Second

// New makes a fleet with the injected providers and no records; Init
// adds the configured providers and loads the records.
func New(o Options) *Fleet {
	f := &Fleet{st: o.Broker, store: o.Store, clock: o.Clock, log: o.Logger, metrics: o.Metrics, cfg: o.Config, adapt: o.Adapters,
		providers: map[string]providers.Provider{}, kinds: map[string]billing.PoolKind{}, bootstrap: o.Bootstrap,
		working: map[string]bool{}}
	if f.bootstrap == nil {
		f.bootstrap = f.sshBootstrap
	}
	for _, p := range o.Providers {
		f.providers[p.Name()] = p
		f.kinds[p.Name()] = billing.PoolCloud
	}
	f.ResetLocked()
	return f
}

// Init builds the providers from the config and loads the instance
// records. Without providers the controller idles.
func (f *Fleet) Init(ctx context.Context) error {
	for i, pc := range f.adapt().Providers {
		p, kind, err := f.buildProvider(ctx, pc)
		if err != nil {
			return fmt.Errorf("providers[%d]: %w", i, err)
		}
		f.providers[p.Name()] = p
		f.kinds[p.Name()] = kind
	}
	if err := f.LoadLocked(ctx); err != nil {
		return err
	}
	if len(f.providers) > 0 {
		signer, err := loadOrCreateSSHKey(f.sshKeyPath())
		if err != nil {
			return err
		}
		f.signer = signer
	}
	return nil
}

// ResetLocked drops what a leader term filled in (LoadLocked and the
// burst loop rebuild it). The providers, SSH key, bootstrap and the
// workers still running stay.
func (f *Fleet) ResetLocked() {
	f.instances = map[string]*broker.InstanceRecord{}
	f.offers = map[string][]providers.Offer{}
	f.offersAt = time.Time{}
	f.orphans = map[string]time.Time{}
	f.reconciled = time.Time{}
	f.alerted = map[string]bool{}
	f.active = false
}

// LoadLocked reads the instance records into memory, tells the
// leased-host pools which hosts the records claim and gives the providers
// their refreshed price tables: at start, and again whenever the broker
// takes over as leader.
func (f *Fleet) LoadLocked(ctx context.Context) error {
	f.instances = map[string]*broker.InstanceRecord{}
	f.alerted = map[string]bool{}
	err := f.store.View(ctx, func(tx broker.Tx) error {
		recs, err := broker.ListInstances(tx)
		for _, r := range recs {
			f.instances[r.ID] = r
		}
		if err != nil {
			return err
		}
		// Budget alerts already raised stay raised across restarts.
		err = tx.Scan(broker.BucketMeta, budgetAlertKey, broker.PrefixEnd(budgetAlertKey), func(k string, _ []byte) error {
			f.alerted[strings.TrimPrefix(k, budgetAlertKey)] = true
			return nil
		})
		if err != nil {
			return err
		}
		// Refreshed on-demand prices outlive restarts (prices.go).
		return f.loadPriceTables(tx)
	})
	if err != nil {
		return fmt.Errorf("load instance records: %w", err)
	}
	// Leased hosts are claimed by records; tell the pools which.
	for name, p := range f.providers {
		pool, ok := p.(*sshpool.Provider)
		if !ok {
			continue
		}
		var claims []providers.Instance
		for _, r := range f.instances {
			if r.Provider == name && r.ProviderID != "" && !r.State.Ended() {
				claims = append(claims, providers.Instance{ID: r.ProviderID, RecordID: r.ID, Provider: name})
			}
		}
		if err := pool.Restore(claims); err != nil {
			f.log.Warn("restore leased host claims", "provider", name, "err", err)
		}
	}
	return nil
}

// Loop decides every burst.interval, carries records forward and
// reconciles with the providers, while ctx lives.
func (f *Fleet) Loop(ctx context.Context) {
	if len(f.providers) == 0 {
		return
	}
	f.Resume(ctx)
	for ctx.Err() == nil {
		if err := f.BurstCycle(ctx); err != nil && ctx.Err() == nil {
			f.log.Error("burst cycle failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-f.clock.After(f.cfg().Burst.Interval.D()):
		}
	}
}

// Resume starts a worker for every record between two steps: a
// broker that was killed picks each machine up where it was.
func (f *Fleet) Resume(ctx context.Context) {
	f.st.Lock()
	defer f.st.Unlock()
	for id, r := range f.instances {
		switch r.State {
		case broker.MachineRequested, broker.MachineProvisioning, broker.MachineBootstrapping:
			f.StartWorkerLocked(ctx, id, f.LaunchWorker)
		case broker.MachineTerminating:
			f.StartWorkerLocked(ctx, id, f.TerminateWorker)
		}
	}
}

// StartWorkerLocked runs fn(ctx, id) as record id's worker, unless one
// already carries it, on the broker's work group (under the lock).
func (f *Fleet) StartWorkerLocked(ctx context.Context, id string, fn func(context.Context, string)) {
	if f.working[id] {
		return
	}
	f.working[id] = true
	// Owned by the term (Broker.Go): its end waits for the worker.
	// The worker keeps the caller's context, which the term's bounds.
	f.st.Go(func(context.Context) {
		defer func() {
			f.st.Lock()
			delete(f.working, id)
			f.st.Unlock()
		}()
		fn(ctx, id)
	})
}

// RefreshOffers asks every provider for its offers when the cache is old.
func (f *Fleet) RefreshOffers(ctx context.Context, now time.Time) {
	f.st.Lock()
	stale := now.Sub(f.offersAt) >= offerRefresh
	provs := make(map[string]providers.Provider, len(f.providers))
	for k, v := range f.providers {
		provs[k] = v
	}
	f.st.Unlock()
	if !stale {
		return
	}
	got := map[string][]providers.Offer{}
	for name, p := range provs {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		offers, err := p.Offers(cctx)
		cancel()
		if err != nil {
			f.log.Warn("provider offers unavailable", "provider", name, "err", err)
			continue
		}
		got[name] = offers
	}
	f.st.Lock()
	for k, v := range got {
		f.offers[k] = v
	}
	f.offersAt = now
	f.st.OffersChanged()
	f.st.Unlock()
}

// BurstCycle makes one burst decision and carries it out, then reconciles
// with the providers when that is due. Budgets are read before the state
// lock is taken.
func (f *Fleet) BurstCycle(ctx context.Context) error {
	now := f.clock.Now()
	f.RefreshOffers(ctx, now)
	ctl := f.burstCtl()
	budgets, err := ctl.Budgets(ctx, f.store, now)
	if err != nil {
		return err
	}
	f.st.Lock()
	if !f.st.MayDecide() {
		f.st.Unlock()
		return nil // a standby, or the store is unreachable
	}
	in := ctl.Input(now, f.active, budgets)
	in.CoolDowns = f.coolDownsLocked(now)
	ctl.SpillInput(in, f.cfg().BillingCompiled().Meter.OnPrem, f.st.HomeNodes)
	f.checkBudgetAlertsLocked(in)
	d := burst.Decide(in)
	err = ctl.Apply(ctx, now, &d)
	f.active = d.Active
	f.st.NoteReasons(d.Reasons)
	f.st.Unlock()
	if err != nil {
		return err
	}
	if now.Sub(f.reconciled) >= f.cfg().Burst.ReconcileEvery.D() {
		f.reconciled = now
		f.Reconcile(ctx)
	}
	return nil
}

// PlanBurst returns the decision the controller would take now, without
// acting on it.
func (f *Fleet) PlanBurst(ctx context.Context) (burst.Decision, *burst.Input, error) {
	now := f.clock.Now()
	f.RefreshOffers(ctx, now)
	ctl := f.burstCtl()
	budgets, err := ctl.Budgets(ctx, f.store, now)
	if err != nil {
		return burst.Decision{}, nil, err
	}
	f.st.Lock()
	defer f.st.Unlock()
	in := ctl.Input(now, f.active, budgets)
	in.CoolDowns = f.coolDownsLocked(now)
	ctl.SpillInput(in, f.cfg().BillingCompiled().Meter.OnPrem, f.st.HomeNodes)
	return burst.Decide(in), in, nil
}

// Zone is the billing time zone of cfg: budget months begin at its
// midnight.
func Zone(cfg *config.Config) *time.Location {
	if tz := cfg.BillingCompiled().TimeZone; tz != nil {
		return tz
	}
	return time.UTC
}

// Currency is the currency of cfg's meter, USD unless set.
func Currency(cfg *config.Config) string {
	if c := cfg.BillingCompiled().Meter.Currency; c != "" {
		return c
	}
	return "USD"
}

// PutRecordLocked writes a record and keeps it in memory.
func (f *Fleet) PutRecordLocked(ctx context.Context, r *broker.InstanceRecord, jobs []*broker.Job, extra func(broker.Tx) error) error {
	err := f.st.Commit(ctx, jobs, nil, func(tx broker.Tx) error {
		if extra != nil {
			if err := extra(tx); err != nil {
				return err
			}
		}
		return broker.PutInstance(tx, r)
	})
	if err != nil {
		return err
	}
	f.instances[r.ID] = r
	return nil
}

// Record returns a copy of a record and its provider.
func (f *Fleet) Record(id string) (*broker.InstanceRecord, providers.Provider) {
	f.st.Lock()
	defer f.st.Unlock()
	r, ok := f.instances[id]
	if !ok {
		return nil, nil
	}
	return r.Clone(), f.providers[r.Provider]
}

// Update applies fn to a copy of the record and writes it (with any job
// changes fn returns).
func (f *Fleet) Update(ctx context.Context, id string, fn func(r *broker.InstanceRecord, now time.Time) ([]*broker.Job, func(broker.Tx) error)) (*broker.InstanceRecord, error) {
	f.st.Lock()
	defer f.st.Unlock()
	r, ok := f.instances[id]
	if !ok {
		return nil, broker.ErrNotFound
	}
	rr := r.Clone()
	jobs, extra := fn(rr, f.clock.Now())
	if err := f.PutRecordLocked(ctx, rr, jobs, extra); err != nil {
		return nil, err
	}
	for _, j := range jobs {
		for _, n := range j.Nodes() {
			f.st.WakeNode(n)
		}
	}
	f.st.Kick()
	return rr.Clone(), nil
}

// MeterMachinesLocked describes the burst machines for the meter: each
// costs from launch to termination, whoever uses it.
func (f *Fleet) MeterMachinesLocked(cursor time.Time) []billing.Machine {
	var out []billing.Machine
	for _, r := range f.instances {
		if r.TerminatedAt != nil && !cursor.IsZero() && r.TerminatedAt.Before(cursor.Add(-time.Hour)) {
			continue // metered long ago
		}
		if m, ok := burstctl.MeterMachine(r, f.kinds[r.Provider]); ok {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Pool.InstanceID < out[b].Pool.InstanceID })
	return out
}

// PoolKind is the billing pool kind of r's machine (under the lock).
func (f *Fleet) PoolKind(r *broker.InstanceRecord) billing.PoolKind {
	return burstctl.Pool(r, f.kinds[r.Provider]).Kind
}

// RecordLocked is the record of machine id, or nil; the caller must not
// change it (under the lock).
func (f *Fleet) RecordLocked(id string) *broker.InstanceRecord { return f.instances[id] }

// RecordsLocked are every record in memory, ended ones too, in id order;
// the caller must not change them (under the lock).
func (f *Fleet) RecordsLocked() []*broker.InstanceRecord {
	out := make([]*broker.InstanceRecord, 0, len(f.instances))
	for _, r := range f.instances {
		out = append(out, r)
	}
	burstctl.SortRecords(out)
	return out
}

// WorkingLocked reports whether a worker is carrying record id forward
// (under the lock).
func (f *Fleet) WorkingLocked(id string) bool { return f.working[id] }

// ProviderNames are the providers' names, sorted.
func (f *Fleet) ProviderNames() []string {
	f.st.Lock()
	defer f.st.Unlock()
	return slices.Sorted(maps.Keys(f.providers))
}

// OffersKnownLocked reports whether the providers were asked for their
// offers since the term began (under the lock).
func (f *Fleet) OffersKnownLocked() bool { return !f.offersAt.IsZero() }

// Signer is the broker's SSH client key, nil without providers.
func (f *Fleet) Signer() ssh.Signer { return f.signer }
