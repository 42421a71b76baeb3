package providers

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"
)

// SortOffers orders offers the way the burst controller tries them:
// available before unavailable, prepaid (leased, already paid for) before
// anything with a marginal price, then by price per hour, then by Key so
// the order is the same on every run.
func SortOffers(offers []Offer) {
	slices.SortStableFunc(offers, func(a, b Offer) int {
		if a.Available != b.Available {
			if a.Available {
				return -1
			}
			return 1
		}
		if a.Prepaid != b.Prepaid {
			if a.Prepaid {
				return -1
			}
			return 1
		}
		if c := cmp.Compare(a.PricePerHour, b.PricePerHour); c != 0 {
			return c
		}
		return cmp.Compare(a.Key(), b.Key())
	})
}

// FindOffer returns the offer in offers with the same Key as want.
func FindOffer(offers []Offer, want Offer) (Offer, bool) {
	k := want.Key()
	for _, o := range offers {
		if o.Key() == k {
			return o, true
		}
	}
	return Offer{}, false
}

// WaitRunning polls Get every interval until the machine is running and has
// an SSH address, and returns it. A machine that ends (terminated, or gone
// from the API) while waiting is an error wrapping ErrNotFound.
func WaitRunning(ctx context.Context, p Provider, id string, interval time.Duration) (*Instance, error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		inst, err := p.Get(ctx, id)
		switch {
		case err != nil:
			return nil, fmt.Errorf("wait for %s: %w", id, err)
		case inst.State == StateTerminated || inst.State == StateStopping:
			return nil, fmt.Errorf("wait for %s: machine is %s: %w", id, inst.State, ErrNotFound)
		case inst.State == StateRunning && inst.SSHHost != "":
			return inst, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for %s: %w", id, ctx.Err())
		case <-t.C:
		}
	}
}
