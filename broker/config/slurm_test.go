package config

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spillway-dev/spillway/broker"
)

func TestSlurmConfig(t *testing.T) {
	key := filepath.Join(t.TempDir(), "munge.key")
	if err := os.WriteFile(key, []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := "dataDir: x\nslurm:\n  team: nlp\n  node: {mungeKeyFile: " + key + "}\n"
	c, err := Parse([]byte(base + "  nodes: [{names: 'burst-[1-4]', offers: [{instanceType: g6.xlarge}]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Slurm.Queue != "slurm" || c.Slurm.Node.MungeSocket != "/run/munge/munge.socket.2" || c.Slurm.TeamFor(c.Slurm.Nodes[0]) != "nlp" {
		t.Fatalf("defaults: %+v", c.Slurm)
	}
	for doc, field := range map[string]string{
		"dataDir: x\nslurm: {nodes: [{names: a, offers: [{}]}]}": "slurm.team",
		base + "  nodes: []\n":               "slurm.nodes",
		base + "  nodes: [{offers: [{}]}]\n": "slurm.nodes[0]",
		// A bad hostlist is broker/slurm's to name (broker/adapters).
		base + "  nodes: [{names: a}]\n":                                                                      "slurm.nodes[0].offers",
		base + "  nodes: [{names: a, offers: [{spot: maybe}]}]\n":                                             "slurm.nodes[0].offers[0].spot",
		base + "  nodes: [{names: a, offers: [{provider: nowhere}]}]\n":                                       "slurm.nodes[0].offers[0].provider",
		base + "  env: [NOEQUALS]\n  nodes: [{names: a, offers: [{}]}]\n":                                     "slurm.env[0]",
		base + "  reserve: 10s\n  nodes: [{names: a, offers: [{}]}]\n":                                        "slurm.reserve",
		"dataDir: x\nslurm: {team: a, node: {mungeKeyFile: /nonexistent}, nodes: [{names: a, offers: [{}]}]}": "slurm.node.mungeKeyFile",
	} {
		_, err := Parse([]byte(doc))
		ve, ok := broker.AsValidation(err)
		if !ok || ve.First().Field != field {
			t.Errorf("%q: got %v, want an error on %s", doc, err, field)
		}
	}
}
