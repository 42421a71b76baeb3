package bootstrap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/spillway-dev/spillway/providers"
)

// MismatchError is a host key the provider did not vouch for. It wraps
// providers.ErrHostKeyMismatch.
type MismatchError struct {
	Addr      string
	Presented string   // SHA256 fingerprint of the key the machine showed
	Vouched   []string // fingerprints of the keys the provider vouches for
}

// Error names both sides.
func (e *MismatchError) Error() string {
	return fmt.Sprintf("%s presented host key %s; the provider vouches for %s",
		e.Addr, e.Presented, strings.Join(e.Vouched, ", "))
}

// Unwrap makes errors.Is(err, providers.ErrHostKeyMismatch) true.
func (e *MismatchError) Unwrap() error { return providers.ErrHostKeyMismatch }

// HostKeyCallback accepts exactly the given keys and refuses every other
// with a *MismatchError. With no keys it refuses everything.
func HostKeyCallback(vouched []ssh.PublicKey) ssh.HostKeyCallback {
	return func(hostname string, remote net.Addr, key ssh.PublicKey) error {
		for _, k := range vouched {
			if bytes.Equal(k.Marshal(), key.Marshal()) {
				return nil
			}
		}
		e := &MismatchError{Addr: hostname, Presented: ssh.FingerprintSHA256(key)}
		for _, k := range vouched {
			e.Vouched = append(e.Vouched, ssh.FingerprintSHA256(k))
		}
		return e
	}
}

// HostKeyAlgorithms lists the signature algorithms for the vouched keys, so
// that the server presents a key of a vouched type (a server with ed25519
// and ecdsa keys would otherwise show whichever it prefers).
func HostKeyAlgorithms(vouched []ssh.PublicKey) []string {
	var algs []string
	seen := map[string]bool{}
	add := func(a ...string) {
		for _, s := range a {
			if !seen[s] {
				seen[s] = true
				algs = append(algs, s)
			}
		}
	}
	for _, k := range vouched {
		switch k.Type() {
		case ssh.KeyAlgoRSA:
			add(ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA)
		default:
			add(k.Type())
		}
	}
	return algs
}

var errNoHostKeys = errors.New("provider has not published host keys yet")

// connect opens an SSH client to the target, retrying while the machine
// boots. It stops at once on a host key mismatch.
func connect(ctx context.Context, target Target, opts Options, tr *Transcript) (*ssh.Client, ssh.PublicKey, error) {
	ctx, cancel := context.WithTimeout(ctx, opts.ConnectTimeout)
	defer cancel()
	step := Step{Name: "connect", Command: "ssh " + target.User + "@" + target.Addr}
	start := time.Now()
	defer func() {
		step.Duration = time.Since(start)
		tr.add(step)
	}()
	var (
		lastErr error
		wait    time.Duration
	)
	for {
		step.Attempts++
		client, key, err := dialOnce(ctx, target, opts)
		if err == nil {
			return client, key, nil
		}
		if errors.Is(err, providers.ErrHostKeyMismatch) {
			step.ExitCode, step.Error = -1, err.Error()
			return nil, nil, err
		}
		if providers.IsNotFound(err) {
			step.ExitCode, step.Error = -1, err.Error()
			return nil, nil, fmt.Errorf("read host keys: %w", err)
		}
		lastErr = err
		wait = opts.Backoff.next(wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			step.ExitCode = -1
			step.Error = lastErr.Error()
			return nil, nil, fmt.Errorf("%w after %d attempts: %w", ErrUnreachable, step.Attempts, lastErr)
		case <-t.C:
		}
	}
}

// dialOnce asks for the vouched keys and makes one connection attempt.
func dialOnce(ctx context.Context, target Target, opts Options) (*ssh.Client, ssh.PublicKey, error) {
	keys, err := target.HostKeys(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("read host keys: %w", err)
	}
	if len(keys) == 0 {
		return nil, nil, errNoHostKeys
	}
	var presented ssh.PublicKey
	check := HostKeyCallback(keys)
	cfg := &ssh.ClientConfig{
		User: target.User,
		Auth: []ssh.AuthMethod{ssh.PublicKeys(target.Signer)},
		HostKeyCallback: func(hostname string, remote net.Addr, key ssh.PublicKey) error {
			presented = key
			return check(target.Addr, remote, key)
		},
		HostKeyAlgorithms: HostKeyAlgorithms(keys),
		Timeout:           opts.DialTimeout,
	}
	dctx, cancel := context.WithTimeout(ctx, opts.DialTimeout)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(dctx, "tcp", target.Addr)
	if err != nil {
		return nil, nil, err
	}
	// The handshake has no context; a deadline bounds it instead.
	_ = conn.SetDeadline(time.Now().Add(opts.DialTimeout))
	c, chans, reqs, err := ssh.NewClientConn(conn, target.Addr, cfg)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return ssh.NewClient(c, chans, reqs), presented, nil
}
