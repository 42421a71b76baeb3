package main

import (
	"bytes"
	"encoding/pem"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/broker/config"
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
	// `run` builds the spec from flags and shows every problem too.
	_, errOut, code = runCLI(t, url, cliUser, "run", "--no-upload", "--gpus", "0", "--priority", "urgent", "--queue", "nope", "--", "true")
	if code == 0 {
		t.Fatal("run with a bad spec was accepted")
	}
	for _, want := range []string{"3 problems", "resources.gpus", "priority", "queue: unknown queue"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("run: stderr lacks %q:\n%s", want, errOut)
		}
	}
	if strings.Contains(errOut, "timeout") {
		t.Errorf("run: a timeout the user left out is reported (the unknown queue has no default):\n%s", errOut)
	}
}

// TestTokenCreateAndConfigCheck: the example config as shipped fails
// `config check` naming each placeholder; with the entries `token create`
// prints pasted in, it passes and the printed tokens are the ones the
// config accepts.
func TestTokenCreateAndConfigCheck(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := execute([]string{"config", "check", "../../deploy/spillway.example.yaml"}, &out, &errOut); code != 1 ||
		!strings.Contains(errOut.String(), "4 problem(s)") || !strings.Contains(errOut.String(), "spillway token create --name ops") {
		t.Fatalf("config check on the shipped example: exit %d\n%s", code, errOut.String())
	}
	raw, err := os.ReadFile("../../deploy/spillway.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	body := string(raw)
	tokens := map[string]string{}
	for _, who := range []struct{ name, role, team string }{{"alice", "user", "nlp"}, {"ops", "operator", ""}, {"finance", "finance", ""}, {"agents", "agent", ""}} {
		args := []string{"token", "create", "--name", who.name, "--role", who.role}
		if who.team != "" {
			args = append(args, "--team", who.team)
		}
		out.Reset()
		if code := execute(args, &out, &errOut); code != 0 {
			t.Fatalf("token create %s: %d %s", who.name, code, errOut.String())
		}
		m := regexp.MustCompile(`(?m)^token: +([0-9a-f]{48})\ntokenSHA256: +([0-9a-f]{64})$`).FindStringSubmatch(out.String())
		if m == nil || !strings.Contains(out.String(), "tokenSHA256: "+m[2]+"}") {
			t.Fatalf("token create printed:\n%s", out.String())
		}
		tokens[who.name] = m[1]
		body = strings.Replace(body, "tokenSHA256: "+config.Placeholder, "tokenSHA256: "+m[2], 1)
	}
	p := filepath.Join(t.TempDir(), "spillway.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	errOut.Reset()
	if code := execute([]string{"config", "check", p}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "ok") {
		t.Fatalf("config check on the filled example: %d\n%s%s", code, out.String(), errOut.String())
	}
	cfg, err := config.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"alice", "ops", "finance", "agents"} {
		if !cfg.Auth.Tokens[i].Matches(tokens[name]) || cfg.Auth.Tokens[i].Matches(tokens["alice"]+"x") {
			t.Errorf("token of %s does not match its entry", name)
		}
	}
	if code := execute([]string{"token", "create", "--name", "bob"}, &out, &errOut); code == 0 {
		t.Error("a user token without --team was created")
	}
}

// TestBurstPlanSaysNoProvider: with no provider configured, burst plan
// says so and where to start, instead of "0 offer(s)" alone.
func TestBurstPlanSaysNoProvider(t *testing.T) {
	_, url := cliBroker(t)
	out, errOut, code := runCLI(t, url, cliAdmin, "burst", "plan")
	if code != 0 || !strings.Contains(out, "No provider is configured") || !strings.Contains(out, "spillway dev --burst") {
		t.Fatalf("burst plan: %d\n%s%s", code, out, errOut)
	}
}

// TestCompletion: shell completion offers job ids (with name and state),
// queues, priorities and teams from the broker.
func TestCompletion(t *testing.T) {
	_, url := cliBroker(t, "teams:\n  - {name: nlp}\n  - {name: vision}\n")
	out, errOut, code := runCLI(t, url, cliUser, "run", "--name", "eval", "--", "true")
	if code != 0 {
		t.Fatalf("run: %d %s", code, errOut)
	}
	id := strings.TrimSpace(strings.TrimPrefix(out, "submitted "))
	out, _, _ = runCLI(t, url, cliUser, "__complete", "status", id[:6])
	if !strings.Contains(out, id+"\teval") {
		t.Errorf("job id completion:\n%s", out)
	}
	out, _, _ = runCLI(t, url, cliUser, "__complete", "run", "--queue", "")
	if !strings.Contains(out, "default\n") || !strings.Contains(out, "inference\n") {
		t.Errorf("queue completion:\n%s", out)
	}
	out, _, _ = runCLI(t, url, cliUser, "__complete", "run", "--priority", "")
	if !strings.Contains(out, "high\n") || !strings.Contains(out, "low\n") {
		t.Errorf("priority completion:\n%s", out)
	}
	for _, args := range [][]string{{"jobs", "--team", ""}, {"bill", "usage", "--team", ""}, {"token", "create", "--team", ""}} {
		out, _, _ = runCLI(t, url, cliAdmin, append([]string{"__complete"}, args...)...)
		if !strings.Contains(out, "nlp\n") || !strings.Contains(out, "vision\n") {
			t.Errorf("team completion of %v:\n%s", args, out)
		}
	}
}

// TestOperatorControlsCLI: job hold/release/priority and node controls
// from the CLI, with a unique id prefix.
func TestOperatorControlsCLI(t *testing.T) {
	_, url := cliBroker(t)
	out, _, _ := runCLI(t, url, cliUser, "run", "--", "true")
	id := strings.TrimSpace(strings.TrimPrefix(out, "submitted "))
	if out, errOut, code := runCLI(t, url, cliUser, "job", "hold", "--reason", "data not ready", id); code != 0 || !strings.Contains(out, id+" held") {
		t.Fatalf("hold: %d %s %s", code, out, errOut)
	}
	if out, _, _ := runCLI(t, url, cliUser, "status", id[:12]); !strings.Contains(out, "held by alice (data not ready)") {
		t.Fatalf("status of a held job:\n%s", out)
	}
	if _, errOut, code := runCLI(t, url, cliUser, "job", "priority", id, "high"); code == 0 || !strings.Contains(errOut, "may not") {
		t.Fatalf("a user changed a priority: %d %s", code, errOut)
	}
	if out, errOut, code := runCLI(t, url, cliAdmin, "job", "priority", id, "high"); code != 0 || !strings.Contains(out, "priority high") {
		t.Fatalf("priority: %d %s %s", code, out, errOut)
	}
	if out, errOut, code := runCLI(t, url, cliUser, "job", "release", id); code != 0 || !strings.Contains(out, id+" released") {
		t.Fatalf("release: %d %s %s", code, out, errOut)
	}
	if _, errOut, code := runCLI(t, url, cliAdmin, "node", "cordon", "nope"); code == 0 || !strings.Contains(errOut, "node nope not found") {
		t.Fatalf("cordon of an unknown node: %d %s", code, errOut)
	}
}

// TestTokenListRevokeCLI: operators list tokens and revoke one by name.
func TestTokenListRevokeCLI(t *testing.T) {
	_, url := cliBroker(t)
	out, errOut, code := runCLI(t, url, cliAdmin, "token", "list")
	if code != 0 || !strings.Contains(out, "alice") || !strings.Contains(out, "active") {
		t.Fatalf("token list: %d %s %s", code, out, errOut)
	}
	if out, errOut, code := runCLI(t, url, cliAdmin, "token", "revoke", "alice"); code != 0 || !strings.Contains(out, "alice revoked") {
		t.Fatalf("revoke: %d %s %s", code, out, errOut)
	}
	if _, _, code := runCLI(t, url, cliUser, "jobs"); code == 0 {
		t.Fatal("a revoked token still works")
	}
	if out, _, _ := runCLI(t, url, cliAdmin, "token", "list"); !strings.Contains(out, "revoked") {
		t.Fatalf("list after revoke:\n%s", out)
	}
}

// TestServerHelpHidesClientFlags: the daemon verbs' help lists their own
// flags, not the client's --server/--token/--output/--ca/--peers (the
// agent keeps its own --token and --ca).
func TestServerHelpHidesClientFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	for _, tc := range []struct {
		verb, own string
		client    []string
	}{
		{"server", "--config", []string{"--server", "--token", "--output", "--ca", "--peers"}},
		{"dev", "--listen", []string{"--server", "--token", "--output", "--ca", "--peers"}},
		{"agent", "--broker", []string{"--server", "--output", "--peers", "env SPILLWAY_CA", "env SPILLWAY_TOKEN"}},
	} {
		out.Reset()
		execute([]string{tc.verb, "--help"}, &out, &errOut)
		if !strings.Contains(out.String(), tc.own) {
			t.Errorf("%s --help lacks its own %s:\n%s", tc.verb, tc.own, out.String())
		}
		for _, f := range tc.client {
			if strings.Contains(out.String(), f) {
				t.Errorf("%s --help lists the client's %s:\n%s", tc.verb, f, out.String())
			}
		}
	}
	out.Reset()
	execute([]string{"jobs", "--help"}, &out, &errOut)
	for _, f := range []string{"--server", "--token", "--output", "--ca", "--peers"} {
		if !strings.Contains(out.String(), f) {
			t.Errorf("jobs --help lost the client's %s:\n%s", f, out.String())
		}
	}
}

// TestTopWatch: top --watch redraws (clear screen, timestamp) each
// interval; --count bounds it for scripts and this test.
func TestTopWatch(t *testing.T) {
	_, url := cliBroker(t)
	out, errOut, code := runCLI(t, url, cliUser, "top", "--watch", "500ms", "--count", "2")
	if code != 0 || strings.Count(out, "\x1b[H\x1b[2J") != 2 || strings.Count(out, "NODE") != 2 {
		t.Fatalf("top --watch: %d %q %s", code, out, errOut)
	}
	if _, errOut, code := runCLI(t, url, cliUser, "top", "--watch", "10ms"); code == 0 || !strings.Contains(errOut, "--watch") {
		t.Fatalf("a 10ms watch was accepted: %s", errOut)
	}
}

// TestIDPrefixEverywhere: a unique prefix of a job id works in every verb
// that takes a job (status, logs, explain, job hold/release/priority,
// cancel), as git takes a short hash; an ambiguous prefix is refused
// naming the jobs it matches.
func TestIDPrefixEverywhere(t *testing.T) {
	_, url := cliBroker(t)
	submit := func() string {
		out, errOut, code := runCLI(t, url, cliUser, "run", "--", "true")
		if code != 0 {
			t.Fatalf("run: %d %s", code, errOut)
		}
		return strings.TrimSpace(strings.TrimPrefix(out, "submitted "))
	}
	a, b := submit(), submit()
	common := 0
	for common < len(a) && a[common] == b[common] {
		common++
	}
	p := strings.ToLower(a[:max(common+1, 4)])
	for _, tc := range []struct {
		token string
		args  []string
		want  string
	}{
		{cliUser, []string{"status", p}, a},
		{cliUser, []string{"logs", p}, ""},
		{cliUser, []string{"explain", p}, a},
		{cliUser, []string{"job", "hold", p}, a + " held"},
		{cliUser, []string{"job", "release", p}, a + " released"},
		{cliAdmin, []string{"job", "priority", p, "high"}, "priority high"},
		{cliUser, []string{"cancel", p}, a},
	} {
		out, errOut, code := runCLI(t, url, tc.token, tc.args...)
		if code != 0 || !strings.Contains(out, tc.want) {
			t.Errorf("%s: exit %d\n%s%s", strings.Join(tc.args, " "), code, out, errOut)
		}
	}
	if out, _, _ := runCLI(t, url, cliUser, "status", b); !strings.Contains(out, "pending") {
		t.Errorf("the other job was touched:\n%s", out)
	}
	if common < 4 {
		return // the two ids share less than the shortest prefix resolved
	}
	for _, verb := range [][]string{{"status"}, {"cancel"}, {"job", "hold"}} {
		_, errOut, code := runCLI(t, url, cliUser, append(verb, a[:common])...)
		if code == 0 || !strings.Contains(errOut, "ambiguous") || !strings.Contains(errOut, a) || !strings.Contains(errOut, b) {
			t.Errorf("%s with the ambiguous prefix %s: exit %d\n%s", verb, a[:common], code, errOut)
		}
	}
}

// TestVersionShowsClientAndServer: --version (and `version`) print this
// binary's version and the broker's; with no broker it says so instead of
// failing.
func TestVersionShowsClientAndServer(t *testing.T) {
	_, url := cliBroker(t)
	for _, args := range [][]string{{"--version"}, {"version"}} {
		out, errOut, code := runCLI(t, url, cliUser, args...)
		if code != 0 || !regexp.MustCompile(`(?m)^spillway \S+ \S+/\S+ go\S+\n`).MatchString(out) ||
			!regexp.MustCompile(`(?m)^broker `+regexp.QuoteMeta(url)+`: spillway \S+$`).MatchString(out) {
			t.Errorf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
	}
	out, _, code := runCLI(t, "http://127.0.0.1:1", cliUser, "--version")
	if code != 0 || !strings.Contains(out, "broker http://127.0.0.1:1: not reachable") {
		t.Errorf("--version with no broker: exit %d\n%s", code, out)
	}
	// Over TLS with the broker's own CA (as `make run` serves): --version
	// trusts --ca like every other command.
	srv, _ := cliBroker(t)
	hs := httptest.NewTLSServer(srv.Handler())
	t.Cleanup(hs.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: hs.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCLI(t, hs.URL, cliUser, "--ca", ca, "--version")
	if code != 0 || !regexp.MustCompile(`(?m)^broker `+regexp.QuoteMeta(hs.URL)+`: spillway \S+$`).MatchString(out) {
		t.Errorf("--version over TLS with --ca: exit %d\n%s%s", code, out, errOut)
	}
}

// TestJobsListsActiveUnlessAll: `jobs` lists pending and running jobs
// only; --all adds the finished ones.
func TestJobsListsActiveUnlessAll(t *testing.T) {
	_, url := cliBroker(t)
	ids := map[string]string{}
	for _, name := range []string{"done", "waiting"} {
		out, errOut, code := runCLI(t, url, cliUser, "run", "--name", name, "--", "true")
		if code != 0 {
			t.Fatalf("run: %d %s", code, errOut)
		}
		ids[name] = strings.TrimSpace(strings.TrimPrefix(out, "submitted "))
	}
	if _, errOut, code := runCLI(t, url, cliUser, "cancel", ids["done"]); code != 0 {
		t.Fatalf("cancel: %s", errOut)
	}
	out, errOut, code := runCLI(t, url, cliUser, "jobs")
	if code != 0 || !strings.Contains(out, ids["waiting"]) || strings.Contains(out, ids["done"]) {
		t.Fatalf("jobs: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = runCLI(t, url, cliUser, "jobs", "--all")
	if code != 0 || !strings.Contains(out, ids["waiting"]) || !strings.Contains(out, ids["done"]) {
		t.Fatalf("jobs --all: exit %d\n%s%s", code, out, errOut)
	}
}

// TestOperationsControlsTable: every CLI command in docs/operations.md's
// "Operator controls" table is a command of this binary with the flags
// the row uses (broker/server's TestOperationsControlsAPI checks the API
// column against the routes).
func TestOperationsControlsTable(t *testing.T) {
	rows := operatorControlRows(t)
	cli := regexp.MustCompile("`(spillway [^`]*)`")
	checked := 0
	for _, row := range rows {
		for _, m := range cli.FindAllStringSubmatch(row[1], -1) {
			words := strings.Fields(m[1])
			var path []string
			for _, w := range words[1:] {
				if strings.HasPrefix(w, "-") || strings.ToUpper(w) == w || w == "..." {
					break
				}
				path = append(path, w)
			}
			var out, errOut bytes.Buffer
			execute(append(append([]string{}, path...), "--help"), &out, &errOut)
			if !strings.Contains(out.String(), "\n  spillway "+strings.Join(path, " ")+" ") {
				t.Errorf("%q: no command spillway %s:\n%s", m[1], strings.Join(path, " "), out.String())
				continue
			}
			for _, w := range words {
				if flag, ok := strings.CutPrefix(w, "--"); ok && !strings.Contains(out.String(), "--"+flag+" ") {
					t.Errorf("%q: spillway %s has no flag --%s", m[1], strings.Join(path, " "), flag)
				}
			}
			checked++
		}
	}
	if checked < 10 {
		t.Fatalf("only %d CLI commands found in the table", checked)
	}
}

// operatorControlRows reads the table under docs/operations.md's
// "## Operator controls": each row's cells (what, CLI, API).
func operatorControlRows(t *testing.T) [][]string {
	t.Helper()
	raw, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(raw), "\n## Operator controls\n")
	if !ok {
		t.Fatal("docs/operations.md has no \"## Operator controls\" section")
	}
	var rows [][]string
	for _, line := range strings.Split(section, "\n") {
		if strings.HasPrefix(line, "## ") || strings.HasPrefix(line, "### ") {
			break
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if !strings.HasPrefix(line, "| ") || len(cells) != 3 || cells[0] == "what" || strings.HasPrefix(cells[0], "---") {
			continue
		}
		rows = append(rows, cells)
	}
	return rows
}
