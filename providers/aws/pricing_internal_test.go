package aws

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/billing"
)

// product is one PriceList document with the given attributes and hourly
// USD price.
func product(t *testing.T, sku, os, tenancy, operation, price string) string {
	t.Helper()
	doc := map[string]any{
		"product": map[string]any{"sku": sku, "attributes": map[string]string{
			"instanceType": "g6.xlarge", "regionCode": "us-east-1", "operatingSystem": os, "tenancy": tenancy,
			"preInstalledSw": "NA", "capacitystatus": "Used", "operation": operation}},
		"terms": map[string]any{"OnDemand": map[string]any{sku + ".T": map[string]any{"priceDimensions": map[string]any{
			sku + ".T.D": map[string]any{"unit": "Hrs", "pricePerUnit": map[string]string{"USD": price}}}}}},
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// TestOnDemandPriceChoosesThePlainLinuxProduct: among the documents a
// query returns, only the plain Linux RunInstances product in shared
// tenancy counts (a loose endpoint's Windows or dedicated siblings are
// ignored); a price with more than six decimals is rounded half up to
// the micro; two different prices for it are an error, not a guess.
func TestOnDemandPriceChoosesThePlainLinuxProduct(t *testing.T) {
	docs := []string{
		product(t, "W", "Windows", "Shared", "RunInstances:0002", "1.2000000000"),
		product(t, "L", "Linux", "Shared", "RunInstances", "0.80480049"),
		product(t, "D", "Linux", "Dedicated", "RunInstances", "0.9000000000"),
	}
	got, ok, err := onDemandPrice(docs, "g6.xlarge", "us-east-1", "USD")
	if err != nil || !ok || got != billing.Amount(804_800) {
		t.Fatalf("got %s %v %v, want 0.8048", got, ok, err)
	}
	if _, ok, err := onDemandPrice(docs[:1], "g6.xlarge", "us-east-1", "USD"); ok || err != nil {
		t.Fatalf("Windows only: ok %v err %v, want no price", ok, err)
	}
	two := append(docs, product(t, "L2", "Linux", "Shared", "RunInstances", "0.8100000000"))
	if _, _, err := onDemandPrice(two, "g6.xlarge", "us-east-1", "USD"); err == nil || !strings.Contains(err.Error(), "two on-demand Linux prices") {
		t.Fatalf("two prices: %v", err)
	}
	if _, _, err := onDemandPrice(docs, "g6.xlarge", "us-east-1", "EUR"); err == nil || !strings.Contains(err.Error(), "no EUR price") {
		t.Fatalf("another currency: %v", err)
	}
	if _, _, err := onDemandPrice([]string{"{not json"}, "g6.xlarge", "us-east-1", "USD"); err == nil {
		t.Fatal("a broken document was accepted")
	}
	for in, want := range map[string]billing.Amount{"98.3200000000": 98_320_000, "0.0000005": 1, "0.0000004": 0, "1.0060004999": 1_006_000} {
		if got, err := parsePriceListAmount(in); err != nil || got != want {
			t.Errorf("parsePriceListAmount(%q) = %s %v, want %s", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "abc", "-1.0", "1e3"} {
		if _, err := parsePriceListAmount(bad); err == nil {
			t.Errorf("parsePriceListAmount(%q) accepted", bad)
		}
	}
}
