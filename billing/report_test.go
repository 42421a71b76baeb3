package billing_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/billing/billingtest"
)

// entryB builds ledger entries for report tests.
type entryB struct{ e billing.Entry }

func entry(team string, start time.Time, gpuSeconds int64, rate string) *entryB {
	e := billing.Entry{
		Start: start.UTC(), End: start.UTC().Add(time.Minute), Kind: billing.KindUsage,
		Team: team, Job: "j-" + team, Attempt: 1, User: "ana", Queue: "default",
		Pool:     billing.Pool{Kind: billing.PoolOnPrem, Node: "gpu-a1"},
		GPUModel: "H100", GPUMillis: gpuSeconds * 1000, Rate: usd(rate), Currency: "USD", UtilPermille: 500,
	}
	return &entryB{e}
}

func (b *entryB) Pool(p billing.Pool) *entryB { b.e.Pool = p; return b }
func (b *entryB) Job(j string) *entryB        { b.e.Job = j; return b }
func (b *entryB) Overhead() *entryB {
	b.e.Kind, b.e.Job, b.e.Attempt, b.e.User, b.e.UtilPermille = billing.KindOverhead, "", 0, "", 0
	return b
}
func (b *entryB) Obj() billing.Entry {
	e := b.e
	e.Cost = billing.CostOf(e.Rate, e.GPUMillis)
	e.ID = billing.DeriveID(e.Kind, e.Job, e.Attempt, e.Pool.ResourceID(), e.Start)
	return e
}

func storeWith(t *testing.T, es ...billing.Entry) *billing.MemStore {
	t.Helper()
	s := billing.NewMemStore()
	if _, err := s.Append(t.Context(), es); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestReportGroupsAndFilters(t *testing.T) {
	day1 := time.Date(2026, 11, 3, 12, 0, 0, 0, time.UTC)
	day2 := day1.AddDate(0, 0, 1)
	store := storeWith(t,
		entry("nlp", day1, 3600, "2.10").Obj(),                                       // 1 GPU-hour on-prem
		entry("nlp", day1.Add(time.Minute), 1800, "2.10").Obj(),                      // 0.5 GPU-hour on-prem
		entry("nlp", day2, 7200, "12.29").Pool(burstPool).Obj(),                      // 2 GPU-hours cloud
		entry("vision", day2, 3600, "2.10").Obj(),                                    // another team
		entry("burst-overhead", day2, 900, "12.29").Pool(burstPool).Overhead().Obj(), // idle burst GPUs
	)
	type row struct {
		Key       []string
		GPUHours  string
		Effective string
		Cost      string
	}
	rows := func(r billing.Report) []row {
		var out []row
		for _, x := range r.Rows {
			out = append(out, row{x.Key, x.GPUHours(), x.EffectiveGPUHours(), x.Cost.String()})
		}
		return out
	}
	cases := []struct {
		name string
		q    billing.ReportQuery
		want []row
	}{
		{
			name: "by team and pool for the month",
			q:    billing.ReportQuery{Period: november, GroupBy: []billing.Dimension{billing.DimTeam, billing.DimPool}},
			want: []row{
				{[]string{"burst-overhead", "cloud/aws/us-east-1/p5.48xlarge"}, "0.250", "0.000", "3.0725"},
				{[]string{"nlp", "cloud/aws/us-east-1/p5.48xlarge"}, "2.000", "1.000", "24.58"},
				{[]string{"nlp", "onprem"}, "1.500", "0.750", "3.15"},
				{[]string{"vision", "onprem"}, "1.000", "0.500", "2.10"},
			},
		},
		{
			name: "a user of team nlp sees only nlp, by day",
			q:    billing.ReportQuery{Period: november, Team: "nlp", GroupBy: []billing.Dimension{billing.DimDay}},
			want: []row{
				{[]string{"2026-11-03"}, "1.500", "0.750", "3.15"},
				{[]string{"2026-11-04"}, "2.000", "1.000", "24.58"},
			},
		},
		{
			name: "days cut in the report's time zone",
			q: billing.ReportQuery{Period: november, Team: "nlp", GroupBy: []billing.Dimension{billing.DimDay},
				Location: time.FixedZone("UTC+12", 12*3600)},
			want: []row{
				{[]string{"2026-11-04"}, "1.500", "0.750", "3.15"},
				{[]string{"2026-11-05"}, "2.000", "1.000", "24.58"},
			},
		},
		{
			name: "by kind and pool kind",
			q:    billing.ReportQuery{Period: november, GroupBy: []billing.Dimension{billing.DimKind, billing.DimPoolKind}},
			want: []row{
				{[]string{"overhead", "cloud"}, "0.250", "0.000", "3.0725"},
				{[]string{"usage", "cloud"}, "2.000", "1.000", "24.58"},
				{[]string{"usage", "onprem"}, "2.500", "1.250", "5.25"},
			},
		},
		{
			name: "no grouping gives one total row",
			q:    billing.ReportQuery{Period: billing.Period{From: day2, To: day2.Add(time.Hour)}},
			want: []row{{[]string{}, "3.250", "1.500", "29.7525"}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep, err := billing.BuildReport(t.Context(), store, c.q)
			if err != nil {
				t.Fatal(err)
			}
			if diff := gocmp.Diff(c.want, rows(rep)); diff != "" {
				t.Errorf("rows (-want +got):\n%s", diff)
			}
			var sum billing.Totals
			for _, r := range rep.Rows {
				sum.Entries += r.Entries
				sum.GPUMillis += r.GPUMillis
				sum.EffectiveGPUMillis += r.EffectiveGPUMillis
				sum.MeasuredGPUMillis += r.MeasuredGPUMillis
				sum.Cost += r.Cost
			}
			if sum != rep.Total {
				t.Errorf("rows sum to %+v, total says %+v", sum, rep.Total)
			}
		})
	}
}

func TestReportJSONKeepsIntegersAndShowsHours(t *testing.T) {
	store := storeWith(t, entry("nlp", november.From, 5400, "2.10").Obj())
	rep, err := billing.BuildReport(t.Context(), store, billing.ReportQuery{Period: november, GroupBy: []billing.Dimension{billing.DimTeam}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(rep.Rows[0])
	if err != nil {
		t.Fatal(err)
	}
	want := `{"key":["nlp"],"entries":1,"gpuMillis":5400000,"effectiveGPUMillis":2700000,"measuredGPUMillis":5400000,"cost":"3.15","gpuHours":"1.500","effectiveGPUHours":"0.750"}`
	if string(b) != want {
		t.Errorf("row JSON:\n got %s\nwant %s", b, want)
	}
}

func TestReportRefusesMixedCurrencies(t *testing.T) {
	eur := entry("vision", november.From.Add(time.Hour), 60, "1.00").Obj()
	eur.Currency = "EUR"
	store := storeWith(t, entry("nlp", november.From, 60, "1.00").Obj(), eur)
	if _, err := billing.BuildReport(t.Context(), store, billing.ReportQuery{Period: november}); !errors.Is(err, billing.ErrMixedCurrency) {
		t.Fatalf("err = %v, want ErrMixedCurrency", err)
	}
}

func TestParseDimensions(t *testing.T) {
	got, err := billing.ParseDimensions("team, pool,GPU-MODEL,month")
	if err != nil {
		t.Fatal(err)
	}
	if diff := gocmp.Diff([]billing.Dimension{billing.DimTeam, billing.DimPool, billing.DimGPUModel, billing.DimMonth}, got); diff != "" {
		t.Error(diff)
	}
	for _, bad := range []string{"team,colour", "team,team"} {
		if _, err := billing.ParseDimensions(bad); !errors.Is(err, billing.ErrBadQuery) {
			t.Errorf("ParseDimensions(%q) err = %v, want ErrBadQuery", bad, err)
		}
	}
}

func TestBurstSpendSumsCloudAndLeaseInTheBudgetMonth(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skipf("no tz database: %v", err) // Go ships one; only a stripped build lacks it
	}
	// November in Berlin runs from 2026-10-31T23:00Z to 2026-11-30T23:00Z.
	lease := billing.Pool{Kind: billing.PoolLease, Provider: "lambda", InstanceType: "8xH100", InstanceID: "lease-9"}
	store := storeWith(t,
		entry("nlp", time.Date(2026, 10, 31, 22, 59, 0, 0, time.UTC), 3600, "12.29").Pool(burstPool).Obj(),    // October in Berlin
		entry("nlp", time.Date(2026, 10, 31, 23, 0, 0, 0, time.UTC), 3600, "12.29").Pool(burstPool).Obj(),     // November
		entry("nlp", time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC), 1800, "4.00").Pool(lease).Obj(),           // November, leased
		entry("nlp", time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC), 3600, "2.10").Obj(),                       // on-prem: not burst
		entry("vision", time.Date(2026, 11, 30, 22, 59, 0, 0, time.UTC), 3600, "12.29").Pool(burstPool).Obj(), // November
		entry("vision", time.Date(2026, 11, 30, 23, 0, 0, 0, time.UTC), 3600, "12.29").Pool(burstPool).Obj(),  // December
		entry("burst-overhead", time.Date(2026, 11, 2, 0, 0, 0, 0, time.UTC), 900, "12.29").Pool(burstPool).Overhead().Obj(),
	)
	sp, err := billing.BurstSpend(t.Context(), store, time.Date(2026, 11, 20, 0, 0, 0, 0, berlin), berlin)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"nlp": "14.29", "vision": "12.29", "burst-overhead": "3.0725"}
	got := map[string]string{}
	for team, a := range sp.ByTeam {
		got[team] = a.String()
	}
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Errorf("spend by team (-want +got):\n%s", diff)
	}
	if sp.Total != usd("29.6525") || sp.Team("nlp") != usd("14.29") || sp.Team("nobody") != 0 {
		t.Errorf("total %s, nlp %s", sp.Total, sp.Team("nlp"))
	}
}

func TestLedgerTotalsMatchReportOverRandomLedger(t *testing.T) {
	store := billing.NewMemStore()
	in := billingtest.Entries(9, 2000, november, "USD")
	if _, err := store.Append(t.Context(), in); err != nil {
		t.Fatal(err)
	}
	var want billing.Totals
	for _, e := range in {
		if e.Team == "nlp" {
			want.Add(e)
		}
	}
	got, err := billing.LedgerTotals(t.Context(), store, november, "nlp")
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("LedgerTotals = %+v, summed by hand %+v", got, want)
	}
}
