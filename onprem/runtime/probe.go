package runtime

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Probe is what `spillway agent --probe` says about the node's runtime:
// which isolation and limits it can enforce, and why not where it cannot.
type Probe struct {
	Kind string `json:"kind"`
	// RunsAs says which uid jobs get.
	RunsAs string `json:"runsAs"`
	// Memory says whether resources.memory is enforced, and how.
	Memory string `json:"memory"`
	// Processes says what a job can see of other processes.
	Processes string `json:"processes"`
	JobsDir   string `json:"jobsDir"`
	// Podman, CDI and Images are for the oci runtime.
	Podman string   `json:"podman,omitempty"`
	CDI    string   `json:"cdi,omitempty"`
	Images []string `json:"images,omitempty"`
	// Problems lists what stops the configured runtime from working.
	Problems []string `json:"problems,omitempty"`
}

// ProbeNode checks the node for the configured runtime without starting
// the agent.
func ProbeNode(cfg Config, opt Options) Probe {
	p := Probe{Kind: cmpOr(cfg.Kind, KindProcess)}
	b, err := newBase(cfg, opt)
	if err != nil {
		p.Problems = append(p.Problems, err.Error())
		return p
	}
	p.JobsDir = b.jobsDir
	if b.root {
		p.RunsAs = "an unprivileged uid per team" + map[bool]string{true: " and user", false: ""}[cfg.PerUser] +
			" (runtime.users, else runtime.uidRange " + cmpOr(cfg.UIDRange, "20000-29999") + "); never root"
	} else {
		p.RunsAs = fmt.Sprintf("the agent's own uid %d (the agent is not root, so jobs share its uid: no isolation between jobs)", os.Geteuid())
	}
	if b.cg != nil {
		p.Memory = "enforced: a memory cgroup per attempt (" + b.cg.version() + ", " + b.cg.root + "/" + cgroupParent + ")"
	} else {
		p.Memory = "not enforced: " + b.cgErr.Error()
	}
	p.Processes = procVisibility()
	if p.Kind == KindOCI {
		r, err := newOCI(b, cfg.Podman, opt)
		if err != nil {
			p.Problems = append(p.Problems, err.Error())
			return p
		}
		p.Processes = "a pid namespace per container: a job sees only its own processes"
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := r.command(ctx, "version", "--format", "{{.Client.Version}}").CombinedOutput()
		if err != nil {
			p.Problems = append(p.Problems, "podman version: "+strings.TrimSpace(string(out)))
		} else {
			p.Podman = fmt.Sprintf("%s %s (--cgroup-manager %s --runtime %s, CONTAINERS_CONF=%s)", r.podman, strings.TrimSpace(string(out)), r.cgm, r.oci, r.conf)
		}
		if _, err := exec.LookPath(r.oci); err != nil {
			p.Problems = append(p.Problems, "OCI runtime "+r.oci+" not found (apt-get install "+r.oci+")")
		}
		if r.cdi {
			p.CDI = cdiSpecs()
			if p.CDI == "" {
				p.Problems = append(p.Problems, "no CDI spec for nvidia.com/gpu in /etc/cdi or /var/run/cdi: run `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`")
			}
		} else {
			p.CDI = "not used: simulated GPUs get CUDA_VISIBLE_DEVICES only"
		}
		if out, err := r.command(ctx, "images", "--format", "{{.Repository}}:{{.Tag}}").Output(); err == nil {
			for _, l := range strings.Fields(string(out)) {
				p.Images = append(p.Images, l)
			}
		}
	}
	return p
}

// procVisibility reads /proc's hidepid option.
func procVisibility() string {
	raw, _ := os.ReadFile("/proc/mounts")
	for _, l := range strings.Split(string(raw), "\n") {
		f := strings.Fields(l)
		if len(f) >= 4 && f[1] == "/proc" && f[2] == "proc" {
			if strings.Contains(f[3], "hidepid=2") || strings.Contains(f[3], "hidepid=invisible") {
				return "hidepid=invisible: a job sees only its own uid's processes"
			}
			return "a job can list other processes but not read their environment or memory (other uids); mount /proc with hidepid=invisible to hide them"
		}
	}
	return "unknown (/proc not found)"
}

func cdiSpecs() string {
	for _, dir := range []string{"/etc/cdi", "/var/run/cdi"} {
		matches, _ := filepath.Glob(filepath.Join(dir, "*"))
		for _, m := range matches {
			raw, err := os.ReadFile(m)
			if err == nil && strings.Contains(string(raw), "nvidia.com/gpu") {
				return m
			}
		}
	}
	return ""
}
