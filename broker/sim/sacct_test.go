package sim

import (
	"strings"
	"testing"
	"time"
)

const sacctDump = `JobID|JobName|Account|Partition|Submit|Start|End|AllocTRES|State
7|train|nlp|burst|2026-12-01T16:09:00|2026-12-01T16:09:55|2026-12-01T16:39:55|billing=1,cpu=1,gres/gpu=2,mem=500M,node=1|COMPLETED
7.batch|batch|nlp||2026-12-01T16:09:55|2026-12-01T16:09:55|2026-12-01T16:39:55|cpu=1,gres/gpu=2,mem=500M,node=1|COMPLETED
5|wrap||burst|2026-12-01T16:08:00|2026-12-01T16:08:30|2026-12-01T16:08:30|cpu=1,gres/gpu:l4=1|COMPLETED
8|cpu|nlp|burst|2026-12-01T16:10:00|2026-12-01T16:10:00|2026-12-01T16:11:00|cpu=4,mem=1G,node=1|COMPLETED
9|wait|nlp|burst|2026-12-01T16:10:00|Unknown|Unknown||PENDING
10|run|nlp|burst|2026-12-01T16:10:00|2026-12-01T16:10:05|Unknown|cpu=1,gres/gpu=1|RUNNING
`

func TestReadSacct(t *testing.T) {
	tr, err := ReadSacct(strings.NewReader(sacctDump), SacctOptions{PartitionQueue: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Jobs) != 2 {
		t.Fatalf("jobs %+v", tr.Jobs)
	}
	a, b := tr.Jobs[0], tr.Jobs[1]
	if a.ID != "s000001" || a.GPUs != 1 || a.Duration != time.Second || a.Team != "slurm" || a.Queue != "burst" ||
		!a.Submit.Equal(time.Date(2026, 12, 1, 16, 8, 0, 0, time.UTC)) {
		t.Fatalf("first job (a zero-second one, typed gres, no account): %+v", a)
	}
	if b.GPUs != 2 || b.Duration != 30*time.Minute || b.Team != "nlp" || b.Priority != "medium" {
		t.Fatalf("second job: %+v", b)
	}
	loc := time.FixedZone("UTC+1", 3600)
	tr, _ = ReadSacct(strings.NewReader(sacctDump), SacctOptions{Location: loc})
	if !tr.Jobs[0].Submit.Equal(time.Date(2026, 12, 1, 15, 8, 0, 0, time.UTC)) || tr.Jobs[0].Queue != "default" {
		t.Fatalf("zone or queue: %+v", tr.Jobs[0])
	}
}

func TestReadSacctErrors(t *testing.T) {
	for in, want := range map[string]string{
		"":                         "empty input",
		"JobID|Submit|Start|End\n": "lacks AllocTRES",
		"JobID|Submit|Start|End|AllocTRES\n1|x|y|z|gres/gpu=1\n":                                                       "Submit",
		"JobID|Submit|Start|End|AllocTRES\n1|2026-12-01T16:00:00|2026-12-01T16:00:00\n":                                "fields",
		"JobID|Submit|Start|End|AllocTRES\n1|2026-12-01T16:00:00|2026-12-01T15:00:00|2026-12-01T17:00:00|gres/gpu=1\n": "out of order",
		"JobID|Submit|Start|End|AllocTRES\n1|2026-12-01T16:00:00|2026-12-01T16:00:00|2026-12-01T17:00:00|cpu=1\n":      "no job that ran with GPUs",
	} {
		_, err := ReadSacct(strings.NewReader(in), SacctOptions{})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", in, err, want)
		}
	}
}
