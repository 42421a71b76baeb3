package server

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
)

// scrape reads /metrics into "name{labels}" → value.
func (h *harness) scrape() map[string]float64 {
	h.t.Helper()
	req, _ := http.NewRequest("GET", h.http.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+tokAdmin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			h.t.Fatalf("metric line %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

// TestDeliveryReportAndMetrics: a preemption and resume, a success, a
// failure, a starving wait and units of output reported from inside a job
// show up alike in the delivery report and in Prometheus, and the cost
// per 1,000 units is the ledger's cost of the job over its units.
func TestDeliveryReportAndMetrics(t *testing.T) {
	h := newHarness(t)
	h.srv.cfg().Reports.StarvationAfter = broker.Duration(time.Minute)
	a := h.agent("n1", 2)
	low := h.submit(tokAlice, `{"resources": {"gpus": 2}, "priority": "low", "preemptible": true, "timeout": "4h",
		"checkpoint": {"signal": "SIGUSR1", "grace": "90s"}, "command": ["train"]}`)
	h.cycle()
	resp := a.sync()
	if len(resp.Start) != 1 || resp.Start[0].Env["SPILLWAY_JOB_TOKEN"] == "" || resp.Start[0].Env["SPILLWAY_SERVER"] != h.srv.cfg().AdvertiseURL {
		t.Fatalf("assignment env: %+v", resp.Start)
	}
	jobToken := resp.Start[0].Env["SPILLWAY_JOB_TOKEN"]
	a.sync()
	h.advance(2*time.Minute, a) // metered while running

	// Units from inside the job, with its job token; a resend with the
	// same id counts once.
	var ans api.UnitsAnswer
	if code := h.do("POST", "/v1/jobs/"+low.ID+"/units", jobToken, `{"units": 3000, "kind": "tokens", "id": "step-1"}`, &ans); code != http.StatusCreated || ans.Total != 3000 {
		t.Fatalf("units: %d %+v", code, ans)
	}
	if code := h.do("POST", "/v1/jobs/"+low.ID+"/units", jobToken, `{"units": 3000, "kind": "tokens", "id": "step-1"}`, &ans); code != http.StatusOK || !ans.Duplicate || ans.Total != 3000 {
		t.Fatalf("resend: %d %+v", code, ans)
	}
	if code := h.do("POST", "/v1/jobs/"+low.ID+"/units", tokAlice, `{"units": 2000, "kind": "tokens"}`, &ans); code != http.StatusCreated || ans.Total != 5000 || ans.By != "alice" {
		t.Fatalf("units by alice: %d %+v", code, ans)
	}
	for _, c := range []struct {
		token, body string
		code        int
	}{
		{jobToken, `{"units": 0, "kind": "tokens"}`, http.StatusBadRequest},
		{jobToken, `{"units": 5, "kind": "Tokens!"}`, http.StatusBadRequest},
		{tokBob, `{"units": 5, "kind": "tokens"}`, http.StatusNotFound},
		{jobTokenPrefix + low.ID + ".forged", `{"units": 5}`, http.StatusUnauthorized},
		{tokMoney, `{"units": 5}`, http.StatusForbidden},
	} {
		if code := h.do("POST", "/v1/jobs/"+low.ID+"/units", c.token, c.body, nil); code != c.code {
			t.Errorf("units %s with %.12s…: %d, want %d", c.body, c.token, code, c.code)
		}
	}

	// Preemption by a high-priority job; the low one checkpoints, waits
	// past the starvation bound, and resumes.
	high := h.submit(tokBob, `{"resources": {"gpus": 2}, "priority": "high", "timeout": "1h", "command": ["serve"]}`)
	h.cycle()
	a.sync()
	h.clock.Step(10 * time.Second)
	a.exit(low.ID, 0, "")
	a.sync()
	h.settle(a)
	h.advance(2*time.Minute, a)
	a.exit(high.ID, 0, "")
	a.sync()
	h.settle(a)
	if j := h.job(low.ID); j.State != broker.StateRunning || j.Attempt != 2 {
		t.Fatalf("low job after resume: %s attempt %d", j.State, j.Attempt)
	}
	h.advance(time.Minute, a)
	a.exit(low.ID, 0, "")
	a.sync()
	bad := h.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "1h", "command": ["oops"]}`)
	h.settle(a)
	a.exit(bad.ID, 1, "")
	a.sync()
	h.advance(2*time.Minute, a) // the meter finishes

	var rep api.DeliveryReport
	q := "/v1/reports/delivery?from=" + t0.Format(time.RFC3339) + "&to=" + t0.Add(time.Hour).Format(time.RFC3339)
	if code := h.do("GET", q, tokAdmin, nil, &rep); code != http.StatusOK {
		t.Fatalf("delivery: %d", code)
	}
	tot := rep.Total
	if tot.Succeeded != 2 || tot.Failed != 1 || tot.Preemptions != 1 || tot.Resumes != 1 || tot.Starved != 1 ||
		tot.Wait.Count != 4 || tot.Completion.Count != 3 || tot.SuccessRate < 0.66 || tot.SuccessRate > 0.67 {
		t.Fatalf("total: %+v", tot)
	}
	rows := map[string]api.DeliveryRow{}
	for _, r := range rep.Rows {
		rows[r.Queue+"/"+r.Priority] = r
	}
	if r := rows["default/low"]; r.Wait.Count != 2 || r.Wait.Max < 120 || r.Preemptions != 1 || r.Resumes != 1 || r.Succeeded != 1 {
		t.Fatalf("low row: %+v", r)
	}
	if len(rep.Units) != 1 {
		t.Fatalf("units: %+v", rep.Units)
	}
	u := rep.Units[0]
	want, err := billing.BuildReport(ctxT(), broker.Ledger{Store: h.store}, billing.ReportQuery{
		Period: billing.Period{From: t0, To: t0.Add(time.Hour)}, GroupBy: []billing.Dimension{billing.DimJob}})
	if err != nil {
		t.Fatal(err)
	}
	var lowCost billing.Amount
	for _, r := range want.Rows {
		if r.Key[0] == low.ID {
			lowCost = r.Cost
		}
	}
	if u.Team != "nlp" || u.Kind != "tokens" || u.Units != 5000 || u.Jobs != 1 || lowCost == 0 || u.Cost != lowCost ||
		u.CostPer1000 != lowCost.MulDiv(1000, 5000) || rep.Currency != "USD" {
		t.Fatalf("unit cost %+v, ledger cost of the job %s", u, lowCost)
	}

	m := h.scrape()
	for series, want := range map[string]float64{
		`spillway_job_preemptions_total{queue="default"}`:                       1,
		`spillway_job_resumes_total{queue="default"}`:                           1,
		`spillway_jobs_completed_total{queue="default",state="succeeded"}`:      2,
		`spillway_jobs_completed_total{queue="default",state="failed"}`:         1,
		`spillway_job_wait_seconds_count{priority="low",queue="default"}`:       2,
		`spillway_job_completion_seconds_count{queue="default",state="failed"}`: 1,
		`spillway_job_units_total{kind="tokens",team="nlp"}`:                    5000,
		`spillway_jobs_starving{queue="default"}`:                               0,
		`spillway_gpu_memory_capacity_bytes{gpu="1",node="n1"}`:                 80 << 30,
	} {
		if m[series] != want {
			t.Errorf("%s = %v, want %v", series, m[series], want)
		}
	}
}

// TestStarvingJobsNow: a job waiting past the bound is listed by the
// report and counted by the gauge.
func TestStarvingJobsNow(t *testing.T) {
	h := newHarness(t)
	h.srv.cfg().Reports.StarvationAfter = broker.Duration(time.Minute)
	a := h.agent("n1", 1)
	h.submit(tokBob, `{"resources": {"gpus": 1}, "timeout": "1h", "command": ["hold"]}`)
	h.settle(a)
	j := h.submit(tokAlice, `{"resources": {"gpus": 1}, "timeout": "1h", "command": ["wait"]}`)
	h.cycle()
	h.clock.Step(2 * time.Minute)
	var rep api.DeliveryReport
	h.do("GET", "/v1/reports/delivery", tokAlice, nil, &rep)
	if len(rep.Starving) != 1 || rep.Starving[0].ID != j.ID || rep.StarvationAfter != "1m" {
		t.Fatalf("starving: %+v", rep)
	}
	m := h.scrape()
	if m[`spillway_jobs_starving{queue="default"}`] != 1 || m[`spillway_queue_oldest_wait_seconds{queue="default"}`] != 120 {
		t.Fatalf("gauges: starving %v oldest %v", m[`spillway_jobs_starving{queue="default"}`], m[`spillway_queue_oldest_wait_seconds{queue="default"}`])
	}
	if n := m[`spillway_pending_jobs{queue="default",reason="resources"}`]; n != 1 {
		t.Fatalf("pending by reason: %v", n)
	}
}

// TestScrapeCountsJobsByQueue: the job gauges, counted in one pass over
// jobs whose states and queues alternate, count each job once, in its
// own state and queue.
func TestScrapeCountsJobsByQueue(t *testing.T) {
	h := newHarness(t)
	a := h.agent("n1", 2)
	submit := func(queues ...string) {
		for _, q := range queues {
			h.submit(tokAlice, `{"queue": "`+q+`", "resources": {"gpus": 1}, "timeout": "1h", "command": ["sleep", "99999"]}`)
		}
		h.settle(a)
	}
	submit("default", "inference") // both run
	submit("default", "inference", "default", "inference")
	m := h.scrape()
	for series, want := range map[string]float64{
		`spillway_jobs{queue="default",state="running"}`:              1,
		`spillway_jobs{queue="inference",state="running"}`:            1,
		`spillway_jobs{queue="default",state="pending"}`:              2,
		`spillway_jobs{queue="inference",state="pending"}`:            2,
		`spillway_pending_jobs{queue="default",reason="resources"}`:   2,
		`spillway_pending_jobs{queue="inference",reason="resources"}`: 2,
		`spillway_jobs_staging{queue="inference"}`:                    0,
		`spillway_jobs_waiting_on_data{queue="default"}`:              0,
		`spillway_queue_oldest_wait_seconds{queue="inference"}`:       0,
	} {
		if got, ok := m[series]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, want)
		}
	}
}
