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

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/slurm"
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
	go h.srv.slurmLoop(h.ctx) // a leader task (the harness runs none)
	waitUntil(t, "the leader's slurm loop runs", func() bool {
		h.srv.lock()
		defer h.srv.mu.Unlock()
		return h.srv.slurm.ctx != nil
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

func TestSlurmdSteps(t *testing.T) {
	key := filepath.Join(t.TempDir(), "munge.key")
	if err := os.WriteFile(key, []byte("secret-key"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Slurm{Node: config.SlurmNode{MungeKeyFile: key, MungeKeyPath: "/etc/munge/munge.key", MungeSocket: "/run/munge/munge.socket.2",
		ConfigFiles: []string{key}, Slurmd: "slurmd", SlurmdArgs: []string{"-b"}}}
	steps, err := slurmdSteps(cfg, "burst-1", "/opt/spillway/slurmd-burst-1.pid")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range steps {
		names = append(names, s.Name)
		if strings.Contains(s.Script, "secret-key") {
			t.Errorf("step %s puts the key on the command line", s.Name)
		}
	}
	if strings.Join(names, ",") != "slurmd and munge installed,munge key,config munge.key,start slurmd" {
		t.Fatalf("steps %v", names)
	}
	if string(steps[1].Stdin) != "secret-key" {
		t.Fatal("the munge key is not streamed on stdin")
	}
	start := steps[3].Script
	for _, want := range []string{"SLURM_CONF='" + key + "' setsid 'slurmd' -D -N 'burst-1' '-b'", "echo $! > '/opt/spillway/slurmd-burst-1.pid'"} {
		if !strings.Contains(start, want) {
			t.Errorf("start script lacks %q:\n%s", want, start)
		}
	}
}

func TestSlurmAllocs(t *testing.T) {
	launched, ended := t0, t0.Add(time.Hour)
	h, _ := slurmHarness(t) // its provider "cloud" is a cloud pool
	s := h.srv
	s.lock()
	defer s.mu.Unlock()
	err := s.fleet.PutRecordLocked(h.ctx, &broker.InstanceRecord{ID: "spw-1", Provider: "cloud", Team: "nlp", SlurmNode: "burst-1",
		State: broker.MachineTerminated, Offer: providers.Offer{InstanceType: "small", GPUModel: "H100", GPUs: 1}, LaunchedAt: &launched, TerminatedAt: &ended,
		SlurmJobs: []slurm.Job{
			{ID: "7", Account: "vision", User: "ann", Partition: "burst", GPUs: 1, Start: t0.Add(time.Minute), End: t0.Add(2 * time.Minute)},
			{ID: "8", GPUs: 2, Start: t0.Add(3 * time.Minute)}, // still running when the machine ended; more GPUs than it has
			{ID: "9", GPUs: 0, Start: t0.Add(3 * time.Minute)}, // no GPU: its time stays overhead
		}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := s.slurmAllocsLocked(time.Time{})
	if len(got) != 2 {
		t.Fatalf("allocations %+v", got)
	}
	a, b := got[0], got[1]
	if a.Job != "slurm:7" || a.Team != "nlp" || a.Project != "vision" || a.User != "ann" || a.Queue != "burst" || a.GPUMilli != 1000 ||
		!a.End.Equal(t0.Add(2*time.Minute)) || a.Pool.InstanceID != "spw-1" || a.Pool.Node != "burst-1" || a.Pool.Kind != billing.PoolCloud {
		t.Fatalf("job 7: %+v", a)
	}
	if b.Job != "slurm:8" || b.GPUMilli != 1000 || !b.End.Equal(ended) {
		t.Fatalf("job 8 is capped to the machine's GPUs and end: %+v", b)
	}
}

func TestMergeSlurmJobs(t *testing.T) {
	h, _ := slurmHarness(t)
	launched := t0
	for _, r := range []*broker.InstanceRecord{
		{ID: "spw-1", Provider: "cloud", State: broker.MachineReady, SlurmNode: "burst-1", LaunchedAt: &launched,
			SlurmJobs: []slurm.Job{{ID: "5", GPUs: 1, Start: t0.Add(time.Minute)}}},
		{ID: "spw-2", Provider: "cloud", State: broker.MachineReady, SlurmNode: "burst-2", LaunchedAt: &launched,
			SlurmJobs: []slurm.Job{{ID: "6", GPUs: 1, Start: t0.Add(time.Minute)}}},
	} {
		h.srv.lock()
		err := h.srv.fleet.PutRecordLocked(h.ctx, r, nil, nil)
		h.srv.mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	}
	h.clock.Set(t0.Add(10 * time.Minute))
	// squeue asked about burst-1 only: job 7 is new there, job 4 ran on an
	// earlier machine of the node, job 5 is gone; burst-2's job 6 is
	// untouched (it was not asked about).
	h.srv.mergeSlurmJobs(h.ctx, []string{"burst-1"}, []slurm.Job{
		{ID: "7", GPUs: 1, Start: t0.Add(2 * time.Minute), Nodes: []string{"burst-1"}, State: "RUNNING"},
		{ID: "4", GPUs: 1, Start: t0.Add(-time.Hour), End: t0.Add(-50 * time.Minute), Nodes: []string{"burst-1"}},
	})
	r1, _ := h.srv.fleet.Record("spw-1")
	r2, _ := h.srv.fleet.Record("spw-2")
	if len(r1.SlurmJobs) != 2 || r1.SlurmJobs[0].ID != "5" || !r1.SlurmJobs[0].End.Equal(t0.Add(10*time.Minute)) ||
		r1.SlurmJobs[1].ID != "7" || !r1.SlurmJobs[1].End.IsZero() {
		t.Fatalf("burst-1 jobs: %+v", r1.SlurmJobs)
	}
	if len(r2.SlurmJobs) != 1 || !r2.SlurmJobs[0].End.IsZero() {
		t.Fatalf("burst-2 jobs changed: %+v", r2.SlurmJobs)
	}
}
