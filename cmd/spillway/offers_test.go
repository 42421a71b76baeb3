package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker/bolt"
	"github.com/spillway-dev/spillway/broker/clock"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/server"
	"github.com/spillway-dev/spillway/providers/fakecloud"
	"github.com/spillway-dev/spillway/providers/fakecloud/fakecloudtest"
)

// TestOffersRefreshCLI: `spillway offers refresh` (an operator) prints
// the on-demand prices the broker read from the EC2 price list (the fake,
// through the real SDK client) and the type the list lacks; `spillway
// offers` then says each price's source (and, before a budget is set,
// that no priced offer can be launched); a user may not refresh. Both
// outputs are the example of docs/providers.md, "Refreshing on-demand
// prices", verbatim.
func TestOffersRefreshCLI(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	fake := fakecloudtest.NewEC2(t, fakecloud.EC2Options{
		Prices: []fakecloud.OnDemandPrice{
			{InstanceType: "g5.xlarge", Price: "1.0060000000"},
			{InstanceType: "p5.48xlarge", Price: "55.0400000000"},
		},
		SpotPrices: []fakecloud.SpotPrice{{InstanceType: "p5.48xlarge", Zone: "us-east-1a", Price: "33.500000", At: time.Date(2026, 12, 1, 9, 52, 11, 0, time.UTC)}},
	})
	dir := t.TempDir()
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDFAKE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "fake-secret")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "aws-config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "aws-credentials"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	cfg, err := config.Parse([]byte(fmt.Sprintf(`listen: 127.0.0.1:0
dataDir: %s
cluster: prod
auth:
  tokens:
    - {name: alice, role: user, team: nlp, token: %s}
    - {name: admin, role: operator, token: %s}
providers:
  - aws:
      region: us-east-1
      endpoint: %s
      pricingEndpoint: %s
      imageId: ami-0gpu
      liveSpotPrices: true
      instanceTypes:
        - {name: g5.xlarge, gpuModel: A10G, gpus: 1, onDemandPrice: "1.10"}
        - {name: p5.48xlarge, gpuModel: H100, gpus: 8, zones: [us-east-1a], onDemandPrice: "98.32", spotPrice: "40.00"}
        - {name: g6.xlarge, gpuModel: L4, gpus: 1, onDemandPrice: "0.805"}
`, dir, cliUser, cliAdmin, fake.URL, fake.URL)))
	if err != nil {
		t.Fatal(err)
	}
	st, err := bolt.Open(filepath.Join(dir, "spillway.db"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(context.Background(), cfg, st, server.Options{Clock: clock.NewFake(now), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		st.Close()
	})
	t.Setenv("SPILLWAY_CONFIG", filepath.Join(dir, "no-cli-config"))
	t.Setenv("SPILLWAY_TOKEN", "")
	t.Setenv("SPILLWAY_JOB_TOKEN", "")

	out, errOut, code := runCLI(t, hs.URL, cliUser, "offers", "refresh")
	if code == 0 || !strings.Contains(errOut, "may not POST /v1/offers/refresh") {
		t.Fatalf("a user refreshed prices: %d\n%s%s", code, out, errOut)
	}
	refresh, errOut, code := runCLI(t, hs.URL, cliAdmin, "offers", "refresh")
	if code != 0 {
		t.Fatalf("offers refresh: %d\n%s%s", code, refresh, errOut)
	}
	offers, errOut, code := runCLI(t, hs.URL, cliUser, "offers")
	if code != 0 || strings.Count(offers, "skipped: no global burst budget is set") != 4 {
		t.Fatalf("offers without a budget: %d\n%s%s", code, offers, errOut)
	}
	if out, errOut, code := runCLI(t, hs.URL, cliAdmin, "budget", "set", "--global", "500"); code != 0 {
		t.Fatalf("budget set: %d\n%s%s", code, out, errOut)
	}
	offers, errOut, code = runCLI(t, hs.URL, cliUser, "offers")
	if code != 0 {
		t.Fatalf("offers: %d\n%s%s", code, offers, errOut)
	}
	raw, err := os.ReadFile("../../docs/providers.md")
	if err != nil {
		t.Fatal(err)
	}
	want := "```console\n$ spillway offers refresh\n" + refresh + "$ spillway offers\n" + offers + "```\n"
	if !strings.Contains(string(raw), want) {
		t.Fatalf("docs/providers.md does not show this session verbatim:\n%s", want)
	}
	if out, errOut, code := runCLI(t, hs.URL, cliAdmin, "offers", "clear-prices"); code != 0 || out != "aws-us-east-1: refreshed prices cleared; the configured prices apply\n" {
		t.Fatalf("offers clear-prices: %d\n%s%s", code, out, errOut)
	}
	if out, _, code := runCLI(t, hs.URL, cliUser, "offers"); code != 0 || strings.Contains(out, "price list at") || !strings.Contains(out, "98.32 USD") {
		t.Fatalf("offers after clear-prices: %d\n%s", code, out)
	}
}
