package billing_test

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/billing/billingtest"
)

var november = billing.MonthOf(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC), time.UTC)

// parsed is an export read back: its header and rows as column → value,
// with nil for null.
type parsed struct {
	header []string
	rows   []map[string]*string
}

func parseExport(t *testing.T, f billing.Format, b []byte) parsed {
	t.Helper()
	var p parsed
	switch f {
	case billing.FormatCSV:
		recs, err := csv.NewReader(bytes.NewReader(b)).ReadAll()
		if err != nil {
			t.Fatalf("read CSV: %v", err)
		}
		p.header = recs[0]
		for _, r := range recs[1:] {
			row := map[string]*string{}
			for i, v := range r {
				if v != "" {
					row[p.header[i]] = &v
				} else {
					row[p.header[i]] = nil
				}
			}
			p.rows = append(p.rows, row)
		}
	case billing.FormatJSON:
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		var objs []map[string]any
		if err := dec.Decode(&objs); err != nil {
			t.Fatalf("read JSON: %v", err)
		}
		for _, o := range objs {
			row := map[string]*string{}
			for k, v := range o {
				var s string
				switch v := v.(type) {
				case nil:
					row[k] = nil
					continue
				case json.Number:
					s = v.String()
				case string:
					s = v
				default:
					enc, _ := json.Marshal(v)
					s = string(enc)
				}
				row[k] = &s
			}
			p.rows = append(p.rows, row)
		}
	}
	return p
}

func (p parsed) sumAmount(t *testing.T, col string) billing.Amount {
	t.Helper()
	var sum billing.Amount
	for i, r := range p.rows {
		if r[col] == nil {
			t.Fatalf("row %d: %s is null", i, col)
		}
		a, err := billing.ParseAmount(*r[col])
		if err != nil {
			t.Fatalf("row %d: %s: %v", i, col, err)
		}
		sum += a
	}
	return sum
}

// sumMillis adds a column of seconds with three decimals, exactly, as
// milliseconds.
func (p parsed) sumMillis(t *testing.T, col string) int64 {
	t.Helper()
	var sum int64
	for i, r := range p.rows {
		a, err := billing.ParseAmount(*r[col]) // micros of a second
		if err != nil || a%1000 != 0 {
			t.Fatalf("row %d: %s = %q is not seconds with at most 3 decimals", i, col, *r[col])
		}
		sum += int64(a / 1000)
	}
	return sum
}

func TestExportSumsEqualTheLedgerForAnyPeriod(t *testing.T) {
	ctx := t.Context()
	for seed := range uint64(5) {
		store := billing.NewMemStore()
		if _, err := store.Append(ctx, billingtest.Entries(seed, 1500, november, "USD")); err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(seed, 3))
		for trial := range 5 {
			// a random period, from whole months down to odd millisecond cuts
			p := november
			if trial > 0 {
				a := november.From.Add(time.Duration(rng.Int64N(int64(30 * 24 * time.Hour)))).Truncate(time.Millisecond)
				b := a.Add(time.Duration(1 + rng.Int64N(int64(10*24*time.Hour)))).Truncate(time.Millisecond)
				p = billing.Period{From: a, To: b.Add(time.Millisecond)}
			}
			team := []string{"", "nlp", "burst-overhead"}[rng.IntN(3)]
			want, err := billing.LedgerTotals(ctx, store, p, team)
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range []billing.Granularity{billing.GranularityEntry, billing.GranularityHour, billing.GranularityDay} {
				for _, f := range []billing.Format{billing.FormatCSV, billing.FormatJSON} {
					name := fmt.Sprintf("seed %d trial %d %s %s team=%q", seed, trial, g, f, team)
					var buf bytes.Buffer
					sum, err := billing.Export(ctx, store, &buf, billing.ExportOptions{Format: f, Granularity: g, Period: p, Team: team, BillingAccountID: "acme"})
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					got := parseExport(t, f, buf.Bytes())
					if len(got.rows) != sum.Rows {
						t.Errorf("%s: %d rows read back, summary says %d", name, len(got.rows), sum.Rows)
					}
					if sum.Totals != want {
						t.Errorf("%s: summary totals %+v, ledger %+v", name, sum.Totals, want)
					}
					for _, col := range []string{"BilledCost", "EffectiveCost", "ListCost", "ContractedCost"} {
						if c := got.sumAmount(t, col); c != want.Cost {
							t.Errorf("%s: sum of %s = %s, ledger total %s", name, col, c, want.Cost)
						}
					}
					if ms := got.sumMillis(t, "ConsumedQuantity"); ms != want.GPUMillis {
						t.Errorf("%s: sum of ConsumedQuantity = %d ms, ledger %d", name, ms, want.GPUMillis)
					}
					if ms := got.sumMillis(t, "x_EffectiveGPUSeconds"); ms != want.EffectiveGPUMillis {
						t.Errorf("%s: sum of x_EffectiveGPUSeconds = %d ms, ledger %d", name, ms, want.EffectiveGPUMillis)
					}
					var entries int
					for _, r := range got.rows {
						var n int
						fmt.Sscan(*r["x_Entries"], &n)
						entries += n
						if team != "" && *r["x_Team"] != team {
							t.Fatalf("%s: row of team %s in an export for %s", name, *r["x_Team"], team)
						}
						start, _ := time.Parse(time.RFC3339Nano, *r["ChargePeriodStart"])
						if g == billing.GranularityEntry && !p.Contains(start) {
							t.Fatalf("%s: row starting %s outside the period", name, start)
						}
					}
					if entries != want.Entries {
						t.Errorf("%s: rows sum %d entries, ledger has %d", name, entries, want.Entries)
					}
				}
			}
		}
	}
}

func TestExportIsByteIdenticalWhateverTheWriteOrder(t *testing.T) {
	ctx := t.Context()
	in := billingtest.Entries(42, 3000, november, "USD")
	a, b := billing.NewMemStore(), billing.NewMemStore()
	if _, err := a.Append(ctx, in); err != nil {
		t.Fatal(err)
	}
	rev := slices.Clone(in)
	slices.Reverse(rev)
	for chunk := range slices.Chunk(rev, 7) {
		if _, err := b.Append(ctx, chunk); err != nil {
			t.Fatal(err)
		}
	}
	for _, g := range []billing.Granularity{billing.GranularityEntry, billing.GranularityHour, billing.GranularityDay} {
		for _, f := range []billing.Format{billing.FormatCSV, billing.FormatJSON} {
			opt := billing.ExportOptions{Format: f, Granularity: g, Period: november}
			var first []byte
			for i, s := range []billing.Store{a, a, b} {
				var buf bytes.Buffer
				if _, err := billing.Export(ctx, s, &buf, opt); err != nil {
					t.Fatal(err)
				}
				if i == 0 {
					first = buf.Bytes()
					continue
				}
				if !bytes.Equal(first, buf.Bytes()) {
					t.Fatalf("%s %s: export %d differs from the first", g, f, i)
				}
			}
		}
	}
}

// focus1x lists the FOCUS 1.0–1.2 column ids we may use.
var focus1x = []string{
	"AvailabilityZone", "BilledCost", "BillingAccountId", "BillingAccountName", "BillingAccountType", "BillingCurrency",
	"BillingPeriodEnd", "BillingPeriodStart", "CapacityReservationId", "CapacityReservationStatus", "ChargeCategory",
	"ChargeClass", "ChargeDescription", "ChargeFrequency", "ChargePeriodEnd", "ChargePeriodStart",
	"CommitmentDiscountCategory", "CommitmentDiscountId", "CommitmentDiscountName", "CommitmentDiscountQuantity",
	"CommitmentDiscountStatus", "CommitmentDiscountType", "CommitmentDiscountUnit", "ConsumedQuantity", "ConsumedUnit",
	"ContractedCost", "ContractedUnitPrice", "EffectiveCost", "InvoiceId", "InvoiceIssuerName", "ListCost", "ListUnitPrice",
	"PricingCategory", "PricingCurrency", "PricingQuantity", "PricingUnit", "ProviderName", "PublisherName", "RegionId",
	"RegionName", "ResourceId", "ResourceName", "ResourceType", "ServiceCategory", "ServiceName", "ServiceSubcategory",
	"SkuId", "SkuMeter", "SkuPriceDetails", "SkuPriceId", "SubAccountId", "SubAccountName", "SubAccountType", "Tags",
}

func TestExportColumnsAreFOCUSOrPrefixed(t *testing.T) {
	seenOurs := false
	for _, c := range billing.Columns {
		switch {
		case c.FOCUS && !slices.Contains(focus1x, c.Name):
			t.Errorf("column %s is marked FOCUS but is not a FOCUS 1.x column", c.Name)
		case c.FOCUS && seenOurs:
			t.Errorf("FOCUS column %s comes after a custom column", c.Name)
		case !c.FOCUS && !strings.HasPrefix(c.Name, "x_"):
			t.Errorf("custom column %s lacks the x_ prefix", c.Name)
		case !c.FOCUS:
			seenOurs = true
		}
		if c.Doc == "" {
			t.Errorf("column %s has no doc", c.Name)
		}
	}
}

func TestExportRowOfOneEntry(t *testing.T) {
	ctx := t.Context()
	store := billing.NewMemStore()
	start := time.Date(2026, 11, 30, 23, 59, 0, 0, time.UTC)
	e := billing.Entry{
		Start: start, End: start.Add(45500 * time.Millisecond), Kind: billing.KindUsage,
		Team: "nlp", Project: "chat-v2", User: "ana", Job: "j-7", Attempt: 2, Queue: "default",
		Pool: burstPool, GPUModel: "H100", Spot: true, GPUMillis: 4 * 45500, Rate: usd("12.29"),
		Currency: "USD", UtilPermille: 873,
	}
	e.Cost = billing.CostOf(e.Rate, e.GPUMillis)
	e.ID = billing.DeriveID(e.Kind, e.Job, e.Attempt, e.Pool.ResourceID(), e.Start)
	if _, err := store.Append(ctx, []billing.Entry{e}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := billing.Export(ctx, store, &buf, billing.ExportOptions{Format: billing.FormatJSON, Granularity: billing.GranularityEntry, Period: november, BillingAccountID: "acme", BillingAccountName: "ACME"}); err != nil {
		t.Fatal(err)
	}
	row := parseExport(t, billing.FormatJSON, buf.Bytes()).rows[0]
	got := map[string]string{}
	for k, v := range row {
		if v == nil {
			got[k] = "<null>"
		} else {
			got[k] = *v
		}
	}
	want := map[string]string{
		"BilledCost": "0.621328", "BillingAccountId": "acme", "BillingAccountName": "ACME", "BillingCurrency": "USD",
		"BillingPeriodStart": "2026-11-01T00:00:00Z", "BillingPeriodEnd": "2026-12-01T00:00:00Z",
		"ChargeCategory": "Usage", "ChargeClass": "<null>", "ChargeFrequency": "Usage-Based",
		"ChargeDescription": "H100 GPU time of job j-7 attempt 2 on cloud/aws/us-east-1/p5.48xlarge i-0abc",
		"ChargePeriodStart": "2026-11-30T23:59:00Z", "ChargePeriodEnd": "2026-11-30T23:59:45.500Z",
		"ConsumedQuantity": "182.000", "ConsumedUnit": "GPU-Seconds",
		"ContractedCost": "0.621328", "ContractedUnitPrice": "12.29", "EffectiveCost": "0.621328",
		"InvoiceIssuerName": "aws", "ListCost": "0.621328", "ListUnitPrice": "12.29",
		"PricingCategory": "Dynamic", "PricingQuantity": "0.050555556", "PricingUnit": "GPU-Hours",
		"ProviderName": "aws", "PublisherName": "aws", "RegionId": "us-east-1", "RegionName": "us-east-1",
		"ResourceId": "i-0abc", "ResourceName": "burst-1", "ResourceType": "GPU Instance",
		"ServiceCategory": "Compute", "ServiceName": "Spillway GPU", "SkuId": "cloud/aws/p5.48xlarge/spot",
		"SubAccountId": "nlp", "SubAccountName": "nlp",
		"Tags":      `{"spillway/job":"j-7","spillway/project":"chat-v2","spillway/queue":"default","spillway/team":"nlp","spillway/user":"ana"}`,
		"x_EntryId": e.ID, "x_Entries": "1", "x_Kind": "usage", "x_Team": "nlp", "x_Project": "chat-v2", "x_User": "ana",
		"x_Job": "j-7", "x_Attempt": "2", "x_Queue": "default", "x_PoolKind": "cloud", "x_Pool": "cloud/aws/us-east-1/p5.48xlarge",
		"x_Node": "burst-1", "x_InstanceType": "p5.48xlarge", "x_InstanceId": "i-0abc", "x_GPUModel": "H100", "x_Spot": "true",
		"x_EffectiveGPUSeconds": "158.886", "x_MeasuredGPUSeconds": "182.000", "x_GPUUtilization": "0.873",
	}
	if diff := gocmp.Diff(want, got); diff != "" {
		t.Errorf("row (-want +got):\n%s", diff)
	}
}

func TestExportRefusesBadOptions(t *testing.T) {
	store := billing.NewMemStore()
	for name, o := range map[string]billing.ExportOptions{
		"empty period": {Format: billing.FormatCSV, Period: billing.Period{From: november.To, To: november.From}},
		"format":       {Format: "xlsx", Period: november},
		"granularity":  {Format: billing.FormatCSV, Granularity: "week", Period: november},
	} {
		if _, err := billing.Export(t.Context(), store, io.Discard, o); !errors.Is(err, billing.ErrBadQuery) {
			t.Errorf("%s: err = %v, want ErrBadQuery", name, err)
		}
	}
}
