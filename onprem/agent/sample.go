package agent

import (
	"context"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/onprem/gpu"
)

// telemetryEvery is the least time between two GPU samples sent as
// telemetry: a burst of heartbeats (many jobs starting and ending) carries
// one sample every telemetryEvery, not one each.
const telemetryEvery = 250 * time.Millisecond

// sampler shares GPU samples between the agent's readers. A reader asks
// for a sample taken after some moment (say, after its process was
// reaped); when one already is, it gets that one instead of a new read of
// the cards, so thirty-two jobs ending together cost one or two samples,
// not thirty-two. Times are the process's monotonic clock: they pace
// reads and decide nothing about jobs.
type sampler struct {
	mu      sync.Mutex // one read of the cards at a time
	startAt time.Time  // when the latest sample began
	last    gpu.Sample
	err     error
}

// since returns a sample that began at or after t, taking one if needed,
// and whether it was taken by this call.
func (sp *sampler) since(b gpu.Backend, t time.Time) (gpu.Sample, bool, error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if !sp.startAt.IsZero() && !sp.startAt.Before(t) {
		return sp.last, false, sp.err
	}
	start := time.Now()
	s, err := b.Sample()
	sp.startAt, sp.last, sp.err = start, s, err
	return s, true, err
}

// age is how long ago the latest sample began.
func (sp *sampler) age() time.Duration {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.startAt.IsZero() {
		return time.Duration(1<<63 - 1)
	}
	return time.Since(sp.startAt)
}

// endGather is how long a report of ended attempts waits for attempts
// started moments before to end too, so that one report (one write on the
// broker) carries a batch of short jobs instead of one report each.
const endGather = 10 * time.Millisecond

// gatherEnds holds the next report back while some attempt has ended and
// another, spawned less than endGather ago, still runs: at most endGather
// in all. Anything else (a stop order, the long poll) is not delayed.
func (ag *Agent) gatherEnds(ctx context.Context) {
	deadline := time.Now().Add(endGather)
	for {
		ag.mu.Lock()
		ended, young := false, false
		for _, r := range ag.runs {
			switch {
			case r.isDone():
				ended = true
			case !r.spawnedAt().IsZero() && time.Since(r.spawnedAt()) < endGather:
				young = true
			}
		}
		ag.mu.Unlock()
		left := time.Until(deadline)
		if !ended || !young || left <= 0 {
			return
		}
		t := time.NewTimer(left)
		select {
		case <-ag.wakeCh: // an attempt ended; the report below carries it
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		if ctx.Err() != nil {
			return
		}
	}
}
