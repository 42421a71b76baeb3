package server

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/providers"
	"github.com/spillway-dev/spillway/providers/fakecloud"
	"github.com/spillway-dev/spillway/providers/fakecloud/fakecloudtest"
)

// priceRig is a broker whose one provider is the real EC2 adapter, built
// from the config, against the fake EC2 and Price List Query API.
func priceRig(t *testing.T) (*harness, *fakecloud.EC2) {
	t.Helper()
	fake := fakecloudtest.NewEC2(t, fakecloud.EC2Options{Prices: []fakecloud.OnDemandPrice{
		{InstanceType: "p5.48xlarge", Price: "55.0400000000"},
		{InstanceType: "g6.xlarge", Price: "0.8048000000"},
	}})
	dir := t.TempDir()
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDFAKE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "fake-secret")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listen: 127.0.0.1:0
dataDir: %s
cluster: prod
auth:
  tokens:
    - {name: alice, role: user, team: nlp, token: %s}
    - {name: admin, role: operator, token: %s}
    - {name: money, role: finance, token: %s}
providers:
  - aws:
      region: us-east-1
      endpoint: %s
      pricingEndpoint: %s
      imageId: ami-0gpu
      instanceTypes:
        - {name: p5.48xlarge, gpuModel: H100, gpus: 8, zones: [us-east-1a], onDemandPrice: "98.32", spotPrice: "40.00"}
        - {name: g6.xlarge, gpuModel: L4, gpus: 1, onDemandPrice: "0.805"}
        - {name: g5.xlarge, gpuModel: A10G, gpus: 1, onDemandPrice: "1.006"}
`, dir, tokAlice, tokAdmin, tokMoney, fake.URL, fake.URL)))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, clock: clock.NewFake(t0), path: filepath.Join(dir, "spillway.db")}
	h.open(cfg)
	t.Cleanup(func() {
		h.cancel()
		h.http.Close()
		h.store.Close()
	})
	return h, fake
}

// offerPrices is GET /v1/offers as "type/zone/market" → "price source".
func offerPrices(h *harness) map[string]string {
	h.t.Helper()
	var got struct {
		Offers []api.OfferView `json:"offers"`
	}
	if code := h.do("GET", "/v1/offers", tokAlice, nil, &got); code != http.StatusOK {
		h.t.Fatalf("GET /v1/offers: %d", code)
	}
	out := map[string]string{}
	for _, o := range got.Offers {
		m := "od"
		if o.Spot {
			m = "spot"
		}
		out[o.InstanceType+"/"+o.Zone+"/"+m] = o.PricePerHour.String() + " " + providers.DescribePriceSource(o.Offer)
	}
	return out
}

// TestRefreshPricesFromPriceList: an operator's POST /v1/offers/refresh
// reads the EC2 on-demand prices from the price list (the real SDK
// client against the fake); GET /v1/offers then shows the on-demand
// offers at those prices with their source and time, a type the list
// lacks at its configured price, spot at its configured one. The call is
// audited; a user may not make it; the table outlives a restart without
// asking the price list again; a failed refresh keeps the last table;
// DELETE /v1/offers/prices puts the configured prices back, also after a
// restart.
func TestRefreshPricesFromPriceList(t *testing.T) {
	h, fake := priceRig(t)
	before := offerPrices(h)
	if before["g6.xlarge//od"] != "0.805 config" || before["p5.48xlarge/us-east-1a/od"] != "98.32 config" {
		t.Fatalf("offers before a refresh: %v", before)
	}
	if code := h.do("POST", "/v1/offers/refresh", tokAlice, nil, nil); code != http.StatusForbidden {
		t.Fatalf("a user refreshed prices: %d", code)
	}
	var bad struct {
		Error struct{ Field, Message string }
	}
	if code := h.do("POST", "/v1/offers/refresh?provider=gcp-nope", tokAdmin, nil, &bad); code != http.StatusBadRequest || bad.Error.Field != "provider" {
		t.Fatalf("unknown provider: %d %+v", code, bad)
	}

	var res struct {
		Refreshed []api.PriceRefresh `json:"refreshed"`
	}
	if code := h.do("POST", "/v1/offers/refresh", tokAdmin, nil, &res); code != http.StatusOK {
		t.Fatalf("refresh: %d", code)
	}
	if len(res.Refreshed) != 1 || res.Refreshed[0].Table == nil {
		t.Fatalf("refresh answered %+v", res.Refreshed)
	}
	tab := res.Refreshed[0].Table
	if tab.Provider != "aws-us-east-1" || !tab.FetchedAt.Equal(t0) || tab.OnDemand["g6.xlarge"] != billing.Amount(804_800) ||
		tab.OnDemand["p5.48xlarge"] != billing.Amount(55_040_000) || len(tab.Missing) != 1 || tab.Missing[0] != "g5.xlarge" {
		t.Fatalf("table %+v", tab)
	}
	want := map[string]string{
		"p5.48xlarge/us-east-1a/od":   "55.04 price list at 2026-11-30T09:00:00Z",
		"p5.48xlarge/us-east-1a/spot": "40.00 config",
		"g6.xlarge//od":               "0.8048 price list at 2026-11-30T09:00:00Z",
		"g5.xlarge//od":               "1.006 config",
	}
	if got := offerPrices(h); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("offers after the refresh:\n got %v\nwant %v", got, want)
	}
	var audit struct {
		Audit []broker.AuditRecord `json:"audit"`
	}
	if code := h.do("GET", "/v1/audit", tokAdmin, nil, &audit); code != http.StatusOK {
		t.Fatalf("audit: %d", code)
	}
	var refreshes []string
	for _, r := range audit.Audit {
		if r.Action == "POST /v1/offers/refresh" {
			refreshes = append(refreshes, fmt.Sprintf("%s %d", r.By, r.Status))
		}
	}
	if strings.Join(refreshes, ",") != "alice 403,admin 400,admin 200" {
		t.Fatalf("audit of the refreshes: %v", refreshes)
	}

	calls := fake.Calls("GetProducts")
	h.restart()
	if got := offerPrices(h); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("offers after a restart:\n got %v\nwant %v", got, want)
	}
	if fake.Calls("GetProducts") != calls {
		t.Fatal("the restarted broker asked the price list again")
	}

	fake.FailNext("GetProducts", "AccessDeniedException")
	var failed struct {
		Error struct{ Code, Message string }
	}
	if code := h.do("POST", "/v1/offers/refresh", tokAdmin, nil, &failed); code != http.StatusBadGateway ||
		!strings.Contains(failed.Error.Message, "aws-us-east-1") || !strings.Contains(failed.Error.Message, "AccessDeniedException") {
		t.Fatalf("failed refresh: %d %+v", code, failed)
	}
	if got := offerPrices(h); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("offers after a failed refresh:\n got %v\nwant %v", got, want)
	}

	// Clearing puts the configured prices back, for good.
	if code := h.do("DELETE", "/v1/offers/prices", tokAlice, nil, nil); code != http.StatusForbidden {
		t.Fatalf("a user cleared prices: %d", code)
	}
	var cleared struct {
		Cleared []string `json:"cleared"`
	}
	if code := h.do("DELETE", "/v1/offers/prices", tokAdmin, nil, &cleared); code != http.StatusOK || fmt.Sprint(cleared.Cleared) != "[aws-us-east-1]" {
		t.Fatalf("clear: %d %+v", code, cleared)
	}
	if got := offerPrices(h); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Fatalf("offers after clearing:\n got %v\nwant %v", got, before)
	}
	h.restart()
	if got := offerPrices(h); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Fatalf("offers after clearing and a restart:\n got %v\nwant %v", got, before)
	}
	if code := h.do("DELETE", "/v1/offers/prices", tokAdmin, nil, &cleared); code != http.StatusOK || len(cleared.Cleared) != 0 {
		t.Fatalf("clear again: %d %+v", code, cleared)
	}
}

// TestRefreshPricesWithoutPriceList: with no provider that has a price
// list, the refresh says so instead of succeeding at nothing.
func TestRefreshPricesWithoutPriceList(t *testing.T) {
	h := newHarness(t)
	var got struct {
		Error struct{ Code, Message string }
	}
	if code := h.do("POST", "/v1/offers/refresh", tokAdmin, nil, &got); code != http.StatusConflict || !strings.Contains(got.Error.Message, "no configured provider has a price list") {
		t.Fatalf("refresh without a price list: %d %+v", code, got)
	}
}
