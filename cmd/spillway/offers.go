package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/broker/client"
)

func offersCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "offers",
		Short: "Burst offers as the controller sees them: price, and why any is skipped",
		Long: "Every provider's offers, in the order burst decisions try them (leased first, then by price),\n" +
			"with live spot prices where the provider reads them, and the reason an offer is skipped now:\n" +
			"unavailable, no GPUs, or cooling down after a capacity error or a spot reclaim.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(g, cmd, func(c *client.Client) ([]api.OfferView, error) { return c.Offers(cmd.Context()) },
				func(list []api.OfferView) error {
					if len(list) == 0 {
						fmt.Fprintln(cmd.OutOrStdout(), "no offers: the broker has no burst provider configured (docs/providers.md; `spillway dev --burst` starts one)")
						return nil
					}
					w := g.table()
					fmt.Fprintln(w, "PROVIDER\tREGION\tZONE\tTYPE\tMARKET\tGPUS\tPRICE/H\tPER GPU-H\tSTATUS")
					for _, o := range list {
						market := "on-demand"
						if o.Spot {
							market = "spot"
						}
						if o.Prepaid {
							market = "leased"
						}
						status := "usable"
						if o.Skip != "" {
							status = "skipped: " + o.SkipDetail
						}
						fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d × %s\t%s %s\t%s\t%s\n", o.Provider, o.Region, dash(o.Zone), o.InstanceType, market,
							o.GPUs, dash(o.GPUModel), burst.Money(o.PricePerHour), o.Currency, burst.Money(o.PricePerGPUHour()), status)
					}
					return w.Flush()
				})
		},
	}
}
