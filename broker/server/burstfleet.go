package server

import (
	"context"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burstctl"
	"github.com/spillway-dev/spillway/providers"
)

// serverFleet is the broker's burstctl.Fleet: the state in memory, the
// store's transactions, the launch and terminate workers. Every method
// runs with s.mu held.
type serverFleet struct{ s *Server }

var _ burstctl.Fleet = serverFleet{}

// burstCtl is the burst executor over the broker's fleet, with the
// config's policy, billing zone and currency.
func (s *Server) burstCtl() *burstctl.Controller {
	return &burstctl.Controller{Fleet: serverFleet{s}, Policy: s.cfg().BurstPolicy(), Zone: s.billingZone(), Currency: s.currency(),
		OfferCoolDown: s.cfg().Burst.OfferCoolDown.D()}
}

// withBurstCtl runs fn on the executor under the state lock, for the
// workers' steps (a machine created, ready, failed or gone).
func (s *Server) withBurstCtl(fn func(c *burstctl.Controller, now time.Time) error) error {
	s.lock()
	defer s.mu.Unlock()
	err := fn(s.burstCtl(), s.clock.Now())
	s.kick()
	return err
}

func (f serverFleet) Job(id string) *broker.Job { return f.s.jobs[id] }

func (f serverFleet) Record(id string) *broker.InstanceRecord { return f.s.burst.instances[id] }

func (f serverFleet) Records() []*broker.InstanceRecord {
	out := make([]*broker.InstanceRecord, 0, len(f.s.burst.instances))
	for _, r := range f.s.burst.instances {
		if !r.State.Ended() {
			out = append(out, r)
		}
	}
	burstctl.SortRecords(out)
	return out
}

func (f serverFleet) Waiting() []burstctl.Waiting {
	s := f.s
	var out []burstctl.Waiting
	for _, j := range s.jobs {
		if j.State != broker.StatePending && j.State != broker.StateProvisioning {
			continue
		}
		w := burstctl.Waiting{Job: j}
		if r, ok := s.reasons[j.ID]; ok {
			w.EstimatedStart, w.Why = r.EstimatedStart(), r.Code()
		}
		out = append(out, w)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Job.ID < out[b].Job.ID })
	return out
}

func (f serverFleet) OnPrem() (gpus, held int) {
	s := f.s
	for _, n := range s.nodes {
		if n.Instance != "" || n.State != broker.NodeReady {
			continue
		}
		gpus += len(n.HealthyGPUs())
		taken := map[int]bool{}
		for id := range s.byNode[n.Name] {
			p, _, _ := placedOn(s.jobs[id], n.Name)
			for _, g := range p.GPUs {
				taken[g] = true
			}
		}
		held += len(taken)
	}
	return gpus, held
}

func (f serverFleet) MachineJobs(id string) ([]string, int) { return f.s.machineJobsLocked(id) }

func (f serverFleet) OnMachine(id string) (waiting, holding []*broker.Job) {
	s := f.s
	for _, j := range s.jobs {
		if j.BoundTo(id) {
			waiting = append(waiting, j)
		}
	}
	slices.SortFunc(waiting, func(a, b *broker.Job) int { return strings.Compare(a.ID, b.ID) })
	return waiting, s.holdingOnLocked(id)
}

func (f serverFleet) ReadyGPUs(id string) int {
	if n, ok := f.s.nodes[id]; ok && n.State == broker.NodeReady {
		return len(n.HealthyGPUs())
	}
	return 0
}

func (f serverFleet) Offers() []providers.Offer {
	b := &f.s.burst
	names := make([]string, 0, len(b.offers))
	for name := range b.offers {
		names = append(names, name)
	}
	slices.Sort(names)
	var out []providers.Offer
	for _, name := range names {
		if _, ok := b.providers[name]; ok {
			out = append(out, b.offers[name]...)
		}
	}
	return out
}

func (f serverFleet) NewRecordID(now time.Time) string { return newRecordID(now, f.s.ids) }

// Commit writes the step's jobs, records and budget change in one
// transaction. A record leaving for good loses its agent token; an ended
// one its node.
func (f serverFleet) Commit(ctx context.Context, st *burstctl.Step) error {
	s := f.s
	err := s.commitLocked(ctx, st.Jobs, nil, func(tx broker.Tx) error {
		if st.Budget != nil {
			if err := st.Budget(tx); err != nil {
				return err
			}
		}
		for _, r := range st.Records {
			if r.State == broker.MachineTerminating || r.State.Ended() {
				if err := broker.DeleteInstanceToken(tx, r.TokenSHA256); err != nil {
					return err
				}
			}
			if r.State.Ended() {
				if err := tx.Delete(broker.BucketNodes, r.ID); err != nil {
					return err
				}
			}
			if err := broker.PutInstance(tx, r); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, r := range st.Records {
		s.burst.instances[r.ID] = r
		switch {
		case r.State.Ended():
			delete(s.nodes, r.ID)
			delete(s.telemetry, r.ID)
		case r.State == broker.MachineDraining:
			s.wakeNodeLocked(r.ID)
		}
	}
	s.noteInventoryLocked()
	for _, j := range st.Jobs {
		for _, n := range j.Nodes() {
			s.wakeNodeLocked(n)
		}
	}
	s.kick()
	return nil
}

func (f serverFleet) Launch(ctx context.Context, id string) {
	f.s.startWorkerLocked(ctx, id, f.s.launchWorker)
}

func (f serverFleet) Delete(ctx context.Context, id string) {
	f.s.startWorkerLocked(ctx, id, f.s.terminateWorker)
}
