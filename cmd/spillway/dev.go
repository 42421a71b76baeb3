package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/onprem/agent"
	"github.com/spillway-dev/spillway/onprem/gpu/backends"
	"github.com/spillway-dev/spillway/onprem/wire"
)

func devCmd(g *globals) *cobra.Command {
	var dir, listen, gpus string
	var agents int
	var writeCLI, insecure, burst bool
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a broker with a simulated on-prem fleet, for trying Spillway out",
		Long: `Run a broker on the embedded store plus simulated agents in one process.
Nothing else is needed. The first start writes a config with fresh tokens
under --dir; later starts reuse it, so jobs and tokens survive restarts.

The broker serves HTTPS with a certificate from a local CA it makes under
--dir/tls (ca.pem is what the CLI and agents trust); --insecure serves
plain HTTP instead.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if agents < 0 || agents > 64 {
				return fmt.Errorf("--agents must be between 0 and 64")
			}
			if burst {
				devBurstDefaults(cmd, &dir, &gpus, &agents)
			}
			cfgPath, userToken, err := ensureDevConfig(dir, listen, burst)
			if err != nil {
				return err
			}
			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			var cloud *localCloud
			if burst {
				if cloud, err = startLocalCloud(cfgPath); err != nil {
					return err
				}
				defer cloud.Close()
				cfg = cloud.cfg
			}
			log := newLogger(g.stderr, cfg.Log)
			caFile, err := devTLS(cfg, dir, insecure)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()

			ready := make(chan string, 1)
			var wg sync.WaitGroup
			var brokerErr error
			wg.Add(1)
			go func() {
				defer wg.Done()
				brokerErr = runBroker(ctx, cfg, log, ready, "")
				cancel()
			}()
			var addr string
			select {
			case addr = <-ready:
			case <-ctx.Done():
				wg.Wait()
				return brokerErr
			}
			url := "http://" + addr
			if caFile != "" {
				url = "https://" + addr
			}
			agentToken := devToken(cfg, config.RoleAgent)
			for i := 0; i < agents; i++ {
				name := fmt.Sprintf("sim-%02d", i+1)
				backend, err := backends.Open(gpus, backends.Identity(name, filepath.Join(dir, "agents", name)), log)
				if err != nil {
					cancel()
					wg.Wait()
					return fmt.Errorf("agent %s: %w", name, err)
				}
				ag, err := agent.New(agent.Config{Broker: url, Token: agentToken, Name: name,
					DataDir: filepath.Join(dir, "agents", name), Labels: map[string]string{"pool": "onprem"}, CAFile: caFile,
					Version: api.Version}, backend, log)
				if err != nil {
					cancel()
					wg.Wait()
					return err
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer backend.Close()
					_ = ag.Run(ctx)
				}()
			}
			cliNote := ""
			if writeCLI {
				cliNote = writeDevCLIConfig(url, userToken, caFile)
			}
			if cloud != nil {
				if err := cloud.setBudget(ctx, url, devToken(cfg, config.RoleOperator), caFile); err != nil {
					cancel()
					wg.Wait()
					return err
				}
				printBurstBanner(g, url, userToken, agents, gpus, cliNote, caFile)
			} else {
				printBanner(g, url, userToken, agents, gpus, cliNote, caFile)
			}
			<-ctx.Done()
			fmt.Fprintln(g.stderr, "stopping: agents stop their jobs, then the broker")
			wg.Wait()
			if brokerErr != nil && !errors.Is(brokerErr, context.Canceled) {
				return brokerErr
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", ".spillway/dev", "where the dev config, store and agent state live")
	f.StringVar(&listen, "listen", "127.0.0.1:8080", "broker address")
	f.IntVar(&agents, "agents", 2, "number of simulated agents")
	f.StringVar(&gpus, "gpus", "sim:8xH100-80GB", "GPU backend of each simulated agent")
	f.BoolVar(&insecure, "insecure", false, "serve plain HTTP instead of HTTPS from the local CA")
	f.BoolVar(&burst, "burst", false, "also run a local cloud to burst to (docs: README, \"Watch a burst\"): a fake EC2 whose machines are agent processes on this host reached over SSH, priced offers and a small budget; default --dir .spillway/burst, one agent with 2 GPUs")
	f.BoolVar(&writeCLI, "write-cli-config", true, "write the user token to ~/.config/spillway/config when that file is absent or was written by dev")
	return cmd
}

func newToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ensureDevConfig writes dir/config.yaml with fresh tokens on first use and
// returns its path and the user token.
func ensureDevConfig(dir, listen string, burst bool) (string, string, error) {
	path := filepath.Join(dir, "config.yaml")
	if _, err := os.Stat(path); err == nil {
		cfg, err := config.Load(path)
		if err != nil {
			return "", "", err
		}
		changed := cfg.Listen != listen
		if changed {
			raw, err := os.ReadFile(path)
			if err != nil {
				return "", "", err
			}
			updated := strings.Replace(string(raw), "listen: "+cfg.Listen, "listen: "+listen, 1)
			if err := os.WriteFile(path, []byte(updated), 0o600); err != nil {
				return "", "", err
			}
		}
		return path, devToken(cfg, config.RoleUser), nil
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return "", "", fmt.Errorf("create %s: %w", dir, err)
	}
	user := newToken()
	body := fmt.Sprintf(`# Written by "spillway dev" on %s. Safe to edit; delete it for fresh tokens.
listen: %s
dataDir: data
cluster: dev
log: {level: info, format: text}
scheduler:
  interval: 500ms
agents:
  heartbeatInterval: 1s
  lostAfter: 5
billing:
  currency: USD
  onprem:
    rates:
      H100: [{perGPUHour: "2.10"}]   # amortised cost of an owned H100
%sauth:
  tokens:
    - {name: alice, role: user, team: nlp, token: %s}
    - {name: bob, role: user, team: vision, token: %s}
    - {name: admin, role: operator, token: %s}
    - {name: finance, role: finance, token: %s}
    - {name: agents, role: agent, token: %s}
`, time.Now().UTC().Format(time.RFC3339), listen, devBurstSection(dir, burst), user, newToken(), newToken(), newToken(), newToken())
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		return "", "", fmt.Errorf("write dev config: %w", err)
	}
	return path, user, nil
}

func devToken(cfg *config.Config, role string) string {
	for _, t := range cfg.Auth.Tokens {
		if t.Role == role && t.Token != "" {
			return t.Token
		}
	}
	return ""
}

const devMarker = "# written by spillway dev"

// writeDevCLIConfig points the CLI at the dev broker, unless the user has a
// config of their own.
func writeDevCLIConfig(url, token, caFile string) string {
	path := cliConfigPath()
	if path == "" {
		return ""
	}
	if raw, err := os.ReadFile(path); err == nil && !strings.HasPrefix(string(raw), devMarker) {
		return fmt.Sprintf("left %s alone (not written by spillway dev); use the export line above", path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return ""
	}
	body := fmt.Sprintf("%s\nserver: %s\ntoken: %s\n", devMarker, url, token)
	if caFile != "" {
		if abs, err := filepath.Abs(caFile); err == nil {
			body += "ca: " + abs + "\n"
		}
	}
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		return ""
	}
	return "the CLI reads this server and token from " + path
}

func printBanner(g *globals, url, token string, agents int, gpus, cliNote, caFile string) {
	w := g.stdout
	fmt.Fprintf(w, "\nSpillway dev broker at %s (%d simulated agents, %s each)\n\n", url, agents, strings.TrimPrefix(gpus, "sim:"))
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
	fmt.Fprintf(w, "\nTry, in another terminal:\n\n")
	fmt.Fprintf(w, "  ./bin/spillway run --gpus 1 --time 5m --wait -- sh -c 'echo $CUDA_VISIBLE_DEVICES'\n")
	fmt.Fprintf(w, "  ./bin/spillway jobs\n")
	fmt.Fprintf(w, "  ./bin/spillway nodes\n")
	fmt.Fprintf(w, "  ./bin/spillway explain JOB\n\n")
	fmt.Fprintf(w, "Dashboard: %s/ui/ (paste the user token)\n", url)
	fmt.Fprintf(w, "Ctrl-C stops the broker and the agents.\n\n")
}

// devTLS gives the dev broker HTTPS from a local CA under dir/tls, unless
// the config has TLS of its own or insecure asks for plain HTTP. It
// returns the CA file agents and the CLI trust ("" for plain HTTP).
func devTLS(cfg *config.Config, dir string, insecure bool) (string, error) {
	if cfg.TLS.Enabled() {
		return cfg.TLS.CAFile, nil
	}
	if insecure {
		cfg.TLS.Insecure = true
		return "", nil
	}
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return "", fmt.Errorf("listen %q: %w", cfg.Listen, err)
	}
	hosts := []string{"127.0.0.1", "localhost", "::1"}
	if host != "" && host != "0.0.0.0" && host != "::" && !slices.Contains(hosts, host) {
		hosts = append(hosts, host)
	}
	caFile, certFile, keyFile, err := wire.EnsureLocalCA(filepath.Join(dir, "tls"), hosts, time.Now())
	if err != nil {
		return "", fmt.Errorf("make the dev CA: %w", err)
	}
	cfg.TLS = config.TLS{CertFile: certFile, KeyFile: keyFile, CAFile: caFile}
	if cfg.AdvertiseURL == "http://"+cfg.Listen {
		cfg.AdvertiseURL = "https://" + cfg.Listen
	}
	return caFile, nil
}
