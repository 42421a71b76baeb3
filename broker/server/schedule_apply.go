package server

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/sched"
	"github.com/spillway-dev/spillway/broker/state"
)

// usageFlushEvery bounds what a crash can lose of fair-share usage: the
// GPU-seconds of attempts that ended since the last write. Attempts still
// holding cards are never lost: after a restart they are counted from the
// time of the last write.
const usageFlushEvery = 30 * time.Second

// scheduling is the server's side of the scheduler core: the core with its
// reused buffers, the policy from the config, and the fair-share ledger.
// Guarded by Server.mu; set up on first use.
type scheduling struct {
	core   *sched.Scheduler
	policy sched.Policy
	ledger *usageLedger
	// handles[k] is the view's handle of the last snapshot's k-th job:
	// applying its plan gives each waiting job its reason without a
	// lookup by id (sched.Pending.SnapshotJob).
	handles []state.Handle
}

// usageLedger is the fair-share ledger (sched.Ledger) kept in memory and
// written to broker.BucketUsage at most every usageFlushEvery. Usage
// comes from the jobs' actual holding time: from scheduling to the end of
// the attempt as the broker records it.
type usageLedger struct {
	*sched.Ledger
	flushedAt time.Time
	dirty     bool
}

// schedulingLocked returns the scheduler state, loading the persisted
// usage the first time.
func (s *Server) schedulingLocked(ctx context.Context) (*scheduling, error) {
	sc := &s.scheduling
	if sc.ledger != nil {
		return sc, nil
	}
	teams := map[string]sched.Usage{}
	var at time.Time
	err := s.store.View(ctx, func(tx broker.Tx) error {
		return tx.Scan(broker.BucketUsage, "", "", func(team string, raw []byte) error {
			var u sched.Usage
			if err := json.Unmarshal(raw, &u); err != nil {
				return fmt.Errorf("decode usage of team %s: %w", team, err)
			}
			teams[team] = u
			if u.At.After(at) {
				at = u.At
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("load fair-share usage: %w", err)
	}
	if at.IsZero() {
		at = s.clock.Now()
	}
	l := &usageLedger{Ledger: sched.NewLedger(s.cfg().Scheduler.FairShareHalfLife.D(), teams, at), flushedAt: at}
	sc.core = sched.New()
	sc.policy = s.cfg().Policy()
	sc.ledger = l
	return sc, nil
}

// heldFrom is when a holding job took its cards: its last scheduling.
func heldFrom(j *broker.Job) time.Time {
	for i := len(j.History) - 1; i >= 0; i-- {
		if j.History[i].To == broker.StateStarting {
			return j.History[i].At
		}
	}
	if j.StartedAt != nil {
		return *j.StartedAt
	}
	return time.Time{}
}

// release records that old's attempt stopped holding cards; now is the
// job after the change.
func (l *usageLedger) release(old, now *broker.Job) {
	if l == nil || !old.State.Holding() || now.State.Holding() || len(now.History) == 0 {
		return
	}
	l.Release(old.Spec.Team, old.TotalGPUs(), heldFrom(old), now.History[len(now.History)-1].At)
}

// advance counts usage up to now: attempts released since the last
// advance, and every job still holding cards — held yields each node and
// a job holding cards there (state.State.Held), each node's share of a job
// counted by its cards.
func (l *usageLedger) advance(now time.Time, held iter.Seq2[string, *broker.Job]) {
	added := l.Advance(now, func(add func(team string, gpus int, from time.Time)) {
		for node, j := range held {
			if j == nil || !j.State.Holding() {
				continue
			}
			p, _, _ := placedOn(j, node)
			add(j.Spec.Team, len(p.GPUs), heldFrom(j))
		}
	})
	l.dirty = l.dirty || added
}

// flush returns the write of every team's usage when one is due, or nil.
func (l *usageLedger) flush(now time.Time) func(broker.Tx) error {
	if !l.dirty || now.Sub(l.flushedAt) < usageFlushEvery {
		return nil
	}
	teams := make(map[string]sched.Usage, len(l.Teams))
	for team, u := range l.Teams {
		teams[team] = u
	}
	return func(tx broker.Tx) error {
		for team, u := range teams {
			raw, err := json.Marshal(u)
			if err != nil {
				return fmt.Errorf("encode usage of team %s: %w", team, err)
			}
			if err := tx.Put(broker.BucketUsage, team, raw); err != nil {
				return err
			}
		}
		return nil
	}
}

// logPreemptions records each preemption of a plan.
func (s *Server) logPreemptions(plan *sched.Plan) {
	for _, p := range plan.Preemptions {
		s.log.Info("job preempted", "job", p.Victim, "for", p.For, "rule", p.Rule, "gpus", p.GPUs, "lost_work", p.LostWork)
	}
}
