package main

import (
	"fmt"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spf13/cobra"
	"github.com/spillway-dev/spillway/broker/client"
)

func queueCmd(g *globals) *cobra.Command {
	var only string
	cmd := &cobra.Command{
		Use:   "queue",
		Short: "The queues: load, and the waiting jobs in order with why each waits",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(g, cmd, func(c *client.Client) ([]api.QueueView, error) { return c.Queues(cmd.Context()) },
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
							fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\t%d\t%s\n", pos, j.ID, j.Name, j.Team, j.Priority, j.GPUs, why)
						}
						_ = w.Flush()
					}
					return nil
				})
		},
	}
	cmd.Flags().StringVar(&only, "queue", "", "only this queue")
	return cmd
}
