package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spf13/cobra"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/client"
)

func nodesCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "nodes",
		Short: "List nodes: GPUs free and held, state, last heartbeat, unhealthy cards",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(g, cmd, func(c *client.Client) ([]api.NodeView, error) { return c.Nodes(cmd.Context()) },
				func(nodes []api.NodeView) error {
					now := time.Now()
					w := g.table()
					fmt.Fprintln(w, "NODE\tPOOL\tSTATE\tGPUS\tFREE\tMODEL\tDRIVER\tLAST SEEN\tNOTES")
					for _, n := range nodes {
						model := ""
						if len(n.Inventory.Devices) > 0 {
							model = shortGPU(n.Inventory.Devices[0].Model)
						}
						var notes []string
						for _, cv := range n.Cards {
							if cv.Unhealthy != "" {
								notes = append(notes, fmt.Sprintf("GPU %d unhealthy: %s", cv.Index, cv.Unhealthy))
							}
						}
						if c := n.Cache; c != nil {
							notes = append(notes, cacheNote(c))
						}
						fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", n.Name, n.Pool, n.State, len(n.Cards), n.FreeGPUs,
							model, dash(n.Inventory.DriverVersion), ago(now, n.LastSeen), strings.Join(notes, "; "))
					}
					return w.Flush()
				})
		},
	}
}

// cacheNote is a node's input cache for `spillway nodes`: "cache 12.0/50.0
// GB, hit ratio 83% (40/48)".
func cacheNote(c *broker.NodeCache) string {
	return fmt.Sprintf("cache %.1f/%.1f GB, hit ratio %.0f%% (%d/%d)", float64(c.Bytes)/1e9, float64(c.CapBytes)/1e9,
		c.HitRatio*100, c.Hits, c.Hits+c.Misses)
}
