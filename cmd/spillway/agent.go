package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/onprem/agent"
	"github.com/spillway-dev/spillway/onprem/gpu/backends"
)

func agentCmd(g *globals) *cobra.Command {
	var cfgPath string
	var probe bool
	var labels []string
	var c agent.Config
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the node agent (or --probe the node's GPUs)",
		Long: `Run the node agent: it registers this machine's GPUs with the broker,
heartbeats, runs the jobs the broker assigns and cleans up after them.

With --probe it prints the GPU inventory, one telemetry sample and what
the configured runtime can enforce on this node (the uid jobs run as, the
memory limit, process visibility, Podman and CDI for the oci runtime) as
JSON and exits, to check a node by hand.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfgPath != "" {
				raw, err := os.ReadFile(cfgPath)
				if err != nil {
					return fmt.Errorf("read agent config: %w", err)
				}
				var fileCfg agent.Config
				if err := broker.DecodeStrict(raw, &fileCfg); err != nil {
					return fmt.Errorf("agent config %s: %w", cfgPath, err)
				}
				mergeAgentConfig(&c, fileCfg, cmd)
			}
			for _, l := range labels {
				k, v, ok := strings.Cut(l, "=")
				if !ok {
					return fmt.Errorf("--label %q: want key=value", l)
				}
				if c.Labels == nil {
					c.Labels = map[string]string{}
				}
				c.Labels[k] = v
			}
			if c.Name == "" {
				c.Name, _ = os.Hostname()
			}
			if c.GPUs == "" {
				c.GPUs = "auto"
			}
			log := newLogger(g.stderr, config.Log{})
			backend, err := backends.Open(c.GPUs, backends.Identity(c.Name, c.DataDir), log)
			if err != nil {
				return err
			}
			defer backend.Close()
			if probe {
				out, err := backends.Probe(backend)
				if err != nil {
					return err
				}
				if out, err = withRuntimeProbe(out, c, backend); err != nil {
					return err
				}
				_, err = g.stdout.Write(out)
				return err
			}
			if c.Token == "" {
				c.Token = os.Getenv("SPILLWAY_AGENT_TOKEN")
			}
			if c.JoinToken == "" {
				c.JoinToken = os.Getenv("SPILLWAY_JOIN_TOKEN")
			}
			c.Version = api.Version
			ag, err := agent.New(c, backend, log)
			if err != nil {
				return err
			}
			stopProfile, err := startProfiles(os.Getenv("SPILLWAY_CPUPROFILE"), os.Getenv("SPILLWAY_TRACE"))
			if err != nil {
				return err
			}
			defer stopProfile()
			return ag.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVarP(&cfgPath, "config", "c", "", "agent config file (YAML; flags override it)")
	f.StringVar(&c.Broker, "broker", "", "broker URL, e.g. http://10.0.0.1:8080")
	f.StringVar(&c.Token, "token", "", "agent token (or env SPILLWAY_AGENT_TOKEN); prefer --join-token")
	f.StringVar(&c.JoinToken, "join-token", "", "single-use join token from `spillway node token create` (or env SPILLWAY_JOIN_TOKEN)")
	f.StringVar(&c.CAFile, "ca", "", "CA bundle (PEM) the broker's certificate must chain to (default: the CA pinned at enrolment, else the system's roots)")
	f.StringVar(&c.Name, "name", "", "node name (default: hostname)")
	f.StringVar(&c.GPUs, "gpus", "", "GPU backend: auto, nvml, none, sim:8xH100-80GB, mock:dgxh100 (default auto)")
	f.StringVar(&c.GPUs, "gpu-backend", "", "alias of --gpus")
	f.StringVar(&c.DataDir, "data-dir", "/var/lib/spillway", "where job logs and agent state live")
	f.StringArrayVar(&labels, "label", nil, "node label key=value (repeatable)")
	f.BoolVar(&probe, "probe", false, "print the GPU inventory and one telemetry sample as JSON, then exit")
	return cmd
}

// mergeAgentConfig fills c from the file wherever no flag was given.
func mergeAgentConfig(c *agent.Config, file agent.Config, cmd *cobra.Command) {
	set := func(flag string, dst *string, v string) {
		if !cmd.Flags().Changed(flag) && v != "" {
			*dst = v
		}
	}
	set("broker", &c.Broker, file.Broker)
	set("token", &c.Token, file.Token)
	set("name", &c.Name, file.Name)
	if !cmd.Flags().Changed("gpus") && !cmd.Flags().Changed("gpu-backend") && file.GPUs != "" {
		c.GPUs = file.GPUs
	}
	set("data-dir", &c.DataDir, file.DataDir)
	set("join-token", &c.JoinToken, file.JoinToken)
	set("ca", &c.CAFile, file.CAFile)
	c.CA = file.CA
	if len(file.Peers) > 0 {
		c.Peers = file.Peers
	}
	if len(file.Labels) > 0 {
		c.Labels = file.Labels
	}
	if file.LogLimit > 0 {
		c.LogLimit = file.LogLimit
	}
	c.Data = file.Data
	c.Runtime = file.Runtime
	c.Notice = file.Notice
}
