package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/providers"
)

// On-demand prices from the clouds' price lists (docs/providers.md,
// "Refreshing on-demand prices"). An operator runs `spillway offers
// refresh`; the broker asks every provider that has a price list (EC2:
// the AWS Price List Query API) for the prices of its configured types,
// keeps each table in the store under priceTableKey+provider with the
// time it was read, and hands it to the provider, whose on-demand offers
// carry it from then on — also after a restart or a change of leader,
// which read the tables back (loadPriceTables). A type the list has no
// price for, and a provider never refreshed, keep the configured price.

// priceTableKey prefixes the meta keys of the refreshed price tables
// ("offers/prices/aws-us-east-1").
const priceTableKey = "offers/prices/"

// priceFetchTimeout bounds one provider's refresh.
const priceFetchTimeout = 2 * time.Minute

// loadPriceTables hands every stored price table to its provider. A
// table that does not decode is logged and left out: the provider keeps
// its configured prices until the next refresh.
func (s *Server) loadPriceTables(tx broker.Tx) error {
	return tx.Scan(broker.BucketMeta, priceTableKey, broker.PrefixEnd(priceTableKey), func(k string, raw []byte) error {
		name := strings.TrimPrefix(k, priceTableKey)
		r, ok := s.burst.providers[name].(providers.PriceRefresher)
		if !ok {
			return nil // a provider no longer configured
		}
		var t providers.PriceTable
		if err := json.Unmarshal(raw, &t); err != nil {
			s.log.Warn("stored price table unreadable; configured prices apply", "provider", name, "err", err)
			return nil
		}
		if err := t.Validate(); err != nil || t.Provider != name {
			s.log.Warn("stored price table invalid; configured prices apply", "provider", name, "err", err)
			return nil
		}
		r.UsePrices(t)
		return nil
	})
}

// refreshPrices answers POST /v1/offers/refresh (?provider=NAME for one):
// every provider with a price list reads it now. The answer lists each
// provider's new table or its error; when every refresh failed it is a
// 502 naming them. The audit middleware records the call.
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
	s.burst.refreshing.Lock()
	defer s.burst.refreshing.Unlock()
	ctx := c.Request().Context()
	out := make([]api.PriceRefresh, 0, len(refreshers))
	var failed []string
	for _, name := range slices.Sorted(maps.Keys(refreshers)) {
		r := refreshers[name]
		fctx, cancel := context.WithTimeout(ctx, priceFetchTimeout)
		t, err := r.FetchPrices(fctx)
		cancel()
		if err != nil {
			s.log.Warn("price list refresh failed", "provider", name, "err", err)
			out = append(out, api.PriceRefresh{Provider: name, Error: err.Error()})
			failed = append(failed, name+": "+err.Error())
			continue
		}
		t.Provider, t.FetchedAt = name, s.clock.Now().UTC()
		raw, err := json.Marshal(t)
		if err != nil {
			return err
		}
		if err := s.store.Update(ctx, func(tx broker.Tx) error { return tx.Put(broker.BucketMeta, priceTableKey+name, raw) }); err != nil {
			return fmt.Errorf("store the price table of %s: %w", name, err)
		}
		r.UsePrices(t)
		s.log.Info("on-demand prices refreshed", "provider", name, "types", len(t.OnDemand), "missing", strings.Join(t.Missing, ","),
			"by", principal(c).Name)
		out = append(out, api.PriceRefresh{Provider: name, Table: &t})
	}
	// The next decision and `spillway offers` ask the providers again.
	s.lock()
	s.burst.offersAt = time.Time{}
	s.mu.Unlock()
	if len(failed) == len(out) {
		return newError(http.StatusBadGateway, "price_list_unavailable", "%s", strings.Join(failed, "; "))
	}
	return c.JSON(http.StatusOK, map[string]any{"refreshed": out})
}

// priceRefreshers returns the providers with a price list (only want's
// when want is not empty) and whether want names a configured provider.
func (s *Server) priceRefreshers(want string) (map[string]providers.PriceRefresher, bool, error) {
	s.lock()
	defer s.mu.Unlock()
	if err := s.checkLeaderLocked(); err != nil {
		return nil, false, err
	}
	_, known := s.burst.providers[want]
	refreshers := map[string]providers.PriceRefresher{}
	for name, p := range s.burst.providers {
		if r, ok := p.(providers.PriceRefresher); ok && (want == "" || want == name) {
			refreshers[name] = r
		}
	}
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
	s.burst.refreshing.Lock()
	defer s.burst.refreshing.Unlock()
	cleared := []string{}
	err = s.store.Update(c.Request().Context(), func(tx broker.Tx) error {
		cleared = cleared[:0]
		for _, name := range slices.Sorted(maps.Keys(refreshers)) {
			if _, err := tx.Get(broker.BucketMeta, priceTableKey+name); errors.Is(err, broker.ErrNotFound) {
				continue
			} else if err != nil {
				return err
			}
			if err := tx.Delete(broker.BucketMeta, priceTableKey+name); err != nil {
				return err
			}
			cleared = append(cleared, name)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, name := range cleared {
		refreshers[name].UsePrices(providers.PriceTable{Provider: name})
		s.log.Info("refreshed prices cleared; configured prices apply", "provider", name, "by", principal(c).Name)
	}
	s.lock()
	s.burst.offersAt = time.Time{}
	s.mu.Unlock()
	return c.JSON(http.StatusOK, map[string]any{"cleared": cleared})
}
