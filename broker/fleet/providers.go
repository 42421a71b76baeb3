package fleet

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/crypto/ssh"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker/adapters"
	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/aws"
	"github.com/spillway-dev/spillway/providers/gcp"
	"github.com/spillway-dev/spillway/providers/lease"
	"github.com/spillway-dev/spillway/providers/sshpool"
)

func (f *Fleet) sshKeyPath() string {
	if f.cfg().Burst.SSHKeyFile != "" {
		return f.cfg().Burst.SSHKeyFile
	}
	return filepath.Join(f.cfg().DataDir, "burst_ssh_key")
}

// buildProvider makes one configured provider.
func (f *Fleet) buildProvider(ctx context.Context, pc adapters.Provider) (providers.Provider, billing.PoolKind, error) {
	switch {
	case pc.AWS != nil:
		p, err := aws.New(ctx, *pc.AWS)
		return p, billing.PoolCloud, err
	case pc.GCP != nil:
		p, err := gcp.New(ctx, *pc.GCP)
		return p, billing.PoolCloud, err
	case pc.Lambda != nil:
		c := *pc.Lambda
		if c.HostKeySecretFile == "" {
			c.HostKeySecretFile = filepath.Join(f.cfg().DataDir, "lambda-hostkey.secret")
		}
		if err := ensureSecret(c.HostKeySecretFile); err != nil {
			return nil, "", err
		}
		p, err := lease.New(c)
		return p, billing.PoolLease, err
	case pc.SSHPool != nil:
		p, err := sshpool.New(*pc.SSHPool, f.clock.Now)
		return p, billing.PoolLease, err
	}
	return nil, "", errors.New("no provider set")
}

// ensureSecret creates a 32-byte random secret file unless it exists.
func ensureSecret(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// loadOrCreateSSHKey reads the broker's SSH client key, creating an
// ed25519 key the first time.
func loadOrCreateSSHKey(path string) (ssh.Signer, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		block, err := ssh.MarshalPrivateKey(priv, "spillway broker")
		if err != nil {
			return nil, err
		}
		raw = pem.EncodeToMemory(block)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		if err := os.WriteFile(path, raw, 0o600); err != nil {
			return nil, fmt.Errorf("write ssh key: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("read ssh key: %w", err)
	}
	signer, err := ssh.ParsePrivateKey(raw)
	if err != nil {
		return nil, fmt.Errorf("parse ssh key %s: %w", path, err)
	}
	return signer, nil
}
