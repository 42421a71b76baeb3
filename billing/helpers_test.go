package billing_test

import (
	"testing"

	"github.com/spillway-dev/spillway/billing"
)

// scan returns the store's entries of a period, in Scan order.
func scan(t *testing.T, s billing.Store, p billing.Period) []billing.Entry {
	t.Helper()
	var out []billing.Entry
	if err := s.Scan(t.Context(), p.From, p.To, func(e billing.Entry) error {
		out = append(out, e)
		return nil
	}); err != nil {
		t.Fatalf("Scan: %v", err)
	}
	return out
}
