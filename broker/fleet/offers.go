package fleet

import (
	"context"
	"slices"

	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/providers"
)

// OfferViews are every provider's offers (refreshed when the cache is
// old), in the order decisions try them, with the reason any is skipped.
// The skip reasons come from burst.OfferSkip, the same test Decide
// applies, then burst.OfferBudgetSkip (no global budget, or it is spent:
// Decide's budget check refuses every launch of a priced offer then).
func (f *Fleet) OfferViews(ctx context.Context) ([]api.OfferView, error) {
	now := f.clock.Now()
	f.RefreshOffers(ctx, now)
	budgets, err := f.burstCtl().Budgets(ctx, f.store, now)
	if err != nil {
		return nil, err
	}
	f.st.Lock()
	in := &burst.Input{Now: now, CoolDowns: f.coolDownsLocked(now), Budgets: budgets, Currency: Currency(f.cfg())}
	for name, offers := range f.offers {
		if _, ok := f.providers[name]; ok {
			in.Offers = append(in.Offers, offers...)
		}
	}
	f.st.Unlock()
	offers := slices.Clone(in.Offers)
	providers.SortOffers(offers)
	out := make([]api.OfferView, 0, len(offers))
	for _, o := range offers {
		code, detail := burst.OfferSkip(in, o)
		if code == "" {
			code, detail = burst.OfferBudgetSkip(in, o)
		}
		out = append(out, api.OfferView{Offer: o, Skip: code, SkipDetail: detail})
	}
	return out, nil
}
