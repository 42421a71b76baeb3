package bolt_test

import (
	"path/filepath"
	"testing"

	"github.com/spillway-dev/spillway/billing/billingtest"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/bolt"
)

func TestLedgerConformance(t *testing.T) {
	billingtest.RunStoreConformance(t, func(t *testing.T) billingtest.Backend {
		s, err := bolt.Open(filepath.Join(t.TempDir(), bolt.FileName))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return broker.Ledger{Store: s}
	})
}
