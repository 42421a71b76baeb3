package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker/client"
)

func billCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bill",
		Short: "GPU-hours and cost from the ledger: reports and FOCUS exports",
	}
	var q client.BillingQuery
	usage := &cobra.Command{
		Use:   "usage",
		Short: "GPU-hours, effective GPU-hours and cost, grouped (--by team,pool --month 2026-11)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(g, cmd, func(c *client.Client) (*billing.Report, error) { return c.Usage(cmd.Context(), q) },
				func(rep *billing.Report) error { printReport(g, rep); return nil })
		},
	}
	addPeriodFlags(usage, &q)
	usage.Flags().StringVar(&q.By, "by", "team", "group by: team, project, user, job, queue, pool, pool-kind, gpu-model, spot, kind, day, month (comma-separated)")

	var out string
	export := &cobra.Command{
		Use:   "export",
		Short: "Export the ledger for a period as FinOps FOCUS CSV or JSON",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var w io.Writer = g.stdout
			if out != "" && out != "-" {
				f, err := os.Create(out)
				if err != nil {
					return err
				}
				defer f.Close()
				w = f
			}
			return c.Export(cmd.Context(), q, w)
		},
	}
	addPeriodFlags(export, &q)
	export.Flags().StringVar(&q.Format, "format", "csv", "csv or json")
	export.Flags().StringVar(&q.Granularity, "granularity", "hour", "rows per ledger entry, or summed per hour or day")
	export.Flags().StringVarP(&out, "file", "f", "-", "write to this file (- for standard output)")
	cmd.AddCommand(usage, export)
	return cmd
}

func addPeriodFlags(cmd *cobra.Command, q *client.BillingQuery) {
	f := cmd.Flags()
	f.StringVar(&q.Month, "month", "", "a calendar month, e.g. 2026-11 (default: this month)")
	f.StringVar(&q.From, "from", "", "start date or time, instead of --month")
	f.StringVar(&q.To, "to", "", "end date or time (exclusive)")
	f.StringVar(&q.Team, "team", "", "only this team (users always see only their own)")
}

func printReport(g *globals, rep *billing.Report) {
	fmt.Fprintf(g.stdout, "Period %s to %s", rep.Period.From.Format("2006-01-02 15:04"), rep.Period.To.Format("2006-01-02 15:04"))
	if rep.Team != "" {
		fmt.Fprintf(g.stdout, ", team %s", rep.Team)
	}
	fmt.Fprintln(g.stdout)
	w := g.table()
	head := make([]string, 0, len(rep.GroupBy)+4)
	for _, d := range rep.GroupBy {
		head = append(head, strings.ToUpper(string(d)))
	}
	cur := rep.Currency
	if cur == "" {
		cur = "USD"
	}
	head = append(head, "GPU-HOURS", "EFFECTIVE GPU-HOURS", "COMPUTING", "COST "+cur)
	fmt.Fprintln(w, strings.Join(head, "\t"))
	row := func(key []string, t billing.Totals) {
		eff := "-"
		if t.MeasuredGPUMillis > 0 {
			eff = fmt.Sprintf("%.0f%%", 100*float64(t.EffectiveGPUMillis)/float64(t.MeasuredGPUMillis))
		}
		cells := append(append([]string{}, key...), billing.FormatGPUHours(t.GPUMillis), billing.FormatGPUHours(t.EffectiveGPUMillis), eff, t.Cost.Cents())
		fmt.Fprintln(w, strings.Join(cells, "\t"))
	}
	for _, r := range rep.Rows {
		row(r.Key, r.Totals)
	}
	total := make([]string, len(rep.GroupBy))
	if len(total) > 0 {
		total[0] = "TOTAL"
	}
	row(total, rep.Total)
	_ = w.Flush()
}
