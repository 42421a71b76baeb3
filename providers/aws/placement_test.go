package aws_test

import (
	"context"
	"errors"
	"testing"

	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/fakecloud"
	"github.com/spillway-dev/spillway/providers/fakecloud/fakecloudtest"
)

// TestGangMachinesShareAClusterPlacementGroup: two machines of one gang
// land in one cluster placement group, created once; the group outlives
// neither of them; a capacity error on the second member is typed.
func TestGangMachinesShareAClusterPlacementGroup(t *testing.T) {
	fake := fakecloudtest.NewEC2(t, fakecloud.EC2Options{})
	p := newProvider(t, fake, "prod")
	ctx := context.Background()
	key := brokerKey(t)
	var ids []string
	for _, rec := range []string{"gang-m0", "gang-m1"} {
		in, err := p.Create(ctx, providers.CreateRequest{RecordID: rec, Offer: offer(t, p, "p5.48xlarge", false),
			SSHAuthorizedKey: key, Placement: "pg-job-01"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, in.ID)
	}
	if got := fake.InGroup("pg-job-01"); len(got) != 2 || fake.Calls("CreatePlacementGroup") != 2 || len(fake.PlacementGroups()) != 1 {
		t.Fatalf("group holds %v after %d creates of it; groups %v", got, fake.Calls("CreatePlacementGroup"), fake.PlacementGroups())
	}
	if err := p.DeletePlacement(ctx, "pg-job-01"); err == nil {
		t.Fatal("a group with live machines was deleted")
	}
	fake.FailNext("RunInstances", "InsufficientInstanceCapacity")
	_, err := p.Create(ctx, providers.CreateRequest{RecordID: "gang-m2", Offer: offer(t, p, "p5.48xlarge", false),
		SSHAuthorizedKey: key, Placement: "pg-job-01"})
	if !errors.Is(err, providers.ErrInsufficientCapacity) {
		t.Fatalf("capacity failure of a member: %v, want ErrInsufficientCapacity", err)
	}
	for _, id := range ids {
		if err := p.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.DeletePlacement(ctx, "pg-job-01"); err != nil {
		t.Fatal(err)
	}
	if err := p.DeletePlacement(ctx, "pg-job-01"); err != nil || len(fake.PlacementGroups()) != 0 {
		t.Fatalf("deleting a gone group: %v; groups %v", err, fake.PlacementGroups())
	}
	if _, err := p.Create(ctx, providers.CreateRequest{RecordID: "bad", Offer: offer(t, p, "p5.48xlarge", false), Placement: "Bad_Name"}); !errors.Is(err, providers.ErrInvalidRequest) {
		t.Fatalf("bad placement name: %v", err)
	}
}
