package integration

import (
	"bufio"
	"context"
	"github.com/spillway-dev/spillway/onprem/wire"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestDemoBurst runs the README's "Watch a burst" script
// (deploy/demo/burst.sh, shown verbatim in the README) against `spillway
// dev --burst` and checks every step it prints: the owned fleet full, the
// burst with its live steps (requested, created, booted, host key,
// uploads, registered), the job's output from the rented machine, the
// idle machine deleted, the budget refusing the next burst, and the bill
// split into owned usage, cloud usage and cloud overhead.
func TestDemoBurst(t *testing.T) {
	script, err := os.ReadFile("../deploy/demo/burst.sh")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "```sh\n"+string(script)+"```\n") {
		t.Fatal("README.md does not show deploy/demo/burst.sh verbatim in a ```sh block; copy the script into the README's \"Watch a burst\" section")
	}

	dir := t.TempDir()
	addr := freePort(t)
	dev := exec.Command(bin, "dev", "--burst", "--dir", filepath.Join(dir, "dev"), "--listen", addr, "--write-cli-config=false")
	dev.Env = append(os.Environ(), "HOME="+dir)
	stdout, err := dev.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	devErr := &lockedLog{}
	dev.Stderr = devErr
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	t.Cleanup(func() {
		_ = dev.Process.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = dev.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("spillway dev --burst log:\n%s", devErr.String())
		}
	})
	banner := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sent := false
		for sc.Scan() {
			if tok, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "user token (team nlp):"); ok && !sent {
				banner <- strings.TrimSpace(tok)
				sent = true
			}
		}
		_ = dev.Wait()
		close(exited)
	}()
	var token string
	select {
	case token = <-banner:
	case <-exited:
		t.Fatalf("spillway dev --burst exited:\n%s", devErr.String())
	case <-time.After(60 * time.Second):
		t.Fatal("no banner from spillway dev --burst within 60 s")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	run := exec.CommandContext(ctx, "sh", "../deploy/demo/burst.sh")
	run.Env = append(os.Environ(), "HOME="+dir, "SPILLWAY="+bin, "SPILLWAY_SERVER=https://"+addr, "SPILLWAY_TOKEN="+token,
		"SPILLWAY_CA="+filepath.Join(dir, "dev", "tls", wire.CAFileName))
	out, err := run.CombinedOutput()
	t.Logf("deploy/demo/burst.sh printed:\n%s", out)
	if err != nil {
		t.Fatalf("the demo script failed: %v", err)
	}
	// The scale-down is not a lost node: the broker logs the machine
	// ended at INFO, never a WARN "node lost".
	if log := devErr.String(); !strings.Contains(log, `msg="burst machine ended"`) || strings.Contains(log, `msg="node lost"`) {
		t.Errorf("the scale-down was not logged as an ended machine, or was logged as a lost node")
	}
	for _, step := range []struct{ what, re string }{
		{"the owned fleet is full", `sim-01\s+onprem\s+ready\s+2\s+0\s`},
		{"the job waits for the minimum before bursting", `spillway: pending: waiting \d+s of the 5s minimum before bursting`},
		{"the burst is requested with its projected cost", `burst spw-\S+: requested: local-ec2 g5\.xlarge for 1 waiting job\(s\), projected 1\.00 USD`},
		{"the cloud creates the machine", `burst spw-\S+: provisioning: created local-ec2 i-\d+`},
		{"the machine boots", `burst spw-\S+: bootstrapping: booted, reachable at 127\.0\.0\.\d+:\d+`},
		{"its host key is verified", `burst spw-\S+: host key SHA256:\S+ verified against the provider`},
		{"the binary is uploaded", `burst spw-\S+: upload binary: ok`},
		{"the agent config is uploaded", `burst spw-\S+: upload config: ok`},
		{"the agent starts", `burst spw-\S+: start agent \(supervised\): ok`},
		{"the agent registers", `burst spw-\S+: ready: agent registered after \d+s`},
		{"the job runs on the rented machine", `hello from the burst machine, card GPU-[0-9a-f-]+`},
		{"the job succeeds", `spillway: \S+ succeeded: exit code 0`},
		{"the idle machine is deleted", `spw-\S+\s+local-ec2\s+g5\.xlarge\s+1\s+terminated`},
		{"the budget blocks the next burst", `Waiting:\s+burst blocked: global budget [0-9.]+/2\.50 USD this month \(needs 4\.00 more\)`},
		{"the budget shows the spend", `global\s+\d{4}-\d{2}\s+2\.50 USD\s+0\.\d\d`},
		{"the bill has the rented machine's idle time", `cloud\s+overhead\s+\d`},
		{"the bill has the cloud usage", `cloud\s+usage\s+\d`},
		{"the bill has the owned usage", `onprem\s+usage\s+\d`},
	} {
		if !regexp.MustCompile(step.re).Match(out) {
			t.Errorf("%s: no line matches %s", step.what, step.re)
		}
	}
}

// lockedLog is a log written by a command and read by the test.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
