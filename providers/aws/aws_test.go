package aws_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/crypto/ssh"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/aws"
	"github.com/spillway-dev/spillway/providers/fakecloud"
	"github.com/spillway-dev/spillway/providers/fakecloud/fakecloudtest"
)

// newProvider builds a provider through the SDK's default credential chain
// (from the environment) against the fake endpoint.
func newProvider(t *testing.T, fake *fakecloud.EC2, cluster string) *aws.Provider {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDFAKE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "fake-secret")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	p, err := aws.New(context.Background(), aws.Config{
		Cluster:  cluster,
		Region:   "us-east-1",
		Endpoint: fake.URL,
		ImageID:  "ami-0gpu",
		SSHUser:  "root",
		SSHPort:  fake.SSHPort(),
		InstanceTypes: []aws.InstanceType{
			{Name: "p5.48xlarge", GPUModel: "H100", GPUs: 8, GPUMemoryGiB: 80, CPUs: 192, MemoryGiB: 2048,
				Zones: []string{"us-east-1a"}, OnDemandPrice: 98_320_000, SpotPrice: 40_000_000},
			{Name: "g6.xlarge", GPUModel: "L4", GPUs: 1, GPUMemoryGiB: 24, CPUs: 4, MemoryGiB: 16, OnDemandPrice: 805_000},
		},
	})
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

func offer(t *testing.T, p *aws.Provider, instanceType string, spot bool) providers.Offer {
	t.Helper()
	offers, err := p.Offers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range offers {
		if o.InstanceType == instanceType && o.Spot == spot {
			return o
		}
	}
	t.Fatalf("no offer %s spot=%v in %+v", instanceType, spot, offers)
	return providers.Offer{}
}

func TestOffersComeFromConfig(t *testing.T) {
	p := newProvider(t, fakecloudtest.NewEC2(t, fakecloud.EC2Options{}), "prod")
	offers, err := p.Offers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []providers.Offer{
		{Provider: "aws-us-east-1", Region: "us-east-1", Zone: "us-east-1a", InstanceType: "p5.48xlarge", GPUModel: "H100", GPUs: 8,
			GPUMemoryBytes: 80 << 30, CPUs: 192, MemoryBytes: 2048 << 30, PricePerHour: 98_320_000, Currency: "USD", Available: true, PriceSource: providers.PriceFromConfig},
		{Provider: "aws-us-east-1", Region: "us-east-1", Zone: "us-east-1a", InstanceType: "p5.48xlarge", GPUModel: "H100", GPUs: 8,
			GPUMemoryBytes: 80 << 30, CPUs: 192, MemoryBytes: 2048 << 30, Spot: true, PricePerHour: 40_000_000, Currency: "USD", Available: true, PriceSource: providers.PriceFromConfig},
		{Provider: "aws-us-east-1", Region: "us-east-1", InstanceType: "g6.xlarge", GPUModel: "L4", GPUs: 1,
			GPUMemoryBytes: 24 << 30, CPUs: 4, MemoryBytes: 16 << 30, PricePerHour: billing.Amount(805_000), Currency: "USD", Available: true, PriceSource: providers.PriceFromConfig},
	}
	if diff := cmp.Diff(want, offers); diff != "" {
		t.Errorf("offers (-want +got):\n%s", diff)
	}
}

func TestCreateIsIdempotentOnTheRecordID(t *testing.T) {
	fake := fakecloudtest.NewEC2(t, fakecloud.EC2Options{})
	p := newProvider(t, fake, "prod")
	key := brokerKey(t)
	req := providers.CreateRequest{
		RecordID: "rec-01", Offer: offer(t, p, "p5.48xlarge", true),
		Tags: map[string]string{"team": "nlp", "job": "finetune-7"}, SSHAuthorizedKey: key,
		UserData: "#!/bin/sh\necho warmup\n",
	}
	first, err := p.Create(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := p.Create(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if first.ID != again.ID {
		t.Errorf("second create launched %s, want the first machine %s", again.ID, first.ID)
	}
	insts := fake.Instances()
	if len(insts) != 1 || fake.Calls("RunInstances") != 2 {
		t.Fatalf("%d machines after %d RunInstances calls, want 1 after 2", len(insts), fake.Calls("RunInstances"))
	}
	in := insts[0]
	if in.ClientToken != "rec-01" || !in.Spot || in.Zone != "us-east-1a" || in.InstanceType != "p5.48xlarge" {
		t.Errorf("launched %+v, want a spot p5.48xlarge in us-east-1a with client token rec-01", in)
	}
	wantTags := map[string]string{
		"spillway:cluster": "prod", "spillway:record": "rec-01", "spillway:team": "nlp",
		"spillway:job": "finetune-7", "Name": "spillway-rec-01",
	}
	if diff := cmp.Diff(wantTags, in.Tags); diff != "" {
		t.Errorf("tags (-want +got):\n%s", diff)
	}
	ci, err := fakecloud.ParseUserData(in.UserData)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ci.AuthorizedKeys, key) || !strings.Contains(in.UserData, "echo warmup") {
		t.Errorf("user data lacks the broker key or the request's script:\n%s", in.UserData)
	}
	if first.RecordID != "rec-01" || first.Tags["team"] != "nlp" || !first.Spot {
		t.Errorf("instance = %+v", first)
	}
}

func TestCreateErrorsAreTyped(t *testing.T) {
	fake := fakecloudtest.NewEC2(t, fakecloud.EC2Options{Capacity: map[string]int{"g6.xlarge": 0}})
	p := newProvider(t, fake, "prod")
	_, err := p.Create(context.Background(), providers.CreateRequest{RecordID: "rec-cap", Offer: offer(t, p, "g6.xlarge", false)})
	if !providers.IsInsufficientCapacity(err) || !providers.IsNextOffer(err) || providers.Code(err) != "InsufficientInstanceCapacity" {
		t.Fatalf("err = %v, want insufficient capacity with its EC2 code", err)
	}
	for code, kind := range map[string]error{
		"VcpuLimitExceeded":            providers.ErrQuotaExceeded,
		"InstanceLimitExceeded":        providers.ErrQuotaExceeded,
		"MaxSpotInstanceCountExceeded": providers.ErrQuotaExceeded,
		"SpotMaxPriceTooLow":           providers.ErrUnsupported,
		"Unsupported":                  providers.ErrUnsupported,
		"AuthFailure":                  providers.ErrUnauthorized,
		"UnauthorizedOperation":        providers.ErrUnauthorized,
		"InvalidParameterValue":        providers.ErrInvalidRequest,
		"SomeCodeNobodyMapped":         providers.ErrInvalidRequest,
	} {
		fake.FailNext("RunInstances", code)
		_, err := p.Create(context.Background(), providers.CreateRequest{RecordID: "rec-" + strings.ToLower(code[:4]), Offer: offer(t, p, "p5.48xlarge", false)})
		if !errors.Is(err, kind) || providers.Code(err) != code {
			t.Errorf("%s: err = %v, want kind %v", code, err, kind)
		}
	}
	if _, err := p.Create(context.Background(), providers.CreateRequest{RecordID: "rec-x", Offer: providers.Offer{InstanceType: "p4d.24xlarge"}}); !errors.Is(err, providers.ErrInvalidRequest) {
		t.Errorf("unknown offer: err = %v, want ErrInvalidRequest", err)
	}
}

func TestListSeesOnlyThisClustersLiveMachines(t *testing.T) {
	fake := fakecloudtest.NewEC2(t, fakecloud.EC2Options{})
	prod := newProvider(t, fake, "prod")
	staging := newProvider(t, fake, "staging")
	ctx := context.Background()
	a, err := prod.Create(ctx, providers.CreateRequest{RecordID: "rec-a", Offer: offer(t, prod, "g6.xlarge", false)})
	if err != nil {
		t.Fatal(err)
	}
	b, err := prod.Create(ctx, providers.CreateRequest{RecordID: "rec-b", Offer: offer(t, prod, "g6.xlarge", false)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := staging.Create(ctx, providers.CreateRequest{RecordID: "rec-c", Offer: offer(t, staging, "g6.xlarge", false)}); err != nil {
		t.Fatal(err)
	}
	deleteUntilGone(t, prod, b.ID)

	got, err := prod.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, i := range got {
		ids = append(ids, i.RecordID+"="+i.ID)
	}
	if diff := cmp.Diff([]string{"rec-a=" + a.ID}, ids); diff != "" {
		t.Errorf("prod list (-want +got):\n%s", diff)
	}
	// Another cluster's machine is not this provider's to see or delete.
	other, _ := staging.List(ctx)
	if err := prod.Delete(ctx, other[0].ID); !providers.IsNotFound(err) {
		t.Errorf("deleting another cluster's machine: err = %v, want ErrNotFound", err)
	}
}

// deleteUntilGone retries Delete as the contract asks, until ErrNotFound.
func deleteUntilGone(t *testing.T, p providers.Provider, id string) int {
	t.Helper()
	for i := 1; i <= 200; i++ {
		err := p.Delete(context.Background(), id)
		if providers.IsNotFound(err) {
			return i
		}
		if err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("delete %s never reached ErrNotFound", id)
	return 0
}

func TestDeleteReturnsNotFoundOnceGone(t *testing.T) {
	fake := fakecloudtest.NewEC2(t, fakecloud.EC2Options{ShutdownTime: 100 * time.Millisecond})
	p := newProvider(t, fake, "prod")
	ctx := context.Background()
	inst, err := p.Create(ctx, providers.CreateRequest{RecordID: "rec-d", Offer: offer(t, p, "g6.xlarge", false)})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(ctx, inst.ID); err != nil {
		t.Fatalf("first delete: %v", err)
	}
	got, err := p.Get(ctx, inst.ID)
	if err != nil || got.State != providers.StateStopping {
		t.Errorf("after delete: %+v, %v; want a stopping machine", got, err)
	}
	if n := deleteUntilGone(t, p, inst.ID); n < 2 {
		t.Errorf("delete reached ErrNotFound after %d calls, want the machine to go away first", n)
	}
	if fake.Instances()[0].State != "terminated" {
		t.Errorf("fake state %q, want terminated", fake.Instances()[0].State)
	}
	for _, op := range []func() error{
		func() error { _, err := p.Get(ctx, "i-0000000000000dead"); return err },
		func() error { return p.Delete(ctx, "i-0000000000000dead") },
	} {
		if err := op(); !providers.IsNotFound(err) || providers.Code(err) != "InvalidInstanceID.NotFound" {
			t.Errorf("unknown id: err = %v, want ErrNotFound from InvalidInstanceID.NotFound", err)
		}
	}
}

func TestHostKeysAreReadFromTheConsole(t *testing.T) {
	fake := fakecloudtest.NewEC2(t, fakecloud.EC2Options{SSHD: true, BootTime: 200 * time.Millisecond})
	p := newProvider(t, fake, "prod")
	ctx := context.Background()
	inst, err := p.Create(ctx, providers.CreateRequest{RecordID: "rec-k", Offer: offer(t, p, "g6.xlarge", false), SSHAuthorizedKey: brokerKey(t)})
	if err != nil {
		t.Fatal(err)
	}
	// Nothing is printed before the machine boots.
	if keys, err := p.HostKeys(ctx, inst.ID); err != nil || len(keys) != 0 {
		t.Fatalf("host keys of a pending machine: %v, %v; want none yet", keys, err)
	}
	running, err := providers.WaitRunning(ctx, p, inst.ID, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	sshd := fake.Instances()[0].SSHD
	if running.SSHHost != sshd.Addr || running.SSHUser != "root" {
		t.Errorf("ssh at %s@%s, want root@%s", running.SSHUser, running.SSHHost, sshd.Addr)
	}
	keys, err := p.HostKeys(ctx, inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || ssh.FingerprintSHA256(keys[0]) != ssh.FingerprintSHA256(sshd.HostKey) {
		t.Errorf("host keys %v, want the sshd's %s", keys, ssh.FingerprintSHA256(sshd.HostKey))
	}
}
