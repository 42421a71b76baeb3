package burstctl

import (
	"context"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/providers"
)

// Running records that the provider reports the machine running and
// reachable: its bootstrap begins (Ready follows when its agent
// registers).
func (c *Controller) Running(ctx context.Context, id string, now time.Time, inst providers.Instance) error {
	r := c.Fleet.Record(id)
	if r == nil {
		return broker.ErrNotFound
	}
	if r.State != broker.MachineProvisioning {
		return ErrAbandoned
	}
	rr := r.Clone()
	rr.SSHHost, rr.SSHUser = inst.SSHHost, inst.SSHUser
	rr.Transit(now, broker.MachineBootstrapping, "running", "reachable at "+inst.SSHHost)
	return c.Fleet.Commit(ctx, &Step{Records: []*broker.InstanceRecord{rr}})
}
