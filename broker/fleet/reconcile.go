package fleet

import (
	"context"
	"slices"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/providers"
)

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
