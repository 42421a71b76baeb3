package server

import (
	"context"
	"encoding/csv"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
)

// ledgerFor sums a job's ledger GPU-milliseconds.
func (h *harness) ledgerFor(job string) (gpuMillis int64, entries []billing.Entry) {
	h.t.Helper()
	err := broker.Ledger{Store: h.store}.Scan(context.Background(), time.Time{}, time.Time{}, func(e billing.Entry) error {
		if e.Job == job {
			gpuMillis += e.GPUMillis
			entries = append(entries, e)
		}
		return nil
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return gpuMillis, entries
}

func TestMeteringMatchesAllocation(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 8)
	util := 50
	a.util = &util
	j := h.submit(tokAlice, `{"resources": {"gpus": 2}, "timeout": "1h", "command": ["x"]}`)
	h.cycle()
	a.sync()
	h.advance(10*time.Minute+30*time.Second, a)
	a.exit(j.ID, 0, "")
	a.sync()
	h.advance(30*time.Second, a)
	got := h.job(j.ID)
	held := got.EndedAt.Sub(got.History[1].At) // from scheduled to the recorded end
	gm, entries := h.ledgerFor(j.ID)
	want := held.Milliseconds() * 2
	if diff := gm - want; diff < -60_000*2 || diff > 60_000*2 {
		t.Fatalf("ledger %d GPU-ms, allocation %d GPU-ms (%s × 2)", gm, want, held)
	}
	for _, e := range entries {
		if e.Team != "nlp" || e.Pool.Kind != billing.PoolOnPrem || e.GPUModel != "H100" {
			t.Fatalf("entry %+v", e)
		}
	}
	if u := entries[len(entries)/2].UtilPermille; u != 500 {
		t.Fatalf("mid-job entry utilisation %d‰, want 500", u)
	}
	// The record is dropped once the ledger is through it.
	h.store.View(context.Background(), func(tx broker.Tx) error {
		recs, _ := broker.ListAllocs(tx)
		if len(recs) != 0 {
			t.Errorf("%d alloc records left", len(recs))
		}
		return nil
	})
}

func TestLostNodeMeteredToLastHeartbeat(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 8)
	j := h.submit(tokAlice, `{"resources": {"gpus": 1}, "preemptible": true, "timeout": "1h", "command": ["x"]}`)
	h.cycle()
	a.sync()
	h.advance(5*time.Minute, a)
	lastSeen := h.clock.Now()
	h.advance(2 * time.Minute) // the agent is gone
	got := h.job(j.ID)
	lost := got.History[3]
	if lost.To != broker.StateLost || !lost.At.Equal(lastSeen) {
		t.Fatalf("lost transition %+v, want at %s", lost, lastSeen)
	}
	gm, _ := h.ledgerFor(j.ID)
	want := lastSeen.Sub(got.History[1].At).Milliseconds()
	if gm < want-60_000 || gm > want+60_000 {
		t.Fatalf("metered %d ms, want about %d (to the last heartbeat)", gm, want)
	}
}

func TestUsageAndExportReconcile(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 8)
	h.submit(tokAlice, `{"resources": {"gpus": 2}, "timeout": "1h", "command": ["x"]}`)
	h.submit(tokBob, `{"resources": {"gpus": 3}, "timeout": "1h", "command": ["x"]}`)
	h.cycle()
	a.sync()
	h.advance(20*time.Minute, a)
	var rep billing.Report
	if code := h.do("GET", "/v1/billing/usage?by=team&month=2026-11", tokMoney, nil, &rep); code != http.StatusOK {
		t.Fatalf("usage = %d", code)
	}
	if len(rep.Rows) != 2 {
		t.Fatalf("rows %+v", rep.Rows)
	}
	// The owned pool reads "onprem", not "onprem/onprem" (issue #21).
	var byPool billing.Report
	if code := h.do("GET", "/v1/billing/usage?by=pool,pool-kind&month=2026-11", tokMoney, nil, &byPool); code != http.StatusOK ||
		len(byPool.Rows) != 1 || strings.Join(byPool.Rows[0].Key, " ") != "onprem onprem" {
		t.Fatalf("usage by pool: %d %+v", code, byPool.Rows)
	}
	var mine billing.Report
	h.do("GET", "/v1/billing/usage?by=team&month=2026-11", tokAlice, nil, &mine)
	if len(mine.Rows) != 1 || mine.Team != "nlp" {
		t.Fatalf("alice's report: %+v", mine)
	}
	if code := h.do("GET", "/v1/billing/usage?team=vision", tokAlice, nil, nil); code != http.StatusForbidden {
		t.Fatalf("alice asking for vision = %d", code)
	}
	req, _ := http.NewRequest("GET", h.http.URL+"/v1/billing/export?month=2026-11&granularity=entry", nil)
	req.Header.Set("Authorization", "Bearer "+tokMoney)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rows, err := csv.NewReader(resp.Body).ReadAll()
	if err != nil && err != io.EOF {
		t.Fatal(err)
	}
	col := -1
	for i, name := range rows[0] {
		if name == "BilledCost" {
			col = i
		}
	}
	if col < 0 {
		t.Fatalf("no BilledCost column in %v", rows[0])
	}
	var sum billing.Amount
	for _, r := range rows[1:] {
		a, err := billing.ParseAmount(r[col])
		if err != nil {
			t.Fatalf("BilledCost %q: %v", r[col], err)
		}
		sum += a
	}
	if rep.Total.Cost <= 0 {
		t.Fatalf("no cost in the report: %+v", rep.Total)
	}
	if sum != rep.Total.Cost {
		t.Fatalf("export sum %s != report total %s", sum, rep.Total.Cost)
	}
	if !strings.Contains(strings.Join(rows[0], ","), "ChargePeriodStart") {
		t.Fatalf("header %v", rows[0])
	}
}
