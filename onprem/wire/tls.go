package wire

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// ClientTLS is the TLS setup of a client of the broker: it trusts exactly
// the CAs in caPEM (a bundle of PEM certificates), or the system's roots
// when caPEM is empty. TLS 1.2 at least.
func ClientTLS(caPEM []byte) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if len(caPEM) == 0 {
		return cfg, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("the CA bundle holds no PEM certificate")
	}
	cfg.RootCAs = pool
	return cfg, nil
}

// ReadCA reads a CA bundle file ("" reads nothing).
func ReadCA(path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CA bundle: %w", err)
	}
	if _, err := ClientTLS(b); err != nil {
		return nil, fmt.Errorf("CA bundle %s: %w", path, err)
	}
	return b, nil
}

// Files of a local CA and the server certificate it signed.
const (
	CAFileName   = "ca.pem"
	CAKeyName    = "ca-key.pem"
	CertFileName = "server.pem"
	KeyFileName  = "server-key.pem"
)

// EnsureLocalCA makes (once) a CA under dir and a server certificate for
// hosts signed by it, and returns the paths of the CA, the certificate and
// its key. Later calls reuse them while the certificate still covers
// hosts and has more than a week to live. For `spillway dev` and tests:
// production brokers use certificates from the site's own CA.
func EnsureLocalCA(dir string, hosts []string, now time.Time) (caFile, certFile, keyFile string, err error) {
	caFile, certFile, keyFile = filepath.Join(dir, CAFileName), filepath.Join(dir, CertFileName), filepath.Join(dir, KeyFileName)
	if certCovers(certFile, hosts, now.Add(7*24*time.Hour)) {
		if _, err := os.Stat(caFile); err == nil {
			return caFile, certFile, keyFile, nil
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", "", err
	}
	ca, caKey, err := loadOrMakeCA(dir, now)
	if err != nil {
		return "", "", "", err
	}
	certPEM, keyPEM, err := IssueServerCert(ca, caKey, hosts, now, 365*24*time.Hour)
	if err != nil {
		return "", "", "", err
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return "", "", "", err
	}
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		return "", "", "", err
	}
	return caFile, certFile, keyFile, nil
}

func certCovers(certFile string, hosts []string, until time.Time) bool {
	raw, err := os.ReadFile(certFile)
	if err != nil {
		return false
	}
	b, _ := pem.Decode(raw)
	if b == nil {
		return false
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil || c.NotAfter.Before(until) {
		return false
	}
	for _, h := range hosts {
		if c.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

func loadOrMakeCA(dir string, now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	caFile, keyFile := filepath.Join(dir, CAFileName), filepath.Join(dir, CAKeyName)
	if pair, err := tls.LoadX509KeyPair(caFile, keyFile); err == nil {
		c, err := x509.ParseCertificate(pair.Certificate[0])
		if k, ok := pair.PrivateKey.(*ecdsa.PrivateKey); ok && err == nil && c.NotAfter.After(now.Add(30*24*time.Hour)) {
			return c, k, nil
		}
	}
	certPEM, keyPEM, err := NewCA("Spillway local CA", now, 10*365*24*time.Hour)
	if err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(caFile, certPEM, 0o644); err != nil {
		return nil, nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, err
	}
	c, err := x509.ParseCertificate(pair.Certificate[0])
	return c, pair.PrivateKey.(*ecdsa.PrivateKey), err
}

// NewCA makes a self-signed CA certificate and its key, PEM-encoded.
func NewCA(name string, now time.Time, life time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"Spillway"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(life),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	return encodePair(der, key)
}

// IssueServerCert signs a server certificate for hosts (names or IPs).
func IssueServerCert(ca *x509.Certificate, caKey *ecdsa.PrivateKey, hosts []string, now time.Time, life time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "spillway broker", Organization: []string{"Spillway"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(life),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	return encodePair(der, key)
}

// ParseCAPair reads a CA certificate and key written by NewCA.
func ParseCAPair(certPEM, keyPEM []byte) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, err
	}
	c, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, nil, err
	}
	k, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, errors.New("CA key is not ECDSA")
	}
	return c, k, nil
}

func encodePair(der []byte, key *ecdsa.PrivateKey) ([]byte, []byte, error) {
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	return n
}
