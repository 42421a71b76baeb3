package burst

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/broker"
)

// spillInput: owned GPUs idle (one free 8-GPU node), nothing waiting, one
// ready 8-GPU machine (98.32 USD/h) running a 4-GPU checkpointable job
// started 1h ago with a 10h declared time and a checkpoint 5m ago.
func spillInput() *Input {
	in := input(0)
	in.Policy.SpillBack = SpillBackPolicy{Enabled: true, Margin: 0.5, MinInterval: time.Hour, Staging: 2 * time.Minute}
	in.Machines = []Machine{{ID: "m1", Provider: "aws", Offer: catalog[0], State: broker.MachineReady, Team: "nlp", Jobs: []string{"r1"},
		GPUsUsed: 4, ReadyGPUs: 8, LaunchedAt: now.Add(-2 * time.Hour)}}
	in.Running = []Running{runningJob("r1", "m1", 4)}
	in.Home = []HomeNode{{Name: "n1", Free: 8, GPUModel: "NVIDIA H100 80GB", GPUMemory: 80 << 30}}
	in.HomeRate = usd("2.00")
	return in
}

func runningJob(id, machine string, gpus int) Running {
	return Running{ID: id, Machine: machine, GPUs: gpus, Checkpointable: true, StartedAt: now.Add(-time.Hour),
		Timeout: 10 * time.Hour, Grace: time.Minute, LastCheckpoint: now.Add(-5 * time.Minute)}
}

func TestSpillBackMovesWhenTheSavingBeatsTheCost(t *testing.T) {
	d := Decide(spillInput())
	if len(d.SpillBacks) != 1 {
		t.Fatalf("spill-backs %+v, stays %v", d.SpillBacks, d.Stays)
	}
	sb := d.SpillBacks[0]
	// Saving: the machine's 98.32/h for the 9h left, less 4 GPUs × 9h at
	// 2.00 = 884.88 − 72.00. Cost: 4 GPUs × (1m grace + 2m staging + 5m
	// lost) at 12.29/GPU-h = 6.5546… → 6.553333 (micro units, rounded down).
	if got, want := sb.Saving, usd("812.88"); got != want {
		t.Errorf("saving %s, want %s", got, want)
	}
	if got, want := sb.Cost.Cents(), "6.55"; got != want {
		t.Errorf("cost %s, want %s", got, want)
	}
	want := []SpillJob{{Job: "r1", Node: "n1", GPUs: 4, Remaining: 9 * time.Hour, LostWork: 5 * time.Minute}}
	if diff := cmp.Diff(want, sb.Jobs); diff != "" {
		t.Errorf("jobs (-want +got):\n%s", diff)
	}
	if !strings.Contains(sb.Detail, "expected saving 812.88 USD") {
		t.Errorf("detail %q", sb.Detail)
	}
	if diff := cmp.Diff([]Stop{{Machine: "m1", Reason: StopSpillBack, Detail: sb.Detail}}, d.Stops); diff != "" {
		t.Errorf("stops (-want +got):\n%s", diff)
	}
}

func TestSpillBackStays(t *testing.T) {
	cases := []struct {
		name string
		edit func(in *Input)
		why  string
	}{
		{"something waits on-prem", func(in *Input) { in.Pending = []Job{mk("w").obj()} }, "jobs wait on-prem"},
		{"not checkpointable", func(in *Input) { in.Running[0].Checkpointable = false }, "has no checkpoint in object storage"},
		{"moved within the interval", func(in *Input) { in.Running[0].LastMoved = now.Add(-30 * time.Minute) }, "moved home 30m ago"},
		{"already stopping", func(in *Input) { in.Running[0].Stopping = true }, "is stopping"},
		{"past its declared time", func(in *Input) { in.Running[0].Timeout = time.Hour }, "past its declared time"},
		{"saving below cost × margin: almost done and an old checkpoint", func(in *Input) {
			in.Running[0].Timeout = time.Hour + 10*time.Minute
			in.Running[0].LastCheckpoint = time.Time{}
		}, "does not beat the move's cost"},
		{"no room at home", func(in *Input) { in.Home[0].Free = 3 }, "do not fit on the idle owned GPUs"},
		{"home is another model", func(in *Input) { in.Running[0].GPUModel = "A100" }, "do not fit"},
		{"a job still starting on it", func(in *Input) { in.Machines[0].Jobs = []string{"r1", "r2"} }, "still starting"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := spillInput()
			c.edit(in)
			d := Decide(in)
			if len(d.SpillBacks) != 0 {
				t.Fatalf("moved: %+v", d.SpillBacks)
			}
			if !strings.Contains(d.Stays["m1"], c.why) {
				t.Errorf("stay reason %q, want it to say %q", d.Stays["m1"], c.why)
			}
		})
	}
}

func TestSpillBackOff(t *testing.T) {
	in := spillInput()
	in.Policy.SpillBack.Enabled = false
	if d := Decide(in); len(d.SpillBacks) != 0 || len(d.Stays) != 0 || len(d.Stops) != 0 {
		t.Fatalf("spill-back off still decided: %+v", d)
	}
}

// The margin is what the saving must beat: the same move passes at one
// margin and not at a larger one.
func TestSpillBackMargin(t *testing.T) {
	in := spillInput()
	in.Running[0].Timeout = time.Hour + 4*time.Minute // 4m left: saving 98.32×4/60 − 2×4×4/60 = 6.02
	in.Running[0].LastCheckpoint = now
	in.Policy.SpillBack.Margin = 0
	if d := Decide(in); len(d.SpillBacks) != 1 {
		t.Fatalf("margin 0: not moved (%v)", d.Stays)
	}
	// Cost 4 GPUs × 3m at 12.29 = 2.458: margin 2 needs more than 7.374.
	in.Policy.SpillBack.Margin = 2
	if d := Decide(in); len(d.SpillBacks) != 0 {
		t.Fatalf("margin 2: moved %+v", d.SpillBacks)
	}
}

// Two machines compete for one free node: the larger net saving wins, and
// the other stays with the reason.
func TestSpillBackBiggestSavingFirst(t *testing.T) {
	in := spillInput()
	in.Machines = append(in.Machines, Machine{ID: "m0", Provider: "aws", Offer: catalog[0], State: broker.MachineReady, Team: "nlp",
		Jobs: []string{"r0"}, GPUsUsed: 8, ReadyGPUs: 8, LaunchedAt: now.Add(-2 * time.Hour)})
	r0 := runningJob("r0", "m0", 8)
	r0.Timeout = 3 * time.Hour
	in.Running = append(in.Running, r0)
	d := Decide(in)
	if len(d.SpillBacks) != 1 || d.SpillBacks[0].Machine != "m1" {
		t.Fatalf("spill-backs %+v", d.SpillBacks)
	}
	if !strings.Contains(d.Stays["m0"], "do not fit") {
		t.Errorf("m0 stays because %q", d.Stays["m0"])
	}
	// Room for both: both go, and every job has its own node.
	in.Home = append(in.Home, HomeNode{Name: "n2", Free: 8, GPUModel: "H100"})
	d = Decide(in)
	if len(d.SpillBacks) != 2 {
		t.Fatalf("spill-backs %+v, stays %v", d.SpillBacks, d.Stays)
	}
}

// The checkpoint interval the job declares bounds the lost work.
func TestSpillBackLostWorkBoundedByInterval(t *testing.T) {
	in := spillInput()
	in.Running[0].LastCheckpoint = time.Time{}
	in.Running[0].CheckpointEvery = 10 * time.Minute
	d := Decide(in)
	if len(d.SpillBacks) != 1 || d.SpillBacks[0].Jobs[0].LostWork != 10*time.Minute {
		t.Fatalf("spill-backs %+v", d.SpillBacks)
	}
}

func TestLastSpillBack(t *testing.T) {
	j := &broker.Job{}
	if !LastSpillBack(j).IsZero() {
		t.Fatal("never moved: want zero")
	}
	j.Transit(now.Add(-2*time.Hour), broker.StatePreempted, StopSpillBack, "")
	j.Transit(now.Add(-time.Hour), broker.StatePreempted, "preempted", "")
	if got := LastSpillBack(j); !got.Equal(now.Add(-2 * time.Hour)) {
		t.Fatalf("last spill-back %s", got)
	}
}

// A waiting job too big for the idle owned GPUs (or for another model)
// does not hold the move back; one that fits does.
func TestSpillBackWaitingJobsThatCannotUseTheIdleCards(t *testing.T) {
	for _, c := range []struct {
		name string
		w    Job
		move bool
	}{
		{"fits", mk("w").gpus(8).obj(), false},
		{"too big for the free node", mk("w").gpus(16).obj(), true},
		{"another model", mk("w").model("A100").obj(), true},
		{"a gang of two nodes, one free", func() Job { j := mk("w").gpus(8).obj(); j.Nodes = 2; return j }(), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := spillInput()
			in.Pending = []Job{c.w}
			d := Decide(in)
			if got := len(d.SpillBacks) == 1; got != c.move {
				t.Fatalf("moved %v, want %v (stays %v)", got, c.move, d.Stays)
			}
			if !c.move && d.StayRules["m1"] != StayJobsWait {
				t.Errorf("rule %q, want %q", d.StayRules["m1"], StayJobsWait)
			}
		})
	}
}

// Of a machine with a long job and a short one that cannot move (another
// model than the owned GPUs), the long one moves alone: the machine runs
// on only for the short one, and is not stopped.
func TestSpillBackMovesPartOfAMachine(t *testing.T) {
	in := spillInput()
	in.Machines[0].Jobs = []string{"r1", "r2"}
	in.Machines[0].GPUsUsed = 8
	r2 := runningJob("r2", "m1", 4)
	r2.GPUModel, r2.Timeout = "A100", 2*time.Hour // 1h left
	in.Running = append(in.Running, r2)
	d := Decide(in)
	if len(d.SpillBacks) != 1 {
		t.Fatalf("spill-backs %+v, stays %v", d.SpillBacks, d.Stays)
	}
	sb := d.SpillBacks[0]
	if sb.Whole || len(sb.Jobs) != 1 || sb.Jobs[0].Job != "r1" {
		t.Fatalf("spill-back %+v: want r1 alone", sb)
	}
	// The machine's 98.32/h for the 8h cut (9h → 1h), less 4 GPUs × 9h at 2.00.
	if got, want := sb.Saving, usd("714.56"); got != want {
		t.Errorf("saving %s, want %s", got, want)
	}
	if len(d.Stops) != 0 {
		t.Errorf("stops %+v: the machine stays for r2", d.Stops)
	}
	if !strings.Contains(sb.Detail, "(1 of the machine's 2 jobs)") {
		t.Errorf("detail %q", sb.Detail)
	}

	// When the job that cannot move has the most time left, moving the
	// other saves nothing: the machine stays, with that job's rule.
	in.Running[1].Timeout = 20 * time.Hour
	in.Running[1].Checkpointable = false
	d = Decide(in)
	if len(d.SpillBacks) != 0 || d.StayRules["m1"] != StayNoCheckpoint {
		t.Fatalf("spill-backs %+v, rules %v", d.SpillBacks, d.StayRules)
	}
}

// gangInput: a 16-GPU gang (2 × 8) running on its group of two ready
// 8-GPU machines, and two owned nodes with 8 free GPUs each.
func gangInput() *Input {
	in := spillInput()
	in.Machines = []Machine{
		{ID: "g1", Provider: "aws", Offer: catalog[0], State: broker.MachineReady, Team: "nlp", Group: "grp", Jobs: []string{"gang"},
			GPUsUsed: 8, ReadyGPUs: 8, LaunchedAt: now.Add(-2 * time.Hour)},
		{ID: "g2", Provider: "aws", Offer: catalog[0], State: broker.MachineReady, Team: "nlp", Group: "grp", Jobs: []string{"gang"},
			GPUsUsed: 8, ReadyGPUs: 8, LaunchedAt: now.Add(-2 * time.Hour)},
	}
	in.Running = []Running{runningJob("gang", "g1", 16), runningJob("gang", "g2", 16)}
	in.Home = []HomeNode{{Name: "n1", Free: 8}, {Name: "n2", Free: 8}}
	return in
}

// A gang moves home when as many owned nodes as it has members each have
// room for one: its whole group drains and ends.
func TestSpillBackMovesAGangWhole(t *testing.T) {
	d := Decide(gangInput())
	if len(d.SpillBacks) != 1 {
		t.Fatalf("spill-backs %+v, stays %v", d.SpillBacks, d.Stays)
	}
	sb := d.SpillBacks[0]
	// Saving: two machines at 98.32/h for the 9h left, less 16 GPUs × 9h
	// at 2.00 = 1,769.76 − 288.00. Cost: 16 GPUs × 8m at 12.29/GPU-h.
	if got, want := sb.Saving, usd("1481.76"); got != want {
		t.Errorf("saving %s, want %s", got, want)
	}
	if got, want := sb.Cost.Cents(), "26.22"; got != want {
		t.Errorf("cost %s, want %s", got, want)
	}
	want := []SpillJob{
		{Job: "gang", Node: "n1", GPUs: 8, Remaining: 9 * time.Hour, LostWork: 5 * time.Minute},
		{Job: "gang", Node: "n2", GPUs: 8, Remaining: 9 * time.Hour, LostWork: 5 * time.Minute},
	}
	if diff := cmp.Diff(want, sb.Jobs); diff != "" {
		t.Errorf("jobs (-want +got):\n%s", diff)
	}
	if !sb.Whole || !strings.Contains(sb.Detail, "gang across group grp, 2 nodes") {
		t.Errorf("whole %v, detail %q", sb.Whole, sb.Detail)
	}
	var stopped []string
	for _, s := range d.Stops {
		if s.Reason != StopSpillBack {
			t.Errorf("stop %+v: reason is not %s", s, StopSpillBack)
		}
		stopped = append(stopped, s.Machine)
	}
	if diff := cmp.Diff([]string{"g1", "g2"}, stopped); diff != "" {
		t.Errorf("stopped machines (-want +got):\n%s", diff)
	}
}

func TestSpillBackGangStays(t *testing.T) {
	cases := []struct {
		name string
		edit func(in *Input)
		rule string
	}{
		{"one node free for two members", func(in *Input) { in.Home[1].Free = 7 }, StayNoFit},
		{"one member's machine not ready", func(in *Input) { in.Machines[1].State = broker.MachineBootstrapping }, StayStarting},
		{"not checkpointable", func(in *Input) {
			for i := range in.Running {
				in.Running[i].Checkpointable = false
			}
		}, StayNoCheckpoint},
		{"almost done", func(in *Input) {
			for i := range in.Running {
				in.Running[i].Timeout = time.Hour + 5*time.Minute
			}
		}, StaySaving},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := gangInput()
			c.edit(in)
			d := Decide(in)
			if len(d.SpillBacks) != 0 {
				t.Fatalf("moved: %+v", d.SpillBacks)
			}
			if d.StayRules["g1"] != c.rule {
				t.Errorf("stay rule %q (%q), want %q", d.StayRules["g1"], d.Stays["g1"], c.rule)
			}
		})
	}
}
