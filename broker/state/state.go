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
	// index, with what the leader keeps of it beside the record: a cycle
	// that gives 100,000 waiting jobs their reasons makes one map lookup
	// a job, not one in each of three maps.
	jobs map[string]*entry
	// order holds the same entries in a slice (entry.at is each one's
	// index): Jobs walks it, not the map, so that a snapshot lists the
	// jobs in the same order from cycle to cycle (Go randomises every walk
	// of a map) and the scheduler finds each job's derived record where it
	// left it, without a lookup. A job that leaves is replaced by the
	// last one, so one job moves.
	order []*entry
	nodes map[string]*broker.Node
	// byNode[n] is the set of jobs holding GPUs on node n, kept equal to
	// the holding jobs' placements.
	byNode map[string]map[string]bool
}

// entry is one job in the view.
type entry struct {
	job *broker.Job
	// io is the running job's last I/O reading, nil when none.
	io *IO
	// saved is when the job's reason was last written (unix ns; 0: not
	// in this term).
	saved int64
	// reason is the job's latest pending reason (when hasReason); only
	// the code is persisted, the sentence is formatted when read.
	reason    sched.Reason
	hasReason bool
	// waiting and code copy what the cycle reads of the record for every
	// waiting job (pending or provisioning; the code of its stored
	// reason, hasCode false when it has none), so that it reads the entry
	// alone, not the record too: at 100,000 waiting jobs each record read
	// is a cache miss. Set whenever job is.
	waiting, hasCode bool
	at               int32 // index in State.order
	code             string
}

// setJob makes j the entry's record.
func (e *entry) setJob(j *broker.Job) {
	e.job = j
	e.waiting = j.State == broker.StatePending || j.State == broker.StateProvisioning
	e.code, e.hasCode = "", j.Pending != nil
	if j.Pending != nil {
		e.code = j.Pending.Code
	}
}

// New returns an empty view.
func New() *State {
	st := &State{}
	st.Reset()
	return st
}

// Reset drops the whole view (a term ended, or one is about to load).
func (st *State) Reset() {
	for _, e := range st.order {
		e.at = -1 // stale handles
	}
	st.jobs = map[string]*entry{}
	st.order = nil
	st.nodes = map[string]*broker.Node{}
	st.byNode = map[string]map[string]bool{}
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
	e := &entry{at: int32(len(st.order))}
	e.setJob(j)
	st.jobs[j.ID] = e
	st.order = append(st.order, e)
	st.hold(j)
}

// drop takes job id's entry out of the view; its handles go stale.
func (st *State) drop(e *entry) {
	delete(st.jobs, e.job.ID)
	last := st.order[len(st.order)-1]
	st.order[e.at], last.at = last, e.at
	st.order[len(st.order)-1] = nil
	st.order = st.order[:len(st.order)-1]
	e.at = -1
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
		e := st.jobs[j.ID]
		var old *broker.Job
		if e != nil {
			old = e.job
			for _, p := range old.Placements {
				delete(st.byNode[p.Node], j.ID)
			}
		}
		switch {
		case j.State.Terminal():
			if e != nil {
				st.drop(e) // with its reason and I/O reading
			}
		case e != nil:
			e.setJob(j)
			st.hold(j)
		default:
			st.put(j)
		}
		if e != nil && j.State != broker.StatePending {
			e.reason, e.hasReason = sched.Reason{}, false
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
func (st *State) Job(id string) *broker.Job {
	if e := st.jobs[id]; e != nil {
		return e.job
	}
	return nil
}

// Jobs yields every non-terminal job, in no order.
func (st *State) Jobs() iter.Seq[*broker.Job] {
	return func(yield func(*broker.Job) bool) {
		for _, e := range st.order {
			if !yield(e.job) {
				return
			}
		}
	}
}

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
			if !yield(st.jobs[id].job) {
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
				if !yield(node, st.jobs[id].job) {
					return
				}
			}
		}
	}
}

// Reason is the latest pending reason of job id, if one is known.
func (st *State) Reason(id string) (sched.Reason, bool) {
	if e := st.jobs[id]; e != nil && e.hasReason {
		return e.reason, true
	}
	return sched.Reason{}, false
}

// ReasonAt is Reason for the job of h, without a lookup; a stale handle
// has none.
func (st *State) ReasonAt(h Handle) (sched.Reason, bool) {
	if h.e == nil || h.e.at < 0 || !h.e.hasReason {
		return sched.Reason{}, false
	}
	return h.e.reason, true
}

// SetReason records job id's latest pending reason; a job not in the view
// keeps none.
func (st *State) SetReason(id string, r sched.Reason) { st.NoteReason(id, r) }

// Noted is what NoteReason returns of a job.
type Noted struct {
	// Job is the job's record; nil when it has left the view.
	Job *broker.Job
	// Waiting: the job is pending or provisioning.
	Waiting bool
	// Code is the code of the reason its record carries; HasCode false
	// when it carries none.
	Code    string
	HasCode bool
	// SavedAt is when its reason was last written, if Saved (in this
	// term).
	SavedAt time.Time
	Saved   bool
}

// NoteReason is SetReason that also returns, from the same lookup, what a
// cycle needs of the job to decide whether to store the reason.
func (st *State) NoteReason(id string, r sched.Reason) Noted {
	e := st.jobs[id]
	if e == nil {
		return Noted{}
	}
	return e.note(r)
}

func (e *entry) note(r sched.Reason) Noted {
	e.reason, e.hasReason = r, true
	n := Noted{Job: e.job, Waiting: e.waiting, Code: e.code, HasCode: e.hasCode}
	if e.saved != 0 {
		n.SavedAt, n.Saved = time.Unix(0, e.saved), true
	}
	return n
}

// Handle is one job's entry in the view, as JobHandles gives it: it lets
// NoteReasonAt skip the lookup by id. It goes stale when the job leaves
// the view or the view is Reset.
type Handle struct {
	e *entry
	j *broker.Job // the record when the handle was given
}

// Job is the record the handle was given with.
func (h Handle) Job() *broker.Job { return h.j }

// JobHandles yields what Jobs yields, each job with its handle.
func (st *State) JobHandles() iter.Seq2[*broker.Job, Handle] {
	return func(yield func(*broker.Job, Handle) bool) {
		for _, e := range st.order {
			if !yield(e.job, Handle{e, e.job}) {
				return
			}
		}
	}
}

// NoteReasonAt is NoteReason for the job of h, without a lookup; a stale
// handle notes nothing and returns a nil Job, as for a job not in the
// view.
func (st *State) NoteReasonAt(h Handle, r sched.Reason) Noted {
	if h.e == nil || h.e.at < 0 {
		return Noted{}
	}
	return h.e.note(r)
}

// DropReason forgets job id's pending reason.
func (st *State) DropReason(id string) {
	if e := st.jobs[id]; e != nil {
		e.reason, e.hasReason = sched.Reason{}, false
	}
}

// NoteReasonSaved records that job id's reason was written at at.
func (st *State) NoteReasonSaved(id string, at time.Time) {
	if e := st.jobs[id]; e != nil {
		e.saved = at.UnixNano()
	}
}

// IO is job id's last I/O reading (zero when there is none).
func (st *State) IO(id string) IO {
	if e := st.jobs[id]; e != nil && e.io != nil {
		return *e.io
	}
	return IO{}
}

// SetIO records job id's latest I/O reading; a job not in the view keeps
// none.
func (st *State) SetIO(id string, r IO) {
	if e := st.jobs[id]; e != nil {
		e.io = &r
	}
}

// DropIO forgets job id's I/O reading (its attempt stopped running).
func (st *State) DropIO(id string) {
	if e := st.jobs[id]; e != nil {
		e.io = nil
	}
}
