package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/spillway-dev/spillway/broker"
)

// spotCluster is testCluster with a spot offer of 4 GPUs, cheaper than
// the on-demand ones, whose machines are reclaimed at rate (per hour)
// with a notice of notice.
func spotCluster(t *testing.T, rate, notice string) *Cluster {
	t.Helper()
	return cluster(t, strings.Replace(testCluster, "offers:\n", "offers:\n  - {provider: cloud, region: r1, instanceType: big, gpuModel: V100, gpus: 4, gpuMemory: 16Gi, spot: true, pricePerHour: \"3\", reclaimsPerHour: "+rate+", reclaimNotice: "+notice+"}\n", 1))
}

// reclaimTrace is 40 two-hour 1-GPU jobs at once on the 8-GPU test
// cluster: 32 burst, onto spot machines first (low is preemptible,
// so it may run on spot).
func reclaimTrace(t *testing.T) *Trace {
	var rows []string
	for i := 0; i < 40; i++ {
		rows = append(rows, "0,7200,1,a,low,default")
	}
	return csvTrace(t, rows...)
}

// replay runs like Run and keeps the engine, for the jobs' histories.
func replay(t *testing.T, tr *Trace, c *Cluster, policy string, opt Options) (*engine, *Result) {
	t.Helper()
	p, err := ParsePolicy(policy, c)
	if err != nil {
		t.Fatal(err)
	}
	e, err := newEngine(tr, c, p, opt)
	if err != nil {
		t.Fatal(err)
	}
	e.loop()
	e.meterMachines(e.now.Add(e.meterCfg.Slice + time.Hour))
	if e.err != nil {
		t.Fatal(e.err)
	}
	return e, e.finish()
}

type attempt struct {
	job        string
	n          int
	start, end time.Time
	node       string
}

// attempts are every job's attempts, from their starts and histories.
func attempts(e *engine, r *Result) []attempt {
	var out []attempt
	for _, s := range r.Starts {
		sj := e.byID[s.Job]
		a := attempt{job: s.Job, n: s.Attempt, start: s.At, node: s.Nodes[0]}
		seen := 0
		for _, h := range sj.j.History {
			if h.To == broker.StateStarting {
				seen++
			}
			if seen == s.Attempt && h.From.Holding() && !h.To.Holding() {
				a.end = h.At
				break
			}
		}
		out = append(out, a)
	}
	return out
}

// TestSpotReclaims: spot machines are reclaimed as drawn from the seed;
// their jobs checkpoint at the notice and finish elsewhere, and no job's
// attempt outlives its machine in the ledger.
func TestSpotReclaims(t *testing.T) {
	c := spotCluster(t, "1", "2m")
	tr := reclaimTrace(t)
	opt := Options{Seed: 3, RecordStarts: true, RecordMachines: true}
	e, r := replay(t, tr, c, "burst-any-pending", opt)
	if r.Reclaims == 0 || r.ReclaimedAttempts == 0 {
		t.Fatalf("%d reclaims, %d attempts reclaimed: the rate should draw some", r.Reclaims, r.ReclaimedAttempts)
	}
	if r.Succeeded != 40 {
		t.Fatalf("%d of 40 jobs succeeded", r.Succeeded)
	}
	t.Logf("%d machines, %d reclaimed, %d attempts reclaimed", r.Machines, r.Reclaims, r.ReclaimedAttempts)
	// The checkpoint (10s) fits in the notice's grace (1m): no work lost.
	if r.ReclaimLostGPUHours != 0 {
		t.Errorf("lost %.3f GPU-h, want 0", r.ReclaimLostGPUHours)
	}
	if r.meterProblems != 0 {
		t.Errorf("%d meter problems", r.meterProblems)
	}
	machines := map[string]*broker.InstanceRecord{}
	reclaimed := 0
	for _, m := range r.MachineRecords {
		machines[m.ID] = m
		if m.Reclaim != nil {
			reclaimed++
			if m.TerminatedAt == nil || m.TerminatedAt.After(m.Reclaim.At) {
				t.Errorf("machine %s reclaimed at %s ended at %v", m.ID, m.Reclaim.At, m.TerminatedAt)
			}
			if m.Offer.Spot != true || m.Reclaim.At.Sub(m.Reclaim.SeenAt) != 2*time.Minute {
				t.Errorf("machine %s: reclaim %+v on offer %s", m.ID, m.Reclaim, m.Offer.Key())
			}
		}
	}
	if reclaimed != r.Reclaims {
		t.Errorf("%d machine records reclaimed, result says %d", reclaimed, r.Reclaims)
	}
	moved := 0
	byJob := map[string][]attempt{}
	for _, a := range attempts(e, r) {
		byJob[a.job] = append(byJob[a.job], a)
		if a.end.IsZero() {
			t.Fatalf("job %s attempt %d has no end", a.job, a.n)
		}
		if m := machines[a.node]; m != nil {
			if a.start.Before(*m.ReadyAt) || a.end.After(*m.TerminatedAt) {
				t.Errorf("job %s attempt %d [%s, %s] outside machine %s [%s, %s]", a.job, a.n, a.start, a.end, m.ID, m.ReadyAt, m.TerminatedAt)
			}
		}
	}
	for job, as := range byJob {
		for i := 1; i < len(as); i++ {
			prev, next := as[i-1], as[i]
			if next.start.Before(prev.end) {
				t.Errorf("job %s: attempt %d starts at %s before attempt %d ends at %s", job, next.n, next.start, prev.n, prev.end)
			}
			if m := machines[prev.node]; m != nil && m.Reclaim != nil && !prev.end.After(m.Reclaim.At) && prev.end.After(m.Reclaim.SeenAt.Add(-time.Second)) {
				moved++
				if next.node == prev.node {
					t.Errorf("job %s resumed on the reclaimed machine %s", job, prev.node)
				}
				if h := findReclaimEnd(e.byID[job].j, prev.end); h == nil {
					t.Errorf("job %s: no spot_reclaim end at %s in its history", job, prev.end)
				}
			}
		}
	}
	if moved == 0 {
		t.Fatal("no job resumed after a reclaim")
	}

	// The same seed draws the same reclaims; another seed others.
	again := run(t, tr, c, "burst-any-pending", opt)
	if mustJSON(t, again) != mustJSON(t, r) {
		t.Fatal("the same seed gave two different results")
	}
	other := run(t, tr, c, "burst-any-pending", Options{Seed: 4, RecordStarts: true, RecordMachines: true})
	if mustJSON(t, other) == mustJSON(t, r) {
		t.Fatal("another seed gave the same result: reclaims do not follow the seed")
	}
}

func findReclaimEnd(j *broker.Job, at time.Time) *broker.Transition {
	for i, h := range j.History {
		if h.To == broker.StatePreempted && h.Reason == broker.ReasonSpotReclaim && h.At.Equal(at) {
			return &j.History[i]
		}
	}
	return nil
}

// A checkpoint longer than the notice's grace does not finish: the job
// runs until the machine goes and resumes from its last periodic
// checkpoint, the work since counted as lost.
func TestSpotReclaimLosesWorkWithoutTimeToCheckpoint(t *testing.T) {
	c := spotCluster(t, "1", "30s")
	c.CheckpointTime = 20 * time.Second // grace 15s: half the notice
	c.CheckpointInterval = 10 * time.Minute
	r := run(t, reclaimTrace(t), c, "burst-any-pending", Options{Seed: 3})
	if r.ReclaimedAttempts == 0 || r.Succeeded != 40 {
		t.Fatalf("%d attempts reclaimed, %d succeeded", r.ReclaimedAttempts, r.Succeeded)
	}
	t.Logf("%d attempts reclaimed, %.3f GPU-h lost", r.ReclaimedAttempts, r.ReclaimLostGPUHours)
	// At most one checkpoint interval lost per reclaimed attempt.
	if r.ReclaimLostGPUHours <= 0 || r.ReclaimLostGPUHours > float64(r.ReclaimedAttempts)*(10*time.Minute).Hours() {
		t.Fatalf("lost %.3f GPU-h over %d attempts", r.ReclaimLostGPUHours, r.ReclaimedAttempts)
	}
}

func TestReclaimConfigNamesTheField(t *testing.T) {
	for _, tc := range []struct{ offer, field string }{
		{`{provider: c, instanceType: x, gpuModel: V100, gpus: 1, pricePerHour: "1", reclaimsPerHour: 0.1}`, "offers[0].reclaimsPerHour"},
		{`{provider: c, instanceType: x, gpuModel: V100, gpus: 1, pricePerHour: "1", spot: true, reclaimsPerHour: -1}`, "offers[0].reclaimsPerHour"},
		{`{provider: c, instanceType: x, gpuModel: V100, gpus: 1, pricePerHour: "1", spot: true, reclaimNotice: 2m}`, "offers[0].reclaimNotice"},
		{`{provider: c, instanceType: x, gpuModel: V100, gpus: 1, pricePerHour: "1", spot: true, reclaimsPerHour: 1, reclaimNotice: 2h}`, "offers[0].reclaimNotice"},
	} {
		_, err := ParseCluster([]byte("nodes: [{name: n, count: 1, gpus: 1, model: P100, memory: 16Gi}]\noffers:\n  - " + tc.offer + "\n"))
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: error %v, want one naming %s", tc.offer, err, tc.field)
		}
	}
}
