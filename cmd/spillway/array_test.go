package main

import (
	"context"
	"os"
	"path/filepath"
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

	// The array at a glance, held, released, and its limit changed.
	out, errOut, code = runCLI(t, url, cliUser, "status", array)
	for _, want := range []string{`Array:\s+` + array + ` \(shards\)\n`, `Jobs:\s+3, indexes 0-2\n`, `Limit:\s+at most 2 running at once\n`,
		`States:\s+3 pending\n`, `Waiting:\s+indexes 0-2 \(`, `Team / queue / priority:\s+nlp / default / medium\n`} {
		if code != 0 || !regexp.MustCompile(want).MatchString(out) {
			t.Fatalf("status ARRAY lacks %s: %d\n%s%s", want, code, out, errOut)
		}
	}
	out, errOut, code = runCLI(t, url, cliUser, "job", "hold", array, "--reason", "input not ready")
	if code != 0 || out != "array "+array+": 3 held; 3 pending (3 held)\n" {
		t.Fatalf("job hold ARRAY: %d %q %q", code, out, errOut)
	}
	if out, _, _ = runCLI(t, url, cliUser, "status", array); !regexp.MustCompile(`Waiting:\s+indexes 0-2 \(held 3\)\n`).MatchString(out) {
		t.Fatalf("status of a held array:\n%s", out)
	}
	if out, _, _ = runCLI(t, url, cliUser, "status", first); !strings.Contains(out, "held by alice (input not ready); spillway job release "+first+" (or the whole array: spillway job release "+array+")") {
		t.Fatalf("status of a held element:\n%s", out)
	}
	out, errOut, code = runCLI(t, url, cliUser, "job", "release", array)
	if code != 0 || out != "array "+array+": 3 released; 3 pending\n" {
		t.Fatalf("job release ARRAY: %d %q %q", code, out, errOut)
	}
	out, errOut, code = runCLI(t, url, cliUser, "job", "limit", array, "1")
	if code != 0 || out != "array "+array+": at most 1 running at once; 3 pending\n" {
		t.Fatalf("job limit ARRAY 1: %d %q %q", code, out, errOut)
	}
	for _, c := range []struct{ n, want string }{{"x", "N: \"x\" is not a whole number"}, {"10001", "limit: must be a whole number from 0 (no limit) to 10000"}} {
		if _, errOut, code = runCLI(t, url, cliUser, "job", "limit", array, c.n); code == 0 || !strings.Contains(errOut, c.want) {
			t.Fatalf("job limit ARRAY %s: %d %q", c.n, code, errOut)
		}
	}

	// `spillway jobs` shows the waiting elements on one line, as squeue
	// does; -r one line each.
	out, errOut, code = runCLI(t, url, cliUser, "jobs")
	if code != 0 || strings.Count(out, "\n") != 2 ||
		!regexp.MustCompile(array+`\s+shards\[0-2%1\]\s+nlp\s+default\s+medium\s+1\s+pending\s+\S+ ago\s+3 waiting: \w+ 3\n`).MatchString(out) {
		t.Fatalf("jobs with an array waiting: %d %q %q", code, out, errOut)
	}
	if out, _, _ = runCLI(t, url, cliUser, "jobs", "-r"); strings.Count(out, "shards[") != 3 || strings.Contains(out, array) {
		t.Fatalf("jobs -r:\n%s", out)
	}
	if out, _, _ = runCLI(t, url, cliUser, "jobs", "-o", "json"); strings.Count(out, `"arrayIndex"`) != 3 {
		t.Fatalf("jobs -o json folds:\n%s", out)
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
	if _, errOut, code = runCLI(t, url, cliUser, "cancel", unknown); code != 1 || errOut != unknown+": job or array "+unknown+" not found\n" {
		t.Fatalf("cancel an unknown id: %d %q", code, errOut)
	}
	if _, errOut, code = runCLI(t, url, cliUser, "jobs", "--array", "shards"); code == 0 || !strings.Contains(errOut, "arrayId") {
		t.Fatalf("jobs --array with a name: %d %q", code, errOut)
	}
}

// TestRunArray: `spillway run --array` makes an array from a command
// line, as `sbatch --array --wrap` does: one job per index, each with its
// SPILLWAY_ARRAY_INDEX (with --wait: integration's TestQuickstart).
func TestRunArray(t *testing.T) {
	_, url := cliBroker(t)
	out, errOut, code := runCLI(t, url, cliUser, "run", "--no-upload", "--name", "shard", "--array", "0-8:4", "--", "sh", "-c", "echo $SPILLWAY_ARRAY_INDEX")
	m := regexp.MustCompile(`^submitted array (\w{26}): 3 jobs, \w{26} \(index 0\) to \w{26} \(index 8\)\n$`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("run --array: %d %q %q", code, out, errOut)
	}
	out, errOut, code = runCLI(t, url, cliUser, "jobs", "--array", m[1], "-r")
	for _, name := range []string{"shard[0]", "shard[4]", "shard[8]"} {
		if code != 0 || !strings.Contains(out, name) {
			t.Fatalf("jobs --array lacks %s: %d\n%s%s", name, code, out, errOut)
		}
	}

	// A bad range is refused before the working directory is packed or
	// sent, with the rule.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "train.py"), []byte("print(1)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"5-1", "0-10000"} {
		_, errOut, code = runCLI(t, url, cliUser, "run", "--workdir-from", dir, "--array", bad, "--", "true")
		if code == 0 || !strings.Contains(errOut, "--array: ") || !strings.Contains(errOut, "write indexes like") || strings.Contains(errOut, "uploaded") {
			t.Fatalf("run --array %s: %d %q", bad, code, errOut)
		}
		t.Logf("--array %s: %s", bad, errOut)
	}
}

// TestQueueHead: `spillway queue` lists the head of each queue (-n) and
// says how many more wait behind it; array elements show as name[index].
func TestQueueHead(t *testing.T) {
	srv, url := cliBroker(t)
	out, errOut, code := runCLI(t, url, cliUser, "run", "--no-upload", "--name", "shard", "--array", "0-4", "--", "true")
	if code != 0 {
		t.Fatalf("run --array: %d %q %q", code, out, errOut)
	}
	if err := srv.Cycle(context.Background()); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = runCLI(t, url, cliUser, "queue", "-n", "2")
	if code != 0 || !strings.Contains(out, "shard[0]") || !strings.Contains(out, "shard[1]") || strings.Contains(out, "shard[2]") ||
		!strings.Contains(out, "… and 3 more waiting behind them") {
		t.Fatalf("queue -n 2: %d\n%s%s", code, out, errOut)
	}
	t.Logf("queue -n 2:\n%s", out)
	if _, errOut, code = runCLI(t, url, cliUser, "queue", "-n", "0"); code == 0 || !strings.Contains(errOut, "--limit 0: must be between 1 and 1000") {
		t.Fatalf("queue -n 0: %d %q", code, errOut)
	}
}
