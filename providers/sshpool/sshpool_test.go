package sshpool_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"

	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/sshpool"
)

const hostKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// The pool as an operator writes it under `providers:`.
const poolYAML = `
name: colo
region: fra1
drainMargin: 48h
hosts:
  - name: box-1
    address: 10.1.0.11
    gpuModel: H100
    gpus: 8
    gpuMemoryGiB: 80
    cpus: 192
    memoryGiB: 2048
    pricePerGPUHour: "1.10"
    leaseEnds: 2026-12-31T00:00:00Z
    hostKey: ` + hostKey + `
  - name: box-2
    address: 10.1.0.12:2222
    user: ubuntu
    gpuModel: A100-80GB
    gpus: 4
    gpuMemoryGiB: 80
    pricePerGPUHour: "0.90"
    leaseEnds: 2026-03-02T12:00:00Z
    hostKey: ` + hostKey + `
`

func newPool(t *testing.T) *sshpool.Provider {
	t.Helper()
	var cfg sshpool.Config
	if err := yaml.UnmarshalStrict([]byte(poolYAML), &cfg); err != nil {
		t.Fatal(err)
	}
	p, err := sshpool.New(cfg, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestOffersArePrepaidAndDrainBeforeLeaseEnd(t *testing.T) {
	p := newPool(t)
	offers, err := p.Offers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	end1, end2 := time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC)
	want := []providers.Offer{
		{Provider: "colo", Region: "fra1", InstanceType: "box-1", GPUModel: "H100", GPUs: 8, GPUMemoryBytes: 80 << 30, CPUs: 192,
			MemoryBytes: 2048 << 30, PricePerHour: 8_800_000, Currency: "USD", PriceSource: providers.PriceFromConfig, Prepaid: true, Available: true, LeaseEnds: &end1},
		// Its lease ends in 24h, inside the 48h drain margin.
		{Provider: "colo", Region: "fra1", InstanceType: "box-2", GPUModel: "A100-80GB", GPUs: 4, GPUMemoryBytes: 80 << 30,
			PricePerHour: 3_600_000, Currency: "USD", PriceSource: providers.PriceFromConfig, Prepaid: true, Available: false, LeaseEnds: &end2},
	}
	if diff := cmp.Diff(want, offers); diff != "" {
		t.Errorf("offers (-want +got):\n%s", diff)
	}
	// Prepaid capacity sorts before a cheaper cloud offer.
	all := append([]providers.Offer{{Provider: "aws", InstanceType: "g6.xlarge", PricePerHour: 805_000, Available: true}}, offers...)
	providers.SortOffers(all)
	if all[0].InstanceType != "box-1" {
		t.Errorf("first offer %s, want the prepaid box-1", all[0].InstanceType)
	}
	_, err = p.Create(context.Background(), providers.CreateRequest{RecordID: "r2", Offer: offers[1]})
	if !providers.IsInsufficientCapacity(err) || providers.Code(err) != "LeaseEnding" {
		t.Errorf("claiming a draining host: err = %v, want LeaseEnding", err)
	}
}

func TestClaimReleaseAndRestore(t *testing.T) {
	p := newPool(t)
	ctx := context.Background()
	req := providers.CreateRequest{RecordID: "r1", Offer: providers.Offer{InstanceType: "box-1"}, Tags: map[string]string{"team": "nlp"}}
	c, err := p.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if c.ID != "box-1" || c.SSHHost != "10.1.0.11:22" || c.SSHUser != "root" || c.State != providers.StateRunning || !c.LaunchedAt.Equal(now) {
		t.Errorf("claim = %+v", c)
	}
	again, err := p.Create(ctx, req)
	if err != nil || again.ID != c.ID {
		t.Errorf("repeat create: %+v, %v; want the same claim", again, err)
	}
	if _, err := p.Create(ctx, providers.CreateRequest{RecordID: "other", Offer: req.Offer}); !providers.IsInsufficientCapacity(err) {
		t.Errorf("claiming a held host: err = %v, want insufficient capacity", err)
	}
	offers, _ := p.Offers(ctx)
	if offers[0].Available {
		t.Error("a claimed host is still offered")
	}

	// A restarted broker restores the pool from its records.
	list, _ := p.List(ctx)
	fresh := newPool(t)
	if err := fresh.Restore(list); err != nil {
		t.Fatal(err)
	}
	got, err := fresh.Get(ctx, "box-1")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(c, got); diff != "" {
		t.Errorf("restored claim (-before +after):\n%s", diff)
	}
	if err := fresh.Restore([]providers.Instance{{ID: "box-9", RecordID: "lost"}}); err == nil || !strings.Contains(err.Error(), "box-9") {
		t.Errorf("restoring an unknown host: err = %v", err)
	}

	if err := p.Delete(ctx, "box-1"); err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(ctx, "box-1"); !providers.IsNotFound(err) {
		t.Errorf("second delete: err = %v, want ErrNotFound", err)
	}
	if _, err := p.Get(ctx, "box-1"); !providers.IsNotFound(err) {
		t.Errorf("get after release: err = %v, want ErrNotFound", err)
	}
	keys, err := p.HostKeys(ctx, "box-1")
	if err != nil || len(keys) != 1 {
		t.Errorf("pinned keys: %v, %v", keys, err)
	}
}

func TestConfigErrorsNameTheHost(t *testing.T) {
	base := sshpool.Host{Name: "h", Address: "10.0.0.1", GPUs: 1, LeaseEnds: now.Add(1000 * time.Hour), HostKey: hostKey}
	for field, mutate := range map[string]func(*sshpool.Host){
		"name":    func(h *sshpool.Host) { h.Name = "bad name" },
		"hostKey": func(h *sshpool.Host) { h.HostKey = "" },
		"gpus":    func(h *sshpool.Host) { h.GPUs = 0 },
	} {
		h := base
		mutate(&h)
		_, err := sshpool.New(sshpool.Config{Hosts: []sshpool.Host{h}}, nil)
		if err == nil || !strings.Contains(err.Error(), "hosts[0]") {
			t.Errorf("%s: err = %v, want one naming hosts[0]", field, err)
		}
	}
	if _, err := sshpool.New(sshpool.Config{Hosts: []sshpool.Host{base, base}}, nil); err == nil {
		t.Error("a duplicate host name was accepted")
	}
	if _, err := sshpool.New(sshpool.Config{DrainMargin: "soon"}, nil); err == nil {
		t.Error("a bad drain margin was accepted")
	}
	p, err := sshpool.New(sshpool.Config{Hosts: []sshpool.Host{base}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Create(context.Background(), providers.CreateRequest{RecordID: "r", Offer: providers.Offer{InstanceType: "nope"}}); !errors.Is(err, providers.ErrInvalidRequest) {
		t.Errorf("unknown host: err = %v, want ErrInvalidRequest", err)
	}
}
