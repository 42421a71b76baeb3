package runtime

import (
	"os"
	"path/filepath"
	"testing"
)

// On cgroup v1 an attempt's cgroup goes from every hierarchy it was made
// in (Podman makes it in cpu, pids… too), found from the hierarchies
// listed once when the controller was detected.
func TestCgroupV1RemovalReachesEveryHierarchy(t *testing.T) {
	mnt := t.TempDir()
	for _, h := range []string{"memory", "cpu,cpuacct", "pids"} {
		if err := os.MkdirAll(filepath.Join(mnt, h), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("cpu,cpuacct", filepath.Join(mnt, "cpu")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "memory", "memory.limit_in_bytes"), []byte("max"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := detectCgroups(mnt)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(mnt, "cpu,cpuacct"), filepath.Join(mnt, "pids")}
	if len(c.others) != len(want) || c.others[0] != want[0] || c.others[1] != want[1] {
		t.Fatalf("other hierarchies %v, want %v (the memory one and symlinks left out)", c.others, want)
	}
	g := &cgroup{c: c, path: filepath.Join(c.root, cgroupParent, "j1-1"), rel: "/" + cgroupParent + "/j1-1"}
	made := []string{g.path, filepath.Join(mnt, "cpu,cpuacct", cgroupParent, "j1-1", "libpod-x"), filepath.Join(mnt, "pids", cgroupParent, "j1-1")}
	for _, d := range made {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	keep := filepath.Join(mnt, "pids", cgroupParent, "j2-1")
	if err := os.MkdirAll(keep, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := g.remove(); err != nil {
		t.Fatal(err)
	}
	for _, d := range append(made, filepath.Join(mnt, "cpu,cpuacct", cgroupParent, "j1-1")) {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still there (%v)", d, err)
		}
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("another attempt's cgroup went too: %v", err)
	}
}
