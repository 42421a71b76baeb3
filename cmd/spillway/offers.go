package main

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/broker/client"
)

func offersCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "offers",
		Short: "Burst offers as the controller sees them: price, where it comes from, and why any is skipped",
		Long: "Every provider's offers, in the order burst decisions try them (leased first, then by price),\n" +
			"with where each price comes from (the config, the cloud's price list as of its last refresh,\n" +
			"the spot price history, the provider's API), and the reason an offer is skipped now:\n" +
			"unavailable, no GPUs, cooling down after a capacity error or a spot reclaim, or no global budget\n" +
			"(none set, or spent this month).\n" +
			"`spillway offers refresh` reads on-demand prices from the clouds' price lists.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(g, cmd, func(c *client.Client) ([]api.OfferView, error) { return c.Offers(cmd.Context()) },
				func(list []api.OfferView) error {
					if len(list) == 0 {
						fmt.Fprintln(cmd.OutOrStdout(), "no offers: the broker has no burst provider configured (docs/providers.md; `spillway dev --burst` starts one)")
						return nil
					}
					w := g.table()
					fmt.Fprintln(w, "PROVIDER\tREGION\tZONE\tTYPE\tMARKET\tGPUS\tPRICE/H\tPER GPU-H\tPRICE FROM\tSTATUS")
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
						fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d × %s\t%s %s\t%s\t%s\t%s\n", o.Provider, o.Region, dash(o.Zone), o.InstanceType, market,
							o.GPUs, dash(o.GPUModel), burst.Money(o.PricePerHour), o.Currency, burst.Money(o.PricePerGPUHour()),
							o.PriceFrom(), status)
					}
					return w.Flush()
				})
		},
	}
	cmd.AddCommand(offersRefreshCmd(g), offersClearPricesCmd(g))
	return cmd
}

func offersClearPricesCmd(g *globals) *cobra.Command {
	var provider string
	cmd := &cobra.Command{
		Use:   "clear-prices",
		Short: "Forget the prices `spillway offers refresh` read: on-demand offers take their configured prices again (operator)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return show(g, cmd, func(c *client.Client) ([]string, error) { return c.ClearPrices(cmd.Context(), provider) },
				func(cleared []string) error {
					if len(cleared) == 0 {
						fmt.Fprintln(cmd.OutOrStdout(), "no refreshed prices to clear: the configured prices apply")
						return nil
					}
					for _, name := range cleared {
						fmt.Fprintf(cmd.OutOrStdout(), "%s: refreshed prices cleared; the configured prices apply\n", name)
					}
					return nil
				})
		},
	}
	cmd.Flags().StringVar(&provider, "provider", "", "this provider only")
	return cmd
}

func offersRefreshCmd(g *globals) *cobra.Command {
	var provider string
	cmd := &cobra.Command{
		Use:   "refresh",
		Short: "Read on-demand prices from the clouds' price lists now (operator)",
		Long: "The broker asks every provider with a price list (EC2: the AWS Price List Query API,\n" +
			"pricing:GetProducts) for the on-demand Linux price of each configured instance type in its\n" +
			"region, keeps the table (it survives restarts) and prices on-demand offers from it. A type the\n" +
			"list lacks keeps its configured onDemandPrice. Audited. docs/providers.md, \"Refreshing on-demand prices\".",
		Example: "  spillway offers refresh\n  spillway offers refresh --provider aws-us-east-1",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var failed int
			fetch := func(c *client.Client) ([]api.PriceRefresh, error) {
				list, err := c.RefreshPrices(cmd.Context(), provider)
				for _, r := range list {
					if r.Table == nil {
						failed++
					}
				}
				return list, err
			}
			err := show(g, cmd, fetch,
				func(list []api.PriceRefresh) error {
					w := g.table()
					fmt.Fprintln(w, "PROVIDER\tREGION\tTYPE\tON-DEMAND/H\tREAD AT")
					for _, r := range list {
						if r.Table == nil {
							fmt.Fprintf(w, "%s\t-\t-\t-\tfailed: %s (its prices stay as they were)\n", r.Provider, r.Error)
							continue
						}
						t := r.Table
						at := t.FetchedAt.UTC().Format(time.RFC3339)
						for _, typ := range slices.Sorted(maps.Keys(t.OnDemand)) {
							fmt.Fprintf(w, "%s\t%s\t%s\t%s %s\t%s\n", r.Provider, t.Region, typ, t.OnDemand[typ].String(), t.Currency, at)
						}
						for _, typ := range t.Missing {
							fmt.Fprintf(w, "%s\t%s\t%s\t-\tnot in the price list: the configured onDemandPrice stays\n", r.Provider, t.Region, typ)
						}
					}
					return w.Flush()
				})
			if err == nil && failed > 0 {
				return fmt.Errorf("%d provider(s) could not read their price list", failed)
			}
			return err
		},
	}
	cmd.Flags().StringVar(&provider, "provider", "", "refresh this provider only (a name `spillway offers` shows)")
	return cmd
}
