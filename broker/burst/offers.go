package burst

import (
	"fmt"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/providers"
)

// CoolDown keeps one offer out of decisions until Until: the provider
// refused it for capacity or quota, or reclaimed a spot machine of it.
// The broker keeps the cool-downs (and the simulator its own); Decide only
// reads them, so a decision stays a function of its input.
type CoolDown struct {
	Until  time.Time `json:"until"`
	Reason string    `json:"reason"`
}

// Skip codes: why an offer takes no part in a decision.
const (
	SkipUnavailable = "unavailable"
	SkipNoGPUs      = "no_gpus"
	SkipCoolingDown = "cooling_down"
	// SkipBudget (OfferBudgetSkip): no priced launch fits this month's
	// global budget.
	SkipBudget = "budget"
)

// OfferSkip says why Decide leaves offer o out at in.Now, or "" when it
// may be chosen; detail is for people (`spillway offers`).
func OfferSkip(in *Input, o providers.Offer) (code, detail string) {
	switch {
	case !o.Available:
		return SkipUnavailable, "the provider reports no capacity for it now"
	case o.GPUs <= 0:
		return SkipNoGPUs, "it has no GPUs"
	}
	if c, ok := in.CoolDowns[o.Key()]; ok && in.Now.Before(c.Until) {
		return SkipCoolingDown, fmt.Sprintf("cooling down until %s: %s", c.Until.UTC().Format(time.RFC3339), c.Reason)
	}
	return "", ""
}

// OfferBudgetSkip says why no decision can launch priced offer o with
// in.Budgets: there is no global budget, or it is spent. Decide's budget
// check blocks every job's launch of o then (with CodeBudget); whether a
// job fits a budget with room depends on its timeout, which `spillway
// burst plan` shows. Leased (prepaid) capacity needs no budget.
func OfferBudgetSkip(in *Input, o providers.Offer) (code, detail string) {
	if o.Prepaid || o.PricePerHour <= 0 {
		return "", ""
	}
	g, ok := in.Budgets[broker.GlobalScope]
	switch {
	case !ok:
		return SkipBudget, "no global burst budget is set (spillway budget set --global AMOUNT)"
	case g.Committed >= g.Limit:
		return SkipBudget, fmt.Sprintf("the global budget is spent: %s/%s %s this month", Money(g.Committed), Money(g.Limit), in.Currency)
	}
	return "", ""
}

// usableOffers are the offers Decide may choose from, cheapest first.
func usableOffers(in *Input) []providers.Offer {
	offers := make([]providers.Offer, 0, len(in.Offers))
	for _, o := range in.Offers {
		if code, _ := OfferSkip(in, o); code == "" {
			offers = append(offers, o)
		}
	}
	providers.SortOffers(offers)
	return offers
}
