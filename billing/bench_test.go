package billing_test

import (
	"io"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/billing/billingtest"
)

func benchStore(b *testing.B, n int) *billing.MemStore {
	b.Helper()
	s := billing.NewMemStore()
	if _, err := s.Append(b.Context(), billingtest.Entries(1, n, november, "USD")); err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkExport measures export throughput; entries/s is the figure.
func BenchmarkExport(b *testing.B) {
	s := benchStore(b, 20_000)
	for _, f := range []billing.Format{billing.FormatCSV, billing.FormatJSON} {
		for _, g := range []billing.Granularity{billing.GranularityEntry, billing.GranularityDay} {
			b.Run(string(f)+"/"+string(g), func(b *testing.B) {
				for b.Loop() {
					if _, err := billing.Export(b.Context(), s, io.Discard, billing.ExportOptions{Format: f, Granularity: g, Period: november}); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(20_000*b.N)/b.Elapsed().Seconds(), "entries/s")
			})
		}
	}
}

// BenchmarkReport measures a grouped report over a scan.
func BenchmarkReport(b *testing.B) {
	s := benchStore(b, 20_000)
	q := billing.ReportQuery{Period: november, GroupBy: []billing.Dimension{billing.DimTeam, billing.DimPool, billing.DimDay}}
	for b.Loop() {
		if _, err := billing.BuildReport(b.Context(), s, q); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(20_000*b.N)/b.Elapsed().Seconds(), "entries/s")
}

// BenchmarkMeter meters 1,000 one-GPU allocations for one hour of 60 s
// slices (60,000 entries) per iteration.
func BenchmarkMeter(b *testing.B) {
	t0 := time.Date(2026, 11, 5, 10, 0, 0, 0, time.UTC)
	allocs := make([]billing.Allocation, 1000)
	for i := range allocs {
		allocs[i] = billing.Allocation{
			Job: "job", Attempt: i, Team: "nlp", Pool: billing.Pool{Kind: billing.PoolOnPrem, Node: "n"},
			GPUModel: "H100", GPUMilli: 1000, Start: t0,
			Util: []billing.UtilSample{{At: t0, Permille: 500}},
		}
	}
	cfg := billing.MeterConfig{Currency: "USD", OnPrem: billing.RateTable{Default: billing.FlatPrice(2_100_000)}}
	for b.Loop() {
		res := billing.Meter(cfg, billing.MeterInput{From: t0, Now: t0.Add(time.Hour), Allocations: allocs})
		if len(res.Entries) != 60_000 {
			b.Fatalf("%d entries", len(res.Entries))
		}
	}
	b.ReportMetric(float64(60_000*b.N)/b.Elapsed().Seconds(), "entries/s")
}

// BenchmarkExportMeteredDay exports one day of a metered fleet (100 GPUs,
// 60 s slices: 144,000 entries) at day granularity, the shape of a real
// scheduled export: many entries, few rows.
func BenchmarkExportMeteredDay(b *testing.B) {
	day := time.Date(2026, 11, 5, 0, 0, 0, 0, time.UTC)
	allocs := make([]billing.Allocation, 100)
	for i := range allocs {
		allocs[i] = billing.Allocation{
			Job: "job", Attempt: i, Team: "nlp", Pool: billing.Pool{Kind: billing.PoolOnPrem, Node: "n"},
			GPUModel: "H100", GPUMilli: 1000, Start: day,
			Util: []billing.UtilSample{{At: day, Permille: 500}},
		}
	}
	cfg := billing.MeterConfig{Currency: "USD", OnPrem: billing.RateTable{Default: billing.FlatPrice(2_100_000)}}
	res := billing.Meter(cfg, billing.MeterInput{Now: day.Add(24 * time.Hour), Allocations: allocs})
	s := billing.NewMemStore()
	if _, err := s.Append(b.Context(), res.Entries); err != nil {
		b.Fatal(err)
	}
	p := billing.Period{From: day, To: day.Add(24 * time.Hour)}
	for b.Loop() {
		sum, err := billing.Export(b.Context(), s, io.Discard, billing.ExportOptions{Format: billing.FormatCSV, Granularity: billing.GranularityDay, Period: p})
		if err != nil || sum.Rows != 100 {
			b.Fatalf("%d rows, %v", sum.Rows, err)
		}
	}
	b.ReportMetric(float64(len(res.Entries)*b.N)/b.Elapsed().Seconds(), "entries/s")
}
