package sim

import (
	"time"

	"github.com/spillway-dev/spillway/broker/sched"
)

// usageLedger is each team's decayed GPU-seconds for fair share, kept as
// the broker keeps it (broker/server/schedule_apply.go): at every cycle,
// attempts that ended since the last one and every attempt still holding
// cards are counted up to the cycle's time with sched.Usage's decay. The
// broker walks its holding jobs; the simulator keeps their GPUs per team,
// which counts the same (attempts only start right after an advance).
// The broker persists usage; the simulator has no restarts.
type usageLedger struct {
	halfLife time.Duration
	teams    map[string]sched.Usage
	// at is when every team was last valued, and the time up to which
	// holding attempts are counted.
	at time.Time
	// held is the GPUs each team's holding attempts hold (kept equal to
	// the sum over the team's jobs in starting or running state).
	held     map[string]int
	released []heldSpan
}

type heldSpan struct {
	team     string
	gpus     int
	from, to time.Time
}

func newUsageLedger(halfLife time.Duration, at time.Time) usageLedger {
	return usageLedger{halfLife: halfLife, teams: map[string]sched.Usage{}, at: at, held: map[string]int{}}
}

// hold records an attempt that took its cards (at the ledger's time).
func (l *usageLedger) hold(team string, gpus int) { l.held[team] += gpus }

// release records an attempt that stopped holding cards at to.
func (l *usageLedger) release(team string, gpus int, from, to time.Time) {
	l.held[team] -= gpus
	if from.Before(l.at) {
		from = l.at
	}
	if to.After(from) {
		l.released = append(l.released, heldSpan{team: team, gpus: gpus, from: from, to: to})
	}
}

// advance counts usage up to now.
func (l *usageLedger) advance(now time.Time) {
	if now.Before(l.at) {
		return
	}
	for team, u := range l.teams {
		l.teams[team] = u.DecayTo(now, l.halfLife)
	}
	add := func(team string, gpus int, from, to time.Time) {
		u, ok := l.teams[team]
		if !ok {
			u = sched.Usage{At: now}
		}
		l.teams[team] = u.AddHeld(gpus, from, to, l.halfLife).DecayTo(now, l.halfLife)
	}
	for _, sp := range l.released {
		add(sp.team, sp.gpus, sp.from, sp.to)
	}
	l.released = l.released[:0]
	if now.After(l.at) {
		for team, g := range l.held {
			if g > 0 {
				add(team, g, l.at, now)
			}
		}
	}
	l.at = now
}

// values fills m (cleared first) with every team's usage.
func (l *usageLedger) values(m map[string]float64) map[string]float64 {
	if m == nil {
		m = make(map[string]float64, len(l.teams))
	}
	clear(m)
	for team, u := range l.teams {
		m[team] = u.GPUSeconds
	}
	return m
}
