// Command benche2e replays a JSON-lines workload against a real broker
// (embedded bbolt store, the HTTP API on 127.0.0.1) with N simulated agents
// that run real processes, and prints jobs started per second, makespan
// against its lower bound, waits by priority class and GPU utilisation.
//
//	benche2e -workload deploy/bench/zero-2000.jsonl -mode parallel
//	benche2e -gen mixed > deploy/bench/mixed-500.jsonl
//
// Every workload line is {"id","submit_s","gpus","duration_s","priority",
// "team"}; a job of duration 0 runs `true`, any other `sleep duration_s`.
// Modes: sequential (one submitter, in submit order, each at its
// submit_s), parallel (-submitters goroutines taking jobs in order), array
// (one array submit per group of identical jobs submitted at the same
// time; each element is its own job).
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spillway-dev/spillway/broker/api"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/bolt"
	"github.com/spillway-dev/spillway/broker/client"
	"github.com/spillway-dev/spillway/broker/config"
	"github.com/spillway-dev/spillway/broker/server"
	"github.com/spillway-dev/spillway/onprem/agent"
	"github.com/spillway-dev/spillway/onprem/gpu/backends"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benche2e:", err)
		os.Exit(1)
	}
}

type options struct {
	system        string
	workload      string
	mode          string
	agents        int
	gpusPerAgent  int
	submitters    int
	preemptLow    bool
	timeoutSlack  time.Duration
	traceFile     string
	cpuProfile    string
	mutexProfile  string
	verbose       bool
	schedInterval time.Duration
	teamQuota     int
	highReserved  int
	fifo          bool
	preemptLimit  int
	regions       bool
	longRegion    time.Duration
	jobsOut       string
	historyOut    string
	agentBin      string
	agentProfile  string
	floor         int
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("benche2e", flag.ContinueOnError)
	var o options
	var gen string
	fs.StringVar(&gen, "gen", "", "write a standard workload to stdout instead: zero (2,000 zero-length 1-GPU jobs at t=0) or mixed (500 jobs, Poisson 5/s)")
	fs.StringVar(&o.workload, "workload", "", "JSON-lines workload file")
	fs.StringVar(&o.system, "system", "spillway", "what replays it: spillway (a broker and its agents), or slurm (slurmctld and one slurmd per agent with -gpus GPUs each, started in a temp dir; needs root, Debian's slurmctld, slurmd, slurm-client and munge)")
	fs.StringVar(&o.mode, "mode", "sequential", "sequential | parallel | array")
	fs.IntVar(&o.agents, "agents", 4, "simulated agents")
	fs.IntVar(&o.gpusPerAgent, "gpus", 8, "simulated GPUs per agent")
	fs.IntVar(&o.submitters, "submitters", 8, "submitters in parallel mode")
	fs.BoolVar(&o.preemptLow, "preemptible-low", false, "mark the workload's low-priority jobs preemptible")
	fs.DurationVar(&o.timeoutSlack, "timeout-slack", 5*time.Second, "declared timeout of a job: its duration plus this")
	fs.StringVar(&o.traceFile, "trace", "", "write a runtime/trace of the broker and agents here (go tool trace FILE)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the replay here (go tool pprof FILE)")
	fs.StringVar(&o.mutexProfile, "mutexprofile", "", "write the replay's mutex contention profile here, by the stack that held the lock (go tool pprof FILE)")
	fs.BoolVar(&o.verbose, "v", false, "log the broker and agents to stderr")
	fs.IntVar(&o.teamQuota, "team-quota", 0, "give every team of the workload a guarantee of this many GPUs (teams above it borrow, so their preemptible jobs may be preempted by other teams' higher classes); 0: no quotas")
	fs.IntVar(&o.highReserved, "high-reserved", 0, "put the workload's high-priority jobs in a queue \"high\" that holds this many GPUs (queues.reserved: other queues' jobs use them only when preemptible); 0: every job in the default queue")
	fs.BoolVar(&o.fifo, "fifo", false, "order each priority class by submit time (scheduler.weights: age 1000, fairShare 0, size 0), as the Slurm side's priority/basic does; default: the shipped weights, fair share and age")
	fs.IntVar(&o.preemptLimit, "preemption-limit", 0, "scheduler.preemptionLimit: a job requeued this many times is not preempted again (0: no limit)")
	fs.BoolVar(&o.regions, "regions", false, "after the replay, summarise the user regions of the traces written by -trace and -agent-profile: count, p50, p90, max and total per region, and every occurrence over -long")
	fs.DurationVar(&o.longRegion, "long", 500*time.Millisecond, "with -regions: list every region occurrence at least this long, with when it began")
	fs.StringVar(&o.jobsOut, "jobs", "", "write one CSV line per job here: id, priority, team, gpus, duration_s, submit_s, start_s, end_s, wait_s, state, attempts")
	fs.StringVar(&o.historyOut, "history", "", "write each job's history here, one JSON line per job (id, nodes, transitions with their reasons): who preempted whom, where each attempt ran")
	fs.StringVar(&o.agentBin, "agent-bin", "", "run each agent as its own process of this spillway binary (`spillway agent`), as on separate nodes; default: agents inside this process")
	fs.StringVar(&o.agentProfile, "agent-profile", "", "with -agent-bin: write each agent's CPU profile and runtime trace into this directory (NAME.cpu, NAME.trace)")
	fs.IntVar(&o.floor, "floor", 0, "before the replay, start and reap this many `true` processes from benche2e alone, as many at a time as there are GPUs, and print the rate: the most jobs/s any replay of zero-length jobs can start on this machine (0: skip)")
	fs.DurationVar(&o.schedInterval, "interval", 500*time.Millisecond, "the broker's scheduling interval (cycles also run on every submit and end)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if gen != "" {
		return generate(gen, out)
	}
	if o.workload == "" {
		return errors.New("-workload is required (or -gen)")
	}
	switch o.mode {
	case "sequential", "parallel", "array":
	default:
		return fmt.Errorf("-mode must be sequential, parallel or array, got %q", o.mode)
	}
	if o.agents < 1 || o.gpusPerAgent < 1 || o.gpusPerAgent > 8 || o.submitters < 1 {
		return errors.New("-agents, -submitters must be ≥ 1 and -gpus 1-8")
	}
	if o.floor < 0 {
		return fmt.Errorf("-floor must be ≥ 0 (processes to start; 0 skips it), got %d", o.floor)
	}
	items, err := readWorkload(o.workload)
	if err != nil {
		return err
	}
	var floor float64
	if o.floor > 0 {
		if floor, err = spawnFloor(o.floor, o.agents*o.gpusPerAgent); err != nil {
			return err
		}
	}
	var res *result
	switch o.system {
	case "spillway":
		res, err = replay(o, items)
	case "slurm":
		if err := o.slurmOnly(); err != nil {
			return err
		}
		res, err = replaySlurm(o, items)
	default:
		return fmt.Errorf("-system must be spillway or slurm, got %q", o.system)
	}
	if err != nil {
		return err
	}
	res.floor = floor
	res.print(out, o, items)
	if o.regions {
		if err := printRegions(out, o); err != nil {
			return err
		}
	}
	if o.historyOut != "" {
		if err := res.writeHistory(o.historyOut); err != nil {
			return err
		}
	}
	if o.jobsOut != "" {
		return res.writeCSV(o.jobsOut)
	}
	return nil
}

func token() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// cluster is a broker and its agents in this process.
type cluster struct {
	url     string
	tokens  map[string]string // team → user token
	admin   string
	stop    func()
	dataDir string
	agents  []int // pids of the agents run as processes (-agent-bin)
	store   broker.GroupCommitter
}

func startCluster(o options, teams []string) (*cluster, error) {
	dir, err := os.MkdirTemp("", "benche2e-")
	if err != nil {
		return nil, err
	}
	c := &cluster{tokens: map[string]string{}, admin: token(), dataDir: dir}
	var tb strings.Builder
	for i, t := range teams {
		c.tokens[t] = token()
		fmt.Fprintf(&tb, "    - {name: u%d, role: user, team: %q, token: %s}\n", i, t, c.tokens[t])
	}
	agentTok := token()
	// extraYAML is the teams (-team-quota) and queues (-high-reserved) sections.
	var extraYAML string
	if o.teamQuota > 0 {
		extraYAML = "teams:\n"
		for _, t := range teams {
			extraYAML += fmt.Sprintf("  - {name: %q, quota: {gpus: %d}}\n", t, o.teamQuota)
		}
	}
	weightsYAML := fmt.Sprintf("  preemptionLimit: %d", o.preemptLimit)
	if o.fifo {
		weightsYAML += "\n  weights: {age: 1000, fairShare: 0, size: 0}"
	}
	if o.highReserved > 0 {
		extraYAML += fmt.Sprintf("queues:\n  - {name: default}\n  - {name: high, reserved: %d}\n", o.highReserved)
	}
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listen: 127.0.0.1:0
dataDir: %s
cluster: bench
scheduler:
  interval: %s
%s
agents:
  heartbeatInterval: 2s
# The replay is one team submitting as fast as it can: the flood limits
# (issue #15) would turn it into a test of the rate limit.
limits: {submitsPerMinute: 1000000, submitBurst: 1000000, maxPendingPerTeam: 10000000}
auth:
  tokens:
%s    - {name: admin, role: operator, token: %s}
    - {name: agents, role: agent, token: %s}
%s`, dir, o.schedInterval, weightsYAML, tb.String(), c.admin, agentTok, extraYAML)))
	if err != nil {
		return nil, fmt.Errorf("bench config: %w", err)
	}
	var log *slog.Logger
	if o.verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	} else {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	st, err := bolt.Open(filepath.Join(dir, bolt.FileName))
	if err != nil {
		return nil, err
	}
	c.store = st
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := server.New(ctx, cfg, st, server.Options{Logger: log})
	if err != nil {
		cancel()
		st.Close()
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		st.Close()
		return nil, err
	}
	c.url = "http://" + l.Addr().String()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = srv.Serve(ctx, l)
	}()
	var procs []*exec.Cmd
	for i := range o.agents {
		name := fmt.Sprintf("sim-%02d", i+1)
		if o.agentBin != "" {
			cmd := exec.Command(o.agentBin, "agent", "--broker", c.url, "--name", name,
				"--gpus", fmt.Sprintf("sim:%dxH100-80GB", o.gpusPerAgent), "--data-dir", filepath.Join(dir, "agents", name))
			cmd.Env = append(os.Environ(), "SPILLWAY_AGENT_TOKEN="+agentTok)
			if o.agentProfile != "" {
				cmd.Env = append(cmd.Env, "SPILLWAY_CPUPROFILE="+filepath.Join(o.agentProfile, name+".cpu"),
					"SPILLWAY_TRACE="+filepath.Join(o.agentProfile, name+".trace"))
			}
			if o.verbose {
				cmd.Stderr = os.Stderr
			}
			if err := cmd.Start(); err != nil {
				cancel()
				wg.Wait()
				return nil, fmt.Errorf("start agent %s: %w", name, err)
			}
			procs = append(procs, cmd)
			c.agents = append(c.agents, cmd.Process.Pid)
			continue
		}
		be, err := backends.Open(fmt.Sprintf("sim:%dxH100-80GB", o.gpusPerAgent), name, log)
		if err != nil {
			cancel()
			wg.Wait()
			return nil, err
		}
		ag, err := agent.New(agent.Config{Broker: c.url, Token: agentTok, Name: name,
			DataDir: filepath.Join(dir, "agents", name), Version: api.Version}, be, log)
		if err != nil {
			cancel()
			wg.Wait()
			return nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer be.Close()
			_ = ag.Run(ctx)
		}()
	}
	c.stop = func() {
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGTERM)
		}
		for _, p := range procs {
			_ = p.Wait()
		}
		cancel()
		wg.Wait()
		st.Close()
		os.RemoveAll(dir)
	}
	// Wait for every agent to register.
	cl := client.New(c.url, c.admin)
	deadline := time.Now().Add(60 * time.Second)
	for {
		nodes, err := cl.Nodes(context.Background())
		ready := 0
		if err == nil {
			for _, n := range nodes {
				if n.State == broker.NodeReady {
					ready++
				}
			}
		}
		if ready == o.agents {
			break
		}
		if time.Now().After(deadline) {
			c.stop()
			return nil, fmt.Errorf("only %d of %d agents registered within 60 s (last error: %v)", ready, o.agents, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return c, nil
}

// specFor is the job spec of one workload item.
func specFor(it Item, o options) broker.Spec {
	cmd := []string{"true"}
	if it.DurationS > 0 {
		cmd = []string{"sleep", fmt.Sprintf("%.3f", it.DurationS)}
	}
	timeout := time.Duration(it.DurationS*float64(time.Second)) + o.timeoutSlack
	timeout = timeout.Round(time.Second)
	if timeout < time.Second {
		timeout = time.Second
	}
	return broker.Spec{
		Name:        it.ID,
		Priority:    it.Priority,
		Queue:       queueFor(it, o),
		Preemptible: o.preemptLow && it.Priority == "low",
		Resources:   broker.Resources{GPUs: it.GPUs},
		Timeout:     broker.Duration(timeout),
		Command:     cmd,
	}
}

// queueFor is the queue of one workload item: "high" for high-priority
// jobs with -high-reserved, else the default queue.
func queueFor(it Item, o options) string {
	if o.highReserved > 0 && it.Priority == "high" {
		return "high"
	}
	return ""
}

// submitted is what the replay knows of one job once the broker took it.
type submitted struct {
	item Item
	id   string
}

// result is the finished replay.
type result struct {
	t0       time.Time
	out      []outcome     // one per submitted job
	jobs     []*broker.Job // out[i]'s broker record (Spillway only)
	submitS  float64       // first submit call to last submit answer
	firstSub time.Time
	calls    int
	rtts     []float64               // each single submit's round trip, seconds
	cpuS     float64                 // CPU over the replay: this process (broker, submitters), or Slurm's daemons
	cpuWhat  string                  // whose CPU cpuS is
	agentS   float64                 // CPU over the replay of the agents run as processes (-agent-bin)
	jobsS    float64                 // CPU of the jobs' processes those agents reaped over the replay
	floor    float64                 // -floor: processes/s this machine starts and reaps with nothing else running
	writer   broker.GroupCommitStats // the store's group-commit writer over the replay (Spillway)
	replayS  float64                 // first submit until every job had ended, as the waiter saw it
}

// outcome is what a replay measured of one job, whichever system ran it.
type outcome struct {
	item     Item
	started  bool
	first    time.Time // its first attempt's start (the wait ends here)
	last     time.Time // its last attempt's start
	end      time.Time
	runS     float64 // seconds its processes ran, over all attempts
	attempts int
	state    string
	ok       bool // it ran to the end and exited 0
}

// outcomeOf is a broker job's outcome.
func outcomeOf(it Item, j *broker.Job) outcome {
	o := outcome{item: it, attempts: j.Attempt, state: string(j.State), ok: j.State == broker.StateSucceeded, runS: runSeconds(j)}
	if j.StartedAt != nil && j.EndedAt != nil {
		o.started, o.first, o.last, o.end = true, firstStart(j), *j.StartedAt, *j.EndedAt
	}
	return o
}

func replay(o options, items []Item) (*result, error) {
	teams := map[string]bool{}
	for _, it := range items {
		teams[it.Team] = true
	}
	teamList := make([]string, 0, len(teams))
	for t := range teams {
		teamList = append(teamList, t)
	}
	sort.Strings(teamList)
	c, err := startCluster(o, teamList)
	if err != nil {
		return nil, err
	}
	defer c.stop()
	if o.traceFile != "" {
		f, err := os.Create(o.traceFile)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if err := trace.Start(f); err != nil {
			return nil, err
		}
		defer trace.Stop()
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, err
		}
		defer pprof.StopCPUProfile()
	}
	if o.mutexProfile != "" {
		runtime.SetMutexProfileFraction(1)
		defer func() {
			runtime.SetMutexProfileFraction(0)
			if f, err := os.Create(o.mutexProfile); err == nil {
				_ = pprof.Lookup("mutex").WriteTo(f, 0)
				f.Close()
			}
		}()
	}
	clients := map[string]*client.Client{}
	for t, tok := range c.tokens {
		clients[t] = client.New(c.url, tok)
	}
	ctx := context.Background()
	res := &result{}
	var mu sync.Mutex
	var subs []submitted
	var firstErr error
	record := func(s []submitted, err error) {
		mu.Lock()
		defer mu.Unlock()
		subs = append(subs, s...)
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	submitOne := func(it Item) {
		t := time.Now()
		j, err := clients[it.Team].SubmitSpec(ctx, specFor(it, o))
		rtt := time.Since(t).Seconds()
		if err != nil {
			record(nil, fmt.Errorf("submit %s: %w", it.ID, err))
			return
		}
		record([]submitted{{it, j.ID}}, nil)
		mu.Lock()
		res.rtts = append(res.rtts, rtt)
		mu.Unlock()
	}
	cpu0 := processCPU()
	agent0, jobs0 := pidsCPU(c.agents)
	writer0 := c.store.GroupCommits()
	t0 := time.Now()
	res.t0 = t0
	res.calls = submitWorkload(o, items, t0, func(i int) { submitOne(items[i]) }, func(_ int, g []Item) {
		s, err := submitArray(ctx, clients[g[0].Team], g, o)
		record(s, err)
	})
	res.submitS = time.Since(t0).Seconds()
	if firstErr != nil {
		return nil, firstErr
	}
	// Wait until every job has ended.
	admin := client.New(c.url, c.admin)
	active := []broker.State{broker.StatePending, broker.StateProvisioning, broker.StateStarting,
		broker.StateRunning, broker.StatePreempted, broker.StateLost}
	deadline := time.Now().Add(time.Duration(lowerBound(items, o.agents*o.gpusPerAgent)*4)*time.Second + 2*time.Minute)
	for {
		l, err := admin.Jobs(ctx, client.ListOptions{States: active, Limit: 1})
		if err == nil && len(l.Jobs) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("jobs still running at the deadline (last error: %v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	res.cpuS = processCPU() - cpu0
	res.cpuWhat = "this process (broker and submitters)"
	res.replayS = time.Since(t0).Seconds()
	writer1 := c.store.GroupCommits()
	res.writer = broker.GroupCommitStats{Commits: writer1.Commits - writer0.Commits, Calls: writer1.Calls - writer0.Calls, Busy: writer1.Busy - writer0.Busy}
	agent1, jobs1 := pidsCPU(c.agents)
	res.agentS, res.jobsS = agent1-agent0, jobs1-jobs0
	if o.traceFile != "" {
		trace.Stop()
	}
	// Fetch every job with its history.
	res.jobs = make([]*broker.Job, len(subs))
	res.out = make([]outcome, len(subs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	errs := make(chan error, len(subs))
	for i, s := range subs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			j, err := admin.Job(ctx, s.id)
			if err != nil {
				errs <- err
				return
			}
			if o.mode != "array" && j.Spec.Name != s.item.ID {
				errs <- fmt.Errorf("job %s is named %q, want %q", s.id, j.Spec.Name, s.item.ID)
				return
			}
			res.jobs[i] = j
			res.out[i] = outcomeOf(s.item, j)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return nil, err
	}
	return res, nil
}

// submitWorkload submits the items at their submit times (from t0) as
// o.mode says: one by one in order (sequential), from o.submitters
// goroutines taking them in order (parallel), or one call per array group
// (array). one(i) submits items[i]; group(i, g) the group g, whose first
// item is items[i]. It returns the number of array calls.
func submitWorkload(o options, items []Item, t0 time.Time, one func(i int), group func(i int, g []Item)) int {
	at := func(it Item) {
		if d := time.Until(t0.Add(time.Duration(it.SubmitS * float64(time.Second)))); d > 0 {
			time.Sleep(d)
		}
	}
	calls := 0
	switch o.mode {
	case "sequential":
		for i, it := range items {
			at(it)
			one(i)
		}
	case "parallel":
		ch := make(chan int)
		var wg sync.WaitGroup
		for range o.submitters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range ch {
					one(i)
				}
			}()
		}
		for i, it := range items {
			at(it)
			ch <- i
		}
		close(ch)
		wg.Wait()
	case "array":
		i := 0
		for _, g := range arrayGroups(items) {
			at(g[0])
			group(i, g)
			calls++
			i += len(g)
		}
	}
	return calls
}

// arrayGroups splits the workload into runs of jobs that one array submit
// can carry: consecutive, same submit time, team, GPUs, duration and
// priority.
func arrayGroups(items []Item) [][]Item {
	var out [][]Item
	for _, it := range items {
		if n := len(out); n > 0 {
			g := out[n-1]
			h := g[0]
			if h.SubmitS == it.SubmitS && h.Team == it.Team && h.GPUs == it.GPUs && h.DurationS == it.DurationS &&
				h.Priority == it.Priority && len(g) < 10000 {
				out[n-1] = append(g, it)
				continue
			}
		}
		out = append(out, []Item{it})
	}
	return out
}

func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

func (r *result) print(w io.Writer, o options, items []Item) {
	gpus := o.agents * o.gpusPerAgent
	var lastStart, lastEnd time.Time
	waits := map[string][]float64{}
	var all []float64
	busy := 0.0
	failed := 0
	for _, j := range r.out {
		it := j.item
		if !j.ok {
			failed++
		}
		if !j.started || j.end.IsZero() {
			continue
		}
		// The wait is from the workload's submit time to the first start
		// of the process (a preempted job's later attempts do not count).
		sub := r.t0.Add(time.Duration(it.SubmitS * float64(time.Second)))
		wt := max(0, j.first.Sub(sub).Seconds())
		waits[it.Priority] = append(waits[it.Priority], wt)
		all = append(all, wt)
		if j.last.After(lastStart) {
			lastStart = j.last
		}
		if j.end.After(lastEnd) {
			lastEnd = j.end
		}
		busy += float64(it.GPUs) * j.runS
	}
	makespan := lastEnd.Sub(r.t0).Seconds()
	lb := lowerBound(items, gpus)
	startSpan := lastStart.Sub(r.t0).Seconds()
	fmt.Fprintf(w, "%s, workload %s: %d jobs, mode %s", o.system, filepath.Base(o.workload), len(items), o.mode)
	switch o.mode {
	case "parallel":
		fmt.Fprintf(w, " (%d submitters)", o.submitters)
	case "array":
		fmt.Fprintf(w, " (%d submit calls)", r.calls)
	}
	fmt.Fprintf(w, ", %d agents × %d GPUs, preemptible low: %v, team quota: %d GPUs, GOMAXPROCS %d\n", o.agents, o.gpusPerAgent, o.preemptLow, o.teamQuota, runtime.GOMAXPROCS(0))
	fmt.Fprintf(w, "  submitted in     %.2f s (%.0f submits/s)\n", r.submitS, float64(len(items))/r.submitS)
	if len(r.rtts) > 0 {
		fmt.Fprintf(w, "  submit round trip p50/p99/max %.2f / %.2f / %.2f ms\n", 1000*percentile(r.rtts, 0.5), 1000*percentile(r.rtts, 0.99), 1000*slices.Max(r.rtts))
	}
	fmt.Fprintf(w, "  jobs started/s   %.0f (%d starts in %.2f s from the first submit)\n", float64(len(all))/startSpan, len(all), startSpan)
	if r.floor > 0 {
		fmt.Fprintf(w, "  spawn floor      %.0f/s (%d × true started and reaped by benche2e alone, %d at a time, before the replay); jobs started/s is %.0f%% of it\n",
			r.floor, o.floor, gpus, 100*float64(len(all))/startSpan/r.floor)
	}
	fmt.Fprintf(w, "  makespan         %.2f s, lower bound %.2f s (%.3f×)\n", makespan, lb, makespan/lb)
	fmt.Fprintf(w, "  wait p50/p99     all %.3f / %.3f s", percentile(all, 0.5), percentile(all, 0.99))
	for _, p := range []string{"high", "medium", "low"} {
		if ws := waits[p]; len(ws) > 0 {
			fmt.Fprintf(w, "; %s %.3f / %.3f s", p, percentile(ws, 0.5), percentile(ws, 0.99))
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "  CPU, %s %.2f s (%.2f ms a job; until every job ended)\n", r.cpuWhat, r.cpuS, 1000*r.cpuS/float64(len(items)))
	if r.agentS > 0 {
		fmt.Fprintf(w, "  CPU, the agents  %.2f s (%.2f ms a job); the jobs' processes they reaped %.2f s (%.2f ms a job)\n",
			r.agentS, 1000*r.agentS/float64(len(items)), r.jobsS, 1000*r.jobsS/float64(len(items)))
	}
	if wr := r.writer; wr.Commits > 0 {
		fmt.Fprintf(w, "  store writer     %d group commits (%.2f a job, %.1f writes each), busy %.0f%% of the replay (%.2f ms a commit)\n",
			wr.Commits, float64(wr.Commits)/float64(len(items)), float64(wr.Calls)/float64(wr.Commits),
			100*wr.Busy.Seconds()/r.replayS, 1000*wr.Busy.Seconds()/float64(wr.Commits))
	}
	fmt.Fprintf(w, "  GPU utilisation  %.1f%% (GPU-seconds held by running processes / (%d GPUs × makespan))\n", 100*busy/(float64(gpus)*makespan), gpus)
	if failed > 0 {
		fmt.Fprintf(w, "  NOT SUCCEEDED    %d jobs\n", failed)
	}
}

// writeCSV writes one line per job, times in seconds from the replay's
// start.
func (r *result) writeCSV(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fmt.Fprintln(f, "id,priority,team,gpus,duration_s,submit_s,start_s,end_s,wait_s,state,attempts")
	rel := func(t time.Time) float64 {
		if t.IsZero() {
			return -1
		}
		return t.Sub(r.t0).Seconds()
	}
	for _, j := range r.out {
		it := j.item
		st := rel(j.first)
		fmt.Fprintf(f, "%s,%s,%s,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%s,%d\n", it.ID, it.Priority, it.Team, it.GPUs, it.DurationS,
			it.SubmitS, st, rel(j.end), st-it.SubmitS, j.state, j.attempts)
	}
	return nil
}

// writeHistory writes one JSON line per job: its workload id, the nodes of
// its last attempt and its transitions, times in seconds from the
// replay's start.
func (r *result) writeHistory(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	type step struct {
		At     float64 `json:"at"`
		To     string  `json:"to"`
		Reason string  `json:"reason"`
		Detail string  `json:"detail,omitempty"`
	}
	enc := json.NewEncoder(f)
	for i, j := range r.jobs {
		line := struct {
			ID    string   `json:"id"`
			Nodes []string `json:"nodes"`
			Steps []step   `json:"steps"`
		}{ID: r.out[i].item.ID, Nodes: j.Nodes()}
		for _, t := range j.History {
			line.Steps = append(line.Steps, step{At: t.At.Sub(r.t0).Seconds(), To: string(t.To), Reason: t.Reason, Detail: t.Detail})
		}
		if err := enc.Encode(line); err != nil {
			return err
		}
	}
	return nil
}

// firstStart is when the job's first attempt started running.
func firstStart(j *broker.Job) time.Time {
	for _, t := range j.History {
		if t.To == broker.StateRunning {
			return t.At
		}
	}
	return *j.StartedAt
}

// runSeconds is the time the job's processes ran, over all its attempts.
func runSeconds(j *broker.Job) float64 {
	total := 0.0
	var from *time.Time
	for i := range j.History {
		t := &j.History[i]
		switch {
		case t.To == broker.StateRunning:
			from = &t.At
		case from != nil:
			total += t.At.Sub(*from).Seconds()
			from = nil
		}
	}
	return total
}

// pidsCPU is the user and system CPU so far of the processes pids, and
// of the children they reaped, in seconds (/proc/PID/stat). A process
// that is gone counts nothing.
func pidsCPU(pids []int) (own, reaped float64) {
	for _, pid := range pids {
		o, r := procCPU(pid)
		own += o
		reaped += r
	}
	return own, reaped
}

// procCPU reads one process's utime+stime and cutime+cstime, in seconds.
func procCPU(pid int) (own, reaped float64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0
	}
	// Fields after the command's closing parenthesis: utime, stime,
	// cutime and cstime are the 14th to 17th of the line.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 > len(b) {
		return 0, 0
	}
	f := strings.Fields(string(b[i+2:]))
	if len(f) < 15 {
		return 0, 0
	}
	tick := func(s string) float64 {
		v, _ := strconv.ParseFloat(s, 64)
		return v / 100 // USER_HZ
	}
	return tick(f[11]) + tick(f[12]), tick(f[13]) + tick(f[14])
}

// processCPU is this process's user and system CPU so far, in seconds.
func processCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}
