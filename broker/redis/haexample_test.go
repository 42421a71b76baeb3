package redis

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
)

// TestHAExampleRedisConf: the shipped deploy/ha/redis.conf starts a real
// Redis, and deploy/ha/spillway.yaml's store URL opens it once the operator
// puts one password where both files say REPLACE-ME; a wrong password is
// refused. (Only the address is this test's: the examples name
// redis.internal and bind 10.0.0.20.)
func TestHAExampleRedisConf(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server not on PATH (apt-get install -y redis-server)")
		}
		t.Skip("redis-server not on PATH (apt-get install -y redis-server)")
	}
	pw := rand.Text()
	dir := t.TempDir()
	fill := func(src string, more ...string) string {
		t.Helper()
		raw, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		s := string(raw)
		if !strings.Contains(s, config.Placeholder) {
			t.Fatalf("%s has no %s for the password", src, config.Placeholder)
		}
		s = strings.NewReplacer(append(more, config.Placeholder, pw)...).Replace(s)
		p := filepath.Join(dir, filepath.Base(src))
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	conf := fill("../../deploy/ha/redis.conf")
	sum := sha256.Sum256([]byte("a-token-from-spillway-token-create"))
	cfg, err := config.Load(fill("../../deploy/ha/spillway.yaml", "tokenSHA256: "+config.Placeholder, "tokenSHA256: "+hex.EncodeToString(sum[:])))
	if err != nil {
		t.Fatal(err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	logFile, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	log := func() string { b, _ := os.ReadFile(logFile.Name()); return string(b) }
	cmd := exec.Command(bin, conf, "--bind", "127.0.0.1", "--port", fmt.Sprint(port), "--dir", dir)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	u, err := url.Parse(cfg.Store)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = fmt.Sprintf("127.0.0.1:%d", port)
	var s *Store
	for deadline := time.Now().Add(30 * time.Second); ; {
		select {
		case <-exited:
			t.Fatalf("redis-server on deploy/ha/redis.conf exited (%v):\n%s", waitErr, log())
		default:
		}
		if s, err = Open(context.Background(), u.String(), Options{Logger: quiet}); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("open the store URL of deploy/ha/spillway.yaml: %v\nredis-server:\n%s", err, log())
	}
	defer s.Close()
	if err := s.Update(context.Background(), func(tx broker.Tx) error { return tx.Put(broker.BucketMeta, "k", []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("", "not-"+pw)
	if bad, err := Open(context.Background(), u.String(), Options{Logger: quiet}); err == nil {
		bad.Close()
		t.Fatal("a wrong password opened the store")
	}
}
