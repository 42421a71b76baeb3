package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker/client"
	"github.com/spillway-dev/spillway/providers/fakecloud"
	"github.com/spillway-dev/spillway/providers/fakecloud/fakecloudtest"
)

// slurmBins are the Debian slurm-wlm and munge programs the Slurm test runs.
var slurmBins = []string{"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/slurmdbd", "/usr/sbin/munged", "/usr/bin/munge",
	"/usr/bin/sbatch", "/usr/bin/squeue", "/usr/bin/scontrol", "/usr/bin/sinfo", "/usr/bin/sacct", "/usr/bin/sacctmgr",
	"/usr/sbin/mariadbd", "/usr/bin/mariadb-install-db"}

// requireSlurm skips the test without Slurm or root (slurmctld and slurmd
// run as root in a temp dir), or fails it under CI=true: CI must run it.
func requireSlurm(t *testing.T) {
	t.Helper()
	var missing []string
	for _, b := range slurmBins {
		if _, err := os.Stat(b); err != nil {
			missing = append(missing, b)
		}
	}
	msg := ""
	switch {
	case len(missing) > 0:
		msg = "missing " + strings.Join(missing, ", ") + ": apt-get install -y slurm-wlm slurmdbd munge mariadb-server (or run .ci/run)"
	case os.Geteuid() != 0:
		msg = "the Slurm test runs slurmctld and slurmd as root; run it as root"
	default:
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// slurmSite is a Slurm cluster of its own in a temp dir: munged,
// slurmctld, and the ports, spool and state of two CLOUD nodes whose
// slurmd the broker starts on the fake cloud's machines.
type slurmSite struct {
	t    *testing.T
	dir  string
	conf string
	env  []string
	// dbPort is the MariaDB port behind slurmdbd.
	dbPort int
}

func (s *slurmSite) path(p string) string { return filepath.Join(s.dir, p) }

// run runs a Slurm client command against the site.
func (s *slurmSite) run(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), s.env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, errb.String())
	}
	return out.String(), nil
}

func freeTCPPort(t *testing.T) int {
	_, p, _ := net.SplitHostPort(freePort(t))
	n, _ := strconv.Atoi(p)
	return n
}

// newSlurmSite writes the site's config and starts munged. ResumeProgram
// and SuspendProgram are wrappers that run `spillway slurm resume|suspend`
// with the CLI config cliConfig (written later, once the broker is up).
func newSlurmSite(t *testing.T, cliConfig string) *slurmSite {
	t.Helper()
	// A short path: munge's socket path must fit in sun_path.
	dir, err := os.MkdirTemp("", "spw-slurm-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := &slurmSite{t: t, dir: dir, conf: filepath.Join(dir, "slurm.conf")}
	s.env = []string{"SLURM_CONF=" + s.conf}
	for _, d := range []string{"state", "spool", "log", "gpu", "munge", "db"} {
		if err := os.MkdirAll(s.path(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	key := make([]byte, 1024)
	_, _ = rand.Read(key)
	if err := os.WriteFile(s.path("munge/munge.key"), key, 0o400); err != nil {
		t.Fatal(err)
	}
	sock := s.path("munge/sock")
	out, err := exec.Command("/usr/sbin/munged", "--force", "--socket="+sock, "--key-file="+s.path("munge/munge.key"),
		"--pid-file="+sock+".pid", "--log-file="+s.path("log/munged.log"), "--seed-file="+s.path("munge/seed")).CombinedOutput()
	if err != nil {
		t.Fatalf("munged: %v: %s", err, out)
	}
	t.Cleanup(func() {
		killPidFile(sock + ".pid")
		if !t.Failed() {
			os.RemoveAll(dir)
		}
	})
	host, _ := os.Hostname()
	ctlPort, dbdPort, dbPort := freeTCPPort(t), freeTCPPort(t), freeTCPPort(t)
	var nodes strings.Builder
	var gres strings.Builder
	for i := 1; i <= 2; i++ {
		name := fmt.Sprintf("burst-%d", i)
		fmt.Fprintf(&nodes, "NodeName=%s NodeHostname=%s Port=%d CPUs=1 RealMemory=500 Gres=gpu:1 Feature=l4 State=CLOUD\n", name, host, freeTCPPort(t))
		// Slurm 22.05 needs File= for a GPU gres; a regular file stands in
		// for /dev/nvidia0, and no GPU is touched.
		gpu := s.path("gpu/" + name + "-nvidia0")
		if err := os.WriteFile(gpu, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&gres, "NodeName=%s Name=gpu File=%s\n", name, gpu)
	}
	conf := fmt.Sprintf(`ClusterName=spwtest
SlurmctldHost=%[2]s(127.0.0.1)
SlurmctldPort=%[3]d
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=%[1]s/munge/sock
CredType=cred/munge
StateSaveLocation=%[1]s/state
SlurmdSpoolDir=%[1]s/spool/%%n
SlurmctldPidFile=%[1]s/slurmctld.pid
SlurmdPidFile=%[1]s/slurmd-%%n.pid
SlurmctldLogFile=%[1]s/log/slurmctld.log
SlurmdLogFile=%[1]s/log/slurmd-%%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=%[5]d
AccountingStoragePass=%[1]s/munge/sock
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=600
GresTypes=gpu
ResumeProgram=%[1]s/resume.sh
SuspendProgram=%[1]s/suspend.sh
ResumeTimeout=60
SuspendTime=5
SuspendTimeout=10
ResumeRate=0
SuspendRate=0
SlurmctldTimeout=10
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
TreeWidth=65533
%[4]sPartitionName=burst Nodes=burst-[1-2] Default=YES MaxTime=10 State=UP
`, dir, host, ctlPort, nodes.String(), dbdPort)
	if err := os.WriteFile(s.conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.path("gres.conf"), []byte(gres.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	// slurmdbd, for sacct, on a MariaDB of its own.
	dbd := fmt.Sprintf(`DbdAddr=127.0.0.1
DbdHost=localhost
DbdPort=%[2]d
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=%[1]s/munge/sock
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=%[3]d
StorageUser=root
StorageLoc=spw_acct
PidFile=%[1]s/slurmdbd.pid
LogFile=%[1]s/log/slurmdbd.log
`, dir, dbdPort, dbPort)
	if err := os.WriteFile(s.path("slurmdbd.conf"), []byte(dbd), 0o600); err != nil {
		t.Fatal(err)
	}
	s.dbPort = dbPort
	for _, verb := range []string{"resume", "suspend"} {
		script := fmt.Sprintf("#!/bin/sh\necho \"$(date +%%T) %s $*\" >> %s/log/programs.log\nSPILLWAY_CONFIG=%s exec %s slurm %s \"$@\" >> %s/log/programs.log 2>&1\n",
			verb, dir, cliConfig, bin, verb, dir)
		if err := os.WriteFile(s.path(verb+".sh"), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// start runs MariaDB and slurmdbd, registers the cluster, then runs
// slurmctld (fresh state) and waits for it to answer.
func (s *slurmSite) start() {
	t := s.t
	t.Helper()
	data := s.path("db/data")
	if out, err := exec.Command("/usr/bin/mariadb-install-db", "--no-defaults", "--datadir="+data, "--user=root",
		"--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v: %s", err, out)
	}
	db := exec.Command("/usr/sbin/mariadbd", "--no-defaults", "--datadir="+data, "--socket="+s.path("db/sock"),
		"--port="+strconv.Itoa(s.dbPort), "--bind-address=127.0.0.1", "--user=root", "--skip-grant-tables",
		"--pid-file="+s.path("db/pid"), "--log-error="+s.path("log/mariadb.log"), "--innodb-buffer-pool-size=16M", "--skip-log-bin")
	db.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := db.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = db.Process.Signal(syscall.SIGTERM)
		_ = db.Wait()
	})
	waitFor(t, 30*time.Second, "MariaDB listens", func() bool {
		conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", s.dbPort))
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
	dbd := exec.Command("/usr/sbin/slurmdbd")
	dbd.Env = append(os.Environ(), s.env...)
	if out, err := dbd.CombinedOutput(); err != nil {
		t.Fatalf("slurmdbd: %v: %s", err, out)
	}
	t.Cleanup(func() { killPidFile(s.path("slurmdbd.pid")) })
	waitFor(t, 30*time.Second, "slurmdbd registers the cluster", func() bool {
		_, err := s.run("sacctmgr", "-i", "add", "cluster", "spwtest")
		return err == nil
	})
	cmd := exec.Command("/usr/sbin/slurmctld", "-i")
	cmd.Env = append(os.Environ(), s.env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("slurmctld: %v: %s", err, out)
	}
	t.Cleanup(func() {
		killPidFile(s.path("slurmctld.pid"))
		if t.Failed() {
			for _, f := range []string{"log/slurmdbd.log", "log/slurmctld.log", "log/programs.log", "log/slurmd-burst-1.log", "log/slurmd-burst-2.log", "log/munged.log"} {
				raw, _ := os.ReadFile(s.path(f))
				t.Logf("--- %s (last 6000 bytes) ---\n%s", f, tailBytes(raw, 6000))
			}
		}
	})
	waitFor(t, 30*time.Second, "slurmctld answers", func() bool {
		_, err := s.run("scontrol", "ping")
		return err == nil
	})
}

func tailBytes(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// killPidFile ends the process a pid file names and waits for it.
func killPidFile(path string) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || pid <= 1 {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for i := 0; i < 50 && syscall.Kill(pid, 0) == nil; i++ {
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting until %s", within, what)
}

// TestSlurmBurst is Spillway as Slurm's burst provider with a real Slurm:
// a partition of two CLOUD nodes; sbatch on it makes slurmctld run
// `spillway slurm resume`; the broker launches a fake EC2 machine (a real
// sshd), bootstraps slurmd there over SSH with the host key checked, and
// sets the node's address; the job runs on the burst node; after
// SuspendTime slurmctld runs `spillway slurm suspend` and the machine is
// deleted; the ledger carries the Slurm job id. Then a budget that is
// spent: the node goes DOWN with the reason, the job stays pending with
// it, and nothing leaks.
func TestSlurmBurst(t *testing.T) {
	requireSlurm(t)
	fakecloudtest.RequireSSHD(t)
	ec2 := fakecloudtest.NewEC2(t, fakecloud.EC2Options{SSHD: true, BootTime: 200 * time.Millisecond})
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDFAKE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "fake-secret")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	cliConfig := filepath.Join(t.TempDir(), "cli.yaml")
	site := newSlurmSite(t, cliConfig)
	remote := site.path("remote")
	t.Cleanup(func() {
		// The fake machines stop their sshd only; a slurmd the bootstrap
		// started would live on.
		for _, n := range []string{"burst-1", "burst-2"} {
			killPidFile(filepath.Join(remote, "slurmd-"+n+".pid"))
		}
	})
	c := newCluster(t, fmt.Sprintf(`billing:
  slice: 1s
burst:
  interval: 300ms
  reconcileEvery: 1s
  orphanGrace: 1s
  remoteDir: %[1]s
providers:
  - aws:
      name: aws-fake
      region: us-east-1
      endpoint: %[2]s
      imageId: ami-0gpu
      sshUser: root
      sshPort: %[3]d
      instanceTypes:
        - {name: g6.xlarge, gpuModel: L4, gpus: 1, gpuMemoryGiB: 24, cpus: 4, memoryGiB: 16, onDemandPrice: "0.805"}
slurm:
  team: nlp
  env: [SLURM_CONF=%[4]s]
  pollEvery: 300ms
  registerTimeout: 50s
  node:
    mungeKeyFile: %[5]s/munge/munge.key
    mungeKeyPath: %[5]s/munge/munge.key
    mungeSocket: %[5]s/munge/sock
    configFiles: [%[4]s, %[5]s/gres.conf]
    slurmdArgs: ["-b"]
  nodes:
    - {partition: burst, feature: l4, offers: [{provider: aws-fake, gpuModel: L4}]}
`, remote, ec2.URL, ec2.SSHPort(), site.conf, site.dir))
	if err := os.WriteFile(cliConfig, []byte(fmt.Sprintf("server: %s\ntoken: %s\n", c.url, tokAdmin)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"budget", "set", "--global", "100"}, {"budget", "set", "--team", "nlp", "50"}} {
		if out, errOut, code := c.cli(tokAdmin, args...); code != 0 {
			t.Fatalf("%v: %s %s", args, out, errOut)
		}
	}
	site.start()
	ctx := context.Background()
	admin := c.client(tokAdmin)

	// 1. A job on the burst partition resumes a node through the broker.
	out, err := site.run("sbatch", "--parsable", "-p", "burst", "--gres=gpu:1", "-o", site.path("job-%j.out"), "--wrap", "hostname; sleep 2")
	if err != nil {
		t.Fatal(err)
	}
	jobID := strings.TrimSpace(out)
	t.Logf("sbatch: job %s", jobID)
	var state string
	waitFor(t, 75*time.Second, "job "+jobID+" completed", func() bool {
		out, _ := site.run("squeue", "-h", "-t", "all", "-j", jobID, "-o", "%T|%N|%r")
		state = strings.TrimSpace(out)
		return strings.HasPrefix(state, "COMPLETED") || strings.HasPrefix(state, "FAILED")
	})
	if !strings.HasPrefix(state, "COMPLETED|burst-") {
		t.Fatalf("job %s: %s", jobID, state)
	}
	node := strings.Split(state, "|")[1]
	if raw, err := os.ReadFile(site.path("job-" + jobID + ".out")); err != nil || len(bytes.TrimSpace(raw)) == 0 {
		t.Fatalf("job output: %q %v", raw, err)
	}
	insts, err := admin.Instances(ctx)
	if err != nil || len(insts) != 1 {
		t.Fatalf("instances: %+v %v", insts, err)
	}
	rec := insts[0]
	descr, _, _ := c.cli(tokAdmin, "instances", "describe", rec.ID)
	for _, want := range []string{"munge key", "start slurmd", "host key SHA256:", "slurmd " + node + " registered"} {
		if !strings.Contains(descr, want) {
			t.Errorf("describe %s lacks %q:\n%s", rec.ID, want, descr)
		}
	}
	if rec.ReadyAt != nil {
		t.Logf("record %s: resume to slurmd registered in %s", rec.ID, rec.ReadyAt.Sub(rec.CreatedAt).Round(time.Millisecond))
	}
	if ec2.Calls("RunInstances") != 1 {
		t.Errorf("RunInstances called %d times", ec2.Calls("RunInstances"))
	}

	// 2. Idle past SuspendTime: slurmctld suspends the node, the machine goes.
	waitFor(t, 60*time.Second, "the burst machine is deleted", func() bool {
		v, err := admin.Instance(ctx, rec.ID)
		return err == nil && v.State == "terminated"
	})
	if ec2.Calls("TerminateInstances") == 0 {
		t.Fatal("no TerminateInstances call")
	}

	// 3. The ledger has the Slurm job on the rented machine.
	waitFor(t, 20*time.Second, "the ledger has slurm:"+jobID, func() bool {
		rep, err := admin.Usage(ctx, client.BillingQuery{By: "job,project,pool-kind,kind"})
		if err != nil {
			return false
		}
		for _, row := range rep.Rows {
			if row.Key[0] == "slurm:"+jobID && row.Key[2] == "cloud" && row.Key[3] == "usage" && row.GPUMillis > 0 {
				return true
			}
		}
		return false
	})

	// 4. The team's budget is spent: the next resume is refused, the node
	// goes DOWN with the reason, the job stays pending with it.
	if out, errOut, code := c.cli(tokAdmin, "budget", "set", "--team", "nlp", "0.01"); code != 0 {
		t.Fatalf("budget set: %s %s", out, errOut)
	}
	out, err = site.run("sbatch", "--parsable", "-p", "burst", "--gres=gpu:1", "-o", site.path("job-%j.out"), "--wrap", "hostname")
	if err != nil {
		t.Fatal(err)
	}
	job2 := strings.TrimSpace(out)
	const why = "spillway: budget nlp exhausted"
	waitFor(t, 30*time.Second, "sinfo -R shows "+why, func() bool {
		out, _ := site.run("sinfo", "-R", "-h", "-o", "%E|%N")
		return strings.Contains(out, why)
	})
	waitFor(t, 20*time.Second, "job "+job2+" pending with the reason", func() bool {
		out, _ := site.run("squeue", "-h", "-j", job2, "-o", "%T|%r|%k")
		state = strings.TrimSpace(out)
		return strings.HasPrefix(state, "PENDING|") && strings.Contains(state, why)
	})
	t.Logf("refused job: %s", state)
	sinfo, _ := site.run("sinfo", "-R", "-o", "%50E %10T %N")
	t.Logf("sinfo -R:\n%s", sinfo)

	// 5. Nothing leaks: after a reconcile no machine runs, no record is
	// open, nothing stays reserved.
	lists := ec2.Calls("DescribeInstances")
	waitFor(t, 30*time.Second, "two reconciles list the machines", func() bool { return ec2.Calls("DescribeInstances") >= lists+2 })
	for _, in := range ec2.Instances() {
		if in.State != "terminated" {
			t.Errorf("instance %s is %s", in.ID, in.State)
		}
	}
	insts, _ = admin.Instances(ctx)
	for _, v := range insts {
		if v.State != "terminated" && v.State != "failed" {
			t.Errorf("record %s is %s", v.ID, v.State)
		}
	}
	budgets, err := admin.Budgets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range budgets {
		if b.Reserved != 0 {
			t.Errorf("budget %s still reserves %s", b.Scope, b.Reserved)
		}
	}
	_, _ = site.run("scancel", job2)

	// 6. The site's accounting of this test replays in the simulator.
	var dump string
	waitFor(t, 30*time.Second, "sacct has job "+jobID+" completed", func() bool {
		dump, _ = site.run("sacct", "--parsable2", "-a", "-X", "-S", "now-1hour", "-o", "JobID,Submit,Start,End,AllocTRES,Account,Partition,State")
		return strings.Contains(dump, "\n"+jobID+"|") && strings.Contains(dump, "|COMPLETED")
	})
	t.Logf("sacct:\n%s", dump)
	trace := filepath.Join(c.dir, "sacct.txt")
	cluster := filepath.Join(c.dir, "sim-cluster.yaml")
	if err := os.WriteFile(trace, []byte(dump), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cluster, []byte("nodes:\n  - {name: onprem, count: 1, gpus: 1, model: L4, memory: 24Gi}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	simOut, simErr, code := c.cli(tokAdmin, "sim", "--trace", trace, "--format", "sacct", "--cluster", cluster, "-o", "json")
	if code != 0 {
		t.Fatalf("spillway sim --format sacct: exit %d\n%s\n%s", code, simOut, simErr)
	}
	var rep struct {
		Trace struct {
			Jobs int `json:"jobs"`
		} `json:"trace"`
		Results []struct {
			Policy    string `json:"policy"`
			Jobs      int    `json:"jobs"`
			Succeeded int    `json:"succeeded"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(simOut), &rep); err != nil {
		t.Fatalf("sim output: %v\n%s", err, simOut)
	}
	// Every allocation that started with a GPU is a job of the trace.
	want := 0
	for _, line := range strings.Split(dump, "\n") {
		if f := strings.Split(line, "|"); len(f) == 8 && f[2] != "Unknown" && f[2] != "Start" && strings.Contains(f[4], "gres/gpu=") {
			want++
		}
	}
	if rep.Trace.Jobs != want || want == 0 || len(rep.Results) == 0 {
		t.Fatalf("sim replayed %d jobs, the dump has %d:\n%s", rep.Trace.Jobs, want, tailBytes([]byte(simOut), 2000))
	}
	for _, r := range rep.Results {
		if r.Jobs != want || r.Succeeded != want {
			t.Errorf("policy %s: %d jobs, %d succeeded, want %d", r.Policy, r.Jobs, r.Succeeded, want)
		}
	}
	t.Logf("spillway sim --format sacct replayed %d jobs under %d policies", want, len(rep.Results))
}
