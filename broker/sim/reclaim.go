package sim

import (
	"context"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// Spot reclaims. A machine of a spot offer with reclaimsPerHour gets, at
// its launch, a time to its reclaim notice drawn from an exponential
// distribution of that rate (the replay's seeded generator, so a seed
// gives the same reclaims). At the notice burstctl.Reclaim — the rules
// the broker applies to an agent's notice — drains the machine, requeues
// the jobs waiting for it, asks the jobs on it to checkpoint, and the
// offer cools down, so the next decision may replace the machine with
// another. Each stopped job ends by broker.Job.EndReclaimed, back at the
// head of its class; the machine, once empty, is scaled down, and the
// ledger closes it at the reclaim time at the latest.

// drawReclaim arms the reclaim notice of a machine just created.
func (e *engine) drawReclaim(m *machine) {
	rc, ok := e.c.Reclaims[m.rec.Offer.Key()]
	if !ok {
		return
	}
	after := time.Duration(e.reclaimRNG.ExpFloat64() / rc.PerHour * float64(time.Hour)).Round(time.Second)
	e.push(event{at: e.now.Add(after), kind: evNotice, m: m})
}

// notice is the provider's reclaim notice to machine m, if it still runs.
func (e *engine) notice(m *machine) bool {
	if e.machineByID(m.rec.ID) != m || m.rec.State.Ended() || m.rec.State == broker.MachineTerminating {
		return false
	}
	rc := e.c.Reclaims[m.rec.Offer.Key()]
	at := e.now.Add(rc.Notice)
	cd, _, ok, err := e.ctl.Reclaim(context.Background(), m.rec.ID, e.now, broker.Reclaim{Kind: "spot_interruption", Action: "terminate", At: at, SeenAt: e.now})
	if err != nil {
		e.fail(err)
		return false
	}
	if !ok {
		return false
	}
	e.res.Reclaims++
	e.coolDowns[m.rec.Offer.Key()] = cd
	e.push(event{at: at, kind: evReclaim, m: m})
	e.wantBurst(e.now)
	return true
}

// reclaimed is the provider taking machine m back: a job still on it
// (one whose checkpoint could not finish in the notice) ends as
// reclaimed, and the machine is closed at the reclaim time.
func (e *engine) reclaimed(m *machine) bool {
	if e.machineByID(m.rec.ID) != m || m.rec.State.Ended() {
		return false
	}
	for _, sj := range append([]*sjob(nil), m.running...) {
		e.release(sj)
		e.endReclaimed(sj)
	}
	if err := e.ctl.Close(context.Background(), m.rec.ID, e.now, e.now, "reclaimed", "the provider took the spot machine back"); err != nil {
		e.fail(err)
	}
	return true
}

// endReclaimed ends a released attempt stopped by a reclaim. The
// simulated job saved its work at the signal when its checkpoint fits in
// the grace the notice left; otherwise its last save is its last
// periodic checkpoint (checkpoint.interval from its start), and the
// work since is lost.
func (e *engine) endReclaimed(sj *sjob) {
	j := sj.j
	saved := e.now
	if st := j.Stop; st != nil && e.c.CheckpointTime <= st.Grace {
		sj.remaining -= st.RequestedAt.Sub(sj.runFrom)
	} else {
		saved = sj.runFrom
		if every := e.c.CheckpointInterval; every > 0 {
			saved = sj.runFrom.Add(e.now.Sub(sj.runFrom) / every * every)
		}
		sj.remaining -= saved.Sub(sj.runFrom)
	}
	if saved.After(sj.runFrom) {
		t := saved
		j.LastCheckpointAt = &t
	}
	lost := j.EndReclaimed(e.now, "")
	e.res.ReclaimedAttempts++
	e.res.ReclaimLostGPUHours += lost.Hours() * float64(j.TotalGPUs())
	e.pending++
}
