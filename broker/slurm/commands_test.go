package slurm

import (
	"slices"
	"testing"
	"time"
)

func TestParseNode(t *testing.T) {
	line := "NodeName=burst-1 CoresPerSocket=1 CPUAlloc=0 State=DOWN+CLOUD+POWERED_DOWN ThreadsPerCore=1 AvailableFeatures=cloud,l4 ActiveFeatures=cloud,l4 NodeAddr=127.0.0.2 Partitions=burst,all Reason=spillway: budget nlp exhausted [root@2026-12-01T16:10:19]\n"
	n, err := ParseNode(line)
	if err != nil {
		t.Fatal(err)
	}
	if n.Name != "burst-1" || n.Addr != "127.0.0.2" || !slices.Equal(n.Partitions, []string{"burst", "all"}) ||
		!slices.Equal(n.Features, []string{"cloud", "l4"}) || n.Reason != "spillway: budget nlp exhausted [root@2026-12-01T16:10:19]" {
		t.Fatalf("%+v", n)
	}
	if !n.Has("DOWN") || !n.Has("POWERED_DOWN") || n.Has("POWERING_UP") {
		t.Fatalf("flags of %q", n.State)
	}
	if _, err := ParseNode("garbage"); err == nil {
		t.Fatal("no error for a line without NodeName")
	}
}

func TestParseSqueue(t *testing.T) {
	out := "7|nlp|alice|burst|gres:gpu:1|2026-12-01T16:09:55|2026-12-01T16:09:56|COMPLETED|burst-1\n" +
		"8|nlp|bob|burst|gres/gpu:l4:2|2026-12-01T16:10:00|2026-12-01T17:10:00|RUNNING|burst-[1-2]\n" +
		"9|||burst|N/A|N/A|N/A|PENDING|\n"
	jobs, err := ParseSqueue(out, time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 3 {
		t.Fatalf("%d jobs", len(jobs))
	}
	if j := jobs[0]; j.ID != "7" || j.Account != "nlp" || j.GPUs != 1 || j.End.IsZero() || !slices.Equal(j.Nodes, []string{"burst-1"}) {
		t.Fatalf("job 7: %+v", j)
	}
	if j := jobs[1]; j.GPUs != 2 || !j.End.IsZero() || len(j.Nodes) != 2 {
		t.Fatalf("a running job has no end yet: %+v", j)
	}
	if j := jobs[2]; !j.Start.IsZero() || j.Nodes != nil {
		t.Fatalf("pending: %+v", j)
	}
	if _, err := ParseSqueue("1|2|3\n", time.UTC); err == nil {
		t.Fatal("short line accepted")
	}
}

func TestGPUsOf(t *testing.T) {
	for in, want := range map[string]int{
		"gres:gpu:2": 2, "gres/gpu:h100:4": 4, "gres:gpu": 1, "N/A": 0, "": 0,
		"cpu=1,mem=500M,node=1,billing=1,gres/gpu=1":      1,
		"cpu=8,mem=64G,node=1,gres/gpu=2,gres/gpu:h100=2": 2,
		"cpu=8,gres/gpu:h100=2":                           2,
		"gres/gpu=x":                                      0,
	} {
		if got := GPUsOf(in); got != want {
			t.Errorf("GPUsOf(%q) = %d, want %d", in, got, want)
		}
	}
}
