package billing

import "testing"

// TestPoolLabel: pools read as reports show them; an on-prem pool named
// "onprem" is not doubled.
func TestPoolLabel(t *testing.T) {
	for _, tc := range []struct {
		pool Pool
		want string
	}{
		{Pool{Kind: PoolOnPrem, Name: "onprem"}, "onprem"},
		{Pool{Kind: PoolOnPrem}, "onprem"},
		{Pool{Kind: PoolOnPrem, Name: "rack-a"}, "onprem/rack-a"},
		{Pool{Kind: PoolCloud, Provider: "aws", Region: "us-east-1", InstanceType: "p5.48xlarge"}, "cloud/aws/us-east-1/p5.48xlarge"},
	} {
		if got := tc.pool.Label(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.pool, got, tc.want)
		}
	}
}
