package server

import (
	"context"
	"fmt"
	"github.com/spillway-dev/spillway/broker/api"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
	"github.com/spillway-dev/spillway/onprem/agentapi"
	"github.com/spillway-dev/spillway/providers"
)

// TestSpotReclaimRequeuesAndReplaces: a preemptible job runs on a spot
// machine; its agent reports EC2's interruption notice. The machine
// drains (reason spot_reclaim), the job gets its checkpoint signal and
// returns to the queue with the work lost since its last checkpoint
// recorded, the spot offer cools down so the next decision replaces the
// machine with the on-demand one, the job runs there, and the ledger
// closes the reclaimed machine no later than the reclaim time, with no
// overlap between the job's lines on the two machines.
func TestSpotReclaimRequeuesAndReplaces(t *testing.T) {
	r := newBurstRig(t)
	r.fill()
	j := r.submit(tokAlice, `{"resources": {"gpus": 8}, "timeout": "2h", "preemptible": true, "checkpoint": {"signal": "SIGUSR1", "grace": "5m"}, "command": ["train"]}`)
	r.until("running on spot", 300, func() bool { return r.job(j.ID).State == broker.StateRunning })
	first := r.job(j.ID).Placements[0].Node
	if rec := r.rec(first); !rec.Offer.Spot {
		t.Fatalf("the preemptible job went to %s, want the spot offer", rec.Offer.Key())
	}
	r.run(10 * time.Minute)
	now := r.clock.Now()
	reclaimAt := now.Add(2 * time.Minute)
	r.machine(first).notices = []agentapi.Notice{{Kind: agentapi.NoticeSpotInterruption, Action: "terminate", ReclaimAt: reclaimAt, SeenAt: now}}
	r.step()

	rec := r.rec(first)
	if rec.State != broker.MachineDraining || rec.Reclaim == nil || !rec.Reclaim.At.Equal(reclaimAt) {
		t.Fatalf("machine after the notice: state %s reclaim %+v", rec.State, rec.Reclaim)
	}
	if last := rec.History[len(rec.History)-1]; last.Reason != agentapi.ReasonSpotReclaim || !strings.Contains(last.Detail, "takes the machine back") {
		t.Fatalf("machine history ends %+v", last)
	}
	stop := r.job(j.ID).Stop
	if stop == nil || stop.Reason != agentapi.ReasonSpotReclaim || stop.Signal != "SIGUSR1" || stop.Grace > time.Minute || stop.Grace <= 0 {
		t.Fatalf("stop %+v, want spot_reclaim with SIGUSR1 and the grace cut to half of the 2m left", stop)
	}
	// The checkpoint upload failed: the attempt ends with no new checkpoint.
	r.machine(first).exit(j.ID, 0, "")
	r.step()
	jj := r.job(j.ID)
	var reclaimed *broker.Transition
	for i := range jj.History {
		if jj.History[i].To == broker.StatePreempted && jj.History[i].Reason == agentapi.ReasonSpotReclaim {
			reclaimed = &jj.History[i]
		}
	}
	if reclaimed == nil || !strings.Contains(reclaimed.Detail, "lost work: 10m") {
		t.Fatalf("no reclaim with its lost work in the history: %+v", jj.History)
	}
	var x api.Explanation
	if code := r.do("GET", "/v1/jobs/"+j.ID+"/explain", tokAlice, nil, &x); code != http.StatusOK {
		t.Fatalf("explain: %d", code)
	}
	if len(x.Reclaims) != 1 || !slices.ContainsFunc(x.Steps, func(s string) bool {
		return strings.Contains(s, "Reclaimed by its provider") && strings.Contains(s, "lost work: 10m")
	}) {
		t.Fatalf("explain does not show the reclaim and its lost work: reclaims %+v, steps %q", x.Reclaims, x.Steps)
	}

	r.until("running again elsewhere", 300, func() bool {
		jj := r.job(j.ID)
		return jj.State == broker.StateRunning && jj.Placements[0].Node != first
	})
	second := r.job(j.ID).Placements[0].Node
	if o := r.rec(second).Offer; o.Spot || o.InstanceType != "big-ondemand" {
		t.Fatalf("replacement is %s, want the on-demand offer while the spot one cools down", o.Key())
	}
	r.until("reclaimed machine ended", 300, func() bool { return r.rec(first).State.Ended() })
	if end := r.rec(first).TerminatedAt; end == nil || end.After(reclaimAt) {
		t.Fatalf("reclaimed machine closed at %v, after the reclaim at %v", end, reclaimAt)
	}
	r.run(2 * time.Minute) // final slices
	var firstEnd, secondStart time.Time
	broker.Ledger{Store: r.store}.Scan(context.Background(), time.Time{}, time.Time{}, func(e billing.Entry) error {
		switch {
		case e.Job != j.ID:
		case e.Pool.InstanceID == first && e.End.After(firstEnd):
			firstEnd = e.End
		case e.Pool.InstanceID == second && (secondStart.IsZero() || e.Start.Before(secondStart)):
			secondStart = e.Start
		}
		if e.Pool.InstanceID == first && e.End.After(reclaimAt) {
			t.Errorf("reclaimed machine charged past the reclaim: %+v", e)
		}
		return nil
	})
	if firstEnd.IsZero() || secondStart.IsZero() || firstEnd.After(secondStart) {
		t.Fatalf("job's lines overlap: on the reclaimed machine until %v, on the replacement from %v", firstEnd, secondStart)
	}
}

// TestSpotNoticeDuringBootstrap: the machine's agent reads the notice
// before the job ever started there. Nothing starts on it; the job goes
// out again, keeping its wait, and runs once, on the replacement.
func TestSpotNoticeDuringBootstrap(t *testing.T) {
	r := newBurstRig(t)
	r.fill()
	now := r.clock.Now()
	r.bootNotices = []agentapi.Notice{{Kind: agentapi.NoticeSpotInterruption, Action: "terminate", ReclaimAt: now.Add(10 * time.Minute), SeenAt: now}}
	j := r.submit(tokAlice, `{"resources": {"gpus": 8}, "timeout": "2h", "preemptible": true, "command": ["train"]}`)
	r.until("running", 300, func() bool { return r.job(j.ID).State == broker.StateRunning })
	jj := r.job(j.ID)
	runs := 0
	for _, h := range jj.History {
		if h.To == broker.StateRunning {
			runs++
		}
	}
	if runs != 1 {
		t.Fatalf("the job ran %d times: %+v", runs, jj.History)
	}
	var reclaimed []broker.InstanceRecord
	for _, rec := range r.records() {
		if rec.Reclaim != nil {
			reclaimed = append(reclaimed, rec)
		}
	}
	if len(reclaimed) != 1 || reclaimed[0].ID == jj.Placements[0].Node || reclaimed[0].State == broker.MachineReady {
		t.Fatalf("reclaimed machines %+v; the job runs on %s", reclaimed, jj.Placements[0].Node)
	}
	if o := r.rec(jj.Placements[0].Node).Offer; o.Spot {
		t.Fatalf("replacement %s is the spot offer that is cooling down", o.Key())
	}
	// Nothing was started twice: one start in all, of the current
	// attempt, on the replacement; none on the reclaimed machine.
	var starts []string
	for _, a := range append([]*fakeAgent{r.onprem, r.machine(reclaimed[0].ID)}, r.machine(jj.Placements[0].Node)) {
		if a == nil {
			continue
		}
		for _, ref := range a.started {
			if ref.Job == j.ID {
				starts = append(starts, fmt.Sprintf("%s attempt %d", a.name, ref.Attempt))
			}
		}
	}
	if want := fmt.Sprintf("%s attempt %d", jj.Placements[0].Node, jj.Attempt); len(starts) != 1 || starts[0] != want {
		t.Fatalf("starts %v, want only %s", starts, want)
	}
	r.until("reclaimed machine ended", 300, func() bool { return r.rec(reclaimed[0].ID).State.Ended() })
}

// TestOffersShowCoolDown: after the provider refuses an offer for
// capacity, GET /v1/offers shows it skipped (cooling down, with the
// error) and the decision launched the next one.
func TestOffersShowCoolDown(t *testing.T) {
	r := newBurstRig(t)
	r.fill()
	r.cloud.NextCreateErr = providers.NewError(providers.ErrInsufficientCapacity, "cloud", "create", "InsufficientInstanceCapacity", nil)
	j := r.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "2h", "command": ["train"]}`)
	r.until("running", 300, func() bool { return r.job(j.ID).State == broker.StateRunning })
	var got struct {
		Offers []api.OfferView `json:"offers"`
	}
	if code := r.do("GET", "/v1/offers", tokAlice, nil, &got); code != http.StatusOK {
		t.Fatalf("GET /v1/offers: %d", code)
	}
	skipped := map[string]string{}
	for _, o := range got.Offers {
		skipped[o.InstanceType] = o.Skip
		if o.Skip != "" && !strings.Contains(o.SkipDetail, "the provider refused it") {
			t.Errorf("%s skipped: %s", o.InstanceType, o.SkipDetail)
		}
	}
	if len(got.Offers) != len(testOffers) || skipped["small"] != burst.SkipCoolingDown || skipped["small-b"] != "" {
		t.Fatalf("offers %+v, want small cooling down and the rest usable", got.Offers)
	}
	if o := r.rec(r.job(j.ID).Placements[0].Node).Offer; o.InstanceType != "small-b" {
		t.Fatalf("launched %s, want the fallback small-b", o.InstanceType)
	}
}
