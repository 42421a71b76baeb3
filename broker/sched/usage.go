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
