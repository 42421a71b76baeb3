package server

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/fake"
)

func TestSlurmAPIWithoutSlurmSection(t *testing.T) {
	h := newHarness(t)
	var body map[string]map[string]string
	if code := h.do("POST", "/v1/slurm/resume", tokAdmin, api.SlurmRequest{Nodes: "burst-1"}, &body); code != http.StatusNotFound || body["error"]["code"] != "slurm_not_configured" {
		t.Fatalf("resume without slurm: %d %v", code, body)
	}
}

// slurmHarness is a broker with a slurm section over a fake cloud whose
// machines never answer SSH. No Slurm runs: the scontrol it names does
// not exist, so every scontrol call fails (and is logged), as on a
// broker host without slurm-client; integration/slurm_test.go runs the
// real thing.
func slurmHarness(t *testing.T) (*harness, *fake.Provider) {
	t.Helper()
	cfg := testConfig(t)
	key := filepath.Join(t.TempDir(), "munge.key")
	if err := os.WriteFile(key, []byte("key"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Slurm = &config.Slurm{Team: "nlp", Scontrol: filepath.Join(t.TempDir(), "no-scontrol"), Squeue: filepath.Join(t.TempDir(), "no-squeue"),
		Node:  config.SlurmNode{MungeKeyFile: key, MungeKeyPath: "/etc/munge/munge.key", MungeSocket: "/run/munge/munge.socket.2", Slurmd: "slurmd"},
		Nodes: []config.SlurmNodes{{Names: "burst-[1-2]", Offers: []config.SlurmOffer{{InstanceType: "small"}, {InstanceType: "small-b"}}}}}
	cfg.Burst.ReconcileEvery = broker.Duration(time.Hour)
	cfg.Slurm.Queue, cfg.Slurm.Reserve, cfg.Slurm.PollEvery, cfg.Slurm.RegisterTimeout = "slurm", broker.Duration(time.Hour), broker.Duration(time.Second), broker.Duration(time.Minute)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cloud := fake.New("cloud", testOffers, nil)
	cloud.Boot = func(_ context.Context, inst providers.Instance, req providers.CreateRequest) (fake.Machine, error) {
		return fake.Machine{SSHHost: "127.0.0.1:1", SSHUser: "root"}, nil
	}
	h := &harness{t: t, clock: clock.NewFake(t0), path: filepath.Join(cfg.DataDir, "spillway.db")}
	h.opts = Options{Providers: []providers.Provider{cloud}}
	h.open(cfg)
	t.Cleanup(func() {
		h.cancel()
		h.http.Close()
		h.store.Close()
	})
	return h, cloud
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out waiting until %s", what)
}

func TestSlurmResume(t *testing.T) {
	h, cloud := slurmHarness(t)
	for scope, limit := range map[string]string{broker.GlobalScope: "10000", "nlp": "0.01"} {
		if code := h.do("PUT", "/v1/budgets/"+scope, tokAdmin, api.BudgetRequest{Limit: limit}, nil); code != http.StatusOK {
			t.Fatalf("budget %s: %d", scope, code)
		}
	}
	var refused map[string]map[string]string
	if code := h.do("POST", "/v1/slurm/resume", tokAdmin, api.SlurmRequest{Nodes: "burst-1"}, &refused); code != http.StatusServiceUnavailable || refused["error"]["code"] != "not_leader" {
		t.Fatalf("resume without a leader term's slurm loop: %d %v", code, refused)
	}
	go h.srv.slurm.Loop(h.ctx) // a leader task (the harness runs none)
	waitUntil(t, "the leader's slurm loop runs", func() bool {
		return h.do("POST", "/v1/slurm/suspend", tokAdmin, api.SlurmRequest{Nodes: "burst-2"}, nil) == http.StatusOK
	})
	if code := h.do("POST", "/v1/slurm/resume", tokAlice, api.SlurmRequest{Nodes: "burst-1"}, nil); code != http.StatusForbidden {
		t.Fatalf("a user may not resume nodes: %d", code)
	}
	if code := h.do("POST", "/v1/slurm/resume", tokAdmin, api.SlurmRequest{Nodes: "burst-[2-1]"}, nil); code != http.StatusBadRequest {
		t.Fatalf("a bad hostlist: %d", code)
	}

	// The team's budget refuses: both nodes, with the reason, nothing
	// written.
	var res api.SlurmResult
	if code := h.do("POST", "/v1/slurm/resume", tokAdmin, api.SlurmRequest{Nodes: "burst-[1-2],other-1"}, &res); code != http.StatusOK {
		t.Fatalf("resume: %d", code)
	}
	want := []api.SlurmNodeResult{
		{Node: "burst-1", Action: "refused", Reason: "spillway: budget nlp exhausted"},
		{Node: "burst-2", Action: "refused", Reason: "spillway: budget nlp exhausted"},
		{Node: "other-1", Action: "failed", Reason: "spillway: no slurm.nodes entry matches other-1"},
	}
	if len(res.Nodes) != 3 || res.Nodes[0] != want[0] || res.Nodes[1] != want[1] || res.Nodes[2] != want[2] {
		t.Fatalf("refused resume: %+v", res.Nodes)
	}
	h.srv.lock()
	n := len(h.srv.fleet.RecordsLocked())
	h.srv.mu.Unlock()
	if n != 0 || len(cloud.CreateCalls) != 0 {
		t.Fatalf("a refused resume wrote %d records, %d creates", n, len(cloud.CreateCalls))
	}

	// Within the budget: the cheapest selected offer, the other as the
	// fallback, the reservation in the same transaction.
	if code := h.do("PUT", "/v1/budgets/nlp", tokAdmin, api.BudgetRequest{Limit: "1000"}, nil); code != http.StatusOK {
		t.Fatal("budget")
	}
	res = api.SlurmResult{}
	if code := h.do("POST", "/v1/slurm/resume", tokAdmin, api.SlurmRequest{Nodes: "burst-1"}, &res); code != http.StatusOK || len(res.Nodes) != 1 || res.Nodes[0].Action != "launching" {
		t.Fatalf("resume: %d %+v", code, res)
	}
	id := res.Nodes[0].Record
	rec, _ := h.srv.fleet.Record(id)
	if rec.SlurmNode != "burst-1" || rec.Offer.InstanceType != "small" || len(rec.Fallbacks) != 1 || rec.Fallbacks[0].InstanceType != "small-b" ||
		rec.Team != "nlp" || rec.ProjectedCost != price("12.00") {
		t.Fatalf("record: %+v", rec)
	}
	// Without slurmctld the bootstrap cannot set the node's address: the
	// launch fails, the machine is deleted, the reservation released.
	waitUntil(t, "the launch fails", func() bool {
		h.clock.Step(time.Second) // the delete's retry backoff
		r, _ := h.srv.fleet.Record(id)
		return r.State == broker.MachineFailed || r.State == broker.MachineTerminated
	})
	rec, _ = h.srv.fleet.Record(id)
	if !strings.Contains(rec.Reason, "slurm node address") || len(cloud.DeleteCalls) == 0 {
		t.Fatalf("failed launch: %s (%d deletes)", rec.Reason, len(cloud.DeleteCalls))
	}
	var budgets struct {
		Budgets []api.BudgetView `json:"budgets"`
	}
	h.do("GET", "/v1/budgets", tokAdmin, nil, &budgets)
	for _, b := range budgets.Budgets {
		if b.Reserved != 0 {
			t.Errorf("budget %s reserves %s after a failed launch", b.Scope, b.Reserved)
		}
	}
	// Suspending a node without a machine does nothing.
	res = api.SlurmResult{}
	if code := h.do("POST", "/v1/slurm/suspend", tokAdmin, api.SlurmRequest{Nodes: "burst-2"}, &res); code != http.StatusOK || res.Nodes[0].Action != "none" {
		t.Fatalf("suspend: %d %+v", code, res)
	}
}
