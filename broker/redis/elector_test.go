package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/spillway-dev/spillway/broker"
)

const testTTL = 600 * time.Millisecond

func elector(t *testing.T, s *Store, id string) *Elector {
	t.Helper()
	e, err := s.NewElector(ElectorConfig{ID: id, URL: "http://" + id + ":8080", TTL: testTTL, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// electorPair is two brokers' electors on one fresh prefix.
func electorPair(t *testing.T) (a, b *Elector, sa, sb *Store) {
	needRedis(t)
	prefix := testPrefix(t)
	wipeAtEnd(t, prefix)
	sa, sb = open(t, prefix), open(t, prefix)
	t.Cleanup(func() { sa.Close(); sb.Close() })
	return elector(t, sa, "a"), elector(t, sb, "b"), sa, sb
}

func TestElectorOneLeader(t *testing.T) {
	a, b, _, _ := electorPair(t)
	ctx := context.Background()
	a.step(ctx)
	b.step(ctx)
	sa, sb := a.Status(), b.Status()
	if !sa.Leader || sa.Token != 1 || sb.Leader || sb.Token != 0 {
		t.Fatalf("after one step each: a %+v, b %+v", sa, sb)
	}
	if sb.LeaderID != "a" || sb.LeaderURL != "http://a:8080" || b.LeaderURL() != "http://a:8080" {
		t.Fatalf("standby sees leader %q at %q", sb.LeaderID, sb.LeaderURL)
	}
	select {
	case <-a.Changes():
	default:
		t.Fatal("winning the lease sent no change")
	}
	// Renewing well before expiry keeps the lease past several TTLs.
	for end := time.Now().Add(3 * testTTL); time.Now().Before(end); {
		time.Sleep(a.step(ctx))
		b.step(ctx)
		if b.IsLeader() || !a.IsLeader() {
			t.Fatal("the lease changed hands while its holder renewed it")
		}
	}
}

// TestElectorStalledLeader: a leader that stops renewing (paused) loses
// its belief at its local deadline, a standby takes over once the lease
// has expired, with a newer token, and the old leader's writes are fenced.
func TestElectorStalledLeader(t *testing.T) {
	a, b, sa, sb := electorPair(t)
	ctx := context.Background()
	a.step(ctx)
	sa.SetFence(a.Status().Token)
	if err := sa.Update(ctx, func(tx broker.Tx) error { return tx.Put(broker.BucketMeta, "k", []byte("a")) }); err != nil {
		t.Fatal(err)
	}
	// The lower bound is the safety rule (no takeover before the lease
	// can have expired); the upper one only bounds the wait, since on a
	// loaded machine a step can come late.
	start := time.Now()
	for !b.IsLeader() {
		if time.Since(start) > testTTL+b.cfg.RenewEvery+30*time.Second {
			t.Fatalf("standby did not take over within %s", time.Since(start))
		}
		time.Sleep(b.step(ctx))
	}
	if took := time.Since(start); took < testTTL-testTTL/10 {
		t.Fatalf("standby took over after %s, before the lease could have expired", took)
	}
	if a.IsLeader() {
		t.Fatal("the stalled leader still believes it leads")
	}
	st := b.Status()
	if st.Token != 2 {
		t.Fatalf("new leader's token = %d, want 2", st.Token)
	}
	sb.SetFence(st.Token)
	err := sa.Update(ctx, func(tx broker.Tx) error { return tx.Put(broker.BucketMeta, "k", []byte("stale")) })
	if !errors.Is(err, broker.ErrFenced) {
		t.Fatalf("old leader's write = %v, want ErrFenced", err)
	}
	if err := sb.Update(ctx, func(tx broker.Tx) error { return tx.Put(broker.BucketMeta, "k", []byte("b")) }); err != nil {
		t.Fatal(err)
	}
	// The old leader resumes: its first step learns it lost.
	a.step(ctx)
	if sa := a.Status(); sa.Leader || sa.LeaderID != "" {
		t.Fatalf("resumed old leader: %+v", sa)
	}
	a.step(ctx)
	if got := a.Status(); got.Leader || got.LeaderID != "b" {
		t.Fatalf("resumed old leader sees %+v, want standby of b", got)
	}
}

// TestElectorStepDown: a leader whose Run ends gives the lease up, and a
// standby's next step takes it.
func TestElectorStepDown(t *testing.T) {
	a, b, _, _ := electorPair(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.Run(ctx); close(done) }()
	for !a.IsLeader() {
		time.Sleep(10 * time.Millisecond)
	}
	b.step(context.Background())
	if b.IsLeader() {
		t.Fatal("two leaders")
	}
	cancel()
	<-done
	if a.IsLeader() {
		t.Fatal("still leader after Run ended")
	}
	b.step(context.Background())
	if st := b.Status(); !st.Leader || st.Token != 2 {
		t.Fatalf("standby after a clean step-down: %+v", st)
	}
}

// TestElectorRedisDown: without Redis the elector leads nothing and says
// why.
func TestElectorRedisDown(t *testing.T) {
	s := &Store{rdb: goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond}),
		prefix: "{spillway-test-down}", log: quiet}
	defer s.Close()
	e := elector(t, s, "a")
	e.step(context.Background())
	st := e.Status()
	if st.Leader || st.Err == nil {
		t.Fatalf("status without redis: %+v", st)
	}
}
