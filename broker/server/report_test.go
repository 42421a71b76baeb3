package server

import (
	"encoding/csv"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
)

func (h *harness) utilization(token, query string) *api.UtilizationReport {
	h.t.Helper()
	var rep api.UtilizationReport
	if code := h.do("GET", "/v1/reports/utilization?"+query, token, nil, &rep); code != http.StatusOK {
		h.t.Fatalf("utilization %s: %d", query, code)
	}
	return &rep
}

// TestUtilReportReconcilesWithLedger: two teams on two nodes, one
// computing and one holding memory idle; the report's GPU-hours allocated,
// computing and cost per team equal the ledger's to the GPU-millisecond,
// memory is attributed to the cards each team held, and the idle job and
// the idle cards are named.
func TestUtilReportReconcilesWithLedger(t *testing.T) {
	h := newHarness(t)
	n1, n2 := h.agent("n1", 4), h.agent("n2", 4)
	busy, idle := 40, 0
	n1.util, n2.util = &busy, &idle
	nlp := h.submit(tokAlice, `{"resources": {"gpus": 2}, "timeout": "4h", "command": ["train"]}`)
	vis := h.submit(tokBob, `{"resources": {"gpus": 3}, "timeout": "4h", "command": ["notebook"]}`)
	h.settle(n1, n2)
	if j := h.job(vis.ID); j.State != broker.StateRunning || j.Placements[0].Node != "n2" {
		t.Fatalf("vision's job: %s %+v", j.State, j.Placements)
	}
	h.advance(10*time.Minute, n1, n2)
	n1.exit(nlp.ID, 0, "")
	n2.exit(vis.ID, 0, "")
	h.advance(3*time.Minute, n1, n2)

	period := billing.Period{From: t0, To: t0.Add(time.Hour)}
	q := "from=" + t0.Format(time.RFC3339) + "&to=" + t0.Add(time.Hour).Format(time.RFC3339)
	rep := h.utilization(tokAdmin, q)
	ledger := broker.Ledger{Store: h.store}
	for _, team := range []string{"", "nlp", "vision"} {
		want, err := billing.LedgerTotals(ctxT(), ledger, period, team)
		if err != nil {
			t.Fatal(err)
		}
		var got api.UtilTotals
		for _, r := range rep.Rows {
			if team == "" || r.Team == team {
				got.Add(r.UtilTotals)
			}
		}
		if want.GPUMillis == 0 || got.GPUMillis != want.GPUMillis || got.EffectiveGPUMillis != want.EffectiveGPUMillis ||
			got.MeasuredGPUMillis != want.MeasuredGPUMillis || got.Cost != want.Cost {
			t.Errorf("team %q: report %d ms / %d effective / %s, ledger %d / %d / %s", team,
				got.GPUMillis, got.EffectiveGPUMillis, got.Cost, want.GPUMillis, want.EffectiveGPUMillis, want.Cost)
		}
	}
	if rep.Total.GPUMillis != rowsSum(rep.Rows) {
		t.Errorf("total %d is not the sum of rows %d", rep.Total.GPUMillis, rowsSum(rep.Rows))
	}
	byTeam := map[string]api.UtilRow{}
	for _, r := range rep.Rows {
		if r.Shift != config.ShiftWeekdayDay || r.Pool != "onprem" || r.GPUModel != "H100" {
			t.Errorf("row key %+v: Monday 09:00 UTC on-prem H100 expected", r)
		}
		byTeam[r.Team] = r
	}
	// nlp computed at 40% on cards 0 and 1 of n1 (0 and 1 GiB in use);
	// vision held cards 0-2 of n2 (0, 1, 2 GiB) computing nothing.
	if u := byTeam["nlp"].Utilization; u < 0.39 || u > 0.41 {
		t.Errorf("nlp utilisation %.3f, want 0.40", u)
	}
	if u := byTeam["vision"].Utilization; u != 0 {
		t.Errorf("vision utilisation %.3f, want 0", u)
	}
	if m := byTeam["nlp"].MeanMemoryBytes; m != 1<<29 {
		t.Errorf("nlp mean memory %d, want 0.5 GiB", m)
	}
	if m := byTeam["vision"].MeanMemoryBytes; m != 1<<30 {
		t.Errorf("vision mean memory %d, want 1 GiB", m)
	}
	if len(rep.IdleHolders) != 1 || rep.IdleHolders[0].Job != vis.ID || rep.IdleHolders[0].MeanMemoryBytes != 3<<29 {
		t.Errorf("idle holders: %+v", rep.IdleHolders)
	}
	if len(rep.IdleCards) != 4 || rep.IdleCards[0].Node != "n2" || rep.IdleCards[0].LongestIdleSeconds < 12*60 {
		t.Errorf("idle cards: %+v", rep.IdleCards)
	}
	// A user sees only their own team.
	mine := h.utilization(tokAlice, q)
	for _, r := range mine.Rows {
		if r.Team != "nlp" {
			t.Errorf("alice sees %+v", r)
		}
	}
	if code := h.do("GET", "/v1/reports/utilization?team=vision&"+q, tokAlice, nil, nil); code != http.StatusForbidden {
		t.Errorf("alice asks for vision: %d", code)
	}

	// CSV: one line per row plus the total, same figures.
	req, _ := http.NewRequest("GET", h.http.URL+"/v1/reports/utilization?format=csv&"+q, nil)
	req.Header.Set("Authorization", "Bearer "+tokMoney)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	recs, err := csv.NewReader(resp.Body).ReadAll()
	if err != nil || len(recs) != len(rep.Rows)+2 || recs[0][4] != "gpu_hours_allocated" || recs[len(recs)-1][4] != rep.Total.GPUHours {
		t.Fatalf("csv (%v): %q", err, recs)
	}
}

func rowsSum(rows []api.UtilRow) int64 {
	var n int64
	for _, r := range rows {
		n += r.GPUMillis
	}
	return n
}

// TestUtilReportSplitsShifts: ledger entries that straddle the end of the
// day shift and a weekend are cut at the boundary in the configured zone,
// and the pieces add up to the entries exactly.
func TestUtilReportSplitsShifts(t *testing.T) {
	h := newHarness(t)
	cfg := h.srv.cfg()
	cfg.Reports.TimeZone = "Asia/Kolkata" // +05:30: hours fall mid-slice in UTC
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	loc := cfg.Reports.Location()
	entry := func(start time.Time, gpuMillis int64) billing.Entry {
		start = start.UTC()
		rate, _ := billing.ParseAmount("2.50")
		e := billing.Entry{Start: start, End: start.Add(time.Minute), Kind: billing.KindUsage, Team: "nlp", Job: "j1", Attempt: 1,
			Pool: billing.Pool{Kind: billing.PoolOnPrem, Node: "n1"}, GPUModel: "H100", GPUMillis: gpuMillis, Rate: rate,
			Currency: "USD", UtilPermille: 500}
		e.Cost = billing.CostOf(rate, gpuMillis)
		e.ID = billing.DeriveID(e.Kind, e.Job, e.Attempt, "n1", e.Start)
		return e
	}
	entries := []billing.Entry{
		entry(time.Date(2026, 11, 30, 19, 59, 40, 0, loc), 120_001), // Monday: 20 s day, 40 s night
		entry(time.Date(2026, 12, 4, 23, 59, 30, 0, loc), 60_000),   // Friday night into Saturday
		entry(time.Date(2026, 12, 1, 10, 0, 0, 0, loc), 60_000),     // Tuesday day
	}
	if _, err := (broker.Ledger{Store: h.store}).Append(ctxT(), entries); err != nil {
		t.Fatal(err)
	}
	rep := h.utilization(tokAdmin, "from=2026-11-29&to=2026-12-08")
	got := map[string]int64{}
	for _, r := range rep.Rows {
		got[r.Shift] += r.GPUMillis
	}
	want := map[string]int64{config.ShiftWeekdayDay: 40_000 + 60_000, config.ShiftWeekdayNight: 80_001 + 30_000, config.ShiftWeekend: 30_000}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %d GPU-ms, want %d (all: %v)", k, got[k], v, got)
		}
	}
	if rep.Total.GPUMillis != 240_001 || rep.Total.Cost != entries[0].Cost+entries[1].Cost+entries[2].Cost {
		t.Errorf("total %d ms %s", rep.Total.GPUMillis, rep.Total.Cost)
	}
	if rep.Shifts.TimeZone != "Asia/Kolkata" || rep.Shifts.DayStart != 8 || rep.Shifts.DayEnd != 20 {
		t.Errorf("shift rules: %+v", rep.Shifts)
	}
}

func TestUtilReportBadInput(t *testing.T) {
	h := newHarness(t)
	for q, field := range map[string]string{
		"format=xml":                 "format",
		"table=people":               "table",
		"resolution=s":               "resolution",
		"from=2026-12-01&to=2026-11": "to",
	} {
		var e struct{ Error struct{ Field string } }
		if code := h.do("GET", "/v1/reports/utilization?"+q, tokAdmin, nil, &e); code != http.StatusBadRequest || e.Error.Field != field {
			t.Errorf("%s: %d field %q, want 400 on %s", q, code, e.Error.Field, field)
		}
	}
}

func TestReportsConfigValidation(t *testing.T) {
	cases := map[string]string{
		"reports: {timeZone: Mars/Olympus}":      "reports.timeZone",
		"reports: {dayStart: 25}":                "reports.dayStart",
		"reports: {dayStart: 9, dayEnd: 9}":      "reports.dayEnd",
		"reports: {weekend: [caturday]}":         "reports.weekend[0]",
		"reports: {starvationAfter: 1s}":         "reports.starvationAfter",
		"reports: {lookback: 1000d}":             "reports.lookback",
		"reports: {dayStart: 0, dayEnd: 24}":     "",
		"reports: {weekend: [friday, saturday]}": "",
		"reports: {timeZone: America/New_York} ": "",
	}
	for doc, field := range cases {
		_, err := config.Parse([]byte("dataDir: x\n" + doc))
		ve, ok := broker.AsValidation(err)
		switch {
		case field == "" && err != nil:
			t.Errorf("%s: %v", doc, err)
		case field != "" && (!ok || ve.First().Field != field):
			t.Errorf("%s: got %v, want an error on %s", doc, err, field)
		}
	}
	c, err := config.Parse([]byte("dataDir: x\nreports: {weekend: [friday, saturday], dayStart: 9, dayEnd: 17}"))
	if err != nil {
		t.Fatal(err)
	}
	for at, want := range map[string]string{
		"2026-12-04T10:00:00Z": config.ShiftWeekend, // Friday
		"2026-12-06T10:00:00Z": config.ShiftWeekdayDay,
		"2026-12-06T17:00:00Z": config.ShiftWeekdayNight,
		"2026-12-06T08:59:59Z": config.ShiftWeekdayNight,
	} {
		ts, _ := time.Parse(time.RFC3339, at)
		if got := c.Reports.ShiftOf(ts); got != want {
			t.Errorf("%s: %s, want %s", at, got, want)
		}
	}
	next := c.Reports.NextShiftChange(time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC))
	if !next.Equal(time.Date(2026, 12, 6, 17, 0, 0, 0, time.UTC)) {
		t.Errorf("next change %s", next)
	}
	if !strings.Contains(c.Reports.Location().String(), "UTC") {
		t.Errorf("zone %s", c.Reports.Location())
	}
}
