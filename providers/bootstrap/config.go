package bootstrap

import (
	"fmt"
	"net/url"
	"path"
	"regexp"

	"sigs.k8s.io/yaml"

	"github.com/spillway-dev/spillway/onprem/agentapi"
	"github.com/spillway-dev/spillway/onprem/runtime"
	"github.com/spillway-dev/spillway/onprem/staging"
)

// AgentConfig is the agent's config file, written as YAML to the machine
// and read by `spillway agent --config <path>`:
//
//	broker: http://10.0.0.1:8080
//	token: <per-machine agent token>
//	name: i-0abc123
//	gpus: auto
//	dataDir: /var/lib/spillway
//	labels: {pool: aws, instance: i-0abc123, provider: aws}
type AgentConfig struct {
	// Broker is the broker's base URL.
	Broker string `json:"broker"`
	// Token is the per-machine agent token; valid only for this machine.
	Token string `json:"token"`
	// Name is the node name the agent registers as.
	Name string `json:"name"`
	// GPUs selects the GPU backend: auto | nvml | none | sim:<spec> (e.g.
	// sim:8xH100-80GB) | mock:<server> (e.g. mock:dgxh100), as the agent's
	// --gpus flag.
	GPUs string `json:"gpus"`
	// DataDir is where the agent keeps its state and job files.
	DataDir string `json:"dataDir"`
	// Labels are attached to the node: pool, instance, provider, …
	Labels map[string]string `json:"labels,omitempty"`
	// CA is the broker's CA bundle (PEM): the machine trusts exactly it
	// for the broker's certificate. It travels inside this file, over the
	// SSH session whose host key was verified.
	CA string `json:"ca,omitempty"`
	// Data is the agent's object-store access and input cache.
	Data *staging.Config `json:"data,omitempty"`
	// Runtime is how the agent runs jobs, as the operator configured it
	// for the machine's provider, with the images to pre-pull.
	Runtime *runtime.Config `json:"runtime,omitempty"`
	// Notice is whose interruption notices the agent watches (spot and
	// preemptible machines of EC2 and GCE).
	Notice *agentapi.NoticeWatch `json:"notice,omitempty"`
}

var (
	gpusPattern = regexp.MustCompile(`^(auto|nvml|none|sim:[0-9]+x[A-Za-z0-9._-]+|mock:[A-Za-z0-9._-]+)$`)
	namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$`)
)

// Validate checks the fields the agent cannot start without.
func (c AgentConfig) Validate() error {
	u, err := url.Parse(c.Broker)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("agent config: broker %q: want an http(s) URL", c.Broker)
	}
	if c.Token == "" {
		return fmt.Errorf("agent config: token: required")
	}
	if !namePattern.MatchString(c.Name) {
		return fmt.Errorf("agent config: name %q: want 1-128 letters, digits, '.', '_', '/' or '-'", c.Name)
	}
	if !gpusPattern.MatchString(c.GPUs) {
		return fmt.Errorf("agent config: gpus %q: want auto, nvml, none, sim:<n>x<model> or mock:<server>", c.GPUs)
	}
	if !path.IsAbs(c.DataDir) {
		return fmt.Errorf("agent config: dataDir %q: want an absolute path", c.DataDir)
	}
	return nil
}

// Marshal writes the config as YAML.
func (c AgentConfig) Marshal() ([]byte, error) {
	b, err := yaml.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("write agent config: %w", err)
	}
	return b, nil
}

// ParseAgentConfig reads a config written by Marshal (or by hand),
// refusing unknown fields, and validates it.
func ParseAgentConfig(b []byte) (AgentConfig, error) {
	var c AgentConfig
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return AgentConfig{}, fmt.Errorf("read agent config: %w", err)
	}
	if err := c.Validate(); err != nil {
		return AgentConfig{}, err
	}
	return c, nil
}
