// Package storetest is the conformance suite every broker.Store passes:
// the same tests run against bbolt and against a real Redis, so the broker
// cannot tell them apart.
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/broker"
)

// Harness opens stores for the suite.
type Harness struct {
	// Open returns an empty store and a function that closes it and opens
	// the same data again (a broker restart).
	Open func(t *testing.T) (s broker.Store, reopen func() broker.Store)
	// AdvanceFence, for a store that implements broker.Fenced, moves the
	// cluster's fence counter on as a newly elected leader would and
	// returns the new value. The fencing tests run only when it is set.
	AdvanceFence func(t *testing.T, s broker.Store) uint64
}

// Run runs the whole suite.
func Run(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(*testing.T, Harness)
	}{
		{"get put delete", testGetPutDelete},
		{"get many reads in order and sees own writes", testGetMany},
		{"get many is serializable", testGetManySerializable},
		{"active jobs are read in chunks, in order", testActiveJobsChunks},
		{"scan is ordered and bounded", testScan},
		{"failed update writes nothing", testRollback},
		{"view sees only committed data", testIsolation},
		{"concurrent updates are serializable", testSerializable},
		{"batch commits every caller", testBatch},
		{"writes survive a restart", testDurable},
		{"buckets are separate", testBuckets},
		{"jobs keep their active index", testJobs},
		{"job listing filters and pages", testListJobs},
		{"team listings read the team index", testTeamIndex},
		{"the audit log is append-only and ordered", testAudit},
		{"logs append once", testLogs},
		{"nodes round trip", testNodes},
		{"update sees its own writes in scans", testOwnWritesInScan},
		{"long scans cross pages", testLongScan},
		{"buckets are listed", testBucketLister},
		{"budget reservations never overspend", testBudgetRace},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, h) })
	}
	if h.AdvanceFence == nil {
		return
	}
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, Harness)
	}{
		{"fence: unset writes unchecked", testFenceUnset},
		{"fence: older token is refused", testFenceOlderToken},
		{"fence: token 0 is refused once a leader existed", testFenceZero},
		{"fence: advance during a transaction", testFenceDuringTx},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, h) })
	}
}

var ctx = context.Background()

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, s broker.Store, b broker.Bucket, k string) (string, error) {
	t.Helper()
	var out string
	err := s.View(ctx, func(tx broker.Tx) error {
		v, err := tx.Get(b, k)
		out = string(v)
		return err
	})
	return out, err
}

func put(t *testing.T, s broker.Store, b broker.Bucket, kv ...string) {
	t.Helper()
	must(t, s.Update(ctx, func(tx broker.Tx) error {
		for i := 0; i < len(kv); i += 2 {
			if err := tx.Put(b, kv[i], []byte(kv[i+1])); err != nil {
				return err
			}
		}
		return nil
	}))
}

func keys(t *testing.T, s broker.Store, b broker.Bucket, from, to string, reverse bool, stopAfter int) []string {
	t.Helper()
	var out []string
	must(t, s.View(ctx, func(tx broker.Tx) error {
		fn := func(k string, _ []byte) error {
			out = append(out, k)
			if stopAfter > 0 && len(out) == stopAfter {
				return broker.ErrStopScan
			}
			return nil
		}
		if reverse {
			return tx.ScanReverse(b, from, to, fn)
		}
		return tx.Scan(b, from, to, fn)
	}))
	return out
}

func testGetPutDelete(t *testing.T, h Harness) {
	s, _ := h.Open(t)
	if _, err := get(t, s, broker.BucketMeta, "missing"); !errors.Is(err, broker.ErrNotFound) {
		t.Fatalf("Get missing = %v, want ErrNotFound", err)
	}
	put(t, s, broker.BucketMeta, "a", "1")
	if v, err := get(t, s, broker.BucketMeta, "a"); err != nil || v != "1" {
		t.Fatalf("Get a = %q, %v", v, err)
	}
	put(t, s, broker.BucketMeta, "a", "2")
	if v, _ := get(t, s, broker.BucketMeta, "a"); v != "2" {
		t.Fatalf("overwrite: got %q", v)
	}
	put(t, s, broker.BucketMeta, "empty", "")
	if v, err := get(t, s, broker.BucketMeta, "empty"); err != nil || v != "" {
		t.Fatalf("empty value: %q, %v", v, err)
	}
	must(t, s.Update(ctx, func(tx broker.Tx) error { return tx.Delete(broker.BucketMeta, "a") }))
	must(t, s.Update(ctx, func(tx broker.Tx) error { return tx.Delete(broker.BucketMeta, "never-there") }))
	if _, err := get(t, s, broker.BucketMeta, "a"); !errors.Is(err, broker.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
}

func testGetMany(t *testing.T, h Harness) {
	s, _ := h.Open(t)
	put(t, s, broker.BucketMeta, "a", "1", "b", "", "c", "3")
	// str shows a missing value as <nil>, an empty one as "".
	str := func(vs [][]byte) []string {
		var out []string
		for _, v := range vs {
			if v == nil {
				out = append(out, "<nil>")
			} else {
				out = append(out, strconv.Quote(string(v)))
			}
		}
		return out
	}
	keys := []string{"x", "a", "b", "c", "d", "a"}
	var got []string
	must(t, s.View(ctx, func(tx broker.Tx) error {
		vs, err := broker.GetMany(tx, broker.BucketMeta, keys)
		got = str(vs)
		return err
	}))
	if d := cmp.Diff([]string{"<nil>", `"1"`, `""`, `"3"`, "<nil>", `"1"`}, got); d != "" {
		t.Fatalf("GetMany in View (-want +got):\n%s", d)
	}
	must(t, s.Update(ctx, func(tx broker.Tx) error {
		must(t, tx.Delete(broker.BucketMeta, "c"))
		must(t, tx.Put(broker.BucketMeta, "d", []byte("4")))
		must(t, tx.Put(broker.BucketMeta, "a", nil))
		vs, err := broker.GetMany(tx, broker.BucketMeta, keys)
		got = str(vs)
		return err
	}))
	if d := cmp.Diff([]string{"<nil>", `""`, `""`, "<nil>", `"4"`, `""`}, got); d != "" {
		t.Fatalf("GetMany after the transaction's own writes (-want +got):\n%s", d)
	}
	// More keys than one round trip asks for.
	const n = 2500
	many := make([]string, n)
	must(t, s.Update(ctx, func(tx broker.Tx) error {
		for i := range n {
			many[i] = fmt.Sprintf("k%05d", n-1-i) // descending: the order asked is the order answered
			if err := tx.Put(broker.BucketAudit, many[i], []byte(strconv.Itoa(n-1-i))); err != nil {
				return err
			}
		}
		return nil
	}))
	must(t, s.View(ctx, func(tx broker.Tx) error {
		vs, err := broker.GetMany(tx, broker.BucketAudit, many)
		if err != nil {
			return err
		}
		for i, v := range vs {
			if want := strconv.Itoa(n - 1 - i); string(v) != want {
				t.Fatalf("GetMany of %d keys: [%d] = %q, want %q", n, i, v, want)
			}
		}
		return nil
	}))
}

// testGetManySerializable is testSerializable reading through GetMany: a
// key it read and another transaction wrote makes the commit run again.
func testGetManySerializable(t *testing.T, h Harness) {
	countConcurrently(t, h, func(tx broker.Tx) (string, error) {
		vs, err := broker.GetMany(tx, broker.BucketMeta, []string{"other", "counter"})
		if err != nil {
			return "", err
		}
		return string(vs[1]), nil
	})
}

func testActiveJobsChunks(t *testing.T, h Harness) {
	s, _ := h.Open(t)
	const n = 2500
	var want []string
	must(t, s.Update(ctx, func(tx broker.Tx) error {
		for i := range n {
			st := broker.StatePending
			if i%7 == 0 {
				st = broker.StateSucceeded // not active
			} else {
				want = append(want, fmt.Sprintf("01J%05d", i))
			}
			if err := broker.PutJob(tx, job(fmt.Sprintf("01J%05d", i), "nlp", "default", st)); err != nil {
				return err
			}
		}
		return nil
	}))
	var got []string
	must(t, s.View(ctx, func(tx broker.Tx) error {
		js, err := broker.ActiveJobs(tx)
		for _, j := range js {
			got = append(got, j.ID)
		}
		return err
	}))
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("ActiveJobs (-want +got):\n%s", d)
	}
	// An active index entry without its job is an error, not a gap.
	must(t, s.Update(ctx, func(tx broker.Tx) error { return tx.Put(broker.BucketActive, "01J99999", nil) }))
	err := s.View(ctx, func(tx broker.Tx) error { _, err := broker.ActiveJobs(tx); return err })
	if !errors.Is(err, broker.ErrNotFound) || !strings.Contains(err.Error(), "01J99999") {
		t.Fatalf("ActiveJobs with a dangling index entry: %v, want ErrNotFound naming 01J99999", err)
	}
}

func testScan(t *testing.T, h Harness) {
	s, _ := h.Open(t)
	if got := keys(t, s, broker.BucketMeta, "", "", false, 0); len(got) != 0 {
		t.Fatalf("empty bucket scan = %v", got)
	}
	put(t, s, broker.BucketMeta, "b", "", "a/2", "", "a/1", "", "c", "", "a/10", "", "\xffz", "")
	all := []string{"a/1", "a/10", "a/2", "b", "c", "\xffz"}
	if d := cmp.Diff(all, keys(t, s, broker.BucketMeta, "", "", false, 0)); d != "" {
		t.Errorf("full scan (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"a/1", "a/10", "a/2"}, keys(t, s, broker.BucketMeta, "a/", broker.PrefixEnd("a/"), false, 0)); d != "" {
		t.Errorf("prefix scan (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"b", "c"}, keys(t, s, broker.BucketMeta, "ab", "d", false, 0)); d != "" {
		t.Errorf("bounded scan (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"\xffz", "c", "b", "a/2", "a/10", "a/1"}, keys(t, s, broker.BucketMeta, "", "", true, 0)); d != "" {
		t.Errorf("reverse scan (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"b", "a/2"}, keys(t, s, broker.BucketMeta, "a/2", "c", true, 0)); d != "" {
		t.Errorf("bounded reverse scan (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"c", "b"}, keys(t, s, broker.BucketMeta, "", "ca", true, 2)); d != "" {
		t.Errorf("reverse scan stopped after 2 (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"a/1"}, keys(t, s, broker.BucketMeta, "", "", false, 1)); d != "" {
		t.Errorf("scan stopped after 1 (-want +got):\n%s", d)
	}
	boom := errors.New("boom")
	err := s.View(ctx, func(tx broker.Tx) error {
		return tx.Scan(broker.BucketMeta, "", "", func(string, []byte) error { return boom })
	})
	if !errors.Is(err, boom) {
		t.Errorf("callback error not returned: %v", err)
	}
}

func testRollback(t *testing.T, h Harness) {
	s, _ := h.Open(t)
	put(t, s, broker.BucketMeta, "keep", "old")
	boom := errors.New("boom")
	err := s.Update(ctx, func(tx broker.Tx) error {
		if err := tx.Put(broker.BucketMeta, "keep", []byte("new")); err != nil {
			return err
		}
		if err := tx.Put(broker.BucketMeta, "added", []byte("x")); err != nil {
			return err
		}
		// The transaction sees its own writes.
		if v, err := tx.Get(broker.BucketMeta, "keep"); err != nil || string(v) != "new" {
			t.Errorf("own write not visible: %q %v", v, err)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Update returned %v, want boom", err)
	}
	if v, _ := get(t, s, broker.BucketMeta, "keep"); v != "old" {
		t.Errorf("keep = %q after rollback", v)
	}
	if _, err := get(t, s, broker.BucketMeta, "added"); !errors.Is(err, broker.ErrNotFound) {
		t.Errorf("added exists after rollback: %v", err)
	}
}

func testIsolation(t *testing.T, h Harness) {
	s, _ := h.Open(t)
	put(t, s, broker.BucketMeta, "k", "committed")
	inside := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.Update(ctx, func(tx broker.Tx) error {
			if err := tx.Put(broker.BucketMeta, "k", []byte("uncommitted")); err != nil {
				return err
			}
			select {
			case <-inside:
			default:
				close(inside)
			}
			<-release
			return errors.New("abort")
		})
	}()
	<-inside
	// Redis stores buffer writes until EXEC, bbolt keeps them in the writer's
	// pages: either way a reader must not see them.
	if v, _ := get(t, s, broker.BucketMeta, "k"); v != "committed" {
		t.Errorf("reader saw %q", v)
	}
	close(release)
	<-done
}

func testSerializable(t *testing.T, h Harness) {
	countConcurrently(t, h, func(tx broker.Tx) (string, error) {
		v, err := tx.Get(broker.BucketMeta, "counter")
		if errors.Is(err, broker.ErrNotFound) {
			return "", nil
		}
		return string(v), err
	})
}

// countConcurrently has 8 workers add 1 to a counter 25 times each, each
// addition an Update that reads the counter through read: no addition
// may be lost.
func countConcurrently(t *testing.T, h Harness, read func(broker.Tx) (string, error)) {
	s, _ := h.Open(t)
	const workers, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range each {
				err := s.Update(ctx, func(tx broker.Tx) error {
					v, err := read(tx)
					if err != nil {
						return err
					}
					n, _ := strconv.Atoi(v)
					return tx.Put(broker.BucketMeta, "counter", []byte(strconv.Itoa(n+1)))
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if v, _ := get(t, s, broker.BucketMeta, "counter"); v != strconv.Itoa(workers*each) {
		t.Fatalf("counter = %s, want %d (lost updates)", v, workers*each)
	}
}

func testBatch(t *testing.T, h Harness) {
	s, _ := h.Open(t)
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs <- s.Batch(ctx, func(tx broker.Tx) error {
				return tx.Put(broker.BucketJobs, fmt.Sprintf("job-%04d", i), []byte("x"))
			})
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := len(keys(t, s, broker.BucketJobs, "", "", false, 0)); got != n {
		t.Fatalf("%d keys after %d batches", got, n)
	}
	// A group-commit store counts every call once, in commits that carry
	// one call or more, and the time its writer spent on them.
	if gc, ok := s.(broker.GroupCommitter); ok {
		st := gc.GroupCommits()
		if st.Calls != n || st.Commits < 1 || st.Commits > n || st.Busy <= 0 {
			t.Fatalf("group commits after %d batch calls: %+v, want %d calls in 1 to %d commits with busy time", n, st, n, n)
		}
	}
	// Members that fail among members that succeed, concurrently: each
	// failure leaves nothing, each success lands.
	errs = make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			err := s.Batch(ctx, func(tx broker.Tx) error {
				if err := tx.Put(broker.BucketNodes, fmt.Sprintf("mixed-%04d", i), []byte("x")); err != nil {
					return err
				}
				if i%2 == 1 {
					return fmt.Errorf("member %d: %w", i, broker.ErrConflict)
				}
				return nil
			})
			if (err != nil) != (i%2 == 1) {
				errs <- fmt.Errorf("member %d: Batch returned %v", i, err)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	mixed := keys(t, s, broker.BucketNodes, "mixed-", broker.PrefixEnd("mixed-"), false, 0)
	if len(mixed) != n/2 {
		t.Fatalf("%d keys after %d succeeding members", len(mixed), n/2)
	}
	for _, k := range mixed {
		var i int
		fmt.Sscanf(k, "mixed-%d", &i)
		if i%2 == 1 {
			t.Fatalf("failed member %s was written", k)
		}
	}
	// A failing batch member writes nothing of its own.
	boom := errors.New("boom")
	err := s.Batch(ctx, func(tx broker.Tx) error {
		if err := tx.Put(broker.BucketJobs, "zz-failed", []byte("x")); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Batch returned %v", err)
	}
	if _, err := get(t, s, broker.BucketJobs, "zz-failed"); !errors.Is(err, broker.ErrNotFound) {
		t.Fatalf("failed batch member was written: %v", err)
	}
}

func testDurable(t *testing.T, h Harness) {
	s, reopen := h.Open(t)
	put(t, s, broker.BucketMeta, "a", "1")
	must(t, s.Batch(ctx, func(tx broker.Tx) error { return tx.Put(broker.BucketMeta, "b", []byte("2")) }))
	s = reopen()
	for k, want := range map[string]string{"a": "1", "b": "2"} {
		if v, err := get(t, s, broker.BucketMeta, k); err != nil || v != want {
			t.Errorf("after reopen %s = %q, %v", k, v, err)
		}
	}
}

func testBuckets(t *testing.T, h Harness) {
	s, _ := h.Open(t)
	put(t, s, broker.BucketMeta, "k", "meta")
	put(t, s, broker.BucketNodes, "k", "nodes")
	if v, _ := get(t, s, broker.BucketMeta, "k"); v != "meta" {
		t.Errorf("meta k = %q", v)
	}
	if got := keys(t, s, broker.BucketJobs, "", "", false, 0); len(got) != 0 {
		t.Errorf("jobs bucket has %v", got)
	}
}

func job(id, team, queue string, st broker.State) *broker.Job {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	return &broker.Job{ID: id, State: st, SubmittedAt: now,
		Spec: broker.Spec{Name: "n", Team: team, Queue: queue, Command: []string{"true"},
			Resources: broker.Resources{GPUs: 1, Nodes: 1}}}
}

func testJobs(t *testing.T, h Harness) {
	s, reopen := h.Open(t)
	j := job("01A", "nlp", "default", broker.StatePending)
	j.Transit(j.SubmittedAt, broker.StatePending, "submitted", "by alice")
	must(t, s.Update(ctx, func(tx broker.Tx) error { return broker.PutJob(tx, j) }))
	s = reopen()
	var got *broker.Job
	must(t, s.View(ctx, func(tx broker.Tx) error {
		var err error
		got, err = broker.GetJob(tx, "01A")
		return err
	}))
	if d := cmp.Diff(j, got); d != "" {
		t.Fatalf("job round trip (-want +got):\n%s", d)
	}
	active := func() []string {
		var ids []string
		must(t, s.View(ctx, func(tx broker.Tx) error {
			js, err := broker.ActiveJobs(tx)
			for _, j := range js {
				ids = append(ids, j.ID)
			}
			return err
		}))
		return ids
	}
	if d := cmp.Diff([]string{"01A"}, active()); d != "" {
		t.Fatalf("active (-want +got):\n%s", d)
	}
	got.Transit(got.SubmittedAt.Add(time.Minute), broker.StateSucceeded, "exited", "exit code 0")
	must(t, s.Update(ctx, func(tx broker.Tx) error { return broker.PutJob(tx, got) }))
	if a := active(); len(a) != 0 {
		t.Fatalf("terminal job still active: %v", a)
	}
}

func testListJobs(t *testing.T, h Harness) {
	s, _ := h.Open(t)
	must(t, s.Update(ctx, func(tx broker.Tx) error {
		for i := 0; i < 25; i++ {
			team := []string{"nlp", "vision"}[i%2]
			st := broker.StatePending
			if i%5 == 0 {
				st = broker.StateSucceeded
			}
			if err := broker.PutJob(tx, job(fmt.Sprintf("J%02d", i), team, "default", st)); err != nil {
				return err
			}
		}
		return nil
	}))
	list := func(f broker.JobFilter) ([]string, string) {
		var ids []string
		var next string
		must(t, s.View(ctx, func(tx broker.Tx) error {
			pg, err := broker.ListJobs(tx, f)
			for _, j := range pg.Jobs {
				ids = append(ids, j.ID)
			}
			next = pg.Next
			return err
		}))
		return ids, next
	}
	ids, next := list(broker.JobFilter{Team: "nlp", Limit: 5})
	if d := cmp.Diff([]string{"J24", "J22", "J20", "J18", "J16"}, ids); d != "" {
		t.Errorf("page 1 (-want +got):\n%s", d)
	}
	ids, _ = list(broker.JobFilter{Team: "nlp", Limit: 5, Cursor: next})
	if d := cmp.Diff([]string{"J14", "J12", "J10", "J08", "J06"}, ids); d != "" {
		t.Errorf("page 2 (-want +got):\n%s", d)
	}
	ids, _ = list(broker.JobFilter{States: []broker.State{broker.StateSucceeded}})
	if d := cmp.Diff([]string{"J20", "J15", "J10", "J05", "J00"}, ids); d != "" {
		t.Errorf("succeeded (-want +got):\n%s", d)
	}
	ids, next = list(broker.JobFilter{States: []broker.State{broker.StatePending}, Team: "vision", Limit: 3})
	if d := cmp.Diff([]string{"J23", "J21", "J19"}, ids); d != "" || next != "J19" {
		t.Errorf("pending vision (-want +got):\n%s next=%q", d, next)
	}
	ids, next = list(broker.JobFilter{Queue: "inference"})
	if len(ids) != 0 || next != "" {
		t.Errorf("other queue: %v %q", ids, next)
	}
}

func testLogs(t *testing.T, h Harness) {
	s, _ := h.Open(t)
	appendLog := func(off int64, data string, limit int64) (broker.LogMeta, error) {
		var m broker.LogMeta
		err := s.Update(ctx, func(tx broker.Tx) error {
			var err error
			m, err = broker.AppendLog(tx, "J1", 1, off, []byte(data), limit)
			return err
		})
		return m, err
	}
	read := func(from int64, max int) string {
		var out []byte
		must(t, s.View(ctx, func(tx broker.Tx) error {
			var err error
			out, err = broker.ReadLog(tx, "J1", 1, from, max)
			return err
		}))
		return string(out)
	}
	if _, err := appendLog(0, "hello ", 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := appendLog(0, "hello ", 1<<20); err != nil { // resent chunk
		t.Fatal(err)
	}
	if m, err := appendLog(3, "lo world\n", 1<<20); err != nil || m.Size != 12 { // overlapping chunk
		t.Fatalf("overlap: %+v %v", m, err)
	}
	if _, err := appendLog(40, "gap", 1<<20); !errors.Is(err, broker.ErrConflict) {
		t.Fatalf("gap accepted: %v", err)
	}
	if got := read(0, 100); got != "hello world\n" {
		t.Fatalf("log = %q", got)
	}
	if got := read(4, 5); got != "o wor" {
		t.Fatalf("ranged read = %q", got)
	}
	m, err := appendLog(12, "0123456789", 20)
	if err != nil || m.Received() != 22 || m.Dropped != 2 || m.Size != 20+int64(len(broker.LogTruncatedMarker(20))) {
		t.Fatalf("capped append: %+v %v", m, err)
	}
	if got := read(12, 100); got != "01234567"+broker.LogTruncatedMarker(20) {
		t.Fatalf("tail after cap = %q", got)
	}
	// Past the cap every chunk is acknowledged, none refused (finding 3).
	if m, err := appendLog(22, "more", 20); err != nil || m.Received() != 26 || m.Dropped != 6 {
		t.Fatalf("append past cap: %+v %v", m, err)
	}
}

func testNodes(t *testing.T, h Harness) {
	s, _ := h.Open(t)
	n := &broker.Node{Name: "gpu-a", Pool: "onprem", State: broker.NodeReady, Generation: 3,
		Unhealthy: map[int]string{2: "xid 79"}}
	must(t, s.Update(ctx, func(tx broker.Tx) error { return broker.PutNode(tx, n) }))
	var got []*broker.Node
	must(t, s.View(ctx, func(tx broker.Tx) error {
		var err error
		got, err = broker.ListNodes(tx)
		return err
	}))
	if d := cmp.Diff([]*broker.Node{n}, got); d != "" {
		t.Fatalf("nodes (-want +got):\n%s", d)
	}
}

func testOwnWritesInScan(t *testing.T, h Harness) {
	s, _ := h.Open(t)
	put(t, s, broker.BucketMeta, "a", "1", "c", "3", "e", "5")
	var fwd, rev []string
	must(t, s.Update(ctx, func(tx broker.Tx) error {
		if err := tx.Put(broker.BucketMeta, "b", []byte("2")); err != nil {
			return err
		}
		if err := tx.Put(broker.BucketMeta, "c", []byte("33")); err != nil {
			return err
		}
		if err := tx.Delete(broker.BucketMeta, "e"); err != nil {
			return err
		}
		if err := tx.Put(broker.BucketMeta, "f", []byte("6")); err != nil {
			return err
		}
		collect := func(out *[]string) func(string, []byte) error {
			return func(k string, v []byte) error {
				*out = append(*out, k+"="+string(v))
				return nil
			}
		}
		if err := tx.Scan(broker.BucketMeta, "", "", collect(&fwd)); err != nil {
			return err
		}
		return tx.ScanReverse(broker.BucketMeta, "b", "f", collect(&rev))
	}))
	if d := cmp.Diff([]string{"a=1", "b=2", "c=33", "f=6"}, fwd); d != "" {
		t.Errorf("scan inside the update (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"c=33", "b=2"}, rev); d != "" {
		t.Errorf("bounded reverse scan inside the update (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"a", "b", "c", "f"}, keys(t, s, broker.BucketMeta, "", "", false, 0)); d != "" {
		t.Errorf("after commit (-want +got):\n%s", d)
	}
}

func testLongScan(t *testing.T, h Harness) {
	s, _ := h.Open(t)
	const n = 2500
	must(t, s.Update(ctx, func(tx broker.Tx) error {
		for i := 0; i < n; i++ {
			if err := tx.Put(broker.BucketAudit, fmt.Sprintf("k%05d", i), []byte(strconv.Itoa(i))); err != nil {
				return err
			}
		}
		return nil
	}))
	all := keys(t, s, broker.BucketAudit, "", "", false, 0)
	if len(all) != n || all[0] != "k00000" || all[n-1] != fmt.Sprintf("k%05d", n-1) {
		t.Fatalf("full scan: %d keys, first %q", len(all), all[0])
	}
	for i := 1; i < len(all); i++ {
		if all[i-1] >= all[i] {
			t.Fatalf("out of order at %d: %q then %q", i, all[i-1], all[i])
		}
	}
	rev := keys(t, s, broker.BucketAudit, "k00100", "k02100", true, 0)
	if len(rev) != 2000 || rev[0] != "k02099" || rev[1999] != "k00100" {
		t.Fatalf("bounded reverse scan: %d keys, %q … %q", len(rev), rev[0], rev[len(rev)-1])
	}
	// Buffered writes merge into a scan that crosses pages: delete every
	// third key, put one between every pair, and compare with a model.
	var want, got []string
	must(t, s.Update(ctx, func(tx broker.Tx) error {
		want, got = nil, nil
		for i := 0; i < n; i++ {
			k := fmt.Sprintf("k%05d", i)
			if i%3 == 0 {
				if err := tx.Delete(broker.BucketAudit, k); err != nil {
					return err
				}
			} else {
				want = append(want, k)
			}
			if i%7 == 0 {
				if err := tx.Put(broker.BucketAudit, k+"+", []byte("new")); err != nil {
					return err
				}
				want = append(want, k+"+")
			}
		}
		return tx.Scan(broker.BucketAudit, "", "", func(k string, _ []byte) error {
			got = append(got, k)
			return nil
		})
	}))
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("scan merged with buffered writes (-want +got):\n%s", d)
	}
	if d := cmp.Diff(want, keys(t, s, broker.BucketAudit, "", "", false, 0)); d != "" {
		t.Fatalf("after commit (-want +got):\n%s", d)
	}
	// Values travel with their keys across pages.
	must(t, s.View(ctx, func(tx broker.Tx) error {
		return tx.Scan(broker.BucketAudit, "", "", func(k string, v []byte) error {
			if strings.HasSuffix(k, "+") {
				return nil
			}
			if want := strings.TrimLeft(k[1:], "0"); want != string(v) && !(want == "" && string(v) == "0") {
				return fmt.Errorf("key %s has value %q", k, v)
			}
			return nil
		})
	}))
}

func fenced(t *testing.T, s broker.Store) broker.Fenced {
	t.Helper()
	f, ok := s.(broker.Fenced)
	if !ok {
		t.Fatalf("%T has AdvanceFence in its harness but does not implement broker.Fenced", s)
	}
	return f
}

func testFenceUnset(t *testing.T, h Harness) {
	s, _ := h.Open(t)
	h.AdvanceFence(t, s)
	h.AdvanceFence(t, s)
	put(t, s, broker.BucketMeta, "k", "v")
	if v, _ := get(t, s, broker.BucketMeta, "k"); v != "v" {
		t.Fatalf("unfenced write lost: %q", v)
	}
}

func testFenceOlderToken(t *testing.T, h Harness) {
	s, _ := h.Open(t)
	f := fenced(t, s)
	tok := h.AdvanceFence(t, s)
	f.SetFence(tok)
	put(t, s, broker.BucketMeta, "k", "leader1")
	if cur, err := f.Fence(ctx); err != nil || cur != tok {
		t.Fatalf("Fence() = %d, %v; want %d", cur, err, tok)
	}
	newer := h.AdvanceFence(t, s)
	if newer <= tok {
		t.Fatalf("AdvanceFence went from %d to %d", tok, newer)
	}
	err := s.Update(ctx, func(tx broker.Tx) error { return tx.Put(broker.BucketMeta, "k", []byte("stale")) })
	if !errors.Is(err, broker.ErrFenced) {
		t.Fatalf("Update with an old token = %v, want ErrFenced", err)
	}
	err = s.Batch(ctx, func(tx broker.Tx) error { return tx.Put(broker.BucketMeta, "b", []byte("stale")) })
	if !errors.Is(err, broker.ErrFenced) {
		t.Fatalf("Batch with an old token = %v, want ErrFenced", err)
	}
	if v, err := get(t, s, broker.BucketMeta, "k"); err != nil || v != "leader1" {
		t.Fatalf("fenced write landed or reads broke: %q, %v", v, err)
	}
	if _, err := get(t, s, broker.BucketMeta, "b"); !errors.Is(err, broker.ErrNotFound) {
		t.Fatalf("fenced batch landed: %v", err)
	}
	// Reads inside Update are not writes: a fenced broker may still read.
	must(t, s.Update(ctx, func(tx broker.Tx) error {
		_, err := tx.Get(broker.BucketMeta, "k")
		return err
	}))
	f.SetFence(newer)
	put(t, s, broker.BucketMeta, "k", "leader2")
	if v, _ := get(t, s, broker.BucketMeta, "k"); v != "leader2" {
		t.Fatalf("write with the current token: %q", v)
	}
}

func testFenceZero(t *testing.T, h Harness) {
	s, _ := h.Open(t)
	h.AdvanceFence(t, s)
	fenced(t, s).SetFence(0)
	err := s.Update(ctx, func(tx broker.Tx) error { return tx.Put(broker.BucketMeta, "k", []byte("x")) })
	if !errors.Is(err, broker.ErrFenced) {
		t.Fatalf("token 0 after a leader = %v, want ErrFenced", err)
	}
}

// testFenceDuringTx: a new leader wins while the old one is between its
// reads and its commit (the paused-leader case): the commit is refused,
// whether the transaction read anything or wrote blind.
func testFenceDuringTx(t *testing.T, h Harness) {
	s, _ := h.Open(t)
	f := fenced(t, s)
	f.SetFence(h.AdvanceFence(t, s))
	put(t, s, broker.BucketMeta, "n", "1")
	for _, read := range []bool{true, false} {
		var once sync.Once
		err := s.Update(ctx, func(tx broker.Tx) error {
			if read {
				if _, err := tx.Get(broker.BucketMeta, "n"); err != nil {
					return err
				}
			}
			if err := tx.Put(broker.BucketMeta, "n", []byte("2")); err != nil {
				return err
			}
			once.Do(func() { h.AdvanceFence(t, s) })
			return nil
		})
		if !errors.Is(err, broker.ErrFenced) {
			t.Fatalf("read=%v: commit after a new leader = %v, want ErrFenced", read, err)
		}
		if v, _ := get(t, s, broker.BucketMeta, "n"); v != "1" {
			t.Fatalf("read=%v: fenced commit landed: n = %q", read, v)
		}
		cur, err := f.Fence(ctx)
		must(t, err)
		f.SetFence(cur)
	}
}

func testBucketLister(t *testing.T, h Harness) {
	s, _ := h.Open(t)
	bl, ok := s.(broker.BucketLister)
	if !ok {
		t.Skipf("%T does not list its buckets", s)
	}
	put(t, s, broker.BucketMeta, "k", "v")
	put(t, s, broker.BucketNodes, "n", "v")
	put(t, s, broker.BucketAudit, "a", "v")
	must(t, s.Update(ctx, func(tx broker.Tx) error { return tx.Delete(broker.BucketAudit, "a") }))
	got, err := bl.Buckets(ctx)
	must(t, err)
	if d := cmp.Diff([]broker.Bucket{broker.BucketMeta, broker.BucketNodes}, got); d != "" {
		t.Fatalf("buckets (-want +got):\n%s", d)
	}
}

// testTeamIndex: a team's listing pages through that team's jobs only,
// newest first, and EnsureTeamIndex indexes jobs written before the index
// existed.
func testTeamIndex(t *testing.T, h Harness) {
	s, _ := h.Open(t)
	must(t, s.Update(ctx, func(tx broker.Tx) error {
		for i := 0; i < 30; i++ {
			team := "flood"
			if i%10 == 0 {
				team = "quiet"
			}
			if err := broker.PutJob(tx, job(fmt.Sprintf("01B%03d", i), team, "default", broker.StatePending)); err != nil {
				return err
			}
		}
		// Jobs from before the index, only in the jobs bucket: one of
		// quiet's, and more of another team's than the index is built
		// from at a time.
		for i := range 2501 {
			old := job(fmt.Sprintf("01A%04d", i), "past", "default", broker.StateSucceeded)
			if i == 0 {
				old = job("01A000", "quiet", "default", broker.StateSucceeded)
			}
			raw, err := json.Marshal(old)
			if err != nil {
				return err
			}
			if err := tx.Put(broker.BucketJobs, old.ID, raw); err != nil {
				return err
			}
		}
		return nil
	}))
	list := func(cursor string, limit int) ([]string, string) {
		var ids []string
		var next string
		must(t, s.View(ctx, func(tx broker.Tx) error {
			pg, err := broker.ListJobs(tx, broker.JobFilter{Team: "quiet", Limit: limit, Cursor: cursor})
			for _, j := range pg.Jobs {
				ids = append(ids, j.ID)
			}
			next = pg.Next
			return err
		}))
		return ids, next
	}
	if ids, _ := list("", 10); !slices.Equal(ids, []string{"01B020", "01B010", "01B000"}) {
		t.Fatalf("quiet's jobs before the index is built: %v", ids)
	}
	must(t, broker.EnsureTeamIndex(ctx, s))
	must(t, broker.EnsureTeamIndex(ctx, s)) // once is enough; twice is harmless
	ids, next := list("", 2)
	if !slices.Equal(ids, []string{"01B020", "01B010"}) || next != "01B010" {
		t.Fatalf("first page %v next %q", ids, next)
	}
	if ids, next = list(next, 2); !slices.Equal(ids, []string{"01B000", "01A000"}) {
		t.Fatalf("second page %v next %q", ids, next)
	}
	if past := keys(t, s, broker.BucketTeamJobs, "past/", broker.PrefixEnd("past/"), false, 0); len(past) != 2500 {
		t.Fatalf("the other team's jobs from before the index: %d indexed, want 2500", len(past))
	}
}

// testAudit: audit records come back oldest first within a time range,
// and an existing record is never overwritten.
func testAudit(t *testing.T, h Harness) {
	s, reopen := h.Open(t)
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	must(t, s.Update(ctx, func(tx broker.Tx) error {
		for i := 0; i < 5; i++ {
			r := broker.AuditRecord{At: t0.Add(time.Duration(i) * time.Minute), By: "admin", Action: "POST /v1/jobs/:id/cancel", Target: fmt.Sprint(i), Status: 200}
			if err := broker.AppendAudit(tx, fmt.Sprintf("id%d", i), r); err != nil {
				return err
			}
		}
		return nil
	}))
	err := s.Update(ctx, func(tx broker.Tx) error {
		return broker.AppendAudit(tx, "id0", broker.AuditRecord{At: t0, By: "mallory", Action: "rewrite"})
	})
	if !errors.Is(err, broker.ErrConflict) {
		t.Fatalf("an audit record was overwritten: %v", err)
	}
	s = reopen()
	var got []string
	must(t, s.View(ctx, func(tx broker.Tx) error {
		return broker.ScanAudit(tx, t0.Add(time.Minute), t0.Add(4*time.Minute), func(r broker.AuditRecord) error {
			got = append(got, r.Target+":"+r.By)
			return nil
		})
	}))
	if !slices.Equal(got, []string{"1:admin", "2:admin", "3:admin"}) {
		t.Fatalf("audit range: %v", got)
	}
}
