package config

import (
	"cmp"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// Slurm makes the broker Slurm's burst provider (docs/slurm.md): slurm.conf
// names `spillway slurm resume` and `spillway slurm suspend` as its
// ResumeProgram and SuspendProgram, and each CLOUD node the site declares
// maps to offers here.
type Slurm struct {
	// Team is the budget scope burst nodes are reserved against and the
	// demand team on their overhead lines; a node entry may override it.
	Team string `json:"team"`
	// Queue is the demand queue on their overhead lines; default "slurm".
	Queue string `json:"queue,omitempty"`
	// Reserve is how long a burst node is projected to live when its cost
	// is reserved against the budget (the offer's price × Reserve);
	// default 1h.
	Reserve broker.Duration `json:"reserve,omitempty"`
	// Scontrol, Squeue and Sacct are Slurm's client commands on the
	// broker's host; default by name on PATH.
	Scontrol string `json:"scontrol,omitempty"`
	Squeue   string `json:"squeue,omitempty"`
	Sacct    string `json:"sacct,omitempty"`
	// Env is added to the environment of those commands, e.g.
	// ["SLURM_CONF=/etc/slurm/slurm.conf"].
	Env []string `json:"env,omitempty"`
	// PollEvery is how often the broker reads the jobs on its burst nodes
	// (squeue) for the ledger; default 10s.
	PollEvery broker.Duration `json:"pollEvery,omitempty"`
	// RegisterTimeout bounds the wait for a started slurmd to register with
	// slurmctld; keep it below slurm.conf's ResumeTimeout. Default 5m.
	RegisterTimeout broker.Duration `json:"registerTimeout,omitempty"`
	// Node says how a burst machine becomes a Slurm node.
	Node SlurmNode `json:"node,omitempty"`
	// Nodes maps Slurm node names to offers; the first entry that matches
	// a node wins.
	Nodes []SlurmNodes `json:"nodes"`
}

// SlurmNode is what the bootstrap installs and starts on a burst machine.
type SlurmNode struct {
	// Install runs apt-get install slurmd munge when either is missing;
	// otherwise a machine without them fails its launch.
	Install bool `json:"install,omitempty"`
	// MungeKeyFile is the site's munge key on the broker's host, copied to
	// MungeKeyPath on the machine; default /etc/munge/munge.key.
	MungeKeyFile string `json:"mungeKeyFile,omitempty"`
	// MungeKeyPath is where the key goes on the machine; default
	// /etc/munge/munge.key.
	MungeKeyPath string `json:"mungeKeyPath,omitempty"`
	// MungeSocket is munged's socket on the machine; default
	// /run/munge/munge.socket.2. munged is started when it does not answer.
	MungeSocket string `json:"mungeSocket,omitempty"`
	// ConfigFiles are copied from the broker's host to the same paths on
	// the machine (slurm.conf first, then gres.conf, cgroup.conf…); slurmd
	// runs with SLURM_CONF set to the first. Leave empty when the image
	// carries them, or with ConfServer.
	ConfigFiles []string `json:"configFiles,omitempty"`
	// ConfServer starts slurmd configless (--conf-server host[:port]).
	ConfServer string `json:"confServer,omitempty"`
	// Slurmd is the slurmd program on the machine; default slurmd.
	Slurmd string `json:"slurmd,omitempty"`
	// SlurmdArgs are added to `slurmd -D -N <name>`.
	SlurmdArgs []string `json:"slurmdArgs,omitempty"`
	// Hostname, when set, is given to scontrol as the node's hostname
	// (nodehostname=); default the machine's address.
	Hostname string `json:"hostname,omitempty"`
}

// SlurmNodes matches Slurm nodes and names the offers they burst to.
type SlurmNodes struct {
	// Names is a hostlist ("burst-[1-8]"); Partition and Feature match
	// what scontrol show node says. Every one that is set must match.
	Names     string `json:"names,omitempty"`
	Partition string `json:"partition,omitempty"`
	Feature   string `json:"feature,omitempty"`
	// Team overrides slurm.team for these nodes.
	Team string `json:"team,omitempty"`
	// Offers are tried cheapest first; the rest are the fallbacks.
	Offers []SlurmOffer `json:"offers"`
}

// SlurmOffer selects provider offers; empty fields match any.
type SlurmOffer struct {
	Provider     string `json:"provider,omitempty"`
	InstanceType string `json:"instanceType,omitempty"`
	GPUModel     string `json:"gpuModel,omitempty"`
	// Spot: "" or "any" takes both, "true" spot only, "false" on-demand only.
	Spot string `json:"spot,omitempty"`
}

// slurmDefaults fills the defaults of the slurm section, when present.
func (c *Config) slurmDefaults() {
	s := c.Slurm
	if s == nil {
		return
	}
	s.Queue = cmp.Or(s.Queue, "slurm")
	s.Reserve = cmp.Or(s.Reserve, broker.Duration(time.Hour))
	s.PollEvery = cmp.Or(s.PollEvery, broker.Duration(10*time.Second))
	s.RegisterTimeout = cmp.Or(s.RegisterTimeout, broker.Duration(5*time.Minute))
	s.Node.MungeKeyFile = cmp.Or(s.Node.MungeKeyFile, "/etc/munge/munge.key")
	s.Node.MungeKeyPath = cmp.Or(s.Node.MungeKeyPath, "/etc/munge/munge.key")
	s.Node.MungeSocket = cmp.Or(s.Node.MungeSocket, "/run/munge/munge.socket.2")
	s.Node.Slurmd = cmp.Or(s.Node.Slurmd, "slurmd")
}

func (c *Config) validateSlurm(add func(field, code, format string, args ...any)) {
	s := c.Slurm
	if s == nil {
		return
	}
	if !nameRe.MatchString(s.Team) {
		add("slurm.team", broker.CodeRequired, "is required: the budget scope burst nodes are reserved against (1-63 letters, digits, '.', '_' or '-')")
	}
	if !nameRe.MatchString(s.Queue) {
		add("slurm.queue", broker.CodeInvalid, "must be 1-63 letters, digits, '.', '_' or '-'")
	}
	if s.Reserve.D() < time.Minute {
		add("slurm.reserve", broker.CodeOutOfRange, "must be at least 1m")
	}
	if s.PollEvery.D() < 100*time.Millisecond {
		add("slurm.pollEvery", broker.CodeOutOfRange, "must be at least 100ms")
	}
	if s.RegisterTimeout.D() < time.Second {
		add("slurm.registerTimeout", broker.CodeOutOfRange, "must be at least 1s")
	}
	for i, e := range s.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			add(fmt.Sprintf("slurm.env[%d]", i), broker.CodeInvalid, "must be NAME=value")
		}
	}
	if _, err := os.Stat(s.Node.MungeKeyFile); err != nil {
		add("slurm.node.mungeKeyFile", broker.CodeInvalid, "cannot be read: %v", err)
	}
	for _, p := range []struct{ field, v string }{{"slurm.node.mungeKeyPath", s.Node.MungeKeyPath}, {"slurm.node.mungeSocket", s.Node.MungeSocket}} {
		if !strings.HasPrefix(p.v, "/") || strings.ContainsAny(p.v, "'\n") {
			add(p.field, broker.CodeInvalid, "must be an absolute path without quotes or newlines")
		}
	}
	for i, f := range s.Node.ConfigFiles {
		field := fmt.Sprintf("slurm.node.configFiles[%d]", i)
		if !strings.HasPrefix(f, "/") || strings.ContainsAny(f, "'\n") {
			add(field, broker.CodeInvalid, "must be an absolute path without quotes or newlines")
		} else if _, err := os.Stat(f); err != nil {
			add(field, broker.CodeInvalid, "cannot be read: %v", err)
		}
	}
	for i, a := range append([]string{s.Node.Slurmd, s.Node.ConfServer, s.Node.Hostname}, s.Node.SlurmdArgs...) {
		if strings.ContainsAny(a, "'\n") {
			field := []string{"slurm.node.slurmd", "slurm.node.confServer", "slurm.node.hostname"}[min(i, 2)]
			if i >= 3 {
				field = fmt.Sprintf("slurm.node.slurmdArgs[%d]", i-3)
			}
			add(field, broker.CodeInvalid, "must not hold quotes or newlines")
		}
	}
	if len(s.Nodes) == 0 {
		add("slurm.nodes", broker.CodeRequired, "is required: which nodes burst to which offers")
	}
	provs := map[string]bool{}
	for _, p := range c.Providers {
		provs[p.Name()] = true
	}
	for i, n := range s.Nodes {
		f := fmt.Sprintf("slurm.nodes[%d]", i)
		if n.Names == "" && n.Partition == "" && n.Feature == "" {
			add(f, broker.CodeRequired, "set names, partition or feature")
		}
		if n.Team != "" && !nameRe.MatchString(n.Team) {
			add(f+".team", broker.CodeInvalid, "must be 1-63 letters, digits, '.', '_' or '-'")
		}
		if len(n.Offers) == 0 {
			add(f+".offers", broker.CodeRequired, "is required: at least one offer selector")
		}
		for j, o := range n.Offers {
			of := fmt.Sprintf("%s.offers[%d]", f, j)
			if o.Provider != "" && !provs[o.Provider] && !provs[""] {
				add(of+".provider", broker.CodeInvalid, "unknown provider %q (providers[].name)", o.Provider)
			}
			switch o.Spot {
			case "", "any", "true", "false":
			default:
				add(of+".spot", broker.CodeInvalid, "must be any, true or false")
			}
		}
	}
}

// TeamFor is the budget scope of a node entry.
func (s *Slurm) TeamFor(n SlurmNodes) string { return cmp.Or(n.Team, s.Team) }
