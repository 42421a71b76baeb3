package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/labstack/echo/v4"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/onprem/gpu"
)

// haState is the leader election of a broker that shares its store with
// other brokers (Redis). A Server without one (the embedded store) always
// leads.
//
// Terms: when the elector reports a won lease, the broker takes over —
// sets the store's fencing token, reloads its in-memory view from the
// store, gives agents a grace period — and runs the leader tasks until
// the lease is lost or the broker stops; then it stops them and drops its
// view. Between terms it stands by: reads that the store answers are
// served, everything else is redirected to the leader.
type haState struct {
	elector broker.Elector
	// term is the fencing token of the term being led, 0 while standing
	// by. Written under Server.mu; read without it by the request gate.
	term atomic.Uint64
	// storeDown: the elector last reported the store unreachable. Under
	// Server.mu. No decisions are made until it is cleared, and clearing
	// it restarts the agents' grace period.
	storeDown bool
}

// errNotLeader answers requests that reached a broker which stopped
// leading while they waited.
var errNotLeader = newError(http.StatusServiceUnavailable, "not_leader", "this broker is not the leader; retry (any broker redirects to the leader)")

// leaderTasks are the loops that only the leader runs, each until its
// context ends (the broker stops or loses the lease): the scheduling
// loop (which also checks node liveness, idle jobs, telemetry and
// metering), the burst controller and the scheduled billing exports. Add
// new leader-only work here.
func (s *Server) leaderTasks() []func(context.Context) {
	return []func(context.Context){s.loop, s.fleet.Loop, s.runExports, s.slurm.Loop}
}

// initHA makes the broker a standby under elector until it wins a lease.
// A fenced store gets token 0 at once: below every token a leader holds,
// so nothing this broker writes before it leads can land.
func (s *Server) initHA(elector broker.Elector) {
	s.ha = &haState{elector: elector}
	if f, ok := s.backend.(broker.Fenced); ok {
		f.SetFence(0)
	}
}

// term is one run of the leader tasks.
type term struct {
	token  uint64
	cancel context.CancelFunc
	done   chan struct{}
}

// lead runs the leader tasks until ctx ends: always, when the broker
// always leads; otherwise once per term of the lease.
func (s *Server) lead(ctx context.Context) {
	if s.ha == nil {
		s.runTerm(ctx, s.leaderTasks())
		return
	}
	// The elector outlives the last term by a moment: the tasks stop
	// before the lease is given up, so a successor never overlaps them.
	ectx, stopElector := context.WithCancel(context.WithoutCancel(ctx))
	electorDone := make(chan struct{})
	go func() {
		defer close(electorDone)
		s.ha.elector.Run(ectx)
	}()
	var cur *term
	defer func() {
		if cur != nil {
			s.endTerm(cur, "broker stopping")
		}
		stopElector()
		<-electorDone
	}()
	recheck := s.cfg().HA.RenewInterval.D() / 2
	for {
		st := s.ha.elector.Status()
		if cur != nil && (!st.Leader || st.Token != cur.token) {
			s.endTerm(cur, "lease lost")
			cur = nil
		}
		if cur == nil && st.Leader {
			if err := s.takeOver(ctx, st.Token); err != nil {
				s.log.Error("could not take over; retrying", "token", st.Token, "err", err)
			} else {
				tctx, cancel := context.WithCancel(ctx)
				cur = &term{token: st.Token, cancel: cancel, done: make(chan struct{})}
				go func(t *term) {
					defer close(t.done)
					s.runTerm(tctx, s.leaderTasks())
				}(cur)
			}
		}
		s.noteStore(st.Err)
		select {
		case <-ctx.Done():
			return
		case <-s.ha.elector.Changes():
		case <-s.clock.After(recheck):
			// A lease can end by time alone; do not wait for the elector
			// to say so.
		}
	}
}

// takeOver starts a term: fence the store with the term's token, reload
// the in-memory view, and give agents their grace period.
func (s *Server) takeOver(ctx context.Context, token uint64) error {
	s.lock()
	defer s.mu.Unlock()
	if f, ok := s.backend.(broker.Fenced); ok {
		f.SetFence(token)
	}
	s.resetLocked()
	if err := s.load(ctx); err != nil {
		s.resetLocked()
		return fmt.Errorf("load state: %w", err)
	}
	if err := s.fleet.LoadLocked(ctx); err != nil {
		s.resetLocked()
		return err
	}
	s.graceLocked()
	s.ha.storeDown = false
	s.ha.term.Store(token)
	s.log.Info("leading", "token", token, "active_jobs", s.view.JobCount(), "nodes", s.view.NodeCount(),
		"agent_grace", s.cfg().HA.AgentGrace.D())
	s.kick()
	return nil
}

// endTerm stops the leader tasks and drops the in-memory view, waking
// every agent's waiting sync so that it hears "not the leader" at once.
func (s *Server) endTerm(t *term, why string) {
	t.cancel()
	<-t.done
	s.lock()
	s.ha.term.Store(0)
	s.resetLocked()
	s.mu.Unlock()
	s.log.Warn("standing by", "why", why, "token", t.token)
}

// graceLocked restarts the period in which no node is declared lost: at
// least the usual lost timeout from now, and ha.agentGrace in all.
func (s *Server) graceLocked() {
	extra := s.cfg().HA.AgentGrace.D() - s.cfg().Agents.LostTimeout()
	s.started = s.clock.Now().Add(max(extra, 0))
}

// noteStore follows the store's reachability as the elector sees it. The
// way back from an outage gives agents a new grace period before any
// decision, since their heartbeats could not be recorded meanwhile.
func (s *Server) noteStore(err error) {
	s.lock()
	defer s.mu.Unlock()
	switch {
	case err != nil && !s.ha.storeDown:
		s.ha.storeDown = true
		s.log.Error("store unreachable: no decisions until it is back; running jobs are left alone", "err", err)
	case err == nil && s.ha.storeDown:
		s.ha.storeDown = false
		s.graceLocked()
		s.log.Info("store reachable again; agents get their grace period", "agent_grace", s.cfg().HA.AgentGrace.D())
		s.kick()
	}
}

// resetLocked drops the leader's in-memory view (it is rebuilt from the
// store by load, the fleet's LoadLocked and, lazily, schedulingLocked). Every field
// that load or the leader tasks fill belongs here; TestStepDownDropsState
// checks none is forgotten (and the fleet's own, ResetLocked).
func (s *Server) resetLocked() {
	for _, ch := range s.nodeWake {
		close(ch)
	}
	s.view.Reset()
	s.dropSubmittedLocked()
	s.scheduling = scheduling{}
	s.burstWhy = map[string]broker.PendingReason{}
	s.fleet.ResetLocked()
	s.noteInventoryLocked()
	s.telemetry = map[string]*gpu.Sample{}
	s.owners = map[string]map[int]string{}
	s.tele = telemetryState{open: map[gpuKey]*accum{}}
	s.quiet = map[string]time.Time{}
	s.meter = meterState{reported: map[string]bool{}}
	s.nodeWake = map[string]chan struct{}{}
	s.strs.reset()
	s.limits.mu.Lock()
	s.limits.pending, s.limits.buckets = nil, nil
	s.limits.mu.Unlock()
}

// leadingLocked reports whether this broker leads a term whose lease is
// still valid. The caller holds s.mu, so no term can start or end
// meanwhile.
func (s *Server) leadingLocked() bool {
	if s.ha == nil {
		return true
	}
	tok := s.ha.term.Load()
	st := s.ha.elector.Status()
	return tok != 0 && st.Leader && st.Token == tok
}

// checkLeaderLocked is leadingLocked as an API error, for handlers that
// answer from the in-memory view (agents' orders must never come from a
// broker that stopped leading).
func (s *Server) checkLeaderLocked() error {
	if s.leadingLocked() {
		return nil
	}
	return errNotLeader
}

// mayDecideLocked reports whether the scheduling loop may act: it leads,
// and the store answers. Without the store the view may be stale, so the
// leader starts, stops and loses nothing until the store is back.
func (s *Server) mayDecideLocked() bool {
	if s.ha == nil {
		return true
	}
	return s.leadingLocked() && s.ha.elector.Status().Err == nil && !s.ha.storeDown
}

// standbyRoutes are the GET routes a standby answers itself: they read the
// store, not the leader's memory.
var standbyRoutes = map[string]bool{
	"/healthz": true, "/metrics": true, "/v1/whoami": true,
	"/v1/jobs": true, "/v1/jobs/:id": true, "/v1/jobs/:id/logs": true,
	"/v1/billing/usage": true, "/v1/billing/export": true,
	"/*": true, "": true, // unknown paths: 404 here
}

// leaderGate sends a standby's requests where they belong: reads of the
// store are served here, the rest is redirected (307, method and body
// kept) to the leader's peer URL, or answered 503 while no leader is
// known. The leader's URL is its ha.peerURL, its own address: several
// brokers may share one advertiseURL (a load balancer) for agents. On the
// leader, writes get 503 while the store is unreachable.
func (s *Server) leaderGate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if s.ha == nil {
			return next(c)
		}
		req := c.Request()
		read := req.Method == http.MethodGet || req.Method == http.MethodHead
		st := s.ha.elector.Status()
		tok := s.ha.term.Load()
		if tok != 0 && st.Leader && st.Token == tok {
			if st.Err != nil && !read {
				c.Response().Header().Set("Retry-After", "1")
				return newError(http.StatusServiceUnavailable, "store_unavailable", "the store is unreachable: %v", st.Err)
			}
			return next(c)
		}
		if read && standbyRoutes[c.Path()] {
			return next(c)
		}
		if st.LeaderURL != "" && !st.Leader && st.LeaderID != s.cfg().HA.BrokerID {
			c.Response().Header().Set(echo.HeaderLocation, strings.TrimRight(st.LeaderURL, "/")+req.RequestURI)
			var body errorBody
			body.Error.Code = "not_leader"
			body.Error.Message = fmt.Sprintf("this broker stands by; the leader %s is at %s", st.LeaderID, st.LeaderURL)
			return c.JSON(http.StatusTemporaryRedirect, body)
		}
		c.Response().Header().Set("Retry-After", "1")
		return newError(http.StatusServiceUnavailable, "no_leader", "no broker leads right now (election in progress); retry shortly")
	}
}

// health is the body and status of /healthz: 503 when the store is
// unreachable, with the reason; pinged says the store answered a ping.
func (s *Server) health(ctx context.Context) (h api.Health, status int, pinged bool) {
	h = api.Health{Status: "ok", Version: api.Version, Leader: true}
	if s.ha == nil {
		return h, http.StatusOK, false
	}
	st := s.ha.elector.Status()
	tok := s.ha.term.Load()
	h.Leader = tok != 0 && st.Leader && st.Token == tok
	h.LeaderURL = st.LeaderURL
	err := st.Err
	if p, ok := s.backend.(interface{ Ping(context.Context) error }); ok {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err = p.Ping(pctx)
		cancel()
		pinged = err == nil
	}
	if err != nil {
		h.Status = "unhealthy"
		h.Error = "store unreachable: " + err.Error()
		return h, http.StatusServiceUnavailable, false
	}
	return h, http.StatusOK, pinged
}
