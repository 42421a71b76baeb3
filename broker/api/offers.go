package api

import "github.com/spillway-dev/spillway/providers"

// OfferView is one offer as the burst controller sees it now, and why a
// decision would leave it out (GET /v1/offers, `spillway offers`).
type OfferView struct {
	providers.Offer
	// Skip is the reason code when decisions leave the offer out now
	// (unavailable, no_gpus, cooling_down); empty when it may be chosen.
	Skip       string `json:"skip,omitempty"`
	SkipDetail string `json:"skipDetail,omitempty"`
}
