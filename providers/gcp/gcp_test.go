package gcp_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/crypto/ssh"
	"google.golang.org/api/option"

	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/fakecloud"
	"github.com/spillway-dev/spillway/providers/fakecloud/fakecloudtest"
	"github.com/spillway-dev/spillway/providers/gcp"
)

func newProvider(t *testing.T, fake *fakecloud.GCE, cluster string) *gcp.Provider {
	t.Helper()
	p, err := gcp.New(context.Background(), gcp.Config{
		Cluster:  cluster,
		Project:  fake.Project(),
		Region:   "us-central1",
		Endpoint: fake.URL,
		Image:    "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts",
		SSHUser:  "root",
		SSHPort:  fake.SSHPort(),
		MachineTypes: []gcp.MachineType{
			{Name: "a3-highgpu-8g", GPUModel: "H100", GPUs: 8, GPUMemoryGiB: 80, CPUs: 208, MemoryGiB: 1872,
				Zones: []string{"us-central1-a"}, OnDemandPrice: 88_250_000, SpotPrice: 31_000_000},
			{Name: "n1-standard-8", AcceleratorType: "nvidia-tesla-t4", GPUModel: "T4", GPUs: 1, GPUMemoryGiB: 16, CPUs: 8, MemoryGiB: 30,
				Zones: []string{"us-central1-a", "us-central1-b"}, OnDemandPrice: 730_000},
		},
	}, option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func brokerKey(t *testing.T) string {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey())))
}

func offer(t *testing.T, p *gcp.Provider, machineType, zone string, spot bool) providers.Offer {
	t.Helper()
	offers, err := p.Offers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range offers {
		if o.InstanceType == machineType && o.Zone == zone && o.Spot == spot {
			return o
		}
	}
	t.Fatalf("no offer %s/%s spot=%v", zone, machineType, spot)
	return providers.Offer{}
}

func metadata(in fakecloud.GCEInstance) map[string]string {
	out := map[string]string{}
	for _, item := range in.Resource.GetMetadata().GetItems() {
		out[item.GetKey()] = item.GetValue()
	}
	return out
}

func TestRequestIDIsAStableUUID(t *testing.T) {
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	a, b := gcp.RequestID("01HZX3ABC"), gcp.RequestID("01HZX3ABC")
	if a != b || !uuid.MatchString(a) || a == gcp.RequestID("01HZX3ABD") {
		t.Errorf("RequestID = %q, %q: want one stable version-5 UUID per record", a, b)
	}
	if got := gcp.InstanceName("01HZX3_Ab"); got != "spw-01hzx3-ab" {
		t.Errorf("InstanceName = %q", got)
	}
}

func TestCreateIsIdempotentOnTheRecordID(t *testing.T) {
	fake := fakecloudtest.NewGCE(t, fakecloud.GCEOptions{})
	p := newProvider(t, fake, "prod")
	key := brokerKey(t)
	req := providers.CreateRequest{
		RecordID: "01HZX3REC", Offer: offer(t, p, "n1-standard-8", "us-central1-b", false),
		Tags: map[string]string{"team": "nlp", "job": "Finetune 7"}, SSHAuthorizedKey: key,
	}
	first, err := p.Create(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := p.Create(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if first.ID != again.ID || first.ID != "us-central1-b/spw-01hzx3rec" {
		t.Errorf("ids %q and %q, want both us-central1-b/spw-01hzx3rec", first.ID, again.ID)
	}
	insts := fake.Instances()
	if len(insts) != 1 || fake.Calls("insert") != 2 {
		t.Fatalf("%d machines after %d inserts, want 1 after 2", len(insts), fake.Calls("insert"))
	}
	in := insts[0]
	if in.RequestID != gcp.RequestID("01HZX3REC") {
		t.Errorf("requestId %q, want %q", in.RequestID, gcp.RequestID("01HZX3REC"))
	}
	wantLabels := map[string]string{"spillway-cluster": "prod", "spillway-record": "01hzx3rec", "spillway-team": "nlp", "spillway-job": "finetune-7"}
	if diff := cmp.Diff(wantLabels, in.Resource.GetLabels()); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	md := metadata(in)
	if md["ssh-keys"] != "root:"+key || md["enable-guest-attributes"] != "TRUE" || md["spillway-record"] != "01HZX3REC" {
		t.Errorf("metadata = %v", md)
	}
	acc := in.Resource.GetGuestAccelerators()
	if len(acc) != 1 || acc[0].GetAcceleratorCount() != 1 || acc[0].GetAcceleratorType() != "zones/us-central1-b/acceleratorTypes/nvidia-tesla-t4" {
		t.Errorf("guest accelerators = %v", acc)
	}
	// Exact record id and tags come back, though labels had to be folded.
	if first.RecordID != "01HZX3REC" || first.Tags["job"] != "Finetune 7" {
		t.Errorf("instance = %+v", first)
	}

	// A create for the same record after the request id is forgotten finds
	// the machine by name instead of launching another.
	fake.FailNext("insert", http.StatusConflict, "alreadyExists")
	adopted, err := p.Create(context.Background(), req)
	if err != nil || adopted.ID != first.ID {
		t.Errorf("create after alreadyExists: %+v, %v; want the first machine", adopted, err)
	}
}

func TestSpotUsesTheSpotProvisioningModel(t *testing.T) {
	fake := fakecloudtest.NewGCE(t, fakecloud.GCEOptions{})
	p := newProvider(t, fake, "prod")
	inst, err := p.Create(context.Background(), providers.CreateRequest{RecordID: "spot-1", Offer: offer(t, p, "a3-highgpu-8g", "us-central1-a", true)})
	if err != nil {
		t.Fatal(err)
	}
	s := fake.Instances()[0].Resource.GetScheduling()
	if s.GetProvisioningModel() != "SPOT" || s.GetInstanceTerminationAction() != "DELETE" || !inst.Spot {
		t.Errorf("scheduling = %v, instance spot = %v; want SPOT, deleted on preemption", s, inst.Spot)
	}
	if len(fake.Instances()[0].Resource.GetGuestAccelerators()) != 0 {
		t.Error("a3 got guest accelerators; its GPUs come with the machine type")
	}
}

func TestCreateErrorsAreTyped(t *testing.T) {
	fake := fakecloudtest.NewGCE(t, fakecloud.GCEOptions{Capacity: map[string]int{"a3-highgpu-8g": 0}})
	p := newProvider(t, fake, "prod")
	ctx := context.Background()
	_, err := p.Create(ctx, providers.CreateRequest{RecordID: "cap-1", Offer: offer(t, p, "a3-highgpu-8g", "us-central1-a", false)})
	if !providers.IsInsufficientCapacity(err) || providers.Code(err) != "ZONE_RESOURCE_POOL_EXHAUSTED" {
		t.Fatalf("err = %v, want insufficient capacity from the operation", err)
	}
	if fake.Calls("operations") == 0 {
		t.Error("the zone operation was never waited on")
	}
	t4 := offer(t, p, "n1-standard-8", "us-central1-a", false)
	fake.FailNextOperation("QUOTA_EXCEEDED")
	if _, err := p.Create(ctx, providers.CreateRequest{RecordID: "quota-op", Offer: t4}); !providers.IsQuotaExceeded(err) {
		t.Errorf("QUOTA_EXCEEDED operation: err = %v, want ErrQuotaExceeded", err)
	}
	for _, c := range []struct {
		status int
		reason string
		kind   error
	}{
		{http.StatusForbidden, "quotaExceeded", providers.ErrQuotaExceeded},
		{http.StatusForbidden, "forbidden", providers.ErrUnauthorized},
		{http.StatusUnauthorized, "required", providers.ErrUnauthorized},
		{http.StatusBadRequest, "invalid", providers.ErrInvalidRequest},
		{http.StatusBadRequest, "aReasonNobodyMapped", providers.ErrInvalidRequest},
	} {
		fake.FailNext("insert", c.status, c.reason)
		_, err := p.Create(ctx, providers.CreateRequest{RecordID: "err-" + strings.ToLower(c.reason), Offer: t4})
		if !errors.Is(err, c.kind) || providers.Code(err) != c.reason {
			t.Errorf("%d %s: err = %v, want kind %v", c.status, c.reason, err, c.kind)
		}
	}
}

func TestListSeesOnlyThisClusterInEveryZone(t *testing.T) {
	fake := fakecloudtest.NewGCE(t, fakecloud.GCEOptions{})
	prod, staging := newProvider(t, fake, "prod"), newProvider(t, fake, "staging")
	ctx := context.Background()
	for _, r := range []struct {
		p      *gcp.Provider
		record string
		zone   string
	}{{prod, "a", "us-central1-a"}, {prod, "b", "us-central1-b"}, {staging, "c", "us-central1-a"}} {
		if _, err := r.p.Create(ctx, providers.CreateRequest{RecordID: r.record, Offer: offer(t, r.p, "n1-standard-8", r.zone, false)}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := prod.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, i := range got {
		ids = append(ids, i.RecordID+"="+i.ID)
	}
	if diff := cmp.Diff([]string{"a=us-central1-a/spw-a", "b=us-central1-b/spw-b"}, ids); diff != "" {
		t.Errorf("prod list (-want +got):\n%s", diff)
	}
	if err := prod.Delete(ctx, "us-central1-a/spw-c"); !providers.IsNotFound(err) {
		t.Errorf("deleting another cluster's machine: err = %v, want ErrNotFound", err)
	}
}

func TestDeleteReturnsNotFoundOnceGone(t *testing.T) {
	fake := fakecloudtest.NewGCE(t, fakecloud.GCEOptions{DeleteTime: 100 * time.Millisecond})
	p := newProvider(t, fake, "prod")
	ctx := context.Background()
	inst, err := p.Create(ctx, providers.CreateRequest{RecordID: "del-1", Offer: offer(t, p, "n1-standard-8", "us-central1-a", false)})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(ctx, inst.ID); err != nil {
		t.Fatalf("first delete: %v", err)
	}
	if got, err := p.Get(ctx, inst.ID); err != nil || got.State != providers.StateStopping {
		t.Errorf("after delete: %+v, %v; want a stopping machine", got, err)
	}
	calls := 1
	for ; ; calls++ {
		err := p.Delete(ctx, inst.ID)
		if providers.IsNotFound(err) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if calls > 200 {
			t.Fatal("delete never reached ErrNotFound")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if calls < 2 || len(fake.Instances()) != 0 {
		t.Errorf("gone after %d deletes with %d machines left", calls, len(fake.Instances()))
	}
	if _, err := p.Get(ctx, "us-central1-a/spw-nothing"); !providers.IsNotFound(err) || providers.Code(err) != "notFound" {
		t.Errorf("unknown machine: err = %v, want ErrNotFound from notFound", err)
	}
	if _, err := p.Get(ctx, "no-slash"); !providers.IsNotFound(err) {
		t.Errorf("malformed id: err = %v, want ErrNotFound", err)
	}
}

func TestHostKeysComeFromGuestAttributes(t *testing.T) {
	fake := fakecloudtest.NewGCE(t, fakecloud.GCEOptions{SSHD: true, BootTime: 200 * time.Millisecond})
	p := newProvider(t, fake, "prod")
	ctx := context.Background()
	inst, err := p.Create(ctx, providers.CreateRequest{RecordID: "keys-1", Offer: offer(t, p, "n1-standard-8", "us-central1-a", false), SSHAuthorizedKey: brokerKey(t)})
	if err != nil {
		t.Fatal(err)
	}
	if keys, err := p.HostKeys(ctx, inst.ID); err != nil || len(keys) != 0 {
		t.Fatalf("host keys of a booting machine: %v, %v; want none yet", keys, err)
	}
	running, err := providers.WaitRunning(ctx, p, inst.ID, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	sshd := fake.Instances()[0].SSHD
	if running.SSHHost != sshd.Addr {
		t.Errorf("ssh host %s, want %s", running.SSHHost, sshd.Addr)
	}
	keys, err := p.HostKeys(ctx, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || ssh.FingerprintSHA256(keys[0]) != ssh.FingerprintSHA256(sshd.HostKey) {
		t.Errorf("host keys %v, want the sshd's %s", keys, ssh.FingerprintSHA256(sshd.HostKey))
	}
}

// TestGangPlacementIsCompact: a gang's machines name one compact placement
// policy (groupPlacementPolicy collocation COLLOCATED) in their region,
// made on first use; a member in another zone is refused; a member whose
// insert finds no capacity is refused for capacity (the broker's next
// offer); the policy goes once its machines are gone.
func TestGangPlacementIsCompact(t *testing.T) {
	fake := fakecloudtest.NewGCE(t, fakecloud.GCEOptions{})
	p := newProvider(t, fake, "prod")
	ctx := context.Background()
	a := offer(t, p, "n1-standard-8", "us-central1-a", false)
	var ids []string
	for _, rec := range []string{"gang-1", "gang-2"} {
		inst, err := p.Create(ctx, providers.CreateRequest{RecordID: rec, Offer: a, Placement: "spillway-g1"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, inst.ID)
	}
	if got := fake.ResourcePolicies(); !slices.Equal(got, []string{"us-central1/spillway-g1"}) {
		t.Fatalf("policies %v, want us-central1/spillway-g1", got)
	}
	if got := fake.InPolicy("us-central1", "spillway-g1"); !slices.Equal(got, []string{"us-central1-a/spw-gang-1", "us-central1-a/spw-gang-2"}) {
		t.Fatalf("in the policy: %v", got)
	}
	pols := fake.Instances()[0].Resource.GetResourcePolicies()
	if len(pols) != 1 || !strings.HasSuffix(pols[0], "projects/"+fake.Project()+"/regions/us-central1/resourcePolicies/spillway-g1") {
		t.Fatalf("instance resourcePolicies %v", pols)
	}
	// A compact policy does not span zones.
	b := offer(t, p, "n1-standard-8", "us-central1-b", false)
	if _, err := p.Create(ctx, providers.CreateRequest{RecordID: "gang-3", Offer: b, Placement: "spillway-g1"}); !errors.Is(err, providers.ErrInvalidRequest) {
		t.Fatalf("a member in another zone: err = %v, want invalid request", err)
	}
	// The second member of another gang finds no capacity.
	fake.FailNthOperation(2, "ZONE_RESOURCE_POOL_EXHAUSTED")
	if _, err := p.Create(ctx, providers.CreateRequest{RecordID: "other-1", Offer: a, Placement: "spillway-g2"}); err != nil {
		t.Fatal(err)
	}
	_, err := p.Create(ctx, providers.CreateRequest{RecordID: "other-2", Offer: a, Placement: "spillway-g2"})
	if !providers.IsInsufficientCapacity(err) || !providers.IsNextOffer(err) {
		t.Fatalf("the second member: err = %v, want insufficient capacity", err)
	}
	// In use, the policy stays; once its machines are gone, it goes.
	if err := p.DeletePlacement(ctx, "spillway-g1"); err == nil {
		t.Fatal("deleted a placement policy its machines still use")
	}
	for _, id := range ids {
		if err := p.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.DeletePlacement(ctx, "spillway-g1"); err != nil {
		t.Fatal(err)
	}
	if got := fake.ResourcePolicies(); !slices.Equal(got, []string{"us-central1/spillway-g2"}) {
		t.Fatalf("policies after delete %v, want only us-central1/spillway-g2", got)
	}
}
