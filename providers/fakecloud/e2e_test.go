package fakecloud_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"google.golang.org/api/option"

	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/aws"
	"github.com/spillway-dev/spillway/providers/bootstrap"
	"github.com/spillway-dev/spillway/providers/fake"
	"github.com/spillway-dev/spillway/providers/fakecloud"
	"github.com/spillway-dev/spillway/providers/fakecloud/fakecloudtest"
	"github.com/spillway-dev/spillway/providers/gcp"
	"github.com/spillway-dev/spillway/providers/lease"
	"github.com/spillway-dev/spillway/providers/sshpool"
)

// The test binary is the "spillway" binary uploaded to the machines.
func TestMain(m *testing.M) {
	fakecloud.RunAgentIfAsked()
	os.Exit(m.Run())
}

func newSigner(tb testing.TB) ssh.Signer {
	tb.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func authorized(s ssh.Signer) string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey())))
}

// world is what the broker would hold: its SSH key, its registration
// endpoint, and a place for the machines' agent files.
type world struct {
	signer ssh.Signer
	reg    *fakecloud.Registrar
	dir    string
}

func newWorld(tb testing.TB) *world {
	return &world{signer: newSigner(tb), reg: fakecloudtest.NewRegistrar(tb), dir: tb.TempDir()}
}

// launch is the broker's side of a burst, from create to "agent
// registered": create, wait for an address, bootstrap against the keys
// the provider vouches for. It returns the transcript and the time Create
// and the wait for an address took.
func (w *world) launch(tb testing.TB, p providers.Provider, record string, offer providers.Offer) (*providers.Instance, *bootstrap.Transcript, time.Duration, error) {
	tb.Helper()
	ctx := context.Background()
	t0 := time.Now()
	inst, err := p.Create(ctx, providers.CreateRequest{
		RecordID: record, Offer: offer, SSHAuthorizedKey: authorized(w.signer),
		Tags: map[string]string{"team": "nlp", "job": "j-" + record},
	})
	if err != nil {
		tb.Fatalf("create: %v", err)
	}
	inst, err = providers.WaitRunning(ctx, p, inst.ID, 20*time.Millisecond)
	if err != nil {
		tb.Fatalf("wait running: %v", err)
	}
	created := time.Since(t0)
	token := "agent-token-" + record
	w.reg.Expect(inst.ID, token)
	remote := filepath.Join(w.dir, record)
	target := bootstrap.Target{
		Addr: inst.SSHHost, User: inst.SSHUser, Signer: w.signer,
		HostKeys: func(ctx context.Context) ([]ssh.PublicKey, error) { return p.HostKeys(ctx, inst.ID) },
	}
	tr, err := bootstrap.Run(ctx, target, bootstrap.Options{
		Agent: bootstrap.AgentConfig{
			Broker: w.reg.URL, Token: token, Name: inst.ID, GPUs: "sim:8xH100-80GB",
			DataDir: filepath.Join(remote, "data"),
			Labels:  map[string]string{"pool": p.Name(), "instance": inst.ID, "provider": inst.Provider},
		},
		RemoteDir:       remote,
		WaitRegistered:  func(ctx context.Context) error { return w.reg.Wait(ctx, inst.ID) },
		ConnectTimeout:  20 * time.Second,
		RegisterTimeout: 20 * time.Second,
		Backoff:         bootstrap.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Logger:          slog.New(slog.DiscardHandler),
	})
	if err == nil {
		// The machine is this computer: stop the agent when the test ends,
		// before the fake cloud stops the sshd.
		tb.Cleanup(func() {
			if _, err := bootstrap.Stop(context.Background(), target, bootstrap.StopOptions{RemoteDir: remote}); err != nil {
				tb.Errorf("stop agent on %s: %v", inst.ID, err)
			}
		})
	}
	return inst, tr, created, err
}

func (w *world) mustLaunch(t *testing.T, p providers.Provider, record string, offer providers.Offer) *providers.Instance {
	t.Helper()
	inst, tr, _, err := w.launch(t, p, record, offer)
	if err != nil {
		t.Fatalf("bootstrap %s: %v\n%+v", inst.ID, err, tr)
	}
	for _, s := range tr.Steps {
		t.Logf("%-26s exit %d  %v", s.Name, s.ExitCode, s.Duration.Round(time.Millisecond))
	}
	reg, ok := w.reg.Registration(inst.ID)
	if !ok || reg.Labels["provider"] != p.Name() {
		t.Fatalf("registration of %s: %+v, %v", inst.ID, reg, ok)
	}
	return inst
}

func firstOffer(t testing.TB, p providers.Provider) providers.Offer {
	t.Helper()
	offers, err := p.Offers(context.Background())
	if err != nil || len(offers) == 0 {
		t.Fatalf("offers: %v, %v", offers, err)
	}
	providers.SortOffers(offers)
	return offers[0]
}

func awsProvider(tb testing.TB, fake *fakecloud.EC2) *aws.Provider {
	tb.Helper()
	p, err := aws.NewWithAPI(aws.Config{
		Cluster: "e2e", Region: "us-east-1", ImageID: "ami-0gpu", SSHUser: "root", SSHPort: fake.SSHPort(),
		InstanceTypes: []aws.InstanceType{{Name: "g6.xlarge", GPUModel: "L4", GPUs: 1, GPUMemoryGiB: 24, OnDemandPrice: 805_000}},
	}, fakecloud.EC2Client(fake), fakecloud.PricingClient(fake))
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

func TestEndToEndAWS(t *testing.T) {
	w := newWorld(t)
	fake := fakecloudtest.NewEC2(t, fakecloud.EC2Options{SSHD: true, BootTime: 100 * time.Millisecond})
	p := awsProvider(t, fake)
	w.mustLaunch(t, p, "aws-1", firstOffer(t, p))
}

func TestEndToEndGCP(t *testing.T) {
	w := newWorld(t)
	fake := fakecloudtest.NewGCE(t, fakecloud.GCEOptions{SSHD: true, BootTime: 100 * time.Millisecond})
	p, err := gcp.New(context.Background(), gcp.Config{
		Cluster: "e2e", Project: fake.Project(), Region: "us-central1", Endpoint: fake.URL,
		Image: "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts", SSHUser: "root", SSHPort: fake.SSHPort(),
		MachineTypes: []gcp.MachineType{{Name: "g2-standard-8", GPUModel: "L4", GPUs: 1, GPUMemoryGiB: 24, Zones: []string{"us-central1-a"}, OnDemandPrice: 850_000}},
	}, option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	w.mustLaunch(t, p, "gcp-1", firstOffer(t, p))
}

func TestEndToEndLambda(t *testing.T) {
	w := newWorld(t)
	fake := fakecloudtest.NewLambda(t, fakecloud.LambdaOptions{SSHD: true, BootTime: 100 * time.Millisecond})
	p, err := lease.New(lease.Config{
		Cluster: "e2e", Endpoint: fake.URL, APIKey: fake.APIKey(),
		HostKeySecret: []byte("e2e-secret-e2e-secret-e2e-secret-e2e"), SSHUser: "root", SSHPort: fake.SSHPort(),
	})
	if err != nil {
		t.Fatal(err)
	}
	w.mustLaunch(t, p, "lambda-1", firstOffer(t, p))
}

func TestEndToEndSSHPool(t *testing.T) {
	w := newWorld(t)
	host := fakecloudtest.StartSSHD(t, fakecloud.SSHOptions{AuthorizedKeys: []string{authorized(w.signer)}})
	p, err := sshpool.New(sshpool.Config{Hosts: []sshpool.Host{{
		Name: "box-1", Address: host.Addr, GPUModel: "H100", GPUs: 8, GPUMemoryGiB: 80,
		PricePerGPUHour: 1_100_000, LeaseEnds: time.Now().Add(90 * 24 * time.Hour), HostKey: host.AuthorizedKey(),
	}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.mustLaunch(t, p, "pool-1", firstOffer(t, p))
}

func TestEndToEndFakeProviderBackedBySSHD(t *testing.T) {
	w := newWorld(t)
	p := fake.New("fake", []providers.Offer{{Region: "r1", InstanceType: "fake-8xh100", GPUs: 8, PricePerHour: 1}}, nil)
	p.Boot = func(ctx context.Context, inst providers.Instance, req providers.CreateRequest) (fake.Machine, error) {
		h := fakecloudtest.StartSSHD(t, fakecloud.SSHOptions{AuthorizedKeys: []string{req.SSHAuthorizedKey}})
		return fake.Machine{SSHHost: h.Addr, SSHUser: "root", HostKeys: []ssh.PublicKey{h.HostKey}}, nil
	}
	w.mustLaunch(t, p, "fake-1", firstOffer(t, p))
}

// A machine whose host key is not the one its cloud publishes: nothing
// runs on it, the error says why, and the broker deletes it.
func TestEndToEndSwappedHostKeyIsDeleted(t *testing.T) {
	w := newWorld(t)
	ec2 := fakecloudtest.NewEC2(t, fakecloud.EC2Options{SSHD: true})
	p := awsProvider(t, ec2)
	inst, err := p.Create(context.Background(), providers.CreateRequest{RecordID: "swap-1", Offer: firstOffer(t, p), SSHAuthorizedKey: authorized(w.signer)})
	if err != nil {
		t.Fatal(err)
	}
	_, impostor, err := fakecloud.GenerateHostKey()
	if err != nil {
		t.Fatal(err)
	}
	ec2.PublishHostKey(inst.ID, impostor)

	_, tr, _, err := w.launch(t, p, "swap-1", firstOffer(t, p))
	if !providers.IsHostKeyMismatch(err) {
		t.Fatalf("err = %v, want a host key mismatch", err)
	}
	if len(tr.Steps) != 1 || tr.Steps[0].Name != "connect" {
		t.Errorf("steps = %+v, want the connect step alone", tr.Steps)
	}
	if _, err := os.Stat(filepath.Join(w.dir, "swap-1")); !os.IsNotExist(err) {
		t.Errorf("the machine's agent dir exists: %v", err)
	}
	if strings.Contains(ec2.Instances()[0].SSHD.Log(), "Accepted publickey") {
		t.Error("sshd let the broker log in")
	}
	// The broker deletes it, retrying until the provider says it is gone.
	for i := 0; ; i++ {
		err := p.Delete(context.Background(), inst.ID)
		if providers.IsNotFound(err) {
			break
		}
		if err != nil || i > 100 {
			t.Fatalf("delete: %v after %d tries", err, i)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := ec2.Instances()[0].State; st != "terminated" {
		t.Errorf("machine state %q, want terminated", st)
	}
}

// BenchmarkCreateToRegistered measures, on loopback, the broker's own
// share of a burst: from Create to "agent registered", split into create
// (API calls until the machine has an address), connect, upload (probe,
// binary, config), start and register. The binary uploaded is this test
// binary. Run it with:
//
//	go test -run '^$' -bench CreateToRegistered -benchtime 5x ./providers/fakecloud/
func BenchmarkCreateToRegistered(b *testing.B) {
	w := newWorld(b)
	fake := fakecloudtest.NewEC2(b, fakecloud.EC2Options{SSHD: true})
	p := awsProvider(b, fake)
	offer := firstOffer(b, p)
	exe, _ := os.Executable()
	if st, err := os.Stat(exe); err == nil {
		b.Logf("uploading %s (%d MiB) each time", filepath.Base(exe), st.Size()>>20)
	}
	var create, connect, upload, start, register, total time.Duration
	for i := 0; b.Loop(); i++ {
		_, tr, created, err := w.launch(b, p, fmt.Sprintf("bench-%d", i), offer)
		if err != nil {
			b.Fatalf("launch: %v", err)
		}
		create += created
		connect += tr.Phases.Connect
		upload += tr.Phases.Upload
		start += tr.Phases.Start
		register += tr.Phases.Register
		total += created + tr.Phases.Total
	}
	n := float64(b.N)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / n }
	b.ReportMetric(ms(create), "create-ms/op")
	b.ReportMetric(ms(connect), "connect-ms/op")
	b.ReportMetric(ms(upload), "upload-ms/op")
	b.ReportMetric(ms(start), "start-ms/op")
	b.ReportMetric(ms(register), "register-ms/op")
	b.ReportMetric(ms(total), "total-ms/op")
}
