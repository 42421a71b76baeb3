package integration

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/onprem/runtime/ocitest"
)

// cliIn runs the CLI from dir (spillway run uploads its working dir).
func (c *cluster) cliIn(dir, token string, args ...string) (stdout, stderr string, code int) {
	c.t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SPILLWAY_SERVER="+c.url, "SPILLWAY_TOKEN="+token, "SPILLWAY_CONFIG=/nonexistent")
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			c.t.Fatal(err)
		}
		code = ee.ExitCode()
	}
	return o.String(), e.String(), code
}

// ociAgent starts an agent with the oci runtime.
func (c *cluster) ociAgent(name, conf string, tlsVerify bool) *proc {
	c.t.Helper()
	cfg := filepath.Join(c.dir, "agent-"+name+".yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("runtime:\n  kind: oci\n  podman: {containersConf: %s, tlsVerify: %t}\n", conf, tlsVerify)), 0o600)
	return start(c.t, "agent "+name, "agent", "-c", cfg, "--broker", c.url, "--token", tokAgent, "--name", name,
		"--gpus", "sim:2xH100-80GB,seed="+filepath.Base(c.dir), "--data-dir", filepath.Join(c.dir, "agent-"+name))
}

// codeDir is a user's project directory holding input.txt.
func codeDir(t *testing.T) string {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "input.txt"), []byte("hello from the laptop\n"), 0o644)
	os.WriteFile(filepath.Join(dir, ".spillwayignore"), []byte("data/\n"), 0o644)
	os.MkdirAll(filepath.Join(dir, "data"), 0o755)
	os.WriteFile(filepath.Join(dir, "data", "big.bin"), bytes.Repeat([]byte("x"), 3<<20), 0o644)
	return dir
}

var submittedRe = regexp.MustCompile(`submitted (\S+);`)

// TestRunImageWithWorkdir: `spillway run --image … -- sh -c 'cat
// input.txt'` from a directory holding input.txt succeeds on a simulated
// agent with the oci runtime; a resubmit does not upload again; an
// unknown image fails with "image not found" in status and explain; a job
// past its memory limit is OOM-killed and explain says so.
func TestRunImageWithWorkdir(t *testing.T) {
	ocitest.Require(t)
	conf := ocitest.ContainersConf(t)
	img := ocitest.Busybox(t, conf)
	c := newCluster(t, "")
	c.ociAgent("oci-a", conf, true)
	c.waitNodes(1)
	dir := codeDir(t)

	out, errOut, code := c.cliIn(dir, tokAlice, "run", "--image", img, "--gpus", "1", "--time", "5m", "--wait", "--",
		"sh", "-c", "cat input.txt; ls data 2>&1 | head -1; echo $CUDA_VISIBLE_DEVICES; id -u")
	if code != 0 || !strings.Contains(out, "hello from the laptop") || !simUUID.MatchString(out) {
		t.Fatalf("run: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	if !strings.Contains(errOut, "uploaded the working directory") || strings.Contains(out, "big.bin") {
		t.Fatalf("the upload should skip data/ (.spillwayignore): stdout %q stderr %q", out, errOut)
	}
	if strings.Contains(out, "\n0\n") {
		t.Fatalf("the job ran as root: %q", out)
	}
	// Resubmitting the same directory uploads nothing.
	_, errOut, code = c.cliIn(dir, tokAlice, "run", "--image", img, "--gpus", "1", "--time", "5m", "--wait", "--", "cat", "input.txt")
	if code != 0 || !strings.Contains(errOut, "unchanged since its last upload") {
		t.Fatalf("resubmit: exit %d, stderr %q", code, errOut)
	}

	// An image no registry has: failed at once, "image not found" in
	// status and explain, no retry.
	_, errOut, _ = c.cliIn(dir, tokAlice, "run", "--image", "127.0.0.1:1/nlp/nope:1", "--gpus", "1", "--time", "5m",
		"--wait", "--", "true")
	m := submittedRe.FindStringSubmatch(errOut)
	if m == nil {
		t.Fatalf("no job id in %q", errOut)
	}
	status, _, _ := c.cli(tokAlice, "status", m[1])
	if !strings.Contains(status, "failed") || !strings.Contains(status, "image not found") || !strings.Contains(status, "Attempt:           1 ") {
		t.Fatalf("status of the unknown image:\n%s", status)
	}
	explain, _, _ := c.cli(tokAlice, "explain", m[1])
	if !strings.Contains(explain, "runtime: image not found") || !strings.Contains(explain, "could not find image") {
		t.Fatalf("explain of the unknown image:\n%s", explain)
	}

	// Past its memory limit: OOM-killed by the limit, said before the log.
	_, errOut, _ = c.cliIn(dir, tokAlice, "run", "--image", img, "--memory", "32Mi", "--gpus", "1", "--time", "5m", "--wait", "--",
		"sh", "-c", `echo allocating; x=$(head -c 100000000 /dev/zero | tr '\0' a); echo survived`)
	m = submittedRe.FindStringSubmatch(errOut)
	if m == nil {
		t.Fatalf("no job id in %q", errOut)
	}
	explain, _, _ = c.cli(tokAlice, "explain", m[1])
	rt := strings.Index(explain, "runtime: OOM-killed by its memory limit (resources.memory 32Mi)")
	lg := strings.Index(explain, "| allocating")
	if rt < 0 || lg < 0 || rt > lg || !strings.Contains(explain, "not by a shortage on the node") {
		t.Fatalf("explain of the OOM job (runtime line before the log):\n%s", explain)
	}
}

// TestRunWorkdirOnProcessAgent: the same upload on a node with the
// hardened process runtime.
func TestRunWorkdirOnProcessAgent(t *testing.T) {
	c := newCluster(t, "")
	c.agent("node-a", "sim:2xH100-80GB")
	c.waitNodes(1)
	dir := codeDir(t)
	out, errOut, code := c.cliIn(dir, tokAlice, "run", "--gpus", "1", "--time", "5m", "--wait", "--", "sh", "-c", "cat input.txt; pwd")
	if code != 0 || !strings.Contains(out, "hello from the laptop") {
		t.Fatalf("run: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
}

// TestRunWorkdirOverCap: a working directory over the cap is refused by
// the CLI before anything is sent.
func TestRunWorkdirOverCap(t *testing.T) {
	c := newCluster(t, "")
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "weights.bin"), bytes.Repeat([]byte("w"), 2<<20), 0o644)
	_, errOut, code := c.cliIn(dir, tokAlice, "run", "--workdir-max", "1Mi", "--gpus", "1", "--time", "5m", "--", "true")
	if code == 0 || !strings.Contains(errOut, "over the 1.0 MiB cap") || !strings.Contains(errOut, "weights.bin") || !strings.Contains(errOut, ".spillwayignore") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if entries, _ := os.ReadDir(filepath.Join(c.dir, "data", "uploads")); len(entries) != 0 {
		t.Fatalf("something was uploaded: %v", entries)
	}
	jobs, _, _ := c.cli(tokAlice, "jobs")
	if strings.Contains(jobs, "true") {
		t.Fatalf("a job was submitted: %s", jobs)
	}
}

// TestPullProgressInStatus: while the node pulls the job's image,
// `spillway status` says how far it got.
func TestPullProgressInStatus(t *testing.T) {
	ocitest.Require(t)
	conf := ocitest.ContainersConf(t)
	reg := ocitest.NewRegistry(t)
	img := reg.Push("nlp/train", fmt.Sprint(time.Now().UnixNano()), ocitest.RootfsWithPadding(t, 60<<20))
	t.Cleanup(func() { _ = ocitest.Podman(conf, "rmi", "-f", img).Run() })
	release := make(chan struct{})
	reg.Gate = func() { <-release }
	c := newCluster(t, "")
	c.ociAgent("oci-a", conf, false)
	c.waitNodes(1)
	_, errOut, code := c.cliIn(t.TempDir(), tokAlice, "run", "--no-upload", "--image", img, "--gpus", "1", "--time", "5m", "--", "echo", "pulled")
	if code != 0 {
		t.Fatalf("run: %d %s", code, errOut)
	}
	out, _, _ := c.cli(tokAlice, "jobs", "-o", "json")
	m := regexp.MustCompile(`"id":\s*"([0-9A-Z]+)"`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no job in %s", out)
	}
	progress := regexp.MustCompile(`Starting:\s+pulling image (\d+)/65 MB`)
	deadline := time.Now().Add(60 * time.Second)
	var status string
	for {
		var serr string
		status, serr, _ = c.cli(tokAlice, "status", m[1])
		status += serr
		if p := progress.FindStringSubmatch(status); p != nil && p[1] != "0" {
			break
		}
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("status never showed the pull's progress:\n%s", status)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(status, "starting") {
		t.Fatalf("a pulling job should be starting:\n%s", status)
	}
	close(release)
	deadline = time.Now().Add(60 * time.Second)
	for !strings.Contains(status, "succeeded") {
		if time.Now().After(deadline) {
			t.Fatalf("the job did not finish after the pull:\n%s", status)
		}
		time.Sleep(100 * time.Millisecond)
		status, _, _ = c.cli(tokAlice, "status", m[1])
	}
}
