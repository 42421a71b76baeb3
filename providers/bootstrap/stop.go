package bootstrap

import (
	"context"
	"fmt"
	"time"
)

// StopOptions says where the agent was installed and how long to try.
type StopOptions struct {
	// RemoteDir is Options.RemoteDir of the bootstrap. Default
	// /opt/spillway.
	RemoteDir string
	// ConnectTimeout bounds the connect phase. Default 1m.
	ConnectTimeout time.Duration
	// DialTimeout bounds one connect attempt. Default 10s.
	DialTimeout time.Duration
	// Backoff paces connect attempts. Default 250ms doubling to 10s.
	Backoff Backoff
}

// Stop ends the agent on a machine that stays up (a leased host going back
// to its pool): it disables the systemd unit or kills the supervised loop
// and its agent. The binary stays, so the next bootstrap can skip the
// upload. It verifies the host key exactly as Run does.
func Stop(ctx context.Context, target Target, so StopOptions) (*Transcript, error) {
	tr := &Transcript{Addr: target.Addr, User: target.User, StartedAt: time.Now().UTC()}
	err := stop(ctx, target, so, tr)
	tr.Phases.Total = time.Since(tr.StartedAt)
	if err != nil {
		tr.Error = err.Error()
	}
	return tr, err
}

func stop(ctx context.Context, target Target, so StopOptions, tr *Transcript) error {
	if so.RemoteDir == "" {
		so.RemoteDir = DefaultRemoteDir
	}
	if so.ConnectTimeout <= 0 {
		so.ConnectTimeout = time.Minute
	}
	opts := Options{ConnectTimeout: so.ConnectTimeout, DialTimeout: so.DialTimeout, Backoff: so.Backoff}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 10 * time.Second
	}
	if opts.Backoff.Initial <= 0 {
		opts.Backoff.Initial = 250 * time.Millisecond
	}
	if opts.Backoff.Max < opts.Backoff.Initial {
		opts.Backoff.Max = max(10*time.Second, opts.Backoff.Initial)
	}
	lay := newLayout(so.RemoteDir)
	t0 := time.Now()
	client, _, err := connect(ctx, target, opts, tr)
	tr.Phases.Connect = time.Since(t0)
	if err != nil {
		return fmt.Errorf("stop agent: %w", err)
	}
	defer client.Close()
	r := &remote{client: client, tr: tr, timeout: time.Minute}
	p, err := r.probe(ctx, lay)
	if err != nil {
		return fmt.Errorf("stop agent: %w", err)
	}
	t0 = time.Now()
	script := `unit=/etc/systemd/system/` + UnitName + `
if [ -f "$unit" ]; then
  systemctl disable --now ` + UnitName + ` >/dev/null 2>&1 || true
  rm -f "$unit"
  systemctl daemon-reload || true
fi
` + stopSupervisedScript(lay)
	_, err = r.exec(ctx, "stop agent", script, nil, p.sudo)
	tr.Phases.Start = time.Since(t0)
	if err != nil {
		return fmt.Errorf("stop agent: %w", err)
	}
	return nil
}
