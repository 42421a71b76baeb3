package billing_test

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/billing"
)

// docsExample returns the body of the `billing:` key in the YAML example of
// docs/billing.md, so the documented shape is the tested one.
func docsExample(t *testing.T) []byte {
	t.Helper()
	doc, err := os.ReadFile("../docs/billing.md")
	if err != nil {
		t.Fatalf("read docs: %v", err)
	}
	_, block, ok := strings.Cut(string(doc), "```yaml\nbilling:\n")
	if !ok {
		t.Fatal("docs/billing.md has no yaml block starting with billing:")
	}
	block, _, _ = strings.Cut(block, "```")
	var body strings.Builder
	for line := range strings.Lines(block) {
		body.WriteString(strings.TrimPrefix(line, "  "))
	}
	return []byte(body.String())
}

func TestDocsNameEveryFieldAndColumn(t *testing.T) {
	doc, err := os.ReadFile("../docs/billing.md")
	if err != nil {
		t.Fatalf("read docs: %v", err)
	}
	for _, c := range billing.Columns {
		if !strings.Contains(string(doc), "| `"+c.Name+"` |") {
			t.Errorf("docs/billing.md has no row for column %s", c.Name)
		}
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[billing.Entry](), reflect.TypeFor[billing.Pool]()} {
		for f := range typ.Fields() {
			if !strings.Contains(string(doc), "`"+f.Name+"`") && !strings.Contains(string(doc), "`Pool."+f.Name+"`") {
				t.Errorf("docs/billing.md does not document %s.%s", typ.Name(), f.Name)
			}
		}
	}
}

func TestParseConfigExample(t *testing.T) {
	_, c, err := billing.ParseConfig(docsExample(t))
	if err != nil {
		t.Fatalf("the documented example does not parse: %v", err)
	}
	if c.Meter.Slice != time.Minute || c.Meter.Currency != "USD" || c.Meter.Overhead.ChargeTo != billing.ChargeDemandTeam {
		t.Errorf("meter config = %+v", c.Meter)
	}
	if err := c.Meter.Validate(); err != nil {
		t.Errorf("compiled meter config does not validate: %v", err)
	}
	if c.TimeZone.String() != "Europe/Berlin" || c.BillingAccountID != "acme-research" {
		t.Errorf("zone %v, account %q", c.TimeZone, c.BillingAccountID)
	}
	want := billing.PriceSchedule{{PerGPUHour: usd("2.10")}, {From: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), PerGPUHour: usd("1.85")}}
	if diff := gocmp.Diff(want, c.Meter.OnPrem.For("H100")); diff != "" {
		t.Errorf("H100 rates (-want +got):\n%s", diff)
	}
	if r, _ := c.Meter.OnPrem.For("L4").At(t0); r != usd("1.00") {
		t.Errorf("default rate = %s", r)
	}
	if len(c.Exports) != 2 {
		t.Fatalf("exports = %+v", c.Exports)
	}
	m, d := c.Exports[0], c.Exports[1]
	if m.Granularity != billing.GranularityDay || m.Destination.S3 == nil || !m.Destination.S3.PathStyle || m.Location.String() != "Europe/Berlin" {
		t.Errorf("monthly export = %+v", m)
	}
	if d.Format != billing.FormatJSON || d.Granularity != billing.GranularityHour || d.Team != "nlp" || d.Destination.Dir == "" {
		t.Errorf("daily export = %+v", d)
	}
	if next := d.Next(t0); !next.Equal(time.Date(2026, 11, 6, 0, 0, 0, 0, time.UTC)) {
		t.Errorf("@daily next after %v = %v", t0, next)
	}
	if c.Retry != (billing.Backoff{Attempts: 5, Initial: 10 * time.Second, Max: 2 * time.Minute}) {
		t.Errorf("retry = %+v", c.Retry)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	cases := map[string]struct {
		doc    string
		fields []string
	}{
		"bad cron, zone, period and destination": {
			doc: `
exports:
  - name: x
    schedule: "61 * * * *"
    timeZone: Mars/Olympus
    period: fortnight
    destination: {dir: /tmp, s3: {bucket: b}}
`,
			fields: []string{"billing.exports[0].schedule", "billing.exports[0].timeZone", "billing.exports[0].period", "billing.exports[0].destination"},
		},
		"rates out of order and negative": {
			doc: `
onprem:
  rates:
    H100:
      - {from: "2027-01-01T00:00:00Z", perGPUHour: "2"}
      - {from: "2026-01-01T00:00:00Z", perGPUHour: "1"}
    A100:
      - {perGPUHour: "-1"}
`,
			fields: []string{"billing.onprem.rates.A100", "billing.onprem.rates.H100"},
		},
		"slice, currency, overhead": {
			doc:    "slice: 7m\ncurrency: dollars\noverhead: {chargeTo: nobody}\n",
			fields: []string{"billing.slice", "billing.currency", "billing.overhead.chargeTo"},
		},
		"duplicate names and a missing bucket": {
			doc: `
exports:
  - {name: a, schedule: "@daily", period: previous-day, destination: {s3: {region: x}}}
  - {name: a, schedule: "@daily", period: previous-day, destination: {dir: /tmp}}
`,
			fields: []string{"billing.exports[0].destination.s3.bucket", "billing.exports[1].name"},
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, _, err := billing.ParseConfig([]byte(c.doc))
			if !errors.Is(err, billing.ErrInvalidConfig) {
				t.Fatalf("err = %v, want ErrInvalidConfig", err)
			}
			for _, f := range c.fields {
				if !strings.Contains(err.Error(), f+":") {
					t.Errorf("error does not name %s:\n%v", f, err)
				}
			}
		})
	}
	if _, _, err := billing.ParseConfig([]byte("currency: USD\nsurprise: 1\n")); !errors.Is(err, billing.ErrInvalidConfig) {
		t.Errorf("unknown field: err = %v, want ErrInvalidConfig", err)
	}
}
