package agent

import (
	"errors"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// A gang member's attempt waits at the start barrier between staging and
// its command (docs/jobs.md, "Multi-node jobs"): the agent reports its
// preflight (driver, CUDA, image, framework label); rank 0 listens on
// MASTER_PORT, which proves the port free and lets the other members
// probe it when the broker says; the command runs only on the broker's
// release, which comes when every member is staged and agrees.

// probeTimeout bounds one member's connection attempt to rank 0.
const probeTimeout = 5 * time.Second

// FrameworkLabel is the node label whose value a gang member reports as
// its framework version (process runtime; containers report the image).
const FrameworkLabel = "framework"

// gate is one attempt's start barrier.
type gate struct {
	g    agentapi.Gang
	rank int

	mu      sync.Mutex
	waiting bool
	pre     agentapi.Preflight
	ln      net.Listener
	release chan struct{}
	stop    chan struct{}
	once    sync.Once
	stopped sync.Once
}

func newGate(a agentapi.Assignment) *gate {
	return &gate{g: *a.Gang, rank: a.Rank, release: make(chan struct{}), stop: make(chan struct{})}
}

// report is the preflight while the attempt waits at the barrier.
func (g *gate) report() *agentapi.Preflight {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.waiting {
		return nil
	}
	p := g.pre
	return &p
}

// open releases the barrier (the broker's order). The member keeps
// reporting its preflight until barrier has closed rank 0's holder: the
// broker releases the other members only once rank 0's report has none.
func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

// cancel ends the wait without a start (a stop order).
func (g *gate) cancel() { g.stopped.Do(func() { close(g.stop) }) }

// probe connects to rank 0's MASTER_ADDR:MASTER_PORT once.
func (g *gate) probe(wake func()) {
	g.mu.Lock()
	if !g.waiting || g.pre.Probing || g.pre.Probed {
		g.mu.Unlock()
		return
	}
	g.pre.Probing = true
	g.mu.Unlock()
	go func() {
		addr := net.JoinHostPort(g.g.MasterAddr, strconv.Itoa(g.g.MasterPort))
		c, err := net.DialTimeout("tcp", addr, probeTimeout)
		g.mu.Lock()
		g.pre.Probing, g.pre.Probed = false, true
		if err != nil {
			g.pre.ProbeError = err.Error()
		} else {
			c.Close()
		}
		g.mu.Unlock()
		wake()
	}()
}

// barrier is the runtime's Barrier hook for a gang member: report the
// preflight, hold MASTER_PORT on rank 0, wait for the release or a stop.
func (ag *Agent) barrier(r *run, g *gate, image string) error {
	inv, err := ag.backend.Inventory() // read again: a driver may have changed since registration
	if err != nil {
		inv = ag.inv
	}
	g.mu.Lock()
	g.pre = agentapi.Preflight{Staged: true, DriverVersion: inv.DriverVersion, CUDAVersion: inv.CUDAVersion,
		Image: image, Framework: ag.cfg.Labels[FrameworkLabel]}
	if g.rank == 0 {
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(g.g.MasterPort))
		if err != nil {
			g.pre.PortError = err.Error()
		} else {
			g.ln, g.pre.Listening = ln, true
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					c.Close()
				}
			}()
		}
	}
	g.waiting = true
	g.mu.Unlock()
	r.mu.Lock()
	r.progress = "waiting at the gang's start barrier"
	r.mu.Unlock()
	ag.log.Info("gang member at the start barrier", "job", r.a.Job, "attempt", r.a.Attempt, "rank", g.rank)
	ag.wake()
	defer func() {
		g.mu.Lock()
		g.waiting = false
		if g.ln != nil {
			g.ln.Close() // the job binds MASTER_PORT itself
		}
		g.mu.Unlock()
		ag.wake() // rank 0's report without a preflight releases the others
	}()
	select {
	case <-g.release:
		return nil
	case <-g.stop:
		return errors.New("stopped at the gang's start barrier")
	}
}

// applyGang carries out the broker's barrier orders.
func (ag *Agent) applyGang(orders []agentapi.GangOrder) {
	for _, o := range orders {
		ag.mu.Lock()
		r := ag.runs[o.JobRef]
		ag.mu.Unlock()
		if r == nil || r.gate == nil {
			continue
		}
		switch {
		case o.Release:
			r.gate.open()
		case o.Probe:
			r.gate.probe(ag.wake)
		}
	}
}
