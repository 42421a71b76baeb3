package sim

import (
	"fmt"
	"strings"
	"testing"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/burst"
)

// A 20-hour 4-GPU job bursts while two 1-hour jobs fill the owned GPUs.
// When they end, the owned GPUs stand idle: without spill-back the job
// runs its 20 hours in the cloud and the owned cards idle all along;
// with it the job moves home at the next decision and the machine ends.
func TestSpillBackMovesTheJobHome(t *testing.T) {
	rows := []string{"0,3600,4,a,medium,default", "0,3600,4,a,medium,default", "0,72000,4,a,medium,default"}
	tr := csvTrace(t, rows...)
	off := run(t, tr, cluster(t, testCluster), "spillway", Options{Seed: 1, RecordStarts: true})
	on := run(t, tr, cluster(t, strings.Replace(testCluster, "    maxLifetime: 30d\n",
		"    maxLifetime: 30d\n    spillBack: {enabled: true, margin: 0.5, minInterval: 1h, staging: 2m}\n", 1)), "spillway", Options{Seed: 1, RecordStarts: true})

	if off.SpillBacks != 0 || off.JobsOnBurst != 1 {
		t.Fatalf("spill-back off: %d moved, %d jobs on burst", off.SpillBacks, off.JobsOnBurst)
	}
	// 4 GPUs idle at home from 1h to the job's end, ~19 hours.
	if off.OwnedIdleWhileRenting < 4*18 {
		t.Errorf("spill-back off: owned idle while renting %.1f GPU-h, want about 76", off.OwnedIdleWhileRenting)
	}
	if on.SpillBacks != 1 {
		t.Fatalf("spill-back on: %d moved", on.SpillBacks)
	}
	last := on.Starts[len(on.Starts)-1]
	if last.Job != tr.Jobs[2].ID || last.Burst || last.Attempt != 2 {
		t.Errorf("the long job's last start %+v: want its second attempt, at home", last)
	}
	if on.OwnedIdleWhileRenting > 0.1 || on.OwnedIdleShare > 0.02 {
		t.Errorf("spill-back on: owned idle while renting %.3f GPU-h (%.1f%%)", on.OwnedIdleWhileRenting, 100*on.OwnedIdleShare)
	}
	if on.BurstGPUHours >= off.BurstGPUHours/10 || on.Succeeded != 3 {
		t.Errorf("burst GPU-hours %.1f with spill-back, %.1f without; %d succeeded", on.BurstGPUHours, off.BurstGPUHours, on.Succeeded)
	}
	if on.Machines != 1 {
		t.Errorf("%d machines", on.Machines)
	}
}

// Two jobs share a 4-GPU burst machine, a 20-hour and a 3-hour one, when
// 2 owned GPUs free up after an hour: the long job moves home alone (the
// machine's cost is cut to the short job's end), the short one finishes
// on the machine, which then ends.
func TestSpillBackMovesPartOfAMachine(t *testing.T) {
	rows := []string{"0,3600,2,a,medium,default", "0,144000,2,a,medium,default", "0,144000,4,a,medium,default",
		"1,72000,2,a,medium,default", "1,10800,2,a,medium,default"}
	tr := csvTrace(t, rows...)
	c := cluster(t, strings.Replace(testCluster, "    maxLifetime: 30d\n",
		"    maxLifetime: 30d\n    spillBack: {enabled: true, margin: 0.5, minInterval: 1h, staging: 2m}\n", 1))
	r := run(t, tr, c, "spillway", Options{Seed: 1, RecordStarts: true})
	var got []string
	for _, s := range r.Starts {
		got = append(got, fmt.Sprintf("%s#%d burst=%v", s.Job, s.Attempt, s.Burst))
	}
	want := "j000001#1 burst=false j000002#1 burst=false j000003#1 burst=false j000004#1 burst=true j000005#1 burst=true j000004#2 burst=false"
	if strings.Join(got, " ") != want {
		t.Fatalf("starts %v, want %s", got, want)
	}
	if r.SpillBacks != 1 || r.Machines != 1 || r.Succeeded != 5 {
		t.Fatalf("moved %d, machines %d, succeeded %d", r.SpillBacks, r.Machines, r.Succeeded)
	}
	// The machine runs about 3h (the short job), not 20h.
	if r.BurstGPUHours > 4*3.5 {
		t.Errorf("burst GPU-h %.1f, want about 4 × 3h", r.BurstGPUHours)
	}
}

// A 20-hour gang of two 4-GPU members bursts to a group of two machines
// while two 1-hour jobs fill the owned nodes. When they end, both owned
// nodes stand idle: spill-back moves the gang home whole, and both
// machines of its group end.
func TestSpillBackMovesAGangHome(t *testing.T) {
	rows := []string{"0,3600,4,a,medium,default", "0,3600,4,a,medium,default", "0,72000,8,a,medium,default"}
	tr := csvTrace(t, rows...)
	c := cluster(t, strings.Replace(testCluster, "    maxLifetime: 30d\n",
		"    maxLifetime: 30d\n    spillBack: {enabled: true, margin: 0.5, minInterval: 1h, staging: 2m}\n", 1))
	r := run(t, tr, c, "spillway", Options{Seed: 1, RecordStarts: true, RecordMachines: true})
	var got []string
	for _, s := range r.Starts {
		got = append(got, fmt.Sprintf("%s#%d burst=%v", s.Job, s.Attempt, s.Burst))
	}
	want := "j000001#1 burst=false j000002#1 burst=false j000003#1 burst=true j000003#2 burst=false"
	if strings.Join(got, " ") != want {
		t.Fatalf("starts %s, want %s", strings.Join(got, " "), want)
	}
	if r.SpillBacks != 1 || r.Machines != 2 || r.Succeeded != 3 {
		t.Errorf("%d moved, %d machines, %d succeeded", r.SpillBacks, r.Machines, r.Succeeded)
	}
	for _, m := range r.MachineRecords {
		if m.Group == "" || !hasReason(m.History, burst.StopSpillBack) {
			t.Errorf("machine %s (group %q) did not end by spill-back: %+v", m.ID, m.Group, m.History)
		}
	}
	// From the move on, the gang's 8 GPU-hours an hour run at home: the
	// machines ran about an hour each, not 20.
	if r.BurstGPUHours > 2*4*2 {
		t.Errorf("burst GPU-hours %.1f", r.BurstGPUHours)
	}
}

func hasReason(h []broker.Transition, reason string) bool {
	for _, t := range h {
		if t.Reason == reason {
			return true
		}
	}
	return false
}
