package slurmdoor

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/adapters"
	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/fleet"
	"github.com/spillway-dev/spillway/broker/fleet/fleettest"
	"github.com/spillway-dev/spillway/broker/slurm"
	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/fake"
)

var t0 = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

var (
	_ fleet.Broker = (*fleettest.Broker)(nil)
	_ Broker       = (*fleettest.Broker)(nil)
)

// rig is a door over a fleet with one fake cloud and a slurm section
// whose commands do not exist (every scontrol or squeue call fails, as on
// a host without slurm-client; integration/slurm_test.go runs the real
// thing).
type rig struct {
	t     *testing.T
	ctx   context.Context
	b     *fleettest.Broker
	clock *clock.Fake
	f     *fleet.Fleet
	d     *Door
}

func newRig(t *testing.T) *rig {
	t.Helper()
	cfg, err := config.Parse([]byte("listen: 127.0.0.1:0\ndataDir: " + t.TempDir() + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(t.TempDir(), "munge.key")
	if err := os.WriteFile(key, []byte("key"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.Slurm = &config.Slurm{Team: "nlp", Scontrol: filepath.Join(t.TempDir(), "no-scontrol"), Squeue: filepath.Join(t.TempDir(), "no-squeue"),
		Node:  config.SlurmNode{MungeKeyFile: key, MungeKeyPath: "/etc/munge/munge.key", MungeSocket: "/run/munge/munge.socket.2", Slurmd: "slurmd"},
		Nodes: []config.SlurmNodes{{Names: "burst-[1-2]", Offers: []config.SlurmOffer{{InstanceType: "small"}}}}}
	cfg.Slurm.Queue, cfg.Slurm.Reserve, cfg.Slurm.PollEvery, cfg.Slurm.RegisterTimeout = "slurm", broker.Duration(time.Hour), broker.Duration(time.Second), broker.Duration(time.Minute)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	ad, err := adapters.Parse(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, ctx: context.Background(), clock: clock.NewFake(t0), b: fleettest.New()}
	cloud := fake.New("cloud", []providers.Offer{{Region: "r1", InstanceType: "small", GPUModel: "H100", GPUs: 1, Available: true}}, nil)
	log := slog.New(slog.DiscardHandler)
	r.f = fleet.New(fleet.Options{Broker: r.b, Store: r.b.Store, Clock: r.clock, Logger: log, Providers: []providers.Provider{cloud},
		Config: func() *config.Config { return cfg }, Adapters: func() *adapters.Config { return ad }})
	if err := r.f.Init(r.ctx); err != nil {
		t.Fatal(err)
	}
	r.d = New(Options{Broker: r.b, Fleet: r.f, Clock: r.clock, Logger: log, Config: func() *config.Config { return cfg },
		Adapters: func() *adapters.Config { return ad }, BurstLead: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "lead"}, []string{"provider"})})
	r.b.OnSlurmBootstrap, r.b.OnSlurmDown = r.d.Bootstrap, r.d.Down
	t.Cleanup(r.b.Wait)
	return r
}

// put writes a record as the workers would.
func (r *rig) put(rec *broker.InstanceRecord) {
	r.t.Helper()
	r.b.Lock()
	defer r.b.Unlock()
	if err := r.f.PutRecordLocked(r.ctx, rec, nil, nil); err != nil {
		r.t.Fatal(err)
	}
}

// TestDoorOpensWithTheTerm: resume and suspend refuse while no leader
// term runs the door's loop, act while one does, and refuse again once
// its context ends.
func TestDoorOpensWithTheTerm(t *testing.T) {
	r := newRig(t)
	if _, err := r.d.Resume(r.ctx, []string{"burst-1"}, nil); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("resume before a term: %v", err)
	}
	if _, err := r.d.Suspend(r.ctx, []string{"burst-1"}); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("suspend before a term: %v", err)
	}
	ctx, cancel := context.WithCancel(r.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.d.Loop(ctx)
	}()
	var res []string
	for deadline := time.Now().Add(20 * time.Second); ; {
		got, err := r.d.Suspend(r.ctx, []string{"burst-2"})
		if err == nil {
			for _, n := range got.Nodes {
				res = append(res, n.Node+":"+n.Action)
			}
			break
		}
		if !errors.Is(err, ErrNotLeader) || time.Now().After(deadline) {
			t.Fatalf("suspend in a term: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if strings.Join(res, ",") != "burst-2:none" {
		t.Fatalf("suspending a node without a machine: %v", res)
	}
	cancel()
	<-done
	if _, err := r.d.Suspend(r.ctx, []string{"burst-2"}); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("suspend after the term: %v", err)
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

func TestAllocs(t *testing.T) {
	launched, ended := t0, t0.Add(time.Hour)
	r := newRig(t) // its provider "cloud" is a cloud pool
	r.put(&broker.InstanceRecord{ID: "spw-1", Provider: "cloud", Team: "nlp", SlurmNode: "burst-1",
		State: broker.MachineTerminated, Offer: providers.Offer{InstanceType: "small", GPUModel: "H100", GPUs: 1}, LaunchedAt: &launched, TerminatedAt: &ended,
		SlurmJobs: []slurm.Job{
			{ID: "7", Account: "vision", User: "ann", Partition: "burst", GPUs: 1, Start: t0.Add(time.Minute), End: t0.Add(2 * time.Minute)},
			{ID: "8", GPUs: 2, Start: t0.Add(3 * time.Minute)}, // still running when the machine ended; more GPUs than it has
			{ID: "9", GPUs: 0, Start: t0.Add(3 * time.Minute)}, // no GPU: its time stays overhead
		}})
	r.b.Lock()
	got := r.d.AllocsLocked(time.Time{})
	r.b.Unlock()
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

func TestMergeJobs(t *testing.T) {
	r := newRig(t)
	launched := t0
	r.put(&broker.InstanceRecord{ID: "spw-1", Provider: "cloud", State: broker.MachineReady, SlurmNode: "burst-1", LaunchedAt: &launched,
		SlurmJobs: []slurm.Job{{ID: "5", GPUs: 1, Start: t0.Add(time.Minute)}}})
	r.put(&broker.InstanceRecord{ID: "spw-2", Provider: "cloud", State: broker.MachineReady, SlurmNode: "burst-2", LaunchedAt: &launched,
		SlurmJobs: []slurm.Job{{ID: "6", GPUs: 1, Start: t0.Add(time.Minute)}}})
	r.clock.Set(t0.Add(10 * time.Minute))
	// squeue asked about burst-1 only: job 7 is new there, job 4 ran on an
	// earlier machine of the node, job 5 is gone; burst-2's job 6 is
	// untouched (it was not asked about).
	r.d.mergeJobs(r.ctx, []string{"burst-1"}, []slurm.Job{
		{ID: "7", GPUs: 1, Start: t0.Add(2 * time.Minute), Nodes: []string{"burst-1"}, State: "RUNNING"},
		{ID: "4", GPUs: 1, Start: t0.Add(-time.Hour), End: t0.Add(-50 * time.Minute), Nodes: []string{"burst-1"}},
	})
	r1, _ := r.f.Record("spw-1")
	r2, _ := r.f.Record("spw-2")
	if len(r1.SlurmJobs) != 2 || r1.SlurmJobs[0].ID != "5" || !r1.SlurmJobs[0].End.Equal(t0.Add(10*time.Minute)) || r1.SlurmJobs[0].State != "GONE" ||
		r1.SlurmJobs[1].ID != "7" || !r1.SlurmJobs[1].End.IsZero() {
		t.Fatalf("burst-1 jobs: %+v", r1.SlurmJobs)
	}
	if len(r2.SlurmJobs) != 1 || !r2.SlurmJobs[0].End.IsZero() {
		t.Fatalf("burst-2 jobs changed: %+v", r2.SlurmJobs)
	}
	// The record is written: the store has the merged jobs.
	err := r.b.Store.View(r.ctx, func(tx broker.Tx) error {
		recs, err := broker.ListInstances(tx)
		for _, rec := range recs {
			if rec.ID == "spw-1" && len(rec.SlurmJobs) != 2 {
				t.Errorf("stored burst-1 jobs: %+v", rec.SlurmJobs)
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
