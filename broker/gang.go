package broker

import "time"

// MemberEnd is how one member of a gang ended (docs/jobs.md, "Multi-node
// jobs"). The gang's attempt ends once every member has.
type MemberEnd struct {
	At       time.Time `json:"at"`
	ExitCode int       `json:"exitCode"`
	Signal   string    `json:"signal,omitempty"`
	// Reason is the agent's reason (timed_out, oom_limit…) or lost when
	// the member's node or agent vanished.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// Failed reports whether the member ended other than by exiting 0.
func (e *MemberEnd) Failed() bool {
	return e.ExitCode != 0 || e.Signal != "" || e.Reason != ""
}

// NodePair is two nodes, in name order, that must not host one gang
// together.
type NodePair struct {
	A string `json:"a"`
	B string `json:"b"`
}

// Pair orders two node names into a NodePair.
func Pair(a, b string) NodePair {
	if b < a {
		a, b = b, a
	}
	return NodePair{A: a, B: b}
}

// Avoids reports whether the job must not run on a and b together.
func (j *Job) Avoids(a, b string) bool {
	if len(j.AvoidPairs) == 0 {
		return false
	}
	p := Pair(a, b)
	for _, q := range j.AvoidPairs {
		if q == p {
			return true
		}
	}
	return false
}

// Gang reports whether the job runs on more than one node.
func (j *Job) Gang() bool { return j.Spec.Resources.Nodes > 1 }
