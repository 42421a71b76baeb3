// Package toolbin finds or builds the real services and tools the tests
// use (versitygw, amazon-ec2-metadata-mock, goreleaser): an explicit path
// from the environment, else one on PATH, else a `go install` from the
// module proxy into ~/.cache/spillway-tools/NAME-VERSION (where .ci/run
// and the Makefile build them).
package toolbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

// Tool is one binary built from a Go module at a pinned version.
type Tool struct {
	// Name is the binary's name; Env the variable that may name it.
	Name, Env string
	// Module is the main package, Version the release.
	Module, Version string

	once sync.Once
	bin  string
	err  error
}

// CacheDir is where the binary is built.
func (t *Tool) CacheDir() string {
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		if h, err := os.UserHomeDir(); err == nil {
			base = filepath.Join(h, ".cache")
		} else {
			base = os.TempDir()
		}
	}
	return filepath.Join(base, "spillway-tools", t.Name+"-"+t.Version)
}

// Binary returns the tool's binary, building it (once) when needed.
func (t *Tool) Binary() (string, error) {
	t.once.Do(func() { t.bin, t.err = t.find() })
	return t.bin, t.err
}

// Installed returns the tool's binary when it is already there (the
// environment's path, PATH, the cache), without building it: for tools
// too big to build inside a test (goreleaser).
func (t *Tool) Installed() (string, bool) {
	if p := os.Getenv(t.Env); p != "" {
		return p, true
	}
	if p, err := exec.LookPath(t.Name); err == nil {
		return p, true
	}
	bin := filepath.Join(t.CacheDir(), t.Name)
	if _, err := os.Stat(bin); err == nil {
		return bin, true
	}
	return "", false
}

func (t *Tool) find() (string, error) {
	if bin, ok := t.Installed(); ok {
		return bin, nil
	}
	dir := t.CacheDir()
	bin := filepath.Join(dir, t.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cmd := exec.Command("go", "install", t.Module+"@"+t.Version)
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=-mod=mod", "GOWORK=off")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s@%s: %v\n%s", t.Module, t.Version, err, out)
	}
	return bin, nil
}
