package main

import (
	"fmt"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spf13/cobra"
	"github.com/spillway-dev/spillway/broker/client"
)

func queueCmd(g *globals) *cobra.Command {
	var only string
	var limit int
	cmd := &cobra.Command{
		Use:   "queue",
		Short: "The queues: load, and the waiting jobs in order with why each waits",
		Example: `  spillway queue                      # every queue, and the first 20 waiting in each
  spillway queue --queue default -n 200`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 || limit > 1000 {
				return fmt.Errorf("--limit %d: must be between 1 and 1000", limit)
			}
			return show(g, cmd, func(c *client.Client) ([]api.QueueView, error) { return c.Queues(cmd.Context(), limit) },
				func(qs []api.QueueView) error {
					w := g.table()
					fmt.Fprintln(w, "QUEUE\tKIND\tRUNNING\tGPUS\tWAITING\tGPUS WANTED\tTIMEOUT (DEFAULT/MAX)")
					for _, q := range qs {
						if only != "" && q.Name != only {
							continue
						}
						fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%s/%s\n", q.Name, q.Kind, q.Running, q.GPUsRunning, q.Pending, q.GPUsWaiting,
							q.DefaultTimeout, q.MaxTimeout)
					}
					_ = w.Flush()
					for _, q := range qs {
						if (only != "" && q.Name != only) || len(q.Waiting) == 0 {
							continue
						}
						fmt.Fprintf(g.stdout, "\nWaiting in %s:\n", q.Name)
						w = g.table()
						fmt.Fprintln(w, "  #\tJOB\tNAME\tTEAM\tPRIO\tGPUS\tWHY")
						for _, j := range q.Waiting {
							pos, why := "-", "-"
							if j.Reason != nil {
								why = j.Reason.Message
								if j.Reason.Position > 0 {
									pos = fmt.Sprint(j.Reason.Position)
								}
							}
							fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\t%d\t%s\n", pos, j.ID, broker.ElementName(j.Name, j.ArrayIndex), j.Team, j.Priority, j.GPUs, why)
						}
						_ = w.Flush()
						if q.WaitingMore > 0 {
							fmt.Fprintf(g.stdout, "  … and %d more waiting behind them (-n lists up to 1000; spillway explain JOB says where one stands)\n", q.WaitingMore)
						}
					}
					return nil
				})
		},
	}
	cmd.Flags().StringVar(&only, "queue", "", "only this queue")
	cmd.Flags().IntVarP(&limit, "limit", "n", 20, "waiting jobs listed per queue, from the head (at most 1000)")
	return cmd
}
