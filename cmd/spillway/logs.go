package main

import (
	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker/client"
)

func logsCmd(g *globals) *cobra.Command {
	var o client.LogOptions
	cmd := &cobra.Command{
		Use:   "logs [-f] JOB",
		Short: "Print a job's log; -f follows it until the job ends",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if o.Follow {
				// Through broker restarts, with backoff (the job keeps running).
				return followLogs(cmd.Context(), c, args[0], o, g.stdout, jobReconnector(g.stderr, args[0]))
			}
			return c.Logs(cmd.Context(), args[0], o, g.stdout)
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&o.Follow, "follow", "f", false, "follow the log until the job ends")
	f.IntVar(&o.Tail, "tail", -1, "only the last N lines")
	f.IntVar(&o.Attempt, "attempt", 0, "an earlier attempt's log (default: the latest)")
	return cmd
}
