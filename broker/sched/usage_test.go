package sched

import (
	"math"
	"testing"
	"time"
)

func TestUsageDecay(t *testing.T) {
	const week = 7 * 24 * time.Hour
	u := Usage{GPUSeconds: 1000, At: t0}
	if got := u.DecayTo(t0.Add(week), week).GPUSeconds; math.Abs(got-500) > 1e-9 {
		t.Errorf("one half-life later: %v, want 500", got)
	}
	if got := u.DecayTo(t0.Add(-time.Hour), week); got != u {
		t.Errorf("decaying into the past changed usage: %+v", got)
	}
	// 8 GPUs for one hour, valued at its end with a half-life far longer
	// than an hour, is nearly 8*3600 GPU-seconds.
	v := Usage{At: t0}.AddHeld(8, t0, t0.Add(time.Hour), 365*24*time.Hour)
	if math.Abs(v.GPUSeconds-8*3600) > 2 || !v.At.Equal(t0.Add(time.Hour)) {
		t.Errorf("one hour of 8 GPUs: %+v", v)
	}
	// Adding two halves equals adding the whole.
	a := Usage{At: t0}.AddHeld(4, t0, t0.Add(3*time.Hour), week)
	b := Usage{At: t0}.AddHeld(4, t0, t0.Add(time.Hour), week).AddHeld(4, t0.Add(time.Hour), t0.Add(3*time.Hour), week)
	if math.Abs(a.GPUSeconds-b.GPUSeconds) > 1e-6 {
		t.Errorf("split intervals: %v != %v", a.GPUSeconds, b.GPUSeconds)
	}
	if got := (Usage{At: t0}).AddHeld(2, t0, t0.Add(time.Minute), 0).GPUSeconds; got != 120 {
		t.Errorf("no decay: %v, want 120", got)
	}
}
