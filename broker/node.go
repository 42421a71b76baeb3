package broker

import (
	"time"

	"github.com/spillway-dev/spillway/onprem/gpu"
)

// NodeState is whether the scheduler may place work on a node.
type NodeState string

// Node states.
const (
	NodeReady    NodeState = "ready"
	NodeLost     NodeState = "lost"     // missed its heartbeats; its jobs were requeued
	NodeDraining NodeState = "draining" // runs what it has, takes nothing new
)

// Node is a machine running a Spillway agent, owned or rented.
type Node struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
	// Pool is "onprem" for owned machines, or the provider name for burst
	// machines; Instance is then the broker's record id of the machine.
	Pool     string `json:"pool"`
	Instance string `json:"instance,omitempty"`
	// Credential is the id of the node credential the name is bound to
	// (enrolment): only that credential may register the name again.
	Credential string `json:"credential,omitempty"`

	Inventory gpu.Inventory `json:"inventory"`
	CPU       float64       `json:"cpu,omitempty"`
	Memory    int64         `json:"memory,omitempty"`

	// Unhealthy maps card index to why it left the pool (XID, failed
	// cleanup). Such cards are never scheduled.
	Unhealthy map[int]string `json:"unhealthy,omitempty"`

	State NodeState `json:"state"`
	// Generation counts agent registrations; a heartbeat that carries an
	// older generation comes from an agent process that has been replaced.
	Generation   uint64    `json:"generation"`
	RegisteredAt time.Time `json:"registeredAt"`
	LastSeen     time.Time `json:"lastSeen"`
	AgentVersion string    `json:"agentVersion,omitempty"`
	Address      string    `json:"address,omitempty"`
	// Cache is the node's input cache (docs/data.md).
	Cache *NodeCache `json:"cache,omitempty"`
	// Cordon, when set, keeps new work off the node (spillway node
	// cordon/drain); it survives the agent's re-registration.
	Cordon *Cordon `json:"cordon,omitempty"`
}

// Cordon is an operator's mark on a node: nothing new starts there, and
// with Drain its running jobs were sent back to the queue.
type Cordon struct {
	By     string    `json:"by"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
	Drain  bool      `json:"drain,omitempty"`
}

// HealthyGPUs returns the cards the scheduler may use.
func (n *Node) HealthyGPUs() []gpu.Device {
	out := make([]gpu.Device, 0, len(n.Inventory.Devices))
	for _, d := range n.Inventory.Devices {
		if _, bad := n.Unhealthy[d.Index]; !bad {
			out = append(out, d)
		}
	}
	return out
}
