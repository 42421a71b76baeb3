package config

import "testing"

// TestHAExampleParses: the three-broker example in deploy/ha is a valid
// config on Redis.
func TestHAExampleParses(t *testing.T) {
	c := loadExample(t, "../../deploy/ha/spillway.yaml")
	if c.StorePath() != "" || len(c.Teams) != 2 || c.Reports.Location().String() != "Europe/Berlin" {
		t.Fatalf("ha example parsed oddly: store %q teams %d zone %s", c.Store, len(c.Teams), c.Reports.Location())
	}
}

// TestExampleHasTeamsAndReports: the single-box example shows quotas and
// the reports section.
func TestExampleHasTeamsAndReports(t *testing.T) {
	c := loadExample(t, "../../deploy/spillway.example.yaml")
	if len(c.Teams) != 2 || c.Teams[0].Quota == nil || c.Teams[0].Quota.GPUs != 16 || *c.Reports.DayStart != 8 || !c.ReclaimsIdle("inference") {
		t.Fatalf("example: %+v", c.Teams)
	}
}
