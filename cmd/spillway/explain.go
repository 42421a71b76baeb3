package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func explainCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "explain JOB",
		Short: "Why a job is where it is: state, queue, nodes, its cards, its log — and what to do",
		Long: `Walk the troubleshooting order for one job and end with the most likely
reason in one sentence:

  1. the job's state and recent history
  2. the queue: its pending reason, its place, the jobs ahead, its team's quota
  3. the cluster: free GPUs of its model, the most free on one node, who holds the rest
  4. its cards: compute, memory and the processes on them
  5. the last attempt's exit and log tail, with out-of-memory detection`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			x, err := c.Explain(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json() {
				return g.printJSON(x)
			}
			fmt.Fprintf(g.stdout, "Job %s (%s), team %s, queue %s, priority %s\n\n", x.Job.ID, x.Job.Spec.Name, x.Job.Spec.Team, x.Job.Spec.Queue, x.Job.Spec.Priority)
			for _, s := range x.Steps {
				fmt.Fprintln(g.stdout, s)
			}
			fmt.Fprintf(g.stdout, "\nMost likely: %s\n", x.Verdict.Sentence)
			return nil
		},
	}
}
