package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/client"
)

func runCmd(g *globals) *cobra.Command {
	var s broker.Spec
	var timeout, gpuMemory, array string
	var env []string
	var wait bool
	var rt runFlags
	cmd := &cobra.Command{
		Use:   "run [flags] -- command [args...]",
		Short: "Submit a command as a job (srun-like); --wait streams its log and exits with its code",
		Example: `  spillway run --gpus 1 --time 2h -- python train.py
  spillway run --image registry.example.com/nlp/train:1.2 --memory 32Gi -- python train.py
  spillway run --gpus 8 --time 30m --queue high_perf --wait -- torchrun --nproc-per-node 8 train.py
  spillway run --gpus 1 --time 1h --array 0-99%10 -- sh -c 'python shard.py --index $SPILLWAY_ARRAY_INDEX'`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			s.Command = args
			if timeout != "" {
				d, err := broker.ParseDuration(timeout)
				if err != nil {
					return fmt.Errorf("--time: %w", err)
				}
				s.Timeout = broker.Duration(d)
			}
			if gpuMemory != "" {
				q, err := broker.ParseQuantity(gpuMemory)
				if err != nil {
					return fmt.Errorf("--gpu-memory: %w", err)
				}
				s.Resources.GPUMemory = broker.Quantity(q)
			}
			for _, kv := range env {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return fmt.Errorf("--env %q: want KEY=value", kv)
				}
				if s.Env == nil {
					s.Env = map[string]string{}
				}
				s.Env[k] = v
			}
			if err := rt.apply(&s); err != nil {
				return err
			}
			if array != "" {
				// Before the working directory is packed and sent: a
				// mistyped range should not cost an upload first.
				if _, _, err := broker.ParseArray(array); err != nil {
					return fmt.Errorf("--array: %v (%s)", err, broker.ArrayHint)
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if err := rt.upload(ctx, g, c, &s); err != nil {
				return err
			}
			if array != "" {
				sub, err := c.SubmitArraySpec(ctx, s, array)
				if err != nil {
					return err
				}
				if sub.Array == nil {
					return fmt.Errorf("--array %s: the broker made one job (%s), not an array; is it older than this CLI?", array, sub.Job.ID)
				}
				if !wait {
					return printArraySubmitted(g, sub.Array)
				}
				fmt.Fprintf(g.stderr, "spillway: submitted array %s (%d jobs); waiting for all of them (Ctrl-C stops waiting, the jobs keep going)\n", sub.Array.ArrayID, sub.Array.Count)
				return waitForArray(ctx, g, c, sub.Array.ArrayID)
			}
			j, err := c.SubmitSpec(ctx, s)
			if err != nil {
				return err
			}
			if !wait {
				if g.json() {
					return g.printJSON(j)
				}
				fmt.Fprintf(g.stdout, "submitted %s\n", j.ID)
				return nil
			}
			fmt.Fprintf(g.stderr, "spillway: submitted %s; waiting for it (Ctrl-C stops waiting, the job keeps going)\n", j.ID)
			return waitForJob(ctx, g, c, j.ID)
		},
	}
	f := cmd.Flags()
	f.IntVar(&s.Resources.GPUs, "gpus", 1, "whole GPUs per node")
	f.StringVar(&timeout, "time", "", "timeout, e.g. 30m, 2h (default: the queue's)")
	f.StringVar(&s.Queue, "queue", "", "queue (default: default)")
	f.StringVar(&s.Priority, "priority", "", "priority class: low, medium, high")
	f.StringVar(&s.Name, "name", "", "job name (default: the command's name)")
	f.StringVar(&s.Team, "team", "", "team (default: your token's)")
	f.StringVar(&s.Project, "project", "", "project")
	f.StringVar(&s.Resources.GPUModel, "gpu-model", "", "GPU model constraint, e.g. H100")
	f.StringVar(&gpuMemory, "gpu-memory", "", "GPU memory needed per card, e.g. 20Gi (below a card's memory → may share)")
	f.IntVar(&s.Resources.Nodes, "nodes", 1, "nodes (more than 1: gang-scheduled)")
	f.BoolVar(&s.Preemptible, "preemptible", false, "may be preempted by higher-priority work (gets its checkpoint signal first)")
	f.StringVar((*string)(&s.Burst), "burst", "", "burst policy: never, allowed, prefer")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=value (repeatable)")
	f.BoolVar(&wait, "wait", false, "wait for the job: stream its log, exit with its exit code (with --array: wait for every element, say how many are in each state, exit with the highest exit code, as sbatch --wait does)")
	f.StringVar(&array, "array", "", arrayFlagUsage)
	rt.register(f)
	return cmd
}

// waitForJob streams a job's log until it ends and turns its end into the
// process's exit status: the job's own exit code, 124 for a timeout, 130
// when cancelled.
func waitForJob(ctx context.Context, g *globals, c *client.Client, id string) error {
	progress := &waitProgress{w: g.stderr}
	rc := jobReconnector(g.stderr, id)
	for {
		j, err := jobRetrying(ctx, c, id, rc)
		if err != nil {
			return err
		}
		if j.State == broker.StatePending || j.State == broker.StateProvisioning {
			progress.job(ctx, c, j)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(500 * time.Millisecond):
			}
			continue
		}
		progress.done(ctx, c)
		break
	}
	if err := followLogs(ctx, c, id, client.LogOptions{Follow: true, Tail: -1}, g.stdout, rc); err != nil && ctx.Err() == nil {
		return fmt.Errorf("stream log: %w", err)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// The log ends when the job does; read its final state.
	for {
		j, err := jobRetrying(ctx, c, id, rc)
		if err != nil {
			return err
		}
		if j.State.Terminal() {
			last := j.History[len(j.History)-1]
			fmt.Fprintf(g.stderr, "spillway: %s %s: %s\n", j.ID, j.State, last.Detail)
			if code := exitStatus(j); code != 0 {
				return exitError{code}
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// exitStatus is what `run --wait` exits with for an ended job: 0 when it
// succeeded, its own exit code, 124 for a timeout, 130 when cancelled, 1
// when it ended with no code of its own.
func exitStatus(j *broker.Job) int {
	switch {
	case j.State == broker.StateSucceeded:
		return 0
	case j.State == broker.StateTimedOut:
		return 124
	case j.State == broker.StateCancelled:
		return 130
	case j.ExitCode != nil && *j.ExitCode != 0:
		return *j.ExitCode
	}
	return 1
}

// waitForArray waits until every element of an array has ended, saying
// on stderr how many are in each state whenever that changes, and then
// exits as sbatch --wait does for an array: 0 when every element
// succeeded, else the highest exit status among them (exitStatus), after
// naming the elements that did not succeed.
func waitForArray(ctx context.Context, g *globals, c *client.Client, id string) error {
	rc := &reconnector{w: g.stderr, meanwhile: "the jobs of array " + id + " keep going"}
	last := ""
	for {
		v, err := arrayRetrying(ctx, c, id, rc)
		if err != nil {
			return err
		}
		if counts := arrayCounts(v); counts != last {
			fmt.Fprintf(g.stderr, "spillway: array %s: %s\n", id, counts)
			last = counts
		}
		if v.Active() == 0 {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	// The elements that did not succeed, a page at a time.
	var bad []*broker.Job
	o := client.ListOptions{Array: id, States: []broker.State{broker.StateFailed, broker.StateTimedOut, broker.StateCancelled}, Limit: 500}
	for {
		page, err := c.Jobs(ctx, o)
		if err != nil {
			return fmt.Errorf("list the elements of array %s that did not succeed: %w", id, err)
		}
		bad = append(bad, page.Jobs...)
		if page.Next == "" {
			break
		}
		o.Cursor = page.Next
	}
	if len(bad) == 0 {
		fmt.Fprintf(g.stderr, "spillway: array %s: every element succeeded\n", id)
		return nil
	}
	slices.SortFunc(bad, func(a, b *broker.Job) int { return cmp.Compare(arrayIndex(a), arrayIndex(b)) })
	worst := 0
	var named []string
	for i, j := range bad {
		code := exitStatus(j)
		worst = max(worst, code)
		if i < arrayShown {
			named = append(named, fmt.Sprintf("%s %s (%s, exit %d)", jobName(j), j.State, j.ID, code))
		}
	}
	more := ""
	if len(bad) > arrayShown {
		more = fmt.Sprintf(", and %d more (spillway jobs --array %s --all)", len(bad)-arrayShown, id)
	}
	fmt.Fprintf(g.stderr, "spillway: array %s: %d did not succeed: %s%s\n", id, len(bad), strings.Join(named, "; "), more)
	return exitError{worst}
}

// arrayShown is how many of an array's failed elements waitForArray names.
const arrayShown = 10

func arrayIndex(j *broker.Job) int {
	if j.ArrayIndex == nil {
		return -1
	}
	return *j.ArrayIndex
}
