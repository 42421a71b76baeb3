package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMain keeps the CLI's tests off the developer's own settings: the
// CLI config `make run` writes (~/.config/spillway/config, whose CA file
// may belong to another checkout) and the SPILLWAY_* variables the README
// tells people to export. A test that wants them sets its own.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "spillway-cli-test-")
	if err != nil {
		panic(err)
	}
	os.Setenv("SPILLWAY_CONFIG", filepath.Join(dir, "no-cli-config"))
	for _, k := range []string{"SPILLWAY_SERVER", "SPILLWAY_TOKEN", "SPILLWAY_CA"} {
		os.Unsetenv(k)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
