package slurm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Commands runs Slurm's client commands on the broker's host: the host
// needs slurm-client, the site's slurm.conf and a munge socket, as any
// submit host does. Arguments go to the command as they are, never
// through a shell.
type Commands struct {
	// Scontrol, Squeue and Sacct are the programs; default by name on PATH.
	Scontrol, Squeue, Sacct string
	// Env is added to the broker's environment ("SLURM_CONF=/etc/slurm/slurm.conf").
	Env []string
	// Location reads the wall-clock times Slurm prints; default time.Local.
	Location *time.Location
}

// ErrCommand wraps a Slurm command that failed.
var ErrCommand = errors.New("slurm command failed")

func (c Commands) run(ctx context.Context, prog, def string, args ...string) (string, error) {
	if prog == "" {
		prog = def
	}
	cmd := exec.CommandContext(ctx, prog, args...)
	if len(c.Env) > 0 {
		cmd.Env = append(cmd.Environ(), c.Env...)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%w: %s %s: %v: %s", ErrCommand, def, strings.Join(args, " "), err, strings.TrimSpace(tailString(errb.String(), 512)))
	}
	return out.String(), nil
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// SetAddr points slurmctld at the node's machine: scontrol update
// nodename=<node> nodeaddr=<addr> nodehostname=<hostname>.
func (c Commands) SetAddr(ctx context.Context, node, addr, hostname string) error {
	args := []string{"update", "nodename=" + node, "nodeaddr=" + addr}
	if hostname != "" {
		args = append(args, "nodehostname="+hostname)
	}
	_, err := c.run(ctx, c.Scontrol, "scontrol", args...)
	return err
}

// SetState sets a node's state with a reason (DOWN, DRAIN) or without one
// (RESUME, IDLE, POWER_DOWN…).
func (c Commands) SetState(ctx context.Context, node, state, reason string) error {
	args := []string{"update", "nodename=" + node, "state=" + state}
	if reason != "" {
		args = append(args, "reason="+reason)
	}
	_, err := c.run(ctx, c.Scontrol, "scontrol", args...)
	return err
}

// SetJobComment sets a job's comment (squeue -O comment shows it).
func (c Commands) SetJobComment(ctx context.Context, job, comment string) error {
	_, err := c.run(ctx, c.Scontrol, "scontrol", "update", "jobid="+job, "comment="+comment)
	return err
}

// Node is what scontrol show node says about one node.
type Node struct {
	Name       string
	State      string // "IDLE+CLOUD", "DOWN+CLOUD+POWERED_DOWN", "ALLOCATED#"…
	Partitions []string
	Features   []string
	Addr       string
	Reason     string
}

// Has reports whether State carries flag ("DOWN", "POWERING_UP",
// "NOT_RESPONDING", …).
func (n Node) Has(flag string) bool {
	for _, f := range strings.FieldsFunc(n.State, func(r rune) bool { return r == '+' }) {
		if strings.TrimRight(f, "*~#!%$@^-") == flag {
			return true
		}
	}
	return false
}

// ShowNode reads one node (scontrol show node -o).
func (c Commands) ShowNode(ctx context.Context, node string) (Node, error) {
	out, err := c.run(ctx, c.Scontrol, "scontrol", "show", "node", "-o", node)
	if err != nil {
		return Node{}, err
	}
	return ParseNode(out)
}

// ParseNode reads one line of `scontrol show node -o`.
func ParseNode(line string) (Node, error) {
	kv := parseKV(line)
	n := Node{Name: kv["NodeName"], State: kv["State"], Addr: kv["NodeAddr"], Reason: kv["Reason"]}
	if n.Name == "" {
		return Node{}, fmt.Errorf("scontrol show node: no NodeName in %q", tailString(line, 200))
	}
	n.Partitions = splitList(kv["Partitions"])
	n.Features = splitList(kv["AvailableFeatures"])
	return n, nil
}

// parseKV reads "Key=Value Key=Value…"; Reason runs to the end of the
// line's "Reason=… [user@time]" part, since it may hold spaces.
func parseKV(line string) map[string]string {
	out := map[string]string{}
	line = strings.TrimSpace(line)
	if i := strings.Index(line, " Reason="); i >= 0 {
		out["Reason"] = strings.TrimSpace(line[i+len(" Reason="):])
		line = line[:i]
	}
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		if ok {
			if _, seen := out[k]; !seen {
				out[k] = v
			}
		}
	}
	return out
}

func splitList(s string) []string {
	if s == "" || s == "(null)" {
		return nil
	}
	return strings.Split(s, ",")
}

// Job is one Slurm job as the broker records it on a burst machine: who
// ran it, where, with how many GPUs, from when to when.
type Job struct {
	ID        string `json:"id"`
	Account   string `json:"account,omitempty"`
	User      string `json:"user,omitempty"`
	Partition string `json:"partition,omitempty"`
	// GPUs is the job's GPUs per node (its gres/gpu), 0 when it asked none.
	GPUs  int       `json:"gpus"`
	Nodes []string  `json:"nodes,omitempty"`
	State string    `json:"state,omitempty"`
	Start time.Time `json:"start,omitempty"`
	// End is zero while the job runs.
	End time.Time `json:"end,omitempty"`
}

// squeueFormat is what Jobs asks squeue for, '|'-separated: job id,
// account, user, partition, tres per node, start, end, state, nodes.
const squeueFormat = "%A|%a|%u|%P|%b|%S|%e|%T|%N"

// Jobs lists the jobs squeue knows on the given nodes, ended ones included
// while slurmctld keeps them (MinJobAge).
func (c Commands) Jobs(ctx context.Context, nodes []string) ([]Job, error) {
	if len(nodes) == 0 {
		return nil, nil
	}
	out, err := c.run(ctx, c.Squeue, "squeue", "-h", "-t", "all", "-w", Compress(nodes), "-o", squeueFormat)
	if err != nil {
		return nil, err
	}
	return ParseSqueue(out, c.loc())
}

// JobsByID lists the given jobs, pending ones included.
func (c Commands) JobsByID(ctx context.Context, ids []string) ([]Job, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	out, err := c.run(ctx, c.Squeue, "squeue", "-h", "-t", "all", "-j", strings.Join(ids, ","), "-o", squeueFormat)
	if err != nil {
		return nil, err
	}
	return ParseSqueue(out, c.loc())
}

func (c Commands) loc() *time.Location {
	if c.Location != nil {
		return c.Location
	}
	return time.Local
}

// ParseSqueue reads lines in squeueFormat.
func ParseSqueue(out string, loc *time.Location) ([]Job, error) {
	var jobs []Job
	for i, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		f := strings.Split(line, "|")
		if len(f) != 9 {
			return nil, fmt.Errorf("squeue line %d: %d fields, want 9: %q", i+1, len(f), tailString(line, 200))
		}
		j := Job{ID: f[0], Account: f[1], User: f[2], Partition: f[3], GPUs: GPUsOf(f[4]), State: f[7]}
		if f[8] != "" && f[8] != "(null)" {
			nodes, err := Expand(f[8])
			if err != nil {
				return nil, fmt.Errorf("squeue line %d: nodes: %w", i+1, err)
			}
			j.Nodes = nodes
		}
		j.Start, _ = ParseTime(f[5], loc)
		j.End, _ = ParseTime(f[6], loc)
		if j.State == "RUNNING" || j.State == "COMPLETING" || j.State == "PENDING" || j.State == "CONFIGURING" {
			j.End = time.Time{} // squeue prints the expected end of a live job
		}
		if j.State == "PENDING" {
			j.Start = time.Time{}
		}
		jobs = append(jobs, j)
	}
	return jobs, nil
}

// ParseTime reads a Slurm timestamp ("2026-12-01T16:09:55") in loc;
// "Unknown", "None", "N/A" and "" are the zero time, with ok false.
func ParseTime(s string, loc *time.Location) (time.Time, bool) {
	switch s {
	case "", "Unknown", "None", "N/A", "NONE":
		return time.Time{}, false
	}
	t, err := time.ParseInLocation("2006-01-02T15:04:05", s, loc)
	if err != nil {
		return time.Time{}, false
	}
	return t.UTC(), true
}

// GPUsOf reads the GPU count from a TRES string: squeue's tres-per-node
// ("gres:gpu:2", "gres/gpu:h100:2", "gres:gpu") or sacct's AllocTRES
// ("cpu=1,mem=1G,node=1,gres/gpu=2,gres/gpu:h100=2"). A typed count and
// an untyped one name the same cards; the untyped wins when both appear.
func GPUsOf(tres string) int {
	untyped, typed := -1, 0
	for _, item := range strings.Split(tres, ",") {
		item = strings.TrimSpace(item)
		if k, v, ok := strings.Cut(item, "="); ok { // sacct: gres/gpu=2, gres/gpu:h100=2
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				continue
			}
			switch {
			case k == "gres/gpu":
				untyped = n
			case strings.HasPrefix(k, "gres/gpu:"):
				typed += n
			}
			continue
		}
		// squeue: gres:gpu:2, gres/gpu:h100:2, gres:gpu (one)
		item = strings.TrimPrefix(strings.TrimPrefix(item, "gres:"), "gres/")
		if item != "gpu" && !strings.HasPrefix(item, "gpu:") {
			continue
		}
		parts := strings.Split(item, ":")
		n := 1
		if len(parts) > 1 {
			if v, err := strconv.Atoi(parts[len(parts)-1]); err == nil && v >= 0 {
				n = v
			}
		}
		typed += n
	}
	if untyped >= 0 {
		return untyped
	}
	return typed
}
