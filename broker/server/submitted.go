package server

import (
	"sync"

	"github.com/spillway-dev/spillway/broker"
)

// submittedJobs carries new jobs from their submit's commit into memory
// without the submit waiting for Server.mu, which cycles and agent reports
// hold across their own commits: a submit answers as soon as its job is
// durable, and whoever takes the lock next (lock) applies the job before
// it looks at anything. Every holder of s.mu goes through lock, so none
// sees memory without a job whose submit was answered.
type submittedJobs struct {
	mu   sync.Mutex
	jobs []*broker.Job
	// window is held for reading from a submit's commit until its jobs are
	// queued, and for writing by load while it reads the store: a job is
	// either read by load or queued after it, never both at once (a job
	// loaded, then started and ended, must not come back as pending).
	window sync.RWMutex
}

// lock takes the broker's lock and applies the jobs submitted meanwhile.
// Every holder of s.mu takes it here.
func (s *Server) lock() {
	s.mu.Lock()
	s.applySubmittedLocked()
}

// queueSubmitted hands jobs whose commit succeeded to the next holder of
// s.mu. They count against their team's pending cap at once. The caller
// holds s.submitted.window for reading.
func (s *Server) queueSubmitted(jobs ...*broker.Job) {
	for _, j := range jobs {
		s.trackPendingLocked(nil, j)
	}
	q := &s.submitted
	q.mu.Lock()
	q.jobs = append(q.jobs, jobs...)
	q.mu.Unlock()
}

// applySubmittedLocked puts the queued jobs into memory. A job already
// there was read by load from the store, which counted it too; it is left
// as it is (load's window keeps this from happening: see submittedJobs).
func (s *Server) applySubmittedLocked() {
	q := &s.submitted
	q.mu.Lock()
	jobs := q.jobs
	q.jobs = nil
	q.mu.Unlock()
	for _, j := range jobs {
		if !s.view.Admit(j) {
			s.trackPendingLocked(j, nil)
		}
	}
}

// dropSubmittedLocked forgets the queued jobs: the leader's view is being
// dropped, or load is about to read them (and every other committed job)
// from the store.
func (s *Server) dropSubmittedLocked() {
	q := &s.submitted
	q.mu.Lock()
	q.jobs = nil
	q.mu.Unlock()
}

// inventoryLimits is what the live inventory and the burst offers allow a
// spec: the most GPUs on one node or offer, and the most memory per GPU
// (zero: nothing known, the config's limits stand).
type inventoryLimits struct {
	gpus int
	mem  int64
}

// noteInventoryLocked publishes the inventory's limits after the nodes or
// the offers changed, for submits to read without s.mu.
func (s *Server) noteInventoryLocked() {
	var l inventoryLimits
	for n := range s.view.Nodes() {
		l.gpus = max(l.gpus, len(n.Inventory.Devices))
		for _, d := range n.Inventory.Devices {
			l.mem = max(l.mem, d.MemoryBytes)
		}
	}
	if s.fleet != nil { // nil while New loads the store, before any offer is known
		for o := range s.fleet.AllOffersLocked() {
			if o.Available {
				l.gpus = max(l.gpus, o.GPUs)
				l.mem = max(l.mem, o.GPUMemoryBytes)
			}
		}
	}
	s.invLimits.Store(&l)
}
