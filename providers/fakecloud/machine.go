package fakecloud

import (
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/mail"
	"os"
	"strings"
	"sync"

	"golang.org/x/crypto/ssh"
	"sigs.k8s.io/yaml"
)

// CloudInit is what a fake machine reads from its user data, as cloud-init
// would: the keys that may log in and host keys to install.
type CloudInit struct {
	AuthorizedKeys []string
	// HostKeyPEM is ssh_keys.ed25519_private, if the user data sets it.
	HostKeyPEM []byte
}

type cloudConfigDoc struct {
	SSHAuthorizedKeys []string          `json:"ssh_authorized_keys"`
	SSHKeys           map[string]string `json:"ssh_keys"`
}

// ParseUserData reads a #cloud-config document or a MIME multipart archive
// of parts, merging the cloud-config parts. Parts of other types are
// ignored.
func ParseUserData(data string) (CloudInit, error) {
	var ci CloudInit
	if strings.HasPrefix(data, "#cloud-config") {
		return ci, ci.addCloudConfig(data)
	}
	if !strings.HasPrefix(data, "Content-Type: multipart/") {
		return ci, nil
	}
	msg, err := mail.ReadMessage(strings.NewReader(data))
	if err != nil {
		return ci, fmt.Errorf("read multipart user data: %w", err)
	}
	_, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil {
		return ci, fmt.Errorf("read multipart user data: %w", err)
	}
	mr := multipart.NewReader(msg.Body, params["boundary"])
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			return ci, nil
		}
		if err != nil {
			return ci, fmt.Errorf("read multipart user data: %w", err)
		}
		body, err := io.ReadAll(p)
		if err != nil {
			return ci, err
		}
		if strings.HasPrefix(p.Header.Get("Content-Type"), "text/cloud-config") {
			if err := ci.addCloudConfig(string(body)); err != nil {
				return ci, err
			}
		}
	}
}

func (ci *CloudInit) addCloudConfig(doc string) error {
	var cc cloudConfigDoc
	if err := yaml.Unmarshal([]byte(doc), &cc); err != nil {
		return fmt.Errorf("read cloud-config: %w", err)
	}
	ci.AuthorizedKeys = append(ci.AuthorizedKeys, cc.SSHAuthorizedKeys...)
	if k := cc.SSHKeys["ed25519_private"]; k != "" {
		ci.HostKeyPEM = []byte(k)
	}
	return nil
}

// machine is one fake instance's guest: an address, host keys, and when the
// cloud runs real machines, an sshd.
type machine struct {
	ip      string
	hostKey ssh.PublicKey
	sshd    *SSHHost
	// stopServer ends a MachineServer's machine; nil otherwise.
	stopServer func()
}

// MachineServer starts the guest of one fake machine in place of sshd: an
// SSH server on ip:port that lets ci.AuthorizedKeys log in and presents
// ci.HostKeyPEM. stop ends it and whatever it started.
type MachineServer func(ip string, port int, ci CloudInit) (stop func(), err error)

// fleet boots and stops the machines of one fake cloud.
type fleet struct {
	realSSHD bool
	server   MachineServer
	port     int
	dir      string

	mu      sync.Mutex
	live    []*SSHHost
	servers []func()
}

// newFleet makes the machines of one fake cloud: with server set, each
// runs it; else with realSSHD, each runs a real sshd, its files in a
// temporary directory that stopAll removes; else machines have addresses
// and host keys and nothing listens.
func newFleet(realSSHD bool, server MachineServer) (*fleet, error) {
	f := &fleet{realSSHD: realSSHD && server == nil, server: server}
	if f.realSSHD {
		if _, err := os.Stat(SSHDPath); err != nil {
			return nil, fmt.Errorf("fake cloud: sshd not found at %s: install openssh-server", SSHDPath)
		}
	}
	port, err := FreePort("127.0.0.1")
	if err != nil {
		return nil, err
	}
	f.port = port
	if f.realSSHD {
		if f.dir, err = os.MkdirTemp("", "fakecloud-"); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// boot starts a machine: an sshd on a fresh 127.0.0.x at the fleet's port
// that lets ci's keys log in, with ci's host key or a new one.
func (f *fleet) boot(ci CloudInit) (*machine, error) {
	hostPEM := ci.HostKeyPEM
	if len(hostPEM) == 0 {
		var err error
		if hostPEM, _, err = GenerateHostKey(); err != nil {
			return nil, err
		}
	}
	signer, err := ssh.ParsePrivateKey(hostPEM)
	if err != nil {
		return nil, fmt.Errorf("parse host key from user data: %w", err)
	}
	m := &machine{ip: NextLoopbackIP(), hostKey: signer.PublicKey()}
	if f.server != nil {
		ci.HostKeyPEM = hostPEM
		stop, err := f.server(m.ip, f.port, ci)
		if err != nil {
			return nil, err
		}
		m.stopServer = stop
		f.mu.Lock()
		f.servers = append(f.servers, stop)
		f.mu.Unlock()
		return m, nil
	}
	if !f.realSSHD {
		return m, nil
	}
	dir, err := os.MkdirTemp(f.dir, "machine-")
	if err != nil {
		return nil, err
	}
	h, err := StartSSHD(dir, SSHOptions{IP: m.ip, Port: f.port, AuthorizedKeys: ci.AuthorizedKeys, HostKeyPEM: hostPEM})
	if err != nil {
		return nil, err
	}
	m.sshd = h
	f.mu.Lock()
	f.live = append(f.live, h)
	f.mu.Unlock()
	return m, nil
}

func (f *fleet) stopAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, h := range f.live {
		h.Stop()
	}
	f.live = nil
	for _, stop := range f.servers {
		stop()
	}
	f.servers = nil
	if f.dir != "" {
		os.RemoveAll(f.dir)
	}
}

// stop ends a machine's sshd, if it has one.
func (m *machine) stop() {
	if m.sshd != nil {
		m.sshd.Stop()
	}
	if m.stopServer != nil {
		m.stopServer()
	}
}

// consoleOutput is what cloud-init prints on a machine's serial console on
// first boot (cc_keys_to_console), host keys included.
func (m *machine) consoleOutput(hostname string) string {
	key := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(m.hostKey)))
	return `[    0.000000] Linux version 6.8.0-1015-aws (buildd@lcy02-amd64-051)
[    4.180412] cloud-init[612]: Cloud-init v. 24.1.3 running 'init' at Mon, 01 Jan 2026 00:00:00 +0000.
<14>Jan  1 00:00:09 ec2: 
<14>Jan  1 00:00:09 ec2: #############################################################
<14>Jan  1 00:00:09 ec2: -----BEGIN SSH HOST KEY FINGERPRINTS-----
<14>Jan  1 00:00:09 ec2: 256 ` + ssh.FingerprintSHA256(m.hostKey) + ` root@` + hostname + ` (ED25519)
<14>Jan  1 00:00:09 ec2: -----END SSH HOST KEY FINGERPRINTS-----
<14>Jan  1 00:00:09 ec2: #############################################################
-----BEGIN SSH HOST KEY KEYS-----
` + key + ` root@` + hostname + `
-----END SSH HOST KEY KEYS-----
[   10.231145] cloud-init[900]: Cloud-init v. 24.1.3 finished at Mon, 01 Jan 2026 00:00:10 +0000.
`
}
