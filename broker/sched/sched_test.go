package sched

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/broker"
)

type schedCase struct {
	nodes  []*NodeWrapper
	jobs   []*JobWrapper
	policy func(*Policy)
	usage  map[string]float64
	want   outcome
}

func runCases(t *testing.T, cases map[string]schedCase) {
	t.Helper()
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := snap(nodes(tc.nodes...), jobs(tc.jobs...))
			if tc.policy != nil {
				tc.policy(&s.Policy)
			}
			s.Usage = tc.usage
			got := summarize(Schedule(s))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("plan differs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPlacement(t *testing.T) {
	runCases(t, map[string]schedCase{
		"a small job goes to the fullest node that fits (best fit)": {
			nodes: []*NodeWrapper{MakeNode("n1"), MakeNode("n2")},
			jobs: []*JobWrapper{
				MakeJob("run").GPUs(6).On("n2", 0, 1, 2, 3, 4, 5),
				MakeJob("a").GPUs(2),
			},
			want: outcome{Starts: map[string]string{"a": "n2:6,7"}},
		},
		"small jobs pack so that a whole node stays free for an 8-GPU job": {
			nodes:  []*NodeWrapper{MakeNode("n1"), MakeNode("n2")},
			policy: func(p *Policy) { p.Weights.Size = 0 },
			jobs: []*JobWrapper{
				MakeJob("a").Waited(3 * time.Hour),
				MakeJob("b").Waited(2 * time.Hour),
				MakeJob("c").GPUs(8).Waited(time.Hour),
			},
			want: outcome{Starts: map[string]string{"a": "n1:0", "b": "n1:1", "c": "n2:0,1,2,3,4,5,6,7"}},
		},
		"gpuModel is honoured even when another node packs better": {
			nodes: []*NodeWrapper{MakeNode("a100").Model("NVIDIA A100-SXM4-80GB"), MakeNode("h100")},
			jobs: []*JobWrapper{
				MakeJob("run").GPUs(7).On("a100", 0, 1, 2, 3, 4, 5, 6),
				MakeJob("a").Model("H100"),
			},
			want: outcome{Starts: map[string]string{"a": "h100:0"}},
		},
		"cards on one NVLink island are preferred": {
			nodes: []*NodeWrapper{MakeNode("n1").NVLinkGroups(4)},
			jobs: []*JobWrapper{
				MakeJob("run").GPUs(2).On("n1", 1, 2),
				MakeJob("a").GPUs(4),
			},
			want: outcome{Starts: map[string]string{"a": "n1:4,5,6,7"}},
		},
		"unhealthy cards and nodes that are not ready receive nothing": {
			nodes: []*NodeWrapper{MakeNode("n1").GPUs(2).Unhealthy(0), MakeNode("n2").State(broker.NodeDraining)},
			jobs:  []*JobWrapper{MakeJob("a").Waited(time.Hour), MakeJob("b")},
			want: outcome{Starts: map[string]string{"a": "n1:1"},
				Pending: map[string]string{"b": ReasonResources}},
		},
		"a rented node takes only the jobs bound to it, whatever their burst policy": {
			nodes: []*NodeWrapper{MakeNode("aws-1").Pool("aws").Instance("m-1"), MakeNode("n1")},
			jobs: []*JobWrapper{
				MakeJob("run").GPUs(8).On("n1", 0, 1, 2, 3, 4, 5, 6, 7),
				MakeJob("home").Burst(broker.BurstNever),
				MakeJob("any"),
				MakeJob("bound").BoundTo("m-1"),
				MakeJob("elsewhere").BoundTo("m-2"),
			},
			want: outcome{Starts: map[string]string{"bound": "aws-1:0"},
				Pending: map[string]string{"home": ReasonResources, "any": ReasonResources, "elsewhere": "machine_not_ready"}},
		},
		"a node's declared CPUs bound what it takes": {
			nodes: []*NodeWrapper{MakeNode("n1").CPU(16), MakeNode("n2").CPU(64)},
			jobs:  []*JobWrapper{MakeJob("a").CPU(32)},
			want:  outcome{Starts: map[string]string{"a": "n2:0"}},
		},
		// Work that cannot be preempted goes where it pushes the end of such
		// work back least, so that nodes empty of it together.
		"protected work joins the node whose protected work ends last": {
			nodes: []*NodeWrapper{MakeNode("n1"), MakeNode("n2")},
			jobs: []*JobWrapper{
				MakeJob("short").GPUs(4).Timeout(time.Hour).Started(0).On("n1", 0, 1, 2, 3),
				MakeJob("long").GPUs(2).Timeout(4*time.Hour).Started(0).On("n2", 0, 1),
				MakeJob("a").Timeout(2 * time.Hour),
			},
			// Best fit would take n1 (4 free); n2 already holds work until
			// 4 h, so a 2 h job there delays nothing.
			want: outcome{Starts: map[string]string{"a": "n2:2"}},
		},
		"among nodes it would push back, protected work takes the least pushed": {
			nodes: []*NodeWrapper{MakeNode("n1"), MakeNode("n2"), MakeNode("n3")},
			jobs: []*JobWrapper{
				MakeJob("r1").GPUs(6).Timeout(time.Hour).Started(0).On("n1", 0, 1, 2, 3, 4, 5),
				MakeJob("r2").GPUs(2).Timeout(3*time.Hour).Started(0).On("n2", 0, 1),
				MakeJob("a").Timeout(4 * time.Hour),
			},
			want: outcome{Starts: map[string]string{"a": "n2:2"}},
		},
		"protected work goes to an empty node last, and best fit among equals": {
			nodes: []*NodeWrapper{MakeNode("n1"), MakeNode("n2"), MakeNode("n3")},
			jobs: []*JobWrapper{
				MakeJob("p").GPUs(6).Preemptible().Timeout(4*time.Hour).Started(0).On("n2", 0, 1, 2, 3, 4, 5),
				MakeJob("r").GPUs(4).Timeout(time.Hour).Started(0).On("n3", 0, 1, 2, 3),
				MakeJob("a").Timeout(2 * time.Hour).Waited(time.Hour),
				MakeJob("b").GPUs(2).Timeout(2 * time.Hour),
			},
			// a: n3 pushes r's hour back by one; n1 and n2 hold no protected
			// work. b: n3 now ends at 2 h, so b pushes nothing back there.
			want: outcome{Starts: map[string]string{"a": "n3:4", "b": "n3:5,6"}},
		},
		"preemptible work keeps best fit": {
			nodes: []*NodeWrapper{MakeNode("n1"), MakeNode("n2")},
			jobs: []*JobWrapper{
				MakeJob("short").GPUs(4).Timeout(time.Hour).Started(0).On("n1", 0, 1, 2, 3),
				MakeJob("long").GPUs(2).Timeout(4*time.Hour).Started(0).On("n2", 0, 1),
				MakeJob("a").Preemptible().Timeout(2 * time.Hour),
			},
			want: outcome{Starts: map[string]string{"a": "n1:4"}},
		},
	})
}

func TestSharing(t *testing.T) {
	runCases(t, map[string]schedCase{
		"small inference jobs share one card": {
			nodes: []*NodeWrapper{MakeNode("n1")},
			jobs: []*JobWrapper{
				MakeJob("a").Queue("inference").GPUMemory(20 * gi).Waited(3 * time.Minute),
				MakeJob("b").Queue("inference").GPUMemory(20 * gi).Waited(2 * time.Minute),
				MakeJob("c").Queue("inference").GPUMemory(20 * gi).Waited(time.Minute),
			},
			want: outcome{Starts: map[string]string{"a": "n1:0@20Gi", "b": "n1:0@20Gi", "c": "n1:0@20Gi"}},
		},
		"a running sharer's card takes a newcomer whose memory fits": {
			nodes: []*NodeWrapper{MakeNode("n1")},
			jobs: []*JobWrapper{
				MakeJob("run").Queue("inference").GPUMemory(40*gi).On("n1", 3),
				MakeJob("fits").Queue("inference").GPUMemory(40 * gi).Waited(time.Hour),
				MakeJob("too-big").Queue("inference").GPUMemory(50 * gi),
			},
			want: outcome{Starts: map[string]string{"fits": "n1:3@40Gi", "too-big": "n1:0@50Gi"}},
		},
		"sharers per card are capped": {
			nodes:  []*NodeWrapper{MakeNode("n1")},
			policy: func(p *Policy) { p.MaxSharersPerGPU = 2 },
			jobs: []*JobWrapper{
				MakeJob("a").Queue("inference").GPUMemory(10 * gi).Waited(3 * time.Minute),
				MakeJob("b").Queue("inference").GPUMemory(10 * gi).Waited(2 * time.Minute),
				MakeJob("c").Queue("inference").GPUMemory(10 * gi).Waited(time.Minute),
			},
			want: outcome{Starts: map[string]string{"a": "n1:0@10Gi", "b": "n1:0@10Gi", "c": "n1:1@10Gi"}},
		},
		"a queue without sharing gives whole cards": {
			nodes: []*NodeWrapper{MakeNode("n1")},
			jobs: []*JobWrapper{
				MakeJob("a").GPUMemory(20 * gi).Waited(2 * time.Minute),
				MakeJob("b").GPUMemory(20 * gi).Waited(time.Minute),
			},
			want: outcome{Starts: map[string]string{"a": "n1:0", "b": "n1:1"}},
		},
		"gang + sharing refused: a gang never lands on a shared card": {
			nodes: []*NodeWrapper{MakeNode("n1").GPUs(2), MakeNode("n2").GPUs(2)},
			jobs: []*JobWrapper{
				MakeJob("run").Queue("inference").GPUMemory(10*gi).On("n1", 0),
				MakeJob("gang").Queue("inference").GPUs(2).Nodes(2).GPUMemory(10 * gi),
			},
			want: outcome{Pending: map[string]string{"gang": ReasonGang}},
		},
	})
}

func TestGang(t *testing.T) {
	runCases(t, map[string]schedCase{
		"a gang starts all-or-nothing": {
			nodes: []*NodeWrapper{MakeNode("n1"), MakeNode("n2")},
			jobs: []*JobWrapper{
				MakeJob("run").GPUs(1).On("n2", 0),
				MakeJob("gang").GPUs(8).Nodes(2),
			},
			want: outcome{Pending: map[string]string{"gang": ReasonGang}},
		},
		"a gang stays in one fabric, one driver version, one model": {
			nodes: []*NodeWrapper{
				MakeNode("a1").Label("fabric", "a"), MakeNode("a2").Label("fabric", "a").Driver("535.1"),
				MakeNode("b1").Label("fabric", "b"), MakeNode("b2").Label("fabric", "b"),
				MakeNode("c1").Label("fabric", "c").Model("NVIDIA A100"), MakeNode("c2").Label("fabric", "c"),
			},
			jobs: []*JobWrapper{MakeJob("gang").GPUs(8).Nodes(2)},
			want: outcome{Starts: map[string]string{"gang": "b1:0,1,2,3,4,5,6,7 b2:0,1,2,3,4,5,6,7"}},
		},
		"a gang prefers the pool where it leaves the fewest cards over": {
			nodes: []*NodeWrapper{
				MakeNode("a1").Label("fabric", "a"), MakeNode("a2").Label("fabric", "a"),
				MakeNode("b1").Label("fabric", "b"), MakeNode("b2").Label("fabric", "b"),
			},
			jobs: []*JobWrapper{
				MakeJob("run1").GPUs(4).On("b1", 0, 1, 2, 3),
				MakeJob("run2").GPUs(4).On("b2", 0, 1, 2, 3),
				MakeJob("gang").GPUs(4).Nodes(2),
			},
			want: outcome{Starts: map[string]string{"gang": "b1:4,5,6,7 b2:4,5,6,7"}},
		},
	})
}

func TestOrder(t *testing.T) {
	one := []*NodeWrapper{MakeNode("n1").GPUs(1)}
	runCases(t, map[string]schedCase{
		"a higher class goes first, however long the lower one waited": {
			nodes: one,
			jobs:  []*JobWrapper{MakeJob("low").Priority("low").Waited(10 * time.Hour), MakeJob("high").Priority("high")},
			want: outcome{Starts: map[string]string{"high": "n1:0"},
				Pending: map[string]string{"low": ReasonResources}},
		},
		"a latency queue goes before batch work of any class": {
			nodes: one,
			jobs:  []*JobWrapper{MakeJob("train").Priority("high").Waited(time.Hour), MakeJob("serve").Queue("inference").Priority("low")},
			want: outcome{Starts: map[string]string{"serve": "n1:0"},
				Pending: map[string]string{"train": ReasonResources}},
		},
		"inside a class the team that used less goes first": {
			nodes: one,
			usage: map[string]float64{"nlp": 1e6, "vision": 1e3},
			jobs:  []*JobWrapper{MakeJob("heavy").Team("nlp").Waited(time.Hour), MakeJob("light").Team("vision")},
			want: outcome{Starts: map[string]string{"light": "n1:0"},
				Pending: map[string]string{"heavy": ReasonResources}},
		},
		"inside a class and team the older job goes first": {
			nodes: one,
			jobs:  []*JobWrapper{MakeJob("new").Waited(time.Minute), MakeJob("old").Waited(time.Hour)},
			want: outcome{Starts: map[string]string{"old": "n1:0"},
				Pending: map[string]string{"new": ReasonResources}},
		},
		"submitted together (an array's elements): the lower id goes first": {
			nodes: one,
			jobs:  []*JobWrapper{MakeJob("job-b"), MakeJob("job-c"), MakeJob("job-a"), MakeJob("job-a0")},
			want: outcome{Starts: map[string]string{"job-a": "n1:0"},
				Pending: map[string]string{"job-b": ReasonResources, "job-c": ReasonResources, "job-a0": ReasonResources}},
		},
		"submitted together, ids past 32 bytes: the lower id goes first": {
			nodes: one,
			jobs: []*JobWrapper{MakeJob(strings.Repeat("x", 40) + "2"), MakeJob(strings.Repeat("x", 40) + "1"),
				MakeJob("y")},
			want: outcome{Starts: map[string]string{strings.Repeat("x", 40) + "1": "n1:0"},
				Pending: map[string]string{strings.Repeat("x", 40) + "2": ReasonResources, "y": ReasonResources}},
		},
		"a job past the starvation age goes before every class": {
			nodes:  one,
			policy: func(p *Policy) { p.StarvationAge = 2 * time.Hour },
			jobs:   []*JobWrapper{MakeJob("starved").Priority("low").Waited(3 * time.Hour), MakeJob("serve").Queue("inference").Priority("high")},
			want: outcome{Starts: map[string]string{"starved": "n1:0"},
				Pending: map[string]string{"serve": ReasonResources}},
		},
		"a job preempted a moment ago is old but not starving: its preemptor goes first": {
			nodes:  one,
			policy: func(p *Policy) { p.StarvationAge = 2 * time.Hour },
			jobs: []*JobWrapper{MakeJob("victim").Priority("low").Preemptible().Waited(3 * time.Hour).Requeued(time.Second),
				MakeJob("preemptor").Priority("high").Waited(time.Minute)},
			want: outcome{Starts: map[string]string{"preemptor": "n1:0"},
				Pending: map[string]string{"victim": ReasonResources}},
		},
		"a job in retry backoff waits": {
			nodes: one,
			jobs:  []*JobWrapper{MakeJob("retry").Backoff(time.Minute)},
			want:  outcome{Pending: map[string]string{"retry": ReasonBackoff}},
		},
	})
}

func TestQuota(t *testing.T) {
	quotas := func(p *Policy) {
		p.Teams = map[string]TeamPolicy{
			"nlp":    {Quota: &Quota{GPUs: 4, BorrowLimit: intp(2)}, Projects: map[string]Quota{"chat": {GPUs: 2, BorrowLimit: intp(0)}}},
			"vision": {Quota: &Quota{GPUs: 4}},
		}
	}
	runCases(t, map[string]schedCase{
		"a team borrows idle GPUs up to its borrowing limit": {
			nodes:  []*NodeWrapper{MakeNode("n1")},
			policy: quotas,
			jobs: []*JobWrapper{
				MakeJob("a").GPUs(3).Waited(3 * time.Hour),
				MakeJob("b").GPUs(3).Waited(2 * time.Hour),
				MakeJob("c").GPUs(1).Waited(time.Hour),
			},
			want: outcome{Starts: map[string]string{"a": "n1:0,1,2", "b": "n1:3,4,5"},
				Pending: map[string]string{"c": ReasonQuota}},
		},
		"a project's quota binds inside its team": {
			nodes:  []*NodeWrapper{MakeNode("n1")},
			policy: quotas,
			jobs: []*JobWrapper{
				MakeJob("a").Project("chat").GPUs(2).Waited(2 * time.Hour),
				MakeJob("b").Project("chat").Waited(time.Hour),
				MakeJob("c").Project("search"),
			},
			want: outcome{Starts: map[string]string{"a": "n1:0,1", "c": "n1:2"},
				Pending: map[string]string{"b": ReasonQuota}},
		},
		"quota + preemption: a team under its guarantee takes it back from a borrower": {
			nodes:  []*NodeWrapper{MakeNode("n1")},
			policy: quotas,
			jobs: []*JobWrapper{
				MakeJob("v1").Team("vision").GPUs(4).Preemptible().On("n1", 0, 1, 2, 3),
				MakeJob("v2").Team("vision").GPUs(4).Preemptible().On("n1", 4, 5, 6, 7),
				MakeJob("mine").GPUs(4),
			},
			want: outcome{Stops: map[string]string{"v1": StopPreempted},
				Pending: map[string]string{"mine": ReasonPreempting}},
		},
		"quota + preemption: a team within its guarantee is not preempted by another team's priority": {
			nodes:  []*NodeWrapper{MakeNode("n1").GPUs(4)},
			policy: quotas,
			jobs: []*JobWrapper{
				MakeJob("v").Team("vision").GPUs(4).Priority("low").Preemptible().On("n1", 0, 1, 2, 3),
				MakeJob("urgent").Priority("high").GPUs(2),
			},
			want: outcome{Pending: map[string]string{"urgent": ReasonResources}},
		},
		"quota + preemption: at its limit, a high job takes its own team's low job": {
			nodes:  []*NodeWrapper{MakeNode("n1")},
			policy: quotas,
			jobs: []*JobWrapper{
				MakeJob("low").GPUs(6).Priority("low").Preemptible().On("n1", 0, 1, 2, 3, 4, 5),
				MakeJob("high").GPUs(2).Priority("high"),
			},
			want: outcome{Stops: map[string]string{"low": StopPreempted},
				Pending: map[string]string{"high": ReasonPreempting}},
		},
	})
}

func TestPreemption(t *testing.T) {
	runCases(t, map[string]schedCase{
		"a high job preempts a preemptible low job": {
			nodes: []*NodeWrapper{MakeNode("n1").GPUs(2)},
			jobs: []*JobWrapper{
				MakeJob("low").GPUs(2).Priority("low").Preemptible().On("n1", 0, 1),
				MakeJob("high").GPUs(2).Priority("high"),
			},
			want: outcome{Stops: map[string]string{"low": StopPreempted},
				Pending: map[string]string{"high": ReasonPreempting}},
		},
		"a job requeued as often as the preemption limit is not preempted again": {
			nodes:  []*NodeWrapper{MakeNode("n1").GPUs(2)},
			policy: func(p *Policy) { p.PreemptionLimit = 3 },
			jobs: []*JobWrapper{
				MakeJob("low").GPUs(2).Priority("low").Preemptible().On("n1", 0, 1).Attempts(4, 0),
				MakeJob("high").GPUs(2).Priority("high"),
			},
			want: outcome{Pending: map[string]string{"high": ReasonResources}},
		},
		"failure retries do not count toward the preemption limit": {
			nodes:  []*NodeWrapper{MakeNode("n1").GPUs(2)},
			policy: func(p *Policy) { p.PreemptionLimit = 3 },
			jobs: []*JobWrapper{
				MakeJob("low").GPUs(2).Priority("low").Preemptible().On("n1", 0, 1).Attempts(5, 3),
				MakeJob("high").GPUs(2).Priority("high"),
			},
			want: outcome{Stops: map[string]string{"low": StopPreempted},
				Pending: map[string]string{"high": ReasonPreempting}},
		},
		"a pending job past the preemption limit is placed as protected work": {
			nodes:  []*NodeWrapper{MakeNode("n1"), MakeNode("n2")},
			policy: func(p *Policy) { p.PreemptionLimit = 2 },
			jobs: []*JobWrapper{
				MakeJob("short").GPUs(4).Timeout(time.Hour).Started(0).On("n1", 0, 1, 2, 3),
				MakeJob("long").GPUs(2).Timeout(4*time.Hour).Started(0).On("n2", 0, 1),
				MakeJob("a").Preemptible().Attempts(2, 0).Timeout(2 * time.Hour),
			},
			// Below the limit it would take the best fit, n1 (TestPlacement).
			want: outcome{Starts: map[string]string{"a": "n2:2"}},
		},
		"a job that is not preemptible is never preempted": {
			nodes: []*NodeWrapper{MakeNode("n1").GPUs(2)},
			jobs: []*JobWrapper{
				MakeJob("low").GPUs(2).Priority("low").On("n1", 0, 1),
				MakeJob("high").GPUs(2).Priority("high"),
			},
			want: outcome{Pending: map[string]string{"high": ReasonResources}},
		},
		"the victim is the one that loses the least work since its checkpoint": {
			nodes: []*NodeWrapper{MakeNode("n1").GPUs(2), MakeNode("n2").GPUs(2)},
			jobs: []*JobWrapper{
				MakeJob("fresh-ckpt").GPUs(2).Priority("low").Preemptible().On("n1", 0, 1).Timeout(24 * time.Hour).Started(5 * time.Hour).Checkpointed(time.Minute),
				MakeJob("no-ckpt").GPUs(2).Priority("low").Preemptible().On("n2", 0, 1).Timeout(24 * time.Hour).Started(time.Hour),
				MakeJob("high").GPUs(2).Priority("high"),
			},
			want: outcome{Stops: map[string]string{"fresh-ckpt": StopPreempted},
				Pending: map[string]string{"high": ReasonPreempting}},
		},
		"with equal work lost, the fewest victims": {
			nodes: []*NodeWrapper{MakeNode("n1").GPUs(4), MakeNode("n2").GPUs(4)},
			jobs: []*JobWrapper{
				MakeJob("s1").GPUs(2).Priority("low").Preemptible().On("n1", 0, 1),
				MakeJob("s2").GPUs(2).Priority("low").Preemptible().On("n1", 2, 3),
				MakeJob("big").GPUs(4).Priority("low").Preemptible().On("n2", 0, 1, 2, 3),
				MakeJob("high").GPUs(4).Priority("high"),
			},
			want: outcome{Stops: map[string]string{"big": StopPreempted},
				Pending: map[string]string{"high": ReasonPreempting}},
		},
		"only the victims needed: one of two when one frees enough": {
			nodes: []*NodeWrapper{MakeNode("n1").GPUs(4)},
			jobs: []*JobWrapper{
				MakeJob("old").GPUs(2).Priority("low").Preemptible().Timeout(24*time.Hour).On("n1", 0, 1).Started(3 * time.Hour),
				MakeJob("new").GPUs(2).Priority("low").Preemptible().On("n1", 2, 3).Started(time.Minute),
				MakeJob("high").GPUs(2).Priority("high"),
			},
			want: outcome{Stops: map[string]string{"new": StopPreempted},
				Pending: map[string]string{"high": ReasonPreempting}},
		},
		"no preemption for a job that would not then fit": {
			nodes: []*NodeWrapper{MakeNode("n1").GPUs(4)},
			jobs: []*JobWrapper{
				MakeJob("keep").GPUs(2).Priority("low").On("n1", 0, 1),
				MakeJob("low").GPUs(2).Priority("low").Preemptible().On("n1", 2, 3),
				MakeJob("high").GPUs(4).Priority("high"),
			},
			want: outcome{Pending: map[string]string{"high": ReasonResources}},
		},
		"a latency job preempts a batch job of a higher class": {
			nodes: []*NodeWrapper{MakeNode("n1").GPUs(1)},
			jobs: []*JobWrapper{
				MakeJob("train").Priority("high").Preemptible().On("n1", 0),
				MakeJob("serve").Queue("inference").Priority("low"),
			},
			want: outcome{Stops: map[string]string{"train": StopPreempted},
				Pending: map[string]string{"serve": ReasonPreempting}},
		},
		"cards already being released are claimed, not preempted again": {
			nodes: []*NodeWrapper{MakeNode("n1").GPUs(2)},
			jobs: []*JobWrapper{
				MakeJob("victim").GPUs(2).Priority("low").Preemptible().On("n1", 0, 1).Stopping("preempted", 30*time.Second),
				MakeJob("other").GPUs(2).Priority("low").Preemptible().On("n2", 0, 1),
				MakeJob("high").GPUs(2).Priority("high"),
			},
			want: outcome{Pending: map[string]string{"high": ReasonReleasing}},
		},
		"a queue takes back its reserved GPUs from other queues' preemptible jobs": {
			nodes:  []*NodeWrapper{MakeNode("n1").GPUs(2)},
			policy: func(p *Policy) { p.Queues["high_perf"] = QueuePolicy{Kind: Batch, Reserved: 2} },
			jobs: []*JobWrapper{
				MakeJob("batch").GPUs(2).Priority("high").Preemptible().On("n1", 0, 1),
				MakeJob("hp").Queue("high_perf").GPUs(1).Priority("low"),
			},
			want: outcome{Stops: map[string]string{"batch": StopPreempted},
				Pending: map[string]string{"hp": ReasonPreempting}},
		},
		"a job past its timeout is stopped and its cards are claimed": {
			nodes: []*NodeWrapper{MakeNode("n1").GPUs(2)},
			jobs: []*JobWrapper{
				MakeJob("late").GPUs(2).Timeout(time.Hour).On("n1", 0, 1).Started(61 * time.Minute),
				MakeJob("next").GPUs(2),
			},
			want: outcome{Stops: map[string]string{"late": StopTimedOut},
				Pending: map[string]string{"next": ReasonReleasing}},
		},
	})
}

func TestReservedCapacity(t *testing.T) {
	reserved := func(p *Policy) { p.Queues["inference"] = QueuePolicy{Kind: Latency, Reserved: 2, Sharing: true} }
	runCases(t, map[string]schedCase{
		"batch work leaves a queue's reserved GPUs free": {
			nodes:  []*NodeWrapper{MakeNode("n1").GPUs(4)},
			policy: reserved,
			jobs:   []*JobWrapper{MakeJob("a").GPUs(2).Waited(time.Hour), MakeJob("b").GPUs(2)},
			want: outcome{Starts: map[string]string{"a": "n1:0,1"},
				Pending: map[string]string{"b": ReasonQueueReserved}},
		},
		"preemptible batch work may use reserved GPUs": {
			nodes:  []*NodeWrapper{MakeNode("n1").GPUs(4)},
			policy: reserved,
			jobs:   []*JobWrapper{MakeJob("a").GPUs(2).Waited(time.Hour), MakeJob("b").GPUs(2).Preemptible()},
			want:   outcome{Starts: map[string]string{"a": "n1:0,1", "b": "n1:2,3"}},
		},
	})
}

func TestBackfill(t *testing.T) {
	// n1's 6 busy cards free in 50 minutes (started 10 min ago, 1h
	// timeout); the head wants all 8 of them.
	base := func(extra ...*JobWrapper) []*JobWrapper {
		return append([]*JobWrapper{
			MakeJob("run").GPUs(6).On("n1", 0, 1, 2, 3, 4, 5),
			MakeJob("head").GPUs(8).Priority("high"),
		}, extra...)
	}
	runCases(t, map[string]schedCase{
		"backfill + reservation: a job that ends before the reservation starts": {
			nodes: []*NodeWrapper{MakeNode("n1")},
			jobs:  base(MakeJob("short").GPUs(2).Timeout(30 * time.Minute)),
			want: outcome{Starts: map[string]string{"short": "n1:6,7"},
				Pending: map[string]string{"head": ReasonResources}},
		},
		"backfill + reservation: a job that would run past it waits": {
			nodes: []*NodeWrapper{MakeNode("n1")},
			jobs:  base(MakeJob("long").GPUs(2).Timeout(2 * time.Hour)),
			want:  outcome{Pending: map[string]string{"head": ReasonResources, "long": ReasonBackfill}},
		},
		"backfill + reservation: a long job may use a node outside the reservation": {
			nodes: []*NodeWrapper{MakeNode("n1"), MakeNode("n2").GPUs(4)},
			jobs: base(
				MakeJob("busy").GPUs(2).On("n2", 0, 1).Started(time.Minute),
				MakeJob("long").GPUs(2).Timeout(2*time.Hour),
			),
			want: outcome{Starts: map[string]string{"long": "n2:2,3"},
				Pending: map[string]string{"head": ReasonResources}},
		},
	})
}

func TestReasons(t *testing.T) {
	s := snap(nodes(MakeNode("n1")), jobs(
		MakeJob("run").GPUs(6).On("n1", 0, 1, 2, 3, 4, 5),
		MakeJob("head").GPUs(8).Priority("high").Waited(time.Hour),
		MakeJob("second").GPUs(8).Waited(2*time.Hour),
		MakeJob("third").GPUs(2).Timeout(2*time.Hour).Waited(time.Hour),
		MakeJob("model").Model("B200"),
	))
	s.Policy.Teams = map[string]TeamPolicy{"vision": {Quota: &Quota{GPUs: 0, BorrowLimit: intp(0)}}}
	s.Jobs = append(s.Jobs, MakeJob("capped").Team("vision").Obj())
	plan := Schedule(s)
	est := t0.Add(50 * time.Minute)
	want := []pendingView{
		{Job: "head", Queue: "default", Reason: broker.PendingReason{Code: ReasonResources, Position: 1, EstimatedStart: &est,
			Message: "waiting for 8 GPUs on one node; 1st in queue default; est. start 12:50 UTC by reservation"}},
		{Job: "second", Queue: "default", Reason: broker.PendingReason{Code: ReasonResources, Position: 2,
			Message: "waiting for 8 GPUs on one node; 2nd in queue default"}},
		{Job: "third", Queue: "default", Reason: broker.PendingReason{Code: ReasonBackfill, Position: 3,
			Message: "starting now would delay job head, reserved for 12:50 UTC; waiting for 2 GPUs on one node; 3rd in queue default"}},
		{Job: "capped", Queue: "default", Reason: broker.PendingReason{Code: ReasonQuota, Position: 4,
			Message: "team vision at quota 0/0 GPUs (borrow limit reached); 4th in queue default"}},
		{Job: "model", Queue: "default", Reason: broker.PendingReason{Code: ReasonNoFit, Position: 5,
			Message: "no ready node set can hold 1 GPU of model B200; 5th in queue default"}},
	}
	if diff := cmp.Diff(want, viewPending(plan)); diff != "" {
		t.Errorf("pending reasons (-want +got):\n%s", diff)
	}
	wantResv := &Reservation{Job: "head", At: est, Nodes: []string{"n1"}}
	if diff := cmp.Diff(wantResv, plan.Reservation); diff != "" {
		t.Errorf("reservation (-want +got):\n%s", diff)
	}
	if bd := plan.BurstDemand(); len(bd) != 5 || bd[0].Job != "head" || bd[0].Waited != time.Hour ||
		bd[0].EstimatedStart == nil || bd[0].GPUs != 8 {
		t.Errorf("burst demand: %+v", bd)
	}
}

func TestPreemptionRecord(t *testing.T) {
	s := snap(nodes(MakeNode("n1").GPUs(2)), jobs(
		MakeJob("low").GPUs(2).Priority("low").Preemptible().Timeout(24*time.Hour).On("n1", 0, 1).Started(3*time.Hour).Checkpointed(20*time.Minute),
		MakeJob("high").GPUs(2).Priority("high"),
	))
	plan := Schedule(s)
	want := Plan{
		Stops:       []Stop{{Job: "low", Reason: StopPreempted, Detail: "preempted by job high (priority high over low)"}},
		Preemptions: []Preemption{{Victim: "low", For: "high", Rule: RulePriority, GPUs: 2, LostWork: 20 * time.Minute}},
	}
	if diff := cmp.Diff(want.Stops, plan.Stops); diff != "" {
		t.Errorf("stops (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want.Preemptions, plan.Preemptions); diff != "" {
		t.Errorf("preemptions (-want +got):\n%s", diff)
	}
	r := reasonOf(t, plan, "high")
	if r.EstimatedStart == nil || !r.EstimatedStart.Equal(t0.Add(2*time.Minute)) {
		t.Errorf("estimated start %v, want now + the victim's 2m grace", r.EstimatedStart)
	}
}

func TestPreemptingMessage(t *testing.T) {
	s := snap(nodes(MakeNode("n1").GPUs(2)), jobs(
		MakeJob("low").GPUs(2).Priority("low").Preemptible().On("n1", 0, 1),
		MakeJob("high").GPUs(2).Priority("high"),
	))
	r := reasonOf(t, Schedule(s), "high")
	want := "preempting 1 job (low) on n1 for 2 GPUs on one node; starts when it stops; 1st in queue default; est. start 12:02 UTC"
	if r.Message != want {
		t.Errorf("message\n got %q\nwant %q", r.Message, want)
	}
}

func TestEmpty(t *testing.T) {
	for name, s := range map[string]*Snapshot{
		"no nodes, no jobs":     snap(nil, nil),
		"a job and no nodes":    snap(nil, jobs(MakeJob("a"))),
		"nodes and no jobs":     snap(nodes(MakeNode("n1")), nil),
		"a node with no cards":  snap(nodes(MakeNode("n1").GPUs(0)), jobs(MakeJob("a"))),
		"a job asking for none": snap(nodes(MakeNode("n1")), jobs(MakeJob("a").GPUs(0))),
	} {
		plan := Schedule(s)
		if len(plan.Starts) != 0 {
			t.Errorf("%s: started %v", name, plan.Starts)
		}
		for _, pe := range plan.Pending {
			if pe.Reason.Code() != ReasonNoFit {
				t.Errorf("%s: %s pending with %+v, want no_fit", name, pe.Job, pe.Reason)
			}
		}
	}
}

func TestClaimsCountAgainstQuota(t *testing.T) {
	runCases(t, map[string]schedCase{
		"a job waiting for released cards holds its team's quota for the cycle": {
			nodes: []*NodeWrapper{MakeNode("n1").GPUs(4), MakeNode("n2").GPUs(4)},
			policy: func(p *Policy) {
				p.Teams = map[string]TeamPolicy{"nlp": {Quota: &Quota{GPUs: 4, BorrowLimit: intp(0)}}}
			},
			jobs: []*JobWrapper{
				MakeJob("leaving").Team("vision").GPUs(4).On("n1", 0, 1, 2, 3).Stopping("cancelled", 10*time.Second),
				MakeJob("busy").Team("vision").GPUs(2).On("n2", 0, 1),
				MakeJob("first").GPUs(4).Waited(time.Hour),
				MakeJob("second").GPUs(2),
			},
			want: outcome{Pending: map[string]string{"first": ReasonReleasing, "second": ReasonQuota}},
		},
	})
}

func TestPreemptionInteractions(t *testing.T) {
	runCases(t, map[string]schedCase{
		"borrowed capacity is reclaimed first, even when it loses more work": {
			nodes: []*NodeWrapper{MakeNode("n1").GPUs(2), MakeNode("n2").GPUs(2)},
			policy: func(p *Policy) {
				p.Teams = map[string]TeamPolicy{"nlp": {Quota: &Quota{GPUs: 4}}}
			},
			jobs: []*JobWrapper{
				MakeJob("own").GPUs(2).Priority("low").Preemptible().On("n1", 0, 1).Started(time.Minute),
				MakeJob("borrowed").Team("vision").GPUs(2).Priority("low").Preemptible().Timeout(24*time.Hour).On("n2", 0, 1).Started(5 * time.Hour),
				MakeJob("high").GPUs(2).Priority("high"),
			},
			want: outcome{Stops: map[string]string{"borrowed": StopPreempted},
				Pending: map[string]string{"high": ReasonPreempting}},
		},
		"a project under its guarantee takes it back from a sibling project": {
			nodes: []*NodeWrapper{MakeNode("n1").GPUs(4)},
			policy: func(p *Policy) {
				p.Teams = map[string]TeamPolicy{"nlp": {Projects: map[string]Quota{"chat": {GPUs: 2}, "search": {GPUs: 2}}}}
			},
			jobs: []*JobWrapper{
				MakeJob("s1").Project("search").GPUs(2).Preemptible().On("n1", 0, 1),
				MakeJob("s2").Project("search").GPUs(2).Preemptible().On("n1", 2, 3),
				MakeJob("chat").Project("chat").GPUs(2),
			},
			want: outcome{Stops: map[string]string{"s1": StopPreempted},
				Pending: map[string]string{"chat": ReasonPreempting}},
		},
		"a gang preempts on every node it needs, or not at all": {
			nodes: []*NodeWrapper{MakeNode("n1").GPUs(2), MakeNode("n2").GPUs(2), MakeNode("n3").GPUs(2)},
			jobs: []*JobWrapper{
				MakeJob("a").GPUs(2).Priority("low").Preemptible().On("n1", 0, 1),
				MakeJob("b").GPUs(2).Priority("low").Preemptible().On("n2", 0, 1),
				MakeJob("c").GPUs(2).Priority("high").On("n3", 0, 1),
				MakeJob("gang").GPUs(2).Nodes(2).Priority("high"),
				MakeJob("gang3").GPUs(2).Nodes(3).Priority("medium").Waited(time.Hour),
			},
			want: outcome{Stops: map[string]string{"a": StopPreempted, "b": StopPreempted},
				Pending: map[string]string{"gang": ReasonPreempting, "gang3": ReasonGang}},
		},
		"preemption never takes a reserved node the head needs": {
			nodes: []*NodeWrapper{MakeNode("n1").GPUs(4)},
			jobs: []*JobWrapper{
				MakeJob("run").GPUs(2).On("n1", 0, 1),
				MakeJob("low").GPUs(2).Priority("low").Preemptible().Timeout(30*time.Minute).On("n1", 2, 3),
				MakeJob("head").GPUs(4).Priority("high").Waited(time.Hour),
				MakeJob("medium").GPUs(2).Priority("medium").Timeout(2 * time.Hour),
			},
			want: outcome{Pending: map[string]string{"head": ReasonResources, "medium": ReasonBackfill}},
		},
	})
}
