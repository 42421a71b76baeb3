package fleet

import (
	"context"
	"iter"
	"slices"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burstctl"
	"github.com/spillway-dev/spillway/providers"
)

// ctlFleet is the broker's burstctl.Fleet: the fleet's records, offers
// and workers, and the broker's jobs and nodes read through Broker. Every
// method runs with the broker's state lock held.
type ctlFleet struct{ f *Fleet }

var _ burstctl.Fleet = ctlFleet{}

// burstCtl is the burst executor over the broker's fleet, with the
// config's policy, billing zone and currency.
func (f *Fleet) burstCtl() *burstctl.Controller {
	return &burstctl.Controller{Fleet: ctlFleet{f}, Policy: f.cfg().BurstPolicy(), Zone: Zone(f.cfg()), Currency: Currency(f.cfg()),
		OfferCoolDown: f.cfg().Burst.OfferCoolDown.D()}
}

// withBurstCtl runs fn on the executor under the state lock, for the
// workers' steps (a machine created, ready, failed or gone).
func (f *Fleet) withBurstCtl(fn func(c *burstctl.Controller, now time.Time) error) error {
	f.st.Lock()
	defer f.st.Unlock()
	err := fn(f.burstCtl(), f.clock.Now())
	f.st.Kick()
	return err
}

func (c ctlFleet) Job(id string) *broker.Job { return c.f.st.Job(id) }

func (c ctlFleet) Record(id string) *broker.InstanceRecord { return c.f.instances[id] }

func (c ctlFleet) Records() []*broker.InstanceRecord {
	out := make([]*broker.InstanceRecord, 0, len(c.f.instances))
	for _, r := range c.f.instances {
		if !r.State.Ended() {
			out = append(out, r)
		}
	}
	burstctl.SortRecords(out)
	return out
}

func (c ctlFleet) Waiting() []burstctl.Waiting { return c.f.st.Waiting() }

func (c ctlFleet) OnPrem() (gpus, held int) { return c.f.st.OnPrem() }

func (c ctlFleet) MachineJobs(id string) ([]string, int) { return c.f.st.MachineJobs(id) }

func (c ctlFleet) OnMachine(id string) (waiting, holding []*broker.Job) {
	return c.f.st.OnMachine(id)
}

func (c ctlFleet) ReadyGPUs(id string) int {
	if n, ok := c.f.st.Node(id); ok && n.State == broker.NodeReady {
		return len(n.HealthyGPUs())
	}
	return 0
}

func (c ctlFleet) Offers() []providers.Offer { return c.f.OffersLocked() }

func (c ctlFleet) NewRecordID(now time.Time) string { return c.f.st.NewRecordID(now) }

// Commit writes the step's jobs, records and budget change in one
// transaction. A record leaving for good loses its agent token; an ended
// one its node.
func (c ctlFleet) Commit(ctx context.Context, st *burstctl.Step) error {
	f := c.f
	var ended []string
	for _, r := range st.Records {
		if r.State.Ended() {
			ended = append(ended, r.ID)
		}
	}
	err := f.st.Commit(ctx, st.Jobs, ended, func(tx broker.Tx) error {
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
		f.instances[r.ID] = r
		if r.State == broker.MachineDraining {
			f.st.WakeNode(r.ID)
		}
	}
	for _, j := range st.Jobs {
		for _, n := range j.Nodes() {
			f.st.WakeNode(n)
		}
	}
	f.st.Kick()
	return nil
}

func (c ctlFleet) Launch(ctx context.Context, id string) {
	c.f.StartWorkerLocked(ctx, id, c.f.LaunchWorker)
}

func (c ctlFleet) Delete(ctx context.Context, id string) {
	c.f.StartWorkerLocked(ctx, id, c.f.TerminateWorker)
}

// AllOffersLocked yields the providers' last good offers, in no order
// (under the lock).
func (f *Fleet) AllOffersLocked() iter.Seq[providers.Offer] {
	return func(yield func(providers.Offer) bool) {
		for name, offers := range f.offers {
			if _, ok := f.providers[name]; !ok {
				continue
			}
			for _, o := range offers {
				if !yield(o) {
					return
				}
			}
		}
	}
}

// OffersLocked are the providers' last good offers, provider by provider
// in name order.
func (f *Fleet) OffersLocked() []providers.Offer {
	names := make([]string, 0, len(f.offers))
	for name := range f.offers {
		names = append(names, name)
	}
	slices.Sort(names)
	var out []providers.Offer
	for _, name := range names {
		if _, ok := f.providers[name]; ok {
			out = append(out, f.offers[name]...)
		}
	}
	return out
}
