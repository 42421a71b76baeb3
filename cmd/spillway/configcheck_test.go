package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigCheckRunsAdapterRules: `spillway config check` runs each
// provider's own rules on its section and names the fields by their path
// in the file.
func TestConfigCheckRunsAdapterRules(t *testing.T) {
	p := filepath.Join(t.TempDir(), "spillway.yaml")
	doc := "dataDir: " + t.TempDir() + "\nproviders:\n  - aws: {imageId: ami-1, instanceTypes: [{name: g6.xlarge, gpus: 1}]}\n"
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := execute([]string{"config", "check", p}, &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), "2 problem(s)") ||
		!strings.Contains(errOut.String(), "providers[0].aws.region: is required") ||
		!strings.Contains(errOut.String(), "providers[0].aws.instanceTypes[0]: want a name") {
		t.Fatalf("exit %d\n%s%s", code, out.String(), errOut.String())
	}
}
