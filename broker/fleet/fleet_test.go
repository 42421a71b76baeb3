package fleet

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/adapters"
	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/fleet/fleettest"
	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/fake"
)

var t0 = time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)

var _ Broker = (*fleettest.Broker)(nil)

// rig is a fleet with one fake cloud over a fake broker and a store in
// memory.
type rig struct {
	t     *testing.T
	ctx   context.Context
	b     *fleettest.Broker
	clock *clock.Fake
	cloud *fake.Provider
	cfg   *config.Config
	f     *Fleet
}

func newRig(t *testing.T) *rig {
	t.Helper()
	cfg, err := config.Parse([]byte("listen: 127.0.0.1:0\ndataDir: " + t.TempDir() + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	ad, err := adapters.Parse(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, ctx: context.Background(), clock: clock.NewFake(t0), cfg: cfg,
		b:     fleettest.New(),
		cloud: fake.New("cloud", []providers.Offer{{Region: "r1", InstanceType: "small", GPUModel: "H100", GPUs: 1, Available: true}}, nil)}
	r.f = New(Options{Broker: r.b, Store: r.b.Store, Clock: r.clock, Logger: slog.New(slog.DiscardHandler), Providers: []providers.Provider{r.cloud},
		Config: func() *config.Config { return cfg }, Adapters: func() *adapters.Config { return ad }})
	if err := r.f.Init(r.ctx); err != nil {
		t.Fatal(err)
	}
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

func (r *rig) rec(id string) *broker.InstanceRecord {
	r.b.Lock()
	defer r.b.Unlock()
	return r.f.RecordLocked(id).Clone()
}

// machine has the fake cloud create a machine tagged with record id.
func (r *rig) machine(id string) string {
	r.t.Helper()
	inst, err := r.cloud.Create(r.ctx, providers.CreateRequest{RecordID: id, Offer: providers.Offer{Region: "r1", InstanceType: "small"}})
	if err != nil {
		r.t.Fatal(err)
	}
	return inst.ID
}

// TestReconcile: a machine without a live record is deleted once the
// orphan grace has passed, not before; a record whose machine the
// provider no longer knows is closed, metered up to when it was last
// seen, and its node dropped; a record whose machine is listed is seen.
func TestReconcile(t *testing.T) {
	r := newRig(t)
	live := r.machine("spw-live")
	orphan := r.machine("spw-orphan")
	seen := t0.Add(-10 * time.Minute)
	launched := t0.Add(-time.Hour)
	r.put(&broker.InstanceRecord{ID: "spw-live", Provider: "cloud", ProviderID: live, State: broker.MachineReady, CreatedAt: launched, LaunchedAt: &launched})
	r.put(&broker.InstanceRecord{ID: "spw-gone", Provider: "cloud", ProviderID: "fake-99", State: broker.MachineReady, CreatedAt: launched,
		LaunchedAt: &launched, LastSeen: &seen})
	r.b.Nodes["spw-gone"] = &broker.Node{Name: "spw-gone", Instance: "spw-gone"}

	r.f.Reconcile(r.ctx)
	if slices.Contains(r.cloud.DeleteCalls, orphan) {
		t.Fatal("the orphan was deleted within its grace")
	}
	if got := r.rec("spw-live"); got.LastSeen == nil || !got.LastSeen.Equal(t0) {
		t.Fatalf("the listed machine's record was not seen: %v", got.LastSeen)
	}
	gone := r.rec("spw-gone")
	if !gone.State.Ended() || gone.TerminatedAt == nil || !gone.TerminatedAt.Equal(seen) {
		t.Fatalf("vanished record = %s ended at %v, want ended at %v", gone.State, gone.TerminatedAt, seen)
	}
	if !slices.Equal(r.b.Dropped, []string{"spw-gone"}) {
		t.Fatalf("dropped nodes %v, want the vanished machine's", r.b.Dropped)
	}

	r.clock.Set(t0.Add(r.cfg.Burst.OrphanGrace.D()))
	r.f.Reconcile(r.ctx)
	if !slices.Equal(r.cloud.DeleteCalls, []string{orphan}) {
		t.Fatalf("deletes %v, want the orphan %s only", r.cloud.DeleteCalls, orphan)
	}
}

// TestWorkersOwned: a record's worker runs on the broker's work group,
// a second start while it runs is a no-op, and it takes its id out of
// the working set when it returns.
func TestWorkersOwned(t *testing.T) {
	r := newRig(t)
	release := make(chan struct{})
	runs := 0
	worker := func(context.Context, string) {
		runs++
		<-release
	}
	r.b.Lock()
	r.f.StartWorkerLocked(r.ctx, "m1", worker)
	r.f.StartWorkerLocked(r.ctx, "m1", worker)
	working := r.f.WorkingLocked("m1")
	r.b.Unlock()
	if !working {
		t.Fatal("m1 is not marked working")
	}
	close(release)
	r.b.Wait()
	r.b.Lock()
	defer r.b.Unlock()
	if runs != 1 || r.f.WorkingLocked("m1") {
		t.Fatalf("%d runs, working %v; want 1 run and m1 released", runs, r.f.WorkingLocked("m1"))
	}
}

// TestLoadAndReset: LoadLocked reads the records and the budget alerts
// already raised; ResetLocked forgets them and the offers, keeping the
// providers.
func TestLoadAndReset(t *testing.T) {
	r := newRig(t)
	err := r.b.Store.Update(r.ctx, func(tx broker.Tx) error {
		if err := broker.PutInstance(tx, &broker.InstanceRecord{ID: "spw-1", Provider: "cloud", State: broker.MachineReady}); err != nil {
			return err
		}
		return tx.Put(broker.BucketMeta, budgetAlertKey+"2026-12/global/80", []byte("1"))
	})
	if err != nil {
		t.Fatal(err)
	}
	r.f.RefreshOffers(r.ctx, t0)
	r.b.Lock()
	defer r.b.Unlock()
	if err := r.f.LoadLocked(r.ctx); err != nil {
		t.Fatal(err)
	}
	if r.f.RecordLocked("spw-1") == nil || !r.f.alerted["2026-12/global/80"] || !r.f.OffersKnownLocked() {
		t.Fatalf("loaded: record %v, alerts %v, offers known %v", r.f.RecordLocked("spw-1"), r.f.alerted, r.f.OffersKnownLocked())
	}
	r.f.ResetLocked()
	if len(r.f.RecordsLocked()) != 0 || len(r.f.alerted) != 0 || r.f.OffersKnownLocked() || len(r.f.OffersLocked()) != 0 {
		t.Fatal("ResetLocked kept the term's state")
	}
	if r.f.PoolKind(&broker.InstanceRecord{Provider: "cloud"}) != billing.PoolCloud || len(r.f.providers) != 1 {
		t.Fatal("ResetLocked dropped the providers")
	}
}
