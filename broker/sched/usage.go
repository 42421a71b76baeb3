package sched

import (
	"math"
	"time"
)

// Usage is a team's decayed GPU-seconds as of At: each GPU-second held at
// time s counts 2^(-(At-s)/halfLife). The fair-share factor reads it; the
// broker keeps one per team and persists it, and the simulator does the
// same in virtual time.
type Usage struct {
	GPUSeconds float64   `json:"gpuSeconds"`
	At         time.Time `json:"at"`
}

// DecayTo returns u as of t. Times before u.At leave u unchanged; a
// halfLife of 0 or less means no decay.
func (u Usage) DecayTo(t time.Time, halfLife time.Duration) Usage {
	if !t.After(u.At) {
		return u
	}
	if halfLife > 0 {
		u.GPUSeconds *= math.Exp2(-float64(t.Sub(u.At)) / float64(halfLife))
	}
	u.At = t
	return u
}

// AddHeld adds gpus held from from to to, valued as of the later of u.At
// and to: ∫ gpus·2^(-(T-s)/h) ds = gpus·h/ln2·(2^(-(T-to)/h) - 2^(-(T-from)/h)).
func (u Usage) AddHeld(gpus int, from, to time.Time, halfLife time.Duration) Usage {
	if to.After(u.At) {
		u = u.DecayTo(to, halfLife)
	}
	if !to.After(from) || gpus <= 0 {
		return u
	}
	if halfLife <= 0 {
		u.GPUSeconds += float64(gpus) * to.Sub(from).Seconds()
		return u
	}
	h := halfLife.Seconds()
	late := math.Exp2(-u.At.Sub(to).Seconds() / h)
	early := math.Exp2(-u.At.Sub(from).Seconds() / h)
	u.GPUSeconds += float64(gpus) * h / math.Ln2 * (late - early)
	return u
}

// Ledger is each team's decayed GPU-seconds for fair share, kept from the
// jobs' actual holding time — from the start of an attempt to its end —
// by the broker and the simulator alike. At every scheduling cycle
// Advance counts the attempts that ended since the last one (Release)
// and every attempt still holding cards, up to the cycle's time.
type Ledger struct {
	// HalfLife is the decay's half-life (no decay when 0 or less).
	HalfLife time.Duration
	// Teams are all valued as of At; At is also the time up to which the
	// attempts holding cards are counted.
	Teams map[string]Usage
	At    time.Time
	// released are attempts that stopped holding since At, not counted
	// yet.
	released []heldSpan
}

type heldSpan struct {
	team     string
	gpus     int
	from, to time.Time
}

// NewLedger is a ledger of teams (kept, not copied; nil for none) valued
// as of at.
func NewLedger(halfLife time.Duration, teams map[string]Usage, at time.Time) *Ledger {
	if teams == nil {
		teams = map[string]Usage{}
	}
	return &Ledger{HalfLife: halfLife, Teams: teams, At: at}
}

// Release records that a team's attempt of gpus, holding cards since
// from, stopped holding them at to. The part before At was counted by an
// earlier Advance.
func (l *Ledger) Release(team string, gpus int, from, to time.Time) {
	if from.Before(l.At) {
		from = l.At
	}
	if to.After(from) && gpus > 0 {
		l.released = append(l.released, heldSpan{team: team, gpus: gpus, from: from, to: to})
	}
}

// Advance counts usage up to now: the attempts released since the last
// Advance, and the attempts still holding cards, which holding reports
// by calling add once per team and GPU count with when they took their
// cards. It reports whether any usage was added; a now before At changes
// nothing.
func (l *Ledger) Advance(now time.Time, holding func(add func(team string, gpus int, from time.Time))) bool {
	if now.Before(l.At) {
		return false
	}
	for team, u := range l.Teams {
		l.Teams[team] = u.DecayTo(now, l.HalfLife)
	}
	added := false
	add := func(team string, gpus int, from, to time.Time) {
		if from.Before(l.At) {
			from = l.At
		}
		if !to.After(from) || gpus <= 0 {
			return
		}
		u, ok := l.Teams[team]
		if !ok {
			u = Usage{At: now}
		}
		l.Teams[team] = u.AddHeld(gpus, from, to, l.HalfLife).DecayTo(now, l.HalfLife)
		added = true
	}
	for _, sp := range l.released {
		add(sp.team, sp.gpus, sp.from, sp.to)
	}
	l.released = l.released[:0]
	if holding != nil {
		holding(func(team string, gpus int, from time.Time) { add(team, gpus, from, now) })
	}
	l.At = now
	return added
}

// Values fills m (cleared first; made when nil) with every team's
// GPU-seconds as of the last Advance.
func (l *Ledger) Values(m map[string]float64) map[string]float64 {
	if m == nil {
		m = make(map[string]float64, len(l.Teams))
	}
	clear(m)
	for team, u := range l.Teams {
		m[team] = u.GPUSeconds
	}
	return m
}
