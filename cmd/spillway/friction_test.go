package main

import (
	"strings"
	"testing"
)

// TestSubmitShowsEverySpecError: a spec with several mistakes gets them
// all at once, each with its field, not only the first.
func TestSubmitShowsEverySpecError(t *testing.T) {
	_, url := cliBroker(t)
	spec := writeSpec(t, "resources: {gpus: 0}\npriority: urgent\ncommand: [\"true\"]\n")
	_, errOut, code := runCLI(t, url, cliUser, "submit", "-f", spec)
	if code == 0 {
		t.Fatal("a bad spec was accepted")
	}
	for _, want := range []string{"2 problems", "resources.gpus", "priority"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
}
