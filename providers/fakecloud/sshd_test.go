package fakecloud_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/spillway-dev/spillway/providers/fakecloud"
	"github.com/spillway-dev/spillway/providers/fakecloud/fakecloudtest"
)

func TestSSHDRunsACommandForTheAuthorizedKey(t *testing.T) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	client, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	h := fakecloudtest.StartSSHD(t, fakecloud.SSHOptions{AuthorizedKeys: []string{string(ssh.MarshalAuthorizedKey(client.PublicKey()))}})
	if !strings.HasPrefix(h.IP, "127.0.0.") {
		t.Fatalf("sshd listens on %s, want a 127.0.0.x address", h.IP)
	}
	c, err := ssh.Dial("tcp", h.Addr, &ssh.ClientConfig{
		User:            "root",
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(client)},
		HostKeyCallback: ssh.FixedHostKey(h.HostKey),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	out, err := s.Output("echo hello-$((40+2))")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != "hello-42" {
		t.Fatalf("command printed %q, want hello-42", got)
	}
}
