// Package bootstrap turns a fresh machine into a Spillway node over SSH,
// the same way for every provider:
//
//  1. connect, retrying with exponential backoff while the machine boots,
//     and accept only a host key the provider vouches for (console output,
//     guest attributes, pinned config). A key it does not vouch for stops
//     everything: no command runs, and the error wraps
//     providers.ErrHostKeyMismatch so the broker records why and deletes
//     the machine;
//  2. probe the machine (OS and architecture, root or sudo, systemd);
//  3. upload the spillway binary (the running one when OS and architecture
//     match, else the one configured for the remote platform) and the
//     agent's config with its per-machine token, each checked by SHA-256
//     on the far side;
//  4. start `spillway agent --config …` as a systemd unit, or where there
//     is no systemd as a supervised background loop that restarts it;
//  5. wait until the agent has registered with the broker.
//
// Every step is kept in a Transcript (command, exit code, duration, stderr
// tail) that the broker stores on the machine's record.
package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"runtime"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// Errors a bootstrap can end with, besides providers.ErrHostKeyMismatch.
var (
	// ErrUnreachable: no SSH session could be opened before the connect
	// timeout (the machine never answered, or never accepted the key).
	ErrUnreachable = errors.New("machine unreachable over ssh")
	// ErrNoBinary: no spillway binary is configured for the machine's
	// OS and architecture.
	ErrNoBinary = errors.New("no spillway binary for the remote platform")
	// ErrStepFailed: a command on the machine failed.
	ErrStepFailed = errors.New("bootstrap step failed")
	// ErrNotRegistered: the agent started but did not register in time.
	ErrNotRegistered = errors.New("agent did not register")
)

// Target is the machine to bootstrap and how to trust it.
type Target struct {
	// Addr is "host:port".
	Addr string
	// User is the SSH login; commands run through `sudo -n` when it is not
	// root.
	User string
	// Signer is the broker's SSH client key.
	Signer ssh.Signer
	// HostKeys returns the host keys the provider vouches for, usually
	// Provider.HostKeys for the machine. It is asked again on every
	// connect attempt until it returns at least one key.
	HostKeys func(ctx context.Context) ([]ssh.PublicKey, error)
}

// Backoff is an exponential backoff: Initial, doubling, at most Max.
type Backoff struct {
	Initial time.Duration
	Max     time.Duration
}

func (b Backoff) next(d time.Duration) time.Duration {
	if d <= 0 {
		return b.Initial
	}
	return min(2*d, b.Max)
}

// Options says what to install and how long to try.
type Options struct {
	// Agent is the config written to the machine. Required.
	Agent AgentConfig
	// RemoteDir holds bin/spillway, agent.yaml, agent.log and agent.pid on
	// the machine. Default /opt/spillway.
	RemoteDir string
	// Executable is uploaded when the machine's OS and architecture are
	// this process's. Default: the running executable.
	Executable string
	// Binaries maps "os/arch" ("linux/arm64") to a local spillway binary
	// for machines of another platform.
	Binaries map[string]string
	// WaitRegistered returns nil once the broker has seen the agent
	// register. Required.
	WaitRegistered func(ctx context.Context) error
	// ConnectTimeout bounds the connect phase (boot included). Default 5m.
	ConnectTimeout time.Duration
	// DialTimeout bounds one TCP connect plus SSH handshake. Default 10s.
	DialTimeout time.Duration
	// CommandTimeout bounds one remote command (uploads included).
	// Default 5m.
	CommandTimeout time.Duration
	// RegisterTimeout bounds the wait for registration. Default 2m.
	RegisterTimeout time.Duration
	// Backoff paces connect attempts. Default 250ms doubling to 10s.
	Backoff Backoff
	// Logger receives one line per step; slog.Default when nil.
	Logger *slog.Logger
	// Init, when InitSupervised, starts the agent as a supervised loop even
	// where the probe finds systemd: for a machine shared with other work,
	// such as the broker's own host under `spillway dev --burst`. Default:
	// what the probe finds.
	Init string
	// NoSudo runs every command as the login user even when it is not
	// root, for a remote dir the user owns.
	NoSudo bool
}

// DefaultRemoteDir is where the agent is installed on a machine.
const DefaultRemoteDir = "/opt/spillway"

// UnitName is the systemd unit the agent runs as.
const UnitName = "spillway-agent.service"

func (o *Options) defaults() error {
	if o.RemoteDir == "" {
		o.RemoteDir = DefaultRemoteDir
	}
	if !path.IsAbs(o.RemoteDir) {
		return fmt.Errorf("remote dir %q: want an absolute path", o.RemoteDir)
	}
	if o.WaitRegistered == nil {
		return errors.New("options: WaitRegistered is required")
	}
	if err := o.Agent.Validate(); err != nil {
		return err
	}
	o.connectDefaults()
	if o.RegisterTimeout <= 0 {
		o.RegisterTimeout = 2 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// layout is where things live on the machine.
type layout struct {
	dir, bin, config, log, pid string
}

func newLayout(dir string) layout {
	return layout{
		dir:    dir,
		bin:    path.Join(dir, "bin", "spillway"),
		config: path.Join(dir, "agent.yaml"),
		log:    path.Join(dir, "agent.log"),
		pid:    path.Join(dir, "agent.pid"),
	}
}

// Run bootstraps the machine and returns the transcript, which is never
// nil, also when Run fails: the broker stores it either way.
func Run(ctx context.Context, target Target, opts Options) (*Transcript, error) {
	tr := &Transcript{Addr: target.Addr, User: target.User, StartedAt: time.Now().UTC()}
	err := run(ctx, target, opts, tr)
	tr.Phases.Total = time.Since(tr.StartedAt)
	if err != nil {
		tr.Error = err.Error()
	}
	return tr, err
}

func run(ctx context.Context, target Target, opts Options, tr *Transcript) error {
	if err := opts.defaults(); err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	log := opts.Logger.With("addr", target.Addr)
	lay := newLayout(opts.RemoteDir)

	t0 := time.Now()
	client, hostKey, err := connect(ctx, target, opts, tr)
	tr.Phases.Connect = time.Since(t0)
	if err != nil {
		log.Warn("bootstrap connect failed", "err", err)
		return fmt.Errorf("bootstrap: %w", err)
	}
	defer client.Close()
	tr.HostKey = ssh.FingerprintSHA256(hostKey)
	log.Info("bootstrap connected", "hostKey", tr.HostKey, "took", tr.Phases.Connect)
	r := &remote{client: client, tr: tr, timeout: opts.CommandTimeout}

	// Upload phase: probe, binary, config.
	t0 = time.Now()
	probe, err := r.probe(ctx, lay)
	if err != nil {
		tr.Phases.Upload = time.Since(t0)
		return fmt.Errorf("bootstrap: %w", err)
	}
	if opts.Init == InitSupervised {
		probe.init = InitSupervised
	}
	if opts.NoSudo {
		probe.sudo = false
	}
	tr.Platform, tr.Init = probe.platform, probe.init
	bin, err := pickBinary(probe.platform, opts)
	if err != nil {
		tr.Phases.Upload = time.Since(t0)
		return fmt.Errorf("bootstrap: %w", err)
	}
	sum, err := fileSHA256(bin)
	if err != nil {
		tr.Phases.Upload = time.Since(t0)
		return fmt.Errorf("bootstrap: %w", err)
	}
	tr.Binary, tr.BinarySHA256 = bin, sum
	if probe.binSHA256 == sum {
		tr.add(Step{Name: "upload binary", Command: "(skipped: " + lay.bin + " already has sha256 " + sum + ")", Skipped: true})
	} else if err := r.uploadFile(ctx, "upload binary", bin, lay.bin, sum, "0755", probe.sudo); err != nil {
		tr.Phases.Upload = time.Since(t0)
		return fmt.Errorf("bootstrap: %w", err)
	}
	cfg, err := opts.Agent.Marshal()
	if err != nil {
		tr.Phases.Upload = time.Since(t0)
		return fmt.Errorf("bootstrap: %w", err)
	}
	if err := r.uploadBytes(ctx, "upload config", cfg, lay.config, "0600", probe.sudo); err != nil {
		tr.Phases.Upload = time.Since(t0)
		return fmt.Errorf("bootstrap: %w", err)
	}
	tr.Phases.Upload = time.Since(t0)
	log.Info("bootstrap uploaded", "platform", probe.platform, "took", tr.Phases.Upload)

	// Start phase.
	t0 = time.Now()
	if probe.init == InitSystemd {
		err = r.startSystemd(ctx, lay, opts.Agent, probe.sudo)
	} else {
		err = r.startSupervised(ctx, lay, probe.sudo)
	}
	tr.Phases.Start = time.Since(t0)
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	log.Info("bootstrap started agent", "init", probe.init, "took", tr.Phases.Start)

	// Register phase.
	t0 = time.Now()
	rctx, cancel := context.WithTimeout(ctx, opts.RegisterTimeout)
	err = opts.WaitRegistered(rctx)
	cancel()
	tr.Phases.Register = time.Since(t0)
	step := Step{Name: "register", Command: "(wait for the agent to register with the broker)", Duration: tr.Phases.Register}
	if err != nil {
		step.ExitCode = -1
		step.Error = err.Error()
		tr.add(step)
		r.agentLogTail(ctx, lay, probe)
		return fmt.Errorf("bootstrap: %w: %w", ErrNotRegistered, err)
	}
	tr.add(step)
	log.Info("bootstrap agent registered", "took", tr.Phases.Register)
	return nil
}

// pickBinary returns the local binary to upload for platform ("linux/amd64").
func pickBinary(platform string, opts Options) (string, error) {
	if p, ok := opts.Binaries[platform]; ok && p != "" {
		return p, nil
	}
	if platform == runtime.GOOS+"/"+runtime.GOARCH {
		if opts.Executable != "" {
			return opts.Executable, nil
		}
		exe, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("find running executable: %w", err)
		}
		return exe, nil
	}
	return "", fmt.Errorf("%w: %s (set a binary for it)", ErrNoBinary, platform)
}

// platformOf maps `uname -sm` output to Go's os/arch.
func platformOf(uname string) string {
	f := strings.Fields(uname)
	if len(f) != 2 {
		return "unknown/" + strings.Join(f, "-")
	}
	goos := strings.ToLower(f[0])
	arch := map[string]string{
		"x86_64": "amd64", "amd64": "amd64",
		"aarch64": "arm64", "arm64": "arm64",
		"armv7l": "arm", "armv6l": "arm",
		"i686": "386", "i386": "386",
		"ppc64le": "ppc64le", "s390x": "s390x", "riscv64": "riscv64",
	}[f[1]]
	if arch == "" {
		arch = f[1]
	}
	return goos + "/" + arch
}

// connectDefaults fills the SSH timeouts and retry backoff left zero; the
// agent bootstrap and RunScripts share them.
func (o *Options) connectDefaults() {
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 5 * time.Minute
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	if o.CommandTimeout <= 0 {
		o.CommandTimeout = 5 * time.Minute
	}
	if o.Backoff.Initial <= 0 {
		o.Backoff.Initial = 250 * time.Millisecond
	}
	if o.Backoff.Max < o.Backoff.Initial {
		o.Backoff.Max = max(10*time.Second, o.Backoff.Initial)
	}
}
