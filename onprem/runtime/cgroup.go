package runtime

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroups makes one memory cgroup per attempt under "spillway", on a
// cgroup v1 memory hierarchy or the v2 unified one.
type cgroups struct {
	v2 bool
	// root is the memory hierarchy's mount (v1: /sys/fs/cgroup/memory;
	// v2: /sys/fs/cgroup).
	root string
	// swap is whether the v1 hierarchy accounts swap (memsw files).
	swap bool
	// others are v1's other hierarchies (cpu, pids…), where Podman makes
	// an attempt's cgroup too; listed once, not for every removal.
	others []string
}

const cgroupParent = "spillway"

// detectCgroups finds a writable memory controller; the error says why
// there is none.
func detectCgroups(mnt string) (*cgroups, error) {
	if mnt == "" {
		mnt = "/sys/fs/cgroup"
	}
	if _, err := os.Stat(filepath.Join(mnt, "cgroup.controllers")); err == nil {
		c := &cgroups{v2: true, root: mnt}
		ctl, _ := os.ReadFile(filepath.Join(mnt, "cgroup.controllers"))
		if !bytes.Contains(ctl, []byte("memory")) {
			return nil, errors.New("cgroup v2 without the memory controller")
		}
		if err := c.ensureParent(); err != nil {
			return nil, err
		}
		return c, nil
	}
	mem := filepath.Join(mnt, "memory")
	if _, err := os.Stat(filepath.Join(mem, "memory.limit_in_bytes")); err != nil {
		return nil, fmt.Errorf("no memory cgroup controller at %s", mem)
	}
	c := &cgroups{root: mem}
	if _, err := os.Stat(filepath.Join(mem, "memory.memsw.limit_in_bytes")); err == nil {
		c.swap = true
	}
	if err := c.ensureParent(); err != nil {
		return nil, err
	}
	if ents, err := os.ReadDir(mnt); err == nil {
		for _, e := range ents {
			if p := filepath.Join(mnt, e.Name()); e.IsDir() && p != mem {
				c.others = append(c.others, p)
			}
		}
	}
	return c, nil
}

func (c *cgroups) ensureParent() error {
	p := filepath.Join(c.root, cgroupParent)
	if err := os.MkdirAll(p, 0o755); err != nil {
		return fmt.Errorf("create cgroup %s: %w", p, err)
	}
	if c.v2 {
		for _, dir := range []string{c.root, p} {
			if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+memory"), 0); err != nil {
				return fmt.Errorf("enable the memory controller in %s: %w", dir, err)
			}
		}
	}
	return nil
}

// version names the hierarchy for people.
func (c *cgroups) version() string {
	if c.v2 {
		return "cgroup v2"
	}
	return "cgroup v1"
}

// cgroup is one attempt's memory cgroup.
type cgroup struct {
	c     *cgroups
	path  string
	limit int64
	// rel is the path under the hierarchy ("/spillway/<id>"), what
	// podman's --cgroup-parent takes.
	rel string
}

// create makes the attempt's cgroup with its limit; swap is capped at the
// same value so the limit is not dodged by swapping.
func (c *cgroups) create(id string, limit int64) (*cgroup, error) {
	g := &cgroup{c: c, path: filepath.Join(c.root, cgroupParent, id), limit: limit, rel: "/" + cgroupParent + "/" + id}
	_ = g.remove() // a leftover of an earlier agent
	if err := os.Mkdir(g.path, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	v := []byte(strconv.FormatInt(limit, 10))
	if limit <= 0 && c.v2 {
		v = []byte("max")
	}
	var writes [][2]string
	if c.v2 {
		writes = [][2]string{{"memory.max", string(v)}, {"memory.swap.max", "0"}}
	} else {
		writes = [][2]string{{"memory.limit_in_bytes", string(v)}}
		if c.swap {
			writes = append(writes, [2]string{"memory.memsw.limit_in_bytes", string(v)})
		}
	}
	for _, w := range writes {
		if err := os.WriteFile(filepath.Join(g.path, w[0]), []byte(w[1]), 0); err != nil && !(c.v2 && w[0] == "memory.swap.max") {
			_ = g.remove()
			return nil, fmt.Errorf("set %s: %w", w[0], err)
		}
	}
	return g, nil
}

// add moves a process into the cgroup.
func (g *cgroup) add(pid int) error {
	return os.WriteFile(filepath.Join(g.path, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
}

// pids lists every process in the cgroup and the cgroups below it.
func (g *cgroup) pids() []int {
	var out []int
	_ = filepath.WalkDir(g.path, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		raw, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		for _, f := range strings.Fields(string(raw)) {
			if pid, err := strconv.Atoi(f); err == nil {
				out = append(out, pid)
			}
		}
		return nil
	})
	return out
}

// killAll kills every process left in the cgroup (those that left the
// process group, say).
func (g *cgroup) killAll() {
	for _, pid := range g.pids() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// oom reports whether the kernel OOM-killed a process of the cgroup (or
// of a cgroup below it that still exists), and whether the cgroup's own
// limit was reached (rather than the node running out of memory).
func (g *cgroup) oom() (killed, atLimit bool) {
	file := "memory.oom_control"
	if g.c.v2 {
		file = "memory.events"
	}
	var kills int64
	_ = filepath.WalkDir(g.path, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			kills += readKV(filepath.Join(p, file))["oom_kill"]
		}
		return nil
	})
	return kills > 0, g.atLimit()
}

// atLimit reports whether the cgroup's usage reached its limit.
func (g *cgroup) atLimit() bool {
	if g.c.v2 {
		ev := readKV(filepath.Join(g.path, "memory.events"))
		return ev["max"] > 0 || ev["oom"] > 0
	}
	// failcnt counts charges refused at the limit, but stays 0 on some
	// kernels once memsw is limited too; the peak reaching the limit says
	// the same.
	fail := readInt(filepath.Join(g.path, "memory.failcnt"))
	peak := readInt(filepath.Join(g.path, "memory.max_usage_in_bytes"))
	if g.c.swap {
		fail += readInt(filepath.Join(g.path, "memory.memsw.failcnt"))
		peak = max(peak, readInt(filepath.Join(g.path, "memory.memsw.max_usage_in_bytes")))
	}
	return fail > 0 || (g.limit > 0 && peak >= g.limit-64<<10)
}

// remove deletes the cgroup and those below it once their processes are
// gone (it kills stragglers and retries briefly). On cgroup v1 Podman
// makes the attempt's cgroup in every hierarchy (--cgroup-parent); those
// go too.
func (g *cgroup) remove() error {
	err := g.removeTree(g.path)
	if !g.c.v2 {
		// Where Podman made none this is one lstat per hierarchy (the
		// process runtime lists none: New).
		for _, h := range g.c.others {
			_ = g.removeTree(filepath.Join(h, g.rel))
		}
	}
	return err
}

func (g *cgroup) removeTree(root string) error {
	var err error
	for i := 0; i < 50; i++ {
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, werr error) error {
			if werr == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		if len(dirs) == 0 {
			return nil
		}
		err = nil
		for j := len(dirs) - 1; j >= 0; j-- {
			if e := syscall.Rmdir(dirs[j]); e != nil && !errors.Is(e, os.ErrNotExist) {
				err = e
			}
		}
		if err == nil {
			return nil
		}
		g.killAll()
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

func readKV(path string) map[string]int64 {
	out := map[string]int64{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			out[k] = n
		}
	}
	return out
}

func readInt(path string) int64 {
	raw, _ := os.ReadFile(path)
	n, _ := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	return n
}
