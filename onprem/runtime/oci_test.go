package runtime

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/onprem/runtime/ocitest"
)

func newOCIRuntime(t testing.TB) (*ociRuntime, string) {
	t.Helper()
	ocitest.Require(t)
	conf := ocitest.ContainersConf(t)
	no := false
	rt, err := New(Config{Kind: KindOCI, Users: map[string]string{"nlp": "20901", "vision": "20902"},
		Podman: Podman{ContainersConf: conf, TLSVerify: &no}}, Options{DataDir: t.TempDir(), SimulatedGPUs: true})
	if err != nil {
		t.Fatal(err)
	}
	return rt.(*ociRuntime), ocitest.Busybox(t, conf)
}

// runOCI starts a job and waits for it.
func runOCI(t *testing.T, rt *ociRuntime, j *Job) (Exit, string) {
	t.Helper()
	var out syncBuffer
	j.Output = &out
	if j.Team == "" {
		j.Team = "nlp"
	}
	p, e := rt.Start(context.Background(), j)
	if e != nil {
		t.Fatalf("start %s: %+v (output %q)", j.ID, e, out.String())
	}
	exit := p.Wait()
	t.Cleanup(func() { rt.Forget(j.ID) })
	return exit, out.String()
}

func TestOCIRunsTheImageAsTheTeamsUser(t *testing.T) {
	rt, img := newOCIRuntime(t)
	exit, out := runOCI(t, rt, &Job{ID: "basic-1", Image: img, GPUs: []string{"GPU-aaaa"},
		Env: []string{"CUDA_VISIBLE_DEVICES=GPU-aaaa", "GREETING=hello world", "MULTI=a\nb"},
		Prepare: func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "input.txt"), []byte("from the upload\n"), 0o644)
		},
		Argv: []string{"sh", "-c", `id -u; id -g; pwd; echo "$HOME"; cat input.txt; echo "$GREETING"; echo "$CUDA_VISIBLE_DEVICES"; echo "$MULTI" | wc -l; echo out > own.txt && echo wrote; readlink /proc/self/ns/net; exit 7`}})
	if exit.Code != 7 {
		t.Fatalf("exit %+v, output %q", exit, out)
	}
	hostNet, _ := os.Readlink("/proc/self/ns/net")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []string{"20901", "20901", WorkspaceDir, WorkspaceDir, "from the upload", "hello world", "GPU-aaaa", "2", "wrote"}
	if len(lines) != len(want)+1 {
		t.Fatalf("output %q", out)
	}
	for i, w := range want {
		if strings.TrimSpace(lines[i]) != w {
			t.Fatalf("line %d: got %q, want %q (output %q)", i, lines[i], w, out)
		}
	}
	if lines[len(lines)-1] == hostNet {
		t.Fatalf("the container shares the node's network namespace %s", hostNet)
	}
}

func TestOCIHostNetworkForGangs(t *testing.T) {
	rt, img := newOCIRuntime(t)
	exit, out := runOCI(t, rt, &Job{ID: "gang-1", Image: img, HostNetwork: true, Argv: []string{"readlink", "/proc/self/ns/net"}})
	hostNet, _ := os.Readlink("/proc/self/ns/net")
	if exit.Code != 0 || strings.TrimSpace(out) != hostNet {
		t.Fatalf("exit %+v, output %q; want the host's %s", exit, out, hostNet)
	}
}

func TestOCIMemoryLimit(t *testing.T) {
	rt, img := newOCIRuntime(t)
	exit, out := runOCI(t, rt, &Job{ID: "oom-1", Image: img, Memory: 32 << 20,
		Argv: []string{"sh", "-c", `x=$(head -c 100000000 /dev/zero | tr '\0' a); echo survived`}})
	if exit.Reason != ReasonOOMLimit || !strings.Contains(exit.Message, "OOM-killed by its memory limit (resources.memory 32Mi)") || strings.Contains(out, "survived") {
		t.Fatalf("exit %+v, output %q; want OOM by the limit", exit, out)
	}
	// Under the limit nothing is said.
	exit, out = runOCI(t, rt, &Job{ID: "fits-1", Image: img, Memory: 256 << 20,
		Argv: []string{"sh", "-c", `x=$(head -c 1000000 /dev/zero | tr '\0' a); echo fine`}})
	if exit.Code != 0 || exit.Reason != "" || strings.TrimSpace(out) != "fine" {
		t.Fatalf("exit %+v, output %q", exit, out)
	}
}

func TestOCIMountsAndWritesOutside(t *testing.T) {
	rt, img := newOCIRuntime(t)
	ro, rw := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(ro, "data.txt"), []byte("dataset\n"), 0o644)
	os.Chmod(rw, 0o777)
	exit, out := runOCI(t, rt, &Job{ID: "mounts-1", Image: img,
		Mounts: []Mount{{Source: ro, Target: "/data", ReadOnly: true}, {Source: rw, Target: "/scratch"}},
		Argv:   []string{"sh", "-c", `cat /data/data.txt; echo x > /data/planted && echo WROTE-RO; echo y > /scratch/out && echo wrote-rw; echo z > /bin/planted && echo WROTE-BIN; echo z > /planted && echo WROTE-ROOT; ls ` + ro + ` 2>/dev/null && echo SAW-HOST; echo done`}})
	if exit.Code != 0 || !strings.Contains(out, "dataset") || !strings.Contains(out, "wrote-rw") || strings.Contains(out, "WROTE") || strings.Contains(out, "SAW-HOST") || !strings.Contains(out, "done") {
		t.Fatalf("exit %+v, output %q", exit, out)
	}
	if _, err := os.Stat(filepath.Join(ro, "planted")); err == nil {
		t.Fatal("the read-only mount was written")
	}
	if raw, _ := os.ReadFile(filepath.Join(rw, "out")); string(raw) != "y\n" {
		t.Fatalf("the read-write mount holds %q", raw)
	}
}

func TestOCIIsolation(t *testing.T) {
	rt, img := newOCIRuntime(t)
	t.Setenv("SPILLWAY_AGENT_TOKEN", "agent-secret-token")
	// A vision job with a secret runs meanwhile.
	var vout syncBuffer
	vp, e := rt.Start(context.Background(), &Job{ID: "victim-1", Team: "vision", Image: img, Output: &vout,
		Env:  []string{"HF_TOKEN=hf-secret-of-vision"},
		Argv: []string{"sh", "-c", `echo file-secret > $HOME/secret; echo ready; exec sleep 300`}})
	if e != nil {
		t.Fatalf("start victim: %+v", e)
	}
	defer func() {
		_ = vp.Signal(syscall.SIGKILL)
		vp.Wait()
		rt.Forget("victim-1")
	}()
	waitFor(t, func() bool { return strings.Contains(vout.String(), "ready") })
	victimDir := vp.Dir()
	exit, out := runOCI(t, rt, &Job{ID: "thief-1", Image: img, Argv: []string{"sh", "-c",
		`id -u; ps -o pid,user,args | wc -l; for f in /proc/[0-9]*/environ; do cat $f 2>/dev/null | tr '\0' ' '; done; cat ` + victimDir + `/secret 2>&1; cat /proc/1/environ | tr '\0' ' '; echo; echo done`}})
	t.Logf("thief: %q", out)
	for _, secret := range []string{"agent-secret-token", "hf-secret-of-vision", "file-secret"} {
		if strings.Contains(out, secret) {
			t.Fatalf("the container read %s: %q", secret, out)
		}
	}
	if exit.Code != 0 || !strings.HasPrefix(out, "20901\n") || !strings.Contains(out, "done") {
		t.Fatalf("exit %+v, output %q", exit, out)
	}
}

func TestOCIStopSignalReachesTheJob(t *testing.T) {
	rt, img := newOCIRuntime(t)
	var out syncBuffer
	p, e := rt.Start(context.Background(), &Job{ID: "stop-1", Team: "nlp", Image: img, Output: &out,
		Argv: []string{"sh", "-c", `trap 'echo got-term; exit 143' TERM; echo ready; while true; do sleep 0.1; done`}})
	if e != nil {
		t.Fatalf("start: %+v", e)
	}
	defer rt.Forget("stop-1")
	waitFor(t, func() bool { return strings.Contains(out.String(), "ready") })
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exit := p.Wait()
	if exit.Code != 143 || !strings.Contains(out.String(), "got-term") {
		t.Fatalf("exit %+v, output %q", exit, out.String())
	}
}

func TestOCIImageNotFound(t *testing.T) {
	rt, _ := newOCIRuntime(t)
	reg := ocitest.NewRegistry(t)
	for _, img := range []string{reg.Host() + "/nlp/missing:1", "127.0.0.1:1/nlp/unreachable:1"} {
		_, e := rt.Start(context.Background(), &Job{ID: "missing-1", Team: "nlp", Image: img, Argv: []string{"true"}, Output: &syncBuffer{}})
		if e == nil || e.Reason != ReasonImageNotFound || !strings.Contains(e.Message, "image not found: "+img) {
			t.Fatalf("%s: want image not found, got %+v", img, e)
		}
	}
}

func TestOCIPullDenied(t *testing.T) {
	rt, _ := newOCIRuntime(t)
	reg := ocitest.NewRegistry(t)
	img := reg.Push("secret/train", "1", ocitest.Rootfs(t))
	reg.Deny["secret"] = true
	_, e := rt.Start(context.Background(), &Job{ID: "denied-1", Team: "nlp", Image: img, Argv: []string{"true"}, Output: &syncBuffer{}})
	if e == nil || e.Reason != ReasonPullDenied || !strings.Contains(e.Message, "pull denied") {
		t.Fatalf("want pull denied, got %+v", e)
	}
}

func TestOCIPullWithProgressThenCache(t *testing.T) {
	rt, _ := newOCIRuntime(t)
	reg := ocitest.NewRegistry(t)
	tag := fmt.Sprintf("%d", time.Now().UnixNano())
	img := reg.Push("nlp/train", tag, ocitest.RootfsWithPadding(t, 60<<20))
	t.Cleanup(func() { _ = rt.command(context.Background(), "rmi", "-f", img).Run() })
	var mu sync.Mutex
	var seen []string
	progress := func(p string) {
		mu.Lock()
		seen = append(seen, p)
		mu.Unlock()
	}
	// The registry holds the layer half sent until the node has reported
	// a partial pull (65 MB in all: 60 MiB of padding and busybox).
	partial := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range seen {
			var have, total int
			if n, _ := fmt.Sscanf(p, "pulling image %d/%d MB", &have, &total); n == 2 && have > 0 && have < total && total == 65 {
				return true
			}
		}
		return false
	}
	reg.Gate = func() {
		waitFor(t, func() bool {
			ok := partial()
			if !ok {
				mu.Lock()
				if len(seen) > 0 {
					t.Logf("progress so far: %q", seen[len(seen)-1])
				}
				mu.Unlock()
			}
			return ok
		})
	}
	exit, out := runOCI(t, rt, &Job{ID: "pull-1", Image: img, Progress: progress, Argv: []string{"sh", "-c", "ls -la /padding.bin | wc -l"}})
	if exit.Code != 0 || strings.TrimSpace(out) != "1" {
		t.Fatalf("exit %+v, output %q", exit, out)
	}
	mu.Lock()
	t.Logf("progress: %q", seen)
	last := seen[len(seen)-1]
	mu.Unlock()
	if last != "pulling image 65/65 MB" {
		t.Fatalf("last progress %q", last)
	}
	// The image is now in the node's cache: a second start pulls nothing.
	reg.Gate = nil
	mu.Lock()
	seen = nil
	mu.Unlock()
	reg.Close()
	exit, _ = runOCI(t, rt, &Job{ID: "pull-2", Image: img, Progress: progress, Argv: []string{"true"}})
	mu.Lock()
	defer mu.Unlock()
	if exit.Code != 0 || len(seen) != 0 {
		t.Fatalf("second start: exit %+v, progress %q; want a cached start", exit, seen)
	}
}

// waitFor polls a condition with a generous deadline.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 60s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOCILeftoversOfACrashedAgent: the agent dies (its podman client with
// it); conmon keeps the container running; the next agent process on
// the same data dir removes it, and no other agent's.
func TestOCILeftoversOfACrashedAgent(t *testing.T) {
	rt, img := newOCIRuntime(t)
	other, _ := newOCIRuntime(t)
	var out, out2 syncBuffer
	p, e := rt.Start(context.Background(), &Job{ID: "left-1", Team: "nlp", Image: img, Output: &out, Argv: []string{"sh", "-c", "echo ready; exec sleep 300"}})
	if e != nil {
		t.Fatalf("start: %+v", e)
	}
	p2, e := other.Start(context.Background(), &Job{ID: "keep-1", Team: "nlp", Image: img, Output: &out2, Argv: []string{"sh", "-c", "echo ready; exec sleep 300"}})
	if e != nil {
		t.Fatalf("start: %+v", e)
	}
	defer func() { _ = p2.Signal(syscall.SIGKILL); p2.Wait(); other.Forget("keep-1") }()
	waitFor(t, func() bool {
		return strings.Contains(out.String(), "ready") && strings.Contains(out2.String(), "ready")
	})
	_ = syscall.Kill(-p.PGID(), syscall.SIGKILL) // the podman client dies with the agent
	p.Wait()
	running := func(name string) bool {
		o, _ := rt.command(context.Background(), "ps", "--filter", "name=^"+name+"$", "--format", "{{.Names}}").Output()
		return strings.TrimSpace(string(o)) == name
	}
	left := running(containerName("left-1"))
	got := rt.RemoveLeftovers(context.Background())
	switch {
	case !left: // some podman setups take the container down with its client
		t.Logf("the container died with its podman client; RemoveLeftovers found %v", got)
		if slices.Contains(got, containerName("keep-1")) {
			t.Fatalf("removed another agent's container: %v", got)
		}
	case len(got) != 1 || got[0] != containerName("left-1") || running(containerName("left-1")):
		t.Fatalf("removed %v; still running: %v", got, running(containerName("left-1")))
	}
	if !running(containerName("keep-1")) {
		t.Fatal("another agent's container was removed")
	}
	rt.Forget("left-1")
}
