package sim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Two waves of 12 one-hour jobs beyond the 8 owned GPUs, at 0 and at
// 3h. The 4-GPU offer costs 2 USD per GPU-hour as the 1-GPU one does;
// the price series makes it cheaper for the first wave and dearer for the
// second, so the first wave bursts on big machines and the second on
// small ones.
func TestPriceSeriesChangesTheOffer(t *testing.T) {
	var rows []string
	for _, at := range []string{"0", "10800"} {
		for i := 0; i < 20; i++ {
			rows = append(rows, at+",3600,1,a,medium,default")
		}
	}
	tr := csvTrace(t, rows...)
	c := cluster(t, testCluster)
	file := filepath.Join(t.TempDir(), "prices.csv")
	series := "# big drops at the start, then rises past the small one\n" + PricesHeader + "\n" +
		"2026-03-01T00:00:00Z,cloud,big,4\n" +
		"2026-03-01T02:00:00Z,cloud,big,40\n"
	if err := os.WriteFile(file, []byte(series), 0o600); err != nil {
		t.Fatal(err)
	}
	prices, err := LoadPrices(file, c)
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, tr, c, "burst-any-pending", Options{Seed: 1, RecordMachines: true, Prices: prices})
	t0 := tr.Jobs[0].Submit
	var first, second []string
	for _, m := range r.MachineRecords {
		if m.LaunchedAt == nil {
			continue
		}
		if m.LaunchedAt.Sub(t0).Hours() < 2 {
			first = append(first, m.Offer.InstanceType+"@"+m.Offer.PricePerHour.String())
		} else {
			second = append(second, m.Offer.InstanceType+"@"+m.Offer.PricePerHour.String())
		}
	}
	if len(first) == 0 || len(second) == 0 {
		t.Fatalf("machines in the first wave %v, in the second %v", first, second)
	}
	for _, m := range first {
		if m != "big@4.00" {
			t.Errorf("first wave: %v, want big machines at 4.00 an hour", first)
			break
		}
	}
	for _, m := range second {
		if m != "small@2.00" {
			t.Errorf("second wave: %v, want small machines at 2.00 an hour", second)
			break
		}
	}
	// JSON lines read the same.
	jl, err := ReadPrices(strings.NewReader(`{"time": "2026-03-01T00:00:00Z", "provider": "cloud", "instanceType": "big", "price": "4"}` + "\n" +
		`{"time": "2026-03-01T02:00:00Z", "provider": "cloud", "instanceType": "big", "price": 40}` + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	if mustJSON(t, run(t, tr, c, "burst-any-pending", Options{Seed: 1, RecordMachines: true, Prices: jl})) != mustJSON(t, r) {
		t.Error("the same series in JSON lines gave another result")
	}
}

func TestPricesErrorsNameLineAndField(t *testing.T) {
	c := cluster(t, strings.Replace(testCluster, "offers:\n", "offers:\n  - {provider: cloud, region: r1, instanceType: big, gpuModel: V100, gpus: 4, spot: true, pricePerHour: \"3\"}\n", 1))
	for _, tc := range []struct{ in, want string }{
		{"time,provider,price\n", "line 1: header: no instanceType column"},
		{PricesHeader + "\n2026-03-01,cloud,small,1\n", "line 2: time: "},
		{PricesHeader + "\n\n2026-03-01T00:00:00Z,cloud,small,cheap\n", "line 3: price: "},
		{PricesHeader + "\n2026-03-01T00:00:00Z,cloud,small,-1\n", "line 2: price: must not be negative"},
		{PricesHeader + "\n2026-03-01T00:00:00Z,,small,1\n", "line 2: provider: is required"},
		{PricesHeader + "\n2026-03-01T00:00:00Z,cloud,small\n", "line 2: 3 fields"},
		{PricesHeader + ",market\n2026-03-01T00:00:00Z,cloud,small,1,reserved\n", "line 2: market: must be spot or on-demand"},
		{PricesHeader + "\n2026-03-01T00:00:00Z,cloud,tiny,1\n", "line 2: instanceType: no spot or on-demand offer of cloud tiny"},
		{PricesHeader + "\n2026-03-01T00:00:00Z,cloud,big,1\n", "line 2: market: cloud big is offered 2 ways"},
		{PricesHeader + ",market\n2026-03-01T00:00:00Z,cloud,small,1,spot\n", "line 2: instanceType: no spot offer of cloud small"},
		{`{"time": "2026-03-01T00:00:00Z", "provider": "cloud", "instanceType": "small"}` + "\n", "line 1: price: is required"},
		{`{"time": "2026-03-01T00:00:00Z", "provider": "cloud", "instanceType": "small", "price": "1", "zone": "a"}` + "\n", "line 1: not a JSON object"},
		{"# nothing\n", "no price rows"},
	} {
		ps, err := ReadPrices(strings.NewReader(tc.in))
		if err == nil {
			err = CheckPrices(ps, c.Offers)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.in, err, tc.want)
		}
	}
	// With the market named, the spot offer of a type offered both ways.
	ps, err := ReadPrices(strings.NewReader(PricesHeader + ",market\n2026-03-01T00:00:00Z,cloud,big,1,spot\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckPrices(ps, c.Offers); err != nil {
		t.Fatal(err)
	}
}
