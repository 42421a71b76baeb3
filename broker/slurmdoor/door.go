// Package slurmdoor is the broker as Slurm's burst provider
// (docs/slurm.md). slurmctld runs `spillway slurm resume <hostlist>` when
// jobs need CLOUD nodes that are powered down; the door gives each node a
// machine through the burst controller's own launch path — a record, a
// budget reservation in the same transaction, the offer and its
// fallbacks, the SSH bootstrap with verified host keys — except that the
// bootstrap starts slurmd instead of the Spillway agent. `spillway slurm
// suspend` ends the machines. The records of Slurm nodes
// (InstanceRecord.SlurmNode) stay out of the burst decision: Slurm, not
// the idle TTL, says when they go.
//
// The door works on the broker's fleet (broker/fleet) and reaches the
// broker itself only through Broker; it never imports broker/server,
// whose handlers parse and authorise the requests and call it.
package slurmdoor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/adapters"
	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/fleet"
	"github.com/spillway-dev/spillway/broker/slurm"
	"github.com/spillway-dev/spillway/providers"
)

// Broker is what the door needs of the broker besides its fleet: the
// state lock, which guards the fleet's memory and the door's term; the
// park of a work goroutine waiting on something outside the broker; and
// names for new machine records. The server's fleet.Broker has them all.
type Broker interface {
	Lock()
	Unlock()
	Park() (unpark func())
	NewRecordID(now time.Time) string
}

// Options are what a door is built from.
type Options struct {
	Broker Broker
	// Fleet holds the machine records and runs their workers, on the
	// term's work group.
	Fleet  *fleet.Fleet
	Clock  clock.Clock
	Logger *slog.Logger
	// Config and Adapters are the configuration in force and its adapter
	// sections (Slurm's commands); a reload swaps them, so the door reads
	// them at each use.
	Config   func() *config.Config
	Adapters func() *adapters.Config
	// BurstLead observes a launch's lead time, by provider, when slurmd
	// registers.
	BurstLead *prometheus.HistogramVec
}

// Door is the broker's side of Slurm's power saving: resume, suspend,
// the bootstrap of slurmd, and the leader's poll of the jobs on the burst
// nodes for the ledger.
type Door struct {
	st        Broker
	fleet     *fleet.Fleet
	clock     clock.Clock
	log       *slog.Logger
	cfg       func() *config.Config
	adapt     func() *adapters.Config
	burstLead *prometheus.HistogramVec

	// ctx is the leader term's context, for the workers resume and
	// suspend start; nil while no term runs Loop (guarded by the
	// broker's lock).
	ctx context.Context
}

// ErrNotLeader answers a resume or suspend while no leader term runs
// the door's loop.
var ErrNotLeader = errors.New("slurm: not the leader")

// New makes a door; Loop, run by each leader term, opens it.
func New(o Options) *Door {
	return &Door{st: o.Broker, fleet: o.Fleet, clock: o.Clock, log: o.Logger, cfg: o.Config, adapt: o.Adapters, burstLead: o.BurstLead}
}

func (d *Door) commands() slurm.Commands {
	if c := d.adapt().Slurm; c != nil {
		return *c
	}
	return slurm.Commands{}
}

// liveRecord is the record backing a node that has not ended (nil when
// none), and the leader term's context for the workers a resume or
// suspend starts; ErrNotLeader while no term runs Loop.
func (d *Door) liveRecord(node string) (context.Context, *broker.InstanceRecord, error) {
	d.st.Lock()
	defer d.st.Unlock()
	if d.ctx == nil {
		return nil, nil, ErrNotLeader
	}
	for _, r := range d.fleet.RecordsLocked() {
		if r.SlurmNode == node && !r.State.Ended() {
			return d.ctx, r, nil
		}
	}
	return d.ctx, nil, nil
}

// Resume gives each node a machine, unless it has one: the matching
// offers (cheapest first, the rest as fallbacks), a record and its budget
// reservation in one transaction, then the launch worker. A node the
// budget refuses, or that no offer serves, is set DOWN with the reason,
// and the jobs slurmctld said wait for it get the reason as comment.
func (d *Door) Resume(ctx context.Context, names []string, jobs []api.SlurmResumeJob) (api.SlurmResult, error) {
	cfg := d.cfg().Slurm
	cmds := d.commands()
	now := d.clock.Now()
	d.fleet.RefreshOffers(ctx, now)
	var res api.SlurmResult
	var down []api.SlurmNodeResult
	for _, name := range names {
		r := api.SlurmNodeResult{Node: name}
		wctx, live, err := d.liveRecord(name)
		if err != nil {
			return res, err
		}
		if live != nil && live.State != broker.MachineDraining && live.State != broker.MachineTerminating {
			r.Action, r.Record, r.Offer = "launched", live.ID, live.Offer.Key()
			res.Nodes = append(res.Nodes, r)
			continue
		}
		entry, ok, err := d.entryFor(ctx, name)
		if err != nil {
			r.Action, r.Reason = "failed", "spillway: cannot read node "+name+": "+err.Error()
			down = append(down, r)
			res.Nodes = append(res.Nodes, r)
			continue
		}
		if !ok {
			r.Action, r.Reason = "failed", "spillway: no slurm.nodes entry matches "+name
			down = append(down, r)
			res.Nodes = append(res.Nodes, r)
			continue
		}
		d.st.Lock()
		offers := d.offersLocked(entry)
		if len(offers) == 0 {
			d.st.Unlock()
			r.Action, r.Reason = "failed", "spillway: no provider offers what slurm.nodes says for "+name
			down = append(down, r)
			res.Nodes = append(res.Nodes, r)
			continue
		}
		team := cfg.TeamFor(entry)
		id := d.st.NewRecordID(now)
		cost := offers[0].PricePerHour.MulDiv(cfg.Reserve.D().Milliseconds(), billing.MillisPerHour)
		rec := &broker.InstanceRecord{ID: id, Provider: offers[0].Provider, Offer: offers[0], Fallbacks: offers[1:],
			State: broker.MachineRequested, Team: team, Queue: cfg.Queue, ProjectedCost: cost, CreatedAt: now, SlurmNode: name}
		rec.History = []broker.Transition{{At: now, To: broker.State(broker.MachineRequested), Reason: "slurm_resume",
			Detail: fmt.Sprintf("slurm node %s: %s %s, projected %s %s", name, offers[0].Provider, offers[0].InstanceType, burst.Money(cost), fleet.Currency(d.cfg()))}}
		var scope string
		zone := fleet.Zone(d.cfg())
		err = d.fleet.PutRecordLocked(ctx, rec, nil, func(tx broker.Tx) error {
			if offers[0].Prepaid {
				return nil
			}
			_, err := broker.Reserve(tx, id, team, cost, now, zone)
			if errors.Is(err, broker.ErrBudgetExceeded) {
				scope = exhaustedScope(tx, team, cost, now, zone)
			}
			return err
		})
		if errors.Is(err, broker.ErrBudgetExceeded) {
			d.st.Unlock()
			r.Action, r.Reason = "refused", "spillway: budget "+scope+" exhausted"
			d.log.Info("slurm resume refused by the budget", "node", name, "team", team, "err", err)
			down = append(down, r)
			res.Nodes = append(res.Nodes, r)
			continue
		}
		if err != nil {
			d.st.Unlock()
			return res, err
		}
		d.log.Info("slurm resume", "node", name, "record", id, "offer", offers[0].Key(), "team", team, "projected", cost.String())
		d.fleet.StartWorkerLocked(wctx, id, d.fleet.LaunchWorker)
		d.st.Unlock()
		r.Action, r.Record, r.Offer = "launching", id, offers[0].Key()
		res.Nodes = append(res.Nodes, r)
	}
	for _, r := range down {
		d.down(ctx, cmds, r.Node, r.Reason)
		for _, j := range jobs {
			if jn, err := slurm.Expand(j.Nodes); err == nil && slices.Contains(jn, r.Node) {
				if err := cmds.SetJobComment(ctx, fmt.Sprint(j.JobID), r.Reason); err != nil {
					d.log.Warn("slurm: set job comment", "job", j.JobID, "err", err)
				}
			}
		}
	}
	return res, nil
}

// exhaustedScope names the budget a reservation of amount would pass: the
// team's when it has one that is too small, else the global one.
func exhaustedScope(tx broker.Tx, team string, amount billing.Amount, now time.Time, loc *time.Location) string {
	b, ok, err := broker.GetBudget(tx, team)
	if err == nil && ok {
		m, err := broker.GetBudgetMonth(tx, now.In(loc).Format("2006-01"), team)
		if err == nil && m.Committed()+amount > b.Limit {
			return team
		}
	}
	return broker.GlobalScope
}

// Down sets a node DOWN with a reason sinfo -R shows (a failed launch of
// its machine, fleet.Broker's SlurmDown).
func (d *Door) Down(ctx context.Context, node, reason string) {
	d.down(ctx, d.commands(), node, reason)
}

func (d *Door) down(ctx context.Context, cmds slurm.Commands, node, reason string) {
	reason = strings.Join(strings.Fields(reason), " ")
	if len(reason) > 200 {
		reason = reason[:200]
	}
	if err := cmds.SetState(ctx, node, "DOWN", reason); err != nil {
		d.log.Warn("slurm: set node down", "node", node, "reason", reason, "err", err)
	}
}

// entryFor is the first slurm.nodes entry matching the node; the node's
// partitions and features are read only when an entry asks.
func (d *Door) entryFor(ctx context.Context, name string) (config.SlurmNodes, bool, error) {
	var info *slurm.Node
	for _, e := range d.cfg().Slurm.Nodes {
		if e.Names != "" {
			names, _ := slurm.Expand(e.Names)
			if !slices.Contains(names, name) {
				continue
			}
		}
		if e.Partition != "" || e.Feature != "" {
			if info == nil {
				n, err := d.commands().ShowNode(ctx, name)
				if err != nil {
					return config.SlurmNodes{}, false, err
				}
				info = &n
			}
			if e.Partition != "" && !slices.Contains(info.Partitions, e.Partition) {
				continue
			}
			if e.Feature != "" && !slices.Contains(info.Features, e.Feature) {
				continue
			}
		}
		return e, true, nil
	}
	return config.SlurmNodes{}, false, nil
}

// offersLocked lists the cached offers an entry selects, cheapest first
// (selector order breaks ties).
func (d *Door) offersLocked(e config.SlurmNodes) []providers.Offer {
	type ranked struct {
		o    providers.Offer
		rank int
	}
	var out []ranked
	seen := map[string]bool{}
	all := d.fleet.OffersLocked()
	for rank, sel := range e.Offers {
		for _, o := range all {
			if seen[o.Key()] || !selects(sel, o) {
				continue
			}
			seen[o.Key()] = true
			out = append(out, ranked{o, rank})
		}
	}
	sort.SliceStable(out, func(a, b int) bool {
		if out[a].o.PricePerHour != out[b].o.PricePerHour {
			return out[a].o.PricePerHour < out[b].o.PricePerHour
		}
		return out[a].rank < out[b].rank
	})
	offers := make([]providers.Offer, len(out))
	for i, r := range out {
		offers[i] = r.o
	}
	return offers
}

func selects(sel config.SlurmOffer, o providers.Offer) bool {
	switch {
	case sel.Provider != "" && sel.Provider != o.Provider,
		sel.InstanceType != "" && sel.InstanceType != o.InstanceType,
		sel.GPUModel != "" && !strings.EqualFold(sel.GPUModel, o.GPUModel),
		sel.Spot == "true" && !o.Spot,
		sel.Spot == "false" && o.Spot:
		return false
	}
	return true
}
