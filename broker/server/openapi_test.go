package server

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	yaml "go.yaml.in/yaml/v3"
)

// TestOpenAPIMatchesRoutes keeps docs/openapi.yaml equal to the routes the
// server registers: no undocumented endpoint, no documented ghost.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	raw, err := os.ReadFile("../../docs/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		OpenAPI string                            `yaml:"openapi"`
		Paths   map[string]map[string]interface{} `yaml:"paths"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("parse openapi.yaml: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi version %q", doc.OpenAPI)
	}
	var documented []string
	for path, ops := range doc.Paths {
		for method := range ops {
			if method == "parameters" {
				continue
			}
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	h := newHarness(t)
	param := regexp.MustCompile(`:([A-Za-z]+)`)
	var registered []string
	for _, r := range h.srv.echo.Routes() {
		if r.Method == "echo_route_not_found" || strings.HasSuffix(r.Path, "/*") {
			continue
		}
		registered = append(registered, r.Method+" "+param.ReplaceAllString(r.Path, "{$1}"))
	}
	slices.Sort(documented)
	slices.Sort(registered)
	registered = slices.Compact(registered)
	if d := cmp.Diff(documented, registered); d != "" {
		t.Fatalf("docs/openapi.yaml (-) vs registered routes (+):\n%s", d)
	}
}
