package agent

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spillway-dev/spillway/onprem/wire"
)

// pinnedCAFile is the broker's CA as the agent pinned it at enrolment.
const pinnedCAFile = "broker-ca.pem"

// credentialFile holds the node credential the agent got at enrolment.
const credentialFile = "node-credential.json"

// agentTLS is the agent's trust in the broker: the configured bundle
// (caFile or ca), else the CA pinned at enrolment, else the system roots.
func agentTLS(cfg Config) (*tls.Config, error) {
	var ca []byte
	switch {
	case cfg.CA != "":
		ca = []byte(cfg.CA)
	case cfg.CAFile != "":
		b, err := wire.ReadCA(cfg.CAFile)
		if err != nil {
			return nil, err
		}
		ca = b
	default:
		b, err := os.ReadFile(filepath.Join(cfg.DataDir, pinnedCAFile))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("read pinned broker CA: %w", err)
		}
		ca = b
	}
	tc, err := wire.ClientTLS(ca)
	if err != nil {
		return nil, fmt.Errorf("broker CA: %w", err)
	}
	return tc, nil
}

// savedCredential is the node credential the broker issued at enrolment,
// bound to the node's name.
type savedCredential struct {
	Broker string `json:"broker"`
	Node   string `json:"node"`
	Token  string `json:"token"`
}

// loadCredential uses the credential of an earlier enrolment when the
// config names no token of its own.
func loadCredential(cfg *Config) error {
	raw, err := os.ReadFile(filepath.Join(cfg.DataDir, credentialFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read node credential: %w", err)
	}
	var c savedCredential
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("node credential %s: %w", filepath.Join(cfg.DataDir, credentialFile), err)
	}
	if c.Node != cfg.Name {
		return fmt.Errorf("the node credential in %s belongs to node %s, not %s; remove it and enrol again with a join token", cfg.DataDir, c.Node, cfg.Name)
	}
	if cfg.Token == "" || cfg.JoinToken != "" {
		cfg.Token, cfg.JoinToken = c.Token, ""
	}
	return nil
}

func saveCredential(dir string, c savedCredential) error {
	raw, err := json.Marshal(c)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, credentialFile+".tmp")
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, credentialFile))
}
