package broker

import (
	"fmt"
	"path"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"
)

// MaxSpecBytes is the largest job spec the API accepts.
const MaxSpecBytes = 256 << 10

// Bounds on the strings and lists inside a spec. They keep a hostile spec
// from filling the store or a terminal.
const (
	maxNameLen     = 63
	maxArgs        = 4096
	maxArgBytes    = 32 << 10
	maxEnv         = 512
	maxEnvValue    = 32 << 10
	maxPathLen     = 4096
	maxModelLen    = 64
	maxRetriesCap  = 100
	maxCPU         = 1024
	maxMemory      = 64 << 40
	maxGrace       = time.Hour
	defaultGrace   = 30 * time.Second
	defaultSignal  = "SIGTERM"
	minGPUMemory   = 1 << 20
	maxNodesPerJob = 256
)

// RestartPolicy says what happens when a job's process fails.
type RestartPolicy string

// Restart policies.
const (
	RestartNever     RestartPolicy = "Never"
	RestartOnFailure RestartPolicy = "OnFailure"
)

// BurstPolicy says whether a job may run on rented capacity.
type BurstPolicy string

// Burst policies.
const (
	BurstNever   BurstPolicy = "never"
	BurstAllowed BurstPolicy = "allowed"
	BurstPrefer  BurstPolicy = "prefer"
)

// Spec is what a user submits: the job of DESIGN.md. The scheduler decides
// only from what a spec declares.
type Spec struct {
	Name          string            `json:"name"`
	Team          string            `json:"team,omitempty"`
	Project       string            `json:"project,omitempty"`
	Queue         string            `json:"queue,omitempty"`
	Priority      string            `json:"priority,omitempty"`
	Resources     Resources         `json:"resources"`
	Timeout       Duration          `json:"timeout,omitempty"`
	RestartPolicy RestartPolicy     `json:"restartPolicy,omitempty"`
	MaxRetries    int               `json:"maxRetries,omitempty"`
	Preemptible   bool              `json:"preemptible,omitempty"`
	Checkpoint    Checkpoint        `json:"checkpoint,omitempty"`
	Burst         BurstPolicy       `json:"burst,omitempty"`
	Command       []string          `json:"command"`
	Env           map[string]string `json:"env,omitempty"`
	Workdir       string            `json:"workdir,omitempty"`
	// Array makes one submit into one job per index ("0-999", "1,3,5-7",
	// "0-15:4"); each job gets its index in SPILLWAY_ARRAY_INDEX.
	Array string `json:"array,omitempty"`
	// Inputs are fetched before the job starts and Outputs uploaded after
	// it ends; see docs/data.md.
	Inputs  []Input  `json:"inputs,omitempty"`
	Outputs []Output `json:"outputs,omitempty"`

	// Runtime fields (spec_runtime.go): the image to run in, the uploaded
	// working directory, allowed mounts, shared memory and the user.
	Image         string   `json:"image,omitempty"`
	WorkdirUpload string   `json:"workdirUpload,omitempty"`
	Mounts        []Mount  `json:"mounts,omitempty"`
	ShmSize       Quantity `json:"shmSize,omitempty"`
	User          string   `json:"user,omitempty"`
}

// Resources is what a job needs on each node.
type Resources struct {
	// GPUs is whole GPUs per node.
	GPUs int `json:"gpus"`
	// GPUMemory, when below a card's memory, lets the job share a card.
	GPUMemory Quantity `json:"gpuMemory,omitempty"`
	GPUModel  string   `json:"gpuModel,omitempty"`
	CPU       float64  `json:"cpu,omitempty"`
	Memory    Quantity `json:"memory,omitempty"`
	// Nodes > 1 makes a gang: all nodes start together or none does.
	Nodes int `json:"nodes,omitempty"`
	// GPU is accepted as another name for GPUs (resources: {gpu: 1});
	// Normalize moves it into GPUs.
	GPU int `json:"gpu,omitempty"`
}

// Checkpoint is what a job gets before it is stopped: Signal, then Grace to
// save its work, then SIGKILL.
type Checkpoint struct {
	Signal string   `json:"signal,omitempty"`
	Grace  Duration `json:"grace,omitempty"`
	// Dir is where the job writes its checkpoint; To is the object-store
	// prefix it is synced to after Signal and Grace, and every Interval,
	// and restored from before a resumed attempt; Keep is how many
	// committed checkpoints stay there. See docs/data.md.
	Dir      string   `json:"dir,omitempty"`
	To       string   `json:"to,omitempty"`
	Keep     int      `json:"keep,omitempty"`
	Interval Duration `json:"interval,omitempty"`
}

// QueueLimits is what validation needs to know about one queue.
type QueueLimits struct {
	DefaultTimeout time.Duration
	MaxTimeout     time.Duration
}

// SpecLimits is the part of the cluster's configuration and inventory that
// decides whether a spec can ever run.
type SpecLimits struct {
	Queues          map[string]QueueLimits
	DefaultQueue    string
	Priorities      []string
	DefaultPriority string
	// MaxGPUs is the most GPUs any single node or cloud offer has.
	MaxGPUs int
	// MaxGPUMemory is the largest card's memory in bytes (0: unknown).
	MaxGPUMemory int64
	// MaxNodes bounds gang size.
	MaxNodes int
	// Buckets lists, per team, the object-store locations its jobs may
	// read and write (inputs, outputs, checkpoint.to).
	Buckets map[string][]string
	// Mounts is the operator's mount allow-list.
	Mounts []MountRule
}

// Signals a job may ask for as its checkpoint signal.
var checkpointSignals = []string{"SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT"}

// reservedEnv are set by the agent; a spec may not override them.
var reservedEnv = []string{"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "NVIDIA_VISIBLE_DEVICES"}

var (
	labelRe  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	envKeyRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	modelRe  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._ -]*$`)
)

// ParseSpec reads a YAML or JSON job spec. It rejects documents over
// MaxSpecBytes, malformed ones, wrong types and unknown fields, each with the
// path of the offending field. It does not apply defaults or limits; see
// Spec.Normalize and Spec.Validate.
func ParseSpec(doc []byte) (Spec, error) {
	var s Spec
	if len(doc) > MaxSpecBytes {
		return s, &ValidationError{Errors: []FieldError{{Code: CodeTooLarge,
			Message: fmt.Sprintf("spec is %d bytes; the limit is %d (256 KiB)", len(doc), MaxSpecBytes)}}}
	}
	if !utf8.Valid(doc) {
		return s, &ValidationError{Errors: []FieldError{{Code: CodeMalformed, Message: "spec is not valid UTF-8"}}}
	}
	if err := DecodeStrict(doc, &s); err != nil {
		return s, err
	}
	if s.Timeout == 0 && hasTopLevelKey(doc, "timeout") {
		// An explicit "timeout: 0" must not silently become the queue's
		// default.
		return s, &ValidationError{Errors: []FieldError{{Field: "timeout", Code: CodeOutOfRange, Message: "must be greater than 0"}}}
	}
	return s, nil
}

// Normalize fills what the user left out: team from the caller, queue,
// priority, timeout from the queue, and the documented defaults.
func (s *Spec) Normalize(callerTeam string, lim SpecLimits) {
	if s.Team == "" {
		s.Team = callerTeam
	}
	if s.Queue == "" {
		s.Queue = lim.DefaultQueue
	}
	if s.Priority == "" {
		s.Priority = lim.DefaultPriority
	}
	if s.Resources.Nodes == 0 {
		s.Resources.Nodes = 1
	}
	if q, ok := lim.Queues[s.Queue]; ok && s.Timeout == 0 {
		s.Timeout = Duration(q.DefaultTimeout)
	}
	if s.RestartPolicy == "" {
		s.RestartPolicy = RestartNever
	}
	if s.Checkpoint.Signal == "" {
		s.Checkpoint.Signal = defaultSignal
	}
	if s.Checkpoint.Grace == 0 {
		s.Checkpoint.Grace = Duration(defaultGrace)
	}
	if s.Burst == "" {
		s.Burst = BurstAllowed
	}
	if s.Name == "" && len(s.Command) > 0 {
		s.Name = NameFromCommand(s.Command)
	}
	s.normalizeData()
	s.normalizeRuntime()
}

// NameFromCommand makes a job name from argv[0] ("python" for
// ["/usr/bin/python", "x.py"]), used when a spec has no name.
func NameFromCommand(argv []string) string {
	b := []byte(path.Base(argv[0]))
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' {
			out = append(out, c)
		}
	}
	for len(out) > 0 && !(out[0] >= 'a' && out[0] <= 'z' || out[0] >= 'A' && out[0] <= 'Z' || out[0] >= '0' && out[0] <= '9') {
		out = out[1:]
	}
	if len(out) > maxNameLen {
		out = out[:maxNameLen]
	}
	if len(out) == 0 {
		return "job"
	}
	return string(out)
}

// Validate checks every field against its rule and the cluster's limits and
// returns a *ValidationError listing all problems, or nil. Call Normalize
// first.
func (s *Spec) Validate(lim SpecLimits) error {
	ve := &ValidationError{}
	// Without a command there is no name to derive; report the command.
	checkLabel(ve, "name", s.Name, len(s.Command) > 0)
	checkLabel(ve, "team", s.Team, true)
	checkLabel(ve, "project", s.Project, false)

	q, queueOK := lim.Queues[s.Queue]
	switch {
	case s.Queue == "":
		ve.add("queue", CodeRequired, "is required")
	case !queueOK:
		ve.add("queue", CodeInvalid, "unknown queue %q (known: %s)", clip(s.Queue), strings.Join(sortedQueueNames(lim.Queues), ", "))
	}
	if !contains(lim.Priorities, s.Priority) {
		ve.add("priority", CodeInvalid, "unknown priority %q (known: %s)", clip(s.Priority), strings.Join(lim.Priorities, ", "))
	}

	r := s.Resources
	maxGPUs := lim.MaxGPUs
	switch {
	case r.GPUs < 1:
		ve.add("resources.gpus", CodeOutOfRange, "must be at least 1, got %d", r.GPUs)
	case maxGPUs > 0 && r.GPUs > maxGPUs:
		ve.add("resources.gpus", CodeOutOfRange, "must be at most %d (the largest node or cloud offer), got %d", maxGPUs, r.GPUs)
	}
	maxNodes := lim.MaxNodes
	if maxNodes <= 0 || maxNodes > maxNodesPerJob {
		maxNodes = maxNodesPerJob
	}
	if r.Nodes < 1 || r.Nodes > maxNodes {
		ve.add("resources.nodes", CodeOutOfRange, "must be between 1 and %d, got %d", maxNodes, r.Nodes)
	}
	if r.GPUMemory != 0 {
		switch {
		case r.GPUMemory < minGPUMemory:
			ve.add("resources.gpuMemory", CodeOutOfRange, "must be at least 1Mi, got %d bytes", int64(r.GPUMemory))
		case lim.MaxGPUMemory > 0 && int64(r.GPUMemory) > lim.MaxGPUMemory:
			ve.add("resources.gpuMemory", CodeOutOfRange, "must be at most %s (the largest card), got %s", FormatQuantity(lim.MaxGPUMemory), r.GPUMemory)
		case r.Nodes > 1:
			ve.add("resources.gpuMemory", CodeNotAllowed, "cannot be combined with nodes > 1: gang jobs take whole cards")
		}
	}
	if r.GPUModel != "" && (len(r.GPUModel) > maxModelLen || !modelRe.MatchString(r.GPUModel)) {
		ve.add("resources.gpuModel", CodeInvalid, "must be a model name like H100 or A100-80GB (letters, digits, '.', '_', '-', at most %d)", maxModelLen)
	}
	if r.CPU < 0 || r.CPU > maxCPU {
		ve.add("resources.cpu", CodeOutOfRange, "must be between 0 and %d cores, got %g", maxCPU, r.CPU)
	}
	if r.Memory < 0 || r.Memory > maxMemory {
		ve.add("resources.memory", CodeOutOfRange, "must be between 0 and 64Ti, got %s", r.Memory)
	}

	switch {
	case s.Timeout < 0 || (s.Timeout == 0 && queueOK):
		// A timeout left out comes from the queue; with an unknown queue
		// (reported above) there is none, and no second error for it.
		ve.add("timeout", CodeOutOfRange, "must be greater than 0")
	case queueOK && q.MaxTimeout > 0 && s.Timeout.D() > q.MaxTimeout:
		ve.add("timeout", CodeOutOfRange, "must be at most %s (queue %s's maximum), got %s", FormatDuration(q.MaxTimeout), s.Queue, s.Timeout)
	}
	switch s.RestartPolicy {
	case RestartNever, RestartOnFailure:
	default:
		ve.add("restartPolicy", CodeInvalid, "must be Never or OnFailure, got %q", clip(string(s.RestartPolicy)))
	}
	switch {
	case s.MaxRetries < 0 || s.MaxRetries > maxRetriesCap:
		ve.add("maxRetries", CodeOutOfRange, "must be between 0 and %d, got %d", maxRetriesCap, s.MaxRetries)
	case s.MaxRetries > 0 && s.RestartPolicy != RestartOnFailure:
		ve.add("maxRetries", CodeNotAllowed, "needs restartPolicy: OnFailure")
	}
	if !contains(checkpointSignals, s.Checkpoint.Signal) {
		ve.add("checkpoint.signal", CodeInvalid, "must be one of %s, got %q", strings.Join(checkpointSignals, ", "), clip(s.Checkpoint.Signal))
	}
	if s.Checkpoint.Grace < 0 || s.Checkpoint.Grace.D() > maxGrace {
		ve.add("checkpoint.grace", CodeOutOfRange, "must be between 0s and 1h, got %s", s.Checkpoint.Grace)
	}
	switch s.Burst {
	case BurstNever, BurstAllowed, BurstPrefer:
	default:
		ve.add("burst", CodeInvalid, "must be never, allowed or prefer, got %q", clip(string(s.Burst)))
	}

	switch {
	case len(s.Command) == 0:
		ve.add("command", CodeRequired, "is required: the program and its arguments as a list (argv; no shell is involved)")
	case len(s.Command) > maxArgs:
		ve.add("command", CodeTooLong, "has %d arguments; the limit is %d", len(s.Command), maxArgs)
	default:
		if s.Command[0] == "" {
			ve.add("command[0]", CodeRequired, "the program to run must not be empty")
		}
		for i, a := range s.Command {
			checkText(ve, fmt.Sprintf("command[%d]", i), a, maxArgBytes)
		}
	}
	if len(s.Env) > maxEnv {
		ve.add("env", CodeTooLong, "has %d variables; the limit is %d", len(s.Env), maxEnv)
	}
	for _, k := range sortedMapKeys(s.Env) {
		f := "env." + k
		switch {
		case !envKeyRe.MatchString(k) || len(k) > 256:
			ve.add(f, CodeInvalid, "variable names are letters, digits and '_', not starting with a digit")
		case contains(reservedEnv, k) || strings.HasPrefix(k, "SPILLWAY_"):
			ve.add(f, CodeNotAllowed, "is set by the agent and cannot be overridden")
		default:
			checkText(ve, f, s.Env[k], maxEnvValue)
		}
	}
	if s.Array != "" {
		if _, _, err := ParseArray(s.Array); err != nil {
			ve.add("array", CodeInvalid, "%v (%s)", err, ArrayHint)
		}
	}
	if s.Workdir != "" {
		switch {
		case len(s.Workdir) > maxPathLen:
			ve.add("workdir", CodeTooLong, "is longer than %d bytes", maxPathLen)
		case !strings.HasPrefix(s.Workdir, "/"):
			ve.add("workdir", CodeInvalid, "must be an absolute path")
		default:
			checkText(ve, "workdir", s.Workdir, maxPathLen)
		}
	}
	s.validateData(ve, lim)
	s.validateRuntime(ve, lim)
	return ve.err()
}

func checkLabel(ve *ValidationError, field, v string, required bool) {
	switch {
	case v == "":
		if required {
			ve.add(field, CodeRequired, "is required")
		}
	case len(v) > maxNameLen:
		ve.add(field, CodeTooLong, "is %d characters; the limit is %d", len(v), maxNameLen)
	case !labelRe.MatchString(v):
		ve.add(field, CodeInvalid, "must start with a letter or digit and hold only letters, digits, '.', '_' and '-', got %q", clip(v))
	}
}

func checkText(ve *ValidationError, field, v string, limit int) {
	switch {
	case len(v) > limit:
		ve.add(field, CodeTooLong, "is %d bytes; the limit is %d", len(v), limit)
	case strings.IndexByte(v, 0) >= 0:
		ve.add(field, CodeInvalid, "must not contain NUL bytes")
	}
}

// clip shortens a user string before it is echoed in an error message.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}
