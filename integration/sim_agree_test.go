package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/client"
	"github.com/spillway-dev/spillway/broker/sim"
)

// simAgreeCluster is the simulator's view of the cluster newCluster and
// four agents form: the same broker config (scheduler interval; default
// queues and priorities), four nodes of two simulated H100s named as the
// agents are, no preemptible job, no provider.
const simAgreeCluster = `
broker:
  scheduler: {interval: 200ms}
nodes:
  - {name: node, count: 4, gpus: 2, model: "NVIDIA H100 80GB HBM3", memory: 80Gi}
jobs: {preemptible: []}
`

// TestSimAgreesWithServer runs 99 short jobs through the real broker
// with four simulated agents, then replays the same workload — the jobs'
// submit times, GPUs, priorities, and how long each held its cards, as
// the broker recorded them — through sim.Run, and checks that the
// simulator starts the jobs in the order the broker did: which waiting
// job goes next, by priority, age, fit and backfill.
//
// The workload comes in waves of 11 jobs submitted 1/11 s apart, each
// running a whole number of seconds, so that every submit and every end
// of a wave falls on its own phase of the second and no two events are
// within ~90 ms of each other; the broker's few milliseconds per start
// and end cannot reorder them. The plan is checked in the simulator
// first (no two events at one instant, each wave drained before the
// next), trying seeds until one passes.
func TestSimAgreesWithServer(t *testing.T) {
	clu, err := sim.ParseCluster([]byte(simAgreeCluster))
	if err != nil {
		t.Fatal(err)
	}
	pol, err := sim.ParsePolicy(sim.PolicyNoBurst, clu)
	if err != nil {
		t.Fatal(err)
	}
	var plan []planned
	for seed := uint64(1); ; seed++ {
		if plan = agreePlan(seed); planIsClean(t, plan, clu, pol) {
			t.Logf("workload seed %d", seed)
			break
		}
		if seed == 500 {
			t.Fatal("no clean workload in 500 seeds")
		}
	}

	c := newCluster(t, "")
	for i := 0; i < 4; i++ {
		c.agent(fmt.Sprintf("node-%03d", i), "sim:2xH100-80GB")
	}
	c.waitNodes(4)
	ctx := context.Background()
	cl := c.client(tokAlice)
	t0 := time.Now()
	for i, p := range plan {
		time.Sleep(time.Until(t0.Add(p.at)))
		if _, err := cl.SubmitSpec(ctx, broker.Spec{Name: fmt.Sprintf("j%06d", i+1), Priority: p.prio,
			Resources: broker.Resources{GPUs: p.gpus}, Timeout: broker.Duration(sim.DeclaredTimeout(p.run)),
			Command: []string{"sleep", fmt.Sprint(p.run.Seconds())}}); err != nil {
			t.Fatalf("submit job %d: %v", i+1, err)
		}
	}
	jobs := waitAllSucceeded(t, c.client(c.viewer), len(plan), 90*time.Second)

	// The observed workload, and the broker's start order.
	tr := &sim.Trace{Location: time.UTC}
	var live []simStart
	for _, j := range jobs {
		scheduled, ended := time.Time{}, time.Time{}
		for _, h := range j.History {
			if h.To == broker.StateStarting && scheduled.IsZero() {
				scheduled = h.At
			}
			if h.To.Terminal() {
				ended = h.At
			}
		}
		if scheduled.IsZero() || ended.Before(scheduled) || j.Attempt != 1 {
			t.Fatalf("job %s: history %+v", j.Spec.Name, j.History)
		}
		tr.Jobs = append(tr.Jobs, sim.Job{ID: j.Spec.Name, Submit: j.SubmittedAt, Duration: ended.Sub(scheduled),
			GPUs: j.TotalGPUs(), Team: j.Spec.Team, Priority: j.Spec.Priority, Queue: j.Spec.Queue})
		live = append(live, simStart{job: j.Spec.Name, at: scheduled})
	}
	slices.SortStableFunc(tr.Jobs, func(a, b sim.Job) int { return a.Submit.Compare(b.Submit) })

	res, err := sim.Run(tr, clu, pol, sim.Options{RecordStarts: true})
	if err != nil {
		t.Fatal(err)
	}
	var simulated []simStart
	for _, s := range res.Starts {
		simulated = append(simulated, simStart{job: s.Job, at: s.At})
	}
	got, want := startOrder(simulated), startOrder(live)
	if got != want {
		t.Fatalf("start order differs (jobs started in one cycle in braces)\nbroker:    %s\nsimulator: %s", want, got)
	}
	queued := 0
	for _, s := range live {
		if j := jobByName(jobs, s.job); s.at.Sub(j.SubmittedAt) > 500*time.Millisecond {
			queued++
		}
	}
	if queued < 10 {
		t.Fatalf("only %d jobs waited: the workload does not exercise the queue", queued)
	}
	t.Logf("%d jobs, %d of them queued, started in the same order by the broker and the simulator", len(jobs), queued)
}

// planned is one job of the workload: when it is submitted (after the
// first), its GPUs, run time and class.
type planned struct {
	at   time.Duration
	gpus int
	run  time.Duration
	prio string
}

const (
	agreeWaves    = 9
	agreeWaveJobs = 11
	agreeWaveGap  = 7 * time.Second
)

// agreePlan is the workload for a seed.
func agreePlan(seed uint64) []planned {
	rng := rand.New(rand.NewPCG(seed, 100))
	var out []planned
	for w := 0; w < agreeWaves; w++ {
		for i := 0; i < agreeWaveJobs; i++ {
			out = append(out, planned{at: time.Duration(w)*agreeWaveGap + time.Duration(i)*time.Second/agreeWaveJobs,
				gpus: 1 + rng.IntN(2), run: time.Duration(1+rng.IntN(3)) * time.Second,
				prio: []string{"low", "medium", "medium", "high"}[rng.IntN(4)]})
		}
	}
	return out
}

// planIsClean replays the planned workload in the simulator and reports
// whether no two of its events (submits, ends) share an instant and every
// wave ends 300 ms before the next begins.
func planIsClean(t *testing.T, plan []planned, clu *sim.Cluster, pol sim.Policy) bool {
	t.Helper()
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	tr := &sim.Trace{Location: time.UTC}
	for i, p := range plan {
		tr.Jobs = append(tr.Jobs, sim.Job{ID: fmt.Sprintf("j%06d", i+1), Submit: t0.Add(p.at), Duration: p.run, GPUs: p.gpus,
			Team: "nlp", Priority: p.prio, Queue: "default"})
	}
	res, err := sim.Run(tr, clu, pol, sim.Options{RecordStarts: true})
	if err != nil {
		t.Fatal(err)
	}
	events := map[time.Duration]int{}
	for _, p := range plan {
		events[p.at]++
	}
	for _, s := range res.Starts {
		var i int
		if _, err := fmt.Sscanf(s.Job, "j%06d", &i); err != nil {
			t.Fatal(err)
		}
		end := s.At.Sub(t0) + plan[i-1].run
		events[end]++
		if w := int(plan[i-1].at / agreeWaveGap); end > time.Duration(w+1)*agreeWaveGap-300*time.Millisecond {
			return false
		}
	}
	for _, n := range events {
		if n > 1 {
			return false
		}
	}
	return true
}

type simStart struct {
	job string
	at  time.Time
}

// startOrder prints starts in time order, the jobs of one instant (one
// cycle) as a sorted set in braces.
func startOrder(ss []simStart) string {
	ss = slices.Clone(ss)
	slices.SortStableFunc(ss, func(a, b simStart) int { return a.at.Compare(b.at) })
	var parts []string
	for i := 0; i < len(ss); {
		k := i
		var group []string
		for ; k < len(ss) && ss[k].at.Equal(ss[i].at); k++ {
			group = append(group, ss[k].job)
		}
		slices.Sort(group)
		if len(group) == 1 {
			parts = append(parts, group[0])
		} else {
			parts = append(parts, "{"+strings.Join(group, " ")+"}")
		}
		i = k
	}
	return strings.Join(parts, " ")
}

func jobByName(jobs []*broker.Job, name string) *broker.Job {
	for _, j := range jobs {
		if j.Spec.Name == name {
			return j
		}
	}
	return nil
}

// waitAllSucceeded polls until n jobs have succeeded and returns them
// with their histories.
func waitAllSucceeded(t *testing.T, cl *client.Client, n int, within time.Duration) []*broker.Job {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var done []*broker.Job
		cursor := ""
		for {
			page, err := cl.Jobs(context.Background(), client.ListOptions{States: []broker.State{broker.StateSucceeded}, Limit: 1000, Cursor: cursor})
			if err != nil {
				t.Fatal(err)
			}
			done = append(done, page.Jobs...)
			if page.Next == "" {
				break
			}
			cursor = page.Next
		}
		if len(done) == n {
			return done
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d jobs succeeded within %s", len(done), n, within)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
