package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/broker/bolt"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/oidctest"
	"github.com/spillway-dev/spillway/broker/server"
)

// hostile is a job name and command that would clear the screen and
// write the clipboard (OSC 52) if printed raw.
const hostile = "\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07"

// TestFinding5TerminalEscapes: job and spec strings reach the terminal
// escaped through status, explain, jobs and queue, and raw only with --raw.
func TestFinding5TerminalEscapes(t *testing.T) {
	srv, url := cliBroker(t)
	spec := writeSpec(t, "name: evil\nresources: {gpus: 1}\ncommand: [\"echo\", \"\\e]52;c;cm0gLXJmIH4=\\a\"]\nenv: {X: \"\\e[31m\"}\n")
	out, errOut, code := runCLI(t, url, cliUser, "submit", "-f", spec)
	if code != 0 {
		t.Fatalf("submit: %d %q %q", code, out, errOut)
	}
	if strings.ContainsAny(out+errOut, "\x1b\x07") {
		t.Fatalf("submit printed raw escapes: %q %q", out, errOut)
	}
	job := ""
	for _, f := range strings.Fields(out + " " + errOut) {
		if f = strings.TrimSuffix(f, ";"); len(f) == 26 {
			job = f
		}
	}
	if job == "" {
		t.Fatalf("no job id in %q %q", out, errOut)
	}
	if err := srv.Cycle(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"status", job}, {"explain", job}, {"jobs"}, {"queue"}, {"nodes"}, {"-o", "json", "status", job},
	} {
		out, errOut, code := runCLI(t, url, cliUser, args...)
		if code != 0 {
			t.Fatalf("%v: %d %q", args, code, errOut)
		}
		if strings.ContainsAny(out+errOut, "\x1b\x07") {
			t.Fatalf("%v printed raw escapes:\n%q", args, out+errOut)
		}
	}
	out, _, _ = runCLI(t, url, cliUser, "status", job)
	if !strings.Contains(out, `\x1b]52;c;`) {
		t.Fatalf("status does not show the command's escape as text: %q", out)
	}
	out, _, _ = runCLI(t, url, cliUser, "--raw", "status", job)
	if !strings.Contains(out, "\x1b]52;c;") {
		t.Fatalf("--raw status does not show the command as is: %q", out)
	}
	// An error message quoting a tenant's string is escaped too.
	_, errOut, _ = runCLI(t, url, cliUser, "status", hostile)
	if strings.ContainsAny(errOut, "\x1b\x07") {
		t.Fatalf("error printed raw escapes: %q", errOut)
	}
}

func TestEscapeWriterSplitRunes(t *testing.T) {
	var b strings.Builder
	w := newEscapeWriter(&b)
	in := "héllo\x1b[0m\u009b\u202eok\n\xff"
	for i := 0; i < len(in); i++ {
		w.Write([]byte{in[i]})
	}
	w.Flush()
	if got, want := b.String(), `héllo\x1b[0m\u009b\u202eok`+"\n"+`\xff`; got != want {
		t.Fatalf("escaped %q, want %q", got, want)
	}
}

// TestFinding8CancelNoPanic: `spillway cancel` reports an answer that is
// not a job instead of panicking.
func TestFinding8CancelNoPanic(t *testing.T) {
	odd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/cancel") && strings.Contains(r.URL.Path, "J2") {
			w.Write([]byte(`{"id":"J2","state":"running"}`))
			return
		}
		w.Write([]byte(`{}`))
	}))
	defer odd.Close()
	t.Setenv("SPILLWAY_CONFIG", t.TempDir()+"/none")
	out, errOut, code := runCLI(t, odd.URL, cliUser, "cancel", "J1", "J2")
	if code != 1 || !strings.Contains(errOut, "names no job") || !strings.Contains(out, "J2 stopping") {
		t.Fatalf("cancel: %d %q %q", code, out, errOut)
	}
}

// TestNodeTokenCreateAndRevokeCLI: an operator creates a join token, an
// agent body enrols with it, and `spillway node revoke` ends it.
func TestNodeTokenCreateAndRevokeCLI(t *testing.T) {
	_, url := cliBroker(t)
	out, errOut, code := runCLI(t, url, cliAdmin, "node", "token", "create", "--expires", "1h", "--max-gpus", "2")
	tok := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(tok, "spjoin.") || !strings.Contains(errOut, "single use") {
		t.Fatalf("create: %d %q %q", code, out, errOut)
	}
	body := `{"joinToken": "` + tok + `", "node": "gpu-a"}`
	resp, err := http.Post(url+"/v1/agent/enrol", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("enrol: %d", resp.StatusCode)
	}
	out, _, code = runCLI(t, url, cliAdmin, "node", "token", "list")
	if code != 0 || !strings.Contains(out, "gpu-a at") {
		t.Fatalf("list: %d %q", code, out)
	}
	out, errOut, code = runCLI(t, url, cliAdmin, "node", "revoke", "gpu-a")
	if code != 0 || !strings.Contains(out, "1 credential(s) revoked") {
		t.Fatalf("revoke: %d %q %q", code, out, errOut)
	}
	if _, _, code = runCLI(t, url, cliUser, "node", "token", "create"); code == 0 {
		t.Fatal("a user created a join token")
	}
}

// TestAuditCLI: `spillway audit` shows who did what; `audit export` writes CSV.
func TestAuditCLI(t *testing.T) {
	_, url := cliBroker(t)
	runCLI(t, url, cliUser, "submit", "-f", writeSpec(t, "resources: {gpus: 1}\ncommand: [\"true\"]\n"))
	out, errOut, code := runCLI(t, url, cliAdmin, "audit", "--from", "1h")
	if code != 0 || !strings.Contains(out, "alice") || !strings.Contains(out, "POST /v1/jobs") || !strings.Contains(out, "201") {
		t.Fatalf("audit: %d %q %q", code, out, errOut)
	}
	file := t.TempDir() + "/audit.csv"
	if _, errOut, code = runCLI(t, url, cliAdmin, "audit", "export", "-f", file); code != 0 {
		t.Fatalf("export: %s", errOut)
	}
	raw, _ := os.ReadFile(file)
	if !strings.HasPrefix(string(raw), "at,by,role") || !strings.Contains(string(raw), "alice,user,POST /v1/jobs") {
		t.Fatalf("export: %q", raw)
	}
	if _, _, code = runCLI(t, url, cliUser, "audit"); code == 0 {
		t.Fatal("a user read the audit log")
	}
}

// TestLoginDeviceFlowCLI: `spillway login` runs the device flow against a
// real (test) OIDC provider, saves the broker session in the CLI config,
// and later verbs act as the person with the team the rules give.
func TestLoginDeviceFlowCLI(t *testing.T) {
	p := oidctest.New("spillway-cli", "")
	defer p.Close()
	p.Claims = map[string]any{"sub": "u-7", "email": "dana@example.com", "groups": []string{"ml-nlp"}}
	dir := t.TempDir()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`listen: 127.0.0.1:0
dataDir: %s
auth:
  tokens:
    - {name: admin, role: operator, token: %s}
oidc:
  issuer: %s
  clientID: spillway-cli
  rules:
    - {claim: groups, value: ml-nlp, role: user, team: nlp}
`, dir, cliAdmin, p.URL)))
	if err != nil {
		t.Fatal(err)
	}
	st, err := bolt.Open(filepath.Join(dir, "spillway.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv, err := server.New(context.Background(), cfg, st, server.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	cliCfg := filepath.Join(dir, "cli-config")
	t.Setenv("SPILLWAY_CONFIG", cliCfg)
	t.Setenv("SPILLWAY_TOKEN", "")
	t.Setenv("SPILLWAY_SERVER", "")
	var out, errb bytes.Buffer
	if code := execute([]string{"--server", hs.URL, "login"}, &out, &errb); code != 0 {
		t.Fatalf("login: %d %s %s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "logged in as dana@example.com (user, team nlp)") || !strings.Contains(errb.String(), "WDJB-MJHT") {
		t.Fatalf("login said %q %q", out.String(), errb.String())
	}
	raw, _ := os.ReadFile(cliCfg)
	if !strings.Contains(string(raw), "token: spsess.") {
		t.Fatalf("cli config: %q", raw)
	}
	out.Reset()
	errb.Reset()
	if code := execute([]string{"submit", "-f", writeSpec(t, "resources: {gpus: 1}\ncommand: [\"true\"]\n")}, &out, &errb); code != 0 {
		t.Fatalf("submit with the session: %d %s", code, errb.String())
	}
	out.Reset()
	if code := execute([]string{"-o", "json", "jobs"}, &out, &errb); code != 0 || !strings.Contains(out.String(), `"user": "dana@example.com"`) {
		t.Fatalf("jobs with the session: %d %s %s", code, out.String(), errb.String())
	}
}
