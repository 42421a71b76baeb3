package server

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
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/adapters"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/broker/burstctl"
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

// burstState is the leader's burst controller (guarded by Server.mu).
type burstState struct {
	providers map[string]providers.Provider
	// kinds is each provider's billing pool kind (cloud or lease).
	kinds     map[string]billing.PoolKind
	instances map[string]*broker.InstanceRecord
	active    bool
	offers    map[string][]providers.Offer // by provider, last good answer
	offersAt  time.Time
	reasons   map[string]broker.PendingReason
	// working holds the records a worker goroutine is carrying forward.
	working    map[string]bool
	orphans    map[string]time.Time
	reconciled time.Time
	signer     ssh.Signer
	bootstrap  BootstrapFunc
	alerted    map[string]bool
	last       burst.Decision
	// refreshing serialises price refreshes (prices.go), so the table a
	// provider uses is the one stored last; it is held without Server.mu
	// while the price lists answer.
	refreshing sync.Mutex
}

// offerRefresh is how long provider offers are cached.
const offerRefresh = 30 * time.Second

// initBurst builds the providers from the config (plus any injected) and
// loads the instance records. Without providers the controller idles.
func (s *Server) initBurst(ctx context.Context, opt Options) error {
	b := &s.burst
	b.providers = map[string]providers.Provider{}
	b.kinds = map[string]billing.PoolKind{}
	b.instances = map[string]*broker.InstanceRecord{}
	b.offers = map[string][]providers.Offer{}
	b.reasons = map[string]broker.PendingReason{}
	b.working = map[string]bool{}
	b.orphans = map[string]time.Time{}
	b.alerted = map[string]bool{}
	b.bootstrap = opt.Bootstrap
	if b.bootstrap == nil {
		b.bootstrap = s.sshBootstrap
	}
	for _, p := range opt.Providers {
		b.providers[p.Name()] = p
		b.kinds[p.Name()] = billing.PoolCloud
	}
	for i, pc := range s.adapt().Providers {
		p, kind, err := s.buildProvider(ctx, pc)
		if err != nil {
			return fmt.Errorf("providers[%d]: %w", i, err)
		}
		b.providers[p.Name()] = p
		b.kinds[p.Name()] = kind
	}
	if err := s.loadInstances(ctx); err != nil {
		return err
	}
	if len(b.providers) > 0 {
		signer, err := loadOrCreateSSHKey(s.sshKeyPath())
		if err != nil {
			return err
		}
		b.signer = signer
	}
	return nil
}

// loadInstances reads the instance records into memory, tells the
// leased-host pools which hosts the records claim and gives the providers
// their refreshed price tables: at start, and again whenever this broker
// takes over as leader (leader.go).
func (s *Server) loadInstances(ctx context.Context) error {
	b := &s.burst
	b.instances = map[string]*broker.InstanceRecord{}
	b.alerted = map[string]bool{}
	err := s.store.View(ctx, func(tx broker.Tx) error {
		recs, err := broker.ListInstances(tx)
		for _, r := range recs {
			b.instances[r.ID] = r
		}
		if err != nil {
			return err
		}
		// Budget alerts already raised stay raised across restarts.
		err = tx.Scan(broker.BucketMeta, budgetAlertKey, broker.PrefixEnd(budgetAlertKey), func(k string, _ []byte) error {
			b.alerted[strings.TrimPrefix(k, budgetAlertKey)] = true
			return nil
		})
		if err != nil {
			return err
		}
		// Refreshed on-demand prices outlive restarts (prices.go).
		return s.loadPriceTables(tx)
	})
	if err != nil {
		return fmt.Errorf("load instance records: %w", err)
	}
	// Leased hosts are claimed by records; tell the pools which.
	for name, p := range b.providers {
		pool, ok := p.(*sshpool.Provider)
		if !ok {
			continue
		}
		var claims []providers.Instance
		for _, r := range b.instances {
			if r.Provider == name && r.ProviderID != "" && !r.State.Ended() {
				claims = append(claims, providers.Instance{ID: r.ProviderID, RecordID: r.ID, Provider: name})
			}
		}
		if err := pool.Restore(claims); err != nil {
			s.log.Warn("restore leased host claims", "provider", name, "err", err)
		}
	}
	return nil
}

func (s *Server) sshKeyPath() string {
	if s.cfg().Burst.SSHKeyFile != "" {
		return s.cfg().Burst.SSHKeyFile
	}
	return filepath.Join(s.cfg().DataDir, "burst_ssh_key")
}

// buildProvider makes one configured provider.
func (s *Server) buildProvider(ctx context.Context, pc adapters.Provider) (providers.Provider, billing.PoolKind, error) {
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
			c.HostKeySecretFile = filepath.Join(s.cfg().DataDir, "lambda-hostkey.secret")
		}
		if err := ensureSecret(c.HostKeySecretFile); err != nil {
			return nil, "", err
		}
		p, err := lease.New(c)
		return p, billing.PoolLease, err
	case pc.SSHPool != nil:
		p, err := sshpool.New(*pc.SSHPool, s.clock.Now)
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

// burstLoop decides every burst.interval, carries records forward and
// reconciles with the providers, while ctx lives.
func (s *Server) burstLoop(ctx context.Context) {
	if len(s.burst.providers) == 0 {
		return
	}
	s.resumeRecords(ctx)
	for ctx.Err() == nil {
		if err := s.BurstCycle(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("burst cycle failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-s.clock.After(s.cfg().Burst.Interval.D()):
		}
	}
}

// resumeRecords starts a worker for every record between two steps: a
// broker that was killed picks each machine up where it was.
func (s *Server) resumeRecords(ctx context.Context) {
	s.lock()
	defer s.mu.Unlock()
	for id, r := range s.burst.instances {
		switch r.State {
		case broker.MachineRequested, broker.MachineProvisioning, broker.MachineBootstrapping:
			s.startWorkerLocked(ctx, id, s.launchWorker)
		case broker.MachineTerminating:
			s.startWorkerLocked(ctx, id, s.terminateWorker)
		}
	}
}

func (s *Server) startWorkerLocked(ctx context.Context, id string, fn func(context.Context, string)) {
	if s.burst.working[id] {
		return
	}
	s.burst.working[id] = true
	// Owned by the term (tasks.go): its end and Serve wait for the worker.
	// The worker keeps the caller's context, which the term's bounds.
	s.goWork(func(context.Context) {
		defer func() {
			s.lock()
			delete(s.burst.working, id)
			s.mu.Unlock()
		}()
		fn(ctx, id)
	})
}

// refreshOffers asks every provider for its offers when the cache is old.
func (s *Server) refreshOffers(ctx context.Context, now time.Time) {
	s.lock()
	stale := now.Sub(s.burst.offersAt) >= offerRefresh
	provs := make(map[string]providers.Provider, len(s.burst.providers))
	for k, v := range s.burst.providers {
		provs[k] = v
	}
	s.mu.Unlock()
	if !stale {
		return
	}
	got := map[string][]providers.Offer{}
	for name, p := range provs {
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		offers, err := p.Offers(cctx)
		cancel()
		if err != nil {
			s.log.Warn("provider offers unavailable", "provider", name, "err", err)
			continue
		}
		got[name] = offers
	}
	s.lock()
	for k, v := range got {
		s.burst.offers[k] = v
	}
	s.burst.offersAt = now
	s.noteInventoryLocked()
	s.mu.Unlock()
}

// BurstCycle makes one burst decision and carries it out, then reconciles
// with the providers when that is due. Budgets are read before the state
// lock is taken.
func (s *Server) BurstCycle(ctx context.Context) error {
	now := s.clock.Now()
	s.refreshOffers(ctx, now)
	ctl := s.burstCtl()
	budgets, err := ctl.Budgets(ctx, s.store, now)
	if err != nil {
		return err
	}
	s.lock()
	if !s.mayDecideLocked() {
		s.mu.Unlock()
		return nil // a standby, or the store is unreachable (leader.go)
	}
	in := ctl.Input(now, s.burst.active, budgets)
	in.CoolDowns = s.coolDownsLocked(now)
	ctl.SpillInput(in, s.cfg().BillingCompiled().Meter.OnPrem, s.homeNodesLocked)
	s.checkBudgetAlertsLocked(in)
	d := burst.Decide(in)
	err = ctl.Apply(ctx, now, &d)
	s.burst.active, s.burst.last, s.burst.reasons = d.Active, d, d.Reasons
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if now.Sub(s.burst.reconciled) >= s.cfg().Burst.ReconcileEvery.D() {
		s.burst.reconciled = now
		s.Reconcile(ctx)
	}
	return nil
}

// PlanBurst returns the decision the controller would take now, without
// acting on it.
func (s *Server) PlanBurst(ctx context.Context) (burst.Decision, *burst.Input, error) {
	now := s.clock.Now()
	s.refreshOffers(ctx, now)
	ctl := s.burstCtl()
	budgets, err := ctl.Budgets(ctx, s.store, now)
	if err != nil {
		return burst.Decision{}, nil, err
	}
	s.lock()
	defer s.mu.Unlock()
	in := ctl.Input(now, s.burst.active, budgets)
	in.CoolDowns = s.coolDownsLocked(now)
	ctl.SpillInput(in, s.cfg().BillingCompiled().Meter.OnPrem, s.homeNodesLocked)
	return burst.Decide(in), in, nil
}

func (s *Server) billingZone() *time.Location {
	if tz := s.cfg().BillingCompiled().TimeZone; tz != nil {
		return tz
	}
	return time.UTC
}

// machineJobsLocked lists the jobs bound to a machine or holding its
// cards, and their GPUs.
func (s *Server) machineJobsLocked(id string) ([]string, int) {
	seen := map[string]bool{}
	var out []string
	gpus := 0
	for jid := range s.byNode[id] {
		if j := s.jobs[jid]; j != nil && !seen[jid] {
			seen[jid] = true
			out = append(out, jid)
			gpus += j.Spec.Resources.GPUs
		}
	}
	for jid, j := range s.jobs {
		if j.BoundTo(id) && !seen[jid] {
			seen[jid] = true
			out = append(out, jid)
			gpus += j.Spec.Resources.GPUs
		}
	}
	slices.Sort(out)
	return out, gpus
}

// putRecordLocked writes a record and keeps it in memory.
func (s *Server) putRecordLocked(ctx context.Context, r *broker.InstanceRecord, jobs []*broker.Job, extra func(broker.Tx) error) error {
	err := s.commitLocked(ctx, jobs, nil, func(tx broker.Tx) error {
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
	s.burst.instances[r.ID] = r
	return nil
}

func newRecordID(now time.Time, ids *idSource) string {
	return "spw-" + strings.ToLower(ids.next(now))
}

func (s *Server) currency() string {
	if c := s.cfg().BillingCompiled().Meter.Currency; c != "" {
		return c
	}
	return "USD"
}

// record returns a copy of a record and its provider.
func (s *Server) record(id string) (*broker.InstanceRecord, providers.Provider) {
	s.lock()
	defer s.mu.Unlock()
	r, ok := s.burst.instances[id]
	if !ok {
		return nil, nil
	}
	return r.Clone(), s.burst.providers[r.Provider]
}

// update applies fn to a copy of the record and writes it (with any job
// changes fn returns).
func (s *Server) update(ctx context.Context, id string, fn func(r *broker.InstanceRecord, now time.Time) ([]*broker.Job, func(broker.Tx) error)) (*broker.InstanceRecord, error) {
	s.lock()
	defer s.mu.Unlock()
	r, ok := s.burst.instances[id]
	if !ok {
		return nil, broker.ErrNotFound
	}
	rr := r.Clone()
	jobs, extra := fn(rr, s.clock.Now())
	if err := s.putRecordLocked(ctx, rr, jobs, extra); err != nil {
		return nil, err
	}
	for _, j := range jobs {
		for _, n := range j.Nodes() {
			s.wakeNodeLocked(n)
		}
	}
	s.kick()
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

// errStep marks a failure that ends the machine's launch.
type errStep struct {
	step string
	err  error
}

func (e *errStep) Error() string { return e.step + ": " + e.err.Error() }
func (e *errStep) Unwrap() error { return e.err }

// launchWorker carries one record from requested to ready, persisting each
// step before the next external call. It may be restarted at any step.
func (s *Server) launchWorker(ctx context.Context, id string) {
	log := s.log.With("record", id)
	for ctx.Err() == nil {
		rec, prov := s.record(id)
		if rec == nil {
			return
		}
		if prov == nil {
			s.failLaunch(ctx, id, &errStep{"launch", fmt.Errorf("provider %q is not configured", rec.Provider)})
			return
		}
		var err error
		switch rec.State {
		case broker.MachineRequested:
			err = s.stepCreate(ctx, rec, prov)
		case broker.MachineProvisioning:
			err = s.stepRunning(ctx, rec, prov)
		case broker.MachineBootstrapping:
			err = s.stepBootstrap(ctx, rec, prov)
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
			s.failLaunch(ctx, id, err)
			return
		}
	}
}

// stepCreate asks the provider for the machine (idempotent on the record
// id), moving to the next offer on a capacity, quota or unsupported error.
func (s *Server) stepCreate(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider) error {
	if _, err := s.update(ctx, rec.ID, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
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
			SSHAuthorizedKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.burst.signer.PublicKey()))),
			Placement:        placementName(rec)})
		cancel()
		switch {
		case err == nil:
			err := s.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
				return c.Launched(ctx, rec.ID, now, *inst)
			})
			if errors.Is(err, burstctl.ErrAbandoned) {
				// Its gang group was given up while this member was being
				// created: delete it now (the reconciler would, later).
				s.log.Info("burst machine created for a group given up; deleting it", "record", rec.ID, "instance", inst.ID)
				dctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				if err := prov.Delete(dctx, inst.ID); err != nil && !providers.IsNotFound(err) {
					s.log.Warn("delete abandoned burst machine; the reconciler will", "record", rec.ID, "err", err)
				}
				cancel()
				_, _ = s.update(ctx, rec.ID, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
					r.Deletes++
					return nil, nil
				})
				return errAbandoned
			}
			return err
		case providers.IsNextOffer(err) && rec.Group != "":
			// A gang's machines are one offer: the whole group moves on.
			s.noteCapacityError(rec.Offer, err)
			cause := err
			ok := false
			if err := s.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
				var err error
				ok, err = c.GroupNextOffer(ctx, rec.ID, now, cause)
				return err
			}); err != nil {
				return &errStep{"create", err}
			}
			s.log.Info("burst offer unavailable for a gang member; the group moves on", "record", rec.ID, "group", rec.Group, "err", cause, "next", ok)
			return errAbandoned
		case providers.IsNextOffer(err):
			s.noteCapacityError(rec.Offer, err)
			var next providers.Offer
			ok := false
			cause := err
			if err := s.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
				var err error
				next, ok, err = c.NextOffer(ctx, rec.ID, now, cause)
				return err
			}); err != nil {
				return &errStep{"create", err}
			}
			if !ok {
				return &errStep{"create", fmt.Errorf("no offer could be had: %w", err)}
			}
			s.log.Info("burst offer unavailable, trying the next", "record", rec.ID, "err", err, "next", next.Key())
			rec, prov = s.record(rec.ID)
			if prov == nil {
				return &errStep{"create", fmt.Errorf("provider %q is not configured", rec.Provider)}
			}
			backoff = time.Second
		case providers.IsUnauthorized(err) || errors.Is(err, providers.ErrInvalidRequest) || attempt >= 5:
			return &errStep{"create", err}
		default:
			s.log.Warn("burst create failed; retrying", "record", rec.ID, "err", err, "in", backoff)
			unpark := s.park()
			select {
			case <-ctx.Done():
				unpark()
				return ctx.Err()
			case <-s.clock.After(backoff):
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
func (s *Server) stepRunning(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	inst, err := providers.WaitRunning(cctx, prov, rec.ProviderID, 2*time.Second)
	if err != nil {
		return &errStep{"wait for running", err}
	}
	return s.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
		return c.Running(ctx, rec.ID, now, *inst)
	})
}

// stepBootstrap gives the machine its own agent token and brings the
// agent up; the machine is ready when the agent registered.
func (s *Server) stepBootstrap(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider) error {
	if rec.SlurmNode != "" {
		return s.stepSlurmd(ctx, rec, prov)
	}
	token := newToken()
	sum := sha256.Sum256([]byte(token))
	sha := hex.EncodeToString(sum[:])
	old := rec.TokenSHA256
	started := s.clock.Now()
	if _, err := s.update(ctx, rec.ID, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
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
	gpus := s.cfg().Burst.AgentGPUs
	if gpus == "sim" {
		gpus = fmt.Sprintf("sim:%dx%s-%dGB", max(rec.Offer.GPUs, 1), firstNonEmpty(rec.Offer.GPUModel, "H100"), max(rec.Offer.GPUMemoryBytes>>30, 1))
	}
	agent := bootstrap.AgentConfig{Broker: s.cfg().AdvertiseURL, Token: token, Name: rec.ID, GPUs: gpus, CA: s.brokerCA(),
		DataDir: machineDir(s.cfg().Burst.AgentDataDir, rec.ID), Data: s.adapt().AgentData,
		Labels: map[string]string{"pool": rec.Provider, "instance": rec.ID, "provider": rec.Provider,
			"region": rec.Offer.Region, "instanceType": rec.Offer.InstanceType},
		Runtime: s.burstRuntime(rec.Provider), Notice: s.noticeWatch(rec)}
	registered := func(ctx context.Context) error { return s.waitRegistered(ctx, rec.ID, started) }
	tr, err := s.burst.bootstrap(ctx, rec, prov, agent, registered)
	var raw json.RawMessage
	if tr != nil {
		raw, _ = json.Marshal(tr)
	}
	if err != nil {
		_, _ = s.update(ctx, rec.ID, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
			r.Bootstrap = raw
			return nil, nil
		})
		if providers.IsHostKeyMismatch(err) {
			return &errStep{"bootstrap", fmt.Errorf("host key mismatch, nothing was run: %w", err)}
		}
		return &errStep{"bootstrap", err}
	}
	if _, err := s.update(ctx, rec.ID, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
		r.Bootstrap = raw
		return nil, nil
	}); err != nil {
		return err
	}
	return s.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
		s.metrics.burstLead.WithLabelValues(rec.Provider).Observe(now.Sub(rec.CreatedAt).Seconds())
		return c.Ready(ctx, rec.ID, now)
	})
}

// sshBootstrap is the real bootstrap over SSH.
func (s *Server) sshBootstrap(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider, agent bootstrap.AgentConfig, registered func(context.Context) error) (*bootstrap.Transcript, error) {
	target := bootstrap.Target{Addr: rec.SSHHost, User: rec.SSHUser, Signer: s.burst.signer,
		HostKeys: func(ctx context.Context) ([]ssh.PublicKey, error) { return prov.HostKeys(ctx, rec.ProviderID) }}
	opts := bootstrap.Options{Agent: agent, RemoteDir: machineDir(s.cfg().Burst.RemoteDir, rec.ID),
		Binaries: s.cfg().Burst.Binaries, WaitRegistered: registered, Logger: s.log.With("record", rec.ID),
		NoSudo: s.cfg().Burst.AgentSudo == "never"}
	if s.cfg().Burst.AgentInit == "supervised" {
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
func (s *Server) waitRegistered(ctx context.Context, id string, since time.Time) error {
	for {
		s.lock()
		n, ok := s.nodes[id]
		done := ok && n.State == broker.NodeReady && !n.RegisteredAt.Before(since.Add(-time.Second))
		s.mu.Unlock()
		if done {
			return nil
		}
		unpark := s.park()
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
func (s *Server) failLaunch(ctx context.Context, id string, cause error) {
	var rec *broker.InstanceRecord
	if err := s.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
		var err error
		rec, err = c.Fail(ctx, id, now, cause)
		return err
	}); err != nil {
		s.log.Error("burst launch failed and could not be recorded", "record", id, "cause", cause, "err", err)
		return
	}
	if rec.SlurmNode != "" {
		s.slurmDown(ctx, s.slurmCommands(), rec.SlurmNode, "spillway: "+cause.Error())
	}
	if rec.State == broker.MachineTerminating {
		s.terminateWorker(ctx, id)
	}
}

// terminateWorker deletes the machine, retrying until the provider says it
// is gone, then closes the record.
func (s *Server) terminateWorker(ctx context.Context, id string) {
	rec, prov := s.record(id)
	if rec == nil {
		return
	}
	if _, err := s.update(ctx, id, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
		sha := r.TokenSHA256
		return nil, func(tx broker.Tx) error { return broker.DeleteInstanceToken(tx, sha) }
	}); err != nil {
		s.log.Error("revoke machine token", "record", id, "err", err)
	}
	backoff := time.Second
	for ctx.Err() == nil && rec.ProviderID != "" && prov != nil {
		if rec.Offer.Prepaid && rec.SSHHost != "" && s.burst.signer != nil {
			// A leased host stays up: stop the agent before giving it back.
			target := bootstrap.Target{Addr: rec.SSHHost, User: rec.SSHUser, Signer: s.burst.signer,
				HostKeys: func(ctx context.Context) ([]ssh.PublicKey, error) { return prov.HostKeys(ctx, rec.ProviderID) }}
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			if _, err := bootstrap.Stop(cctx, target, bootstrap.StopOptions{RemoteDir: machineDir(s.cfg().Burst.RemoteDir, rec.ID)}); err != nil {
				s.log.Warn("stop agent on leased host", "record", id, "err", err)
			}
			cancel()
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := prov.Delete(cctx, rec.ProviderID)
		cancel()
		_, _ = s.update(ctx, id, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
			r.Deletes++
			return nil, nil
		})
		if providers.IsNotFound(err) {
			break
		}
		if err != nil {
			s.log.Warn("burst delete failed; retrying", "record", id, "err", err, "in", backoff)
		} else if gone(ctx, prov, rec.ProviderID) {
			// Deleted at once: the machine stops costing now, not a
			// backoff later.
			break
		}
		unpark := s.park()
		select {
		case <-ctx.Done():
			unpark()
			return
		case <-s.clock.After(backoff):
		}
		unpark()
		backoff = min(2*backoff, 30*time.Second)
	}
	if ctx.Err() != nil {
		return
	}
	s.closeRecord(ctx, id, "deleted", "the provider reports the machine gone", time.Time{})
	s.dropPlacement(ctx, rec, prov)
}

// dropPlacement deletes a gang group's placement group once the last of
// its machines is gone.
func (s *Server) dropPlacement(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider) {
	pl, ok := prov.(providers.Placer)
	if rec.Group == "" || !ok {
		return
	}
	s.lock()
	for _, r := range s.burst.instances {
		if r.Group == rec.Group && !r.State.Ended() {
			s.mu.Unlock()
			return
		}
	}
	s.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := pl.DeletePlacement(cctx, placementName(rec)); err != nil {
		s.log.Warn("delete placement group", "group", rec.Group, "err", err)
	}
}

// gone reports whether the provider no longer knows machine id.
func gone(ctx context.Context, prov providers.Provider, id string) bool {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	_, err := prov.Get(cctx, id)
	return providers.IsNotFound(err)
}

// closeRecord ends a record whose machine is gone (burstctl's Close),
// metered up to end (now when zero).
func (s *Server) closeRecord(ctx context.Context, id, reason, detail string, end time.Time) {
	if err := s.withBurstCtl(func(c *burstctl.Controller, now time.Time) error {
		return c.Close(ctx, id, now, end, reason, detail)
	}); err != nil {
		s.log.Error("close burst record", "record", id, "err", err)
		return
	}
	s.log.Info("burst machine ended", "record", id, "reason", reason)
}

// Reconcile compares every provider's tagged machines with the records:
// a machine with no live record is deleted after the orphan grace; a
// record whose machine vanished is closed, metered up to when it was last
// seen; a reservation left open by an ended record is released.
func (s *Server) Reconcile(ctx context.Context) {
	s.lock()
	provs := make(map[string]providers.Provider, len(s.burst.providers))
	for k, v := range s.burst.providers {
		provs[k] = v
	}
	s.mu.Unlock()
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
			s.log.Warn("reconcile: list machines", "provider", name, "err", err)
			continue
		}
		s.reconcileProvider(ctx, name, p, list)
	}
	// Reservations of ended records.
	s.lock()
	var stale []string
	for id, r := range s.burst.instances {
		if r.State.Ended() {
			stale = append(stale, id)
		}
	}
	s.mu.Unlock()
	if len(stale) > 0 {
		err := s.store.Update(ctx, func(tx broker.Tx) error {
			for _, id := range stale {
				if err := broker.Release(tx, id); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			s.log.Error("reconcile: release reservations", "err", err)
		}
	}
}

func (s *Server) reconcileProvider(ctx context.Context, name string, p providers.Provider, list []providers.Instance) {
	now := s.clock.Now()
	live := map[string]bool{}
	for _, inst := range list {
		live[inst.ID] = true
		s.lock()
		r := s.burst.instances[inst.RecordID]
		s.mu.Unlock()
		key := name + "/" + inst.ID
		if r == nil || r.State.Ended() {
			s.lock()
			first, seen := s.burst.orphans[key]
			if !seen {
				s.burst.orphans[key] = now
				first = now
			}
			s.mu.Unlock()
			if now.Sub(first) < s.cfg().Burst.OrphanGrace.D() {
				continue
			}
			s.log.Warn("deleting a tagged machine without a live record", "provider", name, "machine", inst.ID, "record", inst.RecordID)
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			err := p.Delete(cctx, inst.ID)
			cancel()
			if err != nil && !providers.IsNotFound(err) {
				s.log.Warn("delete orphan machine", "provider", name, "machine", inst.ID, "err", err)
			}
			continue
		}
		s.lock()
		delete(s.burst.orphans, key)
		s.mu.Unlock()
		if r.ProviderID == "" && r.State == broker.MachineRequested {
			continue // the worker will adopt it through the idempotent Create
		}
		_, _ = s.update(ctx, r.ID, func(rr *broker.InstanceRecord, now time.Time) ([]*broker.Job, func(broker.Tx) error) {
			t := now
			rr.LastSeen = &t
			return nil, nil
		})
	}
	s.lock()
	var gone []*broker.InstanceRecord
	for _, r := range s.burst.instances {
		st := r.State
		if r.Provider != name || st.Ended() || r.ProviderID == "" || live[r.ProviderID] || s.burst.working[r.ID] {
			continue
		}
		gone = append(gone, r.Clone())
	}
	s.mu.Unlock()
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
		s.log.Warn("burst machine vanished", "record", r.ID, "provider", name, "machine", r.ProviderID, "last_seen", end)
		s.closeRecord(ctx, r.ID, "vanished", "the provider no longer lists the machine", end)
	}
}

// meterMachinesLocked describes the burst machines for the meter: each
// costs from launch to termination, whoever uses it.
func (s *Server) meterMachinesLocked(cursor time.Time) []billing.Machine {
	var out []billing.Machine
	for _, r := range s.burst.instances {
		if r.TerminatedAt != nil && !cursor.IsZero() && r.TerminatedAt.Before(cursor.Add(-time.Hour)) {
			continue // metered long ago
		}
		if m, ok := burstctl.MeterMachine(r, s.burst.kinds[r.Provider]); ok {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Pool.InstanceID < out[b].Pool.InstanceID })
	return out
}

func (s *Server) poolKind(r *broker.InstanceRecord) billing.PoolKind {
	return burstctl.Pool(r, s.burst.kinds[r.Provider]).Kind
}

func newToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
