package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

func nodesCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "nodes",
		Short: "List nodes: GPUs free and held, state, last heartbeat, unhealthy cards",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			nodes, err := c.Nodes(cmd.Context())
			if err != nil {
				return err
			}
			if g.json() {
				return g.printJSON(nodes)
			}
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
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", n.Name, n.Pool, n.State, len(n.Cards), n.FreeGPUs,
					model, dash(n.Inventory.DriverVersion), ago(now, n.LastSeen), strings.Join(notes, "; "))
			}
			return w.Flush()
		},
	}
}
