package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
)

// nodeOpsCmd is `spillway node`: an operator's controls on one node.
func nodeOpsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Operator controls on nodes: cordon, drain, undrain; enrolment: join tokens, revoke"}
	for _, a := range []struct{ name, short string }{
		{"cordon", "Take no new work on NODE; its jobs keep running (operator; audited)"},
		{"drain", "Cordon NODE and send its jobs back to the queue: checkpoint signal, grace, kill (operator; audited)"},
		{"undrain", "Return a cordoned or drained NODE to service (operator; audited)"},
	} {
		var reason string
		action := a.name
		sub := &cobra.Command{
			Use:   action + " NODE",
			Short: a.short,
			Args:  cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := g.client()
				if err != nil {
					return err
				}
				n, err := c.NodeControl(cmd.Context(), args[0], action, reason)
				if err != nil {
					return err
				}
				if g.json() {
					return g.printJSON(n)
				}
				state := "schedulable"
				if n.Cordon != nil {
					state = "cordoned"
					if n.Cordon.Drain {
						state = "draining: its jobs go back to the queue"
					}
				}
				fmt.Fprintf(g.stdout, "%s %s\n", n.Name, state)
				return nil
			},
		}
		sub.Flags().StringVar(&reason, "reason", "", "why (shown on the node and in the audit log)")
		cmd.AddCommand(sub)
	}
	return cmd
}

// jobOpsCmd is `spillway job`: hold, release and re-prioritise jobs.
func jobOpsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "job", Short: "Hold, release or re-prioritise jobs; limit an array's jobs running at once"}
	for _, a := range []struct{ name, short string }{
		{"hold", "Keep pending JOBs, or an ARRAY's waiting jobs, from starting or bursting until released (audited)"},
		{"release", "Let held JOBs, or an ARRAY's held jobs, be scheduled again (audited)"},
	} {
		var reason string
		action := a.name
		done := map[string]string{"hold": "held", "release": "released"}[action]
		sub := &cobra.Command{
			Use:   action + " JOB|ARRAY...",
			Short: a.short,
			Args:  cobra.MinimumNArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := g.client()
				if err != nil {
					return err
				}
				for _, id := range args {
					j, err := c.JobControl(cmd.Context(), id, action, reason)
					var a *api.ArrayChanged
					isArray, err := asArray(id, err, func() (err error) { a, err = c.ArrayControl(cmd.Context(), id, action, reason); return err })
					if isArray {
						fmt.Fprintf(g.stdout, "array %s: %d %s; %s\n", a.ArrayID, len(a.Changed), done, arrayCounts(&a.Array))
						continue
					}
					if err != nil {
						return fmt.Errorf("%s: %w", id, err)
					}
					fmt.Fprintf(g.stdout, "%s %s\n", j.ID, done)
				}
				return nil
			},
		}
		sub.Flags().StringVar(&reason, "reason", "", "why (shown in the job's pending reason and the audit log)")
		cmd.AddCommand(sub)
	}
	var reason string
	prio := &cobra.Command{
		Use:   "priority JOB CLASS",
		Short: "Change an active job's priority class, e.g. high (operator; audited)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			j, err := c.SetPriority(cmd.Context(), args[0], args[1], reason)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "%s priority %s\n", j.ID, j.Spec.Priority)
			return nil
		},
	}
	prio.Flags().StringVar(&reason, "reason", "", "why (audit log)")
	cmd.AddCommand(prio)
	var limitReason string
	limit := &cobra.Command{
		Use:   "limit ARRAY N",
		Short: "Run at most N of ARRAY's jobs at once from now on; 0 lifts the limit (audited)",
		Long: `Change the most jobs of an array that run at once (the %N of
"spillway submit --array 0-999%N"), as Slurm's
"scontrol update JobId=ARRAY ArrayTaskThrottle=N" does. 0 lifts the
limit. Jobs already running above a lowered limit go on; no more start
until fewer run.`,
		Example: "  spillway job limit 01JF… 20",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := strconv.Atoi(args[1])
			if err != nil {
				return fmt.Errorf("N: %q is not a whole number (0 lifts the limit)", args[1])
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			a, err := c.SetArrayLimit(cmd.Context(), args[0], n, limitReason)
			if err != nil {
				return err
			}
			if g.json() {
				return g.printJSON(a)
			}
			what := "no limit"
			if a.Array.Limit > 0 {
				what = fmt.Sprintf("at most %d running at once", a.Array.Limit)
			}
			fmt.Fprintf(g.stdout, "array %s: %s; %s\n", a.ArrayID, what, arrayCounts(&a.Array))
			return nil
		},
	}
	limit.Flags().StringVar(&limitReason, "reason", "", "why (the jobs' history and the audit log)")
	cmd.AddCommand(limit)
	return cmd
}

// arrayCounts is an array's elements by state, briefly: "8 running, 990
// pending (985 held), 2 succeeded".
func arrayCounts(a *api.ArrayView) string {
	var parts []string
	for _, st := range broker.AllStates {
		n := a.States[st]
		if n == 0 {
			continue
		}
		part := fmt.Sprintf("%d %s", n, st)
		if st == broker.StatePending && a.Held > 0 {
			part += fmt.Sprintf(" (%d held)", a.Held)
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, ", ")
}
