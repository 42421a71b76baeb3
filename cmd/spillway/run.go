package main

import (
	"context"
	"fmt"
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
			if array != "" && wait {
				return fmt.Errorf("--wait follows one job and --array makes many; drop --wait and follow the array with spillway status ARRAY or spillway jobs --array ARRAY")
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
				return printArraySubmitted(g, sub.Array)
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
	f.BoolVar(&wait, "wait", false, "wait for the job: stream its log, exit with its exit code")
	f.StringVar(&array, "array", "", arrayFlagUsage)
	rt.register(f)
	return cmd
}

// waitForJob streams a job's log until it ends and turns its end into the
// process's exit status: the job's own exit code, 124 for a timeout, 130
// when cancelled.
func waitForJob(ctx context.Context, g *globals, c *client.Client, id string) error {
	progress := &waitProgress{w: g.stderr}
	rc := &reconnector{w: g.stderr, id: id}
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
			switch {
			case j.State == broker.StateSucceeded:
				return nil
			case j.State == broker.StateTimedOut:
				return exitError{124}
			case j.State == broker.StateCancelled:
				return exitError{130}
			case j.ExitCode != nil && *j.ExitCode != 0:
				return exitError{*j.ExitCode}
			}
			return exitError{1}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(300 * time.Millisecond):
		}
	}
}
