package server

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
)

// certHolder is the broker's certificate, swapped whole on reload: a
// handshake sees the old pair or the new one, never half of each.
type certHolder struct {
	mu   sync.RWMutex
	cert *tls.Certificate
}

func (h *certHolder) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.cert == nil {
		return nil, fmt.Errorf("no certificate loaded")
	}
	return h.cert, nil
}

// ReloadTLS reads tls.certFile and tls.keyFile again (on SIGHUP): new
// connections get the new certificate, open ones keep theirs. A pair that
// does not load leaves the old one in place and returns the error.
func (s *Server) ReloadTLS() error {
	if !s.cfg().TLS.Enabled() {
		return nil
	}
	pair, err := tls.LoadX509KeyPair(s.cfg().TLS.CertFile, s.cfg().TLS.KeyFile)
	if err != nil {
		return fmt.Errorf("load tls.certFile %s and tls.keyFile %s: %w", s.cfg().TLS.CertFile, s.cfg().TLS.KeyFile, err)
	}
	s.certs.mu.Lock()
	s.certs.cert = &pair
	s.certs.mu.Unlock()
	s.log.Info("TLS certificate loaded", "cert", s.cfg().TLS.CertFile)
	return nil
}

// serverTLS is the TLS setup of the API listener: TLS 1.2 at least, the
// certificate from certHolder.
func (s *Server) serverTLS() (*tls.Config, error) {
	if err := s.ReloadTLS(); err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: s.certs.get, NextProtos: []string{"h2", "http/1.1"}}, nil
}

// brokerCA is the CA bundle of the broker's certificate (tls.caFile), for
// burst machines and enrolling agents; "" when none is configured (the
// machine then trusts its system's roots).
func (s *Server) brokerCA() string {
	if s.cfg().TLS.CAFile == "" {
		return ""
	}
	b, err := os.ReadFile(s.cfg().TLS.CAFile)
	if err != nil {
		s.log.Error("read tls.caFile", "err", err)
		return ""
	}
	return string(b)
}
