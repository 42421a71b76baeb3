package sim

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/billing"
	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
)

// testCluster is two nodes of 4 GPUs, offers of 1 and 4 GPUs at 2 USD
// per GPU-hour, a fixed 1-minute lead time, and the spillway policy with
// a 10-minute minimum wait. extra is appended to the YAML.
const testCluster = `
broker:
  scheduler: {starvationAge: 60d}
  queues:
    - {name: default, maxTimeout: 30d}
    - {name: short, defaultTimeout: 10m, maxTimeout: 30m}
  burst:
    interval: 5s
    threshold: 0.8
    hysteresis: 0.1
    minWait: 10m
    maxInFlight: 100
    maxInFlightPerProvider: 100
    idleTTL: 5m
    maxLifetime: 30d
nodes:
  - {name: n, count: 2, gpus: 4, model: "Tesla P100", memory: 16Gi}
burst:
  leadTime: {p50: 1m, p99: 1m, max: 1m}
offers:
  - {provider: cloud, region: r1, instanceType: big, gpuModel: V100, gpus: 4, gpuMemory: 16Gi, pricePerHour: "8"}
  - {provider: cloud, region: r1, instanceType: small, gpuModel: V100, gpus: 1, gpuMemory: 16Gi, pricePerHour: "2"}
budgets: {global: "100000"}
`

func cluster(t *testing.T, yaml string) *Cluster {
	t.Helper()
	c, err := ParseCluster([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func csvTrace(t *testing.T, rows ...string) *Trace {
	t.Helper()
	tr, err := ReadCSV(strings.NewReader("# start: 2026-03-01T00:00:00Z\n" + CSVHeader + "\n" + strings.Join(rows, "\n") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// burstTrace is 20 one-hour 1-GPU jobs at once on the 8-GPU test
// cluster: 8 start on-prem, 12 wait or burst.
func burstTrace(t *testing.T) *Trace {
	var rows []string
	for i := 0; i < 20; i++ {
		rows = append(rows, "0,3600,1,a,medium,default")
	}
	return csvTrace(t, rows...)
}

func run(t *testing.T, tr *Trace, c *Cluster, policy string, opt Options) *Result {
	t.Helper()
	p, err := ParsePolicy(policy, c)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Run(tr, c, p, opt)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func usd(s string) billing.Amount {
	a, err := billing.ParseAmount(s)
	if err != nil {
		panic(err)
	}
	return a
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

// TestPoliciesOnABurst replays 12 jobs more than the cluster holds. The
// wait each policy gives the 12 and what their machines cost follow from
// the policy: the lead time is 1 minute, each job runs 1 hour, machines
// are stopped after 5 idle minutes.
func TestPoliciesOnABurst(t *testing.T) {
	c := cluster(t, testCluster)
	tr := burstTrace(t)
	cases := []struct {
		policy  string
		maxWait time.Duration // of the 12 that do not fit
		onBurst int
	}{
		{"no-burst", 2 * time.Hour, 0},
		{"burst-any-pending", time.Minute, 12},
		{"starburst-zero", time.Minute, 12},
		{"spillway", 11 * time.Minute, 12},
		// Every job has the same run time and GPUs: each waits β × 1h.
		{"starburst-linear-cost", 16 * time.Minute, 12},
		{"starburst-linear-runtime", 16 * time.Minute, 12},
		{"starburst-constant", 16 * time.Minute, 12},
		// Waits of 2 hours: the last 4 start on-prem when the second 8 end.
		{"starburst-linear-cost:budget=2", 2 * time.Hour, 0},
	}
	for _, tc := range cases {
		t.Run(tc.policy, func(t *testing.T) {
			r := run(t, tr, c, tc.policy, Options{Seed: 1})
			if got := time.Duration(r.Wait.Max * float64(time.Second)); got != tc.maxWait {
				t.Errorf("longest wait %s, want %s", got, tc.maxWait)
			}
			if r.JobsOnBurst != tc.onBurst || r.Succeeded != 20 {
				t.Errorf("%d jobs on burst machines, %d succeeded; want %d, 20", r.JobsOnBurst, r.Succeeded, tc.onBurst)
			}
			if !near(r.FluidBoundGPUHours, 12) {
				t.Errorf("fluid bound %v GPU-h, want 12", r.FluidBoundGPUHours)
			}
			if tc.onBurst == 0 {
				if r.BurstGPUHours != 0 || r.BurstCost != 0 {
					t.Errorf("on-prem only but %v burst GPU-h, %s", r.BurstGPUHours, r.BurstCost)
				}
				return
			}
			// 12 one-GPU machines, each 1 minute booting, 60 busy, 5 idle:
			// 13.2 GPU-hours at 2 USD.
			if !near(r.BurstGPUHours, 13.2) || !near(r.UsageGPUHours, 12) || !near(r.BootGPUHours, 0.2) || !near(r.IdleGPUHours, 1) {
				t.Errorf("burst %v GPU-h (usage %v, boot %v, idle %v), want 13.2 (12, 0.2, 1)", r.BurstGPUHours, r.UsageGPUHours, r.BootGPUHours, r.IdleGPUHours)
			}
			// Metered as the broker meters: one-minute slices, each GPU-minute
			// priced 2/60 USD to the micro (0.033333).
			if r.BurstCost != usd("26.399736") || r.OverheadCost != usd("2.399976") || r.Machines != 12 {
				t.Errorf("cost %s (overhead %s) on %d machines, want 26.399736 (2.399976) on 12", r.BurstCost, r.OverheadCost, r.Machines)
			}
			if !near(r.BurstOverFluid, 1.1) {
				t.Errorf("burst over fluid %v, want 1.1", r.BurstOverFluid)
			}
		})
	}
	// starburst-zero is burst-any-pending under another name.
	a := run(t, tr, c, "burst-any-pending", Options{Seed: 1})
	z := run(t, tr, c, "starburst-zero", Options{Seed: 1})
	a.Policy = z.Policy
	if ja, jz := mustJSON(t, a), mustJSON(t, z); ja != jz {
		t.Fatal("starburst-zero and burst-any-pending differ")
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

func TestThresholdKeepsWorkHome(t *testing.T) {
	c := cluster(t, testCluster)
	var rows []string
	for i := 0; i < 10; i++ {
		rows = append(rows, "0,3600,1,a,medium,default")
	}
	// Ten jobs on eight GPUs: at 100% allocation the two left over burst.
	if r := run(t, csvTrace(t, rows...), c, "spillway:threshold=1", Options{Seed: 1}); r.JobsOnBurst != 2 {
		t.Fatalf("at 100%% allocation the 2 waiting jobs burst: %d did", r.JobsOnBurst)
	}
	// Five 1-GPU jobs fill one node and a card of the other: two 4-GPU
	// jobs cannot start, but 5/8 allocated is under the 80% threshold.
	rows = append(rows[:5], "0,3600,4,a,medium,default", "0,3600,4,a,medium,default")
	if r := run(t, csvTrace(t, rows...), c, "spillway", Options{Seed: 1}); r.JobsOnBurst != 0 {
		t.Fatalf("below the threshold %d jobs burst", r.JobsOnBurst)
	}
	if r := run(t, csvTrace(t, rows...), c, "spillway:threshold=0.5", Options{Seed: 1}); r.JobsOnBurst != 2 || r.Wait.Max != (11*time.Minute).Seconds() {
		t.Fatalf("above a 50%% threshold the 4-GPU jobs burst after the minimum wait: %d jobs, longest wait %vs", r.JobsOnBurst, r.Wait.Max)
	}
}

func TestPreemptionCheckpointsAndResumes(t *testing.T) {
	c := cluster(t, testCluster+"\njobs: {preemptible: [low], checkpointGrace: 30s, checkpointTime: 10s}\n")
	// Both nodes busy with low jobs; a high job arrives at 10 minutes.
	tr := csvTrace(t,
		"0,3600,4,a,low,default",
		"0,3600,4,a,low,default",
		"600,600,4,a,high,default")
	r := run(t, tr, c, "no-burst", Options{Seed: 1, RecordStarts: true})
	if r.Preemptions != 1 || r.Resumptions != 1 {
		t.Fatalf("preemptions %d, resumptions %d; want 1, 1", r.Preemptions, r.Resumptions)
	}
	t0 := tr.Jobs[0].Submit
	var got []string
	for _, s := range r.Starts {
		got = append(got, fmt.Sprintf("%s@%s#%d", s.Job, s.At.Sub(t0), s.Attempt))
	}
	// The victim (the later id on equal terms) saves its 10 minutes of
	// work at the signal, exits 10s later; the high job runs 10 minutes;
	// the victim resumes with 50 minutes left.
	victim := strings.Split(strings.Split(got[3], "@")[0], "#")[0]
	want := []string{"j000001@0s#1", "j000002@0s#1", "j000003@10m10s#1", victim + "@20m10s#2"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("starts %v, want %v", got, want)
	}
	if r.JCT.Max != (70*time.Minute + 10*time.Second).Seconds() {
		t.Fatalf("the victim ends at %vs, want 70m10s", r.JCT.Max)
	}
	if r.WaitByPriority["high"].Max != 10 {
		t.Fatalf("the high job waited %vs, want 10s (the victim's checkpoint)", r.WaitByPriority["high"].Max)
	}
}

func TestBudgetHoldsWorkBack(t *testing.T) {
	c := cluster(t, strings.Replace(testCluster, `budgets: {global: "100000"}`, `budgets: {global: "1"}`, 1))
	r := run(t, burstTrace(t), c, "burst-any-pending", Options{Seed: 1})
	if r.BudgetBlockedJobs != 12 || r.LaunchAttempts != 0 || r.BurstCost != 0 {
		t.Fatalf("blocked %d, launches %d, cost %s; want 12, 0, 0", r.BudgetBlockedJobs, r.LaunchAttempts, r.BurstCost)
	}
	c = cluster(t, strings.Replace(testCluster, `budgets: {global: "100000"}`, `budgets: {global: "15", teams: {a: "100"}}`, 1))
	r = run(t, burstTrace(t), c, "burst-any-pending", Options{Seed: 1})
	// Each launch reserves 1h × 2 USD: seven fit in 15 USD; the others wait.
	if r.Machines != 7 || r.BudgetBlockedJobs != 5 {
		t.Fatalf("machines %d, blocked %d; want 7, 5", r.Machines, r.BudgetBlockedJobs)
	}
	var global BudgetMonth
	for _, b := range r.Budgets {
		if b.Scope == broker.GlobalScope {
			global = b
		}
	}
	// Actual cost (7 × 66 GPU-minutes × 0.033333 USD, the meter's
	// one-minute slices) passes the projection of 1h each.
	if global.Month != "2026-03" || global.Spent != usd("15.399846") || global.Within {
		t.Fatalf("global budget %+v", global)
	}
}

func TestTimeoutStopsAJob(t *testing.T) {
	c := cluster(t, testCluster)
	r := run(t, csvTrace(t, "0,3600,1,a,medium,short"), c, "no-burst", Options{Seed: 1})
	if r.TimedOut != 1 || r.JCT.Max != (30*time.Minute+10*time.Second).Seconds() {
		t.Fatalf("timed out %d, JCT %vs; want 1, 30m10s (queue short's 30m maximum, then the exit)", r.TimedOut, r.JCT.Max)
	}
}

func TestMachineLifetimeDrainsItsJobs(t *testing.T) {
	c := cluster(t, strings.Replace(strings.Replace(testCluster, "maxLifetime: 30d", "maxLifetime: 1h", 1), "count: 2, gpus: 4", "count: 1, gpus: 1", 1))
	// One GPU on-prem, busy for 2 hours; the second job bursts at once,
	// starts after the 1-minute lead time, and its machine reaches its
	// 1-hour lifetime: the job is stopped with its checkpoint signal
	// (59 minutes of work saved) and exits 10s later, unbound; a
	// preempted job keeps its wait, so it bursts again at once, on a
	// second machine.
	tr := csvTrace(t, "0,7200,1,a,medium,default", "0,5400,1,a,medium,default")
	r := run(t, tr, c, "burst-any-pending", Options{Seed: 1, RecordStarts: true})
	if r.Preemptions != 1 || r.Resumptions != 1 || r.Machines != 2 || r.Succeeded != 2 {
		t.Fatalf("preemptions %d, resumptions %d, machines %d, succeeded %d; want 1, 1, 2, 2", r.Preemptions, r.Resumptions, r.Machines, r.Succeeded)
	}
	t0 := tr.Jobs[0].Submit
	var got []string
	for _, s := range r.Starts {
		got = append(got, fmt.Sprintf("%s@%s burst=%v", s.Job, s.At.Sub(t0), s.Burst))
	}
	want := []string{"j000001@0s burst=false", "j000002@1m0s burst=true", "j000002@1h1m10s burst=true"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("starts %v, want %v", got, want)
	}
	// 31 minutes of work were left after the checkpoint.
	if r.JCT.Max != (2*time.Hour).Seconds() || r.Wait.Max != time.Minute.Seconds() {
		t.Fatalf("JCT max %vs, wait max %vs; want 2h (the on-prem job), 1m", r.JCT.Max, r.Wait.Max)
	}
}

// TestDeterminism replays a random trace with random lead times and
// capacity failures: one seed gives one report, to the byte.
func TestDeterminism(t *testing.T) {
	c := cluster(t, strings.Replace(testCluster, "leadTime: {p50: 1m, p99: 1m, max: 1m}",
		"leadTime: {p50: 1m, p99: 20m, max: 25m}\n  capacityFailureRate: 0.3", 1)+"\njobs: {preemptible: [low]}\n")
	rng := rand.New(rand.NewPCG(5, 6))
	var rows []string
	for i := 0; i < 400; i++ {
		rows = append(rows, fmt.Sprintf("%d,%d,%d,%s,%s,default", rng.IntN(86400), 60+rng.IntN(4*3600),
			[]int{1, 1, 1, 2, 4, 8}[rng.IntN(6)], []string{"a", "b", "c"}[rng.IntN(3)], []string{"low", "medium", "high"}[rng.IntN(3)]))
	}
	tr := csvTrace(t, rows...)
	pols, err := ParsePolicies("spillway,starburst-linear-cost", c)
	if err != nil {
		t.Fatal(err)
	}
	report := func(seed uint64) string {
		rep := Describe(tr, c, seed)
		if rep.Results, err = RunAll(tr, c, pols, Options{Seed: seed, RecordStarts: true}); err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := rep.WriteJSON(&b); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	a, b := report(11), report(11)
	if a != b {
		t.Fatal("the same seed gave two different reports")
	}
	if report(12) == a {
		t.Fatal("another seed gave the same report: lead times and failures do not follow the seed")
	}
	if !strings.Contains(a, `"capacityErrors"`) || strings.Contains(a, `"capacityErrors": 0,`) {
		t.Fatal("no capacity error was drawn; the test does not exercise fallbacks")
	}
}

func TestFluidBound(t *testing.T) {
	t0 := utc("2026-03-01T00:00:00Z")
	jobs := []Job{
		{Submit: t0, Duration: 2 * time.Hour, GPUs: 4},
		{Submit: t0.Add(time.Hour), Duration: 2 * time.Hour, GPUs: 2},
		{Submit: t0.Add(90 * time.Minute), Duration: 30 * time.Minute, GPUs: 1},
		{Submit: t0.Add(10 * time.Hour), Duration: time.Hour, GPUs: 3},
	}
	// Demand: 4 for an hour, 6 for half an hour, 7 for half an hour, 2
	// for an hour, then 3. Over 4 GPUs: 0.5h × 2 + 0.5h × 3.
	if got := FluidBound(jobs, 4); !near(got, 2.5) {
		t.Fatalf("fluid bound %v, want 2.5", got)
	}
	if got := FluidBound(jobs, 0); !near(got, 4*2+2*2+1*0.5+3) {
		t.Fatalf("with no on-prem GPUs the bound is every GPU-hour: %v", got)
	}
	if got := FluidBound(jobs, 7); got != 0 {
		t.Fatalf("enough on-prem GPUs: %v", got)
	}
}

func TestParsePolicies(t *testing.T) {
	c := cluster(t, testCluster)
	pols, err := ParsePolicies(AllPolicies, c)
	if err != nil || len(pols) != 7 {
		t.Fatalf("%d policies, %v", len(pols), err)
	}
	p, err := ParsePolicy("spillway:threshold=0.9:minWait=5m:waitTarget=1h:idleTTL=1m:maxInFlight=3:waitPerGPUHour=45s:maxWait=40m:maxWaitMultiNode=20m", c)
	if err != nil {
		t.Fatal(err)
	}
	b := p.Burst
	if b.Threshold != 0.9 || b.MinWait != 5*time.Minute || b.Queues["short"].WaitTarget != time.Hour || b.IdleTTL != time.Minute || b.MaxInFlight != 3 || b.WaitPerGPUHour != 45*time.Second || b.MaxWait != 40*time.Minute || b.MaxWaitMultiNode != 20*time.Minute {
		t.Fatalf("overrides not applied: %+v", b)
	}
	q, err := ParsePolicy("spillway:short.minWait=1h:short.threshold=0.5:default.waitTarget=2h", c)
	if err != nil {
		t.Fatal(err)
	}
	if qs := q.Burst.Queues; qs["short"].MinWait != time.Hour || qs["short"].Threshold != 0.5 || qs["default"].WaitTarget != 2*time.Hour || len(c.Burst.Queues) != 0 {
		t.Fatalf("queue overrides: %+v (the cluster's own map must stay untouched: %+v)", qs, c.Burst.Queues)
	}
	for _, bad := range []string{"spillway:threshold=2", "spillway:colour=red", "spillway:gpu.minWait=1m", "spillway:short.colour=1", "spillway:minWait", "spillway:budget=1", "karpenter", "spillway,spillway", " , "} {
		if _, err := ParsePolicies(bad, c); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestJobWaitsSpendTheWaitingBudget(t *testing.T) {
	jobs := []Job{{ID: "a", GPUs: 1, Duration: time.Hour}, {ID: "b", GPUs: 8, Duration: 2 * time.Hour}, {ID: "c", GPUs: 2, Duration: 15 * time.Minute}}
	sumRun := 3.25 * 3600.0
	for _, kind := range []string{WaitConstant, WaitLinearRuntime, WaitLinearCost} {
		w := jobWaits(WaitRule{Kind: kind, Budget: 0.5}, jobs)
		total := 0.0
		for _, d := range w {
			total += d.Seconds()
		}
		if math.Abs(total-0.5*sumRun) > 1e-3 {
			t.Errorf("%s: waits sum to %vs, want β × Σ run = %vs", kind, total, 0.5*sumRun)
		}
	}
	lc := jobWaits(WaitRule{Kind: WaitLinearCost, Budget: 0.5}, jobs)
	if !(lc["b"] > lc["a"] && lc["a"] > lc["c"]) {
		t.Fatalf("linear_cost waits grow with GPUs × run time: %v", lc)
	}
	if jobWaits(WaitRule{Kind: WaitZero}, jobs) != nil {
		t.Fatal("zero has no per-job waits")
	}
	if jobWaits(WaitRule{Kind: WaitDeclaredCost, Budget: 0.5}, jobs) != nil {
		t.Fatal("costWait is the burst policy's waitPerGPUHour, not per-job waits")
	}
	// costWait: the broker's rule (rate × GPUs × declared timeout), its
	// rate calibrated so that the waits sum to β × Σ declared timeout
	// (here 1h, 2h, 15m).
	pol := burst.Policy{MinWait: 2 * time.Minute, WaitPerGPUHour: DeclaredCostRate(0.5, jobs)}
	total := 0.0
	for _, j := range jobs {
		total += pol.MinWaitFor(burst.Job{GPUs: j.GPUs, Nodes: 1, Timeout: DeclaredTimeout(j.Duration)}).Seconds()
	}
	if want := 0.5 * 3.25 * 3600; math.Abs(total-want) > 0.1 {
		t.Errorf("costWait: waits sum to %vs, want β × Σ timeout = %vs", total, want)
	}
}

func TestParseClusterNamesTheField(t *testing.T) {
	cases := map[string]string{
		"nodes":                       "nodes: []",
		"nodes[0].gpus":               "nodes: [{name: n, count: 1, gpus: 0, model: x, memory: 1Gi}]",
		"burst.threshold":             testCluster + "\n",
		"offers[0].gpus":              "nodes: [{name: n, count: 1, gpus: 1, model: x, memory: 1Gi}]\noffers: [{provider: p, instanceType: t, gpuModel: m, gpus: 0, pricePerHour: '1'}]",
		"broker.queues[0].kind":       "broker: {queues: [{name: default, kind: fast}]}\nnodes: [{name: n, count: 1, gpus: 1, model: x, memory: 1Gi}]",
		"broker.burst.queues[0].name": "nodes: [{name: n, count: 1, gpus: 1, model: x, memory: 1Gi}]\nbroker: {burst: {queues: [{name: gpu, minWait: 1m}]}}",
		"overhead":                    "nodes: [{name: n, count: 1, gpus: 1, model: x, memory: 1Gi}]\noverhead: nobody",
		"jobs.preemptible":            "nodes: [{name: n, count: 1, gpus: 1, model: x, memory: 1Gi}]\njobs: {preemptible: [urgent]}",
		"burst.leadTime":              "nodes: [{name: n, count: 1, gpus: 1, model: x, memory: 1Gi}]\nburst: {leadTime: {p50: 10m, p99: 1m}}",
		"burst.capacityFailureRate":   "nodes: [{name: n, count: 1, gpus: 1, model: x, memory: 1Gi}]\nburst: {capacityFailureRate: 1}",
		"starburst.waitingBudget":     "nodes: [{name: n, count: 1, gpus: 1, model: x, memory: 1Gi}]\nstarburst: {waitingBudget: -1}",
		"colour":                      "colour: red",
	}
	cases["broker.burst.threshold"] = "nodes: [{name: n, count: 1, gpus: 1, model: x, memory: 1Gi}]\nbroker: {burst: {threshold: 1.5}}"
	delete(cases, "burst.threshold")
	for field, doc := range cases {
		t.Run(field, func(t *testing.T) {
			_, err := ParseCluster([]byte(doc))
			if err == nil || !strings.Contains(err.Error(), field) {
				t.Fatalf("error %v does not name %s", err, field)
			}
		})
	}
}

func TestTraceFromJobs(t *testing.T) {
	t0 := utc("2026-03-01T00:00:00Z")
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	j := &broker.Job{ID: "01A", SubmittedAt: at(0), Spec: broker.Spec{Team: "nlp", Queue: "default", Priority: "low",
		Resources: broker.Resources{GPUs: 2, Nodes: 2}},
		History: []broker.Transition{
			{At: at(0), To: broker.StatePending}, {At: at(5), To: broker.StateStarting}, {At: at(6), To: broker.StateRunning},
			{At: at(16), To: broker.StatePreempted}, {At: at(16), To: broker.StatePending},
			{At: at(30), To: broker.StateStarting}, {At: at(30), To: broker.StateRunning}, {At: at(45), To: broker.StateSucceeded},
		}}
	never := &broker.Job{ID: "01B", SubmittedAt: at(1), History: []broker.Transition{{At: at(1), To: broker.StatePending}, {At: at(2), To: broker.StateCancelled}}}
	tr := TraceFromJobs([]*broker.Job{never, j})
	want := []Job{{ID: "01A", Submit: t0, Duration: 25 * time.Minute, GPUs: 4, Team: "nlp", Priority: "low", Queue: "default"}}
	if len(tr.Jobs) != 1 || tr.Jobs[0] != want[0] {
		t.Fatalf("trace %+v, want %+v", tr.Jobs, want)
	}
}

func TestFrontierChecks(t *testing.T) {
	res := []*Result{
		{Policy: "spillway:a", JCT: Stats{Mean: 100}, BurstCost: usd("50")},
		{Policy: "spillway:b", JCT: Stats{Mean: 200}, BurstCost: usd("30")},
		{Policy: "spillway:c", JCT: Stats{Mean: 250}, BurstCost: usd("40")},
		{Policy: "spillway:costWait=0.5", WaitPerGPUHour: time.Minute, JCT: Stats{Mean: 140}, BurstCost: usd("20")},
		{Policy: "starburst-linear-cost:x", JCT: Stats{Mean: 210}, BurstCost: usd("35")},
		{Policy: "starburst-linear-cost:y", JCT: Stats{Mean: 150}, BurstCost: usd("45")},
		{Policy: "starburst-linear-cost:z", JCT: Stats{Mean: 90}, BurstCost: usd("99")},
	}
	s := Frontier(res)
	got := map[string]bool{}
	for _, c := range s.Checks {
		got[c.Family+" "+c.Starburst] = c.AtOrBelow
	}
	// spillway: x is beaten by b (200 ≤ 210, 30 ≤ 35); y only by a, which
	// costs 50 > 45; z: no spillway point is that fast. costWait: beats x
	// and y, not z.
	want := map[string]bool{
		"spillway starburst-linear-cost:x": true, "spillway starburst-linear-cost:y": false, "spillway starburst-linear-cost:z": false,
		"spillway+costWait starburst-linear-cost:x": true, "spillway+costWait starburst-linear-cost:y": true, "spillway+costWait starburst-linear-cost:z": false,
		"spillway (any) starburst-linear-cost:x": true, "spillway (any) starburst-linear-cost:y": true, "spillway (any) starburst-linear-cost:z": false,
	}
	if diff := cmp.Diff(want, got); diff != "" || s.AllAtOrBelow || s.CostWaitAllAtOrBelow || s.AnyAtOrBelow {
		t.Fatalf("checks (-want +got):\n%s", diff)
	}
	// Gaps: spillway's frontier is a (100, 50) - b (200, 30); at x (210)
	// it has no point; at y (150) it is 40 against 45. Both families
	// together: a (100, 50) - costWait (140, 20); y at 150 is past it.
	gaps := map[string]string{}
	for _, c := range s.Checks {
		if c.Gap != nil {
			gaps[c.Family+" "+c.Starburst] = fmt.Sprintf("%+.3f", *c.Gap)
		}
	}
	if diff := cmp.Diff(map[string]string{"spillway starburst-linear-cost:y": "-0.111"}, gaps); diff != "" {
		t.Fatalf("gaps (-want +got):\n%s", diff)
	}
	frontier := map[string]bool{}
	for _, p := range s.Points {
		frontier[p.Policy] = p.Frontier
	}
	if !frontier["spillway:a"] || !frontier["spillway:b"] || frontier["spillway:c"] || !frontier["spillway:costWait=0.5"] {
		t.Fatalf("frontier %v", frontier)
	}
	var table bytes.Buffer
	if err := s.WriteTable(&table, "USD"); err != nil || !strings.Contains(table.String(), "at or below at every JCT: false") {
		t.Fatalf("table (%v):\n%s", err, table.String())
	}
}

func TestReportOutputs(t *testing.T) {
	c := cluster(t, testCluster)
	tr := burstTrace(t)
	pols, err := ParsePolicies("no-burst,spillway", c)
	if err != nil {
		t.Fatal(err)
	}
	rep := Describe(tr, c, 1)
	if rep.Results, err = RunAll(tr, c, pols, Options{Seed: 1}); err != nil {
		t.Fatal(err)
	}
	var table bytes.Buffer
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"fluid lower bound on burst GPU-hours: 12", "spillway", "no-burst", "priority medium", "26.40"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	var svg bytes.Buffer
	if err := WriteChart(&svg, rep); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(&svg)
	polylines := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("the chart is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			polylines++
		}
	}
	if polylines != 6 {
		t.Fatalf("%d polylines, want 3 per policy", polylines)
	}
}

// TestPhillyPrefix replays the first jobs of the Philly trace when it is
// at hand: SPILLWAY_PHILLY, or the shared traces folder next to the
// checkout where the Makefile's PHILLY looks (or inside it). Under CI=true
// a missing trace fails the test.
func TestPhillyPrefix(t *testing.T) {
	var f *os.File
	var err error
	for _, path := range []string{os.Getenv("SPILLWAY_PHILLY"), "../../../shared/traces/philly/philly.csv", "../../../../shared/traces/philly/philly.csv",
		"../../shared/traces/philly/philly.csv"} {
		if path == "" {
			continue
		}
		if f, err = os.Open(path); err == nil {
			break
		}
	}
	if f == nil {
		msg := fmt.Sprintf("Philly trace not found (%v); set SPILLWAY_PHILLY to its philly.csv", err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	defer f.Close()
	tr, err := ReadPhilly(f, PhillyOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Jobs) != 82247 {
		t.Fatalf("%d jobs, want 82,247", len(tr.Jobs))
	}
	from, _ := ParseTime("2017-10-01", tr.Location)
	tr = tr.Window(from, from.Add(36*time.Hour))
	c, err := LoadCluster("../../deploy/sim/cluster.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, tr, c, "spillway", Options{Seed: 1})
	if r.Succeeded+r.TimedOut != r.Jobs || r.OnPremAllocation <= 0 || r.BurstGPUHours < r.FluidBoundGPUHours {
		t.Fatalf("%d jobs, %d done; on-prem %.2f; burst %.0f GPU-h against a bound of %.0f", r.Jobs, r.Succeeded+r.TimedOut,
			r.OnPremAllocation, r.BurstGPUHours, r.FluidBoundGPUHours)
	}
}

// TestSnapshotWithoutIdleBurstNodes replays a random trace with and
// without the burst nodes no bound job waits for in the scheduler's
// snapshot: the replays must agree to the byte.
func TestSnapshotWithoutIdleBurstNodes(t *testing.T) {
	c := cluster(t, strings.Replace(testCluster, "leadTime: {p50: 1m, p99: 1m, max: 1m}",
		"leadTime: {p50: 1m, p99: 20m, max: 25m}\n  capacityFailureRate: 0.1", 1)+"\njobs: {preemptible: [low]}\n")
	rng := rand.New(rand.NewPCG(8, 9))
	var rows []string
	for i := 0; i < 300; i++ {
		rows = append(rows, fmt.Sprintf("%d,%d,%d,%s,%s,default", rng.IntN(43200), 60+rng.IntN(3*3600),
			[]int{1, 1, 2, 4, 8}[rng.IntN(5)], []string{"a", "b"}[rng.IntN(2)], []string{"low", "medium", "high"}[rng.IntN(3)]))
	}
	tr := csvTrace(t, rows...)
	for _, policy := range []string{"spillway", "burst-any-pending", "starburst-linear-cost"} {
		p, err := ParsePolicy(policy, c)
		if err != nil {
			t.Fatal(err)
		}
		replay := func(full bool) string {
			e, err := newEngine(tr, c, p, Options{Seed: 3, RecordStarts: true})
			if err != nil {
				t.Fatal(err)
			}
			e.fullSnapshot = full
			e.loop()
			return mustJSON(t, e.finish())
		}
		if replay(false) != replay(true) {
			t.Fatalf("%s: the reduced snapshot changes the replay", policy)
		}
	}
}

// TestGangsBurst replays three 2-node gangs (8 GPUs on 4-GPU nodes) at
// once: one fills the cluster, and under every policy that bursts the two
// others go out, each to a group of two 4-GPU machines of one offer,
// started and ended together, through the broker's own burstctl. With
// capacity failures, a group whose member finds no capacity is given up
// whole and the gang tried on the next offer; every gang still ends, and
// no machine is left.
func TestGangsBurst(t *testing.T) {
	rows := []string{"0,3600,8,a,medium,default", "0,3600,8,a,medium,default", "0,3600,8,a,medium,default"}
	tr := csvTrace(t, rows...)
	pols := strings.Split(AllPolicies, ",")
	for _, withFailures := range []bool{false, true} {
		yaml := testCluster
		if withFailures {
			yaml = strings.Replace(yaml, "leadTime: {p50: 1m, p99: 1m, max: 1m}", "leadTime: {p50: 1m, p99: 1m, max: 1m}\n  capacityFailureRate: 0.5", 1)
			yaml = strings.Replace(yaml, "offers:\n", "offers:\n  - {provider: other, region: r2, instanceType: big2, gpuModel: V100, gpus: 4, gpuMemory: 16Gi, pricePerHour: \"9\"}\n", 1)
		}
		c := cluster(t, yaml)
		for _, pol := range pols {
			if pol == PolicyNoBurst {
				continue
			}
			t.Run(fmt.Sprintf("%s/failures=%v", pol, withFailures), func(t *testing.T) {
				r := run(t, tr, c, pol, Options{Seed: 7, RecordStarts: true, RecordMachines: true})
				if r.Succeeded != 3 || r.MultiNodeJobs != 3 {
					t.Fatalf("%d succeeded of %d gangs, want 3 of 3", r.Succeeded, r.MultiNodeJobs)
				}
				if r.JobsOnBurst != 2 {
					t.Fatalf("%d gangs ran on burst machines, want 2", r.JobsOnBurst)
				}
				for _, s := range r.Starts {
					if s.Burst && len(s.Nodes) != 2 {
						t.Errorf("gang %s started on burst nodes %v, want 2", s.Job, s.Nodes)
					}
				}
				groups := map[string][]*broker.InstanceRecord{}
				for _, m := range r.MachineRecords {
					if m.Group == "" || m.GroupSize != 2 {
						t.Fatalf("machine %s launched for a gang is in group %q of %d", m.ID, m.Group, m.GroupSize)
					}
					if !m.State.Ended() {
						t.Fatalf("machine %s left %s", m.ID, m.State)
					}
					groups[m.Group] = append(groups[m.Group], m)
				}
				ran := 0
				for g, ms := range groups {
					if len(ms) != 2 {
						t.Fatalf("group %s has %d machines, want 2", g, len(ms))
					}
					if ms[0].Offer.Key() != ms[1].Offer.Key() {
						t.Errorf("group %s mixes offers %s and %s", g, ms[0].Offer.Key(), ms[1].Offer.Key())
					}
					ready := 0
					for _, m := range ms {
						if m.ReadyAt != nil {
							ready++
						}
					}
					switch ready {
					case 2:
						ran++
					case 1:
						t.Errorf("group %s: one member ready and one not", g)
					}
				}
				if ran != 2 {
					t.Errorf("%d groups ran, want 2", ran)
				}
				if !withFailures && (len(groups) != 2 || r.CapacityErrors != 0) {
					t.Errorf("%d groups launched without failures, want 2", len(groups))
				}
				t.Logf("%d capacity errors, %d groups launched, %d launch failures", r.CapacityErrors, len(groups), r.LaunchFailures)
				if withFailures && r.CapacityErrors == 0 {
					t.Errorf("no capacity failure drawn: the case tests nothing")
				}
			})
		}
	}
}
