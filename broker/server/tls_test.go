package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/onprem/wire"
)

// writeCA makes a CA and a server certificate for 127.0.0.1 under dir.
func writeCA(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	caFile, certFile, keyFile, err := wire.EnsureLocalCA(dir, []string{"127.0.0.1"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return caFile, certFile, keyFile
}

func servedSerial(t *testing.T, addr string, ca []byte) string {
	t.Helper()
	tc, err := wire.ClientTLS(ca)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tls.Dial("tcp", addr, tc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestServeTLSAndReload: the broker serves HTTPS from tls.certFile, a
// client trusting the CA gets through and one that does not is refused,
// and ReloadTLS (SIGHUP) puts a renewed certificate live.
func TestServeTLSAndReload(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	caFile, certFile, keyFile := writeCA(t, dir)
	h.srv.cfg().TLS.CertFile, h.srv.cfg().TLS.KeyFile, h.srv.cfg().TLS.CAFile = certFile, keyFile, caFile
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.srv.Serve(ctx, l) }()
	defer func() { cancel(); <-done }()
	addr := l.Addr().String()
	ca, _ := os.ReadFile(caFile)

	tc, _ := wire.ClientTLS(ca)
	cl := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
	resp, err := cl.Get("https://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz over TLS: %d", resp.StatusCode)
	}
	if _, err := http.Get("https://" + addr + "/healthz"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a client without the CA got through: %v", err)
	}
	before := servedSerial(t, addr, ca)

	// Renew: a new certificate from the same CA, then SIGHUP's reload.
	caPEM, _ := os.ReadFile(filepath.Join(dir, wire.CAFileName))
	caKey, _ := os.ReadFile(filepath.Join(dir, wire.CAKeyName))
	c, k, err := wire.ParseCAPair(caPEM, caKey)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := wire.IssueServerCert(c, k, []string{"127.0.0.1"}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(certFile, certPEM, 0o644)
	os.WriteFile(keyFile, keyPEM, 0o600)
	if err := h.srv.ReloadTLS(); err != nil {
		t.Fatal(err)
	}
	after := servedSerial(t, addr, ca)
	if after == before {
		t.Fatalf("the reload kept serving certificate %s", before)
	}
	// A broken pair leaves the served one in place.
	os.WriteFile(keyFile, []byte("garbage"), 0o600)
	if err := h.srv.ReloadTLS(); err == nil {
		t.Fatal("a broken key loaded")
	}
	if got := servedSerial(t, addr, ca); got != after {
		t.Fatalf("a failed reload changed the certificate")
	}
}

// TestPlainHTTPWarns: a broker without TLS logs a warning at every start.
func TestPlainHTTPWarns(t *testing.T) {
	h := newHarness(t)
	var logged strings.Builder
	h.srv.log = slog.New(slog.NewTextHandler(&logged, nil))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.srv.Serve(ctx, l) }()
	resp, err := http.Get("http://" + l.Addr().String() + "/healthz")
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	cancel()
	<-done
	if !strings.Contains(logged.String(), "serving plain HTTP") {
		t.Fatalf("no warning: %s", logged.String())
	}
}

// TestBurstMachineGetsBrokerCA: the bootstrap hands the broker's CA to the
// machine inside its agent config (over the host-key-verified SSH session).
func TestBurstMachineGetsBrokerCA(t *testing.T) {
	r := newBurstRig(t)
	caFile, _, _ := writeCA(t, t.TempDir())
	r.srv.cfg().TLS.CAFile = caFile
	r.fill()
	r.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "2h", "command": ["train"]}`)
	r.until("a machine is bootstrapped", 300, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.boots > 0
	})
	r.mu.Lock()
	got := r.lastCA
	r.mu.Unlock()
	want, _ := os.ReadFile(caFile)
	if got != string(want) {
		t.Fatalf("machine got CA %q", got)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(got)) {
		t.Fatal("the CA handed over is no PEM certificate")
	}
}
