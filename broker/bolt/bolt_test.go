package bolt_test

import (
	"path/filepath"
	"testing"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/bolt"
	"github.com/spillway-dev/spillway/broker/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{Open: func(t *testing.T) (broker.Store, func() broker.Store) {
		path := filepath.Join(t.TempDir(), bolt.FileName)
		s, err := bolt.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		cur := s
		t.Cleanup(func() { cur.Close() })
		return s, func() broker.Store {
			if err := cur.Close(); err != nil {
				t.Fatal(err)
			}
			next, err := bolt.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			cur = next
			return next
		}
	}})
}
