package aws_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/aws"
	"github.com/spillway-dev/spillway/providers/fakecloud"
	"github.com/spillway-dev/spillway/providers/fakecloud/fakecloudtest"
)

// TestSpotPricesFromHistory: with liveSpotPrices, spot offers carry the
// newest DescribeSpotPriceHistory price of their type and zone (the
// cheapest zone's for an offer without one); a type EC2 has no price for
// keeps its configured spotPrice; on-demand prices are untouched. Each
// offer says where its price comes from.
func TestSpotPricesFromHistory(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	fake := fakecloudtest.NewEC2(t, fakecloud.EC2Options{SpotPrices: []fakecloud.SpotPrice{
		{InstanceType: "p5.48xlarge", Zone: "us-east-1a", Price: "31.000000", At: t0},
		{InstanceType: "p5.48xlarge", Zone: "us-east-1a", Price: "33.500000", At: t0.Add(time.Hour)},
		{InstanceType: "p5.48xlarge", Zone: "us-east-1b", Price: "29.000000", At: t0},
		{InstanceType: "g6.xlarge", Zone: "us-east-1b", Price: "0.420000", At: t0},
		{InstanceType: "g6.xlarge", Zone: "us-east-1c", Price: "0.390000", At: t0},
	}})
	dir := t.TempDir()
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDFAKE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "fake-secret")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	p, err := aws.New(context.Background(), aws.Config{Cluster: "prod", Region: "us-east-1", Endpoint: fake.URL, ImageID: "ami-0gpu",
		LiveSpotPrices: true,
		InstanceTypes: []aws.InstanceType{
			{Name: "p5.48xlarge", GPUModel: "H100", GPUs: 8, Zones: []string{"us-east-1a"}, OnDemandPrice: 98_320_000, SpotPrice: 40_000_000},
			{Name: "g6.xlarge", GPUModel: "L4", GPUs: 1, OnDemandPrice: 805_000, SpotPrice: 300_000},
			{Name: "g5.xlarge", GPUModel: "A10G", GPUs: 1, SpotPrice: 500_000},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]billing.Amount{
		"p5.48xlarge/us-east-1a/spot": 33_500_000, "p5.48xlarge/us-east-1a/od": 98_320_000,
		"g6.xlarge//spot": 390_000, "g6.xlarge//od": 805_000, "g5.xlarge//spot": 500_000,
	}
	offers, err := p.Offers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]billing.Amount{}
	sources := map[string]string{}
	for _, o := range offers {
		m := "od"
		if o.Spot {
			m = "spot"
		}
		got[o.InstanceType+"/"+o.Zone+"/"+m] = o.PricePerHour
		sources[o.InstanceType+"/"+o.Zone+"/"+m] = providers.DescribePriceSource(o)
	}
	if s := sources["p5.48xlarge/us-east-1a/spot"]; s != "spot history at 2026-12-01T11:00:00Z" {
		t.Errorf("p5.48xlarge spot price source %q", s)
	}
	if s := sources["g5.xlarge//spot"]; s != "config" {
		t.Errorf("g5.xlarge spot price source %q, want config (EC2 has no history for it)", s)
	}
	if len(got) != len(want) {
		t.Fatalf("offers %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: price %s, want %s", k, got[k], v)
		}
	}
	if fake.Calls("DescribeSpotPriceHistory") == 0 {
		t.Fatal("no DescribeSpotPriceHistory call")
	}
}
