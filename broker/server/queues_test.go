package server

import (
	"net/http"
	"testing"

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
