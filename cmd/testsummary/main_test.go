package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestSummaryListsSkips: skipped tests are listed with their reason after
// the usual lines, a pass prints only its package line, a skip fails the
// run under CI=true (.ci/run), and a failure prints its output and exits 1.
func TestSummaryListsSkips(t *testing.T) {
	in := `{"Action":"run","Package":"github.com/spillway-dev/spillway/integration","Test":"TestSSH"}
{"Action":"output","Package":"github.com/spillway-dev/spillway/integration","Test":"TestSSH","Output":"=== RUN   TestSSH\n"}
{"Action":"output","Package":"github.com/spillway-dev/spillway/integration","Test":"TestSSH","Output":"    sshd.go:48: sshd not found at /usr/sbin/sshd: install openssh-server (apt-get install -y openssh-server)\n"}
{"Action":"output","Package":"github.com/spillway-dev/spillway/integration","Test":"TestSSH","Output":"--- SKIP: TestSSH (0.00s)\n"}
{"Action":"skip","Package":"github.com/spillway-dev/spillway/integration","Test":"TestSSH"}
{"Action":"pass","Package":"github.com/spillway-dev/spillway/integration","Test":"TestOther"}
{"Action":"output","Package":"github.com/spillway-dev/spillway/integration","Output":"ok  \tgithub.com/spillway-dev/spillway/integration\t1.0s\n"}
{"Action":"pass","Package":"github.com/spillway-dev/spillway/integration"}
`
	var out bytes.Buffer
	if code := run(strings.NewReader(in), &out, false); code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"ok  \tgithub.com/spillway-dev/spillway/integration", "1 test(s) skipped", "make test-deps",
		"integration TestSSH: sshd not found at /usr/sbin/sshd: install openssh-server"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if code := run(strings.NewReader(in), &out, true); code != 1 || !strings.Contains(out.String(), "FAIL: CI=true and 1 test(s) skipped") ||
		!strings.Contains(out.String(), "integration TestSSH: sshd not found") {
		t.Fatalf("a skip under CI=true: exit %d\n%s", code, out.String())
	}
	// The README tells a new contributor the same.
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"skips the end-to-end tests that need them", "sudo make test-deps", "any skipped test fails `make test`"} {
		if !strings.Contains(strings.Join(strings.Fields(string(readme)), " "), want) {
			t.Errorf("README.md lacks %q", want)
		}
	}
	fail := `{"Action":"output","Package":"p","Test":"TestX","Output":"    x_test.go:3: boom\n"}
{"Action":"fail","Package":"p","Test":"TestX"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t0.1s\n"}
{"Action":"fail","Package":"p"}
`
	out.Reset()
	if code := run(strings.NewReader(fail), &out, false); code != 1 || !strings.Contains(out.String(), "boom") {
		t.Fatalf("failure: exit %d\n%s", code, out.String())
	}
}
