package providers

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/billing"
)

// Where an offer's price comes from (Offer.PriceSource).
const (
	// PriceFromConfig is the price written in the provider's config.
	PriceFromConfig = "config"
	// PriceFromPriceList is an on-demand price read from the cloud's
	// price list by `spillway offers refresh` (a PriceTable).
	PriceFromPriceList = "price-list"
	// PriceFromSpotHistory is the newest spot price the cloud reports
	// (EC2's DescribeSpotPriceHistory).
	PriceFromSpotHistory = "spot-history"
	// PriceFromAPI is a price the provider's API gives with each offer
	// (Lambda Cloud).
	PriceFromAPI = "provider-api"
)

// PriceTable is one provider's on-demand prices as read from its cloud's
// price list: what `spillway offers refresh` fetches and the broker keeps.
type PriceTable struct {
	// Provider is the configured provider name.
	Provider string `json:"provider"`
	// Region the prices are for.
	Region string `json:"region"`
	// Currency of the prices.
	Currency string `json:"currency"`
	// FetchedAt is when the broker read the price list.
	FetchedAt time.Time `json:"fetchedAt"`
	// OnDemand is the price per hour of each instance type.
	OnDemand map[string]billing.Amount `json:"onDemand"`
	// Missing lists the configured types the price list has no price
	// for; their offers keep the configured price.
	Missing []string `json:"missing,omitempty"`
}

// Validate checks a table read back from the store.
func (t PriceTable) Validate() error {
	if t.Provider == "" {
		return fmt.Errorf("price table: provider is required")
	}
	for _, k := range slices.Sorted(maps.Keys(t.OnDemand)) {
		if t.OnDemand[k] <= 0 {
			return fmt.Errorf("price table %s: onDemand.%s: price %s is not above 0", t.Provider, k, t.OnDemand[k])
		}
	}
	return nil
}

// PriceRefresher is a provider whose on-demand prices can be read from its
// cloud's price list (EC2: the AWS Price List Query API). The broker calls
// FetchPrices when an operator runs `spillway offers refresh`, stamps and
// stores the table, and hands it (then, and after every restart) to
// UsePrices; from then on the provider's on-demand offers carry the
// table's price where it has one and the configured price elsewhere.
type PriceRefresher interface {
	Provider
	// FetchPrices reads the on-demand prices of the configured types.
	FetchPrices(ctx context.Context) (PriceTable, error)
	// UsePrices makes Offers price on-demand offers from t; a table with
	// no prices puts the configured ones back.
	UsePrices(t PriceTable)
}

// DescribePriceSource is the offer's price source for people:
// "config", "price list at 2026-12-01T10:00:00Z", "spot history at …".
func DescribePriceSource(o Offer) string {
	src := o.PriceSource
	if src == "" {
		src = PriceFromConfig
	}
	src = strings.ReplaceAll(src, "-", " ")
	if !o.PricedAt.IsZero() {
		src += " at " + o.PricedAt.UTC().Format(time.RFC3339)
	}
	return src
}
