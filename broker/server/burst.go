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
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/broker/config"
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
	for i, pc := range s.cfg().Providers {
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

// loadInstances reads the instance records into memory and tells the
// leased-host pools which hosts the records claim: at start, and again
// whenever this broker takes over as leader (leader.go).
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
		return tx.Scan(broker.BucketMeta, budgetAlertKey, broker.PrefixEnd(budgetAlertKey), func(k string, _ []byte) error {
			b.alerted[strings.TrimPrefix(k, budgetAlertKey)] = true
			return nil
		})
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
			if r.Provider == name && r.ProviderID != "" && !burst.MachineState(r.State).Ended() {
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
func (s *Server) buildProvider(ctx context.Context, pc config.Provider) (providers.Provider, billing.PoolKind, error) {
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
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, r := range s.burst.instances {
		switch burst.MachineState(r.State) {
		case burst.Requested, burst.Provisioning, burst.Bootstrapping:
			s.startWorkerLocked(ctx, id, s.launchWorker)
		case burst.Terminating:
			s.startWorkerLocked(ctx, id, s.terminateWorker)
		}
	}
}

func (s *Server) startWorkerLocked(ctx context.Context, id string, fn func(context.Context, string)) {
	if s.burst.working[id] {
		return
	}
	s.burst.working[id] = true
	go func() {
		defer func() {
			s.mu.Lock()
			delete(s.burst.working, id)
			s.mu.Unlock()
		}()
		fn(ctx, id)
	}()
}

// refreshOffers asks every provider for its offers when the cache is old.
func (s *Server) refreshOffers(ctx context.Context, now time.Time) {
	s.mu.Lock()
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
	s.mu.Lock()
	for k, v := range got {
		s.burst.offers[k] = v
	}
	s.burst.offersAt = now
	s.mu.Unlock()
}

// BurstCycle makes one burst decision and carries it out, then reconciles
// with the providers when that is due.
func (s *Server) BurstCycle(ctx context.Context) error {
	now := s.clock.Now()
	s.refreshOffers(ctx, now)
	s.mu.Lock()
	if !s.mayDecideLocked() {
		s.mu.Unlock()
		return nil // a standby, or the store is unreachable (leader.go)
	}
	in, err := s.burstInputLocked(ctx, now)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	s.checkBudgetAlertsLocked(in)
	d := burst.Decide(in)
	err = s.applyBurstLocked(ctx, now, d)
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
	s.mu.Lock()
	defer s.mu.Unlock()
	in, err := s.burstInputLocked(ctx, now)
	if err != nil {
		return burst.Decision{}, nil, err
	}
	return burst.Decide(in), in, nil
}

// burstInputLocked snapshots what the decision needs.
func (s *Server) burstInputLocked(ctx context.Context, now time.Time) (*burst.Input, error) {
	in := &burst.Input{Now: now, Policy: s.cfg().BurstPolicy(), Active: s.burst.active,
		Currency: s.cfg().BillingCompiled().Meter.Currency, Budgets: map[string]burst.Budget{}}
	if in.Currency == "" {
		in.Currency = "USD"
	}
	for _, n := range s.nodes {
		if n.Instance != "" || n.State != broker.NodeReady {
			continue
		}
		in.OnPremGPUs += len(n.HealthyGPUs())
		held := map[int]bool{}
		for id := range s.byNode[n.Name] {
			p, _, _ := placedOn(s.jobs[id], n.Name)
			for _, g := range p.GPUs {
				held[g] = true
			}
		}
		in.OnPremAllocated += len(held)
	}
	for _, j := range s.jobs {
		switch {
		case j.Hold != nil:
			continue
		case j.State == broker.StatePending && (j.NotBefore == nil || !now.Before(*j.NotBefore)):
		case j.State == broker.StateProvisioning:
		default:
			continue
		}
		bj := burst.Job{ID: j.ID, Team: j.Spec.Team, Queue: j.Spec.Queue, Priority: j.Spec.Priority, Burst: j.Spec.Burst,
			Preemptible: j.Spec.Preemptible, GPUs: j.Spec.Resources.GPUs, Nodes: max(1, j.Spec.Resources.Nodes),
			GPUModel: j.Spec.Resources.GPUModel, GPUMemory: int64(j.Spec.Resources.GPUMemory), Timeout: j.Spec.Timeout.D(),
			WaitingSince: waitingSince(j), Machine: j.Machine}
		if r, ok := s.reasons[j.ID]; ok {
			bj.EstimatedStart, bj.Why = r.EstimatedStart, r.Code
		}
		in.Pending = append(in.Pending, bj)
	}
	sort.Slice(in.Pending, func(a, b int) bool { return in.Pending[a].ID < in.Pending[b].ID })
	for _, r := range s.burst.instances {
		st := burst.MachineState(r.State)
		if st.Ended() || r.SlurmNode != "" { // Slurm ends its nodes (slurm.go)
			continue
		}
		m := burst.Machine{ID: r.ID, Provider: r.Provider, Offer: r.Offer, State: st, Team: r.Team}
		m.Jobs, m.GPUsUsed = s.machineJobsLocked(r.ID)
		if n, ok := s.nodes[r.ID]; ok && n.State == broker.NodeReady {
			m.ReadyGPUs = len(n.HealthyGPUs())
		}
		if r.LaunchedAt != nil {
			m.LaunchedAt = *r.LaunchedAt
		}
		if r.IdleSince != nil {
			m.IdleSince = *r.IdleSince
		}
		in.Machines = append(in.Machines, m)
	}
	sort.Slice(in.Machines, func(a, b int) bool { return in.Machines[a].ID < in.Machines[b].ID })
	names := make([]string, 0, len(s.burst.offers))
	for name := range s.burst.offers {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if _, ok := s.burst.providers[name]; ok {
			in.Offers = append(in.Offers, s.burst.offers[name]...)
		}
	}
	month := now.In(s.billingZone()).Format("2006-01")
	err := s.store.View(ctx, func(tx broker.Tx) error {
		budgets, err := broker.ListBudgets(tx)
		if err != nil {
			return err
		}
		for _, b := range budgets {
			m, err := broker.GetBudgetMonth(tx, month, b.Scope)
			if err != nil {
				return err
			}
			in.Budgets[b.Scope] = burst.Budget{Limit: b.Limit, Committed: m.Committed()}
		}
		return nil
	})
	return in, err
}

// waitingSince is when a job last entered the queue. A job that was
// preempted keeps its original wait, so once its checkpoint grace is over
// it may resume on burst capacity at once instead of waiting for on-prem.
func waitingSince(j *broker.Job) time.Time {
	for i := len(j.History) - 1; i >= 0; i-- {
		if j.History[i].To == broker.StatePending {
			if j.History[i].From == broker.StatePreempted {
				return j.SubmittedAt
			}
			return j.History[i].At
		}
	}
	return j.SubmittedAt
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
		if j.State == broker.StateProvisioning && j.Machine == id && !seen[jid] {
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

func cloneRecord(r *broker.InstanceRecord) *broker.InstanceRecord {
	c := *r
	c.History = slices.Clone(r.History)
	c.Jobs = slices.Clone(r.Jobs)
	c.Fallbacks = slices.Clone(r.Fallbacks)
	return &c
}

func newRecordID(now time.Time, ids *idSource) string {
	return "spw-" + strings.ToLower(ids.next(now))
}

// applyBurstLocked carries out a decision: launches (record, budget
// reservation and job bindings in one transaction, then a worker), binds,
// scale-downs, idle marks, reasons.
func (s *Server) applyBurstLocked(ctx context.Context, now time.Time, d burst.Decision) error {
	b := &s.burst
	b.active = d.Active
	b.last = d
	b.reasons = d.Reasons
	for _, l := range d.Launches {
		id := newRecordID(now, s.ids)
		rec := &broker.InstanceRecord{ID: id, Provider: l.Offer.Provider, Offer: l.Offer, Fallbacks: l.Fallbacks,
			State: string(burst.Requested), Team: l.Team, Queue: l.Queue, ProjectedCost: int64(l.ProjectedCost), CreatedAt: now}
		rec.History = []broker.Transition{{At: now, To: broker.State(burst.Requested), Reason: "burst",
			Detail: fmt.Sprintf("%s %s for %d waiting job(s), projected %s %s", l.Offer.Provider, l.Offer.InstanceType, len(l.Jobs), burst.Money(l.ProjectedCost), s.currency())}}
		var jobs []*broker.Job
		for _, jid := range l.Jobs {
			if j := s.bindJobLocked(jid, id, now, fmt.Sprintf("burst: %s %s requested (%s)", l.Offer.Provider, l.Offer.InstanceType, id)); j != nil {
				jobs = append(jobs, j)
				rec.Jobs = append(rec.Jobs, jid)
			}
		}
		if len(jobs) == 0 {
			continue
		}
		err := s.putRecordLocked(ctx, rec, jobs, func(tx broker.Tx) error {
			if l.Offer.Prepaid {
				return nil
			}
			_, err := broker.Reserve(tx, id, l.Team, l.ProjectedCost, now, s.billingZone())
			return err
		})
		if errors.Is(err, broker.ErrBudgetExceeded) {
			for _, jid := range rec.Jobs {
				b.reasons[jid] = broker.PendingReason{Code: burst.CodeBudget, Message: "burst blocked: " + strings.TrimPrefix(err.Error(), broker.ErrBudgetExceeded.Error()+": ")}
			}
			continue
		}
		if err != nil {
			return err
		}
		s.log.Info("burst launch", "record", id, "provider", l.Offer.Provider, "type", l.Offer.InstanceType, "spot", l.Offer.Spot,
			"jobs", rec.Jobs, "team", l.Team, "projected", l.ProjectedCost.String())
		s.startWorkerLocked(ctx, id, s.launchWorker)
	}
	for _, bd := range d.Binds {
		r, ok := b.instances[bd.Machine]
		if !ok {
			continue
		}
		j := s.bindJobLocked(bd.Job, r.ID, now, fmt.Sprintf("burst: bound to %s %s (%s)", r.Provider, r.Offer.InstanceType, r.ID))
		if j == nil {
			continue
		}
		rr := cloneRecord(r)
		rr.Jobs = append(rr.Jobs, bd.Job)
		rr.IdleSince = nil
		if err := s.putRecordLocked(ctx, rr, []*broker.Job{j}, nil); err != nil {
			return err
		}
	}
	for _, st := range d.Stops {
		if err := s.scaleDownLocked(ctx, now, st); err != nil {
			return err
		}
	}
	return s.markIdleLocked(ctx, now)
}

// bindJobLocked returns the job moved to provisioning on machine id, or
// nil when it is no longer waiting.
func (s *Server) bindJobLocked(jid, id string, now time.Time, detail string) *broker.Job {
	j, ok := s.jobs[jid]
	if !ok || j.State != broker.StatePending {
		return nil
	}
	jj := cloneJob(j)
	jj.Machine = id
	jj.Transit(now, broker.StateProvisioning, "burst", detail)
	return jj
}

// unbindLocked returns a machine's waiting jobs to the queue.
func (s *Server) unbindLocked(id string, now time.Time, why string) []*broker.Job {
	var out []*broker.Job
	for _, j := range s.jobs {
		if j.State == broker.StateProvisioning && j.Machine == id {
			jj := cloneJob(j)
			jj.Machine = ""
			jj.Transit(now, broker.StatePending, "burst_failed", why)
			out = append(out, jj)
		}
	}
	return out
}

// scaleDownLocked drains a machine (its jobs are stopped with their
// checkpoint signal and requeued) and, once it has none, ends it.
func (s *Server) scaleDownLocked(ctx context.Context, now time.Time, st burst.Stop) error {
	r, ok := s.burst.instances[st.Machine]
	if !ok || burst.MachineState(r.State).Ended() || r.State == string(burst.Terminating) {
		return nil
	}
	jobs, _ := s.machineJobsLocked(r.ID)
	rr := cloneRecord(r)
	var changed []*broker.Job
	changed = append(changed, s.unbindLocked(r.ID, now, "burst machine "+r.ID+" is going away: "+st.Detail)...)
	holding := 0
	for _, jid := range jobs {
		j := s.jobs[jid]
		if j == nil || !j.State.Holding() {
			continue
		}
		holding++
		if j.Stop == nil {
			jj := cloneJob(j)
			jj.Stop = &broker.StopRequest{Reason: "preempted", Detail: "burst machine " + r.ID + ": " + st.Detail,
				Signal: jj.Spec.Checkpoint.Signal, Grace: jj.Spec.Checkpoint.Grace.D(), RequestedAt: now, By: "burst controller"}
			changed = append(changed, jj)
		}
	}
	if holding > 0 {
		if rr.State != string(burst.Draining) {
			rr.Transit(now, string(burst.Draining), st.Reason, st.Detail)
		}
		if err := s.putRecordLocked(ctx, rr, changed, nil); err != nil {
			return err
		}
		s.wakeNodeLocked(r.ID)
		return nil
	}
	rr.Transit(now, string(burst.Terminating), st.Reason, st.Detail)
	s.log.Info("burst scale down", "record", r.ID, "reason", st.Reason, "detail", st.Detail)
	if err := s.putRecordLocked(ctx, rr, changed, nil); err != nil {
		return err
	}
	s.startWorkerLocked(ctx, r.ID, s.terminateWorker)
	return nil
}

// markIdleLocked keeps each ready machine's IdleSince: set when its last
// job goes, cleared when one comes.
func (s *Server) markIdleLocked(ctx context.Context, now time.Time) error {
	for _, r := range s.burst.instances {
		if r.State != string(burst.Ready) || r.SlurmNode != "" {
			continue
		}
		jobs, _ := s.machineJobsLocked(r.ID)
		switch {
		case len(jobs) == 0 && r.IdleSince == nil:
			rr := cloneRecord(r)
			t := now
			rr.IdleSince = &t
			if err := s.putRecordLocked(ctx, rr, nil, nil); err != nil {
				return err
			}
		case len(jobs) > 0 && r.IdleSince != nil:
			rr := cloneRecord(r)
			rr.IdleSince = nil
			if err := s.putRecordLocked(ctx, rr, nil, nil); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *Server) currency() string {
	if c := s.cfg().BillingCompiled().Meter.Currency; c != "" {
		return c
	}
	return "USD"
}

// record returns a copy of a record and its provider.
func (s *Server) record(id string) (*broker.InstanceRecord, providers.Provider) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.burst.instances[id]
	if !ok {
		return nil, nil
	}
	return cloneRecord(r), s.burst.providers[r.Provider]
}

// update applies fn to a copy of the record and writes it (with any job
// changes fn returns).
func (s *Server) update(ctx context.Context, id string, fn func(r *broker.InstanceRecord, now time.Time) ([]*broker.Job, func(broker.Tx) error)) (*broker.InstanceRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.burst.instances[id]
	if !ok {
		return nil, broker.ErrNotFound
	}
	rr := cloneRecord(r)
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
	return cloneRecord(rr), nil
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
		switch burst.MachineState(rec.State) {
		case burst.Requested:
			err = s.stepCreate(ctx, rec, prov)
		case burst.Provisioning:
			err = s.stepRunning(ctx, rec, prov)
		case burst.Bootstrapping:
			err = s.stepBootstrap(ctx, rec, prov)
		default:
			return
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
			SSHAuthorizedKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.burst.signer.PublicKey())))})
		cancel()
		switch {
		case err == nil:
			_, err := s.update(ctx, rec.ID, func(r *broker.InstanceRecord, now time.Time) ([]*broker.Job, func(broker.Tx) error) {
				r.ProviderID = inst.ID
				r.SSHHost, r.SSHUser = inst.SSHHost, inst.SSHUser
				t := now
				r.LaunchedAt = &t
				r.Transit(now, string(burst.Provisioning), "created", fmt.Sprintf("%s %s in %s", prov.Name(), inst.ID, firstNonEmpty(inst.Zone, inst.Region)))
				return nil, nil
			})
			return err
		case providers.IsNextOffer(err):
			next, ok := s.nextOffer(ctx, rec.ID, err)
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
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-s.clock.After(backoff):
			}
			backoff = min(2*backoff, time.Minute)
		}
	}
}

// nextOffer moves a record to its next fallback offer, re-reserving the
// budget for the new projected cost in the same transaction.
func (s *Server) nextOffer(ctx context.Context, id string, cause error) (providers.Offer, bool) {
	var next providers.Offer
	ok := false
	_, err := s.update(ctx, id, func(r *broker.InstanceRecord, now time.Time) ([]*broker.Job, func(broker.Tx) error) {
		if len(r.Fallbacks) == 0 {
			return nil, nil
		}
		next, r.Fallbacks = r.Fallbacks[0], r.Fallbacks[1:]
		r.Offer, r.Provider = next, next.Provider
		cost := projectFor(r, s.cfg().BurstPolicy(), s.jobTimeoutLocked(r.Jobs))
		r.ProjectedCost = int64(cost)
		r.Transit(now, string(burst.Requested), "next_offer", fmt.Sprintf("%v; trying %s %s", cause, next.Provider, next.InstanceType))
		ok = true
		team := r.Team
		prepaid := next.Prepaid
		return nil, func(tx broker.Tx) error {
			if err := broker.Release(tx, id); err != nil {
				return err
			}
			if err := tx.Delete(broker.BucketBudgets, "res/"+id); err != nil {
				return err
			}
			if prepaid {
				return nil
			}
			_, err := broker.Reserve(tx, id, team, cost, now, s.billingZone())
			return err
		}
	})
	if err != nil {
		return providers.Offer{}, false
	}
	return next, ok
}

// jobTimeoutLocked is the longest timeout among jobs (caller holds s.mu).
func (s *Server) jobTimeoutLocked(ids []string) time.Duration {
	var d time.Duration
	for _, id := range ids {
		if j, ok := s.jobs[id]; ok {
			d = max(d, j.Spec.Timeout.D())
		}
	}
	return d
}

// projectFor is a record's projected cost: its offer's price for the
// longest job timeout, capped by the machine lifetime.
func projectFor(r *broker.InstanceRecord, p burst.Policy, timeout time.Duration) billing.Amount {
	d := timeout
	if d <= 0 || d > p.MaxLifetime {
		d = p.MaxLifetime
	}
	return r.Offer.PricePerHour.MulDiv(d.Milliseconds(), billing.MillisPerHour)
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
	_, err = s.update(ctx, rec.ID, func(r *broker.InstanceRecord, now time.Time) ([]*broker.Job, func(broker.Tx) error) {
		r.SSHHost, r.SSHUser = inst.SSHHost, inst.SSHUser
		r.Transit(now, string(burst.Bootstrapping), "running", "reachable at "+inst.SSHHost)
		return nil, nil
	})
	return err
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
		DataDir: machineDir(s.cfg().Burst.AgentDataDir, rec.ID), Data: s.cfg().Burst.AgentData,
		Labels: map[string]string{"pool": rec.Provider, "instance": rec.ID, "provider": rec.Provider,
			"region": rec.Offer.Region, "instanceType": rec.Offer.InstanceType},
		Runtime: s.burstRuntime(rec.Provider)}
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
	_, err = s.update(ctx, rec.ID, func(r *broker.InstanceRecord, now time.Time) ([]*broker.Job, func(broker.Tx) error) {
		r.Bootstrap = raw
		t := now
		r.ReadyAt = &t
		r.Transit(now, string(burst.Ready), "registered", fmt.Sprintf("agent registered after %s", broker.FormatDuration(now.Sub(r.CreatedAt).Truncate(time.Second))))
		s.metrics.burstLead.WithLabelValues(r.Provider).Observe(now.Sub(r.CreatedAt).Seconds())
		return nil, nil
	})
	return err
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
		s.mu.Lock()
		n, ok := s.nodes[id]
		done := ok && n.State == broker.NodeReady && !n.RegisteredAt.Before(since.Add(-time.Second))
		s.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// failLaunch ends a launch that cannot go on: the waiting jobs go back to
// the queue with the reason, the reservation is released, the token
// revoked, and a machine that exists is deleted.
func (s *Server) failLaunch(ctx context.Context, id string, cause error) {
	rec, _ := s.update(ctx, id, func(r *broker.InstanceRecord, now time.Time) ([]*broker.Job, func(broker.Tx) error) {
		jobs := s.unbindLocked(id, now, "burst failed: "+cause.Error())
		r.Reason = cause.Error()
		sha := r.TokenSHA256
		if r.ProviderID != "" {
			r.Transit(now, string(burst.Terminating), "failed", cause.Error())
		} else {
			t := now
			r.TerminatedAt = &t
			r.Transit(now, string(burst.Failed), "failed", cause.Error())
		}
		return jobs, func(tx broker.Tx) error {
			if err := broker.DeleteInstanceToken(tx, sha); err != nil {
				return err
			}
			return broker.Release(tx, id)
		}
	})
	if rec != nil && rec.SlurmNode != "" {
		s.slurmDown(ctx, s.slurmCommands(), rec.SlurmNode, "spillway: "+cause.Error())
	}
	if rec != nil && rec.State == string(burst.Terminating) {
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
		}
		select {
		case <-ctx.Done():
			return
		case <-s.clock.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
	if ctx.Err() != nil {
		return
	}
	s.closeRecord(ctx, id, "deleted", "the provider reports the machine gone", time.Time{})
}

// closeRecord ends a record: terminated (it was ready once) or failed,
// metered up to end (now when zero), its reservation released, its node
// removed and anything still bound to it requeued.
func (s *Server) closeRecord(ctx context.Context, id, reason, detail string, end time.Time) {
	_, err := s.update(ctx, id, func(r *broker.InstanceRecord, now time.Time) ([]*broker.Job, func(broker.Tx) error) {
		if end.IsZero() {
			end = now
		}
		t := end
		r.TerminatedAt = &t
		final := burst.Terminated
		if r.ReadyAt == nil {
			final = burst.Failed
		}
		r.Transit(now, string(final), reason, detail)
		jobs := s.unbindLocked(id, now, "burst machine "+id+" ended")
		for _, j := range s.holdingOnLocked(id) {
			jj := cloneJob(j)
			s.loseJob(jj, end, now, "node_lost", "burst machine "+id+" ended")
			jobs = append(jobs, jj)
		}
		sha := r.TokenSHA256
		return jobs, func(tx broker.Tx) error {
			if err := broker.DeleteInstanceToken(tx, sha); err != nil {
				return err
			}
			if err := tx.Delete(broker.BucketNodes, id); err != nil {
				return err
			}
			return broker.Release(tx, id)
		}
	})
	if err != nil {
		s.log.Error("close burst record", "record", id, "err", err)
		return
	}
	s.mu.Lock()
	delete(s.nodes, id)
	delete(s.telemetry, id)
	s.mu.Unlock()
	s.log.Info("burst machine ended", "record", id, "reason", reason)
}

// Reconcile compares every provider's tagged machines with the records:
// a machine with no live record is deleted after the orphan grace; a
// record whose machine vanished is closed, metered up to when it was last
// seen; a reservation left open by an ended record is released.
func (s *Server) Reconcile(ctx context.Context) {
	s.mu.Lock()
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
	s.mu.Lock()
	var stale []string
	for id, r := range s.burst.instances {
		if burst.MachineState(r.State).Ended() {
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
		s.mu.Lock()
		r := s.burst.instances[inst.RecordID]
		s.mu.Unlock()
		key := name + "/" + inst.ID
		if r == nil || burst.MachineState(r.State).Ended() {
			s.mu.Lock()
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
		s.mu.Lock()
		delete(s.burst.orphans, key)
		s.mu.Unlock()
		if r.ProviderID == "" && burst.MachineState(r.State) == burst.Requested {
			continue // the worker will adopt it through the idempotent Create
		}
		_, _ = s.update(ctx, r.ID, func(rr *broker.InstanceRecord, now time.Time) ([]*broker.Job, func(broker.Tx) error) {
			t := now
			rr.LastSeen = &t
			return nil, nil
		})
	}
	s.mu.Lock()
	var gone []*broker.InstanceRecord
	for _, r := range s.burst.instances {
		st := burst.MachineState(r.State)
		if r.Provider != name || st.Ended() || r.ProviderID == "" || live[r.ProviderID] || s.burst.working[r.ID] {
			continue
		}
		gone = append(gone, cloneRecord(r))
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
		if r.LaunchedAt == nil {
			continue
		}
		if r.TerminatedAt != nil && !cursor.IsZero() && r.TerminatedAt.Before(cursor.Add(-time.Hour)) {
			continue // metered long ago
		}
		m := billing.Machine{
			Pool: billing.Pool{Kind: s.poolKind(r), Name: r.Provider, Node: r.ID, Provider: r.Provider, Region: r.Offer.Region,
				InstanceType: r.Offer.InstanceType, InstanceID: r.ID},
			GPUModel: r.Offer.GPUModel, GPUs: r.Offer.GPUs, Spot: r.Offer.Spot,
			Prices: billing.FlatPrice(r.Offer.PricePerGPUHour()), Start: ms(*r.LaunchedAt),
			DemandTeam: r.Team, DemandQueue: r.Queue,
		}
		if r.TerminatedAt != nil {
			m.End = ms(*r.TerminatedAt)
			if m.End.Before(m.Start) {
				m.End = m.Start
			}
		}
		out = append(out, m)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Pool.InstanceID < out[b].Pool.InstanceID })
	return out
}

func (s *Server) poolKind(r *broker.InstanceRecord) billing.PoolKind {
	if r.Offer.Prepaid {
		return billing.PoolLease
	}
	if k, ok := s.burst.kinds[r.Provider]; ok {
		return k
	}
	return billing.PoolCloud
}

func newToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
