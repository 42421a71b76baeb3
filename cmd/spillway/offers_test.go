package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/broker/bolt"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/server"
	"github.com/spillway-dev/spillway/providers/fakecloud"
	"github.com/spillway-dev/spillway/providers/fakecloud/fakecloudtest"
)

// TestOffersRefreshCLI: `spillway offers refresh` (an operator) prints
// the on-demand prices the broker read from the EC2 price list (the fake,
// through the real SDK client) and the type the list lacks; `spillway
// offers` then says each price's source; a user may not refresh.
func TestOffersRefreshCLI(t *testing.T) {
	fake := fakecloudtest.NewEC2(t, fakecloud.EC2Options{Prices: []fakecloud.OnDemandPrice{{InstanceType: "g6.xlarge", Price: "0.8048000000"}}})
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
      instanceTypes:
        - {name: g6.xlarge, gpuModel: L4, gpus: 1, onDemandPrice: "0.805"}
        - {name: g5.xlarge, gpuModel: A10G, gpus: 1, onDemandPrice: "1.006"}
`, dir, cliUser, cliAdmin, fake.URL, fake.URL)))
	if err != nil {
		t.Fatal(err)
	}
	st, err := bolt.Open(filepath.Join(dir, "spillway.db"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(context.Background(), cfg, st, server.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
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
	out, errOut, code = runCLI(t, hs.URL, cliAdmin, "offers", "refresh")
	if code != 0 {
		t.Fatalf("offers refresh: %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"ON-DEMAND/H", "g6.xlarge", "0.8048 USD", "g5.xlarge", "not in the price list: the configured onDemandPrice stays"} {
		if !strings.Contains(out, want) {
			t.Errorf("offers refresh lacks %q:\n%s", want, out)
		}
	}
	out, errOut, code = runCLI(t, hs.URL, cliUser, "offers")
	if code != 0 {
		t.Fatalf("offers: %d\n%s%s", code, out, errOut)
	}
	lines := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 3 {
			lines[f[3]] = l
		}
	}
	if !strings.Contains(lines["g6.xlarge"], "0.80 USD") || !strings.Contains(lines["g6.xlarge"], "price list at ") ||
		!strings.Contains(lines["g5.xlarge"], "1.01 USD") || !strings.Contains(lines["g5.xlarge"], " config ") {
		t.Fatalf("offers after the refresh:\n%s", out)
	}
}
