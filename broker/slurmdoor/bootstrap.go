package slurmdoor

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/fleet"
	"github.com/spillway-dev/spillway/broker/slurm"
	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/bootstrap"
)

// Bootstrap brings up a Slurm node's machine (fleet.Broker's
// SlurmBootstrap): point slurmctld at its address, install or check
// slurmd and munge, give it the site's munge key (and config files),
// start `slurmd -D -N <node>`, and wait for slurmctld to see the node
// registered. It replaces the agent bootstrap for records with a
// SlurmNode.
func (d *Door) Bootstrap(ctx context.Context, rec *broker.InstanceRecord, prov providers.Provider) error {
	cfg := d.cfg().Slurm
	if cfg == nil {
		return &fleet.StepError{Step: "slurm bootstrap", Err: errors.New("the broker config has no slurm: section any more")}
	}
	cmds := d.commands()
	host := rec.SSHHost
	if h, _, err := net.SplitHostPort(rec.SSHHost); err == nil {
		host = h
	}
	if err := cmds.SetAddr(ctx, rec.SlurmNode, host, cfg.Node.Hostname); err != nil {
		return &fleet.StepError{Step: "slurm node address", Err: err}
	}
	steps, err := slurmdSteps(cfg, rec.SlurmNode, d.pidFile(rec.SlurmNode))
	if err != nil {
		return &fleet.StepError{Step: "slurm bootstrap", Err: err}
	}
	started := d.clock.Now()
	tr, err := bootstrap.RunScripts(ctx, d.target(rec, prov), steps, bootstrap.ScriptOptions{})
	if err == nil {
		err = d.waitRegistered(ctx, cmds, rec.ID, rec.SlurmNode)
		if err != nil {
			tr.Error = err.Error()
		}
	}
	raw, _ := json.Marshal(tr)
	if err != nil {
		_, _ = d.fleet.Update(ctx, rec.ID, func(r *broker.InstanceRecord, _ time.Time) ([]*broker.Job, func(broker.Tx) error) {
			r.Bootstrap = raw
			return nil, nil
		})
		if providers.IsHostKeyMismatch(err) {
			return &fleet.StepError{Step: "bootstrap", Err: fmt.Errorf("host key mismatch, nothing was run: %w", err)}
		}
		return &fleet.StepError{Step: "slurm bootstrap", Err: err}
	}
	_, err = d.fleet.Update(ctx, rec.ID, func(r *broker.InstanceRecord, now time.Time) ([]*broker.Job, func(broker.Tx) error) {
		if r.State != broker.MachineBootstrapping {
			return nil, nil // suspended meanwhile
		}
		r.Bootstrap = raw
		t := now
		r.ReadyAt = &t
		r.Transit(now, broker.MachineReady, "registered", fmt.Sprintf("slurmd %s registered after %s (bootstrap %s)", r.SlurmNode,
			broker.FormatDuration(now.Sub(r.CreatedAt).Truncate(time.Second)), broker.FormatDuration(now.Sub(started).Truncate(time.Second))))
		d.burstLead.WithLabelValues(r.Provider).Observe(now.Sub(r.CreatedAt).Seconds())
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

// waitRegistered returns once slurmctld reports the node up: no longer
// powering up, responding, not DOWN. A DOWN node (slurmctld's
// ResumeTimeout passed, or an operator) or slurm.registerTimeout ends the
// wait with the reason.
func (d *Door) waitRegistered(ctx context.Context, cmds slurm.Commands, id, node string) error {
	ctx, cancel := context.WithTimeout(ctx, d.cfg().Slurm.RegisterTimeout.D())
	defer cancel()
	var last slurm.Node
	for {
		if rec, _ := d.fleet.Record(id); rec == nil || rec.State != broker.MachineBootstrapping {
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
		unpark := d.st.Park()
		select {
		case <-ctx.Done():
			unpark()
			if ctx.Err() == context.DeadlineExceeded {
				return fmt.Errorf("slurmd on %s did not register within %s (state %s)", node, d.cfg().Slurm.RegisterTimeout, cmp.Or(last.State, "unknown"))
			}
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
		unpark()
	}
}
