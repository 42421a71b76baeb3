package agent

import (
	"context"
	"crypto/tls"
	"encoding/json"
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

	"github.com/spillway-dev/spillway/onprem/agentapi"
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

// TestEnrolSavesCredentialAndPinsCA: the agent exchanges its join token
// once, then registers with the node credential; a later start needs
// neither the join token nor a CA flag (the CA is pinned).
func TestEnrolSavesCredentialAndPinsCA(t *testing.T) {
	var caPEM []byte
	var enrols atomic.Int32
	var lastAuth atomic.Value
	srv, ca := tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case agentapi.PathEnrol:
			enrols.Add(1)
			if r.Header.Get("Authorization") != "" {
				t.Errorf("enrol carried a bearer token")
			}
			var req agentapi.EnrolRequest
			json.NewDecoder(r.Body).Decode(&req)
			if req.JoinToken != "spjoin.1.secret" || enrols.Load() > 1 {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			json.NewEncoder(w).Encode(agentapi.EnrolResponse{Node: req.Node, Credential: "spnode.1.cred", CA: string(caPEM)})
		default:
			lastAuth.Store(r.Header.Get("Authorization"))
			io.WriteString(w, `{"generation": 1}`)
		}
	}))
	caPEM = ca
	dir := t.TempDir()
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(caFile, ca, 0o600)
	be, _ := sim.New("1xH100-80GB", "n1", sim.Options{})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ag, err := New(Config{Broker: srv.URL, JoinToken: "spjoin.1.secret", Name: "n1", DataDir: dir, CAFile: caFile}, be, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := ag.register(context.Background()); err != nil {
		t.Fatal(err)
	}
	if lastAuth.Load() != "Bearer spnode.1.cred" {
		t.Fatalf("registered with %v", lastAuth.Load())
	}
	// Restart: no join token, no CA flag.
	ag2, err := New(Config{Broker: srv.URL, Name: "n1", DataDir: dir}, be, log)
	if err != nil {
		t.Fatal(err)
	}
	if err := ag2.register(context.Background()); err != nil {
		t.Fatalf("second start: %v", err)
	}
	if enrols.Load() != 1 || lastAuth.Load() != "Bearer spnode.1.cred" {
		t.Fatalf("enrols %d, auth %v", enrols.Load(), lastAuth.Load())
	}
	// Another name on the same data dir is refused.
	if _, err := New(Config{Broker: srv.URL, Name: "n2", DataDir: dir}, be, log); err == nil || !strings.Contains(err.Error(), "belongs to node n1") {
		t.Fatalf("credential of n1 used for n2: %v", err)
	}
}
