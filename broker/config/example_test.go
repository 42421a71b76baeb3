package config

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// loadExample loads a shipped example with its placeholders filled in as
// an operator would: each REPLACE-ME with a hash (or a password).
func loadExample(t *testing.T, path string) *Config {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("a-token-from-spillway-token-create"))
	filled := strings.ReplaceAll(string(raw), "tokenSHA256: "+Placeholder, "tokenSHA256: "+hex.EncodeToString(sum[:]))
	filled = strings.ReplaceAll(filled, ":"+Placeholder+"@", ":s3cret-password@")
	p := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(p, []byte(filled), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestExamplesHoldNoUsableSecret: the shipped configs carry no token or
// hash anyone could use; a broker started on one as shipped refuses with
// what to do, naming each field.
func TestExamplesHoldNoUsableSecret(t *testing.T) {
	for _, path := range []string{"../../deploy/spillway.example.yaml", "../../deploy/ha/spillway.yaml"} {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(raw), "\n") {
			l := strings.TrimSpace(line)
			if (strings.HasPrefix(l, "tokenSHA256:") || strings.HasPrefix(l, "token:")) && !strings.Contains(l, Placeholder) {
				t.Errorf("%s:%d ships a token: %s", path, i+1, l)
			}
		}
		_, err = Load(path)
		if err == nil {
			t.Fatalf("%s as shipped was accepted", path)
		}
		for _, want := range []string{"auth.tokens[0].tokenSHA256", "spillway token create --name alice"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error lacks %q: %v", path, want, err)
			}
		}
	}
	// Nothing under deploy/ carries a token, or the hash of a guessable
	// one (the old example shipped the hashes of foo and bar).
	err := filepath.WalkDir("../../deploy", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(raw), "\n") {
			l := strings.TrimSpace(line)
			if (strings.HasPrefix(l, "tokenSHA256:") || strings.HasPrefix(l, "token:")) && !strings.Contains(l, Placeholder) {
				t.Errorf("%s:%d ships a token: %s", path, i+1, l)
			}
		}
		for _, weak := range []string{"foo", "bar", "secret", "changeme", "password", "admin", "token"} {
			sum := sha256.Sum256([]byte(weak))
			if strings.Contains(string(raw), hex.EncodeToString(sum[:])) {
				t.Errorf("%s ships the hash of %q", path, weak)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile("../../deploy/ha/redis.conf")
	if !strings.Contains(string(raw), "requirepass "+Placeholder) {
		t.Error("deploy/ha/redis.conf: requirepass is not the placeholder the broker's store URL uses")
	}
	if _, err := Load("../../deploy/ha/spillway.yaml"); err == nil || !strings.Contains(err.Error(), "store: still has the example's") {
		t.Errorf("ha example's store password placeholder not refused: %v", err)
	}
}
