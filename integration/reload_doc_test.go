package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker/api"
)

// TestOperationsReloadExample runs docs/operations.md's "Reloading the
// config" example against a broker and checks every line it prints: the
// token entry the prose pastes goes live with SIGHUP (and the new token
// then works), the audit log shows that reload, `spillway config reload`
// applies teams and limits and lists log as kept until a restart, and
// the audit log then shows both reloads. The file edits the prose
// describes are made before the step that reads them. Times, the config's
// path and the broker's address stand in for the doc's.
//
// `pgrep -f 'spillway server'` runs as a stand-in that names this test's
// broker: the real one would find every broker other tests on this
// machine run.
func TestOperationsReloadExample(t *testing.T) {
	steps := docTranscript(t, "../docs/operations.md", "### Reloading the config")

	const opsToken = "ops-token-0123456789abcdef0123"
	const carolToken = "carol-token-0123456789abcdef01"
	hash := func(tok string) string { s := sha256.Sum256([]byte(tok)); return hex.EncodeToString(s[:]) }
	c := &cluster{t: t, dir: t.TempDir(), addr: freePort(t), viewer: opsToken}
	c.url = "http://" + c.addr
	c.config = filepath.Join(c.dir, "spillway.yaml")
	opsEntry := fmt.Sprintf("    - {name: ops, role: operator, tokenSHA256: %s}\n", hash(opsToken))
	base := fmt.Sprintf("listen: %s\ndataDir: data\ntls: {insecure: true}\nauth:\n  tokens:\n%s", c.addr, opsEntry)
	write := func(body string) {
		t.Helper()
		if err := os.WriteFile(c.config, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(base)
	c.startBroker()

	// What the prose does before each step, and what the test waits for
	// after it (SIGHUP returns before the broker has read the file).
	withCarol := strings.Replace(base, opsEntry, opsEntry+
		fmt.Sprintf("    - {name: carol, role: user, team: nlp, tokenSHA256: %s}\n", hash(carolToken)), 1)
	before := map[string]func(){
		"kill -HUP": func() { write(withCarol) },
		"spillway config reload": func() {
			write(withCarol + "limits: {submitsPerMinute: 1200}\nteams:\n  - name: nlp\n    quota: {gpus: 16}\nlog: {level: debug}\n")
		},
		"spillway audit": func() {},
	}
	after := map[string]func(){
		"kill -HUP": func() {
			// The reload's effect: carol's token works. (The broker
			// audits a reload before it applies it.)
			var who *api.Whoami
			var err error
			waitFor(t, 30*time.Second, "carol's token works after the SIGHUP", func() bool {
				who, err = c.client(carolToken).Whoami(context.Background())
				return err == nil
			})
			if who.Name != "carol" || who.Team != "nlp" {
				t.Fatalf("carol's token after the SIGHUP reload: %+v", who)
			}
		},
	}

	shims := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(shims, "spillway")); err != nil {
		t.Fatal(err)
	}
	pgrep := fmt.Sprintf("#!/bin/sh\n[ $# = 2 ] && [ \"$1\" = -f ] && [ \"$2\" = 'spillway server' ] && { echo %d; exit 0; }\n"+
		"echo \"pgrep stand-in: unexpected arguments: $*\" >&2; exit 2\n", c.broker.cmd.Process.Pid)
	if err := os.WriteFile(filepath.Join(shims, "pgrep"), []byte(pgrep), 0o755); err != nil {
		t.Fatal(err)
	}
	stamp := regexp.MustCompile(`\d{4}-\d\d-\d\d \d\d:\d\d:\d\d`)
	norm := func(s string) string {
		s = strings.ReplaceAll(s, c.config, "/etc/spillway/spillway.yaml")
		s = stamp.ReplaceAllString(s, "TIME")
		var out []string
		for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
		return strings.Join(out, "\n")
	}
	for _, st := range steps {
		var setup func()
		for prefix, f := range before {
			if strings.HasPrefix(st.cmd, prefix) {
				setup = f
			}
		}
		if setup == nil {
			t.Fatalf("docs/operations.md's step %q: this test does not know what the prose does before it; add it to before", st.cmd)
		}
		setup()
		sh := exec.Command("sh", "-c", st.cmd)
		sh.Env = append(os.Environ(), "PATH="+shims+":"+os.Getenv("PATH"),
			"SPILLWAY_SERVER="+c.url, "SPILLWAY_TOKEN="+opsToken, "SPILLWAY_CONFIG=/nonexistent", "SPILLWAY_CA=")
		var stdout, stderr bytes.Buffer
		sh.Stdout, sh.Stderr = &stdout, &stderr
		if err := sh.Run(); err != nil {
			t.Fatalf("$ %s: %v\nstdout:\n%s\nstderr:\n%s", st.cmd, err, stdout.String(), stderr.String())
		}
		if got, want := norm(stdout.String()), norm(st.out); got != want {
			t.Fatalf("$ %s printed (normalised)\n%s\ndocs/operations.md shows\n%s", st.cmd, got, want)
		}
		for prefix, f := range after {
			if strings.HasPrefix(st.cmd, prefix) {
				f()
			}
		}
	}
}

// docStep is one command of a doc's example and what it prints.
type docStep struct{ cmd, out string }

// docTranscript reads the first ``` block after heading in a doc: lines
// starting with "$ " are commands (a trailing "  # comment" dropped), the
// lines after one are its output.
func docTranscript(t *testing.T, doc, heading string) []docStep {
	t.Helper()
	raw, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("%s has no %q section", doc, heading)
	}
	_, block, ok := strings.Cut(section, "\n```\n")
	if ok {
		block, _, ok = strings.Cut(block, "\n```\n")
	}
	if !ok {
		t.Fatalf("%s, %q: no ``` block", doc, heading)
	}
	comment := regexp.MustCompile(`\s{2,}#\s.*$`)
	var steps []docStep
	for _, line := range strings.Split(block, "\n") {
		if cmd, ok := strings.CutPrefix(line, "$ "); ok {
			steps = append(steps, docStep{cmd: strings.TrimSpace(comment.ReplaceAllString(cmd, ""))})
			continue
		}
		if len(steps) == 0 {
			t.Fatalf("%s, %q: output before the first command: %q", doc, heading, line)
		}
		steps[len(steps)-1].out += line + "\n"
	}
	if len(steps) == 0 {
		t.Fatalf("%s, %q: no commands", doc, heading)
	}
	return steps
}
