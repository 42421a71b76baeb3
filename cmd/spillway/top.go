package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spf13/cobra"
)

func topCmd(g *globals) *cobra.Command {
	var node string
	var watch time.Duration
	var count int
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Who holds each card and is it computing: model, memory, compute, power, job, team, processes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			if watch > 0 {
				if watch < 500*time.Millisecond {
					return fmt.Errorf("--watch: must be at least 500ms, got %s", watch)
				}
				// Redraw in place every interval, like top; Ctrl-C ends it.
				for i := 0; count == 0 || i < count; i++ {
					if i > 0 {
						select {
						case <-cmd.Context().Done():
							return cmd.Context().Err()
						case <-time.After(watch):
						}
					}
					nodes, err := c.Nodes(cmd.Context())
					if err != nil {
						return err
					}
					fmt.Fprint(g.term, "\x1b[H\x1b[2J")
					fmt.Fprintf(g.stdout, "%s  every %s (Ctrl-C stops)\n\n", time.Now().Format("15:04:05"), watch)
					if err := printTop(g, nodes, node); err != nil {
						return err
					}
				}
				return nil
			}
			nodes, err := c.Nodes(cmd.Context())
			if err != nil {
				return err
			}
			return printTop(g, nodes, node)
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "only this node")
	cmd.Flags().DurationVarP(&watch, "watch", "w", 0, "redraw every interval, e.g. 2s (Ctrl-C stops)")
	cmd.Flags().IntVar(&count, "count", 0, "with --watch: stop after this many screens (0: until Ctrl-C)")
	return cmd
}

// printTop prints the cards table (or JSON) of nodes, or only of node.
func printTop(g *globals, nodes []api.NodeView, node string) error {
	if node != "" {
		nodes = slices.DeleteFunc(nodes, func(n api.NodeView) bool { return n.Name != node })
	}
	if g.json() {
		return g.printJSON(nodes)
	}
	w := g.table()
	fmt.Fprintln(w, "NODE\tGPU\tMODEL\tMEMORY\tCOMPUTE\tPOWER\tJOB\tTEAM\tPROCESSES")
	for _, n := range nodes {
		for _, cv := range n.Cards {
			mem, util, power, procs := "-", "-", "-", ""
			if t := cv.Telemetry; t != nil {
				mem = fmt.Sprintf("%s/%s", gib(t.MemoryUsedBytes), gib(cv.MemoryBytes))
				util = fmt.Sprintf("%d%%", t.SMUtil)
				power = fmt.Sprintf("%.0fW", t.PowerWatts)
				var ps []string
				for _, p := range t.Processes {
					owner := cv.ProcessJobs[p.PID]
					if owner == "" {
						owner = "not a spillway job"
					}
					ps = append(ps, fmt.Sprintf("%d %s (%s)", p.PID, gib(p.UsedMemoryBytes), owner))
				}
				procs = strings.Join(ps, ", ")
			}
			job, team := dash(strings.Join(cv.Jobs, ",")), dash(strings.Join(cv.Teams, ","))
			if cv.Unhealthy != "" {
				job = "UNHEALTHY: " + cv.Unhealthy
			}
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, cv.Index, shortGPU(cv.Model), mem, util, power, job, team, procs)
		}
	}
	return w.Flush()
}

// gib prints bytes as GiB with one decimal.
func gib(b int64) string { return fmt.Sprintf("%.1fGiB", float64(b)/(1<<30)) }
