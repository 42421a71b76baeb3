package burstctl

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
)

// Reclaim records that the provider takes spot machine id back at rc.At
// (now when zero), on a notice seen now (docs/bursting.md, "Spot
// interruptions"). In one step:
//
//   - the notice goes on the record, and the machine moves to draining
//     (reason spot_reclaim), so nothing new is bound to it or started on
//     it; Close later ends it at rc.At at the latest;
//   - the jobs waiting for it go back to the queue keeping their wait
//     (head of their class: they burst again without a new minimum wait);
//   - the jobs running on it are asked to stop with their checkpoint
//     signal, the grace cut to half the time left before the reclaim (the
//     other half is for the checkpoint upload). Each one's end is then
//     Job.EndReclaimed.
//
// It returns the cool-down that keeps the machine's offer out of the
// next decisions (Controller.OfferCoolDown), so they replace the machine
// with another offer, and the jobs it changed. A machine already
// reclaimed, or gone, is left as it is (ok false). The broker (an agent's
// notice) and the simulator (a drawn reclaim) both call it.
func (c *Controller) Reclaim(ctx context.Context, id string, now time.Time, rc broker.Reclaim) (cd burst.CoolDown, jobs int, ok bool, err error) {
	f := c.Fleet
	r := f.Record(id)
	if r == nil || r.Reclaim != nil || r.State.Ended() {
		return burst.CoolDown{}, 0, false, nil
	}
	if rc.At.IsZero() {
		rc.At = now
	}
	rr := r.Clone()
	rr.Reclaim = &rc
	detail := fmt.Sprintf("%s takes the machine back at %s (%s notice, action %s)", r.Provider,
		rc.At.UTC().Format(time.RFC3339), strings.ReplaceAll(rc.Kind, "_", " "), cmp.Or(rc.Action, "stop"))
	if rr.State != broker.MachineTerminating {
		rr.Transit(now, broker.MachineDraining, broker.ReasonSpotReclaim, detail)
	}
	waiting, holding := f.OnMachine(id)
	changed := make([]*broker.Job, 0, len(waiting)+len(holding))
	for _, j := range waiting {
		jj := j.Clone()
		jj.Machine, jj.Machines = "", nil
		jj.Transit(now, broker.StatePending, broker.ReasonSpotReclaim, "burst machine "+id+" is being reclaimed before it ran the job: "+detail)
		changed = append(changed, jj)
	}
	for _, j := range holding {
		grace := j.Spec.Checkpoint.Grace.D()
		if left := rc.At.Sub(now); left > 0 && grace > left/2 {
			grace = left / 2
		}
		jj := j.Clone()
		jj.Stop = &broker.StopRequest{Reason: broker.ReasonSpotReclaim, Detail: "burst machine " + id + ": " + detail,
			Signal: jj.Spec.Checkpoint.Signal, Grace: grace, RequestedAt: now, By: "provider notice"}
		changed = append(changed, jj)
	}
	if err := f.Commit(ctx, &Step{Jobs: changed, Records: []*broker.InstanceRecord{rr}}); err != nil {
		return burst.CoolDown{}, 0, false, err
	}
	cd = burst.CoolDown{Until: now.Add(c.OfferCoolDown), Reason: "spot machine " + id + " reclaimed"}
	return cd, len(changed), true, nil
}
