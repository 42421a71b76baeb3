package integration

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/api"
	"github.com/spillway-dev/spillway/providers/fakecloud"
	"github.com/spillway-dev/spillway/providers/fakecloud/fakecloudtest"
)

// gangBurstCluster is a broker whose one provider is the fake EC2 with
// two 2-GPU instance types (the cheaper first choice, a dearer
// fallback), one on-prem agent with a single card (no gang member fits
// it), and fast burst timings.
func gangBurstCluster(t *testing.T, ec2 *fakecloud.EC2) *cluster {
	t.Helper()
	c := burstCluster(t, ec2, burstHostDir(t), withMachineDirs(), withInstanceTypes(
		`{name: g6.12xlarge, gpuModel: L4, gpus: 2, gpuMemoryGiB: 24, cpus: 8, memoryGiB: 32, onDemandPrice: "4.60"}`,
		`{name: g6e.12xlarge, gpuModel: L40S, gpus: 2, gpuMemoryGiB: 48, cpus: 8, memoryGiB: 64, onDemandPrice: "10.49"}`))
	c.agent("onprem-1", "sim:1xH100-80GB")
	c.waitNodes(1)
	// The on-prem card is taken: allocation is at the burst threshold.
	c.holdCard(tokAlice, "hold")
	return c
}

// submitWhenOffered submits spec once the broker knows the offers that
// fit it (it refuses a job no node or offer can hold, and reads the
// offers at its first burst tick).
func submitWhenOffered(t *testing.T, c *cluster, spec broker.Spec) *broker.Job {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		j, err := c.client(tokAlice).SubmitSpec(context.Background(), spec)
		if err == nil {
			return j
		}
		if !strings.Contains(err.Error(), "the largest node or cloud offer") || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// groupsOf sorts the instance records by gang group.
func groupsOf(insts []api.InstanceView) map[string][]api.InstanceView {
	out := map[string][]api.InstanceView{}
	for _, v := range insts {
		out[v.Group] = append(out[v.Group], v)
	}
	return out
}

// waitAllEnded waits until every record has ended and returns them.
func waitAllEnded(t *testing.T, c *cluster, within time.Duration) []api.InstanceView {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		insts, err := c.client(tokAdmin).Instances(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		live := 0
		for _, v := range insts {
			if !v.State.Ended() {
				live++
			}
		}
		if live == 0 {
			return insts
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d burst machines still live after %s: %+v", live, within, insts)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkNoLeak: no machine of the fake cloud is left running, and the
// budget holds no reservation, its spend the ledger's cloud cost.
func checkNoLeak(t *testing.T, c *cluster, ec2 *fakecloud.EC2) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var running []string
		for _, in := range ec2.Instances() {
			if in.State != "terminated" && in.State != "shutting-down" {
				running = append(running, in.ID+" "+in.State)
			}
		}
		if len(running) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("machines left in the cloud after reconcile: %v", running)
		}
		time.Sleep(200 * time.Millisecond)
	}
	bs, err := c.client(tokAdmin).Budgets(ctx)
	if err != nil || len(bs) != 1 || bs[0].Reserved != 0 || bs[0].Spent <= 0 {
		t.Fatalf("budget after the gang: %+v %v", bs, err)
	}
}

// TestGangBurstsToFakeEC2: a 2-node × 2-GPU gang that fits nothing
// on-prem bursts to two machines of one offer in one cluster placement
// group of the fake EC2 (real sshd hosts, the real agent bootstrapped on
// each), its members meet at MASTER_ADDR:MASTER_PORT and exit 0; the group
// goes idle and both machines are deleted together.
func TestGangBurstsToFakeEC2(t *testing.T) {
	fakecloudtest.RequireSSHD(t)
	ec2 := fakecloudtest.NewEC2(t, fakecloud.EC2Options{SSHD: true, BootTime: 200 * time.Millisecond})
	c := gangBurstCluster(t, ec2)
	ctx := context.Background()
	j := submitWhenOffered(t, c, gangSpec("rdzv-burst", "/usr/bin/python3", "-c", rendezvous))
	c.waitJob(j.ID, 240*time.Second, "succeeded", func(s string) bool { return s == "succeeded" })
	out, _, _ := c.cli(tokAlice, "logs", j.ID)
	if !strings.Contains(out, "met rank") {
		t.Fatalf("the members did not meet; log:\n%s", out)
	}
	got, err := c.client(tokAlice).Job(ctx, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	insts, err := c.client(tokAdmin).Instances(ctx)
	if err != nil {
		t.Fatal(err)
	}
	groups := groupsOf(insts)
	if len(insts) != 2 || len(groups) != 1 {
		t.Fatalf("want one group of two machines: %+v", insts)
	}
	var nodes []string
	for _, p := range got.Placements {
		nodes = append(nodes, p.Node)
	}
	for g, ms := range groups {
		for _, m := range ms {
			if g == "" || m.GroupSize != 2 || m.Offer.InstanceType != "g6.12xlarge" || !slices.Contains(nodes, m.ID) {
				t.Fatalf("machine %s: group %q of %d, %s; the gang ran on %v", m.ID, g, m.GroupSize, m.Offer.InstanceType, nodes)
			}
		}
	}
	var pg string
	for _, name := range ec2.PlacementGroups() {
		if strings.HasPrefix(name, "spillway-") {
			pg = name
		}
	}
	if pg == "" {
		t.Fatalf("no placement group made for the gang: %v", ec2.PlacementGroups())
	}
	insts = waitAllEnded(t, c, 60*time.Second)
	for _, m := range insts {
		if m.State != broker.MachineTerminated {
			t.Errorf("machine %s ended %s (%s), want terminated", m.ID, m.State, m.Reason)
		}
	}
	checkNoLeak(t, c, ec2)
	waitFor(t, 20*time.Second, "placement group "+pg+" is deleted after its machines ended", func() bool {
		return !slices.Contains(ec2.PlacementGroups(), pg)
	})
}

// TestGangBurstMemberRefused: the fake EC2 has no capacity for the gang's
// second machine. The first, created, is deleted, its reservation and the
// refused one's released, and the gang goes to the next offer as a new
// group of two, where it runs; after reconcile no machine is left and the
// budget holds no reservation.
func TestGangBurstMemberRefused(t *testing.T) {
	fakecloudtest.RequireSSHD(t)
	ec2 := fakecloudtest.NewEC2(t, fakecloud.EC2Options{SSHD: true, BootTime: 200 * time.Millisecond})
	c := gangBurstCluster(t, ec2)
	ec2.FailNth("RunInstances", 2, "InsufficientInstanceCapacity")
	j := submitWhenOffered(t, c, gangSpec("refused", "/usr/bin/python3", "-c", rendezvous))
	c.waitJob(j.ID, 240*time.Second, "succeeded", func(s string) bool { return s == "succeeded" })
	insts := waitAllEnded(t, c, 60*time.Second)
	groups := groupsOf(insts)
	if len(insts) != 4 || len(groups) != 2 {
		t.Fatalf("want two groups of two machines (one given up, one that ran): %+v", insts)
	}
	ran := 0
	for g, ms := range groups {
		if len(ms) != 2 || ms[0].Offer.InstanceType != ms[1].Offer.InstanceType {
			t.Fatalf("group %s: %+v", g, ms)
		}
		ready := 0
		for _, m := range ms {
			if m.ReadyAt != nil {
				ready++
			}
		}
		switch {
		case ready == 2 && ms[0].Offer.InstanceType == "g6e.12xlarge":
			ran++
		case ready == 0 && ms[0].Offer.InstanceType == "g6.12xlarge":
			created := 0
			for _, m := range ms {
				if m.ProviderID != "" {
					created++
					if m.State != broker.MachineFailed && m.State != broker.MachineTerminated {
						t.Errorf("created member %s of the group given up ended %s", m.ID, m.State)
					}
					if m.Deletes == 0 {
						t.Errorf("created member %s of the group given up was never deleted", m.ID)
					}
				}
			}
			if created != 1 {
				t.Errorf("group given up: %d members created, want 1 (the other refused)", created)
			}
		default:
			t.Fatalf("group %s of %s with %d ready: %+v", g, ms[0].Offer.InstanceType, ready, ms)
		}
	}
	if ran != 1 {
		t.Fatalf("the gang did not run on the next offer: %+v", insts)
	}
	if n := ec2.Calls("RunInstances"); n < 4 {
		t.Fatalf("%d RunInstances calls, want at least 4", n)
	}
	checkNoLeak(t, c, ec2)
	out, _, _ := c.cli(tokAlice, "logs", j.ID)
	if !strings.Contains(out, "met rank") {
		t.Fatalf("the members did not meet; log:\n%s", out)
	}
}

// TestGangBurstEveryMemberRefused: the fake EC2 has no g6.12xlarge at
// all, so every member of the gang's first group is refused after its
// cluster placement group was made. The gang runs on the next offer, and
// once everything has ended no placement group is left: the one of the
// group given up with no machine included (it used to stay, and AWS
// allows 500 per account).
func TestGangBurstEveryMemberRefused(t *testing.T) {
	fakecloudtest.RequireSSHD(t)
	ec2 := fakecloudtest.NewEC2(t, fakecloud.EC2Options{SSHD: true, BootTime: 200 * time.Millisecond})
	ec2.SetCapacity("g6.12xlarge", 0)
	c := gangBurstCluster(t, ec2)
	j := submitWhenOffered(t, c, gangSpec("all-refused", "/usr/bin/python3", "-c", rendezvous))
	c.waitJob(j.ID, 240*time.Second, "succeeded", func(s string) bool { return s == "succeeded" })
	insts := waitAllEnded(t, c, 60*time.Second)
	groups := groupsOf(insts)
	if len(groups) != 2 {
		t.Fatalf("want two groups (one given up, one that ran): %+v", insts)
	}
	for g, ms := range groups {
		if ms[0].Offer.InstanceType == "g6.12xlarge" {
			for _, m := range ms {
				if m.ProviderID != "" {
					t.Fatalf("group %s: member %s was created on an offer with no capacity", g, m.ID)
				}
			}
		}
	}
	checkNoLeak(t, c, ec2)
	waitFor(t, 60*time.Second, "no placement group is left after every machine ended", func() bool {
		return !slices.ContainsFunc(ec2.PlacementGroups(), func(name string) bool { return strings.HasPrefix(name, "spillway-") })
	})
}
