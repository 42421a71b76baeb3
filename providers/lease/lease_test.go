package lease_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/crypto/ssh"

	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/fakecloud"
	"github.com/spillway-dev/spillway/providers/fakecloud/fakecloudtest"
	"github.com/spillway-dev/spillway/providers/lease"
)

var secret = []byte("0123456789abcdef0123456789abcdef-test-secret")

func newProvider(t *testing.T, fake *fakecloud.Lambda, cluster string) *lease.Provider {
	t.Helper()
	t.Setenv("LAMBDA_API_KEY", fake.APIKey())
	p, err := lease.New(lease.Config{
		Cluster: cluster, Endpoint: fake.URL, HostKeySecret: secret,
		SSHUser: "root", SSHPort: fake.SSHPort(),
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

func offer(t *testing.T, p *lease.Provider, typ, region string) providers.Offer {
	t.Helper()
	offers, err := p.Offers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range offers {
		if o.InstanceType == typ && o.Region == region {
			return o
		}
	}
	t.Fatalf("no offer %s in %s", typ, region)
	return providers.Offer{}
}

func TestConfigNeedsAKeyAndASecret(t *testing.T) {
	t.Setenv("LAMBDA_API_KEY", "")
	if _, err := lease.New(lease.Config{Cluster: "prod", HostKeySecret: secret}); err == nil || !strings.Contains(err.Error(), "LAMBDA_API_KEY") {
		t.Errorf("no key: err = %v", err)
	}
	t.Setenv("LAMBDA_API_KEY", "k")
	if _, err := lease.New(lease.Config{Cluster: "prod", HostKeySecret: []byte("short")}); err == nil {
		t.Error("a short host key secret was accepted")
	}
	f := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(f, append(secret, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := lease.New(lease.Config{Cluster: "prod", HostKeySecretFile: f}); err != nil {
		t.Errorf("secret from file: %v", err)
	}
}

func TestOffersFollowCapacityAndPrices(t *testing.T) {
	fake := fakecloudtest.NewLambda(t, fakecloud.LambdaOptions{})
	fake.SetCapacity("gpu_8x_h100_sxm5", "us-west-1", 0)
	p := newProvider(t, fake, "prod")
	offers, err := p.Offers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []providers.Offer{
		{Provider: "lambda", Region: "us-east-1", InstanceType: "gpu_1x_h100_pcie", GPUModel: "H100", GPUs: 1, GPUMemoryBytes: 80 << 30,
			CPUs: 26, MemoryBytes: 200 << 30, PricePerHour: 2_490_000, Currency: "USD", Available: true, PriceSource: providers.PriceFromAPI},
		{Provider: "lambda", Region: "us-east-1", InstanceType: "gpu_8x_h100_sxm5", GPUModel: "H100", GPUs: 8, GPUMemoryBytes: 80 << 30,
			CPUs: 208, MemoryBytes: 1800 << 30, PricePerHour: 23_920_000, Currency: "USD", Available: true, PriceSource: providers.PriceFromAPI},
	}
	if diff := cmp.Diff(want, offers); diff != "" {
		t.Errorf("offers (-want +got):\n%s", diff)
	}
}

func TestCreateIsIdempotentOnTheRecordID(t *testing.T) {
	fake := fakecloudtest.NewLambda(t, fakecloud.LambdaOptions{})
	p := newProvider(t, fake, "prod")
	key := brokerKey(t)
	req := providers.CreateRequest{RecordID: "rec-l1", Offer: offer(t, p, "gpu_8x_h100_sxm5", "us-east-1"),
		Tags: map[string]string{"team": "nlp"}, SSHAuthorizedKey: key}
	first, err := p.Create(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := p.Create(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if first.ID != again.ID || len(fake.Instances()) != 1 || fake.Calls("POST /instance-operations/launch") != 1 {
		t.Fatalf("ids %s, %s; %d machines after %d launches; want one machine, one launch",
			first.ID, again.ID, len(fake.Instances()), fake.Calls("POST /instance-operations/launch"))
	}
	in := fake.Instances()[0]
	if in.Name != "spillway-rec-l1" || in.Tags["spillway:record"] != "rec-l1" || in.Tags["spillway:cluster"] != "prod" || in.Tags["spillway:team"] != "nlp" {
		t.Errorf("launched %+v", in)
	}
	if got := fake.SSHKeys()["spillway-prod"]; got != key {
		t.Errorf("registered key %q, want the broker's", got)
	}
	// The user data pins the record's host key.
	ci, err := fakecloud.ParseUserData(in.UserData)
	if err != nil {
		t.Fatal(err)
	}
	pinned, err := lease.HostKey(secret, "rec-l1")
	if err != nil {
		t.Fatal(err)
	}
	got, err := ssh.ParsePrivateKey(ci.HostKeyPEM)
	if err != nil {
		t.Fatalf("user data host key: %v", err)
	}
	if ssh.FingerprintSHA256(got.PublicKey()) != ssh.FingerprintSHA256(pinned.PublicKey()) {
		t.Error("user data carries another host key than the pinned one")
	}
	if first.RecordID != "rec-l1" || first.Tags["team"] != "nlp" || first.Region != "us-east-1" {
		t.Errorf("instance = %+v", first)
	}
	// A second record reuses the registered key.
	if _, err := p.Create(context.Background(), providers.CreateRequest{RecordID: "rec-l2", Offer: req.Offer, SSHAuthorizedKey: key}); err != nil {
		t.Fatal(err)
	}
	if n := fake.Calls("POST /ssh-keys"); n != 1 {
		t.Errorf("the key was registered %d times, want once", n)
	}
	// Another key under the same name is refused, not overwritten.
	_, err = p.Create(context.Background(), providers.CreateRequest{RecordID: "rec-l3", Offer: req.Offer, SSHAuthorizedKey: brokerKey(t)})
	if !errors.Is(err, providers.ErrInvalidRequest) {
		t.Errorf("different key under the same name: err = %v, want ErrInvalidRequest", err)
	}
}

func TestCreateErrorsAreTyped(t *testing.T) {
	fake := fakecloudtest.NewLambda(t, fakecloud.LambdaOptions{})
	p := newProvider(t, fake, "prod")
	o := offer(t, p, "gpu_1x_h100_pcie", "us-east-1")
	fake.SetCapacity("gpu_1x_h100_pcie", "us-east-1", 0)
	key := brokerKey(t)
	_, err := p.Create(context.Background(), providers.CreateRequest{RecordID: "cap", Offer: o, SSHAuthorizedKey: key})
	if !providers.IsInsufficientCapacity(err) || providers.Code(err) != "instance-operations/launch/insufficient-capacity" {
		t.Fatalf("err = %v, want insufficient capacity", err)
	}
	for _, c := range []struct {
		status int
		code   string
		kind   error
	}{
		{http.StatusBadRequest, "global/quota-exceeded", providers.ErrQuotaExceeded},
		{http.StatusForbidden, "global/account-inactive", providers.ErrUnauthorized},
		{http.StatusBadRequest, "global/invalid-parameters", providers.ErrInvalidRequest},
		{http.StatusNotFound, "global/object-does-not-exist", providers.ErrInvalidRequest},
		{http.StatusServiceUnavailable, "provider/internal-unavailable", providers.ErrUnavailable},
		{http.StatusTooManyRequests, "global/rate-limited", providers.ErrUnavailable},
	} {
		fake.FailNext("POST /instance-operations/launch", c.status, c.code)
		_, err := p.Create(context.Background(), providers.CreateRequest{RecordID: "e1", Offer: o, SSHAuthorizedKey: key})
		if !errors.Is(err, c.kind) || providers.Code(err) != c.code {
			t.Errorf("%s: err = %v, want kind %v", c.code, err, c.kind)
		}
	}
	t.Setenv("LAMBDA_API_KEY", "wrong")
	bad, err := lease.New(lease.Config{Cluster: "prod", Endpoint: fake.URL, HostKeySecret: secret})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.List(context.Background()); !providers.IsUnauthorized(err) || providers.Code(err) != "global/invalid-api-key" {
		t.Errorf("wrong API key: err = %v, want ErrUnauthorized", err)
	}
}

func TestListDeleteAndHostKeys(t *testing.T) {
	fake := fakecloudtest.NewLambda(t, fakecloud.LambdaOptions{SSHD: true, TerminateTime: 100 * time.Millisecond})
	prod, staging := newProvider(t, fake, "prod"), newProvider(t, fake, "staging")
	ctx := context.Background()
	key := brokerKey(t)
	o := offer(t, prod, "gpu_1x_h100_pcie", "us-east-1")
	a, err := prod.Create(ctx, providers.CreateRequest{RecordID: "a", Offer: o, SSHAuthorizedKey: key})
	if err != nil {
		t.Fatal(err)
	}
	c, err := staging.Create(ctx, providers.CreateRequest{RecordID: "c", Offer: o, SSHAuthorizedKey: key})
	if err != nil {
		t.Fatal(err)
	}
	got, err := prod.List(ctx)
	if err != nil || len(got) != 1 || got[0].ID != a.ID {
		t.Fatalf("prod list = %+v, %v; want only %s", got, err, a.ID)
	}
	if err := prod.Delete(ctx, c.ID); !providers.IsNotFound(err) {
		t.Errorf("deleting another cluster's machine: err = %v, want ErrNotFound", err)
	}

	// The pinned key is the key the machine's sshd presents.
	keys, err := prod.HostKeys(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	sshd := fake.Instances()[0].SSHD
	if len(keys) != 1 || ssh.FingerprintSHA256(keys[0]) != ssh.FingerprintSHA256(sshd.HostKey) {
		t.Errorf("pinned %v, sshd presents %s", keys, ssh.FingerprintSHA256(sshd.HostKey))
	}
	if a.SSHHost != sshd.Addr {
		t.Errorf("ssh host %s, want %s", a.SSHHost, sshd.Addr)
	}

	if err := prod.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	calls := 1
	for ; !providers.IsNotFound(prod.Delete(ctx, a.ID)); calls++ {
		if calls > 200 {
			t.Fatal("delete never reached ErrNotFound")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if calls < 2 || fake.Calls("POST /instance-operations/terminate") != 1 {
		t.Errorf("gone after %d deletes and %d terminate calls; want one terminate, then waiting", calls, fake.Calls("POST /instance-operations/terminate"))
	}
}
