package server

import (
	"net/http"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/broker"
)

func TestTelemetryMinutesAndHours(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 2)
	util := 40
	a.util = &util
	h.advance(2*time.Hour+time.Minute, a) // one sample per second
	var minutes, hours api.TelemetryPage
	from := t0.Format(time.RFC3339)
	to := t0.Add(3 * time.Hour).Format(time.RFC3339)
	if code := h.do("GET", "/v1/telemetry?resolution=m&from="+from+"&to="+to, tokAlice, nil, &minutes); code != http.StatusOK {
		t.Fatalf("minutes: %d", code)
	}
	if got := len(minutes.Points); got != 2*121-2 && got != 2*121 && got != 2*120 {
		t.Fatalf("%d minute points for 2 cards over 121 minutes", got)
	}
	p := minutes.Points[5]
	if p.SMUtil != 40 || p.Samples < 59 || p.Samples > 61 || (p.GPU == 1 && p.MemoryUsedBytes != 1<<30) {
		t.Fatalf("minute point %+v", p)
	}
	h.do("GET", "/v1/telemetry?resolution=h&from="+from+"&to="+to, tokAlice, nil, &hours)
	if len(hours.Points) != 4 { // two closed hours × two cards
		t.Fatalf("%d hourly points: %+v", len(hours.Points), hours.Points)
	}
	for _, hp := range hours.Points {
		if hp.SMUtil != 40 || hp.Samples < 3500 {
			t.Fatalf("hour point %+v", hp)
		}
	}
	if code := h.do("GET", "/v1/telemetry?from=yesterday", tokAlice, nil, nil); code != http.StatusBadRequest {
		t.Fatalf("bad from = %d", code)
	}
}

// TestTelemetryRollUpOncePerHour: after a roll-up the broker knows the
// hour is done, and the cycles until the next hour neither roll up nor
// read the store's mark; the next hour is due again.
func TestTelemetryRollUpOncePerHour(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 1)
	h.advance(time.Hour+time.Minute, a)
	now := h.srv.clock.Now()
	hour := now.Truncate(time.Hour)
	h.srv.lock()
	got := h.srv.tele.rolledUpTo
	within := h.srv.telemetryUpkeepLocked(now)
	next := h.srv.telemetryUpkeepLocked(hour.Add(time.Hour))
	h.srv.mu.Unlock()
	if !got.Equal(hour) {
		t.Fatalf("rolled up to %v, want %v", got, hour)
	}
	if within.rollUp {
		t.Fatal("a cycle within the hour rolls up (and reads the mark) again")
	}
	if !next.rollUp {
		t.Fatal("the next hour is not rolled up")
	}
}

func TestTelemetryRetention(t *testing.T) {
	h := newHarness(t)
	old := []broker.TelemetryPoint{{Node: "n1", GPU: 0, Start: t0.Add(-8 * 24 * time.Hour), Samples: 1}}
	keep := []broker.TelemetryPoint{{Node: "n1", GPU: 0, Start: t0.Add(-6 * 24 * time.Hour), Samples: 1}}
	if err := h.store.Update(ctxT(), func(tx broker.Tx) error {
		if err := broker.PutTelemetry(tx, broker.Minute, old); err != nil {
			return err
		}
		return broker.PutTelemetry(tx, broker.Minute, keep)
	}); err != nil {
		t.Fatal(err)
	}
	h.cycle()
	var page api.TelemetryPage
	h.do("GET", "/v1/telemetry?from="+t0.Add(-30*24*time.Hour).Format(time.RFC3339), tokAlice, nil, &page)
	if len(page.Points) != 1 || !page.Points[0].Start.Equal(keep[0].Start) {
		t.Fatalf("after pruning: %+v", page.Points)
	}
}

func TestIdleJobReportedThenReclaimed(t *testing.T) {
	h := newHarness(t)
	h.srv.cfg().Idle.Reclaim = []string{"inference"}
	a := h.agent("n1", 8)
	zero := 0
	a.util = &zero
	batch := h.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "4h", "command": ["sleep", "99999"]}`)
	serving := h.submit(tokAlice, `{"queue": "inference", "resources": {"gpus": 1}, "timeout": "4h", "command": ["sleep", "99999"]}`)
	h.cycle()
	a.sync()
	h.advance(29*time.Minute, a)
	if h.job(batch.ID).IdleSince != nil {
		t.Fatal("idle before the window")
	}
	h.advance(2*time.Minute, a)
	b := h.job(batch.ID)
	if b.IdleSince == nil || b.State != broker.StateRunning || b.Stop != nil {
		t.Fatalf("batch job after the window: idle=%v state=%s stop=%v", b.IdleSince, b.State, b.Stop)
	}
	s := h.job(serving.ID)
	if s.Stop == nil || s.Stop.Reason != "idle_reclaimed" {
		t.Fatalf("inference job not reclaimed: %+v", s.Stop)
	}
	a.exit(serving.ID, 0, "SIGTERM")
	a.sync()
	if got := h.job(serving.ID); got.State != broker.StateFailed || got.History[len(got.History)-1].Reason != "idle_reclaimed" {
		t.Fatalf("reclaimed job: %s %+v", got.State, got.History[len(got.History)-1])
	}
	// The ended job's quiet mark goes with it.
	h.cycle()
	h.srv.lock()
	_, kept := h.srv.quiet[serving.ID]
	h.srv.mu.Unlock()
	if kept {
		t.Fatal("the ended job's quiet mark is kept")
	}
	// Work resumes: the mark goes away.
	busy := 90
	a.util = &busy
	h.advance(2*time.Second, a)
	if h.job(batch.ID).IdleSince != nil {
		t.Fatal("idle mark kept after the cards got busy")
	}
}
