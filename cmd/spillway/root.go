package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/client"
)

// exitError carries a specific exit status out of a command.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// globals are the flags every client verb shares.
type globals struct {
	server string
	token  string
	output string
	// raw passes job and spec strings to the terminal unescaped.
	raw bool
	// peers are the cluster's other broker URLs (SPILLWAY_PEERS).
	peers string
	// ca is the CA bundle the broker's certificate must chain to.
	ca     string
	stdout io.Writer
	stderr io.Writer
	// term is stdout unescaped, for the CLI's own control sequences
	// (top --watch clearing the screen); never for tenant strings.
	term io.Writer
}

func execute(args []string, stdout, stderr io.Writer) int {
	outEsc, errEsc := newEscapeWriter(stdout), newEscapeWriter(stderr)
	defer outEsc.Flush()
	defer errEsc.Flush()
	g := &globals{stdout: stdout, stderr: stderr, term: stdout}
	root := &cobra.Command{
		Use:           "spillway",
		Short:         "Spillway schedules your own GPUs first and bursts to the cloud at peaks",
		SilenceUsage:  true,
		SilenceErrors: true,
		// Every string a tenant wrote (job names, commands, output, error
		// messages quoting them) is escaped before the terminal, unless
		// --raw.
		PersistentPreRun: func(cmd *cobra.Command, _ []string) {
			if !g.raw {
				g.stdout, g.stderr = outEsc, errEsc
			}
		},
	}
	var showVersion bool
	root.Flags().BoolVar(&showVersion, "version", false, "print this binary's version and the broker's")
	root.RunE = func(cmd *cobra.Command, _ []string) error {
		if showVersion {
			printVersion(cmd.Context(), g, false)
			return nil
		}
		return cmd.Help()
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetArgs(args)
	root.AddCommand(explainCmd(g), reportCmd(g), unitsCmd(g), backupCmd(g), checkpointCmd(g))
	root.AddCommand(auditCmd(g), loginCmd(g))
	pf := root.PersistentFlags()
	pf.StringVar(&g.server, "server", "", "broker URL (env SPILLWAY_SERVER, or server: in ~/.config/spillway/config)")
	pf.StringVar(&g.token, "token", "", "API token (env SPILLWAY_TOKEN, or token: in ~/.config/spillway/config)")
	pf.StringVarP(&g.output, "output", "o", "table", "output format: table or json")
	pf.BoolVar(&g.raw, "raw", false, "print job names, commands and logs as they are, escape sequences included (default: shown as \\x1b text)")
	pf.StringVar(&g.ca, "ca", "", "CA bundle (PEM) the broker's certificate must chain to (env SPILLWAY_CA, or ca: in ~/.config/spillway/config; default: the system's roots)")
	pf.StringVar(&g.peers, "peers", "", "comma-separated URLs of the cluster's other brokers; the token follows a redirect only to these (env SPILLWAY_PEERS)")

	root.AddCommand(
		serverCmd(g), agentCmd(g), devCmd(g),
		submitCmd(g), runCmd(g), jobsCmd(g), statusCmd(g), cancelCmd(g), logsCmd(g), nodesCmd(g), queueCmd(g), topCmd(g), billCmd(g), instancesCmd(g), offersCmd(g), burstCmd(g), budgetCmd(g), simCmd(g),
		versionCmd(g), storeCmd(g), slurmCmd(g),
	)
	// spillway node: the operator's controls (control.go) and enrolment
	// (node.go) under one verb.
	node := nodeOpsCmd(g)
	for _, sub := range nodeCmd(g).Commands() {
		node.AddCommand(sub)
	}
	root.AddCommand(tokenCmd(g), configCmd(g), node, jobOpsCmd(g))
	addCompletions(root, g)
	hideClientFlags(root, "server", "agent", "dev")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		// Ctrl-C: the shell's convention for SIGINT, and no error text.
		fmt.Fprintln(stderr, "spillway: interrupted")
		return 130
	}
	errOut := stderr
	if !g.raw {
		errOut = errEsc
	}
	fmt.Fprintln(errOut, "error:", err)
	return 1
}

// cliConfig is the CLI's config file, ~/.config/spillway/config.
type cliConfig struct {
	Server string `json:"server"`
	Token  string `json:"token"`
	// CA is the CA bundle file the broker's certificate must chain to.
	CA string `json:"ca,omitempty"`
}

func cliConfigPath() string {
	if p := os.Getenv("SPILLWAY_CONFIG"); p != "" {
		return p
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "spillway", "config")
}

func loadCLIConfig() cliConfig {
	var c cliConfig
	p := cliConfigPath()
	if p == "" {
		return c
	}
	raw, err := os.ReadFile(p)
	if err != nil {
		return c
	}
	_ = broker.DecodeStrict(raw, &c)
	return c
}

// client builds an API client: flags, then environment, then the config
// file.
func (g *globals) client() (*client.Client, error) {
	token := firstNonEmpty(g.token, os.Getenv("SPILLWAY_TOKEN"), loadCLIConfig().Token)
	if token == "" {
		return nil, fmt.Errorf("no API token: pass --token, set SPILLWAY_TOKEN, or put token: in %s (`make run` prints one)", cliConfigPath())
	}
	return g.clientWithToken(token)
}

// serverURL is the broker the CLI talks to: flag, environment, config
// file, else the dev broker's address.
func (g *globals) serverURL() string {
	return firstNonEmpty(g.server, os.Getenv("SPILLWAY_SERVER"), loadCLIConfig().Server, "http://127.0.0.1:8080")
}

// clientWithToken builds an API client for serverURL with token (empty
// for what needs none, such as /healthz), trusting the configured CA and
// HA peers.
func (g *globals) clientWithToken(token string) (*client.Client, error) {
	file := loadCLIConfig()
	c := client.New(g.serverURL(), token)
	if ca := firstNonEmpty(g.ca, os.Getenv("SPILLWAY_CA"), file.CA); ca != "" {
		if err := c.TrustCAFile(ca); err != nil {
			return nil, err
		}
	}
	if peers := firstNonEmpty(g.peers, os.Getenv("SPILLWAY_PEERS")); peers != "" {
		c.TrustPeers(strings.Split(peers, ","))
	}
	return c, nil
}

func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

func (g *globals) json() bool { return g.output == "json" }

func (g *globals) checkOutput() error {
	if g.output != "table" && g.output != "json" {
		return fmt.Errorf("--output must be table or json, not %q", g.output)
	}
	return nil
}

func (g *globals) printJSON(v any) error {
	enc := json.NewEncoder(g.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (g *globals) table() *tabwriter.Writer {
	return tabwriter.NewWriter(g.stdout, 0, 0, 2, ' ', 0)
}

// ago prints how long ago t was, briefly.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm ago", int(d.Hours()), int(d.Minutes())%60)
	}
	return t.Local().Format("2006-01-02 15:04")
}

func shortGPU(model string) string {
	model = strings.TrimPrefix(model, "NVIDIA ")
	return model
}

// show is the shape of every read-only verb: check -o, reach the broker,
// fetch, then print JSON for scripts or the table for people.
func show[T any](g *globals, cmd *cobra.Command, fetch func(*client.Client) (T, error), table func(T) error) error {
	if err := g.checkOutput(); err != nil {
		return err
	}
	c, err := g.client()
	if err != nil {
		return err
	}
	v, err := fetch(c)
	if err != nil {
		return err
	}
	if g.json() {
		return g.printJSON(v)
	}
	return table(v)
}

// hideClientFlags keeps the client's --server, --token, --output, --ca and
// --peers out of the help of the daemon verbs, which do not read them (the
// agent's own --token and --ca are its flags, not these).
func hideClientFlags(root *cobra.Command, names ...string) {
	help := root.HelpFunc()
	for _, c := range root.Commands() {
		if !slices.Contains(names, c.Name()) {
			continue
		}
		c.SetHelpFunc(func(cmd *cobra.Command, args []string) {
			for _, name := range []string{"server", "token", "output", "ca", "peers"} {
				if f := root.PersistentFlags().Lookup(name); f != nil {
					f.Hidden = true
					defer func() { f.Hidden = false }()
				}
			}
			help(cmd, args)
		})
	}
}
