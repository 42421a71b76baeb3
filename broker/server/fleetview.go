package server

import (
	"context"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/broker/burstctl"
	"github.com/spillway-dev/spillway/broker/fleet"
	jobrt "github.com/spillway-dev/spillway/onprem/runtime"
	"github.com/spillway-dev/spillway/providers"
)

// initFleet builds the burst controller's fleet (broker/fleet) over this
// broker's state: its providers from the config plus opt's, and the
// machine records.
func (s *Server) initFleet(ctx context.Context, opt Options) error {
	s.fleet = fleet.New(fleet.Options{Broker: fleetState{s}, Store: s.store, Clock: s.clock, Logger: s.log,
		Metrics: fleet.Metrics{BurstLead: s.metrics.burstLead, BudgetUsed: s.metrics.budgetUsed, BudgetAlerts: s.metrics.budgetAlerts},
		Config:  s.cfg, Adapters: s.adapt, Providers: opt.Providers, Bootstrap: opt.Bootstrap})
	s.initSlurm()
	return s.fleet.Init(ctx)
}

// billingZone is the config's billing time zone.
func (s *Server) billingZone() *time.Location { return fleet.Zone(s.cfg()) }

// currency is the config's meter currency.
func (s *Server) currency() string { return fleet.Currency(s.cfg()) }

func newRecordID(now time.Time, ids *idSource) string {
	return "spw-" + strings.ToLower(ids.next(now))
}

// fleetState is fleet.Broker over the server: s.mu is the fleet's lock,
// and its reads and commits go to the server's maps and commitLocked.
type fleetState struct{ s *Server }

var _ fleet.Broker = fleetState{}

func (f fleetState) Lock()   { f.s.lock() }
func (f fleetState) Unlock() { f.s.mu.Unlock() }

func (f fleetState) MayDecide() bool { return f.s.mayDecideLocked() }

func (f fleetState) Job(id string) *broker.Job { return f.s.view.Job(id) }

func (f fleetState) Waiting() []burstctl.Waiting {
	s := f.s
	var out []burstctl.Waiting
	for j := range s.view.Jobs() {
		if j.State != broker.StatePending && j.State != broker.StateProvisioning {
			continue
		}
		w := burstctl.Waiting{Job: j}
		if r, ok := s.view.Reason(j.ID); ok {
			w.EstimatedStart, w.Why = r.EstimatedStart(), r.Code()
		}
		out = append(out, w)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Job.ID < out[b].Job.ID })
	return out
}

func (f fleetState) OnPrem() (gpus, held int) {
	s := f.s
	for n := range s.view.Nodes() {
		if n.Instance != "" || n.State != broker.NodeReady {
			continue
		}
		gpus += len(n.HealthyGPUs())
		taken := map[int]bool{}
		for j := range s.view.Holders(n.Name) {
			p, _, _ := placedOn(j, n.Name)
			for _, g := range p.GPUs {
				taken[g] = true
			}
		}
		held += len(taken)
	}
	return gpus, held
}

// MachineJobs lists the jobs bound to a machine or holding its cards,
// and their GPUs.
func (f fleetState) MachineJobs(id string) ([]string, int) {
	s := f.s
	seen := map[string]bool{}
	var out []string
	gpus := 0
	for j := range s.view.Holders(id) {
		if j != nil && !seen[j.ID] {
			seen[j.ID] = true
			out = append(out, j.ID)
			gpus += j.Spec.Resources.GPUs
		}
	}
	for j := range s.view.Jobs() {
		if j.BoundTo(id) && !seen[j.ID] {
			seen[j.ID] = true
			out = append(out, j.ID)
			gpus += j.Spec.Resources.GPUs
		}
	}
	slices.Sort(out)
	return out, gpus
}

func (f fleetState) OnMachine(id string) (waiting, holding []*broker.Job) {
	s := f.s
	for j := range s.view.Jobs() {
		if j.BoundTo(id) {
			waiting = append(waiting, j)
		}
	}
	slices.SortFunc(waiting, func(a, b *broker.Job) int { return strings.Compare(a.ID, b.ID) })
	return waiting, s.view.HoldingOn(id)
}

func (f fleetState) Node(name string) (*broker.Node, bool) {
	n := f.s.view.Node(name)
	return n, n != nil
}

func (f fleetState) HomeNodes() []burst.HomeNode { return f.s.homeNodesLocked() }

// Commit writes through commitLocked, with the ended machines' nodes
// deleted in the same transaction, then forgets those nodes.
func (f fleetState) Commit(ctx context.Context, jobs []*broker.Job, dropNodes []string, tx func(broker.Tx) error) error {
	s := f.s
	err := s.commitLocked(ctx, jobs, nil, func(t broker.Tx) error {
		if tx != nil {
			if err := tx(t); err != nil {
				return err
			}
		}
		for _, n := range dropNodes {
			if err := t.Delete(broker.BucketNodes, n); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, n := range dropNodes {
		s.view.DropNode(n)
		delete(s.telemetry, n)
	}
	if len(dropNodes) > 0 {
		s.noteInventoryLocked()
	}
	return nil
}

func (f fleetState) OffersChanged() { f.s.noteInventoryLocked() }

func (f fleetState) WakeNode(name string) { f.s.wakeNodeLocked(name) }

func (f fleetState) NoteReasons(reasons map[string]broker.PendingReason) { f.s.burstWhy = reasons }

func (f fleetState) Kick() { f.s.kick() }

func (f fleetState) Go(fn func(ctx context.Context)) { f.s.goWork(fn) }

func (f fleetState) Park() func() { return f.s.park() }

func (f fleetState) NewRecordID(now time.Time) string { return newRecordID(now, f.s.ids) }

func (f fleetState) BrokerCA() string { return f.s.brokerCA() }

func (f fleetState) AgentRuntime(provider string) *jobrt.Config { return f.s.burstRuntime(provider) }

func (f fleetState) SlurmBootstrap(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider) error {
	return f.s.slurm.Bootstrap(ctx, rec, prov)
}

func (f fleetState) SlurmDown(ctx context.Context, node, reason string) {
	f.s.slurm.Down(ctx, node, reason)
}
