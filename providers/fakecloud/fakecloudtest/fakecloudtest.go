// Package fakecloudtest starts the fake clouds of package fakecloud for a
// test: each ends when the test does, and a test that needs a real sshd
// skips without one, or fails under CI=true.
package fakecloudtest

import (
	"os"
	"testing"

	"github.com/spillway-dev/spillway/providers/fakecloud"
)

// RequireSSHD skips the test when sshd is not installed, or fails it when
// the environment variable CI is "true": CI must run these tests.
func RequireSSHD(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(fakecloud.SSHDPath); err == nil {
		return
	}
	msg := "sshd not found at " + fakecloud.SSHDPath + ": install openssh-server (apt-get install -y openssh-server)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// StartSSHD starts an sshd for the test and stops it when the test ends.
func StartSSHD(t testing.TB, opts fakecloud.SSHOptions) *fakecloud.SSHHost {
	t.Helper()
	RequireSSHD(t)
	h, err := fakecloud.StartSSHD(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.Stop()
		if t.Failed() {
			t.Logf("sshd %s log:\n%s", h.Addr, h.Log())
		}
	})
	return h
}

// NewEC2 starts a fake EC2 endpoint for the test.
func NewEC2(t testing.TB, opts fakecloud.EC2Options) *fakecloud.EC2 {
	t.Helper()
	if opts.SSHD && opts.Machines == nil {
		RequireSSHD(t)
	}
	e, err := fakecloud.StartEC2(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// NewGCE starts a fake Compute Engine endpoint for the test.
func NewGCE(t testing.TB, opts fakecloud.GCEOptions) *fakecloud.GCE {
	t.Helper()
	if opts.SSHD {
		RequireSSHD(t)
	}
	g, err := fakecloud.StartGCE(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g
}

// NewLambda starts a fake Lambda Cloud API for the test.
func NewLambda(t testing.TB, opts fakecloud.LambdaOptions) *fakecloud.Lambda {
	t.Helper()
	if opts.SSHD {
		RequireSSHD(t)
	}
	l, err := fakecloud.StartLambda(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// NewRegistrar starts a stand-in agent registrar for the test.
func NewRegistrar(t testing.TB) *fakecloud.Registrar {
	r := fakecloud.StartRegistrar()
	t.Cleanup(r.Close)
	return r
}
