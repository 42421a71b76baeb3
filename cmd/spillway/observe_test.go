package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/broker/bolt"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/server"
)

const (
	cliUser  = "alice-token-0123456789"
	cliAdmin = "admin-token-012345678"
)

// cliBroker is an in-process broker the CLI verbs talk to; extra is more
// of its config file (top-level keys other than listen, dataDir, auth).
func cliBroker(t *testing.T, extra ...string) (*server.Server, string) {
	t.Helper()
	dir := t.TempDir()
	cfg, err := config.Parse([]byte(fmt.Sprintf(`listen: 127.0.0.1:0
dataDir: %s
auth:
  tokens:
    - {name: alice, role: user, team: nlp, token: %s}
    - {name: admin, role: operator, token: %s}
`, dir, cliUser, cliAdmin) + strings.Join(extra, "")))
	if err != nil {
		t.Fatal(err)
	}
	st, err := bolt.Open(filepath.Join(dir, "spillway.db"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(context.Background(), cfg, st, server.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		st.Close()
	})
	t.Setenv("SPILLWAY_CONFIG", filepath.Join(dir, "no-cli-config"))
	t.Setenv("SPILLWAY_TOKEN", "")
	t.Setenv("SPILLWAY_JOB_TOKEN", "")
	return srv, hs.URL
}

func runCLI(t *testing.T, url, token string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code := execute(append([]string{"--server", url, "--token", token}, args...), &out, &errb)
	return out.String(), errb.String(), code
}

// TestExplainReportUnitsBackupCLI drives the observability verbs end to
// end against a broker: explain prints the walk and the verdict, the
// reports print their tables (and CSV), units are recorded, and backup
// writes a store file.
func TestExplainReportUnitsBackupCLI(t *testing.T) {
	srv, url := cliBroker(t)
	out, errOut, code := runCLI(t, url, cliUser, "submit", "-f", writeSpec(t, "name: eval\nresources: {gpus: 1}\ncommand: [\"true\"]\n"))
	if code != 0 {
		t.Fatalf("submit: %d %s %s", code, out, errOut)
	}
	id := strings.Fields(out + " " + errOut)
	job := ""
	for _, f := range id {
		if len(f) == 26 {
			job = strings.TrimSuffix(f, ";")
		}
	}
	if job == "" {
		t.Fatalf("no job id in %q %q", out, errOut)
	}
	if err := srv.Cycle(context.Background()); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = runCLI(t, url, cliUser, "explain", job)
	if code != 0 || !strings.Contains(out, "1. State: pending") || !strings.Contains(out, "3. Cluster: 0/0 nodes ready") ||
		!strings.Contains(out, "Most likely: ") {
		t.Fatalf("explain: %d\n%s%s", code, out, errOut)
	}
	out, _, code = runCLI(t, url, cliUser, "-o", "json", "explain", job)
	if code != 0 || !strings.Contains(out, `"verdict"`) {
		t.Fatalf("explain json: %d %s", code, out)
	}

	out, errOut, code = runCLI(t, url, cliAdmin, "units", "1500", "--job", job, "--kind", "samples", "--id", "batch-1")
	if code != 0 || !strings.Contains(out, "recorded 1500 samples") {
		t.Fatalf("units: %d %s %s", code, out, errOut)
	}
	out, _, _ = runCLI(t, url, cliAdmin, "units", "1500", "--job", job, "--kind", "samples", "--id", "batch-1")
	if !strings.Contains(out, "already recorded") {
		t.Fatalf("units resend: %s", out)
	}

	out, errOut, code = runCLI(t, url, cliAdmin, "report", "utilization", "--from", "2020-01-01", "--to", "2030-01-01")
	if code != 0 || !strings.Contains(out, "TEAM") || !strings.Contains(out, "TOTAL") || !strings.Contains(out, "Jobs holding GPU memory") {
		t.Fatalf("report utilization: %d\n%s%s", code, out, errOut)
	}
	out, _, code = runCLI(t, url, cliAdmin, "report", "utilization", "--format", "csv", "--from", "2020-01-01", "--to", "2030-01-01")
	if code != 0 || !strings.HasPrefix(out, "team,pool,gpu_model,shift,gpu_hours_allocated") {
		t.Fatalf("report utilization csv: %d %q", code, out)
	}
	out, errOut, code = runCLI(t, url, cliAdmin, "report", "delivery", "--from", "2020-01-01", "--to", "2030-01-01")
	if code != 0 || !strings.Contains(out, "WAIT P50") || !strings.Contains(out, "Cost per unit of output") || !strings.Contains(out, "samples") {
		t.Fatalf("report delivery: %d\n%s%s", code, out, errOut)
	}

	file := filepath.Join(t.TempDir(), "backup.db")
	if _, errOut, code = runCLI(t, url, cliUser, "backup", "-f", file); code == 0 {
		t.Fatalf("a user made a backup: %s", errOut)
	}
	if _, errOut, code = runCLI(t, url, cliAdmin, "backup", "-f", file); code != 0 {
		t.Fatalf("backup: %s", errOut)
	}
	st, err := bolt.Open(file)
	if err != nil {
		t.Fatalf("backup is no store: %v", err)
	}
	st.Close()
}

func writeSpec(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "job.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
