package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/broker/client"
	"github.com/spillway-dev/spillway/providers/bootstrap"
)

// instanceNote says why a machine is where it is: the error that failed
// it, else why it is going away — the transition that began its drain or
// its end (spill_back: moving home: expected saving …, spot_reclaim, idle).
func instanceNote(v api.InstanceView) string {
	if v.Reason != "" {
		return v.Reason
	}
	for _, t := range v.History {
		if st := broker.MachineState(t.To); (st == broker.MachineDraining || st == broker.MachineTerminating) && t.Reason != "" {
			if t.Detail == "" {
				return t.Reason
			}
			return t.Reason + ": " + t.Detail
		}
	}
	return ""
}

func instancesCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "instances",
		Short: "Burst machines: state, age, cost so far, jobs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(g, cmd, func(c *client.Client) ([]api.InstanceView, error) { return c.Instances(cmd.Context()) },
				func(list []api.InstanceView) error {
					w := g.table()
					fmt.Fprintln(w, "ID\tPROVIDER\tTYPE\tGPUS\tSTATE\tAGE\tCOST SO FAR\tJOBS\tNOTE")
					for _, v := range list {
						market := ""
						if v.Offer.Spot {
							market = " (spot)"
						}
						jobs := append(append([]string{}, v.RunningJobs...), v.WaitingJobs...)
						fmt.Fprintf(w, "%s\t%s\t%s%s\t%d\t%s\t%s\t%s %s\t%s\t%s\n", v.ID, v.Provider, v.Offer.InstanceType, market, v.Offer.GPUs,
							v.State, v.Age, burst.Money(v.CostSoFar), v.Currency, dash(strings.Join(jobs, ",")), instanceNote(v))
					}
					return w.Flush()
				})
		},
	}
	describe := &cobra.Command{
		Use:   "describe ID",
		Short: "One burst machine: its history and the bootstrap transcript",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return show(g, cmd, func(c *client.Client) (*api.InstanceView, error) { return c.Instance(cmd.Context(), args[0]) },
				func(v *api.InstanceView) error {
					w := g.table()
					fmt.Fprintf(w, "Machine:\t%s\n", v.ID)
					fmt.Fprintf(w, "Provider:\t%s %s in %s (%s)\n", v.Provider, v.Offer.InstanceType, v.Offer.Region, dash(v.ProviderID))
					fmt.Fprintf(w, "State:\t%s %s\n", v.State, v.Reason)
					fmt.Fprintf(w, "Offer:\t%d × %s, %s %s/h, spot %v\n", v.Offer.GPUs, v.Offer.GPUModel, burst.Money(v.Offer.PricePerHour), v.Currency, v.Offer.Spot)
					fmt.Fprintf(w, "For:\tteam %s, queue %s, jobs %s\n", v.Team, v.Queue, dash(strings.Join(v.Jobs, ",")))
					fmt.Fprintf(w, "Cost so far:\t%s %s\n", burst.Money(v.CostSoFar), v.Currency)
					fmt.Fprintf(w, "SSH:\t%s@%s\n", dash(v.SSHUser), dash(v.SSHHost))
					_ = w.Flush()
					fmt.Fprintln(g.stdout, "\nHistory:")
					w = g.table()
					for _, t := range v.History {
						fmt.Fprintf(w, "  %s\t%s\t%s\t%s\n", t.At.Local().Format(time.DateTime), t.To, t.Reason, t.Detail)
					}
					_ = w.Flush()
					if len(v.Bootstrap) > 0 {
						var tr bootstrap.Transcript
						if json.Unmarshal(v.Bootstrap, &tr) == nil {
							fmt.Fprintf(g.stdout, "\nBootstrap (%s@%s, host key %s, %s):\n", tr.User, tr.Addr, dash(tr.HostKey), dash(tr.Init))
							w = g.table()
							fmt.Fprintln(w, "  STEP\tEXIT\tDURATION\tCOMMAND\tSTDERR")
							for _, st := range tr.Steps {
								fmt.Fprintf(w, "  %s\t%d\t%s\t%s\t%s\n", st.Name, st.ExitCode, st.Duration.Round(time.Millisecond),
									clipLine(st.Command, 60), clipLine(firstNonEmpty(st.StderrTail, st.Error), 60))
							}
							_ = w.Flush()
							if tr.Error != "" {
								fmt.Fprintf(g.stdout, "  error: %s\n", tr.Error)
							}
						}
					}
					return nil
				})
		},
	}
	cmd.AddCommand(describe)
	return cmd
}

func clipLine(s string, n int) string {
	s = strings.ReplaceAll(strings.TrimSpace(s), "\n", " ⏎ ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
