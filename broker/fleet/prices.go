package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

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
func (f *Fleet) loadPriceTables(tx broker.Tx) error {
	return tx.Scan(broker.BucketMeta, priceTableKey, broker.PrefixEnd(priceTableKey), func(k string, raw []byte) error {
		name := strings.TrimPrefix(k, priceTableKey)
		r, ok := f.providers[name].(providers.PriceRefresher)
		if !ok {
			return nil // a provider no longer configured
		}
		var t providers.PriceTable
		if err := json.Unmarshal(raw, &t); err != nil {
			f.log.Warn("stored price table unreadable; configured prices apply", "provider", name, "err", err)
			return nil
		}
		if err := t.Validate(); err != nil || t.Provider != name {
			f.log.Warn("stored price table invalid; configured prices apply", "provider", name, "err", err)
			return nil
		}
		r.UsePrices(t)
		return nil
	})
}

// PriceRefreshersLocked returns the providers with a price list (only want's
// when want is not empty) and whether want names a configured provider
// (under the lock).
func (f *Fleet) PriceRefreshersLocked(want string) (map[string]providers.PriceRefresher, bool) {
	_, known := f.providers[want]
	refreshers := map[string]providers.PriceRefresher{}
	for name, p := range f.providers {
		if r, ok := p.(providers.PriceRefresher); ok && (want == "" || want == name) {
			refreshers[name] = r
		}
	}
	return refreshers, known
}

// RefreshPrices has each of refreshers read its price list now, keeps
// each new table in the store and hands it to its provider; by names who
// asked. It answers each provider's table or error, and the errors; an
// error of its own is the store's.
func (f *Fleet) RefreshPrices(ctx context.Context, refreshers map[string]providers.PriceRefresher, by string) ([]api.PriceRefresh, []string, error) {
	f.refreshing.Lock()
	defer f.refreshing.Unlock()
	out := make([]api.PriceRefresh, 0, len(refreshers))
	var failed []string
	for _, name := range slices.Sorted(maps.Keys(refreshers)) {
		r := refreshers[name]
		fctx, cancel := context.WithTimeout(ctx, priceFetchTimeout)
		t, err := r.FetchPrices(fctx)
		cancel()
		if err != nil {
			f.log.Warn("price list refresh failed", "provider", name, "err", err)
			out = append(out, api.PriceRefresh{Provider: name, Error: err.Error()})
			failed = append(failed, name+": "+err.Error())
			continue
		}
		t.Provider, t.FetchedAt = name, f.clock.Now().UTC()
		raw, err := json.Marshal(t)
		if err != nil {
			return nil, nil, err
		}
		if err := f.store.Update(ctx, func(tx broker.Tx) error { return tx.Put(broker.BucketMeta, priceTableKey+name, raw) }); err != nil {
			return nil, nil, fmt.Errorf("store the price table of %s: %w", name, err)
		}
		r.UsePrices(t)
		f.log.Info("on-demand prices refreshed", "provider", name, "types", len(t.OnDemand), "missing", strings.Join(t.Missing, ","),
			"by", by)
		out = append(out, api.PriceRefresh{Provider: name, Table: &t})
	}
	f.staleOffers()
	return out, failed, nil
}

// ClearPrices drops the refreshed tables of refreshers from the store
// and the providers, whose on-demand offers take their configured prices
// again; by names who asked. It answers the providers whose table it
// dropped.
func (f *Fleet) ClearPrices(ctx context.Context, refreshers map[string]providers.PriceRefresher, by string) ([]string, error) {
	f.refreshing.Lock()
	defer f.refreshing.Unlock()
	cleared := []string{}
	err := f.store.Update(ctx, func(tx broker.Tx) error {
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
		return nil, err
	}
	for _, name := range cleared {
		refreshers[name].UsePrices(providers.PriceTable{Provider: name})
		f.log.Info("refreshed prices cleared; configured prices apply", "provider", name, "by", by)
	}
	f.staleOffers()
	return cleared, nil
}

// staleOffers has the next decision and `spillway offers` ask the
// providers again.
func (f *Fleet) staleOffers() {
	f.st.Lock()
	f.offersAt = time.Time{}
	f.st.Unlock()
}
