package server

import (
	"github.com/spillway-dev/spillway/broker/api"
	"net/http"
	"slices"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/providers"
)

// listOffers answers GET /v1/offers: every provider's offers (refreshed
// when the cache is old), in the order decisions try them, with the
// reason any is skipped. The skip reasons come from burst.OfferSkip, the
// same test Decide applies, then burst.OfferBudgetSkip (no global budget,
// or it is spent: Decide's budget check refuses every launch of a priced
// offer then).
func (s *Server) listOffers(c echo.Context) error {
	ctx := c.Request().Context()
	now := s.clock.Now()
	s.refreshOffers(ctx, now)
	budgets, err := s.burstCtl().Budgets(ctx, s.store, now)
	if err != nil {
		return err
	}
	s.lock()
	in := &burst.Input{Now: now, CoolDowns: s.coolDownsLocked(now), Budgets: budgets, Currency: s.currency()}
	for name, offers := range s.burst.offers {
		if _, ok := s.burst.providers[name]; ok {
			in.Offers = append(in.Offers, offers...)
		}
	}
	s.mu.Unlock()
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
	return c.JSON(http.StatusOK, map[string]any{"offers": out})
}
