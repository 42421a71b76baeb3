package integration

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/client"
)

var simUUID = regexp.MustCompile(`GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// TestQuickstart is the README's first minutes: a server and an agent as
// separate processes, a job through the CLI, its log.
func TestQuickstart(t *testing.T) {
	c := newCluster(t, "")
	c.agent("node-a", "sim:8xH100-80GB")
	c.waitNodes(1)

	out, errOut, code := c.cli(tokAlice, "run", "--gpus", "1", "--time", "5m", "--wait", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES; echo done")
	if code != 0 {
		t.Fatalf("run --wait exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	if !simUUID.MatchString(out) || !strings.Contains(out, "done") {
		t.Fatalf("job output lacks a simulated GPU UUID: %q", out)
	}
	id := regexp.MustCompile(`submitted (\S+);`).FindStringSubmatch(errOut)
	if id == nil {
		t.Fatalf("no job id in %q", errOut)
	}
	logs, _, code := c.cli(tokAlice, "logs", id[1])
	if code != 0 || logs != out {
		t.Fatalf("logs = %q (exit %d), want %q", logs, code, out)
	}
	status, _, _ := c.cli(tokAlice, "status", id[1])
	for _, want := range []string{"succeeded", "submitted", "scheduled", "started", "exited"} {
		if !strings.Contains(status, want) {
			t.Errorf("status lacks %q:\n%s", want, status)
		}
	}
	// Exit codes pass through --wait.
	_, _, code = c.cli(tokAlice, "run", "--gpus", "1", "--time", "1m", "--wait", "--", "sh", "-c", "exit 7")
	if code != 7 {
		t.Fatalf("failing job: exit %d, want 7", code)
	}
	// An array through run --wait: every element waited for, the ones
	// that failed named, the highest exit code out, as sbatch --wait
	// --array does.
	out, errOut, code = c.cli(tokAlice, "run", "--no-upload", "--gpus", "1", "--time", "1m", "--array", "0-4", "--wait", "--",
		"sh", "-c", "exit $((SPILLWAY_ARRAY_INDEX % 3))")
	if code != 2 || out != "" || !regexp.MustCompile(`array \w+: 3 did not succeed: sh\[1\] failed \(\w+, exit 1\); sh\[2\] failed \(\w+, exit 2\); sh\[4\] failed \(\w+, exit 1\)\n$`).MatchString(errOut) ||
		!strings.Contains(errOut, "2 succeeded, 3 failed\n") {
		t.Fatalf("run --array --wait: exit %d, want 2\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	t.Logf("run --array --wait, stderr:\n%s", errOut)
	_, errOut, code = c.cli(tokAlice, "run", "--no-upload", "--gpus", "1", "--time", "1m", "--array", "0-2", "--wait", "--", "true")
	if code != 0 || !strings.HasSuffix(errOut, ": every element succeeded\n") {
		t.Fatalf("run --array --wait of good jobs: exit %d\nstderr: %s", code, errOut)
	}
	// A spec file through submit, and a rejected one naming its field.
	spec := filepath.Join(c.dir, "job.yaml")
	os.WriteFile(spec, []byte("name: bad\nresources: {gpus: 64}\ncommand: [\"true\"]\n"), 0o600)
	_, errOut, code = c.cli(tokAlice, "submit", "-f", spec)
	if code == 0 || !strings.Contains(errOut, "resources.gpus") {
		t.Fatalf("bad spec: exit %d, stderr %q", code, errOut)
	}
}

// TestAuthAcrossTeams: no token is 401; team vision cannot see, cancel or
// read the logs of team nlp's job.
func TestAuthAcrossTeams(t *testing.T) {
	c := newCluster(t, "")
	resp, err := http.Get(c.url + "/v1/jobs")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: %d", resp.StatusCode)
	}
	ctx := context.Background()
	j, err := c.client(tokAlice).SubmitSpec(ctx, broker.Spec{Resources: broker.Resources{GPUs: 1}, Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	bob := c.client(tokBob)
	if _, err := bob.Job(ctx, j.ID); !client.IsNotFound(err) {
		t.Errorf("bob get: %v", err)
	}
	if _, err := bob.Cancel(ctx, j.ID); !client.IsNotFound(err) {
		t.Errorf("bob cancel: %v", err)
	}
	if err := bob.Logs(ctx, j.ID, client.LogOptions{Tail: -1}, os.Stderr); !client.IsNotFound(err) {
		t.Errorf("bob logs: %v", err)
	}
	_, errOut, code := c.cli(tokBob, "cancel", j.ID)
	if code == 0 || !strings.Contains(errOut, "not found") {
		t.Errorf("bob cancel via CLI: %d %q", code, errOut)
	}
	if got, _ := c.client(tokAlice).Job(ctx, j.ID); got.State.Terminal() {
		t.Errorf("bob's cancel touched the job: %s", got.State)
	}
}

// TestBrokerKill9 kills the broker while jobs run and restarts it: every
// job and its history is still there, and running jobs are reconciled with
// the agent — the one still running goes on, the one that ended while the
// broker was down is recorded.
func TestBrokerKill9(t *testing.T) {
	c := newCluster(t, "")
	c.agent("node-a", "sim:8xH100-80GB")
	c.waitNodes(1)
	ctx := context.Background()
	cl := c.client(tokAlice)
	mark := filepath.Join(c.dir, "release")
	long, _ := cl.SubmitSpec(ctx, broker.Spec{Resources: broker.Resources{GPUs: 2}, Timeout: broker.Duration(time.Minute),
		Command: []string{"sh", "-c", "echo started; while [ ! -e " + mark + " ]; do sleep 0.1; done; echo released"}})
	// The short job runs until the broker is down, then ends.
	shortPid, shortGo := filepath.Join(c.dir, "short.pid"), filepath.Join(c.dir, "short.go")
	short, _ := cl.SubmitSpec(ctx, broker.Spec{Resources: broker.Resources{GPUs: 1}, Timeout: broker.Duration(time.Minute),
		Command: []string{"sh", "-c", "echo $$ > " + shortPid + "; while [ ! -e " + shortGo + " ]; do sleep 0.1; done; echo short done"}})
	queued, _ := cl.SubmitSpec(ctx, broker.Spec{Resources: broker.Resources{GPUs: 8}, Timeout: broker.Duration(time.Minute),
		Command: []string{"true"}})
	c.waitJob(long.ID, 10*time.Second, "running", func(s string) bool { return s == "running" })
	c.waitJob(short.ID, 10*time.Second, "running", func(s string) bool { return s == "running" })
	before, _ := cl.Job(ctx, long.ID)
	var pid int
	waitFor(t, 30*time.Second, "the short job's pid file", func() bool {
		raw, _ := os.ReadFile(shortPid)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(raw)))
		return pid > 0
	})

	c.broker.kill() // SIGKILL
	if err := os.WriteFile(shortGo, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the short job to end while the broker is down", func() bool { return syscall.Kill(pid, 0) != nil })
	c.startBroker()

	after, err := cl.Job(ctx, long.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(after.History) < len(before.History) {
		t.Fatalf("history shrank across the crash: %v → %v", before.History, after.History)
	}
	for i := range before.History {
		if before.History[i].To != after.History[i].To || !before.History[i].At.Equal(after.History[i].At) {
			t.Fatalf("history entry %d changed: %+v → %+v", i, before.History[i], after.History[i])
		}
	}
	c.waitJob(short.ID, 10*time.Second, "recorded as succeeded", func(s string) bool { return s == "succeeded" })
	if j, _ := cl.Job(ctx, long.ID); j.State != broker.StateRunning {
		t.Fatalf("long job after restart: %s", j.State)
	}
	os.WriteFile(mark, nil, 0o600)
	c.waitJob(long.ID, 10*time.Second, "succeeded", func(s string) bool { return s == "succeeded" })
	c.waitJob(queued.ID, 10*time.Second, "succeeded", func(s string) bool { return s == "succeeded" })
	var buf strings.Builder
	if err := cl.Logs(ctx, long.ID, client.LogOptions{Tail: -1}, &buf); err != nil || buf.String() != "started\nreleased\n" {
		t.Fatalf("log across the crash = %q, %v", buf.String(), err)
	}
}

// TestDevServesQuickly: `spillway dev` (what `make run` starts) serves
// /healthz within 30 s, runs the README's first command, and stops cleanly
// on Ctrl-C.
func TestDevServesQuickly(t *testing.T) {
	dir := t.TempDir()
	addr := freePort(t)
	t0 := time.Now()
	dev := start(t, "dev", "dev", "--dir", filepath.Join(dir, "dev"), "--listen", addr, "--write-cli-config=false")
	// The README's tour: dev serves HTTPS from its own CA.
	c := &cluster{t: t, dir: dir, addr: addr, url: "https://" + addr, ca: filepath.Join(dir, "dev", "tls", "ca.pem")}
	c.waitHealthy(30 * time.Second)
	t.Logf("healthy after %s", time.Since(t0))
	tokenLine := regexp.MustCompile(`SPILLWAY_TOKEN=(\S+)`)
	var token string
	waitFor(t, 30*time.Second, "dev to print its token", func() bool {
		if m := tokenLine.FindStringSubmatch(dev.output()); m != nil {
			token = m[1]
		}
		return token != ""
	})
	c.viewer = token
	c.waitNodes(2)
	out, _, code := c.cli(token, "run", "--gpus", "1", "--time", "5m", "--wait", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES")
	if code != 0 || !simUUID.MatchString(out) {
		t.Fatalf("README command: exit %d, output %q", code, out)
	}
	if err := dev.stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
}
