package adapters

import (
	"os"
	"strings"
	"testing"
)

// TestPricingDocExampleParses: the provider entry docs/providers.md shows
// under "Refreshing on-demand prices" (a Price List endpoint and region)
// is a valid aws section.
func TestPricingDocExampleParses(t *testing.T) {
	raw, err := os.ReadFile("../../docs/providers.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	_, section, ok := strings.Cut(doc, "### Refreshing on-demand prices\n")
	if !ok {
		t.Fatal(`docs/providers.md has no "Refreshing on-demand prices" section`)
	}
	_, block, ok := strings.Cut(section, "```yaml\n")
	if !ok {
		t.Fatal("the section has no yaml example")
	}
	block, _, _ = strings.Cut(block, "```")
	cfg, err := parse(t, "dataDir: x\ncluster: prod\n"+block)
	if err != nil {
		t.Fatalf("the example does not parse: %v\n%s", err, block)
	}
	if len(cfg.Providers) != 1 || cfg.Providers[0].AWS == nil || cfg.Providers[0].AWS.PricingEndpoint == "" || cfg.Providers[0].AWS.PricingRegion != "eu-central-1" {
		t.Fatalf("the example's provider: %+v", cfg.Providers)
	}
}
