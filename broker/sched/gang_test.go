package sched

import (
	"testing"

	"github.com/spillway-dev/spillway/broker"
)

// Avoid records a pairing a failed preflight ruled out for the job.
func (w *JobWrapper) Avoid(a, b string) *JobWrapper {
	w.j.AvoidPairs = append(w.j.AvoidPairs, broker.Pair(a, b))
	return w
}

func TestGangAvoidsPairings(t *testing.T) {
	runCases(t, map[string]schedCase{
		"a gang is not placed on a pairing its preflight failed": {
			nodes: []*NodeWrapper{MakeNode("n1").GPUs(2), MakeNode("n2").GPUs(2), MakeNode("n3").GPUs(2)},
			jobs:  []*JobWrapper{MakeJob("gang").GPUs(2).Nodes(2).Avoid("n1", "n2")},
			want:  outcome{Starts: map[string]string{"gang": "n1:0,1 n3:0,1"}},
		},
		"a gang with every pairing ruled out waits": {
			nodes: []*NodeWrapper{MakeNode("n1").GPUs(2), MakeNode("n2").GPUs(2)},
			jobs:  []*JobWrapper{MakeJob("gang").GPUs(2).Nodes(2).Avoid("n2", "n1")},
			want:  outcome{Pending: map[string]string{"gang": ReasonGang}},
		},
	})
}
