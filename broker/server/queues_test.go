package server

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
)

func TestQueueOverview(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 8)
	h.submit(tokBob, `{"resources": {"gpus": 8}, "command": ["x"]}`)
	h.cycle()
	a.sync()
	first := h.submit(tokAlice, `{"resources": {"gpus": 4}, "priority": "high", "command": ["x"]}`)
	second := h.submit(tokAlice, `{"resources": {"gpus": 4}, "command": ["x"]}`)
	hidden := h.submit(tokBob, `{"resources": {"gpus": 2}, "priority": "low", "command": ["x"]}`)
	h.cycle()
	a.sync()
	var out struct {
		Queues []api.QueueView `json:"queues"`
	}
	if code := h.do("GET", "/v1/queues", tokAlice, nil, &out); code != http.StatusOK {
		t.Fatalf("queues: %d", code)
	}
	var def api.QueueView
	for _, q := range out.Queues {
		if q.Name == "default" {
			def = q
		}
	}
	if def.Running != 1 || def.GPUsRunning != 8 || def.Pending != 3 || def.GPUsWaiting != 10 {
		t.Fatalf("default queue %+v", def)
	}
	if len(def.Waiting) != 2 || def.Waiting[0].ID != first.ID || def.Waiting[1].ID != second.ID {
		t.Fatalf("alice sees %+v", def.Waiting)
	}
	if def.Waiting[0].Reason == nil || def.Waiting[0].Reason.Position != 1 || def.Waiting[1].Reason.Position != 2 {
		t.Fatalf("positions %+v %+v", def.Waiting[0].Reason, def.Waiting[1].Reason)
	}
	for _, w := range def.Waiting {
		if w.ID == hidden.ID {
			t.Fatal("alice sees bob's waiting job")
		}
	}
}

// TestQueueOverviewHead: a long queue is listed by its head, in order,
// with the count of the rest (?limit=, 100 unless said); the rest a user
// is told of are their own team's; an array element carries its index;
// a bad limit is refused naming the field.
func TestQueueOverviewHead(t *testing.T) {
	h := newHarness(t)
	var ids []string
	for range 5 {
		ids = append(ids, h.submit(tokAlice, `{"resources": {"gpus": 1}, "command": ["x"]}`).ID)
	}
	h.submit(tokBob, `{"resources": {"gpus": 1}, "command": ["x"]}`)
	var arr api.ArraySubmitted
	if code := h.do("POST", "/v1/jobs?array=7-8", tokAlice, `{"name": "shard", "resources": {"gpus": 1}, "command": ["x"]}`, &arr); code != http.StatusCreated {
		t.Fatalf("array: %d", code)
	}
	h.cycle() // no nodes: every job waits, with its place
	var out struct {
		Queues []api.QueueView `json:"queues"`
	}
	if code := h.do("GET", "/v1/queues?limit=2", tokAlice, nil, &out); code != http.StatusOK {
		t.Fatalf("queues: %d", code)
	}
	def := out.Queues[slices.IndexFunc(out.Queues, func(q api.QueueView) bool { return q.Name == "default" })]
	if def.Pending != 8 || len(def.Waiting) != 2 || def.WaitingMore != 5 {
		t.Fatalf("limit 2: pending %d, listed %d, more %d", def.Pending, len(def.Waiting), def.WaitingMore)
	}
	for k, w := range def.Waiting {
		if w.ID != ids[k] || w.Reason == nil || w.Reason.Position == 0 {
			t.Fatalf("head %d: %+v, want %s first", k, w, ids[k])
		}
	}
	if def.Waiting[0].Reason.Position >= def.Waiting[1].Reason.Position {
		t.Fatalf("head out of order: %+v", def.Waiting)
	}
	out.Queues = nil
	if code := h.do("GET", "/v1/queues", tokAlice, nil, &out); code != http.StatusOK {
		t.Fatal(code)
	}
	def = out.Queues[slices.IndexFunc(out.Queues, func(q api.QueueView) bool { return q.Name == "default" })]
	if len(def.Waiting) != 7 || def.WaitingMore != 0 {
		t.Fatalf("default limit: listed %d, more %d", len(def.Waiting), def.WaitingMore)
	}
	last := def.Waiting[6]
	if last.ID != arr.Jobs[1] || last.Name != "shard" || last.ArrayIndex == nil || *last.ArrayIndex != 8 {
		t.Fatalf("array element %+v", last)
	}
	for _, bad := range []string{"0", "1001", "x"} {
		var e struct {
			Error struct{ Field string } `json:"error"`
		}
		if code := h.do("GET", "/v1/queues?limit="+bad, tokAlice, nil, &e); code != http.StatusBadRequest || e.Error.Field != "limit" {
			t.Fatalf("limit=%s: %d %+v", bad, code, e)
		}
	}
}

// TestQueueHeadOrder: the head of a queue kept while its jobs are read
// in any order is the first n of the whole queue sorted by place, jobs
// with no place yet last, ties broken by id.
func TestQueueHeadOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct{ jobs, n int }{{0, 3}, {3, 3}, {50, 1}, {500, 20}, {500, 500}} {
		var all []waiting
		for i := range c.jobs {
			pos := 1 + rng.IntN(c.jobs) // repeats, as between places read across cycles
			if rng.IntN(5) == 0 {
				pos = 1 << 30
			}
			all = append(all, waiting{&broker.Job{ID: fmt.Sprintf("j%04d", i)}, pos})
		}
		rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		h := broker.NewHead(c.n, compareWaiting)
		for _, w := range all {
			h.Offer(w)
		}
		want := slices.SortedFunc(slices.Values(all), func(a, b waiting) int {
			if a.pos != b.pos {
				return a.pos - b.pos
			}
			return strings.Compare(a.j.ID, b.j.ID)
		})[:min(c.n, c.jobs)]
		if got := h.Sorted(); !slices.EqualFunc(got, want, func(a, b waiting) bool { return a.j == b.j }) {
			t.Fatalf("%d jobs, head of %d: the head differs from the queue sorted by place and id", c.jobs, c.n)
		}
	}
}
