package billing

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestAmountParseAndPrint(t *testing.T) {
	cases := []struct {
		in    string
		micro Amount
		str   string
		cents string
	}{
		{"98.32", 98_320_000, "98.32", "98.32"},
		{"5000", 5_000_000_000, "5000.00", "5000.00"},
		{"0.000125", 125, "0.000125", "0.00"},
		{"-1.005", -1_005_000, "-1.005", "-1.01"},
		{"2.675", 2_675_000, "2.675", "2.68"},
	}
	for _, c := range cases {
		got, err := ParseAmount(c.in)
		if err != nil {
			t.Fatalf("ParseAmount(%q): %v", c.in, err)
		}
		if got != c.micro {
			t.Errorf("ParseAmount(%q) = %d, want %d", c.in, got, c.micro)
		}
		if got.String() != c.str {
			t.Errorf("%q.String() = %q, want %q", c.in, got.String(), c.str)
		}
		if got.Cents() != c.cents {
			t.Errorf("%q.Cents() = %q, want %q", c.in, got.Cents(), c.cents)
		}
	}
	for _, bad := range []string{"", "abc", "1e3", "1.0000001", "1/2", "99999999999999999999"} {
		if _, err := ParseAmount(bad); err == nil {
			t.Errorf("ParseAmount(%q) accepted", bad)
		}
	}
}

func TestAmountMulDiv(t *testing.T) {
	// 98.32 USD/h for one instance of 8 GPUs, 60 s of one GPU:
	// 98.32/8/3600*60 = 0.204833.. → 204833 micros
	perGPUHour := Amount(98_320_000).MulDiv(1, 8)
	if perGPUHour != 12_290_000 {
		t.Fatalf("per GPU hour = %d", perGPUHour)
	}
	got := perGPUHour.MulDiv(60_000, 3_600_000)
	if got != 204_833 {
		t.Fatalf("cost = %d, want 204833", got)
	}
	if Amount(-3).MulDiv(1, 2) != -2 || Amount(3).MulDiv(1, 2) != 2 {
		t.Fatal("half away from zero")
	}
}

func TestAmountStringRoundTrips(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10_000 {
		a := Amount(rng.Int64() >> rng.IntN(63))
		if rng.IntN(2) == 0 {
			a = -a
		}
		got, err := ParseAmount(a.String())
		if err != nil || got != a {
			t.Fatalf("ParseAmount(%q) = %d, %v; want %d", a.String(), got, err, a)
		}
	}
	if s := Amount(math.MinInt64).String(); s != "-9223372036854.775808" {
		t.Errorf("MinInt64 prints %q", s)
	}
}

// The fast path of ParseAmount must agree with big.Rat, value and error,
// on every form: what String prints, and edge cases either side of its
// limits (digits, decimals, signs, stray characters).
func TestParseAmountFastPathAgreesWithRat(t *testing.T) {
	inputs := []string{"0", "-0", "0.0", "00012.50", "1.", ".5", "-.5", "+1", "-", "--1", "1..2", "1.2.3",
		"999999999999", "999999999999.999999", "-999999999999.999999", "9999999999999", "9223372036854.775807",
		"1.1234567", "1.123456", "12a", "a12", "1 2", "1,5", "0x10", "1_000", "١٢"}
	r := rand.New(rand.NewPCG(19, 19))
	for range 2000 {
		a := Amount(r.Int64N(2_000_000_000_000_000) - 1_000_000_000_000_000)
		inputs = append(inputs, a.String(), a.Cents())
	}
	for _, in := range inputs {
		want, wantErr := parseRatAmount(in)
		got, err := ParseAmount(in)
		if got != want || (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
			t.Errorf("ParseAmount(%q) = %d, %v; big.Rat gives %d, %v", in, got, err, want, wantErr)
		}
	}
}
