package runtime

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// base is what both runtimes share: the uid map, the attempts'
// directories and the memory cgroups.
type base struct {
	cfg     Config
	dataDir string
	jobsDir string
	users   *userMap
	// cg is nil where the node cannot enforce memory limits; cgErr says
	// why.
	cg    *cgroups
	cgErr error
	root  bool
}

func newBase(cfg Config, opt Options) (*base, error) {
	b := &base{cfg: cfg, dataDir: opt.DataDir, root: isRoot()}
	users, err := newUserMap(cfg, opt.DataDir)
	if err != nil {
		return nil, err
	}
	b.users = users
	if b.jobsDir, err = jobsDir(cfg.JobsDir, opt.DataDir); err != nil {
		return nil, err
	}
	if b.root {
		b.cg, b.cgErr = detectCgroups("")
	} else {
		b.cgErr = fmt.Errorf("the agent runs as uid %d, not root: it cannot create cgroups or switch uids", os.Geteuid())
	}
	return b, nil
}

// jobsDir picks the directory holding the attempts' directories. Each
// attempt's directory is 0700 and owned by the job's uid; their parent is
// 0711, so a job reaches its own directory by name but cannot list the
// others. Every directory above must be searchable by others for a job's
// uid to reach its own.
func jobsDir(configured, dataDir string) (string, error) {
	if configured != "" {
		if err := os.MkdirAll(configured, 0o711); err != nil {
			return "", fmt.Errorf("runtime.jobsDir: %w", err)
		}
		if err := os.Chmod(configured, 0o711); err != nil {
			return "", fmt.Errorf("runtime.jobsDir: %w", err)
		}
		if p := unreachable(configured); p != "" {
			return "", fmt.Errorf("runtime.jobsDir %s: %s is not searchable by others (chmod o+x it)", configured, p)
		}
		return configured, nil
	}
	d := filepath.Join(dataDir, "jobs")
	if unreachable(filepath.Dir(d)) == "" || !isRoot() {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return "", fmt.Errorf("create jobs dir: %w", err)
		}
		return d, os.Chmod(d, 0o711)
	}
	// The data dir sits under a private directory (a test's temp dir):
	// the attempts go under a fresh directory of their own.
	d, err := os.MkdirTemp("", "spillway-jobs-")
	if err != nil {
		return "", fmt.Errorf("create jobs dir: %w", err)
	}
	return d, os.Chmod(d, 0o711)
}

// unreachable returns the first directory on the way to dir that others
// cannot search, or "".
func unreachable(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return dir
	}
	for p := abs; ; p = filepath.Dir(p) {
		if st, err := os.Stat(p); err == nil && st.Mode().Perm()&0o001 == 0 {
			return p
		}
		if p == "/" || p == "." {
			return ""
		}
	}
}

// ident returns the uid an attempt runs as: the mapped one when the agent
// is root, else the agent's own (which is not root either).
func (b *base) ident(j *Job) (ident, error) {
	if !b.root {
		return ident{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}, nil
	}
	return b.users.lookup(j.Team, j.User)
}

// prepareDir makes the attempt's directory: created by the agent, filled
// by j.Prepare, then handed to the job's uid with mode 0700.
func (b *base) prepareDir(j *Job, id ident) (string, error) {
	dir := filepath.Join(b.jobsDir, j.ID)
	err := os.Mkdir(dir, 0o700)
	if errors.Is(err, fs.ErrExist) {
		// A leftover of an earlier agent process: start afresh.
		if err := os.RemoveAll(dir); err != nil {
			return "", fmt.Errorf("clear attempt dir: %w", err)
		}
		err = os.Mkdir(dir, 0o700)
	}
	if err != nil {
		return "", fmt.Errorf("create attempt dir: %w", err)
	}
	if j.Prepare != nil {
		if err := j.Prepare(dir); err != nil {
			return "", err
		}
	}
	if b.root {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, int(id.UID), int(id.GID))
		})
		if err != nil {
			return "", fmt.Errorf("hand attempt dir to uid %d: %w", id.UID, err)
		}
	}
	return dir, os.Chmod(dir, 0o700)
}

// memoryGroup makes the attempt's memory cgroup, or says in the log why
// the limit cannot be enforced here.
func (b *base) memoryGroup(j *Job) (*cgroup, error) {
	if j.Memory <= 0 {
		return nil, nil
	}
	if b.cg == nil {
		fmt.Fprintf(j.Output, "[spillway: this node cannot enforce resources.memory (%s); the job runs without a memory limit]\n", b.cgErr)
		return nil, nil
	}
	return b.cg.create(j.ID, j.Memory)
}

// forget removes an attempt's directory and cgroup.
func (b *base) forget(id string) {
	if id == "" || strings.ContainsAny(id, "/\x00") || id == "." || id == ".." {
		return
	}
	_ = os.RemoveAll(filepath.Join(b.jobsDir, id))
	if b.cg != nil {
		g := &cgroup{c: b.cg, path: filepath.Join(b.cg.root, cgroupParent, id), rel: "/" + cgroupParent + "/" + id}
		_ = g.remove()
	}
}

// oomExit turns a kill into an OOM exit when the cgroup saw one. Podman
// removes the container's own cgroup (below the attempt's) with the
// container, and the kernel counts the kill there; so a SIGKILL nobody
// sent (unsent) to an attempt whose usage reached its limit counts too.
func oomExit(e Exit, g *cgroup, unsent bool) Exit {
	if g == nil {
		return e
	}
	killed, byLimit := g.oom()
	if !killed && unsent && e.Code == 137 && byLimit && g.limit > 0 {
		killed = true
	}
	if !killed {
		return e
	}
	if byLimit && g.limit > 0 {
		e.Reason = ReasonOOMLimit
		e.Message = fmt.Sprintf("OOM-killed by its memory limit (resources.memory %s)", formatBytes(g.limit))
	} else {
		e.Reason = ReasonOOMNode
		e.Message = "OOM-killed: the node ran out of memory (the job was under its own limit)"
	}
	return e
}

func formatBytes(b int64) string {
	units := []string{"Ki", "Mi", "Gi", "Ti"}
	v, u := b, ""
	for _, next := range units {
		if v < 1024 || v%1024 != 0 {
			break
		}
		v, u = v/1024, next
	}
	return fmt.Sprintf("%d%s", v, u)
}

// copier copies a child's output into the job's writer and lets Wait
// give up on it when stray grandchildren hold the pipe open.
type copier struct {
	done chan struct{}
	once sync.Once
}

func startCopy(w io.Writer, r *os.File) *copier {
	c := &copier{done: make(chan struct{})}
	go func() {
		_, _ = io.Copy(w, r)
		r.Close()
		close(c.done)
	}()
	return c
}

// wait waits for the copy, at most a moment after the process ended
// (leak cleanup deals with stray writers).
func (c *copier) wait() {
	select {
	case <-c.done:
	case <-time.After(2 * time.Second):
	}
}

// exitOf reads an exit status the way a shell reports it.
func exitOf(ps *os.ProcessState) Exit {
	if ps == nil {
		return Exit{Code: 127}
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return Exit{Code: 128 + int(ws.Signal()), Signal: signalName(ws.Signal())}
	}
	return Exit{Code: ps.ExitCode()}
}

var signalNames = map[syscall.Signal]string{
	syscall.SIGTERM: "SIGTERM", syscall.SIGINT: "SIGINT", syscall.SIGHUP: "SIGHUP",
	syscall.SIGUSR1: "SIGUSR1", syscall.SIGUSR2: "SIGUSR2", syscall.SIGQUIT: "SIGQUIT",
	syscall.SIGKILL: "SIGKILL", syscall.SIGSEGV: "SIGSEGV", syscall.SIGABRT: "SIGABRT",
}

func signalName(s syscall.Signal) string {
	if n, ok := signalNames[s]; ok {
		return n
	}
	return "SIG" + strings.ToUpper(s.String())
}
