package main

import (
	"fmt"
	"strings"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/broker/client"
)

func burstCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "burst",
		Short: "The burst controller",
	}
	plan := &cobra.Command{
		Use:   "plan",
		Short: "Print the decision the burst controller would take now, without acting (operator)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(g, cmd, func(c *client.Client) (*api.BurstPlan, error) { return c.BurstPlan(cmd.Context()) },
				func(p *api.BurstPlan) error {
					d, in := p.Decision, p.Input
					state := "idle"
					if d.Active {
						state = "active"
					}
					fmt.Fprintf(g.stdout, "On-prem allocation %.0f%% (%d/%d GPUs), threshold %.0f%%: controller %s\n",
						100*d.Allocation, in.OnPremAllocated, in.OnPremGPUs, 100*in.Policy.Threshold, state)
					fmt.Fprintf(g.stdout, "%d waiting job(s), %d machine(s), %d offer(s)\n\n", len(in.Pending), len(in.Machines), len(in.Offers))
					if len(p.Providers) == 0 {
						fmt.Fprintln(g.stdout, "No provider is configured, so nothing can burst: add one under providers: (docs/providers.md),\nor watch a burst on this machine with `spillway dev --burst` (README, \"Watch a burst\").")
						return nil
					}
					if len(d.Launches) == 0 && len(d.Binds) == 0 && len(d.Stops) == 0 {
						fmt.Fprintln(g.stdout, "Nothing to launch, bind or stop.")
					}
					w := g.table()
					for _, l := range d.Launches {
						market := "on-demand"
						if l.Offer.Spot {
							market = "spot"
						}
						if l.Offer.Prepaid {
							market = "leased"
						}
						count := ""
						if l.Nodes > 1 {
							count = fmt.Sprintf("%d × ", l.Nodes) // a gang's group
						}
						fmt.Fprintf(w, "launch\t%s%s %s %s (%s, %d GPUs)\tfor %s\tteam %s\tprojected %s %s (%.1fh)\n", count, l.Offer.Provider, l.Offer.Region,
							l.Offer.InstanceType, market, l.Offer.GPUs, strings.Join(l.Jobs, ","), l.Team, burst.Money(l.ProjectedCost), in.Currency, l.Hours)
					}
					for _, b := range d.Binds {
						fmt.Fprintf(w, "bind\t%s\tto %s\t\t\n", b.Job, b.Machine)
					}
					for _, s := range d.Stops {
						fmt.Fprintf(w, "stop\t%s\t%s\t%s\t\n", s.Machine, s.Reason, s.Detail)
					}
					_ = w.Flush()
					if len(d.Reasons) > 0 {
						fmt.Fprintln(g.stdout, "\nWaiting:")
						w = g.table()
						for id, r := range d.Reasons {
							fmt.Fprintf(w, "  %s\t%s\n", id, r.Message)
						}
						_ = w.Flush()
					}
					return nil
				})
		},
	}
	cmd.AddCommand(plan)
	return cmd
}

func budgetCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "budget",
		Short: "Monthly burst budgets per team and global",
	}
	var team string
	var global bool
	set := &cobra.Command{
		Use:   "set (--team TEAM | --global) AMOUNT",
		Short: "Set a monthly burst budget in the billing currency (operator; audited)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (team == "") == !global {
				return fmt.Errorf("give exactly one of --team TEAM or --global")
			}
			scope := team
			if global {
				scope = "global"
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			b, err := c.SetBudget(cmd.Context(), scope, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "burst budget %s: %s %s per month\n", b.Scope, burst.Money(b.Limit), b.Currency)
			return nil
		},
	}
	set.Flags().StringVar(&team, "team", "", "the team's budget")
	set.Flags().BoolVar(&global, "global", false, "the whole cluster's budget (required for anything to burst)")
	list := &cobra.Command{
		Use:   "list",
		Short: "Budgets with this month's spend, reservations and what remains",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(g, cmd, func(c *client.Client) ([]api.BudgetView, error) { return c.Budgets(cmd.Context()) },
				func(bs []api.BudgetView) error {
					w := g.table()
					fmt.Fprintln(w, "SCOPE\tMONTH\tLIMIT\tSPENT\tRESERVED\tREMAINING\tUSED\tSET BY")
					for _, b := range bs {
						fmt.Fprintf(w, "%s\t%s\t%s %s\t%s\t%s\t%s\t%.0f%%\t%s %s\n", b.Scope, b.Month, burst.Money(b.Limit), b.Currency,
							burst.Money(b.Spent), burst.Money(b.Reserved), burst.Money(b.Remaining), 100*b.UsedRatio, b.UpdatedBy, b.UpdatedAt.Local().Format("2006-01-02"))
					}
					return w.Flush()
				})
		},
	}
	cmd.AddCommand(set, list)
	return cmd
}
