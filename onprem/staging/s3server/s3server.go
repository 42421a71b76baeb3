// Package s3server starts a real S3-compatible server for tests:
// versitygw (github.com/versity/versitygw) over a temporary directory
// with its posix backend, listening on 127.0.0.1.
//
// The binary is found in $SPILLWAY_VERSITYGW, then on PATH, then in the
// tool cache ($XDG_CACHE_HOME/spillway-tools, filled by `.ci/run` or by
// the first test that needs it with `go install` from the module proxy).
// Under CI=true a server that cannot be built or started fails the test;
// elsewhere the test is skipped with how to enable it.
package s3server

import (
	"context"
	"github.com/spillway-dev/spillway/internal/toolbin"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Version is the versitygw release the tests use.
const Version = "v1.8.0"

// Module is versitygw's main package.
const Module = "github.com/versity/versitygw/cmd/versitygw"

// Test credentials of the server.
const (
	AccessKey = "spillway-test"
	SecretKey = "spillway-test-secret"
	Region    = "us-east-1"
)

// Server is one running versitygw.
type Server struct {
	// Endpoint is http://127.0.0.1:port.
	Endpoint string
	// Dir is the directory the buckets live in (one subdirectory each).
	Dir string
	// meta holds object metadata (ETags) beside Dir, so the server needs
	// no extended attributes on the test's filesystem.
	meta string

	t    testing.TB
	bin  string
	addr string
	mu   sync.Mutex
	cmd  *exec.Cmd
	exit chan struct{}
}

var tool = &toolbin.Tool{Name: "versitygw", Env: "SPILLWAY_VERSITYGW", Module: Module, Version: Version}

// CacheDir is where the binary is built.
func CacheDir() string { return tool.CacheDir() }

// Binary returns the binary, building it when needed.
func Binary() (string, error) { return tool.Binary() }

// Start builds (once) and starts versitygw over a fresh temporary
// directory; it stops with the test.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("versitygw: %v", err)
		}
		t.Skipf("versitygw unavailable (run .ci/run or set SPILLWAY_VERSITYGW): %v", err)
	}
	dir := t.TempDir()
	meta := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	s := &Server{Endpoint: "http://" + addr, Dir: dir, meta: meta, t: t, bin: bin, addr: addr}
	s.Restart()
	t.Cleanup(s.Stop)
	return s
}

// Restart starts the server again on the same address and directory (after
// Stop), and waits until it answers.
func (s *Server) Restart() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return
	}
	cmd := exec.Command(s.bin, "--access", AccessKey, "--secret", SecretKey, "--port", s.addr, "posix", "--sidecar", s.meta, s.Dir)
	logf, err := os.OpenFile(filepath.Join(filepath.Dir(s.Dir), "versitygw-"+strconv.Itoa(os.Getpid())+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err == nil {
		cmd.Stdout, cmd.Stderr = logf, logf
		defer logf.Close()
	}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start versitygw: %v", err)
	}
	exit := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exit) }()
	s.cmd, s.exit = cmd, exit
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-exit:
			s.cmd = nil
			s.t.Fatalf("versitygw exited at start (see %s)", logf.Name())
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("versitygw did not listen on %s within 60s", s.addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop ends the server; the bucket directory stays for Restart.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exit
	s.cmd = nil
}

// Client is an SDK client for the server.
func (s *Server) Client() *s3.Client {
	return s3.New(s3.Options{
		Region:       Region,
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
		BaseEndpoint: aws.String(s.Endpoint),
		UsePathStyle: true,
	})
}

// Bucket creates a bucket.
func (s *Server) Bucket(name string) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		s.t.Fatalf("create bucket %s: %v", name, err)
	}
}

// Env is the environment that points the AWS SDK's default credential chain
// at the server's test key.
func (s *Server) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + AccessKey, "AWS_SECRET_ACCESS_KEY=" + SecretKey, "AWS_REGION=" + Region}
}
