package api

import (
	"time"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/onprem/gpu"
)

// CardView is one GPU as the API shows it: what it is, who holds it, how
// busy it is.
type CardView struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Model       string `json:"model"`
	MemoryBytes int64  `json:"memoryBytes"`
	// Job and Team hold the card ("" when free).
	Jobs      []string `json:"jobs,omitempty"`
	Teams     []string `json:"teams,omitempty"`
	Unhealthy string   `json:"unhealthy,omitempty"`
	// Telemetry is the card's latest sample, if the agent sent one.
	Telemetry *gpu.DeviceSample `json:"telemetry,omitempty"`
	// ProcessJobs maps the PIDs on the card to their jobs, where known.
	ProcessJobs map[int]string `json:"processJobs,omitempty"`
}

// NodeView is a node with its cards.
type NodeView struct {
	*broker.Node
	Cards    []CardView `json:"cards"`
	FreeGPUs int        `json:"freeGpus"`
	// SampledAt is when the latest telemetry was taken.
	SampledAt *time.Time `json:"sampledAt,omitempty"`
}
