package adapters

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/config"
)

// parse reads doc as the broker does: the config, then its adapter
// sections.
func parse(t *testing.T, doc string) (*Config, error) {
	t.Helper()
	c, err := config.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("config.Parse(%q): %v", doc, err)
	}
	return Parse(c)
}

// TestAdapterSectionsNameField: a problem inside an adapter's section,
// found by the adapter (its Validate, its decoder's rules, broker/redis's
// URL check, broker/slurm's hostlist), names the field by its full path.
func TestAdapterSectionsNameField(t *testing.T) {
	key := filepath.Join(t.TempDir(), "munge.key")
	if err := os.WriteFile(key, []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	aws := "dataDir: x\nproviders:\n  - aws: {region: us-east-1, imageId: ami-1, instanceTypes: [{name: g6.xlarge, gpus: 1, onDemandPrice: 0.8}]}\n"
	for doc, field := range map[string]string{
		"dataDir: x\nstore: redis://h:1/0?prefix=a*": "store",
		"dataDir: x\nstore: redis-sentinel://h/m":    "store",
		"dataDir: x\nstore: rediss://h:1/notanumber": "store",
		"dataDir: x\nslurm:\n  team: nlp\n  node: {mungeKeyFile: " + key + "}\n  nodes: [{names: 'b-[4-1]', offers: [{}]}]\n":                          "slurm.nodes[0].names",
		"dataDir: x\nproviders: [{aws: {imageId: ami-1, instanceTypes: [{name: a, gpus: 1, onDemandPrice: 1}]}}]":                                      "providers[0].aws.region",
		"dataDir: x\nproviders: [{aws: {region: r, imageId: ami-1, instanceTypes: [{name: a, gpus: 1}]}}]":                                             "providers[0].aws.instanceTypes[0]",
		"dataDir: x\nproviders: [{aws: {region: r, imageId: ami-1, instanceTyps: []}}]":                                                                "providers[0].aws.instanceTyps",
		"dataDir: x\nproviders: [{aws: {region: r, imageId: ami-1, pricingRegion: us-west-2, instanceTypes: [{name: a, gpus: 1, onDemandPrice: 1}]}}]": "providers[0].aws.pricingRegion",
		"dataDir: x\nproviders: [{gcp: {project: p, image: i, machineTypes: [{name: a2, onDemandPrice: 3}]}}]":                                         "providers[0].gcp.machineTypes[0]",
		"dataDir: x\nproviders: [{sshpool: {drainMargin: soon}}]":                                                                                      "providers[0].sshpool.drainMargin",
		"dataDir: x\nproviders: [{sshpool: {hosts: [{name: 'bad name', address: h, gpus: 1, leaseEnds: '2030-01-01T00:00:00Z', hostKey: x}]}}]":        "providers[0].sshpool.hosts[0].name",
		"dataDir: x\nproviders: [{lambda: {sshPort: 70000}}]":                                                                                          "providers[0].lambda.sshPort",
		"dataDir: x\nproviders: [{lambda: {sshPort: twenty}}]":                                                                                         "providers[0].lambda.sshPort",
		"dataDir: x\nburst: {agentRuntime: {kind: oci, bogus: 1}}":                                                                                     "burst.agentRuntime.bogus",
		"dataDir: x\nburst: {providerRuntimes: {aws-r: {nope: true}}}":                                                                                 "burst.providerRuntimes.aws-r.nope",
		"dataDir: x\nburst: {agentData: {cache: []}}":                                                                                                  "burst.agentData.cache",
		aws + "  - aws: {region: us-east-2, imageId: ami-1, instanceTypes: [{name: g6.xlarge, gpus: 1}]}\n":                                            "providers[1].aws.instanceTypes[0]",
	} {
		_, err := parse(t, doc)
		ve, ok := broker.AsValidation(err)
		if !ok || ve.First().Field != field {
			t.Errorf("%q: got %v, want an error on %s", doc, err, field)
		}
	}
}

// TestAdapterSectionsDecoded: a good config's sections come out typed,
// cloud providers tagged with the cluster and named by their adapter's
// default.
func TestAdapterSectionsDecoded(t *testing.T) {
	a, err := parse(t, `dataDir: x
cluster: lab
providers:
  - aws: {region: us-east-1, imageId: ami-1, instanceTypes: [{name: g6.xlarge, gpus: 1, onDemandPrice: 0.8}]}
  - gcp: {name: g, cluster: other, project: p, image: i, machineTypes: [{name: a2, zones: [z], onDemandPrice: 3}]}
burst:
  agentRuntime: {kind: process}
  providerRuntimes: {g: {kind: oci}}
  agentData: {}
`)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Providers) != 2 || a.Providers[0].Name() != "aws-us-east-1" || a.Providers[0].AWS.Cluster != "lab" ||
		a.Providers[1].Name() != "g" || a.Providers[1].GCP.Cluster != "other" {
		t.Fatalf("providers: %+v", a.Providers)
	}
	if a.RuntimeFor("g").Kind != "oci" || a.RuntimeFor("aws-us-east-1").Kind != "process" || a.AgentData == nil {
		t.Fatalf("agent sections: %+v", a)
	}
}
