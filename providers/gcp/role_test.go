package gcp_test

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/spillway-dev/spillway/providers/gcp"
)

// TestCustomRoleCoversCalls: every call of the adapter's narrow GCE
// interfaces has its permission in deploy/gcp/spillway-role.yaml (shown in
// docs/providers.md); a new call without a permission here fails.
func TestCustomRoleCoversCalls(t *testing.T) {
	perm := map[string]string{
		"InstancesAPI.Insert":             "compute.instances.create",
		"InstancesAPI.Get":                "compute.instances.get",
		"InstancesAPI.List":               "compute.instances.list",
		"InstancesAPI.Delete":             "compute.instances.delete",
		"InstancesAPI.GetGuestAttributes": "compute.instances.getGuestAttributes",
		"OperationsAPI.Wait":              "compute.zoneOperations.get",
		"PoliciesAPI.Insert":              "compute.resourcePolicies.create",
		"PoliciesAPI.Delete":              "compute.resourcePolicies.delete",
		"RegionOperationsAPI.Wait":        "compute.regionOperations.get",
	}
	raw, err := os.ReadFile("../../deploy/gcp/spillway-role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var role struct {
		IncludedPermissions []string `json:"includedPermissions"`
	}
	if err := yaml.Unmarshal(raw, &role); err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, p := range role.IncludedPermissions {
		have[p] = true
	}
	for _, iface := range []reflect.Type{reflect.TypeOf((*gcp.InstancesAPI)(nil)).Elem(), reflect.TypeOf((*gcp.OperationsAPI)(nil)).Elem(),
		reflect.TypeOf((*gcp.PoliciesAPI)(nil)).Elem(), reflect.TypeOf((*gcp.RegionOperationsAPI)(nil)).Elem()} {
		for i := range iface.NumMethod() {
			key := iface.Name() + "." + iface.Method(i).Name
			p, ok := perm[key]
			if !ok {
				t.Errorf("%s has no permission mapped; add it here and to deploy/gcp/spillway-role.yaml", key)
				continue
			}
			if !have[p] {
				t.Errorf("%s needs %s, missing from deploy/gcp/spillway-role.yaml", key, p)
			}
		}
	}
	doc, err := os.ReadFile("../../docs/providers.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "```yaml\n"+string(raw)+"```\n") {
		t.Error("docs/providers.md does not show deploy/gcp/spillway-role.yaml verbatim in a ```yaml block")
	}
}
