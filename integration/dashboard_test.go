package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// browserTools finds Chromium, Node.js and playwright-core; without them
// the test skips with what to install, except under CI=true where it fails.
func browserTools(t *testing.T) (chromium, node string) {
	t.Helper()
	chromium = os.Getenv("CHROMIUM")
	if chromium == "" {
		chromium = "/usr/bin/chromium"
	}
	missing := ""
	if _, err := os.Stat(chromium); err != nil {
		missing = "Chromium (apt-get install chromium)"
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing = "Node.js (apt-get install nodejs npm)"
	}
	if _, err := os.Stat("browser/node_modules/playwright-core/package.json"); err != nil && missing == "" {
		missing = "playwright-core (cd integration/browser && npm ci)"
	}
	if missing != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the dashboard test needs %s; .ci/run installs it", missing)
		}
		t.Skipf("the dashboard test needs %s; .ci/run installs it", missing)
	}
	return chromium, node
}

// TestDashboardInBrowser: a real broker and simulated agent; a person
// opens /ui/ in headless Chromium, is refused with a wrong token, signs in
// with theirs, sees the job they submitted waiting with its pending reason
// and the job running on the card heatmap. The screenshot is saved in
// integration/artifacts/dashboard.png.
func TestDashboardInBrowser(t *testing.T) {
	chromium, node := browserTools(t)
	c := newCluster(t, "")
	c.agent("gpu-a", "sim:4xH100-80GB")
	c.waitNodes(1)
	ctx := context.Background()
	alice := c.client(tokAlice)
	run, err := alice.SubmitSpec(ctx, broker.Spec{Name: "finetune-chat", Resources: broker.Resources{GPUs: 3}, Timeout: broker.Duration(10 * time.Minute),
		Command: []string{"sleep", "300"}, Env: map[string]string{"SIM_GPU_UTIL": "85", "SIM_GPU_MEMORY": "52Gi"}})
	if err != nil {
		t.Fatal(err)
	}
	c.waitJob(run.ID, 30*time.Second, "running", func(s string) bool { return s == "running" })
	// The waiting job is an array's element: the page names it with its
	// index, as the CLI does.
	sub, err := alice.SubmitArraySpec(ctx, broker.Spec{Name: "eval-sweep", Resources: broker.Resources{GPUs: 2}, Timeout: broker.Duration(time.Hour),
		Command: []string{"true"}}, "3")
	if err != nil {
		t.Fatal(err)
	}
	if sub.Array == nil || len(sub.Array.Jobs) != 1 {
		t.Fatalf("array submit answered %+v", sub)
	}
	waitID := sub.Array.Jobs[0]
	deadline := time.Now().Add(20 * time.Second)
	var reason *broker.PendingReason
	for reason == nil && time.Now().Before(deadline) {
		j, err := alice.Job(ctx, waitID)
		if err == nil && j.Pending != nil {
			reason = j.Pending
		}
		time.Sleep(100 * time.Millisecond)
	}
	if reason == nil {
		t.Fatal("the waiting job got no pending reason")
	}
	// The heatmap shows the running job's cards at its utilisation once a
	// telemetry sample of them has arrived.
	waitFor(t, 30*time.Second, "a telemetry sample of the running job's cards", func() bool {
		nodes, err := c.client(tokAdmin).Nodes(ctx)
		if err != nil {
			return false
		}
		sampled := 0
		for _, n := range nodes {
			for _, card := range n.Cards {
				if slices.Contains(card.Jobs, run.ID) && card.Telemetry != nil && card.Telemetry.SMUtil > 0 {
					sampled++
				}
			}
		}
		return sampled == 3
	})

	artifacts, err := filepath.Abs("artifacts")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(artifacts, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(artifacts, "dashboard.png")
	os.Remove(shot)
	cmd := exec.Command(node, "dashboard.mjs")
	cmd.Dir = "browser"
	cmd.Env = append(os.Environ(), "SPILLWAY_URL="+c.url, "SPILLWAY_TOKEN="+tokAlice, "PENDING_JOB="+waitID,
		"RUNNING_JOB="+run.ID, "SCREENSHOT="+shot, "CHROMIUM="+chromium)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	runErr := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { runErr <- cmd.Wait() }()
	select {
	case err = <-runErr:
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatalf("the browser script did not finish in 2 minutes\n%s%s", out.String(), errb.String())
	}
	if err != nil {
		t.Fatalf("browser script: %v\n%s%s", err, out.String(), errb.String())
	}
	var seen struct {
		Refused, Reason, Name, Who, Instances, Budgets string
		Cells, Held                                    int
		Stored                                         bool
		Errors                                         []string
	}
	if err := json.Unmarshal(bytes.TrimSpace(out.Bytes()), &seen); err != nil {
		t.Fatalf("browser output %q: %v", out.String(), err)
	}
	if !strings.Contains(seen.Refused, "refused") {
		t.Errorf("a wrong token was not refused: %q", seen.Refused)
	}
	if !strings.Contains(seen.Reason, reason.Code) || !strings.Contains(seen.Reason, "waiting for 2 GPUs on one node") {
		t.Errorf("pending reason on the page %q, the API says %s: %s", seen.Reason, reason.Code, reason.Message)
	}
	if !strings.Contains(seen.Name, "eval-sweep[3]") {
		t.Errorf("the waiting array element is named %q on the page, want eval-sweep[3]", seen.Name)
	}
	if seen.Cells != 4 || seen.Held != 3 || !strings.Contains(seen.Who, "alice") || !seen.Stored {
		t.Errorf("page: %+v", seen)
	}
	if !strings.Contains(seen.Instances, "No burst machines") {
		t.Errorf("burst section: %q", seen.Instances)
	}
	if len(seen.Errors) > 0 {
		t.Errorf("errors in the page: %q", seen.Errors)
	}
	if st, err := os.Stat(shot); err != nil || st.Size() < 10_000 {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	t.Logf("screenshot: %s", shot)
}
