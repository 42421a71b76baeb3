// Package imdsmock starts the real EC2 instance metadata mock for tests:
// amazon-ec2-metadata-mock (github.com/aws/amazon-ec2-metadata-mock,
// "AEMM"), listening on 127.0.0.1, IMDSv2 only, serving a spot
// interruption notice (spot/instance-action) and a rebalance
// recommendation.
//
// The binary is found in $SPILLWAY_EC2_METADATA_MOCK, then on PATH as
// ec2-metadata-mock, then in the tool cache ($XDG_CACHE_HOME/spillway-tools,
// filled by `.ci/run` or by the first test that needs it with `go install`
// from the module proxy). Under CI=true a mock that cannot be built or
// started fails the test; elsewhere the test is skipped with how to enable
// it.
package imdsmock

import (
	"github.com/spillway-dev/spillway/internal/toolbin"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// Version is the AEMM release the tests use.
const Version = "v1.13.0"

// Module is AEMM's main package.
const Module = "github.com/aws/amazon-ec2-metadata-mock/cmd/ec2-metadata-mock"

var tool = &toolbin.Tool{Name: "ec2-metadata-mock", Env: "SPILLWAY_EC2_METADATA_MOCK", Module: Module, Version: Version}

// CacheDir is where the binary is built.
func CacheDir() string { return tool.CacheDir() }

// Binary returns the binary, building it when needed.
func Binary() (string, error) { return tool.Binary() }

// Mock is one running AEMM.
type Mock struct {
	// Endpoint is http://127.0.0.1:port, the agent's metadata endpoint.
	Endpoint string
	// Addr is 127.0.0.1:port.
	Addr string
	t    testing.TB
	cmd  *exec.Cmd
	exit chan struct{}
}

// Options choose what the mock serves.
type Options struct {
	// Action is the instance action (terminate, stop, hibernate);
	// default terminate.
	Action string
	// Time is the termination time the notice announces; default two
	// minutes after the notice is read (AEMM's default).
	Time time.Time
	// Addr is where to listen (127.0.0.1:port); default a free port.
	Addr string
}

// FreeAddr returns a 127.0.0.1 address with a port the kernel chose, for
// an endpoint that nothing serves yet.
func FreeAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// Start starts AEMM's `spot` command: the interruption notice is served
// at once, IMDSv2 tokens required. It stops with the test.
func Start(t testing.TB, o Options) *Mock {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("amazon-ec2-metadata-mock: %v", err)
		}
		t.Skipf("amazon-ec2-metadata-mock unavailable (run .ci/run or set SPILLWAY_EC2_METADATA_MOCK): %v", err)
	}
	addr := o.Addr
	if addr == "" {
		addr = FreeAddr(t)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"spot", "--imdsv2", "--hostname", host, "--port", port, "--action", cmpOr(o.Action, "terminate")}
	if !o.Time.IsZero() {
		args = append(args, "--time", o.Time.UTC().Format(time.RFC3339))
	}
	dir := t.TempDir()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+dir) // its config file lives in $HOME
	logf, err := os.Create(filepath.Join(dir, "aemm.log"))
	if err == nil {
		cmd.Stdout, cmd.Stderr = logf, logf
		defer logf.Close()
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start ec2-metadata-mock: %v", err)
	}
	m := &Mock{Endpoint: "http://" + addr, Addr: addr, t: t, cmd: cmd, exit: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(m.exit) }()
	t.Cleanup(m.Stop)
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return m
		}
		select {
		case <-m.exit:
			log, _ := os.ReadFile(filepath.Join(dir, "aemm.log"))
			t.Fatalf("ec2-metadata-mock exited at start: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("ec2-metadata-mock did not listen on %s within 60s", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop ends the mock.
func (m *Mock) Stop() {
	select {
	case <-m.exit:
		return
	default:
	}
	_ = m.cmd.Process.Kill()
	<-m.exit
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
