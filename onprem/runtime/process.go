package runtime

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// processRuntime runs the command as a child of the agent, as the job's
// unprivileged uid, in its own process group and memory cgroup.
type processRuntime struct{ *base }

func (p *processRuntime) Kind() string     { return KindProcess }
func (p *processRuntime) Forget(id string) { p.forget(id) }

type processProc struct {
	cmd  *exec.Cmd
	dir  string
	cg   *cgroup
	copy *copier
}

func (p *processRuntime) Start(_ context.Context, j *Job) (Proc, *Exit) {
	if j.Image != "" {
		return nil, startFailure(ReasonRuntimeError, "this node runs jobs as processes (runtime.kind: process); a job with an image needs a node with the oci runtime")
	}
	if len(j.Argv) == 0 {
		return nil, startFailure(ReasonRuntimeError, "empty command")
	}
	for _, m := range j.Mounts {
		if m.Target != m.Source {
			return nil, startFailure(ReasonRuntimeError, "mount %s → %s: the process runtime cannot move a mount; the job sees host paths where they are", m.Source, m.Target)
		}
	}
	id, err := p.ident(j)
	if err != nil {
		return nil, startFailure(ReasonRuntimeError, "map the job's user: %v", err)
	}
	dir, err := p.prepareDir(j, id)
	if err != nil {
		return nil, prepareFailure(err)
	}
	if e := passBarrier(j, ""); e != nil {
		return nil, e
	}
	cg, err := p.memoryGroup(j)
	if err != nil {
		return nil, startFailure(ReasonRuntimeError, "memory limit: %v", err)
	}
	workdir := j.Workdir
	if workdir == "" {
		workdir = dir
	}
	bin, err := jobCommand(j.Argv[0], j.Env, workdir, id, p.root)
	if err != nil {
		p.dropGroup(cg)
		return nil, startFailure("", "%v", err)
	}
	cmd := exec.Command(bin, j.Argv[1:]...)
	cmd.Args[0] = j.Argv[0] // as given, as execvp passes it
	cmd.Dir = workdir
	cmd.Env = append(append([]string(nil), j.Env...), "HOME="+dir, "TMPDIR="+dir)
	// Pdeathsig: the job's main process dies with the agent. An agent
	// killed with SIGKILL cannot stop its jobs, and the broker retries a
	// lost node's jobs elsewhere: without this the old copy would run on
	// beside its retry. A restarted agent kills what is left of the group
	// (killLeftovers). Go sets it after the uid switch, which would
	// otherwise clear it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if p.root {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: id.UID, Gid: id.GID, Groups: []uint32{}}
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		p.dropGroup(cg)
		return nil, startFailure(ReasonRuntimeError, "create pipe: %v", err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := startCmd(cmd); err != nil {
		pr.Close()
		pw.Close()
		p.dropGroup(cg)
		return nil, startFailure("", "%v", err)
	}
	pw.Close()
	if cg != nil {
		// The child is placed right after it starts; what it allocates
		// before exec is charged to the agent, a few pages.
		if err := cg.add(cmd.Process.Pid); err != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
			pr.Close()
			p.dropGroup(cg)
			return nil, startFailure(ReasonRuntimeError, "memory limit: %v", err)
		}
	}
	return &processProc{cmd: cmd, dir: dir, cg: cg, copy: startCopy(j.Output, pr)}, nil
}

// jobCommand finds a bare command name on the PATH the job runs with (the
// last PATH of env: the spec's over the agent's), as execvp in the job's
// environment would; exec.Command would search the agent's own PATH. A
// relative directory on it is the job's working directory's. A name with
// a slash is used as it is. A file the job's uid may not run is passed
// over, as execvp passes over EACCES: an agent running as root finds
// /root/.local/bin/python, which the job, as its own uid, cannot reach.
func jobCommand(name string, env []string, workdir string, id ident, asRoot bool) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	denied := ""
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(workdir, dir) // "" is the working directory too
		}
		f := filepath.Join(dir, name)
		st, err := os.Stat(f)
		if err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
			continue
		}
		if mayRun(f, id, asRoot) {
			return f, nil
		}
		if denied == "" {
			denied = f
		}
	}
	if denied != "" {
		return "", fmt.Errorf("command %q not found on the job's PATH (%s): %s is there, but the job's uid %d may not run it (no execute permission on it or on a directory above it)", name, path, denied, id.UID)
	}
	return "", fmt.Errorf("command %q not found on the job's PATH (%s)", name, path)
}

// mayRun reports whether uid id may execute the regular file f. An agent
// that is not root runs the job as itself, and the kernel answers
// (access(2)). A root agent runs it as id, with no supplementary groups:
// the file needs an execute bit for id, and f, the file a link at f leads
// to, and every directory on the way to either, a search bit, read as the
// kernel reads them: from the POSIX ACL where one is set, else from the
// mode.
func mayRun(f string, id ident, asRoot bool) bool {
	if !asRoot {
		return syscall.Access(f, 0o1) == nil // X_OK
	}
	if id.UID == 0 {
		return true // root runs anything with an execute bit
	}
	paths := []string{f}
	if real, err := filepath.EvalSymlinks(f); err == nil && real != f {
		paths = append(paths, real)
	}
	for _, p := range paths {
		for q := p; ; q = filepath.Dir(q) {
			if !modeAllows(q, id) {
				return false
			}
			if q == filepath.Dir(q) {
				break
			}
		}
	}
	return true
}

// modeAllows reports whether id may execute (search) p: by p's access
// ACL where it has one, else by the execute bit of p's mode for id's class
// (owner, group or other, the first that applies).
func modeAllows(p string, id ident) bool {
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		return false
	}
	if acl, ok := readACL(p); ok {
		return acl.allows(st, id, aclExecute)
	}
	var bit uint32 = 0o001
	switch {
	case st.Uid == id.UID:
		bit = 0o100
	case st.Gid == id.GID:
		bit = 0o010
	}
	return st.Mode&bit != 0
}

// A POSIX access ACL as Linux stores it in the system.posix_acl_access
// attribute: a version (2), then entries of tag, permissions and id, all
// little-endian (include/uapi/linux/posix_acl_xattr.h).
type posixACL []aclEntry

type aclEntry struct {
	tag, perm uint16
	id        uint32
}

const (
	aclUserObj  = 0x01
	aclUser     = 0x02
	aclGroupObj = 0x04
	aclGroup    = 0x08
	aclMask     = 0x10
	aclOther    = 0x20

	aclExecute = 0x1

	aclXattr   = "system.posix_acl_access"
	aclVersion = 2
)

// readACL reads p's access ACL, following links as stat does. A file
// with none (ENODATA), a file system without ACLs, or an attribute this
// does not read reports false: the mode alone decides.
func readACL(p string) (posixACL, bool) {
	buf := make([]byte, 4+8*32)
	n, err := syscall.Getxattr(p, aclXattr, buf)
	if err == syscall.ERANGE {
		if n, err = syscall.Getxattr(p, aclXattr, nil); err == nil {
			buf = make([]byte, n)
			n, err = syscall.Getxattr(p, aclXattr, buf)
		}
	}
	if err != nil {
		return nil, false
	}
	return parseACL(buf[:n])
}

func parseACL(b []byte) (posixACL, bool) {
	if len(b) < 4 || (len(b)-4)%8 != 0 || binary.LittleEndian.Uint32(b) != aclVersion {
		return nil, false
	}
	var acl posixACL
	for b = b[4:]; len(b) > 0; b = b[8:] {
		acl = append(acl, aclEntry{tag: binary.LittleEndian.Uint16(b), perm: binary.LittleEndian.Uint16(b[2:]), id: binary.LittleEndian.Uint32(b[4:])})
	}
	return acl, true
}

// allows is the kernel's ACL check (acl(5), "access check algorithm") for
// a process of uid id.UID and the one group id.GID: the owner's entry for
// the owner; else a named user's entry, under the mask; else the owning
// group's and named groups' entries that match, under the mask, any one
// granting; else, when no group entry matched, the others' entry.
func (acl posixACL) allows(st syscall.Stat_t, id ident, want uint16) bool {
	mask := uint16(0xffff)
	for _, e := range acl {
		if e.tag == aclMask {
			mask = e.perm
		}
	}
	if st.Uid == id.UID {
		for _, e := range acl {
			if e.tag == aclUserObj {
				return e.perm&want == want
			}
		}
		return false
	}
	for _, e := range acl {
		if e.tag == aclUser && e.id == id.UID {
			return e.perm&mask&want == want
		}
	}
	groupMatched := false
	for _, e := range acl {
		if (e.tag == aclGroupObj && st.Gid == id.GID) || (e.tag == aclGroup && e.id == id.GID) {
			groupMatched = true
			if e.perm&mask&want == want {
				return true
			}
		}
	}
	if groupMatched {
		return false
	}
	for _, e := range acl {
		if e.tag == aclOther {
			return e.perm&want == want
		}
	}
	return false
}

func (p *processRuntime) dropGroup(g *cgroup) {
	if g != nil {
		_ = g.remove()
	}
}

func (pp *processProc) PGID() int   { return pp.cmd.Process.Pid }
func (pp *processProc) Dir() string { return pp.dir }

func (pp *processProc) Signal(sig syscall.Signal) error {
	err := syscall.Kill(-pp.cmd.Process.Pid, sig)
	if sig == syscall.SIGKILL && pp.cg != nil {
		pp.cg.killAll()
	}
	return err
}

func (pp *processProc) Wait() Exit {
	_ = pp.cmd.Wait()
	pp.copy.wait()
	e := exitOf(pp.cmd.ProcessState)
	if pp.cg != nil {
		e = oomExit(e, pp.cg, false)
		_ = pp.cg.remove() // kills what is left, then removes it
	}
	return e
}

// String describes the process for logs.
func (pp *processProc) String() string { return fmt.Sprintf("pid %d", pp.cmd.Process.Pid) }
