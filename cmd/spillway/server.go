package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/bolt"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/redis"
	"github.com/spillway-dev/spillway/broker/server"
)

func serverCmd(g *globals) *cobra.Command {
	var cfgPath, listen, store string
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run the broker",
		Long: `Run the broker: the /v1 API, the scheduler and the agents' endpoint.

The configuration file is documented in docs/config.md; deploy/spillway.example.yaml
is an annotated example. SIGHUP (or spillway config reload) reads the file
again: queues, priorities, teams and quotas, burst thresholds, limits, tokens
and the TLS certificate go live; a file that fails validation changes
nothing (docs/operations.md, "Reloading the config").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfgPath == "" {
				return fmt.Errorf("--config is required (see deploy/spillway.example.yaml)")
			}
			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			if listen != "" {
				cfg.Listen = listen
			}
			if store != "" {
				cfg.Store = store
				if err := cfg.Validate(); err != nil {
					return fmt.Errorf("--store: %w", err)
				}
			}
			log := newLogger(g.stderr, cfg.Log)
			return runBroker(cmd.Context(), cfg, log, nil, cfgPath)
		},
	}
	cmd.Flags().StringVarP(&cfgPath, "config", "c", "", "broker config file (YAML)")
	cmd.Flags().StringVar(&listen, "listen", "", "override the config's listen address")
	cmd.Flags().StringVar(&store, "store", "", "override the config's store: bolt:///path/spillway.db or redis://host:port/db (docs/operations.md)")
	return cmd
}

func newLogger(w io.Writer, c config.Log) *slog.Logger {
	level := slog.LevelInfo
	switch strings.ToLower(c.Level) {
	case "debug":
		level = slog.LevelDebug
	case "warn":
		level = slog.LevelWarn
	case "error":
		level = slog.LevelError
	}
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// openStore opens the store the config selects.
func openStore(ctx context.Context, cfg *config.Config, log *slog.Logger) (broker.Store, error) {
	if p := cfg.StorePath(); p != "" {
		return bolt.Open(p)
	}
	return redis.Open(ctx, cfg.Store, redis.Options{Logger: log})
}

// runBroker opens the store, listens and serves until ctx ends. ready, if
// not nil, receives the bound address once the broker accepts requests.
func runBroker(ctx context.Context, cfg *config.Config, log *slog.Logger, ready chan<- string, cfgPath string) error {
	st, err := openStore(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer st.Close()
	opt := server.Options{Logger: log, ConfigFile: cfgPath}
	if rs, ok := st.(*redis.Store); ok {
		// Brokers sharing a Redis elect one leader (docs/operations.md).
		el, err := rs.NewElector(redis.ElectorConfig{ID: cfg.HA.BrokerID, URL: cfg.HA.PeerURL,
			TTL: cfg.HA.LeaseTTL.D(), RenewEvery: cfg.HA.RenewInterval.D(), Logger: log})
		if err != nil {
			return err
		}
		opt.Elector = el
	}
	if !cfg.TLS.Enabled() && !cfg.TLS.Insecure {
		return fmt.Errorf("tls: set tls.certFile and tls.keyFile to serve HTTPS, or tls.insecure: true for plain HTTP (docs/security.md)")
	}
	srv, err := server.New(ctx, cfg, st, opt)
	if err != nil {
		return err
	}
	// SIGHUP reads the certificate and the config file again: a renewed
	// certificate, queues, quotas, burst thresholds, limits and tokens go
	// live without a restart.
	go reloadOnHUP(ctx, srv)
	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	if ready != nil {
		ready <- l.Addr().String()
	}
	return srv.Serve(ctx, l)
}

// reloadOnHUP applies the config file again on SIGHUP
// (docs/operations.md, "Reloading the config"); srv.Reload logs and
// audits what it applied, or why it refused the file.
func reloadOnHUP(ctx context.Context, srv *server.Server) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			_, _ = srv.Reload(ctx, "SIGHUP")
		}
	}
}
