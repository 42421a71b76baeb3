package bootstrap

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
)

// remote runs commands on one connected machine and records them.
type remote struct {
	client  *ssh.Client
	tr      *Transcript
	timeout time.Duration
}

// exec runs script with sh on the machine, feeding stdin, and records a
// Step. A non-zero exit is an error wrapping ErrStepFailed.
func (r *remote) exec(ctx context.Context, name, script string, stdin io.Reader, sudo bool) (string, error) {
	cmd := "sh -c " + shellQuote(script)
	if sudo {
		cmd = "sudo -n " + cmd
	}
	step := Step{Name: name, Command: cmd}
	start := time.Now()
	stdout, stderr, code, err := r.runCmd(ctx, cmd, stdin)
	step.Duration = time.Since(start)
	step.ExitCode = code
	step.StderrTail = tail(stderr, StderrTailBytes)
	if err == nil && code != 0 {
		err = fmt.Errorf("%w: %s exited %d: %s", ErrStepFailed, name, code, strings.TrimSpace(tail(stderr, 256)))
	}
	if err != nil {
		step.Error = err.Error()
	}
	if name == "probe" {
		step.Stdout = tail(stdout, StderrTailBytes)
	}
	r.tr.add(step)
	return string(stdout), err
}

// runCmd runs one command in a new session. code is -1 when the command did
// not report an exit status.
func (r *remote) runCmd(ctx context.Context, cmd string, stdin io.Reader) (stdout, stderr []byte, code int, err error) {
	s, err := r.client.NewSession()
	if err != nil {
		return nil, nil, -1, fmt.Errorf("%w: open session: %w", ErrStepFailed, err)
	}
	defer s.Close()
	var out, errb limitedBuffer
	out.limit, errb.limit = 1<<20, 1<<20
	s.Stdout, s.Stderr = &out, &errb
	if stdin != nil {
		s.Stdin = stdin
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Run(cmd) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		// Closing the session makes Run return; the command may go on
		// running on the machine, which the caller then deletes or retries.
		s.Close()
		<-done
		return out.Bytes(), errb.Bytes(), -1, fmt.Errorf("%w: %w", ErrStepFailed, ctx.Err())
	}
	var exitErr *ssh.ExitError
	switch {
	case err == nil:
		return out.Bytes(), errb.Bytes(), 0, nil
	case errors.As(err, &exitErr):
		return out.Bytes(), errb.Bytes(), exitErr.ExitStatus(), nil
	default:
		return out.Bytes(), errb.Bytes(), -1, fmt.Errorf("%w: %w", ErrStepFailed, err)
	}
}

type probeResult struct {
	platform  string
	sudo      bool
	init      string
	binSHA256 string
}

// probe learns the platform, whether sudo is needed, whether systemd runs,
// and the checksum of an already installed binary, in one round trip.
func (r *remote) probe(ctx context.Context, lay layout) (probeResult, error) {
	script := `uname -sm
id -u
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then echo ` + InitSystemd + `; else echo ` + InitSupervised + `; fi
if [ -f ` + shellQuote(lay.bin) + ` ]; then sha256sum ` + shellQuote(lay.bin) + ` | cut -d' ' -f1; else echo none; fi`
	out, err := r.exec(ctx, "probe", script, nil, false)
	if err != nil {
		return probeResult{}, err
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 4 {
		return probeResult{}, fmt.Errorf("%w: probe printed %d lines, want 4", ErrStepFailed, len(lines))
	}
	return probeResult{
		platform:  platformOf(lines[0]),
		sudo:      strings.TrimSpace(lines[1]) != "0",
		init:      strings.TrimSpace(lines[2]),
		binSHA256: strings.TrimSpace(lines[3]),
	}, nil
}

// uploadFile streams a local file to dst through `cat`, verifies its
// SHA-256 on the machine, and moves it into place atomically.
func (r *remote) uploadFile(ctx context.Context, name, local, dst, sum, mode string, sudo bool) error {
	f, err := os.Open(local)
	if err != nil {
		return fmt.Errorf("open %s: %w", local, err)
	}
	defer f.Close()
	_, err = r.exec(ctx, name, uploadScript(dst, sum, mode), f, sudo)
	return err
}

// uploadBytes is uploadFile for content held in memory.
func (r *remote) uploadBytes(ctx context.Context, name string, content []byte, dst, mode string, sudo bool) error {
	h := sha256.Sum256(content)
	_, err := r.exec(ctx, name, uploadScript(dst, hex.EncodeToString(h[:]), mode), bytes.NewReader(content), sudo)
	return err
}

func uploadScript(dst, sum, mode string) string {
	tmp := shellQuote(dst + ".tmp")
	return `set -e
umask 077
mkdir -p ` + shellQuote(path.Dir(dst)) + `
cat > ` + tmp + `
sum=$(sha256sum ` + tmp + ` | cut -d' ' -f1)
if [ "$sum" != ` + shellQuote(sum) + ` ]; then rm -f ` + tmp + `; echo "checksum mismatch: got $sum" >&2; exit 3; fi
chmod ` + mode + ` ` + tmp + `
mv -f ` + tmp + ` ` + shellQuote(dst)
}

// unit renders the systemd unit for the agent.
func unit(lay layout, agent AgentConfig) string {
	return `[Unit]
Description=Spillway agent (` + agent.Name + `)
After=network-online.target
Wants=network-online.target

[Service]
ExecStart=` + lay.bin + ` agent --config ` + lay.config + `
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
`
}

func (r *remote) startSystemd(ctx context.Context, lay layout, agent AgentConfig, sudo bool) error {
	script := `set -e
cat > /etc/systemd/system/` + UnitName + `
systemctl daemon-reload
systemctl enable ` + UnitName + ` >/dev/null 2>&1
systemctl restart ` + UnitName
	_, err := r.exec(ctx, "start agent (systemd)", script, strings.NewReader(unit(lay, agent)), sudo)
	return err
}

// supervisorScript starts a restart loop in its own session (so its pid is
// its process group), writes the pid file, and returns once it exists. An
// earlier loop found through the pid file is stopped first.
func supervisorScript(lay layout) string {
	loop := `echo $$ > ` + shellQuote(lay.pid) + `
while :; do ` + shellQuote(lay.bin) + ` agent --config ` + shellQuote(lay.config) + ` >> ` + shellQuote(lay.log) + ` 2>&1; sleep 2; done`
	return `set -e
` + stopSupervisedScript(lay) + `
S=
if command -v setsid >/dev/null 2>&1; then S=setsid; fi
nohup $S sh -c ` + shellQuote(loop) + ` </dev/null >/dev/null 2>&1 &
i=0
while [ ! -s ` + shellQuote(lay.pid) + ` ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
test -s ` + shellQuote(lay.pid)
}

func stopSupervisedScript(lay layout) string {
	pid := shellQuote(lay.pid)
	return `if [ -s ` + pid + ` ]; then p=$(cat ` + pid + `); kill -TERM "-$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null || true; rm -f ` + pid + `; fi`
}

func (r *remote) startSupervised(ctx context.Context, lay layout, sudo bool) error {
	_, err := r.exec(ctx, "start agent (supervised)", supervisorScript(lay), nil, sudo)
	return err
}

// agentLogTail records the agent's last log lines after a failed
// registration, for the transcript. Its own failure is recorded, not
// returned.
func (r *remote) agentLogTail(ctx context.Context, lay layout, p probeResult) {
	script := "tail -n 50 " + shellQuote(lay.log) + " >&2"
	if p.init == InitSystemd {
		script = "journalctl -u " + UnitName + " -n 50 --no-pager >&2"
	}
	_, _ = r.exec(ctx, "agent log", script, nil, p.sudo)
}

// shellQuote quotes s for sh as one word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// limitedBuffer keeps at most limit bytes, the last ones.
type limitedBuffer struct {
	mu    sync.Mutex
	buf   []byte
	limit int
}

// Write keeps p, dropping the oldest bytes past the limit.
func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.limit {
		b.buf = b.buf[len(b.buf)-b.limit:]
	}
	return len(p), nil
}

// Bytes returns a copy of what is kept.
func (b *limitedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]byte(nil), b.buf...)
}

// sumCache remembers binary checksums by path, size and modification time:
// the broker uploads the same binary to many machines.
var sumCache sync.Map

type sumKey struct {
	path  string
	size  int64
	mtime time.Time
}

func fileSHA256(p string) (string, error) {
	st, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("stat %s: %w", p, err)
	}
	k := sumKey{p, st.Size(), st.ModTime()}
	if v, ok := sumCache.Load(k); ok {
		return v.(string), nil
	}
	f, err := os.Open(p)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", p, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", p, err)
	}
	s := hex.EncodeToString(h.Sum(nil))
	sumCache.Store(k, s)
	return s, nil
}
