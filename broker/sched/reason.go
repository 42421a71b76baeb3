package sched

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// Reason is why one job stays pending, kept compact: its code, its place
// in its queue, the start estimate, and the few numbers its sentence
// needs. The sentence is formatted only when asked (Message,
// PendingReason): a cycle leaves ~100,000 jobs waiting, and most of their
// sentences are never read.
//
// A Reason stays valid after later cycles: the names it refers to live in
// a table of its own cycle that the Scheduler never reuses.
type Reason struct {
	ctx *reasonCtx
	// est is the estimated start (unix ns), 0 when none.
	est int64
	// at is the retry time (backoff) or the head's reserved start
	// (backfill).
	at int64
	// What the job waits for: g cards on each of n nodes, share bytes of
	// each when it shares cards, of model ctx.models[model].
	share        int64
	g, n, model  int32
	pos, queue   int32
	team, proj   int32 // quota: the team and project (-1: the team's quota)
	used, limit  int32 // quota: GPUs in use and the limit; array limit: elements running and the limit
	arr          int32 // array limit: the array
	victims      int32 // preempting: index in ctx.victims
	kind         reasonKind
	byResv       bool // the estimate is the head's reservation
	projectQuota bool // quota: the project's limit, not the team's
}

// reasonKind is a Reason's code as a small number; reasonCodes spells it.
type reasonKind uint8

const (
	kindNone reasonKind = iota
	kindBackoff
	kindQuota
	kindQueueReserved
	kindResources
	kindGang
	kindBackfill
	kindReleasing
	kindPreempting
	kindNoFit
	kindArrayLimit
	kindFixed // a sentence given whole (FixedReason)
)

var reasonCodes = [...]string{kindNone: "", kindBackoff: ReasonBackoff, kindQuota: ReasonQuota,
	kindQueueReserved: ReasonQueueReserved, kindResources: ReasonResources, kindGang: ReasonGang,
	kindBackfill: ReasonBackfill, kindReleasing: ReasonReleasing, kindPreempting: ReasonPreempting,
	kindNoFit: ReasonNoFit, kindArrayLimit: ReasonArrayLimit}

// reasonCtx is what one cycle's reasons share: its clock and the names
// they refer to by index.
type reasonCtx struct {
	now      int64
	queues   []string // by queue index
	models   []string // by constraint index
	teams    []string // by team index
	projects []string // by project index
	arrays   []string // by array index
	head     string   // the job holding the reservation
	victims  []victimText
	fixed    *broker.PendingReason // kindFixed
}

// victimText is what a preempting reason names: how many victims, the
// first three of them, and the nodes.
type victimText struct {
	n     int
	ids   []string
	nodes []string
}

// FixedReason wraps a reason given whole (a hold, say), so that the
// callers keep one kind of reason per job.
func FixedReason(r broker.PendingReason) Reason {
	return Reason{ctx: &reasonCtx{fixed: &r}, kind: kindFixed}
}

// Code is the reason's code (a Reason* constant); "" for the zero Reason.
func (r Reason) Code() string {
	if r.kind == kindFixed {
		return r.ctx.fixed.Code
	}
	return reasonCodes[r.kind]
}

// Position is the job's 1-based place in its queue's order (0 if none).
func (r Reason) Position() int {
	if r.kind == kindFixed {
		return r.ctx.fixed.Position
	}
	return int(r.pos)
}

// Queue is the job's queue ("" for a fixed or zero Reason).
func (r Reason) Queue() string {
	if r.ctx == nil || r.kind == kindFixed {
		return ""
	}
	return r.ctx.queues[r.queue]
}

// EstimatedStart is when the job is expected to start, if the cycle
// estimated it.
func (r Reason) EstimatedStart() *time.Time {
	if r.kind == kindFixed {
		return r.ctx.fixed.EstimatedStart
	}
	if r.est == 0 {
		return nil
	}
	t := time.Unix(0, r.est).UTC()
	return &t
}

// PendingReason is the reason as the API shows it, sentence included.
func (r Reason) PendingReason() broker.PendingReason {
	if r.kind == kindFixed {
		return *r.ctx.fixed
	}
	return broker.PendingReason{Code: r.Code(), Message: r.Message(), Position: r.Position(), EstimatedStart: r.EstimatedStart()}
}

// MarshalJSON writes the reason as the API shows it.
func (r Reason) MarshalJSON() ([]byte, error) { return json.Marshal(r.PendingReason()) }

// Message is the sentence shown to people, e.g. "team nlp at quota 16/16
// GPUs (borrow limit reached); 3rd in queue default".
func (r Reason) Message() string {
	switch r.kind {
	case kindNone:
		return ""
	case kindFixed:
		return r.ctx.fixed.Message
	}
	return string(r.appendMessage(make([]byte, 0, 96)))
}

func (r Reason) appendMessage(b []byte) []byte {
	x := r.ctx
	switch r.kind {
	case kindBackoff:
		b = append(b, "retry backoff until "...)
		b = appendClock(b, r.at, x.now)
	case kindQuota:
		if r.projectQuota {
			b = append(b, "project "...)
			b = append(b, x.projects[r.proj]...)
			b = append(b, " of team "...)
		} else {
			b = append(b, "team "...)
		}
		b = append(b, x.teams[r.team]...)
		b = append(b, " at quota "...)
		b = strconv.AppendInt(b, int64(r.used), 10)
		b = append(b, '/')
		b = strconv.AppendInt(b, int64(r.limit), 10)
		b = append(b, " GPUs (borrow limit reached"...)
		if need := r.g * r.n; r.used+need > r.limit && r.used < r.limit {
			b = append(b, "; this job needs "...)
			b = strconv.AppendInt(b, int64(need), 10)
		}
		b = append(b, ')')
	case kindArrayLimit:
		// "array 01M9… runs 4 elements at once, its limit (%4)".
		b = append(b, "array "...)
		b = append(b, x.arrays[r.arr]...)
		b = append(b, " runs "...)
		b = strconv.AppendInt(b, int64(r.used), 10)
		if r.used == 1 {
			b = append(b, " element"...)
		} else {
			b = append(b, " elements"...)
		}
		b = append(b, " at once, its limit (%"...)
		b = strconv.AppendInt(b, int64(r.limit), 10)
		b = append(b, ')')
	case kindPreempting:
		// "preempting 2 jobs (a, b) on n1 for 8 GPUs on one node; starts
		// when they stop".
		v := &x.victims[r.victims]
		b = append(b, "preempting "...)
		b = strconv.AppendInt(b, int64(v.n), 10)
		if v.n == 1 {
			b = append(b, " job ("...)
		} else {
			b = append(b, " jobs ("...)
		}
		for k, id := range v.ids {
			if k > 0 {
				b = append(b, ", "...)
			}
			b = append(b, id...)
		}
		if v.n > len(v.ids) {
			b = append(b, ", …"...)
		}
		b = append(b, ") on "...)
		for k, name := range v.nodes {
			if k > 0 {
				b = append(b, ", "...)
			}
			b = append(b, name...)
		}
		b = append(b, " for "...)
		b = r.appendNeed(b)
		if v.n == 1 {
			b = append(b, "; starts when it stops"...)
		} else {
			b = append(b, "; starts when they stop"...)
		}
	case kindReleasing:
		b = append(b, "waiting for "...)
		b = r.appendNeed(b)
		b = append(b, " being released by stopping jobs"...)
	case kindNoFit:
		b = append(b, "no ready node set can hold "...)
		b = r.appendNeed(b)
	case kindQueueReserved:
		b = append(b, "the free GPUs are reserved for other queues; waiting for "...)
		b = r.appendNeed(b)
	case kindBackfill:
		b = append(b, "starting now would delay job "...)
		b = append(b, x.head...)
		b = append(b, ", reserved for "...)
		b = appendClock(b, r.at, x.now)
		b = append(b, "; waiting for "...)
		b = r.appendNeed(b)
	default: // resources, gang
		b = append(b, "waiting for "...)
		b = r.appendNeed(b)
	}
	b = append(b, "; "...)
	b = appendOrdinal(b, int(r.pos))
	b = append(b, " in queue "...)
	b = append(b, x.queues[r.queue]...)
	if r.est > 0 {
		b = append(b, "; est. start "...)
		b = appendClock(b, r.est, x.now)
		if r.byResv {
			b = append(b, " by reservation"...)
		}
	}
	return b
}

// appendNeed describes what the job waits for: "8 GPUs on one node",
// "2 nodes with 8 GPUs each", "1 GPU with 20Gi free (shared)".
func (r Reason) appendNeed(b []byte) []byte {
	if r.n > 1 {
		b = strconv.AppendInt(b, int64(r.n), 10)
		b = append(b, " nodes with "...)
		b = strconv.AppendInt(b, int64(r.g), 10)
		b = append(b, " GPUs each in one pool"...)
	} else {
		b = strconv.AppendInt(b, int64(r.g), 10)
		if r.g == 1 {
			b = append(b, " GPU"...)
		} else {
			b = append(b, " GPUs on one node"...)
		}
		if r.share > 0 {
			b = append(b, " with "...)
			b = append(b, broker.FormatQuantity(r.share)...)
			b = append(b, " free (shared)"...)
		}
	}
	if m := r.ctx.models[r.model]; m != "" {
		b = append(b, " of model "...)
		b = append(b, m...)
	}
	return b
}
