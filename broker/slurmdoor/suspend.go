package slurmdoor

import (
	"cmp"
	"context"
	"path"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/bootstrap"
)

// Suspend ends the machines behind the nodes: each record goes to
// draining and a worker waits out the node's running jobs (draining it in
// Slurm if it has any), records its jobs for the ledger, stops slurmd and
// deletes the machine.
func (d *Door) Suspend(ctx context.Context, names []string) (api.SlurmResult, error) {
	var res api.SlurmResult
	for _, name := range names {
		r := api.SlurmNodeResult{Node: name, Action: "none"}
		wctx, live, err := d.liveRecord(name)
		if err != nil {
			return res, err
		}
		if live == nil {
			res.Nodes = append(res.Nodes, r)
			continue
		}
		r.Action, r.Record = "suspending", live.ID
		if live.State == broker.MachineRequested || live.State == broker.MachineProvisioning || live.State == broker.MachineBootstrapping {
			// Slurm gave up on the node while it was starting: its
			// ResumeTimeout set it DOWN, which ends the launch's wait for
			// registration, and the failed launch deletes the machine.
			d.log.Info("slurm suspend of a node still starting; its launch ends when slurmctld has it DOWN", "node", name, "record", live.ID, "state", live.State)
			r.Action = "failing"
			res.Nodes = append(res.Nodes, r)
			continue
		}
		_, err = d.fleet.Update(ctx, live.ID, func(rr *broker.InstanceRecord, now time.Time) ([]*broker.Job, func(broker.Tx) error) {
			if rr.State != broker.MachineDraining && rr.State != broker.MachineTerminating {
				rr.Transit(now, broker.MachineDraining, "slurm_suspend", "slurmctld suspends node "+name)
			}
			return nil, nil
		})
		if err != nil {
			return res, err
		}
		d.st.Lock()
		d.fleet.StartWorkerLocked(wctx, live.ID, d.suspendWorker)
		d.st.Unlock()
		res.Nodes = append(res.Nodes, r)
	}
	return res, nil
}

// suspendWorker carries a draining Slurm record to deletion. A launch
// worker still running for it sees the state change and stops.
func (d *Door) suspendWorker(ctx context.Context, id string) {
	rec, prov := d.fleet.Record(id)
	if rec == nil || rec.State != broker.MachineDraining {
		return
	}
	cmds := d.commands()
	log := d.log.With("record", id, "node", rec.SlurmNode)
	drained := false
	for ctx.Err() == nil && rec.ReadyAt != nil {
		jobs, err := cmds.Jobs(ctx, []string{rec.SlurmNode})
		if err != nil {
			log.Warn("slurm: list jobs on a suspending node", "err", err)
			break
		}
		d.mergeJobs(ctx, []string{rec.SlurmNode}, jobs)
		running := 0
		for _, j := range jobs {
			if j.End.IsZero() && !j.Start.IsZero() {
				running++
			}
		}
		if running == 0 {
			break
		}
		if !drained {
			if err := cmds.SetState(ctx, rec.SlurmNode, "DRAIN", "spillway: suspending"); err != nil {
				log.Warn("slurm: drain", "err", err)
			}
			drained = true
		}
		select {
		case <-ctx.Done():
			return
		case <-d.clock.After(d.cfg().Slurm.PollEvery.D()):
		}
	}
	if ctx.Err() != nil {
		return
	}
	if rec.SSHHost != "" && prov != nil && d.fleet.Signer() != nil {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err := bootstrap.RunScripts(cctx, d.target(rec, prov), []bootstrap.ScriptStep{{Name: "stop slurmd", Script: stopSlurmdScript(d.pidFile(rec.SlurmNode))}},
			bootstrap.ScriptOptions{ConnectTimeout: 30 * time.Second, CommandTimeout: 30 * time.Second})
		cancel()
		if err != nil {
			log.Warn("slurm: stop slurmd", "err", err)
		}
	}
	if _, err := d.fleet.Update(ctx, id, func(r *broker.InstanceRecord, now time.Time) ([]*broker.Job, func(broker.Tx) error) {
		if r.State == broker.MachineDraining {
			r.Transit(now, broker.MachineTerminating, "slurm_suspend", "slurmd stopped; deleting the machine")
		}
		return nil, nil
	}); err != nil {
		log.Error("slurm: terminate record", "err", err)
		return
	}
	if rec.ProviderID == "" {
		d.fleet.CloseRecord(ctx, id, "slurm_suspend", "suspended before the provider created a machine", time.Time{})
		return
	}
	d.fleet.TerminateWorker(ctx, id)
}

// target is the SSH target of a record's machine, its host keys asked of
// the provider.
func (d *Door) target(rec *broker.InstanceRecord, prov providers.Provider) bootstrap.Target {
	return bootstrap.Target{Addr: rec.SSHHost, User: rec.SSHUser, Signer: d.fleet.Signer(),
		HostKeys: func(ctx context.Context) ([]ssh.PublicKey, error) { return prov.HostKeys(ctx, rec.ProviderID) }}
}

// pidFile is where slurmd's pid is kept on the node's machine.
func (d *Door) pidFile(node string) string {
	return path.Join(cmp.Or(d.cfg().Burst.RemoteDir, bootstrap.DefaultRemoteDir), "slurmd-"+node+".pid")
}

func stopSlurmdScript(pidFile string) string {
	q := bootstrap.ShellQuote(pidFile)
	return `if [ -f ` + q + ` ]; then pid=$(cat ` + q + `); kill "$pid" 2>/dev/null || true
  i=0; while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  kill -9 "$pid" 2>/dev/null || true; rm -f ` + q + `; fi`
}
