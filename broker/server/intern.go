package server

import (
	"sync"

	"github.com/spillway-dev/spillway/broker"
)

// interner keeps one copy of the strings that thousands of jobs share
// (team, project, queue, priority, user, the kinds of transitions and the
// submit's "by <user>"), so that 100,000 pending jobs do not hold 100,000 copies
// of "default" — whether they came in through the API or were read back
// from the store after a restart. It only grows by distinct values, which
// validation bounds in length (never by per-job values such as names or
// ids); values longer than internMaxLen are left alone.
type interner struct {
	mu sync.Mutex
	m  map[string]string
}

// internMaxLen is the longest string worth interning.
const internMaxLen = 96

func (in *interner) str(s string) string {
	if s == "" || len(s) > internMaxLen {
		return s
	}
	if v, ok := in.m[s]; ok {
		return v
	}
	if in.m == nil {
		in.m = map[string]string{}
	}
	in.m[s] = s
	return s
}

// job replaces the job's shared strings by their interned copies. The job
// must not be visible to anyone else yet.
func (in *interner) job(j *broker.Job) {
	in.mu.Lock()
	defer in.mu.Unlock()
	sp := &j.Spec
	sp.Team, sp.Project, sp.Queue, sp.Priority = in.str(sp.Team), in.str(sp.Project), in.str(sp.Queue), in.str(sp.Priority)
	sp.RestartPolicy = broker.RestartPolicy(in.str(string(sp.RestartPolicy)))
	sp.Burst = broker.BurstPolicy(in.str(string(sp.Burst)))
	sp.Checkpoint.Signal = in.str(sp.Checkpoint.Signal)
	sp.Resources.GPUModel = in.str(sp.Resources.GPUModel)
	j.User = in.str(j.User)
	for i := range j.History {
		t := &j.History[i]
		t.From, t.To = broker.State(in.str(string(t.From))), broker.State(in.str(string(t.To)))
		t.Reason = in.str(t.Reason)
		if t.Reason == "submitted" {
			t.Detail = in.str(t.Detail) // "by <user>": one per user
		}
	}
	if p := j.Pending; p != nil {
		p.Code = in.str(p.Code)
	}
}

// reset forgets every interned string (a broker that stops leading drops
// its jobs; the strings go with them).
func (in *interner) reset() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.m = nil
}
