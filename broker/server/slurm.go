package server

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/labstack/echo/v4"
	"golang.org/x/crypto/ssh"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/fleet"
	"github.com/spillway-dev/spillway/broker/slurm"
	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/bootstrap"
)

// The broker as Slurm's burst provider (docs/slurm.md). slurmctld runs
// `spillway slurm resume <hostlist>` when jobs need CLOUD nodes that are
// powered down; the broker gives each node a machine through the burst
// controller's own launch path — a record, a budget reservation in the
// same transaction, the offer and its fallbacks, the SSH bootstrap with
// verified host keys — except that the bootstrap starts slurmd instead of
// the Spillway agent. `spillway slurm suspend` ends the machines. The
// records of Slurm nodes (InstanceRecord.SlurmNode) stay out of the burst
// decision: Slurm, not the idle TTL, says when they go.

// slurmState is the Slurm side of the leader (guarded by Server.mu).
type slurmState struct {
	// ctx is the leader term's context, for the workers resume starts.
	ctx context.Context
}

var errSlurmOff = newError(http.StatusNotFound, "slurm_not_configured", "this broker has no slurm: section in its config (docs/slurm.md)")

func (s *Server) slurmRequest(c echo.Context) (api.SlurmRequest, []string, error) {
	var req api.SlurmRequest
	if s.cfg().Slurm == nil {
		return req, nil, errSlurmOff
	}
	if err := decodeBody(c, 1<<20, &req); err != nil {
		return req, nil, err
	}
	names, err := slurm.Expand(req.Nodes)
	if err != nil {
		return req, nil, errBadRequest("nodes", broker.CodeInvalid, "%v", err)
	}
	if len(names) > 4096 {
		return req, nil, errBadRequest("nodes", broker.CodeOutOfRange, "at most 4096 nodes at once, got %d", len(names))
	}
	return req, names, nil
}

// slurmResume is POST /v1/slurm/resume.
func (s *Server) slurmResume(c echo.Context) error {
	req, names, err := s.slurmRequest(c)
	if err != nil {
		return err
	}
	res, err := s.ResumeSlurm(c.Request().Context(), names, req.Jobs)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, res)
}

// slurmSuspend is POST /v1/slurm/suspend.
func (s *Server) slurmSuspend(c echo.Context) error {
	_, names, err := s.slurmRequest(c)
	if err != nil {
		return err
	}
	res, err := s.SuspendSlurm(c.Request().Context(), names)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, res)
}

func (s *Server) slurmCommands() slurm.Commands {
	if c := s.adapt().Slurm; c != nil {
		return *c
	}
	return slurm.Commands{}
}

// liveSlurmRecordLocked is the record backing a node that has not ended.
func (s *Server) liveSlurmRecordLocked(node string) *broker.InstanceRecord {
	for _, r := range s.fleet.RecordsLocked() {
		if r.SlurmNode == node && !r.State.Ended() {
			return r
		}
	}
	return nil
}

// ResumeSlurm gives each node a machine, unless it has one: the matching
// offers (cheapest first, the rest as fallbacks), a record and its budget
// reservation in one transaction, then the launch worker. A node the
// budget refuses, or that no offer serves, is set DOWN with the reason.
func (s *Server) ResumeSlurm(ctx context.Context, names []string, jobs []api.SlurmResumeJob) (api.SlurmResult, error) {
	cfg := s.cfg().Slurm
	cmds := s.slurmCommands()
	now := s.clock.Now()
	s.fleet.RefreshOffers(ctx, now)
	var res api.SlurmResult
	var down []api.SlurmNodeResult
	for _, name := range names {
		r := api.SlurmNodeResult{Node: name}
		s.lock()
		wctx := s.slurm.ctx
		live := s.liveSlurmRecordLocked(name)
		s.mu.Unlock()
		if wctx == nil {
			return res, errNotLeader
		}
		if live != nil && live.State != broker.MachineDraining && live.State != broker.MachineTerminating {
			r.Action, r.Record, r.Offer = "launched", live.ID, live.Offer.Key()
			res.Nodes = append(res.Nodes, r)
			continue
		}
		entry, ok, err := s.slurmEntryFor(ctx, name)
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
		s.lock()
		offers := s.slurmOffersLocked(entry)
		if len(offers) == 0 {
			s.mu.Unlock()
			r.Action, r.Reason = "failed", "spillway: no provider offers what slurm.nodes says for "+name
			down = append(down, r)
			res.Nodes = append(res.Nodes, r)
			continue
		}
		team := cfg.TeamFor(entry)
		id := newRecordID(now, s.ids)
		cost := offers[0].PricePerHour.MulDiv(cfg.Reserve.D().Milliseconds(), billing.MillisPerHour)
		rec := &broker.InstanceRecord{ID: id, Provider: offers[0].Provider, Offer: offers[0], Fallbacks: offers[1:],
			State: broker.MachineRequested, Team: team, Queue: cfg.Queue, ProjectedCost: cost, CreatedAt: now, SlurmNode: name}
		rec.History = []broker.Transition{{At: now, To: broker.State(broker.MachineRequested), Reason: "slurm_resume",
			Detail: fmt.Sprintf("slurm node %s: %s %s, projected %s %s", name, offers[0].Provider, offers[0].InstanceType, burst.Money(cost), s.currency())}}
		var scope string
		err = s.fleet.PutRecordLocked(ctx, rec, nil, func(tx broker.Tx) error {
			if offers[0].Prepaid {
				return nil
			}
			_, err := broker.Reserve(tx, id, team, cost, now, s.billingZone())
			if errors.Is(err, broker.ErrBudgetExceeded) {
				scope = exhaustedScope(tx, team, cost, now, s.billingZone())
			}
			return err
		})
		if errors.Is(err, broker.ErrBudgetExceeded) {
			s.mu.Unlock()
			r.Action, r.Reason = "refused", "spillway: budget "+scope+" exhausted"
			s.log.Info("slurm resume refused by the budget", "node", name, "team", team, "err", err)
			down = append(down, r)
			res.Nodes = append(res.Nodes, r)
			continue
		}
		if err != nil {
			s.mu.Unlock()
			return res, err
		}
		s.log.Info("slurm resume", "node", name, "record", id, "offer", offers[0].Key(), "team", team, "projected", cost.String())
		s.fleet.StartWorkerLocked(wctx, id, s.fleet.LaunchWorker)
		s.mu.Unlock()
		r.Action, r.Record, r.Offer = "launching", id, offers[0].Key()
		res.Nodes = append(res.Nodes, r)
	}
	for _, r := range down {
		s.slurmDown(ctx, cmds, r.Node, r.Reason)
		for _, j := range jobs {
			if jn, err := slurm.Expand(j.Nodes); err == nil && slices.Contains(jn, r.Node) {
				if err := cmds.SetJobComment(ctx, fmt.Sprint(j.JobID), r.Reason); err != nil {
					s.log.Warn("slurm: set job comment", "job", j.JobID, "err", err)
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

// slurmDown sets a node DOWN with a reason sinfo -R shows.
func (s *Server) slurmDown(ctx context.Context, cmds slurm.Commands, node, reason string) {
	reason = strings.Join(strings.Fields(reason), " ")
	if len(reason) > 200 {
		reason = reason[:200]
	}
	if err := cmds.SetState(ctx, node, "DOWN", reason); err != nil {
		s.log.Warn("slurm: set node down", "node", node, "reason", reason, "err", err)
	}
}

// slurmEntryFor is the first slurm.nodes entry matching the node; the
// node's partitions and features are read only when an entry asks.
func (s *Server) slurmEntryFor(ctx context.Context, name string) (config.SlurmNodes, bool, error) {
	var info *slurm.Node
	for _, e := range s.cfg().Slurm.Nodes {
		if e.Names != "" {
			names, _ := slurm.Expand(e.Names)
			if !slices.Contains(names, name) {
				continue
			}
		}
		if e.Partition != "" || e.Feature != "" {
			if info == nil {
				n, err := s.slurmCommands().ShowNode(ctx, name)
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

// slurmOffersLocked lists the cached offers an entry selects, cheapest
// first (selector order breaks ties).
func (s *Server) slurmOffersLocked(e config.SlurmNodes) []providers.Offer {
	type ranked struct {
		o    providers.Offer
		rank int
	}
	var out []ranked
	seen := map[string]bool{}
	all := s.fleet.OffersLocked()
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

// SuspendSlurm ends the machines behind the nodes: each record goes to
// draining and a worker waits out the node's running jobs (draining it in
// Slurm if it has any), records its jobs for the ledger, stops slurmd and
// deletes the machine.
func (s *Server) SuspendSlurm(ctx context.Context, names []string) (api.SlurmResult, error) {
	var res api.SlurmResult
	for _, name := range names {
		r := api.SlurmNodeResult{Node: name, Action: "none"}
		s.lock()
		wctx := s.slurm.ctx
		live := s.liveSlurmRecordLocked(name)
		s.mu.Unlock()
		if wctx == nil {
			return res, errNotLeader
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
			s.log.Info("slurm suspend of a node still starting; its launch ends when slurmctld has it DOWN", "node", name, "record", live.ID, "state", live.State)
			r.Action = "failing"
			res.Nodes = append(res.Nodes, r)
			continue
		}
		_, err := s.fleet.Update(ctx, live.ID, func(rr *broker.InstanceRecord, now time.Time) ([]*broker.Job, func(broker.Tx) error) {
			if rr.State != broker.MachineDraining && rr.State != broker.MachineTerminating {
				rr.Transit(now, broker.MachineDraining, "slurm_suspend", "slurmctld suspends node "+name)
			}
			return nil, nil
		})
		if err != nil {
			return res, err
		}
		s.lock()
		s.fleet.StartWorkerLocked(wctx, live.ID, s.slurmSuspendWorker)
		s.mu.Unlock()
		res.Nodes = append(res.Nodes, r)
	}
	return res, nil
}

// slurmSuspendWorker carries a draining Slurm record to deletion. A launch
// worker still running for it sees the state change and stops.
func (s *Server) slurmSuspendWorker(ctx context.Context, id string) {
	rec, prov := s.fleet.Record(id)
	if rec == nil || rec.State != broker.MachineDraining {
		return
	}
	cmds := s.slurmCommands()
	log := s.log.With("record", id, "node", rec.SlurmNode)
	drained := false
	for ctx.Err() == nil && rec.ReadyAt != nil {
		jobs, err := cmds.Jobs(ctx, []string{rec.SlurmNode})
		if err != nil {
			log.Warn("slurm: list jobs on a suspending node", "err", err)
			break
		}
		s.mergeSlurmJobs(ctx, []string{rec.SlurmNode}, jobs)
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
		case <-s.clock.After(s.cfg().Slurm.PollEvery.D()):
		}
	}
	if ctx.Err() != nil {
		return
	}
	if rec.SSHHost != "" && prov != nil && s.fleet.Signer() != nil {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		_, err := bootstrap.RunScripts(cctx, s.slurmTarget(rec, prov), []bootstrap.ScriptStep{{Name: "stop slurmd", Script: stopSlurmdScript(s.slurmPidFile(rec.SlurmNode))}},
			bootstrap.ScriptOptions{ConnectTimeout: 30 * time.Second, CommandTimeout: 30 * time.Second})
		cancel()
		if err != nil {
			log.Warn("slurm: stop slurmd", "err", err)
		}
	}
	if _, err := s.fleet.Update(ctx, id, func(r *broker.InstanceRecord, now time.Time) ([]*broker.Job, func(broker.Tx) error) {
		if r.State == broker.MachineDraining {
			r.Transit(now, broker.MachineTerminating, "slurm_suspend", "slurmd stopped; deleting the machine")
		}
		return nil, nil
	}); err != nil {
		log.Error("slurm: terminate record", "err", err)
		return
	}
	if rec.ProviderID == "" {
		s.fleet.CloseRecord(ctx, id, "slurm_suspend", "suspended before the provider created a machine", time.Time{})
		return
	}
	s.fleet.TerminateWorker(ctx, id)
}

func (s *Server) slurmTarget(rec *broker.InstanceRecord, prov providers.Provider) bootstrap.Target {
	return bootstrap.Target{Addr: rec.SSHHost, User: rec.SSHUser, Signer: s.fleet.Signer(),
		HostKeys: func(ctx context.Context) ([]ssh.PublicKey, error) { return prov.HostKeys(ctx, rec.ProviderID) }}
}

func (s *Server) slurmPidFile(node string) string {
	return path.Join(cmp.Or(s.cfg().Burst.RemoteDir, bootstrap.DefaultRemoteDir), "slurmd-"+node+".pid")
}

func stopSlurmdScript(pidFile string) string {
	q := bootstrap.ShellQuote(pidFile)
	return `if [ -f ` + q + ` ]; then pid=$(cat ` + q + `); kill "$pid" 2>/dev/null || true
  i=0; while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  kill -9 "$pid" 2>/dev/null || true; rm -f ` + q + `; fi`
}

// stepSlurmd is the bootstrap of a Slurm node's machine: point slurmctld
// at its address, install or check slurmd and munge, give it the site's
// munge key (and config files), start `slurmd -D -N <node>`, and wait for
// slurmctld to see the node registered. It replaces the agent bootstrap
// for records with a SlurmNode.
func (s *Server) stepSlurmd(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider) error {
	cfg := s.cfg().Slurm
	if cfg == nil {
		return &fleet.StepError{Step: "slurm bootstrap", Err: errors.New("the broker config has no slurm: section any more")}
	}
	cmds := s.slurmCommands()
	host := rec.SSHHost
	if h, _, err := net.SplitHostPort(rec.SSHHost); err == nil {
		host = h
	}
	if err := cmds.SetAddr(ctx, rec.SlurmNode, host, cfg.Node.Hostname); err != nil {
		return &fleet.StepError{Step: "slurm node address", Err: err}
	}
	steps, err := slurmdSteps(cfg, rec.SlurmNode, s.slurmPidFile(rec.SlurmNode))
	if err != nil {
		return &fleet.StepError{Step: "slurm bootstrap", Err: err}
	}
	started := s.clock.Now()
	tr, err := bootstrap.RunScripts(ctx, s.slurmTarget(rec, prov), steps, bootstrap.ScriptOptions{})
	if err == nil {
		err = s.waitSlurmRegistered(ctx, cmds, rec.ID, rec.SlurmNode)
		if err != nil {
			tr.Error = err.Error()
		}
	}
	raw, _ := json.Marshal(tr)
	if err != nil {
		_, _ = s.fleet.Update(ctx, rec.ID, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
			r.Bootstrap = raw
			return nil, nil
		})
		if providers.IsHostKeyMismatch(err) {
			return &fleet.StepError{Step: "bootstrap", Err: fmt.Errorf("host key mismatch, nothing was run: %w", err)}
		}
		return &fleet.StepError{Step: "slurm bootstrap", Err: err}
	}
	_, err = s.fleet.Update(ctx, rec.ID, func(r *broker.InstanceRecord, now time.Time) ([]*broker.Job, func(broker.Tx) error) {
		if r.State != broker.MachineBootstrapping {
			return nil, nil // suspended meanwhile
		}
		r.Bootstrap = raw
		t := now
		r.ReadyAt = &t
		r.Transit(now, broker.MachineReady, "registered", fmt.Sprintf("slurmd %s registered after %s (bootstrap %s)", r.SlurmNode,
			broker.FormatDuration(now.Sub(r.CreatedAt).Truncate(time.Second)), broker.FormatDuration(now.Sub(started).Truncate(time.Second))))
		s.metrics.burstLead.WithLabelValues(r.Provider).Observe(now.Sub(r.CreatedAt).Seconds())
		return nil, nil
	})
	return err
}

// slurmdSteps are the scripts that make a machine the Slurm node.
func slurmdSteps(cfg *config.Slurm, node, pidFile string) ([]bootstrap.ScriptStep, error) {
	q := bootstrap.ShellQuote
	n := cfg.Node
	check := `for p in ` + q(n.Slurmd) + ` munged munge; do command -v "$p" >/dev/null 2>&1 || { echo "$p is not installed" >&2; exit 3; }; done`
	if n.Install {
		check = `missing=""
for p in ` + q(n.Slurmd) + ` munged munge; do command -v "$p" >/dev/null 2>&1 || missing=1; done
if [ -n "$missing" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2 && apt-get install -y -q --no-install-recommends slurmd munge >&2 || exit 4
fi
` + check
	}
	steps := []bootstrap.ScriptStep{{Name: "slurmd and munge installed", Script: check}}
	key, err := os.ReadFile(n.MungeKeyFile)
	if err != nil {
		return nil, fmt.Errorf("read munge key: %w", err)
	}
	keyPath, sock := q(n.MungeKeyPath), q(n.MungeSocket)
	// The key comes on stdin. munged is (re)started when it does not answer
	// on the socket, or when the key changed under it.
	steps = append(steps, bootstrap.ScriptStep{Name: "munge key", Stdin: key, Script: `set -e
umask 077
mkdir -p "$(dirname ` + keyPath + `)" "$(dirname ` + sock + `)"
cat > ` + keyPath + `.spillway
changed=1
if [ -f ` + keyPath + ` ] && cmp -s ` + keyPath + `.spillway ` + keyPath + `; then changed=""; rm -f ` + keyPath + `.spillway; else mv ` + keyPath + `.spillway ` + keyPath + `; fi
if id munge >/dev/null 2>&1; then chown munge: ` + keyPath + ` "$(dirname ` + keyPath + `)" 2>/dev/null || true; fi
chmod 0400 ` + keyPath + `
if [ -z "$changed" ] && munge -n -S ` + sock + ` >/dev/null 2>&1; then exit 0; fi
if [ -f ` + sock + `.pid ]; then kill "$(cat ` + sock + `.pid)" 2>/dev/null || true; sleep 1; fi
munged --force --socket=` + sock + ` --key-file=` + keyPath + ` --pid-file=` + sock + `.pid
i=0; until munge -n -S ` + sock + ` >/dev/null 2>&1; do i=$((i+1)); [ $i -lt 50 ] || { echo "munged does not answer on ` + n.MungeSocket + `" >&2; exit 5; }; sleep 0.1; done`})
	for i, f := range n.ConfigFiles {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read slurm.node.configFiles[%d]: %w", i, err)
		}
		steps = append(steps, bootstrap.ScriptStep{Name: "config " + path.Base(f), Stdin: raw, Script: `set -e
mkdir -p "$(dirname ` + q(f) + `)"
cat > ` + q(f) + `.spillway
if [ -f ` + q(f) + ` ] && cmp -s ` + q(f) + `.spillway ` + q(f) + `; then rm -f ` + q(f) + `.spillway; else chmod 0644 ` + q(f) + `.spillway; mv ` + q(f) + `.spillway ` + q(f) + `; fi`})
	}
	args := []string{q(n.Slurmd), "-D", "-N", q(node)}
	if n.ConfServer != "" {
		args = append(args, "--conf-server", q(n.ConfServer))
	}
	for _, a := range n.SlurmdArgs {
		args = append(args, q(a))
	}
	env := ""
	if len(n.ConfigFiles) > 0 && n.ConfServer == "" {
		env = "SLURM_CONF=" + q(n.ConfigFiles[0]) + " "
	}
	pid := q(pidFile)
	steps = append(steps, bootstrap.ScriptStep{Name: "start slurmd", Script: `set -e
mkdir -p "$(dirname ` + pid + `)"
` + stopSlurmdScript(pidFile) + `
` + env + `setsid ` + strings.Join(args, " ") + ` >"$(dirname ` + pid + `)/slurmd-` + node + `.log" 2>&1 </dev/null &
echo $! > ` + pid + `
sleep 0.5
kill -0 "$(cat ` + pid + `)" 2>/dev/null || { tail -n 20 "$(dirname ` + pid + `)/slurmd-` + node + `.log" >&2; exit 6; }`})
	return steps, nil
}

// waitSlurmRegistered returns once slurmctld reports the node up: no
// longer powering up, responding, not DOWN. A DOWN node (slurmctld's
// ResumeTimeout passed, or an operator) or slurm.registerTimeout ends the
// wait with the reason.
func (s *Server) waitSlurmRegistered(ctx context.Context, cmds slurm.Commands, id, node string) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg().Slurm.RegisterTimeout.D())
	defer cancel()
	var last slurm.Node
	for {
		if rec, _ := s.fleet.Record(id); rec == nil || rec.State != broker.MachineBootstrapping {
			return errors.New("the node was suspended while slurmd started")
		}
		n, err := cmds.ShowNode(ctx, node)
		if err == nil {
			last = n
			switch {
			case n.Has("DOWN"):
				return fmt.Errorf("slurmctld set node %s DOWN: %s", node, cmp.Or(n.Reason, n.State))
			case !n.Has("POWERING_UP") && !n.Has("NOT_RESPONDING") && !n.Has("POWERED_DOWN") && !n.Has("POWER_DOWN"):
				return nil
			}
		}
		unpark := s.park()
		select {
		case <-ctx.Done():
			unpark()
			if ctx.Err() == context.DeadlineExceeded {
				return fmt.Errorf("slurmd on %s did not register within %s (state %s)", node, s.cfg().Slurm.RegisterTimeout, cmp.Or(last.State, "unknown"))
			}
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
		unpark()
	}
}

// slurmLoop reads the jobs on the burst nodes every slurm.pollEvery for the
// ledger, and picks up suspends a previous leader left half done.
func (s *Server) slurmLoop(ctx context.Context) {
	if s.cfg().Slurm == nil {
		return
	}
	s.lock()
	s.slurm.ctx = ctx
	for _, r := range s.fleet.RecordsLocked() {
		id := r.ID
		if r.SlurmNode != "" && r.State == broker.MachineDraining {
			s.fleet.StartWorkerLocked(ctx, id, s.slurmSuspendWorker)
		}
	}
	s.mu.Unlock()
	defer func() {
		s.lock()
		s.slurm.ctx = nil
		s.mu.Unlock()
	}()
	for ctx.Err() == nil {
		s.pollSlurmJobs(ctx)
		select {
		case <-ctx.Done():
			return
		case <-s.clock.After(s.cfg().Slurm.PollEvery.D()):
		}
	}
}

// pollSlurmJobs asks squeue for the jobs on every live Slurm node.
func (s *Server) pollSlurmJobs(ctx context.Context) {
	s.lock()
	var nodes []string
	for _, r := range s.fleet.RecordsLocked() {
		if r.SlurmNode != "" && r.LaunchedAt != nil && !r.State.Ended() {
			nodes = append(nodes, r.SlurmNode)
		}
	}
	s.mu.Unlock()
	if len(nodes) == 0 {
		return
	}
	slices.Sort(nodes)
	nodes = slices.Compact(nodes)
	jobs, err := s.slurmCommands().Jobs(ctx, nodes)
	if err != nil {
		s.log.Warn("slurm: list jobs on burst nodes", "err", err)
		return
	}
	s.mergeSlurmJobs(ctx, nodes, jobs)
}

// mergeSlurmJobs records jobs squeue listed for the queried nodes on the
// live records of their nodes: a job that started while the record's
// machine lived belongs to it. A job recorded as running on a queried
// node that squeue no longer lists ended by now.
func (s *Server) mergeSlurmJobs(ctx context.Context, queried []string, jobs []slurm.Job) {
	now := s.clock.Now()
	s.lock()
	defer s.mu.Unlock()
	byNode := map[string][]slurm.Job{}
	listed := map[string]bool{}
	for _, j := range jobs {
		listed[j.ID] = true
		if j.Start.IsZero() {
			continue
		}
		for _, n := range j.Nodes {
			byNode[n] = append(byNode[n], j)
		}
	}
	for _, r := range s.fleet.RecordsLocked() {
		if r.SlurmNode == "" || r.LaunchedAt == nil || r.State.Ended() || !slices.Contains(queried, r.SlurmNode) {
			continue
		}
		merged := slices.Clone(r.SlurmJobs)
		changed := false
		for _, j := range byNode[r.SlurmNode] {
			if j.Start.Before(r.LaunchedAt.Add(-time.Minute)) {
				continue // ran on an earlier machine of this node
			}
			j.Nodes = nil
			i := slices.IndexFunc(merged, func(o slurm.Job) bool { return o.ID == j.ID })
			switch {
			case i < 0:
				merged = append(merged, j)
				changed = true
			case !equalJob(merged[i], j):
				merged[i] = j
				changed = true
			}
		}
		for i, j := range merged {
			if j.End.IsZero() && !listed[j.ID] {
				merged[i].End = now.UTC()
				merged[i].State = "GONE"
				changed = true
			}
		}
		if !changed {
			continue
		}
		rr := r.Clone()
		rr.SlurmJobs = merged
		if err := s.fleet.PutRecordLocked(ctx, rr, nil, nil); err != nil {
			s.log.Warn("slurm: record jobs", "record", r.ID, "err", err)
		}
	}
}

func equalJob(a, b slurm.Job) bool {
	return a.ID == b.ID && a.Account == b.Account && a.User == b.User && a.Partition == b.Partition && a.GPUs == b.GPUs &&
		a.State == b.State && a.Start.Equal(b.Start) && a.End.Equal(b.End) && slices.Equal(a.Nodes, b.Nodes)
}

// slurmAllocsLocked turns the Slurm jobs recorded on burst machines into
// the meter's allocations: usage lines with the Slurm job id ("slurm:42"),
// the account as project, the user and the partition, on the machine's
// pool. The machine's other GPU-time stays overhead.
func (s *Server) slurmAllocsLocked(cursor time.Time) []billing.Allocation {
	var out []billing.Allocation
	for _, r := range s.fleet.RecordsLocked() {
		if r.SlurmNode == "" || r.LaunchedAt == nil || len(r.SlurmJobs) == 0 {
			continue
		}
		if r.TerminatedAt != nil && !cursor.IsZero() && r.TerminatedAt.Before(cursor.Add(-time.Hour)) {
			continue
		}
		pool := billing.Pool{Kind: s.fleet.PoolKind(r), Name: r.Provider, Node: r.SlurmNode, Provider: r.Provider, Region: r.Offer.Region,
			InstanceType: r.Offer.InstanceType, InstanceID: r.ID}
		for _, j := range r.SlurmJobs {
			gpus := min(j.GPUs, max(r.Offer.GPUs, 0))
			if gpus <= 0 || j.Start.IsZero() {
				continue
			}
			start, end := ms(maxT(j.Start, *r.LaunchedAt)), time.Time{}
			if !j.End.IsZero() {
				end = ms(j.End)
			}
			if r.TerminatedAt != nil && (end.IsZero() || end.After(*r.TerminatedAt)) {
				end = ms(*r.TerminatedAt)
			}
			if !end.IsZero() && !end.After(start) {
				continue
			}
			out = append(out, billing.Allocation{Job: "slurm:" + j.ID, Attempt: 1, Team: r.Team, Project: j.Account, User: j.User,
				Queue: j.Partition, Pool: pool, GPUModel: cmp.Or(r.Offer.GPUModel, "GPU"), Spot: r.Offer.Spot,
				GPUMilli: int64(gpus) * 1000, Start: start, End: end})
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Job < out[b].Job })
	return out
}

func maxT(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
