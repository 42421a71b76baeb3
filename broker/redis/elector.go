package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/clock"
)

// DefaultLeaseTTL is how long a leader lease lasts without renewal.
const DefaultLeaseTTL = 10 * time.Second

// ElectorConfig configures a leader election.
type ElectorConfig struct {
	// ID names this broker (no '|'); URL is where the others redirect
	// writes to while it leads (its peer URL, ha.peerURL).
	ID  string
	URL string
	// TTL is the lease's life without renewal (default 10s). A dead
	// leader is replaced within TTL + RenewEvery.
	TTL time.Duration
	// RenewEvery is how often the leader renews and a standby tries to
	// take over (default TTL/3).
	RenewEvery time.Duration
	Clock      clock.Clock
	Logger     *slog.Logger
}

// Status is what an elector knows now.
type Status = broker.LeaderStatus

// Elector campaigns for the leader lease of one store and tells its
// observers who leads. The lease is a key set only when absent, with a TTL
// (acquireScript), renewed by a compare-and-PEXPIRE well before it expires
// (renewScript); each lease won increments the fence counter, and the new
// value is the winner's fencing token.
//
// A leader considers itself leader only until its local deadline: the
// start of its last successful renewal plus TTL less a tenth. The lease in
// Redis outlives that deadline, so two brokers never both believe they
// lead — and a broker paused past its deadline (SIGSTOP, a long GC, a
// frozen VM) stops believing it the moment it runs again, before it can
// learn anything from Redis.
type Elector struct {
	s   *Store
	cfg ElectorConfig
	log *slog.Logger

	mu       sync.Mutex
	st       Status
	value    string    // our lease value while leader
	deadline time.Time // local end of the lease while leader
	changes  chan struct{}
}

var _ broker.Elector = (*Elector)(nil)

// NewElector makes an elector for this store's cluster; Run campaigns.
func (s *Store) NewElector(cfg ElectorConfig) (*Elector, error) {
	if cfg.ID == "" || strings.Contains(cfg.ID, "|") {
		return nil, fmt.Errorf("elector: broker id %q must be non-empty and contain no '|'", cfg.ID)
	}
	if cfg.URL == "" {
		return nil, errors.New("elector: the broker's URL is required")
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultLeaseTTL
	}
	if cfg.RenewEvery <= 0 {
		cfg.RenewEvery = cfg.TTL / 3
	}
	if cfg.RenewEvery >= cfg.TTL/2 {
		return nil, fmt.Errorf("elector: renew interval %s must be under half the TTL %s", cfg.RenewEvery, cfg.TTL)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Elector{s: s, cfg: cfg, log: cfg.Logger.With("broker", cfg.ID), changes: make(chan struct{}, 1)}, nil
}

// Status returns what the elector knows now. Leader turns false as soon as
// the local deadline passes, even before Run notices.
func (e *Elector) Status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.st
	if st.Leader && !e.cfg.Clock.Now().Before(e.deadline) {
		st.Leader, st.Token = false, 0
	}
	return st
}

// IsLeader reports whether this broker holds an unexpired lease.
func (e *Elector) IsLeader() bool { return e.Status().Leader }

// LeaderURL is the URL of the current leader ("" when unknown).
func (e *Elector) LeaderURL() string { return e.Status().LeaderURL }

// Changes receives a value (coalesced) whenever Status changes.
func (e *Elector) Changes() <-chan struct{} { return e.changes }

func (e *Elector) notify() {
	select {
	case e.changes <- struct{}{}:
	default:
	}
}

// Run campaigns and renews until ctx ends, then gives the lease up so a
// standby takes over at once.
func (e *Elector) Run(ctx context.Context) {
	defer e.release()
	for {
		wait := e.step(ctx)
		select {
		case <-ctx.Done():
			return
		case <-e.cfg.Clock.After(wait):
		}
	}
}

// step renews (leader) or tries to take over (standby) once and returns
// how long to wait before the next step.
func (e *Elector) step(ctx context.Context) time.Duration {
	now := e.cfg.Clock.Now()
	e.mu.Lock()
	leading, value, deadline := e.st.Leader, e.value, e.deadline
	e.mu.Unlock()
	ttlMS := strconv.FormatInt(e.cfg.TTL.Milliseconds(), 10)
	keys := []string{e.s.leaderKey(), e.s.fenceKey()}
	if leading {
		left := deadline.Sub(now)
		if left <= 0 {
			e.lose("lease expired before it could be renewed")
			return 0
		}
		cctx, cancel := context.WithTimeout(ctx, min(e.cfg.RenewEvery, left))
		n, err := renewScript.Run(cctx, e.s.rdb, keys[:1], value, ttlMS).Int()
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return 0
			}
			e.setErr(err)
			// Retry soon, but never past the deadline unannounced.
			return min(e.cfg.RenewEvery/4, max(deadline.Sub(e.cfg.Clock.Now()), 0))
		}
		if n == 0 {
			e.lose("lease taken over by another broker")
			return 0
		}
		e.mu.Lock()
		e.deadline = now.Add(e.cfg.TTL - e.cfg.TTL/10)
		changed := e.st.Err != nil
		e.st.Err = nil
		e.mu.Unlock()
		if changed {
			e.notify()
		}
		return e.cfg.RenewEvery
	}
	cctx, cancel := context.WithTimeout(ctx, e.cfg.RenewEvery)
	res, err := acquireScript.Run(cctx, e.s.rdb, keys, e.cfg.ID+"|"+e.cfg.URL, ttlMS).Slice()
	cancel()
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("acquire script answered %v", res)
	}
	if err != nil {
		if ctx.Err() == nil {
			e.setErr(err)
		}
		return e.cfg.RenewEvery
	}
	tok, _ := res[0].(int64)
	holder, _ := res[1].(string)
	id, url := parseLease(holder)
	e.mu.Lock()
	old := e.st
	e.st = Status{LeaderID: id, LeaderURL: url}
	if tok > 0 {
		e.st.Leader, e.st.Token = true, uint64(tok)
		e.value = holder
		e.deadline = now.Add(e.cfg.TTL - e.cfg.TTL/10)
	}
	st := e.st
	e.mu.Unlock()
	if st.Leader {
		e.log.Info("won the leader lease", "token", st.Token, "ttl", e.cfg.TTL)
	} else if old.LeaderID != st.LeaderID {
		e.log.Info("standing by", "leader", st.LeaderID, "leader_url", st.LeaderURL)
	}
	if old != st {
		e.notify()
	}
	return e.cfg.RenewEvery
}

// parseLease splits "<token>|<id>|<url>".
func parseLease(v string) (id, url string) {
	parts := strings.SplitN(v, "|", 3)
	if len(parts) != 3 {
		return "", ""
	}
	return parts[1], parts[2]
}

func (e *Elector) setErr(err error) {
	err = fmt.Errorf("reach redis: %w", err)
	e.mu.Lock()
	was := e.st.Err
	e.st.Err = err
	e.mu.Unlock()
	if was == nil {
		e.log.Warn("leader election cannot reach redis", "err", err)
		e.notify()
	}
}

func (e *Elector) lose(why string) {
	e.mu.Lock()
	was := e.st.Leader
	e.st.Leader, e.st.Token = false, 0
	e.st.LeaderID, e.st.LeaderURL = "", ""
	e.value = ""
	e.mu.Unlock()
	if was {
		e.log.Warn("lost the leader lease", "why", why)
		e.notify()
	}
}

// release gives the lease up (compare-and-delete) when this broker holds
// it.
func (e *Elector) release() {
	e.mu.Lock()
	leading, value := e.st.Leader, e.value
	e.mu.Unlock()
	if !leading {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := releaseScript.Run(ctx, e.s.rdb, []string{e.s.leaderKey()}, value).Err(); err != nil {
		e.log.Warn("could not release the leader lease; it expires on its own", "err", err)
	}
	e.lose("stepped down")
}
