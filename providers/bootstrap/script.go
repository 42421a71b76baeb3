package bootstrap

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"time"

	"golang.org/x/crypto/ssh"
)

// ScriptStep is one shell script run on the machine, with optional stdin
// (a key or a config file streamed in, never put on a command line).
type ScriptStep struct {
	Name   string
	Script string
	Stdin  []byte
}

// ScriptOptions bounds RunScripts.
type ScriptOptions struct {
	// ConnectTimeout bounds the connect phase (boot included). Default 5m.
	ConnectTimeout time.Duration
	// DialTimeout bounds one TCP connect plus SSH handshake. Default 10s.
	DialTimeout time.Duration
	// CommandTimeout bounds one step. Default 5m.
	CommandTimeout time.Duration
	// Backoff paces connect attempts. Default 250ms doubling to 10s.
	Backoff Backoff
}

// RunScripts connects to the machine exactly as Run does — the host key
// must be one the provider vouches for, or nothing runs — and runs the
// steps in order with sh (through sudo -n when the login is not root),
// stopping at the first that fails. It is how other daemons than the
// agent (slurmd, for a Slurm site) are brought up on a burst machine. The
// transcript is never nil.
func RunScripts(ctx context.Context, target Target, steps []ScriptStep, so ScriptOptions) (*Transcript, error) {
	tr := &Transcript{Addr: target.Addr, User: target.User, StartedAt: time.Now().UTC()}
	err := runScripts(ctx, target, steps, so, tr)
	tr.Phases.Total = time.Since(tr.StartedAt)
	if err != nil {
		tr.Error = err.Error()
	}
	return tr, err
}

func runScripts(ctx context.Context, target Target, steps []ScriptStep, so ScriptOptions, tr *Transcript) error {
	opts := Options{ConnectTimeout: so.ConnectTimeout, DialTimeout: so.DialTimeout, CommandTimeout: so.CommandTimeout, Backoff: so.Backoff}
	opts.connectDefaults()
	t0 := time.Now()
	client, hostKey, err := connect(ctx, target, opts, tr)
	tr.Phases.Connect = time.Since(t0)
	if err != nil {
		return fmt.Errorf("run scripts: %w", err)
	}
	defer client.Close()
	tr.HostKey = ssh.FingerprintSHA256(hostKey)
	r := &remote{client: client, tr: tr, timeout: opts.CommandTimeout}
	sudo := target.User != "" && target.User != "root"
	t0 = time.Now()
	defer func() { tr.Phases.Start = time.Since(t0) }()
	for _, st := range steps {
		var stdin io.Reader
		if st.Stdin != nil {
			stdin = bytes.NewReader(st.Stdin)
		}
		if _, err := r.exec(ctx, st.Name, st.Script, stdin, sudo); err != nil {
			return err
		}
	}
	return nil
}

// ShellQuote quotes s for sh as one word.
func ShellQuote(s string) string { return shellQuote(s) }
