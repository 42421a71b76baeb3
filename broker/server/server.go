// Package server is the running broker: the /v1 HTTP API (echo), the agent
// endpoints, and the loop that snapshots state, asks the scheduler core for
// a plan and applies it. It is the one place that writes job and node
// state; everything it writes goes to the store before memory and before
// any answer.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/onprem/gpu"
	"github.com/spillway-dev/spillway/providers"
)

// reasonPersistEvery bounds how often a job's changing pending reason is
// written to the store.
const reasonPersistEvery = 30 * time.Second

// Version is reported by /healthz and to agents; set at build time.
var Version = "dev"

// Options are the parts a caller may inject; zero values get production
// defaults.
type Options struct {
	Clock    clock.Clock
	Logger   *slog.Logger
	Registry *prometheus.Registry
	// Elector, when set, is the leader election among brokers sharing the
	// store: the broker stands by until it wins a lease (leader.go).
	// Without one the broker always leads.
	Elector broker.Elector
	// Providers are added to the configured ones (tests use fakes).
	Providers []providers.Provider
	// Bootstrap replaces the SSH bootstrap of burst machines (tests).
	Bootstrap BootstrapFunc
}

// Server is one broker process.
type Server struct {
	cfg     *config.Config
	store   broker.Store
	clock   clock.Clock
	log     *slog.Logger
	echo    *echo.Echo
	metrics *metrics
	ids     *idSource
	started time.Time

	// cycleMu makes scheduling cycles one at a time (the core's buffers
	// are reused between cycles).
	cycleMu sync.Mutex
	// mu guards the leader's in-memory view below. Every change is written
	// to the store first, under mu, then applied here.
	mu sync.Mutex
	// tokenSt is the auth tokens in force (tokens.go); its own lock.
	tokenSt tokenState
	// jobs holds every non-terminal job, kept equal to the store's active
	// index.
	jobs  map[string]*broker.Job
	nodes map[string]*broker.Node
	// byNode[n] is the set of jobs holding GPUs on node n, kept equal to
	// the holding jobs' placements.
	byNode map[string]map[string]bool
	// reasons is the latest pending reason of each pending job; only the
	// code is persisted, the full text lives here.
	reasons map[string]broker.PendingReason
	// reasonSaved is when each job's reason was last written.
	reasonSaved map[string]time.Time
	// telemetry is the latest GPU sample of each node, owners its
	// processes' jobs.
	telemetry map[string]*gpu.Sample
	owners    map[string]map[int]string
	tele      telemetryState
	// quiet[j] is when job j's cards last dropped under the idle threshold.
	quiet map[string]time.Time
	meter meterState
	burst burstState
	// nodeWake[n] is closed (and replaced) when node n has new orders.
	nodeWake map[string]chan struct{}
	// schedWake asks the loop for a cycle now.
	schedWake chan struct{}
	// ha is the leader election, nil when this broker always leads.
	ha *haState
	// scheduling is the scheduler core and fair-share ledger
	// (schedule_apply.go).
	scheduling scheduling
	// observability is the observability bookkeeping (delivery.go).
	observability observeState
}

// New builds a broker over an open store and loads its state.
func New(ctx context.Context, cfg *config.Config, store broker.Store, opt Options) (*Server, error) {
	if opt.Clock == nil {
		opt.Clock = clock.Real{}
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.Registry == nil {
		opt.Registry = prometheus.NewRegistry()
	}
	s := &Server{
		cfg:         cfg,
		store:       store,
		clock:       opt.Clock,
		log:         opt.Logger,
		ids:         newIDSource(),
		jobs:        map[string]*broker.Job{},
		nodes:       map[string]*broker.Node{},
		byNode:      map[string]map[string]bool{},
		reasons:     map[string]broker.PendingReason{},
		reasonSaved: map[string]time.Time{},
		telemetry:   map[string]*gpu.Sample{},
		owners:      map[string]map[int]string{},
		tele:        telemetryState{open: map[gpuKey]*accum{}},
		quiet:       map[string]time.Time{},
		meter:       meterState{reported: map[string]bool{}},
		nodeWake:    map[string]chan struct{}{},
		schedWake:   make(chan struct{}, 1),
	}
	s.metrics = newMetrics(opt.Registry, s)
	if opt.Elector != nil {
		s.initHA(opt.Elector) // state loads when a lease is won
	} else if err := s.load(ctx); err != nil {
		return nil, err
	}
	if err := s.initBurst(ctx, opt); err != nil {
		return nil, err
	}
	s.echo = s.routes(opt.Registry)
	return s, nil
}

// load reads every active job and node from the store. Nodes get a grace
// period counted from now, so a broker restart never declares a node lost
// before its agent had the chance to reconnect.
func (s *Server) load(ctx context.Context) error {
	s.started = s.clock.Now()
	return s.store.View(ctx, func(tx broker.Tx) error {
		jobs, err := broker.ActiveJobs(tx)
		if err != nil {
			return fmt.Errorf("load jobs: %w", err)
		}
		for _, j := range jobs {
			s.jobs[j.ID] = j
			if j.State.Holding() {
				for _, p := range j.Placements {
					if s.byNode[p.Node] == nil {
						s.byNode[p.Node] = map[string]bool{}
					}
					s.byNode[p.Node][j.ID] = true
				}
			}
		}
		nodes, err := broker.ListNodes(tx)
		if err != nil {
			return fmt.Errorf("load nodes: %w", err)
		}
		for _, n := range nodes {
			s.nodes[n.Name] = n
		}
		s.log.Info("state loaded", "active_jobs", len(jobs), "nodes", len(nodes))
		return nil
	})
}

// Handler is the HTTP handler (for tests and embedding).
func (s *Server) Handler() http.Handler { return s.echo }

// Serve runs the API on l and the scheduling loop until ctx ends, then
// shuts down gracefully.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	srv := &http.Server{Handler: s.echo, ReadHeaderTimeout: 10 * time.Second}
	loopDone := make(chan struct{})
	go func() {
		defer close(loopDone)
		s.lead(ctx) // the scheduling loop, burst controller and other leader tasks
	}()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	s.log.Info("broker serving", "addr", l.Addr().String(), "version", Version)
	select {
	case <-ctx.Done():
	case err := <-errc:
		return fmt.Errorf("serve http: %w", err)
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(shutdown)
	<-loopDone
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shut down http: %w", err)
	}
	return nil
}

// loop runs scheduling cycles every interval, or at once when woken.
func (s *Server) loop(ctx context.Context) {
	interval := s.cfg.Scheduler.Interval.D()
	for {
		if err := s.Cycle(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("scheduling cycle failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-s.schedWake:
			// Let a burst of submits or ended jobs gather into one cycle.
			select {
			case <-ctx.Done():
				return
			case <-time.After(kickCoalesce):
			}
		case <-s.clock.After(interval):
		}
	}
}

// kickCoalesce is how long a triggered cycle waits for more triggers. It
// is real time on purpose: it paces work, it decides nothing.
const kickCoalesce = 20 * time.Millisecond

// kick asks for a scheduling cycle soon.
func (s *Server) kick() {
	select {
	case s.schedWake <- struct{}{}:
	default:
	}
}

// wakeNodeLocked tells a node's waiting sync that it has new orders.
func (s *Server) wakeNodeLocked(name string) {
	if ch, ok := s.nodeWake[name]; ok {
		close(ch)
	}
	s.nodeWake[name] = make(chan struct{})
}

func (s *Server) nodeWaitLocked(name string) <-chan struct{} {
	ch, ok := s.nodeWake[name]
	if !ok {
		ch = make(chan struct{})
		s.nodeWake[name] = ch
	}
	return ch
}
