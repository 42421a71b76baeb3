package main

import (
	"fmt"

	"github.com/spf13/cobra"
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
	cmd := &cobra.Command{Use: "job", Short: "Hold, release or re-prioritise jobs"}
	for _, a := range []struct{ name, short string }{
		{"hold", "Keep pending JOBs from starting or bursting until released (audited)"},
		{"release", "Let held JOBs be scheduled again (audited)"},
	} {
		var reason string
		action := a.name
		sub := &cobra.Command{
			Use:   action + " JOB...",
			Short: a.short,
			Args:  cobra.MinimumNArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := g.client()
				if err != nil {
					return err
				}
				for _, id := range args {
					j, err := c.JobControl(cmd.Context(), id, action, reason)
					if err != nil {
						return fmt.Errorf("%s: %w", id, err)
					}
					fmt.Fprintf(g.stdout, "%s %sd\n", j.ID, map[string]string{"hold": "hel", "release": "release"}[action])
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
	return cmd
}
