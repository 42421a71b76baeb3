// Package gpu is the agent's view of a node's GPUs: a small Backend
// interface in the manner of NVIDIA's device plugin Manager/Device, with
// one implementation per source of truth (NVML on real hardware, a
// simulated fleet for development and tests).
//
// Errors from the vendor library become Go errors at this edge; nothing
// above this package sees nvml.Return.
package gpu

import (
	"errors"
	"time"
)

// ErrUnavailable is returned by a backend that cannot start on this machine
// (no driver, no library, no devices).
var ErrUnavailable = errors.New("gpu backend unavailable")

// Link is how close two cards are, from nvidia-smi topo's vocabulary.
// Lower is closer.
type Link uint8

// Link levels, closest first.
const (
	LinkSelf   Link = iota // the same card
	LinkNVLink             // NV#: direct NVLink / NVSwitch
	LinkPIX                // one PCIe switch
	LinkPXB                // several PCIe switches, no host bridge
	LinkPHB                // through a PCIe host bridge
	LinkNode               // across host bridges within a NUMA node
	LinkSys                // across NUMA nodes (SMP interconnect)
)

// String is the nvidia-smi topo spelling.
func (l Link) String() string {
	return [...]string{"X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS"}[min(int(l), 6)]
}

// Device is one card as the inventory reports it.
type Device struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Model       string `json:"model"`       // e.g. "NVIDIA H100 80GB HBM3"
	MemoryBytes int64  `json:"memoryBytes"` // total framebuffer memory
	PCIBusID    string `json:"pciBusId,omitempty"`
	MIG         bool   `json:"mig,omitempty"` // MIG mode enabled
	// NVLinks is the number of active NVLink links on the card.
	NVLinks int `json:"nvlinks,omitempty"`
}

// Inventory is everything static about a node's GPUs.
type Inventory struct {
	Backend       string   `json:"backend"` // nvml | sim | none
	DriverVersion string   `json:"driverVersion,omitempty"`
	CUDAVersion   string   `json:"cudaVersion,omitempty"`
	Devices       []Device `json:"devices"`
	// Topology[i][j] is the link between cards i and j (by index).
	Topology [][]Link `json:"topology,omitempty"`
	// MPS reports whether an MPS control daemon serves this node.
	MPS bool `json:"mps,omitempty"`
}

// Process is a compute process holding memory on a card.
type Process struct {
	PID             int    `json:"pid"`
	UsedMemoryBytes int64  `json:"usedMemoryBytes"`
	Name            string `json:"name,omitempty"`
}

// Event is something the card reported between samples: an XID error or an
// ECC error.
type Event struct {
	At   time.Time `json:"at"`
	Kind string    `json:"kind"` // xid | ecc_dbe | ecc_sbe
	Code uint64    `json:"code"` // the XID number, or the error count
	Text string    `json:"text,omitempty"`
}

// DeviceSample is one card's telemetry at one moment.
type DeviceSample struct {
	Index           int       `json:"index"`
	UUID            string    `json:"uuid"`
	MemoryUsedBytes int64     `json:"memoryUsedBytes"`
	SMUtil          int       `json:"smUtil"` // percent, 0-100
	PowerWatts      float64   `json:"powerWatts"`
	TemperatureC    int       `json:"temperatureC"`
	Processes       []Process `json:"processes,omitempty"`
	Events          []Event   `json:"events,omitempty"`
}

// Sample is one telemetry reading of all cards.
type Sample struct {
	At      time.Time      `json:"at"`
	Devices []DeviceSample `json:"devices"`
}

// Backend reads a node's GPUs. Implementations are safe for concurrent use.
type Backend interface {
	// Inventory describes the cards; it does not change while the backend
	// is open.
	Inventory() (Inventory, error)
	// Sample reads current telemetry of every card, including the compute
	// processes on each and any XID/ECC events since the last Sample.
	Sample() (Sample, error)
	// Close releases the backend.
	Close() error
}

// ShortModel turns a product name as NVML reports it into the short model
// name operators write in rates, offers and gpuModel constraints:
// "NVIDIA H100 80GB HBM3" → "H100", "NVIDIA A100-SXM4-80GB" → "A100",
// "Tesla V100-SXM2-32GB" → "V100".
func ShortModel(product string) string {
	s := product
	for _, p := range []string{"NVIDIA ", "Tesla ", "GeForce ", "Quadro "} {
		if len(s) > len(p) && s[:len(p)] == p {
			s = s[len(p):]
		}
	}
	for i, r := range s {
		if r == ' ' || r == '-' {
			return s[:i]
		}
	}
	return s
}
