// Package state is the broker leader's in-memory view: every non-terminal
// job, every node, which jobs hold GPUs on which node, the latest pending
// reason of each waiting job and the last I/O reading of each running one.
// It has one applier, Apply, for what the store has accepted; broker/server
// writes the store first and applies to State only after the commit
// succeeded, so memory never holds what the store does not.
//
// State takes no lock of its own: the server's mutex (Server.mu, taken
// through Server.lock) guards every call, reads included. Jobs and nodes
// are replaced, never changed in place, so a value read under the lock
// stays consistent after it is released.
package state

import (
	"iter"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/sched"
)

// IO is the previous reading of one attempt's I/O, for data-wait
// detection.
type IO struct {
	Attempt int
	At      time.Time
	Bytes   int64
	// Since is when low compute with high I/O began (zero: not now).
	Since time.Time
}

// State is the leader's in-memory view. The zero value is not usable: use
// New.
type State struct {
	// jobs holds every non-terminal job, kept equal to the store's active
	// index.
	jobs  map[string]*broker.Job
	nodes map[string]*broker.Node
	// byNode[n] is the set of jobs holding GPUs on node n, kept equal to
	// the holding jobs' placements.
	byNode map[string]map[string]bool
	// reasons is the latest pending reason of each pending job; only the
	// code is persisted, the sentence is formatted when read.
	reasons map[string]sched.Reason
	// reasonSaved is when each job's reason was last written.
	reasonSaved map[string]time.Time
	// io is each running job's last I/O reading.
	io map[string]IO
}

// New returns an empty view.
func New() *State {
	st := &State{}
	st.Reset()
	return st
}

// Reset drops the whole view (a term ended, or one is about to load).
func (st *State) Reset() {
	st.jobs = map[string]*broker.Job{}
	st.nodes = map[string]*broker.Node{}
	st.byNode = map[string]map[string]bool{}
	st.reasons = map[string]sched.Reason{}
	st.reasonSaved = map[string]time.Time{}
	st.io = map[string]IO{}
}

// Load puts what the store holds into the view: its active jobs and its
// nodes. It is called on an empty view (after Reset).
func (st *State) Load(jobs []*broker.Job, nodes []*broker.Node) {
	for _, j := range jobs {
		st.put(j)
	}
	for _, n := range nodes {
		st.nodes[n.Name] = n
	}
}

// Admit puts a job that a submit committed outside Apply into the view.
// It returns false, and leaves the view as it is, when a job with that id
// is there already (load read it from the store).
func (st *State) Admit(j *broker.Job) bool {
	if _, ok := st.jobs[j.ID]; ok {
		return false
	}
	st.put(j)
	return true
}

// put adds a job not yet in the view, with its holdings.
func (st *State) put(j *broker.Job) {
	st.jobs[j.ID] = j
	st.hold(j)
}

// hold records j's placements in byNode when it holds GPUs.
func (st *State) hold(j *broker.Job) {
	if !j.State.Holding() {
		return
	}
	for _, p := range j.Placements {
		if st.byNode[p.Node] == nil {
			st.byNode[p.Node] = map[string]bool{}
		}
		st.byNode[p.Node][j.ID] = true
	}
}

// Apply is the one applier of committed changes: each job replaces its
// old version (the byNode index follows its placements; a terminal job
// leaves, with its reason and I/O reading; a job no longer pending loses
// its reason), and each node replaces its old version. each, when not
// nil, is called after every job is applied with its old version (nil for
// a job new to the view) and the new one, for the caller's side effects.
// The caller applies only what the store accepted.
func (st *State) Apply(jobs []*broker.Job, nodes []*broker.Node, each func(old, j *broker.Job)) {
	for _, j := range jobs {
		old := st.jobs[j.ID]
		if old != nil {
			for _, p := range old.Placements {
				delete(st.byNode[p.Node], j.ID)
			}
		}
		if j.State.Terminal() {
			delete(st.jobs, j.ID)
			delete(st.reasons, j.ID)
			delete(st.reasonSaved, j.ID)
			delete(st.io, j.ID)
		} else {
			st.jobs[j.ID] = j
			st.hold(j)
		}
		if j.State != broker.StatePending {
			delete(st.reasons, j.ID)
		}
		if each != nil {
			each(old, j)
		}
	}
	for _, n := range nodes {
		st.nodes[n.Name] = n
	}
}

// Job is the non-terminal job id, or nil.
func (st *State) Job(id string) *broker.Job { return st.jobs[id] }

// Jobs yields every non-terminal job, in no order.
func (st *State) Jobs() iter.Seq[*broker.Job] { return maps.Values(st.jobs) }

// JobCount is how many non-terminal jobs there are.
func (st *State) JobCount() int { return len(st.jobs) }

// Node is the node name, or nil.
func (st *State) Node(name string) *broker.Node { return st.nodes[name] }

// Nodes yields every node, in no order.
func (st *State) Nodes() iter.Seq[*broker.Node] { return maps.Values(st.nodes) }

// NodeCount is how many nodes there are.
func (st *State) NodeCount() int { return len(st.nodes) }

// NoteSeen replaces a node whose only change is kept in memory, not
// written (its LastSeen between the heartbeats that are written).
func (st *State) NoteSeen(n *broker.Node) { st.nodes[n.Name] = n }

// DropNode forgets a node the caller has deleted from the store.
func (st *State) DropNode(name string) { delete(st.nodes, name) }

// HoldingOn returns the jobs holding GPUs on node, by id.
func (st *State) HoldingOn(node string) []*broker.Job {
	return slices.SortedFunc(st.Holders(node), func(a, b *broker.Job) int { return strings.Compare(a.ID, b.ID) })
}

// Holders yields the jobs holding GPUs on node, in no order (HoldingOn
// sorts them, at the cost of a slice).
func (st *State) Holders(node string) iter.Seq[*broker.Job] {
	return func(yield func(*broker.Job) bool) {
		for id := range st.byNode[node] {
			if !yield(st.jobs[id]) {
				return
			}
		}
	}
}

// Held yields every node and a job holding GPUs on it, in no order; a job
// placed on several nodes comes once for each.
func (st *State) Held() iter.Seq2[string, *broker.Job] {
	return func(yield func(string, *broker.Job) bool) {
		for node, ids := range st.byNode {
			for id := range ids {
				if !yield(node, st.jobs[id]) {
					return
				}
			}
		}
	}
}

// Reason is the latest pending reason of job id, if one is known.
func (st *State) Reason(id string) (sched.Reason, bool) {
	r, ok := st.reasons[id]
	return r, ok
}

// SetReason records job id's latest pending reason.
func (st *State) SetReason(id string, r sched.Reason) { st.reasons[id] = r }

// DropReason forgets job id's pending reason.
func (st *State) DropReason(id string) { delete(st.reasons, id) }

// ReasonSaved is when job id's reason was last written to the store, if
// it was in this term.
func (st *State) ReasonSaved(id string) (time.Time, bool) {
	at, ok := st.reasonSaved[id]
	return at, ok
}

// NoteReasonSaved records that job id's reason was written at at.
func (st *State) NoteReasonSaved(id string, at time.Time) { st.reasonSaved[id] = at }

// IO is job id's last I/O reading (zero when there is none).
func (st *State) IO(id string) IO { return st.io[id] }

// SetIO records job id's latest I/O reading.
func (st *State) SetIO(id string, r IO) { st.io[id] = r }

// DropIO forgets job id's I/O reading (its attempt stopped running).
func (st *State) DropIO(id string) { delete(st.io, id) }
