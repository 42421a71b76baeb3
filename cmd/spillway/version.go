package main

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spf13/cobra"
)

func versionCmd(g *globals) *cobra.Command {
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print this binary's version and the broker's",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			printVersion(cmd.Context(), g, clientOnly)
			return nil
		},
	}
	cmd.Flags().BoolVar(&clientOnly, "client", false, "this binary only; do not ask the broker")
	return cmd
}

// printVersion prints this binary's version and, unless clientOnly, the
// version the broker reports on /healthz (which needs no token).
func printVersion(ctx context.Context, g *globals, clientOnly bool) {
	fmt.Fprintf(g.stdout, "spillway %s %s/%s %s\n", api.Version, runtime.GOOS, runtime.GOARCH, runtime.Version())
	if clientOnly {
		return
	}
	url := g.serverURL()
	c, err := g.clientWithToken("")
	if err != nil { // the CA file named cannot be read
		fmt.Fprintf(g.stdout, "broker %s: %v\n", url, err)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	h, err := c.Health(ctx)
	if err != nil || h.Version == "" {
		fmt.Fprintf(g.stdout, "broker %s: not reachable\n", url)
		return
	}
	fmt.Fprintf(g.stdout, "broker %s: spillway %s\n", url, h.Version)
}
