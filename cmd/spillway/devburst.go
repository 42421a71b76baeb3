package main

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker/client"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/providers/fakecloud"
)

// The local cloud of `spillway dev --burst`: one priced instance type and a
// global budget small enough that a second burst is refused.
const (
	devBurstType   = "g5.xlarge"
	devBurstPrice  = "2.00"
	devBurstBudget = "2.50"
)

// devBurstDefaults gives --burst its own dir and a 2-GPU owned fleet unless
// the flags say otherwise.
func devBurstDefaults(cmd *cobra.Command, dir, gpus *string, agents *int) {
	f := cmd.Flags()
	if !f.Changed("dir") {
		*dir = ".spillway/burst"
	}
	if !f.Changed("gpus") {
		*gpus = "sim:2xH100-80GB"
	}
	if !f.Changed("agents") {
		*agents = 1
	}
}

// devBurstSection is the part of a --burst dev config written once: a
// short metering slice and fast burst timings, agents on this host kept
// apart by machine, started without systemd or sudo.
func devBurstSection(dir string, burst bool) string {
	if !burst {
		return ""
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	return fmt.Sprintf(`  slice: 2s
  overhead: {chargeTo: demand-team}   # a rented machine's idle time is billed to the team that asked for it
burst:
  interval: 500ms
  minWait: 5s                # work waits this long on a full fleet before it bursts
  idleTTL: 15s               # an idle rented machine is deleted after this
  reconcileEvery: 5s
  agentGPUs: sim             # burst agents get simulated cards shaped like the offer
  agentInit: supervised      # never a systemd unit on your machine
  agentSudo: never
  remoteDir: %[1]s/machines/{machine}/opt
  agentDataDir: %[1]s/machines/{machine}/data
`, abs)
}

// localCloud is the fake EC2 that --burst rents from, and the config that
// points the broker at it.
type localCloud struct {
	ec2 *fakecloud.EC2
	cfg *config.Config
}

// startLocalCloud starts the fake EC2 (machines are SSH servers in this
// process, each running the bootstrap's commands on this host) and reads
// the dev config with a provider for it added.
func startLocalCloud(cfgPath string) (*localCloud, error) {
	// The fake checks no signature; these keep the SDK from looking for
	// real credentials (and from sending a real key id anywhere).
	for k, v := range map[string]string{"AWS_ACCESS_KEY_ID": "AKIDLOCALCLOUD", "AWS_SECRET_ACCESS_KEY": "local-cloud",
		"AWS_SESSION_TOKEN": "", "AWS_PROFILE": "", "AWS_EC2_METADATA_DISABLED": "true"} {
		_ = os.Setenv(k, v)
	}
	// Its price list (`spillway offers refresh`) lists the configured
	// price, so a refresh changes the source, not the demo's budget sums.
	ec2, err := fakecloud.StartEC2(fakecloud.EC2Options{Machines: fakecloud.LocalSSH, BootTime: 2 * time.Second,
		Prices: []fakecloud.OnDemandPrice{{InstanceType: devBurstType, Price: devBurstPrice + "00000000"}}})
	if err != nil {
		return nil, fmt.Errorf("local cloud: %w", err)
	}
	raw, err := os.ReadFile(cfgPath)
	if err != nil {
		ec2.Close()
		return nil, fmt.Errorf("read config: %w", err)
	}
	login := "root"
	if u, err := user.Current(); err == nil {
		login = u.Username
	}
	raw = append(raw, fmt.Sprintf(`
providers:   # added by spillway dev --burst at each start
  - aws:
      name: local-ec2
      region: us-east-1
      endpoint: %s
      pricingEndpoint: %s
      imageId: ami-local
      sshUser: %s
      sshPort: %d
      instanceTypes:
        - {name: %s, gpuModel: A10G, gpus: 1, gpuMemoryGiB: 24, cpus: 4, memoryGiB: 16, onDemandPrice: "%s"}
`, ec2.URL, ec2.URL, login, ec2.SSHPort(), devBurstType, devBurstPrice)...)
	cfg, err := config.Parse(raw)
	if err != nil {
		ec2.Close()
		return nil, fmt.Errorf("config %s with the local cloud: %w", cfgPath, err)
	}
	if !filepath.IsAbs(cfg.DataDir) {
		cfg.DataDir = filepath.Join(filepath.Dir(cfgPath), cfg.DataDir)
	}
	return &localCloud{ec2: ec2, cfg: cfg}, nil
}

// setBudget gives the dev cluster a global burst budget on first start.
func (l *localCloud) setBudget(ctx context.Context, url, operatorToken, caFile string) error {
	c := client.New(url, operatorToken)
	if caFile != "" {
		if err := c.TrustCAFile(caFile); err != nil {
			return err
		}
	}
	bs, err := c.Budgets(ctx)
	if err != nil {
		return fmt.Errorf("read budgets: %w", err)
	}
	for _, b := range bs {
		if b.Scope == "global" {
			return nil
		}
	}
	if _, err := c.SetBudget(ctx, "global", devBurstBudget); err != nil {
		return fmt.Errorf("set the dev budget: %w", err)
	}
	return nil
}

// Close ends the local cloud and every machine in it.
func (l *localCloud) Close() { l.ec2.Close() }

func printBurstBanner(g *globals, url, token string, agents int, gpus, cliNote, caFile string) {
	w := g.stdout
	fmt.Fprintf(w, "\nSpillway dev broker at %s with a local cloud\n\n", url)
	fmt.Fprintf(w, "  owned fleet:  %d agent(s), %s each\n", agents, gpus[len("sim:"):])
	fmt.Fprintf(w, "  local cloud:  local-ec2 offers %s (1x A10G) at %s USD/h; machines are agents on this host over SSH\n", devBurstType, devBurstPrice)
	fmt.Fprintf(w, "  burst budget: %s USD this month (global)\n\n", devBurstBudget)
	fmt.Fprintf(w, "  user token (team nlp):  %s\n", token)
	if caFile != "" {
		abs, _ := filepath.Abs(caFile)
		fmt.Fprintf(w, "  export SPILLWAY_SERVER=%s SPILLWAY_TOKEN=%s SPILLWAY_CA=%s\n", url, token, abs)
	} else {
		fmt.Fprintf(w, "  export SPILLWAY_SERVER=%s SPILLWAY_TOKEN=%s\n", url, token)
	}
	if cliNote != "" {
		fmt.Fprintf(w, "  %s\n", cliNote)
	}
	fmt.Fprintf(w, "\nWatch a burst, in another terminal: deploy/demo/burst.sh (README, \"Watch a burst\")\n")
	fmt.Fprintf(w, "Ctrl-C stops the broker, the agents and the local cloud's machines.\n\n")
}
