package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func cancelCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "cancel JOB...",
		Short: "Cancel jobs (running ones get their checkpoint signal, the grace period, then a kill)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			failed := 0
			for _, id := range args {
				j, err := c.Cancel(cmd.Context(), id)
				if err != nil {
					fmt.Fprintf(g.stderr, "%s: %v\n", id, err)
					failed++
					continue
				}
				switch {
				case j.ID == "" || j.State == "":
					fmt.Fprintf(g.stderr, "%s: the broker's answer names no job; check with `spillway status %s`\n", id, id)
					failed++
				case j.State.Terminal():
					fmt.Fprintf(g.stdout, "%s cancelled\n", j.ID)
				case j.Stop == nil:
					fmt.Fprintf(g.stdout, "%s stopping (%s)\n", j.ID, j.State)
				default:
					fmt.Fprintf(g.stdout, "%s stopping (%s, then kill after %s)\n", j.ID, j.Stop.Signal, j.Spec.Checkpoint.Grace)
				}
			}
			if failed > 0 {
				return exitError{1}
			}
			return nil
		},
	}
}
