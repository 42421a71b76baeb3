package agent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime/trace"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spillway-dev/spillway/onprem/agentapi"
	"github.com/spillway-dev/spillway/onprem/gpu"
)

// cleanWait is how long the agent waits for a card to show no process of
// an ended job before it declares the card unhealthy.
var cleanWait = 5 * time.Second

// afterExit makes sure nothing of an ended attempt keeps its cards: first
// the rest of its process group, then any process the GPU backend still
// sees on those cards that belongs to no other running attempt (a
// grandchild that left the group, say). A card that stays held is taken
// out of the pool as unhealthy.
func (ag *Agent) afterExit(r *run) {
	if pg := r.group(); pg > 0 {
		_ = syscall.Kill(-pg, syscall.SIGKILL)
	}
	if len(r.a.UUIDs) == 0 {
		return
	}
	defer trace.StartRegion(context.Background(), "agent.cleanup").End()
	deadline := time.Now().Add(cleanWait)
	killed := map[int]bool{}
	for {
		stray, err := ag.strays(r)
		if err != nil {
			ag.log.Warn("gpu sample for cleanup failed", "job", r.a.Job, "err", err)
			return
		}
		if len(stray) == 0 {
			return
		}
		if time.Now().After(deadline) {
			ag.mu.Lock()
			for idx, pids := range stray {
				why := fmt.Sprintf("cleanup failed: pid %s still holds the card after job %s ended", joinInts(pids), r.a.Job)
				if len(pids) == 1 && pids[0] == 0 {
					why = fmt.Sprintf("cleanup failed: memory still in use, held by no process, after job %s ended", r.a.Job)
				}
				ag.unhealthy[idx] = why
				ag.log.Error("gpu not clean after job; taking it out of the pool", "job", r.a.Job, "gpu", idx, "pids", pids)
			}
			ag.mu.Unlock()
			return
		}
		for idx, pids := range stray {
			for _, pid := range pids {
				if pid == 0 || killed[pid] {
					continue
				}
				killed[pid] = true
				err := syscall.Kill(pid, syscall.SIGKILL)
				leak := agentapi.Leak{GPU: uuidAt(ag.inv, idx), PID: pid, Job: r.a.Job, Killed: err == nil}
				if err != nil {
					leak.Error = err.Error()
				}
				ag.log.Warn("killed a process left on a gpu by an ended job", "job", r.a.Job, "gpu", idx, "pid", pid, "err", err)
				ag.mu.Lock()
				ag.leaks = append(ag.leaks, leak)
				ag.mu.Unlock()
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// residualMemory is how much memory a card may show with no process on it
// and still count as clean (the driver's own reservations): 1 GiB or 2% of
// the card, whichever is larger.
func residualMemory(cardBytes int64) int64 { return max(1<<30, cardBytes/50) }

// strays returns, per card index of the ended run, the processes on it
// that belong to no other running attempt. A card with no such process
// that still shows memory in use, and that no other attempt shares, is
// returned with pid 0: memory held by nothing the agent can kill.
func (ag *Agent) strays(ended *run) (map[int][]int, error) {
	// Any sample that began after this call is as good as a new one.
	s, _, err := ag.samples.since(ag.backend, time.Now())
	if err != nil {
		return nil, err
	}
	ag.mu.Lock()
	ag.noteEventsLocked(s)
	others := map[string]bool{}
	otherGroups := map[int]bool{}
	for _, r := range ag.runs {
		if r != ended && !r.isDone() {
			others[r.a.Job] = true
			otherGroups[r.group()] = true
		}
	}
	ag.mu.Unlock()
	mine := map[string]bool{}
	for _, u := range ended.a.UUIDs {
		mine[u] = true
	}
	shared := map[string]bool{}
	ag.mu.Lock()
	for _, r := range ag.runs {
		if r != ended && !r.isDone() {
			for _, u := range r.a.UUIDs {
				shared[u] = true
			}
		}
	}
	ag.mu.Unlock()
	out := map[int][]int{}
	for _, d := range s.Devices {
		if !mine[d.UUID] {
			continue
		}
		holders := gpu.Holders(s, []string{d.UUID})
		for _, p := range holders {
			if p.PID == os.Getpid() || belongsTo(p.PID, others, otherGroups) {
				continue
			}
			out[d.Index] = append(out[d.Index], p.PID)
		}
		if len(holders) == 0 && !shared[d.UUID] && d.MemoryUsedBytes > residualMemory(cardMemory(ag.inv, d.Index)) {
			out[d.Index] = append(out[d.Index], 0)
		}
	}
	return out, nil
}

// belongsTo reports whether pid is part of another running attempt, by its
// process group or the SPILLWAY_JOB_ID it inherited.
func belongsTo(pid int, jobs map[string]bool, groups map[int]bool) bool {
	if pgid, err := syscall.Getpgid(pid); err == nil && groups[pgid] {
		return true
	}
	return jobs[inheritedJob(pid)]
}

// inheritedJob is the SPILLWAY_JOB_ID in a process's environment ("" if
// none or unreadable).
func inheritedJob(pid int) string {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return ""
	}
	for _, kv := range bytes.Split(env, []byte{0}) {
		if id, ok := bytes.CutPrefix(kv, []byte("SPILLWAY_JOB_ID=")); ok {
			return string(id)
		}
	}
	return ""
}

// ownersLocked tells, for each process on a card, which job it belongs to:
// the attempt whose process group it is in, else the job id it inherited.
func (ag *Agent) ownersLocked(s gpu.Sample) map[int]string {
	groups := map[int]string{}
	for ref, r := range ag.runs {
		if pg := r.group(); pg > 0 {
			groups[pg] = ref.Job
		}
	}
	var out map[int]string
	for _, d := range s.Devices {
		for _, p := range d.Processes {
			job := ""
			if pgid, err := syscall.Getpgid(p.PID); err == nil {
				job = groups[pgid]
			}
			if job == "" {
				job = inheritedJob(p.PID)
			}
			if job != "" {
				if out == nil {
					out = map[int]string{}
				}
				out[p.PID] = job
			}
		}
	}
	return out
}

// noteEventsLocked takes cards out of the pool on critical events: an XID
// after which NVIDIA says to reset the card, or an uncorrectable ECC error.
func (ag *Agent) noteEventsLocked(s gpu.Sample) {
	for _, d := range s.Devices {
		for _, e := range d.Events {
			if !gpu.Critical(e) {
				if e.Kind == gpu.EventXID {
					ag.log.Info("gpu reported a non-critical xid", "gpu", d.Index, "xid", e.Code, "what", gpu.XIDText(e.Code))
				}
				continue
			}
			if _, already := ag.unhealthy[d.Index]; already {
				continue
			}
			why := fmt.Sprintf("%d uncorrectable ECC errors", e.Code)
			if e.Kind == gpu.EventXID {
				why = fmt.Sprintf("XID %d: %s", e.Code, gpu.XIDText(e.Code))
			}
			ag.unhealthy[d.Index] = why
			ag.log.Error("gpu unhealthy after a critical event", "gpu", d.Index, "why", why)
		}
	}
}

func cardMemory(inv gpu.Inventory, idx int) int64 {
	for _, d := range inv.Devices {
		if d.Index == idx {
			return d.MemoryBytes
		}
	}
	return 0
}

func uuidAt(inv gpu.Inventory, idx int) string {
	for _, d := range inv.Devices {
		if d.Index == idx {
			return d.UUID
		}
	}
	return ""
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
