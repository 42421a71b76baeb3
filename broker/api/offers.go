package api

import "github.com/spillway-dev/spillway/providers"

// OfferView is one offer as the burst controller sees it now, and why a
// decision would leave it out (GET /v1/offers, `spillway offers`).
type OfferView struct {
	providers.Offer
	// Skip is the reason code when decisions leave the offer out now
	// (unavailable, no_gpus, cooling_down, budget); empty when it may be
	// chosen.
	Skip       string `json:"skip,omitempty"`
	SkipDetail string `json:"skipDetail,omitempty"`
}

// PriceFrom says where the offer's price comes from, for people:
// "config", "price list at 2026-12-01T10:00:00Z", "spot history at …".
func (v OfferView) PriceFrom() string { return providers.DescribePriceSource(v.Offer) }

// PriceRefresh is one provider's answer to `spillway offers refresh`
// (POST /v1/offers/refresh): the table read from its cloud's price list
// and now used for its on-demand offers, or why it could not be read.
type PriceRefresh struct {
	Provider string                `json:"provider"`
	Table    *providers.PriceTable `json:"table,omitempty"`
	// Error is why the price list could not be read; the provider keeps
	// the prices it had (an earlier table, or its config).
	Error string `json:"error,omitempty"`
}
