package broker

import (
	"fmt"
	"path"
	"regexp"
	"strings"
)

// Bounds on the runtime fields of a spec.
const (
	maxMounts   = 64
	maxImageLen = 512
	maxShmSize  = 1 << 40
	maxUserLen  = 32
)

// Mount is a host path or a named volume the operator allows, made
// visible to the job at Target (the image runtime) or at its own path (the
// process runtime).
type Mount struct {
	// Source is an absolute host path or a volume name from the allow-list.
	Source string `json:"source"`
	// Target is where the job sees it (absolute); defaults to Source for a
	// host path.
	Target   string `json:"target,omitempty"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// MountRule is one entry of the operator's mount allow-list (config
// `mounts:`): a host path (and everything under it) or a named volume.
type MountRule struct {
	// Source is an absolute host path, or a volume name.
	Source string `json:"source"`
	// ReadOnly forces every mount of this source to be read-only.
	ReadOnly bool `json:"readOnly,omitempty"`
	// Teams limits the rule to these teams; empty means every team.
	Teams []string `json:"teams,omitempty"`
}

var (
	// imageRe is an OCI reference: [registry[:port]/]path[:tag][@digest].
	imageRe  = regexp.MustCompile(`^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$`)
	userRe   = regexp.MustCompile(`^[a-z_][a-z0-9_-]*$`)
	hashRe   = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)
	volumeRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
)

// normalizeRuntime applies the runtime fields' defaults and aliases.
func (s *Spec) normalizeRuntime() {
	if s.Resources.GPUs == 0 && s.Resources.GPU > 0 {
		// resources: {gpu: 1} is the seed's spelling of gpus.
		s.Resources.GPUs, s.Resources.GPU = s.Resources.GPU, 0
	} else if s.Resources.GPU == s.Resources.GPUs {
		s.Resources.GPU = 0
	}
	for i := range s.Mounts {
		if s.Mounts[i].Target == "" && strings.HasPrefix(s.Mounts[i].Source, "/") {
			s.Mounts[i].Target = s.Mounts[i].Source
		}
	}
}

// validateRuntime checks image, mounts, shmSize, user and the uploaded
// workdir against their rules and the operator's mount allow-list.
func (s *Spec) validateRuntime(ve *ValidationError, lim SpecLimits) {
	if s.Resources.GPU != 0 {
		ve.add("resources.gpu", CodeNotAllowed, "is another name for resources.gpus; give one of them (gpu: %d, gpus: %d)", s.Resources.GPU, s.Resources.GPUs)
	}
	if s.Image != "" {
		switch {
		case len(s.Image) > maxImageLen:
			ve.add("image", CodeTooLong, "is %d bytes; the limit is %d", len(s.Image), maxImageLen)
		case !imageRe.MatchString(s.Image):
			ve.add("image", CodeInvalid, "must be an OCI image reference like registry.example.com/team/train:1.2 or ubuntu@sha256:<digest>, got %q", clip(s.Image))
		}
	}
	if s.ShmSize < 0 || s.ShmSize > maxShmSize {
		ve.add("shmSize", CodeOutOfRange, "must be between 0 and 1Ti, got %s", s.ShmSize)
	} else if s.ShmSize > 0 && s.Image == "" {
		ve.add("shmSize", CodeNotAllowed, "needs an image: the process runtime shares the node's /dev/shm")
	}
	if s.User != "" {
		switch {
		case s.User == "root" || s.User == "0" || strings.HasPrefix(s.User, "0:"):
			ve.add("user", CodeNotAllowed, "jobs never run as root")
		case len(s.User) > maxUserLen || !userRe.MatchString(s.User):
			ve.add("user", CodeInvalid, "must be a user name (lower-case letters, digits, '_' and '-', at most %d), got %q", maxUserLen, clip(s.User))
		}
	}
	if s.WorkdirUpload != "" && !hashRe.MatchString(s.WorkdirUpload) {
		ve.add("workdirUpload", CodeInvalid, "must be sha256:<64 hex digits> as returned by POST /v1/uploads")
	}
	if len(s.Mounts) > maxMounts {
		ve.add("mounts", CodeTooLong, "has %d entries; the limit is %d", len(s.Mounts), maxMounts)
		return
	}
	targets := map[string]int{}
	for i, m := range s.Mounts {
		f := fmt.Sprintf("mounts[%d]", i)
		switch {
		case m.Source == "":
			ve.add(f+".source", CodeRequired, "is required: a host path or a volume name from the operator's allow-list")
			continue
		case len(m.Source) > maxPathLen || strings.IndexByte(m.Source, 0) >= 0:
			ve.add(f+".source", CodeInvalid, "must be a path of at most %d bytes without NUL", maxPathLen)
			continue
		case strings.HasPrefix(m.Source, "/") && path.Clean(m.Source) != m.Source:
			ve.add(f+".source", CodeInvalid, "must be a clean absolute path (no '..', '//' or trailing '/'), got %q", clip(m.Source))
			continue
		case !strings.HasPrefix(m.Source, "/") && !volumeRe.MatchString(m.Source):
			ve.add(f+".source", CodeInvalid, "must be an absolute host path or a volume name, got %q", clip(m.Source))
			continue
		}
		rule, ok := lim.mountRule(m.Source, s.Team)
		if !ok {
			ve.add(f+".source", CodeNotAllowed, "%q is not in the operator's mount allow-list%s", clip(m.Source), lim.allowedMounts(s.Team))
			continue
		}
		if rule.ReadOnly && !m.ReadOnly {
			ve.add(f+".readOnly", CodeNotAllowed, "must be true: %s is read-only in the allow-list", rule.Source)
		}
		switch {
		case m.Target == "":
			ve.add(f+".target", CodeRequired, "is required for a named volume")
		case len(m.Target) > maxPathLen || !strings.HasPrefix(m.Target, "/") || path.Clean(m.Target) != m.Target || strings.IndexByte(m.Target, 0) >= 0:
			ve.add(f+".target", CodeInvalid, "must be a clean absolute path, got %q", clip(m.Target))
		case m.Target == "/" || m.Target == "/proc" || m.Target == "/dev" || m.Target == "/sys":
			ve.add(f+".target", CodeNotAllowed, "cannot hide %s", m.Target)
		default:
			if j, dup := targets[m.Target]; dup {
				ve.add(f+".target", CodeInvalid, "is also the target of mounts[%d]", j)
			}
			targets[m.Target] = i
		}
	}
}

// mountRule finds the allow-list entry covering source for team: a volume
// by its name, a host path by the entry itself or a directory above it.
func (lim SpecLimits) mountRule(source, team string) (MountRule, bool) {
	for _, r := range lim.Mounts {
		if len(r.Teams) > 0 && !contains(r.Teams, team) {
			continue
		}
		if source == r.Source || strings.HasPrefix(r.Source, "/") && strings.HasPrefix(source, strings.TrimSuffix(r.Source, "/")+"/") {
			return r, true
		}
	}
	return MountRule{}, false
}

func (lim SpecLimits) allowedMounts(team string) string {
	var names []string
	for _, r := range lim.Mounts {
		if len(r.Teams) == 0 || contains(r.Teams, team) {
			names = append(names, r.Source)
		}
	}
	if len(names) == 0 {
		return " (the allow-list is empty: no mounts are allowed)"
	}
	return " (allowed: " + strings.Join(names, ", ") + ")"
}
