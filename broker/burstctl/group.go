package burstctl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/providers"
)

// ErrAbandoned answers a launch step for a record that no longer waits
// for it: its gang group was given up (a member had no capacity, or
// failed) while the step ran. The caller deletes what it created.
var ErrAbandoned = errors.New("burst machine abandoned: its gang group was given up")

// launchGroup starts a gang's machines: l.Nodes records of one offer, all
// in one gang group (named after the first), the gang bound to all of
// them, and every machine's projected cost reserved, in one step. When the
// budgets refuse any of them, none starts.
func (c *Controller) launchGroup(ctx context.Context, now time.Time, l burst.Launch, d *burst.Decision) error {
	f := c.Fleet
	if len(l.Jobs) != 1 {
		return fmt.Errorf("gang launch for %d jobs: a group is one gang's", len(l.Jobs))
	}
	j := f.Job(l.Jobs[0])
	if j == nil || j.State != broker.StatePending {
		return nil
	}
	per := l.ProjectedCost / billing.Amount(l.Nodes)
	recs := c.groupRecords(now, l.Offer, l.Fallbacks, l.Nodes, per, l.Team, l.Queue, l.Jobs,
		fmt.Sprintf("%s %s × %d for gang %s, projected %s %s", l.Offer.Provider, l.Offer.InstanceType, l.Nodes, j.ID, burst.Money(l.ProjectedCost), c.currency()))
	jj := j.Clone()
	jj.BindGroup(groupIDs(recs), now, fmt.Sprintf("burst: %d × %s %s requested (group %s)", l.Nodes, l.Offer.Provider, l.Offer.InstanceType, recs[0].ID))
	st := &Step{Jobs: []*broker.Job{jj}, Records: recs}
	if !l.Offer.Prepaid {
		st.Budget = reserveGroup(recs, now, c.zone())
	}
	err := f.Commit(ctx, st)
	if errors.Is(err, broker.ErrBudgetExceeded) {
		d.Reasons[j.ID] = broker.PendingReason{Code: burst.CodeBudget, Message: "burst blocked: " + strings.TrimPrefix(err.Error(), broker.ErrBudgetExceeded.Error()+": ")}
		return nil
	}
	if err != nil {
		return err
	}
	for _, r := range recs {
		f.Launch(ctx, r.ID)
	}
	return nil
}

// groupRecords are n new requested records of one gang group.
func (c *Controller) groupRecords(now time.Time, offer providers.Offer, fallbacks []providers.Offer, n int, cost billing.Amount, team, queue string, jobs []string, detail string) []*broker.InstanceRecord {
	recs := make([]*broker.InstanceRecord, n)
	group := ""
	for i := range recs {
		id := c.Fleet.NewRecordID(now)
		if i == 0 {
			group = id
		}
		recs[i] = &broker.InstanceRecord{ID: id, Provider: offer.Provider, Offer: offer, Fallbacks: fallbacks,
			State: broker.MachineRequested, Team: team, Queue: queue, Jobs: slices.Clone(jobs), ProjectedCost: cost,
			Group: group, GroupSize: n, CreatedAt: now,
			History: []broker.Transition{{At: now, To: broker.State(broker.MachineRequested), Reason: "burst",
				Detail: fmt.Sprintf("member %d of %d: %s", i+1, n, detail)}}}
	}
	return recs
}

func groupIDs(recs []*broker.InstanceRecord) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}

// reserveGroup reserves every member's projected cost: the budgets take
// the whole group or nothing (the step's transaction).
func reserveGroup(recs []*broker.InstanceRecord, now time.Time, zone *time.Location) func(tx broker.Tx) error {
	return func(tx broker.Tx) error {
		for _, r := range recs {
			if _, err := broker.Reserve(tx, r.ID, r.Team, r.ProjectedCost, now, zone); err != nil {
				return err
			}
		}
		return nil
	}
}

// Members are the live records of machine id's gang group, in id order
// (id alone when it is in none).
func (c *Controller) Members(id string) []*broker.InstanceRecord {
	r := c.Fleet.Record(id)
	if r == nil {
		return nil
	}
	if r.Group == "" {
		return []*broker.InstanceRecord{r}
	}
	var out []*broker.InstanceRecord
	for _, m := range c.Fleet.Records() {
		if m.Group == r.Group {
			out = append(out, m)
		}
	}
	return out
}

// giveUp ends every live member of a group as a failed launch: one the
// provider created goes to terminating (to be deleted), one it did not is
// failed; the reservations are released in the step's transaction.
func giveUp(members []*broker.InstanceRecord, now time.Time, reason, detail string) ([]*broker.InstanceRecord, func(tx broker.Tx) error) {
	var out []*broker.InstanceRecord
	for _, m := range members {
		if m.State.Ended() || m.State == broker.MachineTerminating {
			continue
		}
		mm := m.Clone()
		mm.Reason = detail
		if mm.ProviderID != "" {
			mm.Transit(now, broker.MachineTerminating, reason, detail)
		} else {
			t := now
			mm.TerminatedAt = &t
			mm.Transit(now, broker.MachineFailed, reason, detail)
		}
		out = append(out, mm)
	}
	release := func(tx broker.Tx) error {
		for _, m := range out {
			if err := broker.Release(tx, m.ID); err != nil {
				return err
			}
		}
		return nil
	}
	return out, release
}

// failGroup ends a gang group whose launch cannot go on: the gang goes
// back to the queue with the reason, every member's reservation is
// released, and every member the provider created is deleted. It returns
// r's record as written (the caller deletes r's machine; the others are
// deleted here).
func (c *Controller) failGroup(ctx context.Context, r *broker.InstanceRecord, now time.Time, cause error) (*broker.InstanceRecord, error) {
	members := c.Members(r.ID)
	recs, release := giveUp(members, now, "failed", cause.Error())
	jobs := c.unbind(r.ID, now, "burst failed: "+cause.Error())
	if err := c.Fleet.Commit(ctx, &Step{Jobs: jobs, Records: recs, Budget: release}); err != nil {
		return nil, err
	}
	out := r
	for _, m := range recs {
		if m.ID == r.ID {
			out = m
		} else if m.State == broker.MachineTerminating {
			c.Fleet.Delete(ctx, m.ID)
		}
	}
	return out, nil
}

// GroupNextOffer gives up a gang group one of whose members (id) the
// provider had no capacity (or quota) for, and tries the group's next
// offer: every member created is deleted and every reservation released,
// and a new group of the next offer is requested for the gang with its
// reservations, in one step. It reports false, having failed the group,
// when no offer is left or the budgets refuse the next one.
func (c *Controller) GroupNextOffer(ctx context.Context, id string, now time.Time, cause error) (bool, error) {
	f := c.Fleet
	r := f.Record(id)
	if r == nil || r.State != broker.MachineRequested {
		return false, nil // the group was given up already
	}
	members := c.Members(id)
	old, release := giveUp(members, now, "next_offer", fmt.Sprintf("member %s: %v; the group is given up", id, cause))
	waiting, _ := f.OnMachine(id)
	if len(r.Fallbacks) == 0 || len(waiting) != 1 {
		_, err := c.failGroup(ctx, r, now, fmt.Errorf("no offer could be had: %w", cause))
		return false, err
	}
	gang := waiting[0]
	next := r.Fallbacks[0]
	n := r.GroupSize
	cost := burst.ProjectedCost(next, gang.Spec.Timeout.D(), c.Policy.MaxLifetime)
	recs := c.groupRecords(now, next, r.Fallbacks[1:], n, cost, r.Team, r.Queue, r.Jobs,
		fmt.Sprintf("%v; trying %s %s × %d for gang %s", cause, next.Provider, next.InstanceType, n, gang.ID))
	jj := gang.Clone()
	jj.Machine, jj.Machines = recs[0].ID, groupIDs(recs)
	jj.Transit(now, broker.StateProvisioning, "next_offer",
		fmt.Sprintf("burst: %v; %d × %s %s requested (group %s)", cause, n, next.Provider, next.InstanceType, recs[0].ID))
	st := &Step{Jobs: []*broker.Job{jj}, Records: append(old, recs...), Budget: func(tx broker.Tx) error {
		if err := release(tx); err != nil {
			return err
		}
		if next.Prepaid {
			return nil
		}
		return reserveGroup(recs, now, c.zone())(tx)
	}}
	err := f.Commit(ctx, st)
	if errors.Is(err, broker.ErrBudgetExceeded) {
		_, err := c.failGroup(ctx, r, now, fmt.Errorf("no offer could be had: %w; the next is over budget: %v", cause, err))
		return false, err
	}
	if err != nil {
		return false, err
	}
	for _, m := range old {
		if m.State == broker.MachineTerminating {
			f.Delete(ctx, m.ID)
		}
	}
	for _, m := range recs {
		f.Launch(ctx, m.ID)
	}
	return true, nil
}
