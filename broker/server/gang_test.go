package server

import (
	"context"
	"testing"

	"github.com/spillway-dev/spillway/onprem/agentapi"
)

// TestGangReleasesRankZeroFirst: once every member is staged and the probe
// reached rank 0's hold on MASTER_PORT, only rank 0 is released; the others
// are released once rank 0's report shows it left the barrier (its hold
// closed). Before, both were released at once and a member could connect
// to rank 0's hold instead of its command, read nothing and fail.
func TestGangReleasesRankZeroFirst(t *testing.T) {
	testGangRelease(t, false)
}

// TestGangReleasedWhenRankZeroEndsFirst: rank 0 released, its command
// ends before its agent reports it past the barrier; the others are
// released all the same (they waited at the barrier for good before).
func TestGangReleasedWhenRankZeroEndsFirst(t *testing.T) {
	testGangRelease(t, true)
}

func testGangRelease(t *testing.T, quick bool) {
	h := newHarness(t)
	a, b := h.agent("node-a", 2), h.agent("node-b", 2)
	j := h.submit(tokAlice, `{"resources": {"gpus": 2, "nodes": 2}, "command": ["x"]}`)
	h.cycle()
	ranks := map[*fakeAgent]agentapi.JobRef{}
	var rank0, rank1 *fakeAgent
	for _, ag := range []*fakeAgent{a, b} {
		resp := ag.sync()
		if len(resp.Start) != 1 || resp.Start[0].Job != j.ID || resp.Start[0].Gang == nil {
			t.Fatalf("%s: start %+v, want one gang member of %s", ag.name, resp.Start, j.ID)
		}
		ranks[ag] = resp.Start[0].JobRef
		if resp.Start[0].Rank == 0 {
			rank0 = ag
		} else {
			rank1 = ag
		}
	}
	if rank0 == nil || rank1 == nil {
		t.Fatal("want one member of rank 0 and one of rank 1")
	}
	pre := func(ag *fakeAgent, p *agentapi.Preflight) { ag.jobs[ranks[ag]].Preflight = p }
	orders := func(ag *fakeAgent) (probe, release bool) {
		for _, o := range ag.sync().Gang {
			probe, release = probe || o.Probe, release || o.Release
		}
		return
	}
	staged := agentapi.Preflight{Staged: true, DriverVersion: "550.54", CUDAVersion: "12.4"}
	p0 := staged
	p0.Listening = true
	pre(rank0, &p0)
	pre(rank1, &staged)
	orders(rank0)
	if probe, _ := orders(rank1); !probe {
		t.Fatal("rank 1 was not asked to probe MASTER_PORT once both members were staged")
	}
	p1 := staged
	p1.Probed = true
	pre(rank1, &p1)
	if _, release := orders(rank1); release {
		t.Fatal("rank 1 released before rank 0 left the barrier")
	}
	if _, release := orders(rank0); !release {
		t.Fatal("rank 0 not released once the probe reached it")
	}
	if _, release := orders(rank1); release {
		t.Fatal("rank 1 released while rank 0 still reports its preflight (its hold may still be open)")
	}
	if quick {
		// Rank 0's command ended before its agent reported it running
		// past the barrier (a loaded node, a command that exits at once):
		// its first report after the release is its end.
		pre(rank0, nil)
		rank0.exit(j.ID, 0, "")
	} else {
		pre(rank0, nil) // rank 0 closed its hold and runs its command
	}
	orders(rank0)
	if _, release := orders(rank1); !release {
		t.Fatal("rank 1 not released after rank 0 left the barrier")
	}
}

// TestBatchedReportsCheckEveryGangMember: when the reports of both members'
// agents are recorded in one batch and the first one changes the gang (its
// member failed), the second agent's silence about its member is still
// noticed in that batch: the member is lost and the attempt ends, instead
// of waiting for that agent's next report.
func TestBatchedReportsCheckEveryGangMember(t *testing.T) {
	h := newHarness(t)
	a, b := h.agent("node-a", 2), h.agent("node-b", 2)
	j := h.submit(tokAlice, `{"resources": {"gpus": 2, "nodes": 2}, "command": ["x"]}`)
	h.cycle()
	a.sync()
	b.sync()
	for _, ag := range []*fakeAgent{a, b} {
		for _, r := range ag.jobs {
			r.Preflight = nil // past the barrier: both commands run
		}
		ag.sync()
	}
	if got := h.job(j.ID); got.State != "running" {
		t.Fatalf("gang is %s, want running", got.State)
	}
	a.exit(j.ID, 1, "")
	reqA, reqB := a.request(), b.request()
	reqB.Jobs = nil // node-b's agent no longer reports its member
	calls := []*syncCall{{req: &reqA}, {req: &reqB}}
	h.srv.lock()
	h.srv.recordSyncsLocked(context.Background(), calls)
	h.srv.mu.Unlock()
	for _, c := range calls {
		if c.err != nil {
			t.Fatal(c.err)
		}
	}
	got := h.job(j.ID)
	if got.State.Holding() {
		t.Fatalf("gang still %s after both members' reports: placements %+v", got.State, got.Placements)
	}
}
