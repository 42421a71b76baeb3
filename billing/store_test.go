package billing_test

import (
	"testing"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/billing/billingtest"
)

func TestMemStoreConformance(t *testing.T) {
	billingtest.RunStoreConformance(t, func(*testing.T) billingtest.Backend { return billing.NewMemStore() })
}
