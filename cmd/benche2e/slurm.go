package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The Slurm side of the comparison (-system slurm): the same workload
// file, the same submit times and the same jobs (`sleep duration_s`, or
// `/bin/true` for a zero-length job), on a Slurm of its own: munged,
// slurmctld and one slurmd per simulated node with -gpus GPUs each, all on
// this machine, as the Slurm figures of issue 20 were taken. Each class is
// a partition over every node (high, medium, low by PriorityTier); with
// -preemptible-low the low partition's jobs are requeued for the others'
// (preempt/partition_prio), as Spillway preempts preemptible jobs of a
// lower class. The tuning is SchedMD's advice for many short jobs, kept
// to what does not delay a start: no accounting, no cgroups, backfill
// every second at one-second resolution, event-driven scheduling over the
// whole queue.
//
// Each job's batch script appends "start", "end" (or "stop" when Slurm
// signals it to requeue) and the time to a file of its own, so waits and
// run times come from the processes, as Spillway's come from its agents'
// reports.

// slurmConf is the cluster's slurm.conf: %[1]s the site's directory,
// %[2]s this host's name, %[3]d slurmctld's port, %[4]s the node lines,
// %[5]s the preemption settings, %[6]s the low partition's PreemptMode,
// %[7]s the node list.
const slurmConf = `ClusterName=bench
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
SlurmctldDebug=error
SlurmdDebug=error
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,bf_resolution=1,bf_continue,bf_max_job_test=5000,default_queue_depth=5000,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
PriorityType=priority/basic
%[5]s
GresTypes=gpu
ReturnToService=2
MaxJobCount=100000
MaxArraySize=100000
MinJobAge=60
MessageTimeout=30
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=120
TreeWidth=65533
%[4]sPartitionName=high Nodes=%[7]s PriorityTier=3 PreemptMode=OFF MaxTime=UNLIMITED State=UP
PartitionName=medium Nodes=%[7]s PriorityTier=2 PreemptMode=OFF MaxTime=UNLIMITED State=UP Default=YES
PartitionName=low Nodes=%[7]s PriorityTier=1 PreemptMode=%[6]s MaxTime=UNLIMITED State=UP
`

// slurmJobScript is every job's batch script; $1 is its duration in
// seconds and its record is DIR/out/NAME.TASK.
const slurmJobScript = `#!/bin/bash
f=%[1]s/out/$SLURM_JOB_NAME.${SLURM_ARRAY_TASK_ID:-x}
echo "start $EPOCHREALTIME" >> "$f"
trap 'echo "stop $EPOCHREALTIME" >> "$f"; exit 143' TERM
if [ "$1" = 0 ]; then /bin/true; else sleep "$1" & wait $!; fi
echo "end $EPOCHREALTIME" >> "$f"
`

// slurmOnly rejects the flags that mean something to Spillway only.
func (o options) slurmOnly() error {
	var bad []string
	for flag, set := range map[string]bool{
		"-team-quota": o.teamQuota > 0, "-high-reserved": o.highReserved > 0, "-fifo": o.fifo, "-preemption-limit": o.preemptLimit > 0, "-history": o.historyOut != "",
		"-trace": o.traceFile != "", "-regions": o.regions, "-agent-bin": o.agentBin != "",
		"-agent-profile": o.agentProfile != "", "-cpuprofile": o.cpuProfile != "", "-mutexprofile": o.mutexProfile != "",
	} {
		if set {
			bad = append(bad, flag)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("-system slurm: %s apply to Spillway only", strings.Join(bad, ", "))
	}
	return nil
}

// slurmSite is the running Slurm.
type slurmSite struct {
	dir   string
	env   []string
	nodes []string
}

func (s *slurmSite) path(p string) string { return filepath.Join(s.dir, p) }

// run runs a Slurm command against the site.
func (s *slurmSite) run(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), s.env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// freePort is a TCP port free on 127.0.0.1 now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startSlurm(o options) (s *slurmSite, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("-system slurm runs slurmctld and slurmd as root: run it as root")
	}
	for _, b := range []string{"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged"} {
		if _, err := os.Stat(b); err != nil {
			return nil, fmt.Errorf("-system slurm needs %s (apt-get install slurmctld slurmd slurm-client munge)", b)
		}
	}
	for _, b := range []string{"sbatch", "squeue", "scontrol", "sinfo", "scancel"} {
		if _, err := exec.LookPath(b); err != nil {
			return nil, fmt.Errorf("-system slurm needs %s on PATH (apt-get install slurm-client)", b)
		}
	}
	// A short path: munge's socket path must fit in sun_path.
	dir, err := os.MkdirTemp("", "spw-bench-slurm-")
	if err != nil {
		return nil, err
	}
	s = &slurmSite{dir: dir, env: []string{"SLURM_CONF=" + filepath.Join(dir, "slurm.conf")}}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w (logs in %s)", err, dir)
			s.stop(false)
		}
	}()
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	for _, d := range []string{"state", "spool", "log", "gpu", "munge", "out"} {
		if err := os.MkdirAll(s.path(d), 0o755); err != nil {
			return nil, err
		}
	}
	key := make([]byte, 1024)
	_, _ = rand.Read(key)
	if err := os.WriteFile(s.path("munge/munge.key"), key, 0o400); err != nil {
		return nil, err
	}
	sock := s.path("munge/sock")
	if out, err := exec.Command("/usr/sbin/munged", "--force", "--socket="+sock, "--key-file="+s.path("munge/munge.key"),
		"--pid-file="+sock+".pid", "--log-file="+s.path("log/munged.log"), "--seed-file="+s.path("munge/seed")).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("munged: %v: %s", err, out)
	}
	host, _ := os.Hostname()
	ctlPort, err := freePort()
	if err != nil {
		return nil, err
	}
	var nodes, gres strings.Builder
	for i := range o.agents {
		name := fmt.Sprintf("sim-%02d", i+1)
		s.nodes = append(s.nodes, name)
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&nodes, "NodeName=%s NodeHostname=%s NodeAddr=127.0.0.1 Port=%d CPUs=64 Boards=1 SocketsPerBoard=1 CoresPerSocket=64 ThreadsPerCore=1 RealMemory=64000 Gres=gpu:%d State=UNKNOWN\n",
			name, host, port, o.gpusPerAgent)
		// Slurm 22.05 needs File= for a GPU gres; regular files stand in
		// for /dev/nvidia*, and no GPU is touched.
		for k := range o.gpusPerAgent {
			if err := os.WriteFile(s.path(fmt.Sprintf("gpu/%s-nvidia%d", name, k)), nil, 0o644); err != nil {
				return nil, err
			}
		}
		fmt.Fprintf(&gres, "NodeName=%s Name=gpu File=%s/gpu/%s-nvidia[0-%d]\n", name, dir, name, o.gpusPerAgent-1)
	}
	preempt, lowMode := "PreemptType=preempt/none\nPreemptMode=OFF", "OFF"
	if o.preemptLow {
		preempt, lowMode = "PreemptType=preempt/partition_prio\nPreemptMode=REQUEUE", "REQUEUE"
	}
	conf := fmt.Sprintf(slurmConf, dir, host, ctlPort, nodes.String(), preempt, lowMode, strings.Join(s.nodes, ","))
	for name, text := range map[string]string{"slurm.conf": conf, "gres.conf": gres.String(),
		"job.sh": fmt.Sprintf(slurmJobScript, dir)} {
		if err := os.WriteFile(s.path(name), []byte(text), 0o755); err != nil {
			return nil, err
		}
	}
	if _, err := s.run("/usr/sbin/slurmctld", "-i"); err != nil {
		return nil, err
	}
	for _, n := range s.nodes {
		if _, err := s.run("/usr/sbin/slurmd", "-N", n); err != nil {
			return nil, err
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		out, err := s.run("sinfo", "-h", "-N", "-p", "medium", "-o", "%N %T")
		idle := 0
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[1] == "idle" {
				idle++
			}
		}
		if err == nil && idle == len(s.nodes) {
			return s, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("only %d of %d slurmd idle within 60 s (sinfo: %v %s)", idle, len(s.nodes), err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pids are the site's daemons: slurmctld and every slurmd.
func (s *slurmSite) pids() []int {
	files := []string{s.path("slurmctld.pid")}
	for _, n := range s.nodes {
		files = append(files, s.path("slurmd-"+n+".pid"))
	}
	var out []int
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}

// daemonCPU is the user and system CPU seconds of slurmctld and the
// slurmds so far (not their short-lived slurmstepd).
func (s *slurmSite) daemonCPU() float64 {
	own, _ := pidsCPU(s.pids())
	return own
}

// stop cancels what is left, stops the daemons and removes the site
// (kept, for its logs, when keep is set).
func (s *slurmSite) stop(keep bool) {
	// Cancelled jobs end through their slurmd: wait for the queue to
	// empty before the daemons go, or their slurmstepd outlive them.
	if _, err := s.run("scancel", "--full", "--partition=high,medium,low"); err == nil {
		for range 100 {
			if out, err := s.run("squeue", "-h", "-o", "%i"); err != nil || strings.TrimSpace(out) == "" {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	pids := s.pids()
	if b, err := os.ReadFile(s.path("munge/sock.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			pids = append(pids, pid)
		}
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	for i := 0; ; i++ {
		alive := pids[:0]
		for _, pid := range pids {
			if syscall.Kill(pid, 0) == nil {
				alive = append(alive, pid)
			}
		}
		pids = alive
		if len(pids) == 0 {
			break
		}
		if i == 50 {
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !keep {
		os.RemoveAll(s.dir)
	}
}

// sbatchArgs are one submission's arguments: the job (or array, with
// -array) named name, shaped like it.
func (s *slurmSite) sbatchArgs(it Item, o options, name, array string) []string {
	// Slurm's time limits are whole minutes: the declared timeout, as
	// Spillway's, rounded up to one.
	timeout := time.Duration(it.DurationS*float64(time.Second)) + o.timeoutSlack
	mins := max(1, int((timeout+time.Minute-1)/time.Minute))
	args := []string{"--parsable", "-J", name, "-p", it.Priority, fmt.Sprintf("--gres=gpu:%d", it.GPUs),
		"-n", "1", "-c", "1", fmt.Sprintf("--time=%d", mins), "-o", "/dev/null", "-e", "/dev/null"}
	if it.Priority == "low" && o.preemptLow {
		args = append(args, "--requeue")
	}
	if array != "" {
		args = append(args, "--array="+array)
	}
	return append(args, s.path("job.sh"), strconv.FormatFloat(it.DurationS, 'f', 3, 64))
}

// replaySlurm replays the workload on a Slurm of its own, as replay does
// on Spillway.
func replaySlurm(o options, items []Item) (*result, error) {
	s, err := startSlurm(o)
	if err != nil {
		return nil, err
	}
	keep := false
	defer func() { s.stop(keep) }()
	res := &result{cpuWhat: "slurmctld and slurmd"}
	var mu sync.Mutex
	var firstErr error
	submit := func(it Item, name, array string) {
		t := time.Now()
		_, err := s.run("sbatch", s.sbatchArgs(it, o, name, array)...)
		rtt := time.Since(t).Seconds()
		mu.Lock()
		defer mu.Unlock()
		if err != nil && firstErr == nil {
			firstErr = err
		}
		if array == "" {
			res.rtts = append(res.rtts, rtt)
		}
	}
	// Records: job i is "j<i>.x"; element k of the array whose first item
	// is i is "g<i>.<k>", item i+k.
	file := make([]string, len(items))
	cpu0 := s.daemonCPU()
	t0 := time.Now()
	res.t0 = t0
	for i := range items {
		file[i] = fmt.Sprintf("j%d.x", i)
	}
	res.calls = submitWorkload(o, items, t0, func(i int) { submit(items[i], fmt.Sprintf("j%d", i), "") }, func(i int, g []Item) {
		for k := range g {
			file[i+k] = fmt.Sprintf("g%d.%d", i, k)
		}
		submit(g[0], fmt.Sprintf("g%d", i), fmt.Sprintf("0-%d", len(g)-1))
	})
	res.submitS = time.Since(t0).Seconds()
	if firstErr != nil {
		keep = true
		return nil, firstErr
	}
	// Slurm starts some tens of jobs a second: 2,000 zero-length jobs take
	// minutes.
	deadline := time.Now().Add(time.Duration(lowerBound(items, o.agents*o.gpusPerAgent)*4)*time.Second + 15*time.Minute)
	for {
		out, err := s.run("squeue", "-h", "-o", "%i")
		if err == nil && strings.TrimSpace(out) == "" {
			break
		}
		if time.Now().After(deadline) {
			keep = true
			return nil, fmt.Errorf("jobs still queued or running at the deadline (squeue: %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	res.cpuS = s.daemonCPU() - cpu0
	res.out = make([]outcome, len(items))
	for i, it := range items {
		oc, err := readSlurmRecord(s.path("out/"+file[i]), it)
		if err != nil {
			keep = true
			return nil, err
		}
		res.out[i] = oc
	}
	return res, nil
}

// readSlurmRecord reads the lines one job's batch script wrote: "start T",
// then "end T" or "stop T", for each attempt.
func readSlurmRecord(path string, it Item) (outcome, error) {
	o := outcome{item: it, state: "never started"}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return o, nil
	}
	if err != nil {
		return o, err
	}
	defer f.Close()
	var from time.Time
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		word, val, ok := strings.Cut(sc.Text(), " ")
		sec, err := strconv.ParseFloat(val, 64)
		if !ok || err != nil {
			return o, fmt.Errorf("%s: bad line %q", path, sc.Text())
		}
		t := time.Unix(0, int64(sec*1e9))
		switch word {
		case "start":
			if !o.started {
				o.started, o.first = true, t
			}
			o.last, from = t, t
			o.attempts++
			o.state, o.ok = "running", false
		case "end", "stop":
			if !from.IsZero() {
				o.runS += t.Sub(from).Seconds()
			}
			from, o.end = time.Time{}, t
			o.ok = word == "end"
			o.state = map[bool]string{true: "completed", false: "stopped"}[o.ok]
		default:
			return o, fmt.Errorf("%s: bad line %q", path, sc.Text())
		}
	}
	return o, sc.Err()
}
