package aws_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/aws"
	"github.com/spillway-dev/spillway/providers/fakecloud"
	"github.com/spillway-dev/spillway/providers/fakecloud/fakecloudtest"
)

// pricedProvider builds a provider whose EC2 and Price List Query API
// endpoints are the fake, through the SDK's default credential chain.
func pricedProvider(t *testing.T, fake *fakecloud.EC2, cfg aws.Config) *aws.Provider {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDFAKE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "fake-secret")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	cfg.Cluster, cfg.Region, cfg.ImageID = "prod", "us-east-1", "ami-0gpu"
	cfg.Endpoint, cfg.PricingEndpoint = fake.URL, fake.URL
	p, err := aws.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestOnDemandPricesFromPriceList: FetchPrices asks the Price List Query
// API (the real SDK client against the fake's GetProducts, which also
// holds the Windows, RHEL, SQL, dedicated and reserved-capacity siblings
// of every type) and reads the plain Linux on-demand price of each
// configured type; a type the list lacks is Missing. Once UsePrices has
// the table, on-demand offers carry its price and say so, the type
// without one keeps its configured price, and spot offers are untouched.
func TestOnDemandPricesFromPriceList(t *testing.T) {
	fake := fakecloudtest.NewEC2(t, fakecloud.EC2Options{Prices: []fakecloud.OnDemandPrice{
		{InstanceType: "p5.48xlarge", Price: "55.0400000000"},
		{InstanceType: "g6.xlarge", Price: "0.8048000000"},
		{InstanceType: "g6.xlarge", Region: "us-west-2", Price: "0.9100000000"},
		{InstanceType: "g5.xlarge", Region: "eu-central-1", Price: "1.2590000000"},
	}})
	p := pricedProvider(t, fake, aws.Config{InstanceTypes: []aws.InstanceType{
		{Name: "p5.48xlarge", GPUModel: "H100", GPUs: 8, Zones: []string{"us-east-1a"}, OnDemandPrice: 98_320_000, SpotPrice: 40_000_000},
		{Name: "g6.xlarge", GPUModel: "L4", GPUs: 1, OnDemandPrice: 805_000},
		{Name: "g5.xlarge", GPUModel: "A10G", GPUs: 1, OnDemandPrice: 1_006_000},
	}})
	table, err := p.FetchPrices(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := providers.PriceTable{Provider: "aws-us-east-1", Region: "us-east-1", Currency: "USD",
		OnDemand: map[string]billing.Amount{"p5.48xlarge": 55_040_000, "g6.xlarge": 804_800}, Missing: []string{"g5.xlarge"}}
	if diff := cmp.Diff(want, table); diff != "" {
		t.Fatalf("price table (-want +got):\n%s", diff)
	}
	if n := fake.Calls("GetProducts"); n != 3 {
		t.Fatalf("%d GetProducts calls, want one per type", n)
	}

	// Before UsePrices, the configured prices.
	got := offerPrices(t, p)
	if got["g6.xlarge//od"] != "0.805 config" {
		t.Fatalf("before UsePrices: %v", got)
	}
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	table.FetchedAt = at
	p.UsePrices(table)
	p.UsePrices(providers.PriceTable{Provider: "aws-other", OnDemand: map[string]billing.Amount{"g5.xlarge": 1}})
	want2 := map[string]string{
		"p5.48xlarge/us-east-1a/od":   "55.04 price list at 2026-12-01T10:00:00Z",
		"p5.48xlarge/us-east-1a/spot": "40.00 config",
		"g6.xlarge//od":               "0.8048 price list at 2026-12-01T10:00:00Z",
		"g5.xlarge//od":               "1.006 config",
	}
	if diff := cmp.Diff(want2, offerPrices(t, p)); diff != "" {
		t.Fatalf("offers after UsePrices (-want +got):\n%s", diff)
	}
}

func offerPrices(t *testing.T, p *aws.Provider) map[string]string {
	t.Helper()
	offers, err := p.Offers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, o := range offers {
		m := "od"
		if o.Spot {
			m = "spot"
		}
		got[o.InstanceType+"/"+o.Zone+"/"+m] = o.PricePerHour.String() + " " + providers.DescribePriceSource(o)
	}
	return got
}

// TestPriceListErrors: the Price List Query API's errors map to provider
// error kinds (throttling is unavailable, access denied unauthorized)
// and name the call.
func TestPriceListErrors(t *testing.T) {
	fake := fakecloudtest.NewEC2(t, fakecloud.EC2Options{Prices: []fakecloud.OnDemandPrice{{InstanceType: "g6.xlarge", Price: "0.8048000000"}}})
	p := pricedProvider(t, fake, aws.Config{InstanceTypes: []aws.InstanceType{{Name: "g6.xlarge", GPUModel: "L4", GPUs: 1, OnDemandPrice: 805_000}}})
	for code, kind := range map[string]error{"AccessDeniedException": providers.ErrUnauthorized, "InvalidParameterException": providers.ErrInvalidRequest} {
		fake.FailNext("GetProducts", code)
		_, err := p.FetchPrices(context.Background())
		if !errors.Is(err, kind) || providers.Code(err) != code || !strings.Contains(err.Error(), "get products") {
			t.Errorf("%s: got %v, want kind %v", code, err, kind)
		}
	}
	if _, err := p.FetchPrices(context.Background()); err != nil {
		t.Fatalf("after the failures: %v", err)
	}
}

// TestPricingRegionValidated: the Price List Query API is served in three
// regions only; another is refused naming the field.
func TestPricingRegionValidated(t *testing.T) {
	c := aws.Config{Cluster: "prod", Region: "us-west-2", ImageID: "ami-0gpu", PricingRegion: "us-west-2",
		InstanceTypes: []aws.InstanceType{{Name: "g6.xlarge", GPUs: 1, OnDemandPrice: 805_000}}}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "pricingRegion") {
		t.Fatalf("validate: %v", err)
	}
	c.PricingRegion = "eu-central-1"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}
