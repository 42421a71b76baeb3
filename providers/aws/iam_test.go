package aws_test

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/providers/aws"
)

// TestIAMPolicyMatchesCalls: the IAM policy users paste
// (deploy/aws/iam-policy.json, shown verbatim in docs/providers.md) allows
// exactly the actions the adapter calls — the methods of its narrow API
// (EC2) and PricingAPI (Price List Query API) interfaces — plus
// ec2:CreateTags only as part of RunInstances (tags at launch).
// DescribeSpotPriceHistory prices spot offers (liveSpotPrices),
// pricing:GetProducts on-demand ones (`spillway offers refresh`).
func TestIAMPolicyMatchesCalls(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/aws/iam-policy.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/providers.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "```json\n"+string(raw)+"```\n") {
		t.Error("docs/providers.md does not show deploy/aws/iam-policy.json verbatim in a ```json block")
	}
	var policy struct {
		Statement []struct {
			Effect    string
			Action    []string
			Condition map[string]map[string]string
		}
	}
	if err := json.Unmarshal(raw, &policy); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range policy.Statement {
		if s.Effect != "Allow" {
			t.Errorf("statement with effect %q", s.Effect)
		}
		for _, a := range s.Action {
			got = append(got, a)
			if a == "ec2:CreateTags" && s.Condition["StringEquals"]["ec2:CreateAction"] != "RunInstances" {
				t.Error("ec2:CreateTags is allowed beyond RunInstances")
			}
			if strings.Contains(a, "*") {
				t.Errorf("wildcard action %s", a)
			}
		}
	}
	want := []string{"ec2:CreateTags"}
	for _, api := range []struct {
		service string
		calls   reflect.Type
	}{{"ec2", reflect.TypeOf((*aws.API)(nil)).Elem()}, {"pricing", reflect.TypeOf((*aws.PricingAPI)(nil)).Elem()}} {
		for i := range api.calls.NumMethod() {
			want = append(want, api.service+":"+api.calls.Method(i).Name)
		}
	}
	sort.Strings(got)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Fatalf("policy actions %v, the adapter calls %v", got, want)
	}
}
