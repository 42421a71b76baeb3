package main

import (
	"regexp"
	"strings"
	"testing"
)

// TestArrayCLI: an array's elements are listed by its id with their
// indexes, status names the array, and `spillway cancel ARRAY` cancels
// every element, as scancel does given an array's id.
func TestArrayCLI(t *testing.T) {
	_, url := cliBroker(t)
	spec := writeSpec(t, "name: shards\nresources: {gpus: 1}\ncommand: [\"true\"]\n")
	out, errOut, code := runCLI(t, url, cliUser, "submit", "-f", spec, "--array", "0-2%2")
	m := regexp.MustCompile(`submitted array (\w{26}): 3 jobs, (\w{26}) \(index 0\)`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("submit --array: %d %q %q", code, out, errOut)
	}
	array, first := m[1], m[2]

	out, errOut, code = runCLI(t, url, cliUser, "jobs", "--array", array)
	if code != 0 || strings.Count(out, "\n") != 4 {
		t.Fatalf("jobs --array: %d %q %q", code, out, errOut)
	}
	for _, name := range []string{"shards[0]", "shards[1]", "shards[2]"} {
		if !strings.Contains(out, name) {
			t.Fatalf("jobs --array does not show %s:\n%s", name, out)
		}
	}
	if out, _, _ = runCLI(t, url, cliUser, "status", first); !regexp.MustCompile(`Array:\s+` + array + `, index 0 \(at most 2 running at once\)\n`).MatchString(out) {
		t.Fatalf("status of an element:\n%s", out)
	}

	out, errOut, code = runCLI(t, url, cliUser, "cancel", array)
	if code != 0 || out != "array "+array+": 3 cancelled, 0 stopping, 0 had ended (3 jobs)\n" {
		t.Fatalf("cancel ARRAY: %d %q %q", code, out, errOut)
	}
	out, _, _ = runCLI(t, url, cliUser, "jobs", "--array", array, "--all")
	if strings.Count(out, "cancelled by alice") != 3 {
		t.Fatalf("after the cancel:\n%s", out)
	}
	if _, errOut, code = runCLI(t, url, cliUser, "cancel", array); code != 1 || !strings.Contains(errOut, "already ended (3 jobs)") {
		t.Fatalf("cancel an ended array: %d %q", code, errOut)
	}
	unknown := "01M91DFM9A4WV7KQQAF63BJ15N"
	if _, errOut, code = runCLI(t, url, cliUser, "cancel", unknown); code != 1 || errOut != unknown+": job "+unknown+" not found\n" {
		t.Fatalf("cancel an unknown id: %d %q", code, errOut)
	}
	if _, errOut, code = runCLI(t, url, cliUser, "jobs", "--array", "shards"); code == 0 || !strings.Contains(errOut, "arrayId") {
		t.Fatalf("jobs --array with a name: %d %q", code, errOut)
	}
}
