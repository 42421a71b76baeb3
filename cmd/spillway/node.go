package main

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker"
)

// nodeCmd holds the enrolment verbs of `spillway node` (docs/security.md);
// root.go puts them under the one node command beside the operator controls.
func nodeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Enrol and revoke nodes: join tokens and node credentials (operators)",
	}
	token := &cobra.Command{Use: "token", Short: "Single-use join tokens for new nodes"}
	var expires time.Duration
	var node string
	var maxGPUs int
	create := &cobra.Command{
		Use:   "create",
		Short: "Create a single-use, expiring join token",
		Long: `Create a join token. Start the node's agent with it once:

  spillway agent --broker https://broker:8080 --ca ca.pem --join-token <token>

The agent exchanges it for the node's own credential (bound to the node's
name, kept in its data dir) and pins the broker's CA. The token works once,
until it expires.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ans, err := c.CreateJoinToken(cmd.Context(), api.JoinTokenRequest{Expires: broker.Duration(expires), Node: node, MaxGPUs: maxGPUs})
			if err != nil {
				return err
			}
			if g.output == "json" {
				return g.printJSON(ans)
			}
			fmt.Fprintln(g.stdout, ans.Token)
			bound := "any node name"
			if ans.Node != "" {
				bound = "node " + ans.Node
			}
			fmt.Fprintf(g.stderr, "join token %s: single use, for %s with at most %d GPUs, until %s\n", ans.ID, bound, ans.MaxGPUs, ans.ExpiresAt.Format(time.RFC3339))
			return nil
		},
	}
	create.Flags().DurationVar(&expires, "expires", time.Hour, "how long the token lasts (1m to 168h)")
	create.Flags().StringVar(&node, "node", "", "the only node name the token may enrol (default: any)")
	create.Flags().IntVar(&maxGPUs, "max-gpus", 0, "the most GPUs the node may report (default: agents.maxCardsPerNode)")
	list := &cobra.Command{
		Use:   "list",
		Short: "List join tokens (no secrets)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			toks, err := c.JoinTokens(cmd.Context())
			if err != nil {
				return err
			}
			if g.output == "json" {
				return g.printJSON(toks)
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tBY\tEXPIRES\tNODE\tMAX GPUS\tUSED BY")
			for _, t := range toks {
				used := "-"
				if t.UsedAt != nil {
					used = t.UsedBy + " at " + t.UsedAt.Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", t.ID, t.CreatedBy, t.ExpiresAt.Format(time.RFC3339), firstNonEmpty(t.Node, "any"), t.MaxGPUs, used)
			}
			return tw.Flush()
		},
	}
	token.AddCommand(create, list)
	revoke := &cobra.Command{
		Use:   "revoke NODE",
		Short: "Revoke a node's credential: its agent gets 401 and its jobs return to the queue",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ids, err := c.RevokeNode(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "node %s: %d credential(s) revoked; enrol it again with a new join token\n", args[0], len(ids))
			return nil
		},
	}
	cmd.AddCommand(token, revoke)
	return cmd
}
