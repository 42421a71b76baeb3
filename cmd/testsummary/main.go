// Command testsummary reads `go test -json` on stdin and prints what `go
// test` prints without -v (each package's ok/FAIL line, the output of
// failing tests), then a summary of every skipped test with its reason,
// which for tests that need a real service says how to enable it. `make
// test` pipes into it; `make test-deps` installs those services on Debian.
// It exits 1 when any test or package failed, and under CI=true (.ci/run)
// also when any test skipped: CI has every service installed, so a skip
// there is a test that did not run, never a pass.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

type skip struct{ pkg, test, reason string }

func main() {
	os.Exit(run(os.Stdin, os.Stdout, os.Getenv("CI") == "true"))
}

// run summarises the events on in; failOnSkip (CI=true) makes any skipped
// test fail the run.
func run(in io.Reader, out io.Writer, failOnSkip bool) int {
	outputs := map[string][]string{} // package/test → its output lines
	var skips []skip
	failed := false
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			fmt.Fprintln(out, sc.Text()) // build errors come as plain text
			continue
		}
		key := e.Package + "/" + e.Test
		switch e.Action {
		case "output":
			outputs[key] = append(outputs[key], e.Output)
			if e.Test == "" && (strings.HasPrefix(e.Output, "ok ") || strings.HasPrefix(e.Output, "FAIL") ||
				strings.HasPrefix(e.Output, "?") || strings.HasPrefix(e.Output, "---") || strings.HasPrefix(e.Output, "panic")) {
				fmt.Fprint(out, e.Output)
			}
		case "fail":
			failed = true
			if e.Test != "" {
				fmt.Fprint(out, strings.Join(outputs[key], ""))
			} else if !strings.Contains(strings.Join(outputs[key], ""), "FAIL") {
				fmt.Fprint(out, strings.Join(outputs[key], ""))
			}
			delete(outputs, key)
		case "skip":
			if e.Test != "" {
				skips = append(skips, skip{e.Package, e.Test, reason(outputs[key])})
			}
			delete(outputs, key)
		case "pass":
			delete(outputs, key)
		}
	}
	if len(skips) > 0 {
		sort.Slice(skips, func(i, j int) bool {
			if skips[i].pkg != skips[j].pkg {
				return skips[i].pkg < skips[j].pkg
			}
			return skips[i].test < skips[j].test
		})
		fmt.Fprintf(out, "\n%d test(s) skipped; `ok` above does not include them. `make test-deps` installs what they need on Debian:\n", len(skips))
		for _, s := range skips {
			fmt.Fprintf(out, "  %s %s: %s\n", strings.TrimPrefix(s.pkg, "github.com/spillway-dev/spillway/"), s.test, s.reason)
		}
	}
	if len(skips) > 0 && failOnSkip {
		fmt.Fprintf(out, "FAIL: CI=true and %d test(s) skipped; under CI every test runs (a missing service is a failure, not a skip)\n", len(skips))
		return 1
	}
	if failed {
		return 1
	}
	return 0
}

var fileLine = regexp.MustCompile(`^\S+\.go:\d+: `)

// reason is the skip message: the test's last log line before "--- SKIP".
func reason(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "--- SKIP") || strings.HasPrefix(l, "=== ") {
			continue
		}
		return fileLine.ReplaceAllString(l, "")
	}
	return "(no reason given)"
}
