package agent

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/onprem/gpu/sim"
	"github.com/spillway-dev/spillway/onprem/wire"
)

// tlsServer serves h over HTTPS with a certificate for 127.0.0.1 from a
// fresh CA, and returns the server and that CA (PEM).
func tlsServer(t *testing.T, h http.Handler) (*httptest.Server, []byte) {
	t.Helper()
	now := time.Now()
	caPEM, caKeyPEM, err := wire.NewCA("test CA", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ca, caKey, err := wire.ParseCAPair(caPEM, caKeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := wire.IssueServerCert(ca, caKey, []string{"127.0.0.1"}, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, caPEM
}

// TestFinding1FakeBrokerRefused: an agent that trusts the real broker's CA
// and is pointed at an impostor with a certificate from another CA
// refuses to talk to it: the handshake fails, no request (and so no
// token) reaches the impostor, and the agent never syncs.
func TestFinding1FakeBrokerRefused(t *testing.T) {
	_, realCA := tlsServer(t, http.NotFoundHandler())
	var requests atomic.Int32
	var sawToken atomic.Value
	impostor, _ := tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		sawToken.Store(r.Header.Get("Authorization"))
		io.WriteString(w, `{"generation": 1}`)
	}))
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, realCA, 0o600); err != nil {
		t.Fatal(err)
	}
	be, _ := sim.New("1xH100-80GB", "n1", sim.Options{})
	ag, err := New(Config{Broker: impostor.URL, Token: "agent-secret-0123456789", Name: "n1", DataDir: filepath.Join(dir, "agent"), CAFile: caFile},
		be, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = ag.register(ctx)
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("register with an impostor: %v", err)
	}
	if err := ag.syncOnce(ctx); err == nil {
		t.Fatal("sync with an impostor succeeded")
	}
	if n := requests.Load(); n != 0 {
		t.Fatalf("the impostor got %d requests (token %v)", n, sawToken.Load())
	}
}

// TestAgentTrustsConfiguredCA: with the right CA the agent reaches the
// broker over HTTPS.
func TestAgentTrustsConfiguredCA(t *testing.T) {
	var got atomic.Value
	srv, ca := tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get("Authorization"))
		io.WriteString(w, `{"generation": 1, "heartbeatInterval": 1000000000}`)
	}))
	dir := t.TempDir()
	be, _ := sim.New("1xH100-80GB", "n1", sim.Options{})
	ag, err := New(Config{Broker: srv.URL, Token: "agent-secret-0123456789", Name: "n1", DataDir: dir, CA: string(ca)},
		be, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := ag.register(context.Background()); err != nil {
		t.Fatalf("register: %v", err)
	}
	if got.Load() != "Bearer agent-secret-0123456789" {
		t.Fatalf("broker saw %v", got.Load())
	}
}
