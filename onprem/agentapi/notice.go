package agentapi

import "time"

// NoticeWatch tells a burst machine's agent whose interruption notices to
// watch: the bootstrap writes it into the agent's config (docs/bursting.md,
// "Spot interruptions").
type NoticeWatch struct {
	// Provider is "aws" (EC2 instance metadata, IMDSv2) or "gcp" (the GCE
	// metadata server); empty watches nothing.
	Provider string `json:"provider"`
	// Endpoint overrides the metadata server's base URL
	// (http://169.254.169.254 on EC2, http://metadata.google.internal on
	// GCE): a proxy, or a mock in tests.
	Endpoint string `json:"endpoint,omitempty"`
}

// Notice kinds an agent reports.
const (
	// NoticeSpotInterruption: EC2 will stop, hibernate or terminate the
	// machine at ReclaimAt (spot/instance-action).
	NoticeSpotInterruption = "spot_interruption"
	// NoticeRebalance: EC2 says the spot machine is at elevated risk of
	// interruption (events/recommendations/rebalance); nothing is stopped.
	NoticeRebalance = "rebalance_recommendation"
	// NoticePreempted: GCE is preempting the machine (instance/preempted
	// turned TRUE); it goes about 30 seconds later.
	NoticePreempted = "preempted"
)

// Notice is an interruption notice the agent read from its provider.
type Notice struct {
	Kind string `json:"kind"`
	// Action is what the provider will do (terminate, stop, hibernate).
	Action string `json:"action,omitempty"`
	// ReclaimAt is when the provider takes the machine; zero for a
	// rebalance recommendation.
	ReclaimAt time.Time `json:"reclaimAt,omitempty"`
	// SeenAt is when the agent read the notice.
	SeenAt time.Time `json:"seenAt"`
}

// Ending reports whether the notice means the machine goes away.
func (n Notice) Ending() bool { return n.Kind == NoticeSpotInterruption || n.Kind == NoticePreempted }

// ReasonSpotReclaim is the stop reason of an attempt stopped because its
// machine is being reclaimed by the provider.
const ReasonSpotReclaim = "spot_reclaim"
