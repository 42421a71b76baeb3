// Package runtime starts a job's attempt on a node and isolates it. Two
// runtimes exist, chosen per node in the agent's config:
//
//   - process: the command runs as a child of the agent, as the
//     unprivileged uid the node maps the job's user or team to (never
//     root), in a 0700 directory owned by that uid, with the memory limit
//     in a cgroup where the node has one;
//   - oci: the command runs in the job's image under Podman, as that same
//     uid, with its own network namespace, the memory limit, the allowed
//     mounts and the cards by CDI name.
//
// Both report how an attempt ended, the runtime's own failures included
// (image not found, pull denied, OOM-killed by the limit), so the broker
// can say so before the job's log.
package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

// Kinds of runtime.
const (
	KindProcess = "process"
	KindOCI     = "oci"
)

// Reasons a Proc reports for an end the runtime itself caused or saw.
const (
	ReasonImageNotFound = "image_not_found"
	ReasonPullDenied    = "pull_denied"
	ReasonPullFailed    = "pull_failed"
	ReasonOOMLimit      = "oom_limit"
	ReasonOOMNode       = "oom_node"
	ReasonRuntimeError  = "runtime_error"
)

// Config is the runtime part of the agent's configuration (`runtime:`).
type Config struct {
	// Kind is process (the default) or oci.
	Kind string `json:"kind,omitempty"`
	// Users maps a team ("nlp") or a user of a team ("nlp/alice") to the
	// host uid[:gid] its jobs run as. Unlisted teams get a uid from
	// UIDRange, remembered in the data dir.
	Users map[string]string `json:"users,omitempty"`
	// PerUser gives every user of a team its own uid from UIDRange instead
	// of one uid per team.
	PerUser bool `json:"perUser,omitempty"`
	// UIDRange is "first-last" (default 20000-29999); never includes 0.
	UIDRange string `json:"uidRange,omitempty"`
	// JobsDir holds the attempts' working directories; every directory
	// above it must be searchable by others (o+x). Default: <dataDir>/jobs
	// when reachable, else a fresh 0711 directory under $TMPDIR.
	JobsDir string `json:"jobsDir,omitempty"`
	// Podman configures the oci runtime.
	Podman Podman `json:"podman,omitempty"`
	// PrePull lists images to pull when the agent starts (a burst
	// machine's bootstrap fills it with the queue's most-used images).
	PrePull []string `json:"prePull,omitempty"`
}

// Podman is how the oci runtime calls Podman.
type Podman struct {
	// Path of the podman binary (default: podman on PATH).
	Path string `json:"path,omitempty"`
	// CgroupManager: cgroupfs (default) or systemd.
	CgroupManager string `json:"cgroupManager,omitempty"`
	// OCIRuntime is the low-level runtime (default runc).
	OCIRuntime string `json:"ociRuntime,omitempty"`
	// ContainersConf is a containers.conf passed as CONTAINERS_CONF; the
	// agent writes one with `default_ulimits = []` under its data dir when
	// this is empty.
	ContainersConf string `json:"containersConf,omitempty"`
	// Network is the network mode of jobs: "" or "private" (their own
	// namespace with the node's default bridge), "none", or "host".
	// Gangs get the host network whatever this says.
	Network string `json:"network,omitempty"`
	// GPUs: "cdi" passes cards as --device nvidia.com/gpu=UUID (generate
	// the spec with `nvidia-ctk cdi generate`); "env" (simulated GPUs)
	// only sets CUDA_VISIBLE_DEVICES. Default: cdi on an NVML node, env
	// otherwise.
	GPUs string `json:"gpus,omitempty"`
	// TLSVerify: false allows plain-HTTP registries (tests, a local
	// mirror). Default true.
	TLSVerify *bool `json:"tlsVerify,omitempty"`
}

// Mount is one allowed mount of a job.
type Mount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// Job is one attempt to start.
type Job struct {
	// ID names the attempt uniquely on the node ("<job>-<attempt>").
	ID   string
	Team string
	User string
	Argv []string
	// Env is the job's whole environment (KEY=VALUE), nothing inherited.
	Env []string
	// Image is the OCI image (oci runtime); empty for the process runtime.
	Image string
	// Workdir is where the command starts: for process, a host path (""
	// = the attempt's own directory); for oci, a path in the container
	// ("" = /workspace, where the attempt directory is mounted).
	Workdir string
	// Prepare, when set, fills the attempt's directory (it is empty and
	// owned by root then) before the uid takes it over: the unpacked
	// upload.
	Prepare func(dir string) error
	Mounts  []Mount
	// Memory is the limit in bytes (0: none).
	Memory  int64
	ShmSize int64
	// GPUs are the cards' UUIDs.
	GPUs []string
	// HostNetwork puts the job in the node's network namespace (gangs).
	HostNetwork bool
	// Barrier, when set, is called once the attempt is ready to run (image
	// present, directory prepared and staged) and before its command runs;
	// image is the image's id (oci) or "". An error ends the start: a
	// gang member waits here for the others (the start barrier).
	Barrier func(image string) error
	// Output receives stdout and stderr.
	Output io.Writer
	// Progress, when set, hears about slow steps before the start
	// ("pulling image 1.2/4.0 GB").
	Progress func(string)
}

// Exit is how an attempt ended.
type Exit struct {
	Code   int
	Signal string
	// Reason is one of the Reason constants when the runtime knows more
	// than the exit status; Message says it for people.
	Reason  string
	Message string
}

// Proc is a started attempt.
type Proc interface {
	// PGID is the process group the agent's leak cleanup and ownership
	// tracking use (the podman client's for oci).
	PGID() int
	// Signal sends sig to every process of the attempt.
	Signal(sig syscall.Signal) error
	// Wait blocks until the attempt has ended and its output is written.
	Wait() Exit
	// Dir is the attempt's working directory on the host.
	Dir() string
}

// Runtime starts attempts.
type Runtime interface {
	Kind() string
	// Start starts one attempt. An error is a failure to start, with the
	// Exit to report (Reason set when the runtime knows why).
	Start(ctx context.Context, j *Job) (Proc, *Exit)
	// Forget removes what is left of an attempt (its directory, cgroup).
	Forget(id string)
}

// PrepareError is a failure of Job.Prepare with the reason to report
// (staging's input_missing, say); other Prepare errors are runtime errors.
type PrepareError struct {
	Reason string
	Err    error
}

func (e *PrepareError) Error() string { return e.Err.Error() }
func (e *PrepareError) Unwrap() error { return e.Err }

// prepareFailure is the Exit for a failed prepareDir.
func prepareFailure(err error) *Exit {
	var pe *PrepareError
	if errors.As(err, &pe) && pe.Reason != "" {
		return startFailure(pe.Reason, "%v", pe.Err)
	}
	return startFailure(ReasonRuntimeError, "%v", err)
}

// StartError is an attempt that could not start.
func startFailure(reason, format string, args ...any) *Exit {
	return &Exit{Code: 127, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// Options are what a runtime needs from the agent.
type Options struct {
	// DataDir is the agent's private state directory.
	DataDir string
	// SimulatedGPUs is true when the node's cards are simulated.
	SimulatedGPUs bool
}

// New makes the runtime the config selects.
func New(cfg Config, opt Options) (Runtime, error) {
	if opt.DataDir == "" {
		return nil, errors.New("runtime needs the agent's data dir")
	}
	base, err := newBase(cfg, opt)
	if err != nil {
		return nil, err
	}
	switch cfg.Kind {
	case "", KindProcess:
		if base.cg != nil {
			// Only Podman makes an attempt's groups outside the memory
			// hierarchy: looking there would cost a lookup per hierarchy
			// at every attempt's end.
			base.cg.others = nil
		}
		return &processRuntime{base: base}, nil
	case KindOCI:
		return newOCI(base, cfg.Podman, opt)
	}
	return nil, fmt.Errorf("runtime.kind: must be process or oci, got %q", cfg.Kind)
}

// isRoot reports whether the agent can switch uids.
func isRoot() bool { return os.Geteuid() == 0 }
