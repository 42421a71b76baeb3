package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker/client"
)

func reportCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "report",
		Short: "Utilisation and delivery reports: are we using what we pay for, and how well do we serve",
	}
	cmd.AddCommand(reportUtilizationCmd(g), reportDeliveryCmd(g))
	return cmd
}

func addReportFlags(cmd *cobra.Command, q *client.ReportQuery) {
	f := cmd.Flags()
	f.StringVar(&q.Month, "month", "", "a calendar month, e.g. 2026-11 (default: this month)")
	f.StringVar(&q.From, "from", "", "start date or time, instead of --month (2026-11-01 or 2026-11-01T08:00:00Z)")
	f.StringVar(&q.To, "to", "", "end date or time (exclusive)")
	f.StringVar(&q.Team, "team", "", "only this team (users always see only their own)")
}

func reportUtilizationCmd(g *globals) *cobra.Command {
	var q client.ReportQuery
	var format, out string
	cmd := &cobra.Command{
		Use:   "utilization",
		Short: "GPU-hours allocated and computing, memory held, by team, pool, GPU model and shift; idle holders; idle cards",
		Long: `GPU-hours allocated and computing come from the billing ledger and equal
'spillway bill usage' for the same period and team. Memory held comes from
the GPU telemetry, each card's memory attributed to the job that held it.
Shifts (weekday day, weekday night, weekend) follow the config's reports
section. --format csv writes one table (--table rows, jobs or cards).`,
		Aliases: []string{"utilisation"},
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			switch format {
			case "csv":
				var w io.Writer = g.stdout
				if out != "" && out != "-" {
					f, err := os.Create(out)
					if err != nil {
						return err
					}
					defer f.Close()
					w = f
				}
				return c.UtilizationCSV(cmd.Context(), q, w)
			case "", "table":
			default:
				return fmt.Errorf("--format must be table or csv, not %q", format)
			}
			rep, err := c.Utilization(cmd.Context(), q)
			if err != nil {
				return err
			}
			if g.json() {
				return g.printJSON(rep)
			}
			printUtilization(g, rep)
			return nil
		},
	}
	addReportFlags(cmd, &q)
	cmd.Flags().StringVar(&format, "format", "table", "table or csv")
	cmd.Flags().StringVar(&q.Table, "table", "", "with --format csv: rows (default), jobs or cards")
	cmd.Flags().StringVarP(&out, "file", "f", "-", "with --format csv: write to this file")
	return cmd
}

func pct(f float64) string { return fmt.Sprintf("%.0f%%", 100*f) }

func hours(sec float64) string { return fmt.Sprintf("%.1fh", sec/3600) }

func printUtilization(g *globals, rep *api.UtilizationReport) {
	fmt.Fprintf(g.stdout, "Utilisation %s to %s (shifts in %s: weekday day %02d:00-%02d:00, weekend %s)\n\n",
		rep.Period.From.Format("2006-01-02 15:04"), rep.Period.To.Format("2006-01-02 15:04"), rep.Shifts.TimeZone,
		rep.Shifts.DayStart, rep.Shifts.DayEnd, strings.Join(rep.Shifts.Weekend, ", "))
	w := g.table()
	fmt.Fprintln(w, "TEAM\tPOOL\tGPU\tSHIFT\tGPU-HOURS\tCOMPUTING\tUTIL\tMEM GiB-H\tMEAN MEM/GPU\tCOST "+rep.Currency)
	line := func(team, pool, model, shift string, t api.UtilTotals) {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%s\t%s\n", team, pool, model, shift, t.GPUHours, t.ComputingGPUHours,
			pct(t.Utilization), t.MemoryGiBHours, gib(t.MeanMemoryBytes), t.Cost.Cents())
	}
	for _, r := range rep.Rows {
		line(r.Team, r.Pool, r.GPUModel, r.Shift, r.UtilTotals)
	}
	line("TOTAL", "", "", "", rep.Total)
	_ = w.Flush()
	fmt.Fprintf(g.stdout, "\nJobs holding GPU memory while computing under %d%%:\n", rep.IdleThreshold)
	if len(rep.IdleHolders) == 0 {
		fmt.Fprintln(g.stdout, "  none")
	} else {
		w = g.table()
		fmt.Fprintln(w, "  JOB\tTEAM\tIDLE CARD-HOURS\tMEAN MEMORY\tFROM\tTO")
		for _, h := range rep.IdleHolders {
			fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\t%s\n", h.Job, h.Team, hours(h.IdleCardSeconds), gib(h.MeanMemoryBytes),
				h.First.Local().Format("01-02 15:04"), h.Last.Local().Format("01-02 15:04"))
		}
		_ = w.Flush()
	}
	if len(rep.IdleCards) > 0 {
		fmt.Fprintln(g.stdout, "\nCards idle longest:")
		w = g.table()
		fmt.Fprintln(w, "  NODE\tGPU\tIDLE\tOF WHICH HELD\tLONGEST STRETCH\tENDED\tLAST HOLDER")
		for _, c := range rep.IdleCards {
			fmt.Fprintf(w, "  %s\t%d\t%s\t%s\t%s\t%s\t%s\n", c.Node, c.GPU, hours(c.IdleSeconds), hours(c.HeldIdleSeconds),
				hours(c.LongestIdleSeconds), c.LongestIdleEnd.Local().Format("01-02 15:04"), dash(c.LastHolder))
		}
		_ = w.Flush()
	}
}

func reportDeliveryCmd(g *globals) *cobra.Command {
	var q client.ReportQuery
	cmd := &cobra.Command{
		Use:   "delivery",
		Short: "Waits, completion times, success rate, preemptions, resumes, starvation, and cost per 1,000 units",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := g.checkOutput(); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			rep, err := c.Delivery(cmd.Context(), q)
			if err != nil {
				return err
			}
			if g.json() {
				return g.printJSON(rep)
			}
			printDelivery(g, rep)
			return nil
		},
	}
	addReportFlags(cmd, &q)
	return cmd
}

func secs(s float64) string {
	if s == 0 {
		return "-"
	}
	return (time.Duration(s * float64(time.Second))).Round(time.Second).String()
}

func printDelivery(g *globals, rep *api.DeliveryReport) {
	fmt.Fprintf(g.stdout, "Delivery %s to %s\n\n", rep.Period.From.Format("2006-01-02 15:04"), rep.Period.To.Format("2006-01-02 15:04"))
	w := g.table()
	fmt.Fprintln(w, "QUEUE\tPRIORITY\tSTARTS\tWAIT P50\tWAIT P90\tDONE\tTIME P50\tSUCCESS\tFAILED\tTIMED OUT\tCANCELLED\tPREEMPTED\tRESUMED\tSTARVED")
	line := func(queue, prio string, r api.DeliveryRow) {
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\n", queue, prio, r.Wait.Count, secs(r.Wait.P50), secs(r.Wait.P90),
			r.Completion.Count, secs(r.Completion.P50), pct(r.SuccessRate), r.Failed, r.TimedOut, r.Cancelled, r.Preemptions, r.Resumes, r.Starved)
	}
	for _, r := range rep.Rows {
		line(r.Queue, r.Priority, r)
	}
	line("TOTAL", "", rep.Total)
	_ = w.Flush()
	fmt.Fprintf(g.stdout, "\nStarving now (waiting over %s): ", rep.StarvationAfter)
	if len(rep.Starving) == 0 {
		fmt.Fprintln(g.stdout, "none")
	} else {
		fmt.Fprintln(g.stdout)
		for _, s := range rep.Starving {
			fmt.Fprintf(g.stdout, "  %s team %s queue %s since %s: %s\n", s.ID, s.Team, s.Queue, s.Since.Local().Format("01-02 15:04"), s.Reason)
		}
	}
	if len(rep.Units) > 0 {
		fmt.Fprintln(g.stdout, "\nCost per unit of output:")
		w = g.table()
		fmt.Fprintf(w, "  TEAM\tKIND\tUNITS\tJOBS\tGPU-S PER 1000\tCOST %s\tPER 1000\n", rep.Currency)
		for _, u := range rep.Units {
			fmt.Fprintf(w, "  %s\t%s\t%d\t%d\t%.2f\t%s\t%s\n", u.Team, u.Kind, u.Units, u.Jobs, u.GPUSecondsPer1000, u.Cost.Cents(), u.CostPer1000)
		}
		_ = w.Flush()
	}
}
