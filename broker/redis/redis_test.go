package redis

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/billing/billingtest"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/storetest"
)

// addr is the Redis the tests use.
const addr = "127.0.0.1:6379"

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// needRedis skips (or, under CI=true, fails) when no Redis answers.
func needRedis(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := Open(ctx, "redis://"+addr+"/0", Options{Logger: quiet})
	if err == nil {
		s.Close()
		return
	}
	msg := "start redis-server on " + addr + " (apt-get install -y redis-server; redis-server --daemonize yes): " + err.Error()
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// testPrefix is a key prefix no other test uses.
func testPrefix(t testing.TB) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "spillway-test-" + hex.EncodeToString(b)
}

// open opens a store under a fresh prefix and wipes it when the test ends.
func open(t testing.TB, prefix string) *Store {
	t.Helper()
	s, err := Open(context.Background(), "redis://"+addr+"/0?prefix="+prefix, Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func wipeAtEnd(t testing.TB, prefix string) {
	t.Cleanup(func() {
		s := open(t, prefix)
		defer s.Close()
		if err := s.Wipe(context.Background()); err != nil {
			t.Errorf("clean up %s: %v", prefix, err)
		}
	})
}

func TestRedisConformance(t *testing.T) {
	needRedis(t)
	storetest.Run(t, storetest.Harness{
		Open: func(t *testing.T) (broker.Store, func() broker.Store) {
			prefix := testPrefix(t)
			wipeAtEnd(t, prefix)
			cur := open(t, prefix)
			t.Cleanup(func() { cur.Close() })
			return cur, func() broker.Store {
				if err := cur.Close(); err != nil {
					t.Fatal(err)
				}
				cur = open(t, prefix)
				return cur
			}
		},
		AdvanceFence: func(t *testing.T, s broker.Store) uint64 {
			v, err := s.(*Store).AdvanceFence(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			return v
		},
	})
}

// TestLedgerConformance: the billing ledger on Redis passes the same
// contract as on bbolt.
func TestLedgerConformance(t *testing.T) {
	needRedis(t)
	billingtest.RunStoreConformance(t, func(t *testing.T) billingtest.Backend {
		prefix := testPrefix(t)
		wipeAtEnd(t, prefix)
		s := open(t, prefix)
		t.Cleanup(func() { s.Close() })
		return broker.Ledger{Store: s}
	})
}
