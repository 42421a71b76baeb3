package config

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/broker"
)

func TestExampleConfigParses(t *testing.T) {
	c := loadExample(t, "../../deploy/spillway.example.yaml")
	if c.Listen != "0.0.0.0:8080" || len(c.Auth.Tokens) != 4 || len(c.Queues) != 3 {
		t.Fatalf("example parsed oddly: %+v", c)
	}
}

// fieldPaths lists every config field as a dotted path ("auth.tokens.name").
func fieldPaths(t reflect.Type, prefix string) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := strings.Split(f.Tag.Get("json"), ",")[0]
		if name == "" || name == "-" {
			continue
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		out = append(out, path)
		ft := f.Type
		for ft.Kind() == reflect.Slice || ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct && ft.PkgPath() == reflect.TypeOf(Config{}).PkgPath() {
			out = append(out, fieldPaths(ft, path)...)
		}
	}
	return out
}

// TestConfigDocumented: docs/config.md names every field.
func TestConfigDocumented(t *testing.T) {
	raw, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	for _, p := range fieldPaths(reflect.TypeOf(Config{}), "") {
		if !strings.Contains(doc, "`"+p+"`") {
			t.Errorf("docs/config.md does not document `%s`", p)
		}
	}
}

func TestBadConfigNamesField(t *testing.T) {
	cases := map[string]string{
		"listen: ''\ndataDir: x": "listen",
		"dataDir: x\nauth: {tokens: [{name: a, role: root, token: x}]}":                "auth.tokens[0].role",
		"dataDir: x\nauth: {tokens: [{name: a, role: user, token: 0123456789abcdef}]}": "auth.tokens[0].team",
		"dataDir: x\nauth: {tokens: [{name: a, role: agent, token: short}]}":           "auth.tokens[0].token",
		"dataDir: x\nqueues: [{name: batch}]":                                          "queues",
		"dataDir: x\nagents: {lostAfter: 1}":                                           "agents.lostAfter",
		"dataDir: x\nschedulr: {}":                                                     "schedulr",
		"dataDir: x\nstore: mysql://x":                                                 "store",
		"dataDir: x\nburst: {waitPerGPUHour: 2h}":                                      "burst.waitPerGPUHour",
		"dataDir: x\nburst: {maxWait: 45m}":                                            "burst.maxWait",
		"dataDir: x\nburst: {waitPerGPUHour: 1m, maxWait: 8d}":                         "burst.maxWait",
		"dataDir: x\nburst: {maxWaitMultiNode: 30m}":                                   "burst.maxWaitMultiNode",
		"dataDir: x\nburst: {spillBack: {enabled: true, margin: -1}}":                  "burst.spillBack.margin",
		"dataDir: x\nburst: {spillBack: {minInterval: -1h}}":                           "burst.spillBack.minInterval",
		"dataDir: x\nburst: {spillBack: {staging: 48h}}":                               "burst.spillBack.staging",
	}
	for doc, field := range cases {
		_, err := Parse([]byte(doc))
		ve, ok := broker.AsValidation(err)
		if !ok || ve.First().Field != field {
			t.Errorf("%q: got %v, want an error on %s", doc, err, field)
		}
	}
}

func TestTokenHash(t *testing.T) {
	tok := Token{TokenSHA256: "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"} // "password"
	if !tok.Matches("password") || tok.Matches("Password") {
		t.Fatal("sha256 token matching")
	}
}

// TestBillingDocExampleParses: the billing example in docs/billing.md is a
// valid section of the broker config.
func TestBillingDocExampleParses(t *testing.T) {
	raw, err := os.ReadFile("../../docs/billing.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	start := strings.Index(doc, "```yaml\nbilling:")
	if start < 0 {
		t.Fatal("no billing example in docs/billing.md")
	}
	body := doc[start+len("```yaml\n"):]
	body = body[:strings.Index(body, "```")]
	c, err := Parse([]byte("dataDir: x\n" + body))
	if err != nil {
		t.Fatal(err)
	}
	comp := c.BillingCompiled()
	if len(comp.Exports) != 2 || comp.Meter.Currency != "USD" || len(comp.Meter.OnPrem.ByModel["H100"]) != 2 {
		t.Fatalf("compiled billing: %+v", comp)
	}
	_, err = Parse([]byte("dataDir: x\nbilling:\n  exports:\n    - {name: x, schedule: \"61 * * * *\", period: previous-day, destination: {dir: /tmp}}\n"))
	ve, ok := broker.AsValidation(err)
	if !ok || ve.First().Field != "billing.exports[0].schedule" {
		t.Fatalf("bad schedule: %v", err)
	}
}
