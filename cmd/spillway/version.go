package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker/server"
)

func versionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(g.stdout, "spillway %s %s/%s %s\n", server.Version, runtime.GOOS, runtime.GOARCH, runtime.Version())
			return nil
		},
	}
}
