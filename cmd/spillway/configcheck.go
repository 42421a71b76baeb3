package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/adapters"
	"github.com/spillway-dev/spillway/broker/config"
)

func configCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "The broker's config file",
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "check FILE",
		Short: "Validate a broker config file: every problem with its field, or what it sets up",
		Long: `Read a broker config file as "spillway server --config FILE" would, without
starting anything: print every problem with its field and rule (exit 1), or
a summary of what it sets up (exit 0). Run it before a restart.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := config.Load(args[0])
			if err == nil {
				// Each adapter checks its own section (providers, the
				// store URL, the agents' runtime and data).
				_, err = adapters.Parse(cfg)
			}
			if err != nil {
				if ve, ok := broker.AsValidation(err); ok && len(ve.Errors) > 0 {
					fmt.Fprintf(g.stderr, "%s: %d problem(s):\n", args[0], len(ve.Errors))
					for _, fe := range ve.Errors {
						fmt.Fprintf(g.stderr, "  %s\n", fe.Error())
					}
					return exitError{1}
				}
				return err
			}
			store := "bolt " + cfg.StorePath()
			if cfg.IsRedis() {
				store = "redis"
			}
			fmt.Fprintf(g.stdout, "%s: ok\n", args[0])
			fmt.Fprintf(g.stdout, "  listen %s, store %s, cluster %s\n", cfg.Listen, store, cfg.Cluster)
			fmt.Fprintf(g.stdout, "  %d token(s), %d queue(s), %d priorities, %d team(s), %d provider(s)\n",
				len(cfg.Auth.Tokens), len(cfg.Queues), len(cfg.Priorities), len(cfg.Teams), len(cfg.Providers))
			return nil
		},
	})
	cmd.AddCommand(&cobra.Command{
		Use:   "reload",
		Short: "Make the broker read its config file again, as SIGHUP does (operator; audited)",
		Long: `Ask the broker to read its config file again and apply it. The file is
validated whole first: a bad one changes nothing and the error names the
field. Queues, priorities, teams and quotas, scheduler weights, burst
thresholds, limits, idle and telemetry settings, mounts and tokens go live;
sections that need a restart (listen, store, providers, billing, tls, oidc,
ha, slurm) are listed when they changed. docs/operations.md, "Reloading the
config".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.ReloadConfig(cmd.Context())
			if err != nil {
				return err
			}
			if g.json() {
				return g.printJSON(res)
			}
			applied := "nothing changed"
			if len(res.Applied) > 0 {
				applied = strings.Join(res.Applied, ", ")
			}
			fmt.Fprintf(g.stdout, "%s reloaded: applied %s\n", res.File, applied)
			if len(res.RestartNeeded) > 0 {
				fmt.Fprintf(g.stdout, "changed but kept until a restart: %s\n", strings.Join(res.RestartNeeded, ", "))
			}
			return nil
		},
	})
	return cmd
}
