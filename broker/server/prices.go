package server

import (
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/providers"
)

// refreshPrices answers POST /v1/offers/refresh (?provider=NAME for one):
// every provider with a price list reads it now (the fleet's
// RefreshPrices, docs/providers.md "Refreshing on-demand prices"). The
// answer lists each provider's new table or its error; when every
// refresh failed it is a 502 naming them. The audit middleware records
// the call.
func (s *Server) refreshPrices(c echo.Context) error {
	want := c.QueryParam("provider")
	refreshers, known, err := s.priceRefreshers(want)
	if err != nil {
		return err
	}
	switch {
	case want != "" && !known:
		return errBadRequest("provider", broker.CodeInvalid, "no provider named %q is configured (spillway offers lists them)", clip(want))
	case want != "" && len(refreshers) == 0:
		return errBadRequest("provider", broker.CodeNotAllowed, "provider %s has no price list to refresh from (aws providers do); its prices come from its config or its API", want)
	case len(refreshers) == 0:
		return newError(http.StatusConflict, "no_price_list", "no configured provider has a price list to refresh from (aws providers do); prices come from the config")
	}
	out, failed, err := s.fleet.RefreshPrices(c.Request().Context(), refreshers, principal(c).Name)
	if err != nil {
		return err
	}
	if len(failed) == len(out) {
		return newError(http.StatusBadGateway, "price_list_unavailable", "%s", strings.Join(failed, "; "))
	}
	return c.JSON(http.StatusOK, map[string]any{"refreshed": out})
}

// priceRefreshers returns the providers with a price list (only want's
// when want is not empty) and whether want names a configured provider;
// only the leader answers.
func (s *Server) priceRefreshers(want string) (map[string]providers.PriceRefresher, bool, error) {
	s.lock()
	defer s.mu.Unlock()
	if err := s.checkLeaderLocked(); err != nil {
		return nil, false, err
	}
	refreshers, known := s.fleet.PriceRefreshersLocked(want)
	return refreshers, known, nil
}

// clearPrices answers DELETE /v1/offers/prices (?provider=NAME for one):
// the refreshed tables are dropped from the store and the providers, whose
// on-demand offers take their configured prices again. It answers the
// providers whose table it dropped. The audit middleware records the call.
func (s *Server) clearPrices(c echo.Context) error {
	want := c.QueryParam("provider")
	refreshers, known, err := s.priceRefreshers(want)
	if err != nil {
		return err
	}
	if want != "" && !known {
		return errBadRequest("provider", broker.CodeInvalid, "no provider named %q is configured (spillway offers lists them)", clip(want))
	}
	cleared, err := s.fleet.ClearPrices(c.Request().Context(), refreshers, principal(c).Name)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"cleared": cleared})
}
