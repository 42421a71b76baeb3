package broker_test

import (
	"testing"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/storetest"
)

// TestMemStoreConformance runs the store suite on the in-memory store the
// simulator keeps its budgets in; "reopen" keeps the same memory (the
// store has no restarts to survive).
func TestMemStoreConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{Open: func(t *testing.T) (broker.Store, func() broker.Store) {
		s := broker.NewMemStore()
		return s, func() broker.Store { return s }
	}})
}
