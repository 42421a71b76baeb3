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
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
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
	"github.com/spillway-dev/spillway/providers/aws"
	"github.com/spillway-dev/spillway/providers/bootstrap"
	"github.com/spillway-dev/spillway/providers/gcp"
	"github.com/spillway-dev/spillway/providers/lease"
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
	// the agent; SlurmDown sets a node DOWN with a reason (slurm.go).
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

func (f *Fleet) sshKeyPath() string {
	if f.cfg().Burst.SSHKeyFile != "" {
		return f.cfg().Burst.SSHKeyFile
	}
	return filepath.Join(f.cfg().DataDir, "burst_ssh_key")
}

// buildProvider makes one configured provider.
func (f *Fleet) buildProvider(ctx context.Context, pc adapters.Provider) (providers.Provider, billing.PoolKind, error) {
	switch {
	case pc.AWS != nil:
		p, err := aws.New(ctx, *pc.AWS)
		return p, billing.PoolCloud, err
	case pc.GCP != nil:
		p, err := gcp.New(ctx, *pc.GCP)
		return p, billing.PoolCloud, err
	case pc.Lambda != nil:
		c := *pc.Lambda
		if c.HostKeySecretFile == "" {
			c.HostKeySecretFile = filepath.Join(f.cfg().DataDir, "lambda-hostkey.secret")
		}
		if err := ensureSecret(c.HostKeySecretFile); err != nil {
			return nil, "", err
		}
		p, err := lease.New(c)
		return p, billing.PoolLease, err
	case pc.SSHPool != nil:
		p, err := sshpool.New(*pc.SSHPool, f.clock.Now)
		return p, billing.PoolLease, err
	}
	return nil, "", errors.New("no provider set")
}

// ensureSecret creates a 32-byte random secret file unless it exists.
func ensureSecret(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// loadOrCreateSSHKey reads the broker's SSH client key, creating an
// ed25519 key the first time.
func loadOrCreateSSHKey(path string) (ssh.Signer, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		block, err := ssh.MarshalPrivateKey(priv, "spillway broker")
		if err != nil {
			return nil, err
		}
		raw = pem.EncodeToMemory(block)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		if err := os.WriteFile(path, raw, 0o600); err != nil {
			return nil, fmt.Errorf("write ssh key: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("read ssh key: %w", err)
	}
	signer, err := ssh.ParsePrivateKey(raw)
	if err != nil {
		return nil, fmt.Errorf("parse ssh key %s: %w", path, err)
	}
	return signer, nil
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

// errAbandoned ends a launch worker whose record its gang group gave up
// (burstctl.GroupNextOffer, burstctl.ErrAbandoned at create): nothing is
// left for it to do.
var errAbandoned = errors.New("launch abandoned")

// placementName is the placement group of a gang's machines (EC2 cluster
// placement group, GCE compact placement policy): one per group, named
// after it; empty for a machine launched alone.
func placementName(r *broker.InstanceRecord) string {
	if r.Group == "" {
		return ""
	}
	return "spillway-" + strings.ReplaceAll(safeTag(r.Group), "_", "-")
}

// StepError marks a failure that ends the machine's launch, with the
// step that failed.
type StepError struct {
	Step string
	Err  error
}

func (e *StepError) Error() string { return e.Step + ": " + e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

// LaunchWorker carries one record from requested to ready, persisting each
// step before the next external call. It may be restarted at any step.
func (f *Fleet) LaunchWorker(ctx context.Context, id string) {
	log := f.log.With("record", id)
	for ctx.Err() == nil {
		rec, prov := f.Record(id)
		if rec == nil {
			return
		}
		if prov == nil {
			f.failLaunch(ctx, id, &StepError{"launch", fmt.Errorf("provider %q is not configured", rec.Provider)})
			return
		}
		var err error
		switch rec.State {
		case broker.MachineRequested:
			err = f.stepCreate(ctx, rec, prov)
		case broker.MachineProvisioning:
			err = f.stepRunning(ctx, rec, prov)
		case broker.MachineBootstrapping:
			err = f.stepBootstrap(ctx, rec, prov)
		default:
			return
		}
		if errors.Is(err, errAbandoned) {
			return // the group moved on without this record
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("burst launch failed", "state", rec.State, "err", err)
			f.failLaunch(ctx, id, err)
			return
		}
	}
}

// stepCreate asks the provider for the machine (idempotent on the record
// id), moving to the next offer on a capacity, quota or unsupported error.
func (f *Fleet) stepCreate(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider) error {
	if _, err := f.Update(ctx, rec.ID, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
		r.Attempts++
		return nil, nil
	}); err != nil {
		return err
	}
	tags := map[string]string{"team": safeTag(rec.Team)}
	if len(rec.Jobs) > 0 {
		tags["job"] = safeTag(strings.ToLower(rec.Jobs[0]))
	}
	var backoff time.Duration = time.Second
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		inst, err := prov.Create(cctx, providers.CreateRequest{RecordID: rec.ID, Offer: rec.Offer, Tags: tags,
			SSHAuthorizedKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(f.signer.PublicKey()))),
			Placement:        placementName(rec)})
		cancel()
		switch {
		case err == nil:
			err := f.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
				return c.Launched(ctx, rec.ID, now, *inst)
			})
			if errors.Is(err, burstctl.ErrAbandoned) {
				// Its gang group was given up while this member was being
				// created: delete it now (the reconciler would, later).
				f.log.Info("burst machine created for a group given up; deleting it", "record", rec.ID, "instance", inst.ID)
				dctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				if err := prov.Delete(dctx, inst.ID); err != nil && !providers.IsNotFound(err) {
					f.log.Warn("delete abandoned burst machine; the reconciler will", "record", rec.ID, "err", err)
				}
				cancel()
				_, _ = f.Update(ctx, rec.ID, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
					r.Deletes++
					return nil, nil
				})
				return errAbandoned
			}
			return err
		case providers.IsNextOffer(err) && rec.Group != "":
			// A gang's machines are one offer: the whole group moves on.
			f.noteCapacityError(rec.Offer, err)
			cause := err
			ok := false
			if err := f.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
				var err error
				ok, err = c.GroupNextOffer(ctx, rec.ID, now, cause)
				return err
			}); err != nil {
				return &StepError{"create", err}
			}
			f.log.Info("burst offer unavailable for a gang member; the group moves on", "record", rec.ID, "group", rec.Group, "err", cause, "next", ok)
			return errAbandoned
		case providers.IsNextOffer(err):
			f.noteCapacityError(rec.Offer, err)
			var next providers.Offer
			ok := false
			cause := err
			if err := f.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
				var err error
				next, ok, err = c.NextOffer(ctx, rec.ID, now, cause)
				return err
			}); err != nil {
				return &StepError{"create", err}
			}
			if !ok {
				return &StepError{"create", fmt.Errorf("no offer could be had: %w", err)}
			}
			f.log.Info("burst offer unavailable, trying the next", "record", rec.ID, "err", err, "next", next.Key())
			rec, prov = f.Record(rec.ID)
			if prov == nil {
				return &StepError{"create", fmt.Errorf("provider %q is not configured", rec.Provider)}
			}
			backoff = time.Second
		case providers.IsUnauthorized(err) || errors.Is(err, providers.ErrInvalidRequest) || attempt >= 5:
			return &StepError{"create", err}
		default:
			f.log.Warn("burst create failed; retrying", "record", rec.ID, "err", err, "in", backoff)
			unpark := f.st.Park()
			select {
			case <-ctx.Done():
				unpark()
				return ctx.Err()
			case <-f.clock.After(backoff):
			}
			unpark()
			backoff = min(2*backoff, time.Minute)
		}
	}
}

func safeTag(s string) string {
	s = strings.ToLower(s)
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i] = '-'
		}
	}
	if len(b) > 63 {
		b = b[:63]
	}
	return string(b)
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// stepRunning waits until the provider reports the machine running with an
// address.
func (f *Fleet) stepRunning(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	inst, err := providers.WaitRunning(cctx, prov, rec.ProviderID, 2*time.Second)
	if err != nil {
		return &StepError{"wait for running", err}
	}
	return f.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
		return c.Running(ctx, rec.ID, now, *inst)
	})
}

// stepBootstrap gives the machine its own agent token and brings the
// agent up; the machine is ready when the agent registered.
func (f *Fleet) stepBootstrap(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider) error {
	if rec.SlurmNode != "" {
		return f.st.SlurmBootstrap(ctx, rec, prov)
	}
	token := newToken()
	sum := sha256.Sum256([]byte(token))
	sha := hex.EncodeToString(sum[:])
	old := rec.TokenSHA256
	started := f.clock.Now()
	if _, err := f.Update(ctx, rec.ID, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
		r.TokenSHA256 = sha
		return nil, func(tx broker.Tx) error {
			if err := broker.DeleteInstanceToken(tx, old); err != nil {
				return err
			}
			return broker.PutInstanceToken(tx, sha, r.ID)
		}
	}); err != nil {
		return err
	}
	gpus := f.cfg().Burst.AgentGPUs
	if gpus == "sim" {
		gpus = fmt.Sprintf("sim:%dx%s-%dGB", max(rec.Offer.GPUs, 1), firstNonEmpty(rec.Offer.GPUModel, "H100"), max(rec.Offer.GPUMemoryBytes>>30, 1))
	}
	agent := bootstrap.AgentConfig{Broker: f.cfg().AdvertiseURL, Token: token, Name: rec.ID, GPUs: gpus, CA: f.st.BrokerCA(),
		DataDir: machineDir(f.cfg().Burst.AgentDataDir, rec.ID), Data: f.adapt().AgentData,
		Labels: map[string]string{"pool": rec.Provider, "instance": rec.ID, "provider": rec.Provider,
			"region": rec.Offer.Region, "instanceType": rec.Offer.InstanceType},
		Runtime: f.st.AgentRuntime(rec.Provider), Notice: f.noticeWatch(rec)}
	registered := func(ctx context.Context) error { return f.waitRegistered(ctx, rec.ID, started) }
	tr, err := f.bootstrap(ctx, rec, prov, agent, registered)
	var raw json.RawMessage
	if tr != nil {
		raw, _ = json.Marshal(tr)
	}
	if err != nil {
		_, _ = f.Update(ctx, rec.ID, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
			r.Bootstrap = raw
			return nil, nil
		})
		if providers.IsHostKeyMismatch(err) {
			return &StepError{"bootstrap", fmt.Errorf("host key mismatch, nothing was run: %w", err)}
		}
		return &StepError{"bootstrap", err}
	}
	if _, err := f.Update(ctx, rec.ID, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
		r.Bootstrap = raw
		return nil, nil
	}); err != nil {
		return err
	}
	return f.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
		f.metrics.BurstLead.WithLabelValues(rec.Provider).Observe(now.Sub(rec.CreatedAt).Seconds())
		return c.Ready(ctx, rec.ID, now)
	})
}

// sshBootstrap is the real bootstrap over SSH.
func (f *Fleet) sshBootstrap(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider, agent bootstrap.AgentConfig, registered func(context.Context) error) (*bootstrap.Transcript, error) {
	target := bootstrap.Target{Addr: rec.SSHHost, User: rec.SSHUser, Signer: f.signer,
		HostKeys: func(ctx context.Context) ([]ssh.PublicKey, error) { return prov.HostKeys(ctx, rec.ProviderID) }}
	opts := bootstrap.Options{Agent: agent, RemoteDir: machineDir(f.cfg().Burst.RemoteDir, rec.ID),
		Binaries: f.cfg().Burst.Binaries, WaitRegistered: registered, Logger: f.log.With("record", rec.ID),
		NoSudo: f.cfg().Burst.AgentSudo == "never"}
	if f.cfg().Burst.AgentInit == "supervised" {
		opts.Init = bootstrap.InitSupervised
	}
	return bootstrap.Run(ctx, target, opts)
}

// machineDir expands "{machine}" in a configured remote path to the
// record id, so machines sharing one filesystem (the broker's own host
// under `spillway dev --burst`) keep their agents apart.
func machineDir(dir, id string) string { return strings.ReplaceAll(dir, "{machine}", id) }

// waitRegistered returns once the machine's agent has registered since
// the bootstrap began.
func (f *Fleet) waitRegistered(ctx context.Context, id string, since time.Time) error {
	for {
		f.st.Lock()
		n, ok := f.st.Node(id)
		done := ok && n.State == broker.NodeReady && !n.RegisteredAt.Before(since.Add(-time.Second))
		f.st.Unlock()
		if done {
			return nil
		}
		unpark := f.st.Park()
		select {
		case <-ctx.Done():
			unpark()
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		unpark()
	}
}

// failLaunch ends a launch that cannot go on (burstctl's Fail): the
// waiting jobs go back to the queue with the reason, the reservation is
// released, the token revoked, and a machine that exists is deleted.
func (f *Fleet) failLaunch(ctx context.Context, id string, cause error) {
	var rec *broker.InstanceRecord
	if err := f.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
		var err error
		rec, err = c.Fail(ctx, id, now, cause)
		return err
	}); err != nil {
		f.log.Error("burst launch failed and could not be recorded", "record", id, "cause", cause, "err", err)
		return
	}
	if rec.SlurmNode != "" {
		f.st.SlurmDown(ctx, rec.SlurmNode, "spillway: "+cause.Error())
	}
	if rec.State == broker.MachineTerminating {
		f.TerminateWorker(ctx, id)
	}
}

// TerminateWorker deletes the machine, retrying until the provider says it
// is gone, then closes the record.
func (f *Fleet) TerminateWorker(ctx context.Context, id string) {
	rec, prov := f.Record(id)
	if rec == nil {
		return
	}
	if _, err := f.Update(ctx, id, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
		sha := r.TokenSHA256
		return nil, func(tx broker.Tx) error { return broker.DeleteInstanceToken(tx, sha) }
	}); err != nil {
		f.log.Error("revoke machine token", "record", id, "err", err)
	}
	backoff := time.Second
	for ctx.Err() == nil && rec.ProviderID != "" && prov != nil {
		if rec.Offer.Prepaid && rec.SSHHost != "" && f.signer != nil {
			// A leased host stays up: stop the agent before giving it back.
			target := bootstrap.Target{Addr: rec.SSHHost, User: rec.SSHUser, Signer: f.signer,
				HostKeys: func(ctx context.Context) ([]ssh.PublicKey, error) { return prov.HostKeys(ctx, rec.ProviderID) }}
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			if _, err := bootstrap.Stop(cctx, target, bootstrap.StopOptions{RemoteDir: machineDir(f.cfg().Burst.RemoteDir, rec.ID)}); err != nil {
				f.log.Warn("stop agent on leased host", "record", id, "err", err)
			}
			cancel()
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := prov.Delete(cctx, rec.ProviderID)
		cancel()
		_, _ = f.Update(ctx, id, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
			r.Deletes++
			return nil, nil
		})
		if providers.IsNotFound(err) {
			break
		}
		if err != nil {
			f.log.Warn("burst delete failed; retrying", "record", id, "err", err, "in", backoff)
		} else if gone(ctx, prov, rec.ProviderID) {
			// Deleted at once: the machine stops costing now, not a
			// backoff later.
			break
		}
		unpark := f.st.Park()
		select {
		case <-ctx.Done():
			unpark()
			return
		case <-f.clock.After(backoff):
		}
		unpark()
		backoff = min(2*backoff, 30*time.Second)
	}
	if ctx.Err() != nil {
		return
	}
	f.CloseRecord(ctx, id, "deleted", "the provider reports the machine gone", time.Time{})
	f.dropPlacement(ctx, rec, prov)
}

// dropPlacement deletes a gang group's placement group once the last of
// its machines is gone.
func (f *Fleet) dropPlacement(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider) {
	pl, ok := prov.(providers.Placer)
	if rec.Group == "" || !ok {
		return
	}
	f.st.Lock()
	for _, r := range f.instances {
		if r.Group == rec.Group && !r.State.Ended() {
			f.st.Unlock()
			return
		}
	}
	f.st.Unlock()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := pl.DeletePlacement(cctx, placementName(rec)); err != nil {
		f.log.Warn("delete placement group", "group", rec.Group, "err", err)
	}
}

// gone reports whether the provider no longer knows machine id.
func gone(ctx context.Context, prov providers.Provider, id string) bool {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, err := prov.Get(cctx, id)
	return providers.IsNotFound(err)
}

// CloseRecord ends a record whose machine is gone (burstctl's Close),
// metered up to end (now when zero).
func (f *Fleet) CloseRecord(ctx context.Context, id, reason, detail string, end time.Time) {
	if err := f.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
		return c.Close(ctx, id, now, end, reason, detail)
	}); err != nil {
		f.log.Error("close burst record", "record", id, "err", err)
		return
	}
	f.log.Info("burst machine ended", "record", id, "reason", reason)
}

// Reconcile compares every provider's tagged machines with the records:
// a machine with no live record is deleted after the orphan grace; a
// record whose machine vanished is closed, metered up to when it was last
// seen; a reservation left open by an ended record is released.
func (f *Fleet) Reconcile(ctx context.Context) {
	f.st.Lock()
	provs := make(map[string]providers.Provider, len(f.providers))
	for k, v := range f.providers {
		provs[k] = v
	}
	f.st.Unlock()
	names := make([]string, 0, len(provs))
	for n := range provs {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		p := provs[name]
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		list, err := p.List(cctx)
		cancel()
		if err != nil {
			f.log.Warn("reconcile: list machines", "provider", name, "err", err)
			continue
		}
		f.reconcileProvider(ctx, name, p, list)
	}
	// Reservations of ended records.
	f.st.Lock()
	var stale []string
	for id, r := range f.instances {
		if r.State.Ended() {
			stale = append(stale, id)
		}
	}
	f.st.Unlock()
	if len(stale) > 0 {
		err := f.store.Update(ctx, func(tx broker.Tx) error {
			for _, id := range stale {
				if err := broker.Release(tx, id); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			f.log.Error("reconcile: release reservations", "err", err)
		}
	}
}

func (f *Fleet) reconcileProvider(ctx context.Context, name string, p providers.Provider, list []providers.Instance) {
	now := f.clock.Now()
	live := map[string]bool{}
	for _, inst := range list {
		live[inst.ID] = true
		f.st.Lock()
		r := f.instances[inst.RecordID]
		f.st.Unlock()
		key := name + "/" + inst.ID
		if r == nil || r.State.Ended() {
			f.st.Lock()
			first, seen := f.orphans[key]
			if !seen {
				f.orphans[key] = now
				first = now
			}
			f.st.Unlock()
			if now.Sub(first) < f.cfg().Burst.OrphanGrace.D() {
				continue
			}
			f.log.Warn("deleting a tagged machine without a live record", "provider", name, "machine", inst.ID, "record", inst.RecordID)
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			err := p.Delete(cctx, inst.ID)
			cancel()
			if err != nil && !providers.IsNotFound(err) {
				f.log.Warn("delete orphan machine", "provider", name, "machine", inst.ID, "err", err)
			}
			continue
		}
		f.st.Lock()
		delete(f.orphans, key)
		f.st.Unlock()
		if r.ProviderID == "" && r.State == broker.MachineRequested {
			continue // the worker will adopt it through the idempotent Create
		}
		_, _ = f.Update(ctx, r.ID, func(rr *broker.InstanceRecord, now time.Time) ([]*broker.Job, func(broker.Tx) error) {
			t := now
			rr.LastSeen = &t
			return nil, nil
		})
	}
	f.st.Lock()
	var gone []*broker.InstanceRecord
	for _, r := range f.instances {
		st := r.State
		if r.Provider != name || st.Ended() || r.ProviderID == "" || live[r.ProviderID] || f.working[r.ID] {
			continue
		}
		gone = append(gone, r.Clone())
	}
	f.st.Unlock()
	for _, r := range gone {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err := p.Get(cctx, r.ProviderID)
		cancel()
		if !providers.IsNotFound(err) {
			continue
		}
		end := now
		if r.LastSeen != nil {
			end = *r.LastSeen
		}
		f.log.Warn("burst machine vanished", "record", r.ID, "provider", name, "machine", r.ProviderID, "last_seen", end)
		f.CloseRecord(ctx, r.ID, "vanished", "the provider no longer lists the machine", end)
	}
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

func newToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
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
