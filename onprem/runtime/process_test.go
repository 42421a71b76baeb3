package runtime

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// syncBuffer is a job's output collected by a test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("runtime tests need root (uids, cgroups); CI runs them as root")
		}
		t.Skip("runtime tests need root (uids, cgroups): run as root, or with CI=true under .ci/run")
	}
}

func newProcess(t testing.TB) Runtime {
	t.Helper()
	rt, err := New(Config{Users: map[string]string{"nlp": "20901"}}, Options{DataDir: t.TempDir(), SimulatedGPUs: true})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

func TestProcessMemoryLimitKillsAndSaysSo(t *testing.T) {
	needRoot(t)
	rt := newProcess(t)
	if rt.(*processRuntime).cg == nil {
		t.Fatalf("this node has no memory cgroup: %v", rt.(*processRuntime).cgErr)
	}
	var out syncBuffer
	// 100 MB into a shell variable under a 32Mi limit.
	p, e := rt.Start(context.Background(), &Job{ID: "oom-1", Team: "nlp", Memory: 32 << 20, Output: &out,
		Argv: []string{"sh", "-c", `x=$(head -c 100000000 /dev/zero | tr '\0' a); echo survived`}, Env: []string{"PATH=" + os.Getenv("PATH")}})
	if e != nil {
		t.Fatalf("start: %+v", e)
	}
	exit := p.Wait()
	rt.Forget("oom-1")
	if exit.Reason != ReasonOOMLimit || !strings.Contains(exit.Message, "OOM-killed by its memory limit (resources.memory 32Mi)") {
		t.Fatalf("exit %+v, output %q; want OOM by the limit", exit, out.String())
	}
	if strings.Contains(out.String(), "survived") {
		t.Fatalf("the job outlived its limit: %q", out.String())
	}
}

func TestProcessUnderLimitIsNotOOM(t *testing.T) {
	needRoot(t)
	rt := newProcess(t)
	var out syncBuffer
	p, e := rt.Start(context.Background(), &Job{ID: "fine-1", Team: "nlp", Memory: 256 << 20, Output: &out,
		Argv: []string{"sh", "-c", `x=$(head -c 1000000 /dev/zero | tr '\0' a); echo ok; exit 3`}, Env: []string{"PATH=" + os.Getenv("PATH")}})
	if e != nil {
		t.Fatalf("start: %+v", e)
	}
	exit := p.Wait()
	rt.Forget("fine-1")
	if exit.Code != 3 || exit.Reason != "" || out.String() != "ok\n" {
		t.Fatalf("exit %+v, output %q", exit, out.String())
	}
}

// TestProcessForgetLeavesNothing: an attempt starts in a fresh directory
// even where an earlier agent process left one, and Forget removes the
// directory and the attempt's memory cgroup.
func TestProcessForgetLeavesNothing(t *testing.T) {
	needRoot(t)
	rt := newProcess(t)
	pr := rt.(*processRuntime)
	if pr.cg == nil {
		t.Fatalf("this node has no memory cgroup: %v", pr.cgErr)
	}
	dir := filepath.Join(pr.jobsDir, "left-1")
	if err := os.MkdirAll(filepath.Join(dir, "old"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "old", "stale"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	p, e := rt.Start(context.Background(), &Job{ID: "left-1", Team: "nlp", Memory: 64 << 20, Output: &out,
		Argv: []string{"sh", "-c", `ls -A "$HOME"; echo end`}, Env: []string{"PATH=" + os.Getenv("PATH")}})
	if e != nil {
		t.Fatalf("start: %+v", e)
	}
	if exit := p.Wait(); exit.Code != 0 || out.String() != "end\n" {
		t.Fatalf("exit %+v, output %q; want an empty directory", exit, out.String())
	}
	group := filepath.Join(pr.cg.root, cgroupParent, "left-1")
	if err := os.Mkdir(group, 0o755); err != nil && !os.IsExist(err) {
		t.Fatal(err) // as a crashed agent would leave it
	}
	rt.Forget("left-1")
	for _, p := range []string{dir, group} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s after Forget: %v, want gone", p, err)
		}
	}
}

// TestProcessFindsCommandOnJobPath: a bare command name is looked up on
// the PATH the job runs with (its spec may set one, say a virtualenv's),
// not on the agent's, as a shell or srun would; a name on neither says so.
func TestProcessFindsCommandOnJobPath(t *testing.T) {
	needRoot(t)
	rt := newProcess(t)
	bin, err := os.MkdirTemp("", "spillway-jobpath-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bin) })
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "hello-spillway"), []byte("#!/bin/sh\necho hello from $0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	p, e := rt.Start(context.Background(), &Job{ID: "path-1", Team: "nlp", Output: &out,
		Argv: []string{"hello-spillway"}, Env: []string{"PATH=/usr/bin:/bin", "PATH=" + bin + ":/usr/bin:/bin"}})
	if e != nil {
		t.Fatalf("start: %+v", e)
	}
	exit := p.Wait()
	rt.Forget("path-1")
	if want := "hello from " + filepath.Join(bin, "hello-spillway") + "\n"; exit.Code != 0 || out.String() != want {
		t.Fatalf("exit %+v, output %q; want %q", exit, out.String(), want)
	}

	_, e = rt.Start(context.Background(), &Job{ID: "path-2", Team: "nlp", Output: &syncBuffer{},
		Argv: []string{"hello-spillway"}, Env: []string{"PATH=/usr/bin:/bin"}})
	if e == nil {
		t.Fatal("a command on no directory of the job's PATH started")
	}
	rt.Forget("path-2")
	if !strings.Contains(e.Message, `"hello-spillway"`) || !strings.Contains(e.Message, "PATH") {
		t.Fatalf("start failure %+v; want one naming the command and PATH", e)
	}

	// The agent is root and finds copies the job's uid may not run: one
	// in a directory only root may enter (as /root/.local/bin), one with
	// only the owner's execute bit. Both are passed over, as execvp
	// passes over EACCES, for the one the job may run.
	private := filepath.Join(bin, "private")
	ownerOnly := filepath.Join(bin, "owner-only")
	for dir, mode := range map[string]os.FileMode{private: 0o700, ownerOnly: 0o755} {
		if err := os.Mkdir(dir, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil { // past the umask
			t.Fatal(err)
		}
	}
	for dir, mode := range map[string]os.FileMode{private: 0o755, ownerOnly: 0o744} {
		f := filepath.Join(dir, "hello-spillway")
		if err := os.WriteFile(f, []byte("#!/bin/sh\necho wrong copy\n"), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f, mode); err != nil {
			t.Fatal(err)
		}
	}
	runsHello(t, rt, "path-3", private+":"+ownerOnly+":"+bin, filepath.Join(bin, "hello-spillway"))
	refusesHello(t, rt, "path-4", private+":"+ownerOnly, filepath.Join(private, "hello-spillway"))
}

// runsHello runs hello-spillway as team nlp's uid with PATH=path and
// checks that the copy at want ran.
func runsHello(t *testing.T, rt Runtime, id, path, want string) {
	t.Helper()
	var out syncBuffer
	p, e := rt.Start(context.Background(), &Job{ID: id, Team: "nlp", Output: &out,
		Argv: []string{"hello-spillway"}, Env: []string{"PATH=" + path}})
	if e != nil {
		t.Fatalf("%s: start: %+v", id, e)
	}
	exit := p.Wait()
	rt.Forget(id)
	if want := "hello from " + want + "\n"; exit.Code != 0 || out.String() != want {
		t.Fatalf("%s: exit %+v, output %q; want %q", id, exit, out.String(), want)
	}
}

// refusesHello checks that hello-spillway with PATH=path does not start,
// and that the refusal names the copy at denied that uid 20901 may not run.
func refusesHello(t *testing.T, rt Runtime, id, path, denied string) {
	t.Helper()
	_, e := rt.Start(context.Background(), &Job{ID: id, Team: "nlp", Output: &syncBuffer{},
		Argv: []string{"hello-spillway"}, Env: []string{"PATH=" + path}})
	if e == nil {
		t.Fatalf("%s: a command the job's uid may not run started", id)
	}
	rt.Forget(id)
	if want := denied + " is there, but the job's uid 20901 may not run it"; !strings.Contains(e.Message, want) {
		t.Fatalf("%s: start failure %+v; want one saying %q", id, e, want)
	}
}

// TestProcessFindsCommandAnACLOpens: a root agent reads POSIX ACLs as the
// kernel will when the job execs: a copy that only a named-user entry
// opens to the job's uid is found; one whose entry the mask takes back is
// passed over, with the error naming it.
func TestProcessFindsCommandAnACLOpens(t *testing.T) {
	needRoot(t)
	setfacl, err := exec.LookPath("setfacl")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("setfacl not found: .ci/run installs Debian's acl")
		}
		t.Skip("setfacl not found: install Debian's acl (sudo make test-deps)")
	}
	rt := newProcess(t)
	root, err := os.MkdirTemp("", "spillway-jobacl-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	acl := func(path, spec string) {
		t.Helper()
		if out, err := exec.Command(setfacl, "-m", spec, path).CombinedOutput(); err != nil {
			t.Fatalf("setfacl -m %s %s: %v: %s", spec, path, err, out)
		}
	}
	// Both directories and copies are root's, mode 0700 but for the ACL.
	opened, masked := filepath.Join(root, "opened"), filepath.Join(root, "masked")
	for _, dir := range []string{opened, masked} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, "hello-spillway")
		if err := os.WriteFile(f, []byte("#!/bin/sh\necho hello from $0\n"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f, 0o700); err != nil { // past the umask
			t.Fatal(err)
		}
	}
	acl(opened, "u:20901:x")
	acl(filepath.Join(opened, "hello-spillway"), "u:20901:rx")
	acl(masked, "u:20901:x")
	acl(filepath.Join(masked, "hello-spillway"), "u:20901:rx,m::r")

	runsHello(t, rt, "acl-1", masked+":"+opened, filepath.Join(opened, "hello-spillway"))
	refusesHello(t, rt, "acl-2", masked, filepath.Join(masked, "hello-spillway"))
}

// TestACLAllows: the kernel's ACL check for execute, one class at a time
// (acl(5)): the owner's entry alone for the owner, a named user's under
// the mask, the group entries that match under the mask (any one
// granting, none falling through to others), else the others' entry.
func TestACLAllows(t *testing.T) {
	st := syscall.Stat_t{Uid: 0, Gid: 100}
	e := func(tag, perm uint16, id uint32) aclEntry { return aclEntry{tag: tag, perm: perm, id: id} }
	base := []aclEntry{e(aclUserObj, 7, 0), e(aclGroupObj, 0, 0), e(aclOther, 1, 0)}
	for _, c := range []struct {
		name string
		acl  posixACL
		id   ident
		want bool
	}{
		{"others' entry", base, ident{UID: 5, GID: 5}, true},
		{"owning group matched, no x: not the others' entry", base, ident{UID: 5, GID: 100}, false},
		{"named user", append(slices.Clone(base), e(aclUser, 1, 5), e(aclMask, 1, 0)), ident{UID: 5, GID: 5}, true},
		{"named user under the mask", append(slices.Clone(base), e(aclUser, 1, 5), e(aclMask, 4, 0)), ident{UID: 5, GID: 5}, false},
		{"named user without x, others with", append(slices.Clone(base), e(aclUser, 4, 5), e(aclMask, 7, 0)), ident{UID: 5, GID: 5}, false},
		{"named group grants though the owning group does not", append(slices.Clone(base), e(aclGroup, 1, 100), e(aclMask, 1, 0)), ident{UID: 5, GID: 100}, true},
		{"owner's entry, not the others'", []aclEntry{e(aclUserObj, 6, 0), e(aclGroupObj, 1, 0), e(aclOther, 1, 0)}, ident{UID: 0, GID: 100}, false},
	} {
		if got := c.acl.allows(st, c.id, aclExecute); got != c.want {
			t.Errorf("%s: allows = %v, want %v", c.name, got, c.want)
		}
	}
	if _, ok := parseACL([]byte{2, 0, 0, 0, 1, 0}); ok {
		t.Error("a truncated entry parsed")
	}
	if _, ok := parseACL([]byte{3, 0, 0, 0}); ok {
		t.Error("version 3 parsed")
	}
	if acl, ok := parseACL([]byte{2, 0, 0, 0, 0x02, 0, 1, 0, 0xa5, 0x51, 0, 0}); !ok || len(acl) != 1 || acl[0] != e(aclUser, 1, 20901) {
		t.Errorf("parse = %v, %v; want one entry user:20901:--x", acl, ok)
	}
}

func TestProcessRefusesImage(t *testing.T) {
	rt := newProcess(t)
	_, e := rt.Start(context.Background(), &Job{ID: "img-1", Team: "nlp", Image: "busybox", Argv: []string{"true"}, Output: &syncBuffer{}})
	if e == nil || !strings.Contains(e.Message, "oci runtime") {
		t.Fatalf("want a clear refusal, got %+v", e)
	}
}

func TestUserMap(t *testing.T) {
	dir := t.TempDir()
	m, err := newUserMap(Config{Users: map[string]string{"nlp": "3000:3001", "nlp/alice": "3100"}, UIDRange: "4000-4001"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		team, user string
		want       ident
	}{
		{"nlp", "bob", ident{3000, 3001}},
		{"nlp", "alice", ident{3100, 3100}},
		{"vision", "", ident{4000, 4000}},
		{"audio", "", ident{4001, 4001}},
	} {
		got, err := m.lookup(c.team, c.user)
		if err != nil || got != c.want {
			t.Fatalf("%s/%s: got %v, %v; want %v", c.team, c.user, got, err, c.want)
		}
	}
	if _, err := m.lookup("speech", ""); err == nil || !strings.Contains(err.Error(), "used up") {
		t.Fatalf("want the range used up, got %v", err)
	}
	// Kept across restarts.
	m2, _ := newUserMap(Config{UIDRange: "4000-4001"}, dir)
	if got, _ := m2.lookup("audio", ""); got.UID != 4001 {
		t.Fatalf("audio lost its uid across a restart: %v", got)
	}
	for _, bad := range []string{"0", "0:5", "5:0", "root", ""} {
		if _, err := newUserMap(Config{Users: map[string]string{"x": bad}}, dir); err == nil {
			t.Fatalf("users.x: %q accepted", bad)
		}
	}
}

func TestPullProgress(t *testing.T) {
	for _, c := range []struct {
		have, total int64
		want        string
	}{
		{1_200_000_000, 4_000_000_000, "pulling image 1.2/4.0 GB"},
		{32_000_000, 65_000_000, "pulling image 32/65 MB"},
		{300_000_000, 0, "pulling image 300 MB"},
		{5_000_000_000, 4_000_000_000, "pulling image 4.0/4.0 GB"},
	} {
		if got := PullProgress(c.have, c.total); got != c.want {
			t.Errorf("PullProgress(%d, %d) = %q, want %q", c.have, c.total, got, c.want)
		}
	}
}
