package bootstrap_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/crypto/ssh"

	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/bootstrap"
	"github.com/spillway-dev/spillway/providers/fakecloud"
	"github.com/spillway-dev/spillway/providers/fakecloud/fakecloudtest"
)

// The test binary is also the "spillway" binary the bootstrap uploads:
// started as `<bin> agent --config …` it acts as a stand-in agent.
func TestMain(m *testing.M) {
	fakecloud.RunAgentIfAsked()
	os.Exit(m.Run())
}

func newClientKey(t testing.TB) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func vouch(keys ...ssh.PublicKey) func(context.Context) ([]ssh.PublicKey, error) {
	return func(context.Context) ([]ssh.PublicKey, error) { return keys, nil }
}

type rig struct {
	sshd   *fakecloud.SSHHost
	reg    *fakecloud.Registrar
	client ssh.Signer
	dir    string
}

func newRig(t testing.TB) *rig {
	client := newClientKey(t)
	return &rig{
		sshd:   fakecloudtest.StartSSHD(t, fakecloud.SSHOptions{AuthorizedKeys: []string{string(ssh.MarshalAuthorizedKey(client.PublicKey()))}}),
		reg:    fakecloudtest.NewRegistrar(t),
		client: client,
		dir:    t.TempDir(),
	}
}

func (r *rig) options(name, token string) bootstrap.Options {
	return bootstrap.Options{
		Agent: bootstrap.AgentConfig{
			Broker:  r.reg.URL,
			Token:   token,
			Name:    name,
			GPUs:    "sim:8xH100-80GB",
			DataDir: filepath.Join(r.dir, "data"),
			Labels:  map[string]string{"pool": "test", "instance": name, "provider": "fake"},
		},
		RemoteDir:       filepath.Join(r.dir, "opt"),
		WaitRegistered:  func(ctx context.Context) error { return r.reg.Wait(ctx, name) },
		ConnectTimeout:  20 * time.Second,
		RegisterTimeout: 20 * time.Second,
		Backoff:         bootstrap.Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Logger:          slog.New(slog.DiscardHandler),
	}
}

func (r *rig) target(keys func(context.Context) ([]ssh.PublicKey, error)) bootstrap.Target {
	return bootstrap.Target{Addr: r.sshd.Addr, User: "root", Signer: r.client, HostKeys: keys}
}

// stopOnCleanup stops the agent when the test ends (before sshd stops).
func stopOnCleanup(t *testing.T, r *rig, remoteDir string) {
	t.Cleanup(func() {
		if _, err := bootstrap.Stop(context.Background(), r.target(vouch(r.sshd.HostKey)), bootstrap.StopOptions{RemoteDir: remoteDir}); err != nil {
			t.Errorf("stop agent: %v", err)
		}
	})
}

func stepNames(tr *bootstrap.Transcript) []string {
	var names []string
	for _, s := range tr.Steps {
		names = append(names, s.Name)
	}
	return names
}

func TestRunUploadsStartsAndWaitsForRegistration(t *testing.T) {
	r := newRig(t)
	r.reg.Expect("node-1", "token-node-1")
	opts := r.options("node-1", "token-node-1")
	stopOnCleanup(t, r, opts.RemoteDir)

	tr, err := bootstrap.Run(context.Background(), r.target(vouch(r.sshd.HostKey)), opts)
	if err != nil {
		t.Fatalf("bootstrap: %v\ntranscript: %+v", err, tr)
	}
	want := []string{"connect", "probe", "upload binary", "upload config", "start agent (supervised)", "register"}
	if diff := cmp.Diff(want, stepNames(tr)); diff != "" {
		t.Errorf("steps (-want +got):\n%s", diff)
	}
	for _, s := range tr.Steps {
		if s.ExitCode != 0 || s.Error != "" {
			t.Errorf("step %q: exit %d, error %q", s.Name, s.ExitCode, s.Error)
		}
	}
	if tr.HostKey != ssh.FingerprintSHA256(r.sshd.HostKey) {
		t.Errorf("accepted host key %s, want %s", tr.HostKey, ssh.FingerprintSHA256(r.sshd.HostKey))
	}
	if tr.Init != bootstrap.InitSupervised {
		t.Errorf("init = %q, want %q (no systemd in this container)", tr.Init, bootstrap.InitSupervised)
	}
	if tr.Phases.Connect <= 0 || tr.Phases.Upload <= 0 || tr.Phases.Start <= 0 || tr.Phases.Register <= 0 {
		t.Errorf("phases not all measured: %+v", tr.Phases)
	}

	// The uploaded binary is this test binary, byte for byte.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := sum(t, filepath.Join(opts.RemoteDir, "bin", "spillway")), sum(t, exe); got != want {
		t.Errorf("uploaded binary sha256 %s, want %s", got, want)
	}
	// The config is private to root and reads back as what was sent.
	cfgPath := filepath.Join(opts.RemoteDir, "agent.yaml")
	st, err := os.Stat(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("agent.yaml mode %v, want 0600", st.Mode().Perm())
	}
	raw, _ := os.ReadFile(cfgPath)
	got, err := bootstrap.ParseAgentConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(opts.Agent, got); diff != "" {
		t.Errorf("agent config on the machine (-sent +read):\n%s", diff)
	}
	// The agent registered with its labels, under the per-machine token.
	reg, ok := r.reg.Registration("node-1")
	if !ok {
		t.Fatal("no registration recorded")
	}
	if diff := cmp.Diff(opts.Agent.Labels, reg.Labels); diff != "" {
		t.Errorf("registered labels (-want +got):\n%s", diff)
	}
	// The transcript is JSON for the broker's record and carries no token.
	js, err := json.Marshal(tr)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(js), "token-node-1") {
		t.Errorf("transcript leaks the agent token: %s", js)
	}

	// A second run on the same machine skips the binary upload.
	r.reg.Expect("node-1", "token-node-1b")
	opts.Agent.Token = "token-node-1b"
	tr2, err := bootstrap.Run(context.Background(), r.target(vouch(r.sshd.HostKey)), opts)
	if err != nil {
		t.Fatalf("second bootstrap: %v", err)
	}
	if !tr2.Steps[2].Skipped || tr2.Steps[2].Name != "upload binary" {
		t.Errorf("second run step 3 = %+v, want a skipped binary upload", tr2.Steps[2])
	}
}

func TestStopEndsTheSupervisedAgent(t *testing.T) {
	r := newRig(t)
	r.reg.Expect("node-2", "tok2")
	opts := r.options("node-2", "tok2")
	if _, err := bootstrap.Run(context.Background(), r.target(vouch(r.sshd.HostKey)), opts); err != nil {
		t.Fatal(err)
	}
	pidPath := filepath.Join(opts.RemoteDir, "agent.pid")
	raw, err := os.ReadFile(pidPath)
	if err != nil {
		t.Fatal(err)
	}
	pgid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bootstrap.Stop(context.Background(), r.target(vouch(r.sshd.HostKey)), bootstrap.StopOptions{RemoteDir: opts.RemoteDir}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pidPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pid file still there after stop: %v", err)
	}
	// The supervisor's process group empties (kill -0 on it fails).
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(-pgid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("process group %d still alive 5s after stop", pgid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestHostKeyMismatchRunsNothing(t *testing.T) {
	r := newRig(t)
	r.reg.Expect("node-3", "tok3")
	opts := r.options("node-3", "tok3")
	// The provider vouches for a key that is not the one sshd presents.
	otherPEM, other, err := fakecloud.GenerateHostKey()
	if err != nil || len(otherPEM) == 0 {
		t.Fatal(err)
	}

	tr, err := bootstrap.Run(context.Background(), r.target(vouch(other)), opts)
	if !providers.IsHostKeyMismatch(err) {
		t.Fatalf("err = %v, want a host key mismatch", err)
	}
	var mm *bootstrap.MismatchError
	if !errors.As(err, &mm) || mm.Presented != ssh.FingerprintSHA256(r.sshd.HostKey) {
		t.Errorf("mismatch error %+v does not name the presented key %s", mm, ssh.FingerprintSHA256(r.sshd.HostKey))
	}
	if diff := cmp.Diff([]string{"connect"}, stepNames(tr)); diff != "" {
		t.Errorf("steps after a mismatch (-want +got):\n%s", diff)
	}
	if tr.Steps[0].Attempts != 1 {
		t.Errorf("connect attempts = %d, want 1: a mismatch is not retried", tr.Steps[0].Attempts)
	}
	// Nothing ran: the probe and the uploads would have created the remote
	// dir, and sshd never let the client authenticate.
	if _, err := os.Stat(opts.RemoteDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("remote dir exists after a mismatch: %v", err)
	}
	if log := r.sshd.Log(); strings.Contains(log, "Accepted publickey") {
		t.Errorf("sshd accepted a login after a host key mismatch:\n%s", log)
	}
	if _, ok := r.reg.Registration("node-3"); ok {
		t.Error("an agent registered after a host key mismatch")
	}
}

func TestConnectRetriesWhileTheMachineBoots(t *testing.T) {
	fakecloudtest.RequireSSHD(t)
	client := newClientKey(t)
	reg := fakecloudtest.NewRegistrar(t)
	reg.Expect("node-4", "tok4")
	hostPEM, hostKey, err := fakecloud.GenerateHostKey()
	if err != nil {
		t.Fatal(err)
	}
	ip := fakecloud.NextLoopbackIP()
	port, err := fakecloud.FreePort(ip)
	if err != nil {
		t.Fatal(err)
	}
	// The provider publishes no key at first, then the key while sshd is
	// not up yet (connection refused), then sshd comes up.
	r := &rig{reg: reg, client: client, dir: t.TempDir()}
	opts := r.options("node-4", "tok4")
	addr := ip + ":" + strconv.Itoa(port)
	calls := 0
	keys := func(context.Context) ([]ssh.PublicKey, error) {
		calls++
		switch {
		case calls == 1:
			return nil, nil
		case calls == 3:
			r.sshd = fakecloudtest.StartSSHD(t, fakecloud.SSHOptions{IP: ip, Port: port, HostKeyPEM: hostPEM,
				AuthorizedKeys: []string{string(ssh.MarshalAuthorizedKey(client.PublicKey()))}})
			// Registered after sshd's own cleanup, so it runs before it.
			stopOnCleanup(t, r, opts.RemoteDir)
		}
		return []ssh.PublicKey{hostKey}, nil
	}
	target := bootstrap.Target{Addr: addr, User: "root", Signer: client, HostKeys: keys}
	tr, err := bootstrap.Run(context.Background(), target, opts)
	if err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	if tr.Steps[0].Attempts != 3 {
		t.Errorf("connect attempts = %d, want 3 (no keys, refused, connected)", tr.Steps[0].Attempts)
	}
}

func TestUnregisteredAgentFailsWithItsLog(t *testing.T) {
	r := newRig(t)
	// The registrar expects another token: the agent is refused and says so
	// in its log, which the transcript picks up.
	r.reg.Expect("node-5", "the-right-token")
	opts := r.options("node-5", "a-wrong-token")
	opts.RegisterTimeout = 3 * time.Second
	stopOnCleanup(t, r, opts.RemoteDir)

	tr, err := bootstrap.Run(context.Background(), r.target(vouch(r.sshd.HostKey)), opts)
	if !errors.Is(err, bootstrap.ErrNotRegistered) {
		t.Fatalf("err = %v, want ErrNotRegistered", err)
	}
	last := tr.Steps[len(tr.Steps)-1]
	if last.Name != "agent log" || !strings.Contains(last.StderrTail, "401") {
		t.Errorf("last step = %+v, want the agent log with its 401", last)
	}
	if tr.Error == "" {
		t.Error("transcript has no error")
	}
}

func TestUnreachableMachineTimesOut(t *testing.T) {
	client := newClientKey(t)
	_, key, err := fakecloud.GenerateHostKey()
	if err != nil {
		t.Fatal(err)
	}
	ip := fakecloud.NextLoopbackIP()
	port, err := fakecloud.FreePort(ip)
	if err != nil {
		t.Fatal(err)
	}
	reg := fakecloudtest.NewRegistrar(t)
	r := &rig{reg: reg, client: client, dir: t.TempDir()}
	opts := r.options("node-6", "tok6")
	opts.ConnectTimeout = 300 * time.Millisecond
	tr, err := bootstrap.Run(context.Background(), bootstrap.Target{Addr: ip + ":" + strconv.Itoa(port), User: "root", Signer: client, HostKeys: vouch(key)}, opts)
	if !errors.Is(err, bootstrap.ErrUnreachable) {
		t.Fatalf("err = %v, want ErrUnreachable", err)
	}
	if tr.Steps[0].Attempts < 2 {
		t.Errorf("connect attempts = %d, want retries", tr.Steps[0].Attempts)
	}
}

func sum(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}
