package fakecloud

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
)

// LocalSSH is a MachineServer that needs nothing installed: an SSH server
// in this process (golang.org/x/crypto/ssh) that runs each exec request as
// `/bin/sh -c COMMAND` on this host, as this process's user, with stdin,
// stdout, stderr and the exit status carried over the channel. It accepts
// only the machine's authorized keys and presents its host key, so the
// broker's bootstrap checks the key the fake cloud publishes exactly as it
// would on a real machine.
//
// Every process a session starts carries SPILLWAY_LOCAL_MACHINE=ip:port in
// its environment; stop ends the server and then those processes (the
// agent the bootstrap started in a session of its own included): SIGTERM,
// and SIGKILL five seconds later for any left.
func LocalSSH(ip string, port int, ci CloudInit) (func(), error) {
	signer, err := ssh.ParsePrivateKey(ci.HostKeyPEM)
	if err != nil {
		return nil, fmt.Errorf("local machine: parse host key: %w", err)
	}
	allowed := map[string]bool{}
	for _, line := range ci.AuthorizedKeys {
		pub, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
		if err == nil {
			allowed[string(pub.Marshal())] = true
		}
	}
	cfg := &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if allowed[string(key.Marshal())] {
				return nil, nil
			}
			return nil, errors.New("key not authorized")
		},
	}
	cfg.AddHostKey(signer)
	addr := net.JoinHostPort(ip, strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("local machine: %w", err)
	}
	s := &localSSH{ln: ln, cfg: cfg, tag: "SPILLWAY_LOCAL_MACHINE=" + addr, conns: map[net.Conn]bool{}}
	go s.accept()
	var once sync.Once
	return func() { once.Do(s.stop) }, nil
}

type localSSH struct {
	ln  net.Listener
	cfg *ssh.ServerConfig
	tag string

	mu    sync.Mutex
	conns map[net.Conn]bool
}

func (s *localSSH) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = true
		s.mu.Unlock()
		go s.serve(c)
	}
}

func (s *localSSH) serve(c net.Conn) {
	defer func() {
		c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	_, chans, reqs, err := ssh.NewServerConn(c, s.cfg)
	if err != nil {
		return
	}
	_ = c.SetDeadline(time.Time{})
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "only sessions")
			continue
		}
		ch, creqs, err := nc.Accept()
		if err != nil {
			continue
		}
		go s.session(ch, creqs)
	}
}

// session serves one session channel: env requests are accepted and
// ignored, the first exec runs and ends the channel.
func (s *localSSH) session(ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer ch.Close()
	for req := range reqs {
		switch req.Type {
		case "exec":
			var p struct{ Command string }
			if err := ssh.Unmarshal(req.Payload, &p); err != nil {
				_ = req.Reply(false, nil)
				return
			}
			_ = req.Reply(true, nil)
			code := s.run(ch, p.Command)
			_, _ = ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(code)}))
			return
		case "env":
			_ = req.Reply(true, nil)
		default:
			_ = req.Reply(false, nil)
		}
	}
}

func (s *localSSH) run(ch ssh.Channel, command string) int {
	cmd := exec.Command("/bin/sh", "-c", command)
	cmd.Env = append(os.Environ(), s.tag)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = ch, ch, ch.Stderr()
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit) && exit.ExitCode() >= 0:
		return exit.ExitCode()
	default:
		fmt.Fprintf(ch.Stderr(), "local machine: %v\n", err)
		return 255
	}
}

func (s *localSSH) stop() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	pids := s.processes()
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	if len(pids) > 0 {
		time.AfterFunc(5*time.Second, func() {
			for _, pid := range s.processes() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		})
	}
}

// processes lists the processes whose environment carries the machine's
// tag.
func (s *localSSH) processes() []int {
	paths, _ := filepath.Glob("/proc/[0-9]*/environ")
	var pids []int
	for _, p := range paths {
		env, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(env, []byte{0}) {
			if string(kv) == s.tag {
				if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil && pid != os.Getpid() {
					pids = append(pids, pid)
				}
				break
			}
		}
	}
	return pids
}
