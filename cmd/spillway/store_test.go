package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/bolt"
	"github.com/spillway-dev/spillway/broker/redis"
)

// redisURL returns a Redis store URL under a fresh prefix, wiped when the
// test ends; it skips (fails under CI=true) without Redis.
func redisURL(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	url := "redis://127.0.0.1:6379/0?prefix=spillway-test-" + hex.EncodeToString(b)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := redis.Open(ctx, url, redis.Options{})
	if err != nil {
		msg := "start redis-server on 127.0.0.1:6379: " + err.Error()
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Cleanup(func() {
		if err := s.Wipe(context.Background()); err != nil {
			t.Error(err)
		}
		s.Close()
	})
	return url
}

func run(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := execute(args, &out, &errOut)
	return out.String(), errOut.String(), code
}

func dump(t *testing.T, s broker.Store) map[string]string {
	t.Helper()
	out := map[string]string{}
	bs, err := s.(broker.BucketLister).Buckets(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	err = s.View(context.Background(), func(tx broker.Tx) error {
		for _, b := range bs {
			if err := tx.Scan(b, "", "", func(k string, v []byte) error {
				out[string(b)+"/"+k] = string(v)
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestStoreCopy: bolt → Redis → bolt keeps every key of every bucket
// (more than one chunk of them), a non-empty target is refused without
// --force, and --force replaces what the target held.
func TestStoreCopy(t *testing.T) {
	url := redisURL(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src.db")
	s, err := bolt.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	err = s.Update(context.Background(), func(tx broker.Tx) error {
		for i := 0; i < 1200; i++ {
			j := &broker.Job{ID: fmt.Sprintf("J%04d", i), State: broker.StatePending, SubmittedAt: now,
				Spec: broker.Spec{Name: "n", Team: "nlp", Queue: "default", Command: []string{"true"}}}
			j.Transit(now, broker.StatePending, "submitted", "by alice")
			if err := broker.PutJob(tx, j); err != nil {
				return err
			}
		}
		if _, err := broker.AppendLog(tx, "J0001", 1, 0, []byte("hello\n"), 1<<20); err != nil {
			return err
		}
		if err := tx.Put(broker.BucketLedger, "2026-11/0001", []byte(`{"gpuSeconds":3600}`)); err != nil {
			return err
		}
		return tx.Put(broker.Bucket("added-later"), "k", []byte{0, 1, 0xff})
	})
	if err != nil {
		t.Fatal(err)
	}
	want := dump(t, s)
	s.Close()

	out, errOut, code := run(t, "store", "copy", "--from", "bolt://"+src, "--to", url)
	if code != 0 {
		t.Fatalf("copy exit %d: %s", code, errOut)
	}
	for _, b := range []string{"jobs", "active", "logs", "logmeta", "ledger", "added-later"} {
		if !strings.Contains(out, b) {
			t.Errorf("copy report lacks bucket %s:\n%s", b, out)
		}
	}
	r, err := redis.Open(context.Background(), url, redis.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := dump(t, r); len(got) != len(want) || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("redis holds %d keys, bolt %d (or values differ)", len(got), len(want))
	}
	r.Close()

	if _, errOut, code := run(t, "store", "copy", "--from", "bolt://"+src, "--to", url); code == 0 || !strings.Contains(errOut, "--force") {
		t.Fatalf("copy into a non-empty target: exit %d, %s", code, errOut)
	}
	// Back to a new bolt file, over a target holding a stray key.
	back := filepath.Join(dir, "back.db")
	b, err := bolt.Open(back)
	if err != nil {
		t.Fatal(err)
	}
	b.Update(context.Background(), func(tx broker.Tx) error { return tx.Put(broker.BucketMeta, "stray", nil) })
	b.Close()
	if _, errOut, code := run(t, "store", "copy", "--from", url, "--to", back, "--force"); code != 0 {
		t.Fatalf("copy back: exit %d: %s", code, errOut)
	}
	b, err = bolt.Open(back)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if got := dump(t, b); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("round trip changed the data: %d keys, want %d", len(got), len(want))
	}
}
