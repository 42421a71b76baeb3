// Package adapters reads the sections of the broker config that belong to
// the store and provider adapters and to the agents' runtime and staging:
// broker/config keeps them as read (broker.Section) so that it imports none
// of those packages; here each section is decoded strictly into its
// adapter's type and checked by the adapter's own Validate, every problem
// named by its path in the config ("providers[0].aws.region").
//
// The wiring calls Parse: broker/server when it starts and on every
// reload, and `spillway config check`.
package adapters

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
	redisstore "github.com/spillway-dev/spillway/broker/redis"
	"github.com/spillway-dev/spillway/broker/slurm"
	"github.com/spillway-dev/spillway/onprem/runtime"
	"github.com/spillway-dev/spillway/onprem/staging"
	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/aws"
	"github.com/spillway-dev/spillway/providers/gcp"
	"github.com/spillway-dev/spillway/providers/lease"
	"github.com/spillway-dev/spillway/providers/sshpool"
)

// Config is the adapter sections of one broker config, decoded and
// checked.
type Config struct {
	// Providers are config.Providers, in order.
	Providers []Provider
	// AgentData is burst.agentData (nil: the machine's credential chain).
	AgentData *staging.Config
	// AgentRuntime is burst.agentRuntime; ProviderRuntimes
	// burst.providerRuntimes by provider name.
	AgentRuntime     runtime.Config
	ProviderRuntimes map[string]runtime.Config
	// Slurm is the Slurm client commands the broker runs (nil without a
	// slurm section).
	Slurm *slurm.Commands
}

// Provider is one entry of `providers:`, exactly one field set.
type Provider struct {
	AWS     *aws.Config
	GCP     *gcp.Config
	Lambda  *lease.Config
	SSHPool *sshpool.Config
}

// Name is the provider's name in offers and records: the configured one
// or the adapter's default.
func (p Provider) Name() string {
	switch {
	case p.AWS != nil:
		return cmp.Or(p.AWS.Name, "aws-"+p.AWS.Region)
	case p.GCP != nil:
		return cmp.Or(p.GCP.Name, "gcp-"+p.GCP.Project)
	case p.Lambda != nil:
		return cmp.Or(p.Lambda.Name, "lambda")
	case p.SSHPool != nil:
		return cmp.Or(p.SSHPool.Name, "sshpool")
	}
	return ""
}

// RuntimeFor is the runtime configuration of a burst machine's agent on
// provider.
func (a *Config) RuntimeFor(provider string) runtime.Config {
	if rt, ok := a.ProviderRuntimes[provider]; ok {
		return rt
	}
	return a.AgentRuntime
}

// Parse decodes and checks c's adapter sections. Its error is a
// *broker.ValidationError naming each bad field.
func Parse(c *config.Config) (*Config, error) {
	ve := &broker.ValidationError{}
	out := &Config{}
	if c.IsRedis() {
		if err := redisstore.CheckURL(c.Store); err != nil {
			ve.Errors = append(ve.Errors, broker.FieldError{Field: "store", Code: broker.CodeInvalid, Message: err.Error()})
		}
	}
	for i, pc := range c.Providers {
		kind, sec := pc.Kind()
		if sec == nil {
			continue // config's Validate names it
		}
		path := fmt.Sprintf("providers[%d].%s", i, kind)
		var p Provider
		var v interface{ Validate() error }
		switch kind {
		case "aws":
			p.AWS = &aws.Config{}
			v = p.AWS
		case "gcp":
			p.GCP = &gcp.Config{}
			v = p.GCP
		case "lambda":
			p.Lambda = &lease.Config{}
			v = p.Lambda
		case "sshpool":
			p.SSHPool = &sshpool.Config{}
			v = p.SSHPool
		}
		if !decode(ve, path, *sec, v) {
			continue
		}
		// Cloud providers tag machines with the cluster's name unless
		// told otherwise.
		switch {
		case p.AWS != nil:
			p.AWS.Cluster = cmp.Or(p.AWS.Cluster, c.Cluster)
		case p.GCP != nil:
			p.GCP.Cluster = cmp.Or(p.GCP.Cluster, c.Cluster)
		case p.Lambda != nil:
			p.Lambda.Cluster = cmp.Or(p.Lambda.Cluster, c.Cluster)
		}
		addAdapter(ve, path, v.Validate())
		out.Providers = append(out.Providers, p)
	}
	b := c.Burst
	if b.AgentData != nil {
		out.AgentData = &staging.Config{}
		decode(ve, "burst.agentData", *b.AgentData, out.AgentData)
	}
	if b.AgentRuntime != nil {
		decode(ve, "burst.agentRuntime", *b.AgentRuntime, &out.AgentRuntime)
	}
	for _, name := range slices.Sorted(maps.Keys(b.ProviderRuntimes)) {
		var rt runtime.Config
		if decode(ve, "burst.providerRuntimes."+name, b.ProviderRuntimes[name], &rt) {
			if out.ProviderRuntimes == nil {
				out.ProviderRuntimes = map[string]runtime.Config{}
			}
			out.ProviderRuntimes[name] = rt
		}
	}
	if s := c.Slurm; s != nil {
		for i, n := range s.Nodes {
			if n.Names == "" {
				continue
			}
			if _, err := slurm.Expand(n.Names); err != nil {
				ve.Errors = append(ve.Errors, broker.FieldError{Field: fmt.Sprintf("slurm.nodes[%d].names", i), Code: broker.CodeInvalid, Message: err.Error()})
			}
		}
		out.Slurm = &slurm.Commands{Scontrol: s.Scontrol, Squeue: s.Squeue, Sacct: s.Sacct, Env: s.Env}
	}
	if len(ve.Errors) > 0 {
		return nil, ve
	}
	return out, nil
}

// decode fills out from sec, recording problems under path; false when
// there were any.
func decode(ve *broker.ValidationError, path string, sec broker.Section, out any) bool {
	err := broker.DecodeSection(path, sec, out)
	if err == nil {
		return true
	}
	if dve, ok := broker.AsValidation(err); ok {
		ve.Errors = append(ve.Errors, dve.Errors...)
	} else {
		ve.Errors = append(ve.Errors, broker.FieldError{Field: path, Code: broker.CodeInvalid, Message: err.Error()})
	}
	return false
}

// addAdapter records an adapter's Validate error: each
// *providers.ConfigError under path plus its field.
func addAdapter(ve *broker.ValidationError, path string, err error) {
	if err == nil {
		return
	}
	errs := []error{err}
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		errs = joined.Unwrap()
	}
	for _, e := range errs {
		var ce *providers.ConfigError
		if errors.As(e, &ce) {
			ve.Errors = append(ve.Errors, broker.FieldError{Field: path + "." + ce.Field, Code: broker.CodeInvalid, Message: ce.Message})
		} else {
			ve.Errors = append(ve.Errors, broker.FieldError{Field: path, Code: broker.CodeInvalid, Message: e.Error()})
		}
	}
}
