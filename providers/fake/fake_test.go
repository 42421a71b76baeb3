package fake_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/crypto/ssh"

	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/fake"
)

var offers = []providers.Offer{
	{Region: "r1", InstanceType: "big", GPUs: 8, PricePerHour: 80_000_000},
	{Region: "r1", InstanceType: "small", GPUs: 1, PricePerHour: 2_000_000},
	{Region: "r1", InstanceType: "small", GPUs: 1, Spot: true, PricePerHour: 900_000},
}

func key(o providers.Offer) string { o.Provider = "f"; return o.Key() }

func TestOffersCheapestFirstAndCapacityRunsOut(t *testing.T) {
	p := fake.New("f", offers, map[string]int{key(offers[1]): 1})
	ctx := context.Background()
	got, _ := p.Offers(ctx)
	var order []string
	for _, o := range got {
		order = append(order, o.Key())
	}
	if diff := cmp.Diff([]string{key(offers[2]), key(offers[1]), key(offers[0])}, order); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
	a, err := p.Create(ctx, providers.CreateRequest{RecordID: "a", Offer: offers[1]})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Create(ctx, providers.CreateRequest{RecordID: "b", Offer: offers[1]}); !providers.IsInsufficientCapacity(err) {
		t.Fatalf("second machine of a 1-capacity offer: err = %v", err)
	}
	got, _ = p.Offers(ctx)
	if o, _ := providers.FindOffer(got, providers.Offer{Provider: "f", Region: "r1", InstanceType: "small"}); o.Available {
		t.Error("an exhausted offer is still available")
	}
	if last := got[len(got)-1]; last.Key() != key(offers[1]) {
		t.Errorf("last offer %s, want the exhausted one", last.Key())
	}
	// Deleting gives the capacity back.
	if err := p.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(ctx, a.ID); !providers.IsNotFound(err) {
		t.Errorf("second delete: err = %v, want ErrNotFound", err)
	}
	if _, err := p.Create(ctx, providers.CreateRequest{RecordID: "b", Offer: offers[1]}); err != nil {
		t.Errorf("create after the capacity came back: %v", err)
	}
}

func TestKnobsRecordersAndReset(t *testing.T) {
	p := fake.New("f", offers, nil)
	ctx := context.Background()
	boom := providers.NewError(providers.ErrQuotaExceeded, "f", "create", "VcpuLimitExceeded", nil)
	p.NextCreateErr = boom
	if _, err := p.Create(ctx, providers.CreateRequest{RecordID: "a", Offer: offers[0]}); !errors.Is(err, boom) {
		t.Errorf("err = %v, want the injected one", err)
	}
	p.AllowedCreateCalls = 1
	first, err := p.Create(ctx, providers.CreateRequest{RecordID: "a", Offer: offers[0], Tags: map[string]string{"team": "nlp"}})
	if err != nil {
		t.Fatal(err)
	}
	if again, err := p.Create(ctx, providers.CreateRequest{RecordID: "a", Offer: offers[0]}); err != nil || again.ID != first.ID {
		t.Errorf("idempotent repeat: %+v, %v", again, err)
	}
	if _, err := p.Create(ctx, providers.CreateRequest{RecordID: "b", Offer: offers[0]}); !providers.IsInsufficientCapacity(err) {
		t.Errorf("past AllowedCreateCalls: err = %v", err)
	}
	if len(p.CreateCalls) != 4 || p.CreateCalls[1].Tags["team"] != "nlp" {
		t.Errorf("recorded %d creates: %+v", len(p.CreateCalls), p.CreateCalls)
	}
	list, _ := p.List(ctx)
	if len(list) != 1 || p.ListCalls != 1 {
		t.Errorf("list = %+v after %d calls", list, p.ListCalls)
	}
	p.Reset()
	if list, _ := p.List(ctx); len(list) != 0 || len(p.CreateCalls) != 0 || p.AllowedCreateCalls != -1 {
		t.Errorf("after reset: %d machines, %d calls, allowed %d", len(list), len(p.CreateCalls), p.AllowedCreateCalls)
	}
}

func TestBootBacksMachinesWithSomethingReal(t *testing.T) {
	p := fake.New("f", offers, nil)
	hostKey, _, _, _, err := ssh.ParseAuthorizedKey([]byte("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"))
	if err != nil {
		t.Fatal(err)
	}
	var terminated []string
	p.Boot = func(ctx context.Context, inst providers.Instance, req providers.CreateRequest) (fake.Machine, error) {
		if inst.RecordID == "broken" {
			return fake.Machine{}, errors.New("no sshd")
		}
		return fake.Machine{SSHHost: "127.0.0.9:2222", SSHUser: "root", HostKeys: []ssh.PublicKey{hostKey}}, nil
	}
	p.Terminate = func(inst providers.Instance) { terminated = append(terminated, inst.ID) }
	ctx := context.Background()
	inst, err := p.Create(ctx, providers.CreateRequest{RecordID: "a", Offer: offers[1]})
	if err != nil {
		t.Fatal(err)
	}
	if inst.SSHHost != "127.0.0.9:2222" || inst.SSHUser != "root" {
		t.Errorf("instance = %+v", inst)
	}
	keys, err := p.HostKeys(ctx, inst.ID)
	if err != nil || len(keys) != 1 {
		t.Errorf("host keys = %v, %v", keys, err)
	}
	if _, err := p.Create(ctx, providers.CreateRequest{RecordID: "broken", Offer: offers[1]}); err == nil {
		t.Error("a failed boot still created a machine")
	}
	if list, _ := p.List(ctx); len(list) != 1 {
		t.Errorf("%d machines, want 1 (the failed boot left none)", len(list))
	}
	if err := p.Delete(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{inst.ID}, terminated); diff != "" {
		t.Errorf("terminated (-want +got):\n%s", diff)
	}
}
