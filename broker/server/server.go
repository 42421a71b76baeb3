// Package server is the running broker: the /v1 HTTP API (echo), the agent
// endpoints, and the loop that snapshots state, asks the scheduler core for
// a plan and applies it. It is the one place that writes job and node
// state; everything it writes goes to the store before memory and before
// any answer.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/adapters"
	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/fleet"
	"github.com/spillway-dev/spillway/broker/slurmdoor"
	"github.com/spillway-dev/spillway/broker/state"
	"github.com/spillway-dev/spillway/onprem/gpu"
	"github.com/spillway-dev/spillway/providers"
)

// reasonPersistEvery bounds how often a job's changing pending reason is
// written to the store.
const reasonPersistEvery = 30 * time.Second

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
	Bootstrap fleet.BootstrapFunc
	// ConfigFile is the file the config came from, read again by Reload
	// (reload.go); "" when there is none to reload.
	ConfigFile string
	// OIDCClient reaches the OIDC provider (tests: one that trusts the
	// test provider's certificate).
	OIDCClient *http.Client
}

// Server is one broker process.
type Server struct {
	// config is the configuration in force, swapped whole by Reload
	// (reload.go); read it through cfg(), never keep it across a wait.
	conf atomic.Pointer[config.Config]
	// store is backend with every write timed (storeslow.go); read and
	// write through it. backend is asked only for the store's optional
	// interfaces (broker.Fenced, Ping, Backuper).
	store   broker.Store
	backend broker.Store
	clock   clock.Clock
	log     *slog.Logger
	echo    *echo.Echo
	metrics *metrics
	ids     *idSource
	started time.Time

	// sections are conf's adapter sections decoded (providers, the
	// agents' runtime and data); swapped with conf.
	sections atomic.Pointer[adapters.Config]
	// specLims are conf's spec limits, built once per config (every
	// submit reads them; see configSpecLimits).
	specLims atomic.Pointer[configLimits]

	// progress holds what starting attempts wait for, by job id
	// ("pulling image 1.2/4.0 GB"); in memory only (runtime.go).
	progress sync.Map
	// barriers are the start barriers of gangs, by job id (gang.go);
	// guarded by mu, rebuilt from the members' reports after a restart.
	barriers map[string]*barrier

	// cycleMu makes scheduling cycles one at a time (the core's buffers
	// are reused between cycles).
	cycleMu sync.Mutex
	// mu guards the leader's in-memory view below. Every change is written
	// to the store first, under mu, then applied here; new jobs are written
	// without it and applied by the next holder (submitted.go). Take it
	// with lock, never directly.
	mu sync.Mutex
	// submitted is the jobs committed by submits and not yet in memory.
	submitted submittedJobs
	// syncs is the agent reports waiting for mu (agents.go).
	syncs syncQueue
	// invLimits is the inventory's spec limits (noteInventoryLocked),
	// read by submits without mu.
	invLimits atomic.Pointer[inventoryLimits]
	// tokenSt is the auth tokens in force (tokens.go); its own lock.
	tokenSt tokenState
	// view is the jobs, nodes, placements by node, pending reasons and I/O
	// readings (broker/state); mu guards it, reads included. commitLocked
	// applies what the store accepted to it (State.Apply); what is kept
	// in memory only (reasons, I/O readings, a node's LastSeen) is set
	// through its own methods.
	view *state.State
	// telemetry is the latest GPU sample of each node, owners its
	// processes' jobs.
	telemetry map[string]*gpu.Sample
	owners    map[string]map[int]string
	tele      telemetryState
	// quiet[j] is when job j's cards last dropped under the idle threshold.
	quiet map[string]time.Time
	meter meterState
	// fleet is the burst controller's live side (broker/fleet), over this
	// broker's state (fleetview.go); mu guards its memory too.
	fleet *fleet.Fleet
	// burstWhy is the burst decision's last word on each waiting job
	// (fleet.Broker's NoteReasons).
	burstWhy map[string]broker.PendingReason
	// slurm is the broker as Slurm's burst provider (broker/slurmdoor,
	// wired in slurm.go).
	slurm *slurmdoor.Door
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
	// strs interns the strings jobs share (intern.go).
	strs interner
	// slowCommits is the warning for slow store writes (storeslow.go).
	slowCommits slowCommits
	// storeHealth is the last store failure (storehealth.go).
	storeHealth storeHealth
	// certs is the API's TLS certificate (tls.go).
	certs certHolder
	// limits are the per-team submit rate and pending cap (limits.go).
	limits teamLimits
	// oidc is the OIDC provider once discovered; oidcClient, when set,
	// reaches it (oidc.go).
	oidc       oidcState
	oidcClient *http.Client
	// work owns the goroutines a leader term starts (tasks.go).
	work workGroup
	// reload is what a config reload compares against (reload.go).
	reload reloadState
	// staticTokens are auth.tokens with their secrets hashed (auth.go).
	staticTokens []config.Token
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
		backend:   store,
		clock:     opt.Clock,
		log:       opt.Logger,
		ids:       newIDSource(),
		view:      state.New(),
		telemetry: map[string]*gpu.Sample{},
		owners:    map[string]map[int]string{},
		tele:      telemetryState{open: map[gpuKey]*accum{}},
		quiet:     map[string]time.Time{},
		meter:     meterState{reported: map[string]bool{}},
		burstWhy:  map[string]broker.PendingReason{},
		nodeWake:  map[string]chan struct{}{},
		schedWake: make(chan struct{}, 1),

		slowCommits: slowCommits{threshold: defaultSlowCommit, every: defaultSlowCommitEvery},
	}
	s.store = timedStore{Store: store, s: s}
	sections, err := adapters.Parse(cfg)
	if err != nil {
		return nil, err
	}
	s.conf.Store(cfg)
	s.sections.Store(sections)
	s.metrics = newMetrics(opt.Registry, s)
	s.oidcClient = opt.OIDCClient
	s.staticTokens = hashStaticTokens(cfg.Auth.Tokens)
	s.initReload(opt.ConfigFile)
	if opt.Elector != nil {
		s.initHA(opt.Elector) // state loads when a lease is won
	} else if err := s.load(ctx); err != nil {
		return nil, err
	}
	if err := s.initFleet(ctx, opt); err != nil {
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
	if err := broker.EnsureTeamIndex(ctx, s.store); err != nil {
		return fmt.Errorf("build the team index: %w", err)
	}
	// No submit is between its commit and its queue while the store is
	// read: each new job is either read here or queued after.
	s.submitted.window.Lock()
	defer s.submitted.window.Unlock()
	s.dropSubmittedLocked()
	return s.store.View(ctx, func(tx broker.Tx) error {
		jobs, err := broker.ActiveJobs(tx)
		if err != nil {
			return fmt.Errorf("load jobs: %w", err)
		}
		for _, j := range jobs {
			s.strs.job(j)
		}
		nodes, err := broker.ListNodes(tx)
		if err != nil {
			return fmt.Errorf("load nodes: %w", err)
		}
		s.view.Load(jobs, nodes)
		s.noteInventoryLocked()
		s.recountPendingLocked()
		s.log.Info("state loaded", "active_jobs", len(jobs), "nodes", len(nodes))
		return nil
	})
}

// cfg is the configuration in force. A reload swaps it whole, so one
// call's fields always belong together.
func (s *Server) cfg() *config.Config { return s.conf.Load() }

// adapt is cfg()'s adapter sections, decoded (broker/adapters).
func (s *Server) adapt() *adapters.Config { return s.sections.Load() }

// Handler is the HTTP handler (for tests and embedding).
func (s *Server) Handler() http.Handler { return s.echo }

// Serve runs the API on l and the scheduling loop until ctx ends, then
// shuts down gracefully.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	lim := s.cfg().Limits
	srv := &http.Server{Handler: s.echo, ReadHeaderTimeout: lim.ReadHeaderTimeout.D(),
		IdleTimeout: lim.IdleTimeout.D(), ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	if s.cfg().TLS.Enabled() {
		tc, err := s.serverTLS()
		if err != nil {
			return err
		}
		l = tls.NewListener(l, tc)
	} else {
		s.log.Warn("serving plain HTTP: tokens and job data cross the network unencrypted and agents cannot tell this broker from an impostor; set tls.certFile and tls.keyFile (docs/security.md)")
	}
	for _, t := range s.cfg().Auth.Tokens {
		if t.Role == config.RoleAgent {
			s.log.Warn("a shared agent token is configured: it may register any node name not enrolled yet; enrol nodes with join tokens instead (spillway node token create, docs/security.md)", "token", t.Name)
		}
	}
	// Serve owns both goroutines it starts and returns only after both
	// did: the leader tasks (which wait for their work, tasks.go) and the
	// HTTP server.
	lctx, stopLead := context.WithCancel(ctx)
	defer stopLead()
	var owned sync.WaitGroup
	owned.Go(func() { s.lead(lctx) }) // the scheduling loop, burst controller and other leader tasks
	errc := make(chan error, 1)
	owned.Go(func() { errc <- srv.Serve(l) })
	s.log.Info("broker serving", "addr", l.Addr().String(), "version", api.Version)
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(shutdown)
	stopLead()
	owned.Wait()
	if serveErr != nil {
		return fmt.Errorf("serve http: %w", serveErr)
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shut down http: %w", err)
	}
	return nil
}

// loop runs scheduling cycles every interval, or at once when woken.
func (s *Server) loop(ctx context.Context) {
	for {
		t0 := time.Now()
		if err := s.Cycle(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("scheduling cycle failed", "err", err)
		}
		took := time.Since(t0)
		select {
		case <-ctx.Done():
			return
		case <-s.schedWake:
			// Let a burst of submits or ended jobs gather into one cycle:
			// wait as long as the last cycle took (so cycles use at most
			// about half the time), between kickCoalesceMin and
			// kickCoalesceMax. Triggers that come during a cycle gather
			// on their own.
			select {
			case <-ctx.Done():
				return
			case <-time.After(min(max(took, kickCoalesceMin), kickCoalesceMax)):
			}
		case <-s.clock.After(s.cfg().Scheduler.Interval.D()):
		}
	}
}

// A triggered cycle waits between kickCoalesceMin and kickCoalesceMax for
// more triggers. It is real time on purpose: it paces work, it decides
// nothing.
const (
	kickCoalesceMin = time.Millisecond
	kickCoalesceMax = 20 * time.Millisecond
)

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
