package main

import (
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker/client"
)

// auditCmd is `spillway audit`: the audit log of every mutating call.
func auditCmd(g *globals) *cobra.Command {
	var q client.AuditQuery
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show the audit log: who changed what, when, from where (operators, finance)",
		Long: `Show the audit log, oldest first: every mutating API call (submits,
cancels, budgets, join tokens, revocations, registrations, logins) with the
caller, the route, the answer and the caller's address.

  spillway audit --from 24h
  spillway audit --by alice --from 2026-12-01
  spillway audit export --from 2026-11-01 --to 2026-12-01 -f audit-november.csv`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			recs, err := c.Audit(cmd.Context(), q)
			if err != nil {
				return err
			}
			if g.output == "json" {
				return g.printJSON(recs)
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "AT\tBY\tROLE\tACTION\tTARGET\tSTATUS\tFROM\tCHANGE")
			for _, r := range recs {
				change := ""
				if r.Old != "" || r.New != "" {
					change = r.Old + " → " + r.New
				}
				status := "-"
				if r.Status != 0 {
					status = fmt.Sprint(r.Status)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.At.Local().Format(time.DateTime), r.By, firstNonEmpty(r.Role, "-"),
					r.Action, firstNonEmpty(r.Target, "-"), status, firstNonEmpty(r.Remote, "-"), change)
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&q.From, "from", "", "start: RFC 3339 time, a date, or a duration back from now (24h)")
	f.StringVar(&q.To, "to", "", "end (exclusive), same forms")
	f.StringVar(&q.By, "by", "", "only this caller's records (token or login name)")
	f.IntVar(&q.Limit, "limit", 200, "the newest N records of the range")

	var eq client.AuditQuery
	var file string
	export := &cobra.Command{
		Use:   "export",
		Short: "Write the audit log of a period as CSV",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			w := g.stdout
			if file != "" && file != "-" {
				out, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
				if err != nil {
					return err
				}
				defer out.Close()
				w = out
			}
			return c.AuditExport(cmd.Context(), eq, w)
		},
	}
	ef := export.Flags()
	ef.StringVar(&eq.From, "from", "", "start: RFC 3339 time, a date, or a duration back from now")
	ef.StringVar(&eq.To, "to", "", "end (exclusive)")
	ef.StringVar(&eq.By, "by", "", "only this caller's records")
	ef.IntVar(&eq.Limit, "limit", 1_000_000, "the newest N records of the range")
	ef.StringVarP(&file, "file", "f", "", "write to this file (default: stdout)")
	cmd.AddCommand(export)
	return cmd
}
