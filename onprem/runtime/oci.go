package runtime

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ociRuntime runs each attempt in its image under (rootful) Podman: as the
// job's unprivileged uid, without capabilities, in its own network
// namespace, in the attempt's memory cgroup, with the attempt directory at
// /workspace, the allowed mounts, and the cards by CDI name.
type ociRuntime struct {
	*base
	podman  string
	conf    string
	cgm     string
	oci     string
	network string
	cdi     bool
	tls     bool

	// pulls makes concurrent starts of one image share one pull.
	mu    sync.Mutex
	pulls map[string]*pull
}

type pull struct {
	done chan struct{}
	exit *Exit
}

// containersConf is what a node needs so that rootful Podman can start
// containers from an agent: no default ulimits (raising RLIMIT_NPROC fails
// where the agent's own limit is lower: "error setting rlimit type 7").
const containersConf = "[containers]\ndefault_ulimits = []\n"

// WorkspaceDir is where an attempt's directory appears in its container.
const WorkspaceDir = "/workspace"

func newOCI(b *base, cfg Podman, opt Options) (*ociRuntime, error) {
	r := &ociRuntime{base: b, podman: cfg.Path, conf: cfg.ContainersConf, cgm: cfg.CgroupManager,
		oci: cfg.OCIRuntime, network: cfg.Network, tls: cfg.TLSVerify == nil || *cfg.TLSVerify, pulls: map[string]*pull{}}
	if r.podman == "" {
		p, err := exec.LookPath("podman")
		if err != nil {
			return nil, errors.New("runtime.kind oci needs podman (apt-get install podman runc)")
		}
		r.podman = p
	}
	r.cgm = cmpOr(r.cgm, "cgroupfs")
	r.oci = cmpOr(r.oci, "runc")
	switch r.network {
	case "", "private", "none", "host":
	default:
		return nil, fmt.Errorf("runtime.podman.network: must be private, none or host, got %q", r.network)
	}
	switch cfg.GPUs {
	case "cdi":
		r.cdi = true
	case "env":
	case "":
		r.cdi = !opt.SimulatedGPUs
	default:
		return nil, fmt.Errorf("runtime.podman.gpus: must be cdi or env, got %q", cfg.GPUs)
	}
	if r.conf == "" {
		r.conf = filepath.Join(b.dataDir, "containers.conf")
		if err := os.WriteFile(r.conf, []byte(containersConf), 0o644); err != nil {
			return nil, fmt.Errorf("write containers.conf: %w", err)
		}
	}
	if !b.root {
		return nil, errors.New("runtime.kind oci needs the agent to run as root (rootful podman; jobs still run as unprivileged uids)")
	}
	if b.cg == nil {
		return nil, fmt.Errorf("runtime.kind oci needs a memory cgroup: %v", b.cgErr)
	}
	return r, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (r *ociRuntime) Kind() string { return KindOCI }

// command builds a podman invocation with the node's global flags.
func (r *ociRuntime) command(ctx context.Context, args ...string) *exec.Cmd {
	full := append([]string{"--cgroup-manager", r.cgm, "--runtime", r.oci}, args...)
	cmd := exec.CommandContext(ctx, r.podman, full...)
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+r.conf)
	return cmd
}

func containerName(id string) string { return "spillway-" + id }

type ociProc struct {
	r    *ociRuntime
	cmd  *exec.Cmd
	name string
	dir  string
	cg   *cgroup
	copy *copier
	tail *tailBuffer

	mu     sync.Mutex
	killed bool // the agent sent SIGKILL
}

func (r *ociRuntime) Start(ctx context.Context, j *Job) (Proc, *Exit) {
	if j.Image == "" {
		return nil, startFailure(ReasonRuntimeError, "this node runs jobs in containers (runtime.kind: oci) and the job names no image")
	}
	if len(j.Argv) == 0 {
		return nil, startFailure(ReasonRuntimeError, "empty command")
	}
	if e := r.EnsureImage(ctx, j.Image, j.Progress); e != nil {
		return nil, e
	}
	id, err := r.ident(j)
	if err != nil {
		return nil, startFailure(ReasonRuntimeError, "map the job's user: %v", err)
	}
	dir, err := r.prepareDir(j, id)
	if err != nil {
		return nil, prepareFailure(err)
	}
	if j.Barrier != nil {
		if e := passBarrier(j, r.imageID(ctx, j.Image)); e != nil {
			return nil, e
		}
	}
	// Every attempt gets its own cgroup, with or without a limit, so
	// that an OOM kill is told apart and nothing escapes the kill.
	limit := j.Memory
	if limit <= 0 {
		limit = -1
	}
	cg, err := r.cg.create(j.ID, limit)
	if err != nil {
		return nil, startFailure(ReasonRuntimeError, "cgroup: %v", err)
	}
	if j.Memory <= 0 {
		cg.limit = 0
	}
	name := containerName(j.ID)
	_ = r.command(ctx, "rm", "-f", "--ignore", name).Run()
	workdir := cmpOr(j.Workdir, WorkspaceDir)
	args := []string{"run", "--rm", "--name", name, "--pull", "never",
		"--label", "spillway.attempt=" + j.ID, "--label", "spillway.agent=" + r.agentID(),
		"--user", fmt.Sprintf("%d:%d", id.UID, id.GID),
		"--cap-drop", "all", "--security-opt", "no-new-privileges",
		"--cgroup-parent", cg.rel,
		"--volume", dir + ":" + WorkspaceDir,
		"--workdir", workdir,
		"--env", "HOME=" + WorkspaceDir,
	}
	switch {
	case j.HostNetwork || r.network == "host":
		args = append(args, "--network", "host")
	case r.network == "none":
		args = append(args, "--network", "none")
	}
	if j.ShmSize > 0 {
		args = append(args, "--shm-size", strconv.FormatInt(j.ShmSize, 10)+"b")
	}
	for _, m := range j.Mounts {
		v := m.Source + ":" + m.Target
		if m.ReadOnly {
			v += ":ro"
		}
		args = append(args, "--volume", v)
	}
	if r.cdi {
		for _, u := range j.GPUs {
			args = append(args, "--device", "nvidia.com/gpu="+u)
		}
	}
	// The job's variables go to podman by name only, their values through
	// podman's own environment: the command line of any process is
	// readable by every user of the node, its environment is not.
	podEnv := []string{}
	for _, kv := range j.Env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "HOME" {
			continue
		}
		args = append(args, "--env", k)
		podEnv = append(podEnv, kv)
	}
	args = append(args, j.Image)
	args = append(args, j.Argv...)
	cmd := r.command(context.Background(), args...)
	cmd.Env = append(cmd.Env, podEnv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr, pw, err := os.Pipe()
	if err != nil {
		_ = cg.remove()
		return nil, startFailure(ReasonRuntimeError, "create pipe: %v", err)
	}
	tail := &tailBuffer{max: 4096}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		_ = cg.remove()
		return nil, startFailure(ReasonRuntimeError, "run podman: %v", err)
	}
	pw.Close()
	return &ociProc{r: r, cmd: cmd, name: name, dir: dir, cg: cg, tail: tail,
		copy: startCopy(io.MultiWriter(j.Output, tail), pr)}, nil
}

func (p *ociProc) PGID() int   { return p.cmd.Process.Pid }
func (p *ociProc) Dir() string { return p.dir }

// Signal goes to the container's processes through podman kill; SIGKILL
// also kills whatever is left in the attempt's cgroup and the podman
// client, so a stop never depends on podman answering.
func (p *ociProc) Signal(sig syscall.Signal) error {
	if sig == syscall.SIGKILL {
		p.mu.Lock()
		p.killed = true
		p.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := p.r.command(ctx, "kill", "--signal", strconv.Itoa(int(sig)), p.name).Run()
	if sig == syscall.SIGKILL {
		p.cg.killAll()
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		return nil
	}
	return err
}

func (p *ociProc) Wait() Exit {
	_ = p.cmd.Wait()
	p.copy.wait()
	e := exitOf(p.cmd.ProcessState)
	// podman run exits 125 when podman itself failed, 126 when the
	// command could not be invoked, 127 when it was not found.
	switch e.Code {
	case 125:
		e.Reason, e.Message = ReasonRuntimeError, "podman: "+p.tail.lastError()
	case 126, 127:
		if m := p.tail.lastError(); m != "" {
			e.Message = m
		}
	}
	p.mu.Lock()
	unsent := !p.killed
	p.mu.Unlock()
	e = oomExit(e, p.cg, unsent)
	_ = p.cg.remove() // kills what is left, then removes it
	return e
}

// Forget removes the container if podman left it, then the attempt's
// directory and cgroup.
func (r *ociRuntime) Forget(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = r.command(ctx, "rm", "-f", "--ignore", containerName(id)).Run()
	r.forget(id)
}

// EnsureImage makes the image present in the node's image store (the
// node-local cache): there already, or pulled now with progress. One pull
// per image at a time; concurrent starts wait for it.
func (r *ociRuntime) EnsureImage(ctx context.Context, image string, progress func(string)) *Exit {
	if r.command(ctx, "image", "exists", image).Run() == nil {
		return nil
	}
	r.mu.Lock()
	p, ok := r.pulls[image]
	if !ok {
		p = &pull{done: make(chan struct{})}
		r.pulls[image] = p
		go func() {
			p.exit = r.pull(context.WithoutCancel(ctx), image, progress)
			r.mu.Lock()
			delete(r.pulls, image)
			r.mu.Unlock()
			close(p.done)
		}()
	}
	r.mu.Unlock()
	select {
	case <-p.done:
		return p.exit
	case <-ctx.Done():
		return startFailure(ReasonPullFailed, "pull of %s abandoned: %v", image, ctx.Err())
	}
}

// pull runs podman pull. Progress is the bytes podman has written to its
// own temporary directory against the image's size from its manifest.
func (r *ociRuntime) pull(ctx context.Context, image string, progress func(string)) *Exit {
	tmp, err := os.MkdirTemp(r.dataDir, "pull-")
	if err != nil {
		return startFailure(ReasonPullFailed, "pull %s: %v", image, err)
	}
	defer os.RemoveAll(tmp)
	tlsFlag := "--tls-verify=" + strconv.FormatBool(r.tls)
	total := r.imageSize(ctx, image, tlsFlag)
	cmd := r.command(ctx, "pull", "--quiet", tlsFlag, image)
	cmd.Env = append(cmd.Env, "TMPDIR="+tmp)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return startFailure(ReasonPullFailed, "pull %s: %v", image, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = cmd.Wait()
	}()
	report := func() {
		if progress != nil {
			progress(PullProgress(dirSize(tmp), total))
		}
	}
	report()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
loop:
	for {
		select {
		case <-done:
			break loop
		case <-tick.C:
			report()
		}
	}
	if cmd.ProcessState != nil && cmd.ProcessState.Success() {
		if progress != nil && total > 0 {
			progress(PullProgress(total, total))
		}
		return nil
	}
	return classifyPull(image, out.String())
}

// PullProgress is the line `spillway status` shows while a node pulls the
// image: "pulling image 1.2/4.0 GB", in MB below a gigabyte ("pulling
// image 32/65 MB"), or without the total when the registry did not tell
// the size.
func PullProgress(have, total int64) string {
	unit, div, prec := "GB", 1e9, 1
	if max(have, total) < 1e9 {
		unit, div, prec = "MB", 1e6, 0
	}
	f := func(b int64) string { return strconv.FormatFloat(float64(b)/div, 'f', prec, 64) }
	if total > 0 {
		return fmt.Sprintf("pulling image %s/%s %s", f(min(have, total)), f(total), unit)
	}
	return fmt.Sprintf("pulling image %s %s", f(have), unit)
}

// imageSize is the image's size from its registry's manifest, 0 when
// the registry does not say.
func (r *ociRuntime) imageSize(ctx context.Context, image, _ string) int64 {
	return registrySize(ctx, image, r.tls)
}

// classifyPull turns podman's words into a reason. Podman is a command,
// not a library here: its message is all there is to go on.
func classifyPull(image, out string) *Exit {
	msg := lastErrorLine(out)
	low := strings.ToLower(out)
	switch {
	case strings.Contains(low, "manifest unknown") || strings.Contains(low, "name unknown") ||
		strings.Contains(low, "not found") || strings.Contains(low, "no such host") ||
		strings.Contains(low, "connection refused") || strings.Contains(low, "short-name"):
		return startFailure(ReasonImageNotFound, "image not found: %s is not in the node's image cache and could not be pulled (%s)", image, msg)
	case strings.Contains(low, "unauthorized") || strings.Contains(low, "denied") || strings.Contains(low, "authentication required"):
		return startFailure(ReasonPullDenied, "pull denied: the registry refused %s (%s); check the node's registry credentials", image, msg)
	}
	return startFailure(ReasonPullFailed, "pull of %s failed: %s", image, msg)
}

func lastErrorLine(out string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); strings.HasPrefix(l, "Error: ") {
			return clipLine(strings.TrimPrefix(l, "Error: "))
		}
	}
	if len(lines) > 0 {
		return clipLine(lines[len(lines)-1])
	}
	return ""
}

func clipLine(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// tailBuffer keeps the last bytes of the output, where podman's own
// error is.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = t.buf[len(t.buf)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) lastError() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return lastErrorLine(string(t.buf))
}

// agentID names this agent's containers (several agents may share a
// host: tests, or nodes with several agents): its data dir's hash.
func (r *ociRuntime) agentID() string {
	sum := sha256.Sum256([]byte(r.dataDir))
	return hex.EncodeToString(sum[:6])
}

// RemoveLeftovers removes every container an earlier process of this
// agent started (they carry its spillway.agent label) and returns their
// names: after an agent crash conmon keeps them running, holding cards.
// Call it before the agent starts any attempt.
func (r *ociRuntime) RemoveLeftovers(ctx context.Context) []string {
	out, err := r.command(ctx, "ps", "-a", "--filter", "label=spillway.agent="+r.agentID(), "--format", "{{.Names}}").Output()
	if err != nil {
		return nil
	}
	names := strings.Fields(string(out))
	if len(names) > 0 {
		_ = r.command(ctx, append([]string{"rm", "-f", "--time", "0"}, names...)...).Run()
	}
	return names
}
