package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/client"
	"github.com/spillway-dev/spillway/onprem/staging/s3server"
	"github.com/spillway-dev/spillway/providers/fakecloud"
	"github.com/spillway-dev/spillway/providers/fakecloud/fakecloudtest"
)

// TestBurstToFakeEC2 is the burst path end to end: the on-prem card is
// taken, a job waits past the minimum, the broker bursts to a fake EC2
// whose instances are real sshd hosts, bootstraps the real spillway agent
// there over SSH (host key checked against the console output), the job
// runs on it, the machine goes idle and is deleted, the ledger shows the
// cloud GPU-hours and the idle overhead, and the budget shows the spend.
func TestBurstToFakeEC2(t *testing.T) {
	fakecloudtest.RequireSSHD(t)
	ec2 := fakecloudtest.NewEC2(t, fakecloud.EC2Options{SSHD: true, BootTime: 200 * time.Millisecond})
	c := burstCluster(t, ec2, burstHostDir(t))
	c.agent("onprem-1", "sim:1xH100-80GB")
	c.waitNodes(1)
	c.holdCard(tokAlice, "hold")
	burstJobTail(t, c, ec2)
}

// burstConfig is the broker config every burst test shares: one-second
// billing slices and the on-prem H100 rate, fast burst timings, simulated
// cards for burst agents, and the fake EC2 as the one provider, whose
// machines keep their files under remote. Options change what tests
// differ in.
type burstConfig struct {
	ec2    *fakecloud.EC2
	remote string
	// rate is the on-prem H100 price per GPU-hour.
	rate string
	// idleTTL is how long an idle burst machine is kept.
	idleTTL string
	// types are the provider's instance types, one flow mapping each.
	types []string
	// dirs is appended to remoteDir and agentDataDir: "/{machine}" gives
	// each machine directories of its own.
	dirs string
	// burst and provider are more lines under burst: and the provider.
	burst, provider []string
	// extra is more top-level config.
	extra string
}

// burstOption changes a burstConfig.
type burstOption func(*burstConfig)

// nlpBucket is top-level config letting team nlp stage from s3://spill.
const nlpBucket = "teams:\n  - {name: nlp, buckets: [\"s3://spill\"]}\n"

// g6xlarge is the one-L4 instance type most burst tests offer.
const g6xlarge = `{name: g6.xlarge, gpuModel: L4, gpus: 1, gpuMemoryGiB: 24, cpus: 4, memoryGiB: 16, onDemandPrice: "0.805"}`

// withInstanceTypes offers these instance types instead of g6xlarge.
func withInstanceTypes(types ...string) burstOption {
	return func(b *burstConfig) { b.types = types }
}

// withMachineDirs gives each burst machine a remote and a data directory
// of its own ({machine} in the templates).
func withMachineDirs() burstOption {
	return func(b *burstConfig) { b.dirs = "/{machine}" }
}

// withOnPremRate prices the owned H100s at rate per GPU-hour.
func withOnPremRate(rate string) burstOption {
	return func(b *burstConfig) { b.rate = rate }
}

// withIdleTTL keeps idle burst machines for ttl (a duration) instead of 4s.
func withIdleTTL(ttl string) burstOption {
	return func(b *burstConfig) { b.idleTTL = ttl }
}

// withBurst adds lines ("key: value") under burst:.
func withBurst(lines ...string) burstOption {
	return func(b *burstConfig) { b.burst = append(b.burst, lines...) }
}

// withProvider adds lines ("key: value") under the fake EC2 provider.
func withProvider(lines ...string) burstOption {
	return func(b *burstConfig) { b.provider = append(b.provider, lines...) }
}

// withConfig adds top-level config.
func withConfig(extra string) burstOption {
	return func(b *burstConfig) { b.extra += extra }
}

// String is the config text newCluster adds to its own.
func (b *burstConfig) String() string {
	var s strings.Builder
	fmt.Fprintf(&s, `billing:
  slice: 1s
  onprem:
    rates:
      H100: [{perGPUHour: "%s"}]
burst:
  interval: 300ms
  minWait: 2s
  idleTTL: %s
  reconcileEvery: 2s
  agentGPUs: sim
  remoteDir: %s/opt%s
  agentDataDir: %s/data%s
`, b.rate, b.idleTTL, b.remote, b.dirs, b.remote, b.dirs)
	for _, l := range b.burst {
		s.WriteString("  " + l + "\n")
	}
	fmt.Fprintf(&s, `providers:
  - aws:
      name: aws-fake
      region: us-east-1
      endpoint: %s
      imageId: ami-0gpu
      sshUser: root
      sshPort: %d
`, b.ec2.URL, b.ec2.SSHPort())
	for _, l := range b.provider {
		s.WriteString("      " + l + "\n")
	}
	s.WriteString("      instanceTypes:\n")
	for _, ty := range b.types {
		s.WriteString("        - " + ty + "\n")
	}
	s.WriteString(b.extra)
	return s.String()
}

// burstCluster is a broker on the burst config (burstConfig) with the fake
// EC2 and remote, the fake machines' directory from burstHostDir, and a
// global budget of 100.
func burstCluster(t *testing.T, ec2 *fakecloud.EC2, remote string, opts ...burstOption) *cluster {
	t.Helper()
	b := &burstConfig{ec2: ec2, remote: remote, rate: "2.00", idleTTL: "4s", types: []string{g6xlarge}}
	for _, o := range opts {
		o(b)
	}
	c := newCluster(t, b.String())
	if _, _, code := c.cli(tokAdmin, "budget", "set", "--global", "100"); code != 0 {
		t.Fatal("budget set failed")
	}
	return c
}

// holdCard takes an on-prem card: token's job, named name, holds one GPU
// until released and never bursts. It runs when holdCard returns. release
// ends it; it is also called at cleanup.
func (c *cluster) holdCard(token, name string) (hold *broker.Job, release func()) {
	c.t.Helper()
	file := filepath.Join(c.dir, "release-"+name)
	release = func() {
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			c.t.Error(err)
		}
	}
	hold, err := c.client(token).SubmitSpec(context.Background(), broker.Spec{Name: name, Burst: broker.BurstNever,
		Resources: broker.Resources{GPUs: 1}, Timeout: broker.Duration(10 * time.Minute),
		Command: []string{"sh", "-c", "while [ ! -e " + file + " ]; do sleep 0.1; done"}})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(release)
	c.waitJob(hold.ID, 30*time.Second, "running", func(s string) bool { return s == "running" })
	return hold, release
}

func burstJobTail(t *testing.T, c *cluster, ec2 *fakecloud.EC2) {
	ctx := context.Background()
	out, errOut, code := c.cli(tokAlice, "run", "--gpus", "1", "--time", "5m", "--wait", "--",
		"sh", "-c", "echo running on $(hostname) with $CUDA_VISIBLE_DEVICES; sleep 2")
	if code != 0 {
		t.Fatalf("burst job: exit %d\nstdout %s\nstderr %s", code, out, errOut)
	}
	t.Logf("spillway run --wait printed:\n%s", errOut)
	for _, step := range []string{"before bursting", "burst in progress", "provisioning"} {
		if !strings.Contains(errOut, step) {
			t.Errorf("run --wait did not show %q:\n%s", step, errOut)
		}
	}
	if !regexp.MustCompile(`with GPU-[0-9a-f-]+`).MatchString(out) {
		t.Fatalf("job output %q", out)
	}
	insts, err := c.client(tokAdmin).Instances(ctx)
	if err != nil || len(insts) != 1 {
		t.Fatalf("instances %v %v", insts, err)
	}
	id := insts[0].ID
	descr, _, _ := c.cli(tokAdmin, "instances", "describe", id)
	for _, want := range []string{"upload", "registered", "host key SHA256:"} {
		if !strings.Contains(descr, want) {
			t.Errorf("describe lacks %q:\n%s", want, descr)
		}
	}
	// Idle, then deleted.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		v, err := c.client(tokAdmin).Instance(ctx, id)
		if err == nil && v.State == "terminated" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	v, _ := c.client(tokAdmin).Instance(ctx, id)
	if v.State != "terminated" {
		t.Fatalf("machine %s did not end: %s %s", id, v.State, v.Reason)
	}
	if ec2.Calls("TerminateInstances") == 0 {
		t.Fatal("no TerminateInstances call")
	}
	c.waitMachineMetered(id)
	rep, err := c.client(tokAdmin).Usage(ctx, client.BillingQuery{By: "pool-kind,kind"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, row := range rep.Rows {
		got[strings.Join(row.Key, "/")] = row.GPUMillis
	}
	if got["cloud/usage"] < 2000 || got["cloud/overhead"] < 2000 {
		t.Fatalf("ledger by pool kind and kind: %v", got)
	}
	bs, err := c.client(tokAdmin).Budgets(ctx)
	if err != nil || len(bs) != 1 || bs[0].Spent <= 0 || bs[0].Reserved != 0 {
		t.Fatalf("budget after the burst: %+v %v", bs, err)
	}
	var cloudCost billing.Amount
	for _, row := range rep.Rows {
		if row.Key[0] == "cloud" {
			cloudCost += row.Cost
		}
	}
	if bs[0].Spent != cloudCost {
		t.Fatalf("budget spent %s, ledger cloud cost %s", bs[0].Spent, cloudCost)
	}
}

// TestBurstHostKeySwapped: the machine answers SSH with a host key other
// than the one the cloud's console output vouches for. Nothing runs on it
// (no login is accepted, the remote dir is never made), the record fails
// with the reason, the machine is deleted, and the job goes back to the
// queue.
func TestBurstHostKeySwapped(t *testing.T) {
	fakecloudtest.RequireSSHD(t)
	ec2 := fakecloudtest.NewEC2(t, fakecloud.EC2Options{SSHD: true, BootTime: 1500 * time.Millisecond})
	remote := burstHostDir(t)
	c := burstCluster(t, ec2, remote)
	ctx := context.Background()
	// No owned cards at all: the job bursts as soon as it has waited.
	j, err := c.client(tokAlice).SubmitSpec(ctx, broker.Spec{Resources: broker.Resources{GPUs: 1}, Timeout: broker.Duration(time.Minute),
		Command: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	// While the instance boots, its console starts vouching for another key.
	deadline := time.Now().Add(20 * time.Second)
	for len(ec2.Instances()) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if len(ec2.Instances()) == 0 {
		t.Fatal("no instance launched")
	}
	_, bogus, err := fakecloud.GenerateHostKey()
	if err != nil {
		t.Fatal(err)
	}
	inst := ec2.Instances()[0]
	ec2.PublishHostKey(inst.ID, bogus)
	for time.Now().Before(deadline.Add(20 * time.Second)) {
		list, _ := c.client(tokAdmin).Instances(ctx)
		if len(list) == 1 && list[0].State == "failed" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	list, _ := c.client(tokAdmin).Instances(ctx)
	if len(list) != 1 || list[0].State != "failed" || !strings.Contains(list[0].Reason, "host key mismatch") {
		t.Fatalf("instances %+v", list)
	}
	if ec2.Calls("TerminateInstances") == 0 {
		t.Fatal("the machine was not deleted")
	}
	if _, err := os.Stat(filepath.Join(remote, "opt")); err == nil {
		t.Fatal("the bootstrap made its remote dir on a machine whose host key did not match")
	}
	if log := inst.SSHD.Log(); strings.Contains(log, "Accepted publickey") {
		t.Fatalf("sshd accepted a login:\n%s", log)
	}
	got, _ := c.client(tokAlice).Job(ctx, j.ID)
	if got.State != broker.StatePending && got.State != broker.StateProvisioning {
		t.Fatalf("job %s after the failed burst", got.State)
	}
}

// burstHostDir sets the fake EC2's AWS credentials and returns a directory
// for the fake machines' files. At cleanup every process under it is
// stopped, and gone before the directory is removed: fake machines stop
// their sshd only, and the agent the bootstrap started in a session of its
// own would live on.
func burstHostDir(t *testing.T) string {
	t.Helper()
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDFAKE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "fake-secret")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	remote := t.TempDir()
	t.Cleanup(func() {
		_ = exec.Command("pkill", "-f", remote).Run()
		deadline := time.Now().Add(30 * time.Second)
		for exec.Command("pgrep", "-f", remote).Run() == nil {
			if time.Now().After(deadline) {
				t.Logf("processes under %s outlived SIGTERM by 30s; killing them", remote)
				_ = exec.Command("pkill", "-KILL", "-f", remote).Run()
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	return remote
}

// s3Credentials writes the versitygw keys as a shared credentials file in
// dir, as agents on a machine without an instance role read them (burst
// agents get it through the bootstrap), and returns its path.
func s3Credentials(t *testing.T, dir string) string {
	t.Helper()
	creds := filepath.Join(dir, "s3-credentials")
	if err := os.WriteFile(creds, []byte(fmt.Sprintf("[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n",
		s3server.AccessKey, s3server.SecretKey)), 0o600); err != nil {
		t.Fatal(err)
	}
	return creds
}
