// Package fakecloud is local stand-ins for the clouds Spillway rents from:
// httptest servers that speak each wire protocol for the calls the
// providers make (EC2's Query API, GCE's REST JSON with zone operations,
// Lambda Cloud's API v1), and machines behind them that are real OpenSSH
// sshd processes on 127.0.0.x, each with its own host keys, published the
// way the real cloud publishes them.
//
// It is test support for providers/... and for the broker's end-to-end
// tests, and the local cloud of `spillway dev --burst` (StartEC2 with
// LocalSSH machines); the broker itself never imports it.
package fakecloud

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
)

// SSHDPath is where Debian's openssh-server installs the daemon.
const SSHDPath = "/usr/sbin/sshd"

// SSHOptions configures one sshd.
type SSHOptions struct {
	// IP is the loopback address to listen on; empty picks the next one
	// from 127.0.0.2-127.0.0.254.
	IP string
	// Port is the port to listen on; 0 picks a free one.
	Port int
	// AuthorizedKeys may log in as root (authorized_keys lines).
	AuthorizedKeys []string
	// HostKeyPEM is the private host key (OpenSSH or PKCS#8 PEM); empty
	// generates a fresh ed25519 key.
	HostKeyPEM []byte
}

// SSHHost is one running sshd.
type SSHHost struct {
	// Addr is "ip:port".
	Addr string
	IP   string
	Port int
	// HostKey is the public host key sshd presents.
	HostKey ssh.PublicKey
	// Dir holds the sshd's config, keys and pid file.
	Dir string

	cmd  *exec.Cmd
	log  *syncBuffer
	once sync.Once
	done chan struct{}
}

var nextIP atomic.Uint32

func init() { nextIP.Store(uint32(2 + os.Getpid()%200)) }

// NextLoopbackIP returns a 127.0.0.x address not handed out before by this
// process (until the 253 addresses wrap around).
func NextLoopbackIP() string {
	n := nextIP.Add(1)
	return fmt.Sprintf("127.0.0.%d", 2+n%253)
}

// FreePort returns a TCP port that was free on ip a moment ago.
func FreePort(ip string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return 0, fmt.Errorf("find free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// GenerateHostKey returns a fresh ed25519 key as OpenSSH PEM and its
// public half.
func GenerateHostKey() (pemBytes []byte, pub ssh.PublicKey, err error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	block, err := ssh.MarshalPrivateKey(priv, "fakecloud host key")
	if err != nil {
		return nil, nil, err
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(block), signer.PublicKey(), nil
}

// StartSSHD starts Debian's sshd (SSHDPath) with its config, keys and
// pid file in dir. Stop ends it.
func StartSSHD(dir string, opts SSHOptions) (*SSHHost, error) {
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		return nil, fmt.Errorf("create privilege separation dir: %w", err)
	}
	keyPEM := opts.HostKeyPEM
	if len(keyPEM) == 0 {
		var err error
		if keyPEM, _, err = GenerateHostKey(); err != nil {
			return nil, fmt.Errorf("generate host key: %w", err)
		}
	}
	signer, err := ssh.ParsePrivateKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("parse host key: %w", err)
	}
	ip := opts.IP
	if ip == "" {
		ip = NextLoopbackIP()
	}
	port := opts.Port
	if port == 0 {
		if port, err = FreePort(ip); err != nil {
			return nil, err
		}
	}
	keyPath := filepath.Join(dir, "ssh_host_key")
	if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
		return nil, err
	}
	authPath := filepath.Join(dir, "authorized_keys")
	if err := os.WriteFile(authPath, []byte(strings.Join(opts.AuthorizedKeys, "\n")+"\n"), 0o600); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf(`ListenAddress %s:%d
HostKey %s
AuthorizedKeysFile %s
PidFile %s
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
UseDNS no
MaxStartups 64
LogLevel VERBOSE
`, ip, port, keyPath, authPath, filepath.Join(dir, "sshd.pid"))
	confPath := filepath.Join(dir, "sshd_config")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	h := &SSHHost{
		Addr: net.JoinHostPort(ip, strconv.Itoa(port)), IP: ip, Port: port,
		HostKey: signer.PublicKey(), Dir: dir,
		log: &syncBuffer{}, done: make(chan struct{}),
	}
	h.cmd = exec.Command(SSHDPath, "-D", "-e", "-f", confPath)
	h.cmd.Stdout, h.cmd.Stderr = h.log, h.log
	// Its own process group, so Stop ends the per-connection children
	// too; and a bound on waiting for the log pipe, which an open
	// connection's child holds.
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	h.cmd.WaitDelay = 2 * time.Second
	if err := h.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start sshd: %w", err)
	}
	go func() { _ = h.cmd.Wait(); close(h.done) }()
	if err := h.waitReady(10 * time.Second); err != nil {
		h.Stop()
		return nil, fmt.Errorf("start sshd on %s: %w\n%s", h.Addr, err, h.Log())
	}
	return h, nil
}

// waitReady waits until sshd sends its version banner.
func (h *SSHHost) waitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		select {
		case <-h.done:
			return errors.New("sshd exited")
		default:
		}
		c, err := net.DialTimeout("tcp", h.Addr, time.Second)
		if err == nil {
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 8)
			_, rerr := c.Read(buf)
			c.Close()
			if rerr == nil && bytes.HasPrefix(buf, []byte("SSH-")) {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("no SSH banner within " + limit.String())
}

// Stop ends the sshd and the connections it serves. Processes a session
// started in a session of their own (a setsid'd agent) live on.
func (h *SSHHost) Stop() {
	h.once.Do(func() {
		if h.cmd.Process != nil {
			_ = syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL)
		}
		<-h.done
	})
}

// Log returns what sshd wrote to stderr so far.
func (h *SSHHost) Log() string { return h.log.String() }

// AuthorizedKey is the host key in authorized_keys form, without newline.
func (h *SSHHost) AuthorizedKey() string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(h.HostKey)))
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written.
func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
