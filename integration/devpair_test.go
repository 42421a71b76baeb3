package integration

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// devBroker starts `spillway dev` in its own dir with one simulated agent
// of one card, and returns it as a cluster viewed with its user token.
func devBroker(t *testing.T, dir string) (*cluster, *proc) {
	t.Helper()
	addr := freePort(t)
	dev := start(t, "dev "+filepath.Base(dir), "dev", "--dir", dir, "--listen", addr, "--agents", "1",
		"--gpus", "sim:1xH100-80GB", "--write-cli-config=false")
	c := &cluster{t: t, dir: dir, addr: addr, url: "https://" + addr, ca: filepath.Join(dir, "tls", "ca.pem")}
	c.waitHealthy(60 * time.Second)
	tokenLine := regexp.MustCompile(`SPILLWAY_TOKEN=(\S+)`)
	deadline := time.Now().Add(30 * time.Second)
	for c.viewer == "" {
		if m := tokenLine.FindStringSubmatch(dev.output()); m != nil {
			c.viewer = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("dev printed no token:\n%s", dev.output())
		} else {
			time.Sleep(50 * time.Millisecond)
		}
	}
	c.waitNodes(1)
	return c, dev
}

var submittedID = regexp.MustCompile(`submitted (\S+)`)

// TestTwoDevBrokersKeepApart: two `spillway dev` brokers on one host,
// each with a node sim-01 of one card, never touch each other's jobs. A
// job of broker B that ends makes B's agent clean its card of strays; if
// the simulated cards had the same UUID on both (they once derived from
// the node name only), that cleanup killed broker A's job on "the same"
// card. A's job ends only when the test says so, and must succeed.
func TestTwoDevBrokersKeepApart(t *testing.T) {
	root := t.TempDir()
	// Jobs run as the team's uid: they must reach files under root.
	os.Chmod(filepath.Dir(root), 0o755)
	os.Chmod(root, 0o755)
	a, _ := devBroker(t, filepath.Join(root, "a"))
	b, _ := devBroker(t, filepath.Join(root, "b"))

	ctx := context.Background()
	na, err := a.client(a.viewer).Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nb, err := b.client(b.viewer).Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(na) != 1 || len(nb) != 1 || na[0].Name != nb[0].Name {
		t.Fatalf("want one node of the same name on each broker, got %d and %d", len(na), len(nb))
	}
	ua, ub := na[0].Inventory.Devices[0].UUID, nb[0].Inventory.Devices[0].UUID
	if ua == ub {
		t.Fatalf("both brokers' %s have card %s", na[0].Name, ua)
	}

	stop := filepath.Join(root, "stop")
	out, errOut, code := a.cli(a.viewer, "run", "--gpus", "1", "--time", "10m", "--", "sh", "-c",
		`while [ ! -e `+stop+` ]; do sleep 0.1; done; echo "A done on $CUDA_VISIBLE_DEVICES"`)
	m := submittedID.FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("submit to A: exit %d\n%s%s", code, out, errOut)
	}
	jobA := m[1]
	a.waitJob(jobA, 60*time.Second, "running", func(s string) bool { return s == "running" })

	// B's job starts and ends on B's sim-01; its agent cleans the card.
	out, errOut, code = b.cli(b.viewer, "run", "--gpus", "1", "--time", "5m", "--wait", "--", "sh", "-c", "echo B on $CUDA_VISIBLE_DEVICES")
	if code != 0 || !strings.Contains(out, "B on "+ub) {
		t.Fatalf("B's job: exit %d\n%s%s", code, out, errOut)
	}
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if st := a.waitJob(jobA, 60*time.Second, "ended", func(s string) bool {
		return s == "succeeded" || s == "failed" || s == "cancelled" || s == "timed_out"
	}); st != "succeeded" {
		logs, _, _ := a.cli(a.viewer, "logs", jobA)
		t.Fatalf("A's job ended %s after B's job ran on a card of the same name:\n%s", st, logs)
	}
	logs, _, _ := a.cli(a.viewer, "logs", jobA)
	if !strings.Contains(logs, "A done on "+ua) {
		t.Fatalf("A's job log: %q", logs)
	}
}

// TestJobTrustsBrokerCA: against a broker serving HTTPS from a private CA
// (spillway dev's), a job's own spillway calls work with nothing set by
// hand: the agent hands the CA it trusts the broker by to the job
// (SPILLWAY_CA, a file in the attempt's directory the job's uid reads).
func TestJobTrustsBrokerCA(t *testing.T) {
	root := t.TempDir()
	// Jobs run as the team's uid: they must reach files under root.
	os.Chmod(filepath.Dir(root), 0o755)
	os.Chmod(root, 0o755)
	c, _ := devBroker(t, filepath.Join(root, "dev"))
	out, errOut, code := c.cli(c.viewer, "run", "--gpus", "1", "--time", "5m", "--wait", "--", "sh", "-c",
		`test -r "$SPILLWAY_CA" && echo "ca at $SPILLWAY_CA" && `+bin+` units 7 --kind samples`)
	if code != 0 {
		t.Fatalf("the job's spillway units failed: exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, "ca at ") || !regexp.MustCompile(`\b7\b`).MatchString(out) {
		t.Fatalf("job output: %q", out)
	}
	if strings.Contains(out, "ca at "+c.ca) {
		t.Fatalf("the job was given the broker's own CA path, not a copy in its directory: %q", out)
	}
}
