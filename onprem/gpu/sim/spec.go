package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/spillway-dev/spillway/onprem/gpu"
)

// MaxCards bounds the count in a spec; no real node carries more.
const MaxCards = 16

// Spec is a parsed fleet description such as "8xH100-80GB".
type Spec struct {
	Count     int    // cards on the node, 1..MaxCards
	Model     string // short model, upper case: "H100", "A100", "L4"
	MemoryGiB int    // framebuffer per card in GiB
}

// String prints the spec in the form ParseSpec reads.
func (s Spec) String() string { return fmt.Sprintf("%dx%s-%dGB", s.Count, s.Model, s.MemoryGiB) }

var specRE = regexp.MustCompile(`^(\d+)\s*[xX×]\s*([A-Za-z][A-Za-z0-9]*)-(\d+)\s*(?:GB|G|GiB|Gi)$`)

// ParseSpec reads "<count>x<model>-<memory>GB", e.g. "8xH100-80GB",
// "4xA100-40GB", "2xL4-24GB". The model may be any alphanumeric name; the
// families in the table below get their real product name, power envelope
// and NVLink fabric, others are treated as PCIe cards.
func ParseSpec(s string) (Spec, error) {
	m := specRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return Spec{}, fmt.Errorf("sim spec %q: want <count>x<model>-<memory>GB, like 8xH100-80GB", s)
	}
	n, err := strconv.Atoi(m[1])
	if err != nil || n < 1 || n > MaxCards {
		return Spec{}, fmt.Errorf("sim spec %q: count must be 1..%d", s, MaxCards)
	}
	mem, err := strconv.Atoi(m[3])
	if err != nil || mem < 1 || mem > 4096 {
		return Spec{}, fmt.Errorf("sim spec %q: memory must be 1..4096 GB per card", s)
	}
	return Spec{Count: n, Model: strings.ToUpper(m[2]), MemoryGiB: mem}, nil
}

// family is what the simulator knows about a GPU model.
type family struct {
	// sxm cards sit on an NVLink fabric (NVSwitch): every pair is NV#.
	sxm     bool
	nvlinks int     // active NVLink links per card on the fabric
	idleW   float64 // power draw at 0% utilisation
	maxW    float64 // power draw at 100% (board power limit)
	names   map[int]string
}

// families keys on Spec.Model. Power figures are the published board power
// limits; idle draw is a typical reading from nvidia-smi on an idle card.
var families = map[string]family{
	"H100": {sxm: true, nvlinks: 18, idleW: 70, maxW: 700, names: map[int]string{80: "NVIDIA H100 80GB HBM3"}},
	"H200": {sxm: true, nvlinks: 18, idleW: 75, maxW: 700, names: map[int]string{141: "NVIDIA H200"}},
	"B200": {sxm: true, nvlinks: 18, idleW: 140, maxW: 1000, names: map[int]string{180: "NVIDIA B200"}},
	"A100": {sxm: true, nvlinks: 12, idleW: 55, maxW: 400, names: map[int]string{40: "NVIDIA A100-SXM4-40GB", 80: "NVIDIA A100-SXM4-80GB"}},
	"L40S": {idleW: 35, maxW: 350, names: map[int]string{48: "NVIDIA L40S"}},
	"L4":   {idleW: 16, maxW: 72, names: map[int]string{24: "NVIDIA L4"}},
	"A10":  {idleW: 20, maxW: 150, names: map[int]string{24: "NVIDIA A10"}},
	"T4":   {idleW: 10, maxW: 70, names: map[int]string{16: "Tesla T4"}},
}

// genericFamily is used for models not in the table.
var genericFamily = family{idleW: 30, maxW: 300}

func (s Spec) family() family {
	if f, ok := families[s.Model]; ok {
		return f
	}
	return genericFamily
}

// productName is what NVML's DeviceGetName would say.
func (s Spec) productName() string {
	if n, ok := s.family().names[s.MemoryGiB]; ok {
		return n
	}
	return fmt.Sprintf("NVIDIA %s %dGB", s.Model, s.MemoryGiB)
}

// uuid derives a card's UUID from the node name and the card index, so a
// node keeps its UUIDs across restarts and two simulated nodes never share
// one. The shape is NVML's: GPU-8-4-4-4-12 hex digits.
func uuid(node string, index int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("spillway-sim/%s/%d", node, index)))
	h := hex.EncodeToString(sum[:16])
	return fmt.Sprintf("GPU-%s-%s-%s-%s-%s", h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
}

// pciBusID spreads the cards over the bus numbers the way a two-socket
// server does: evenly from 0x18 upward.
func pciBusID(index, count int) string {
	step := 0xE0 / count
	return fmt.Sprintf("00000000:%02X:00.0", 0x18+index*step)
}

// topology lays out the cards.
//
// SXM models (H100, H200, B200, A100) hang off NVSwitch, so every pair is
// NVLink. PCIe models follow a common two-socket layout: cards go in pairs
// behind one PCIe switch (0-1, 2-3, ...: PIX), two switches share an upstream
// switch under one CPU (0-3, 4-7, ...: PXB), and cards under different CPUs
// cross the socket interconnect (SYS).
func (s Spec) topology() [][]gpu.Link {
	t := make([][]gpu.Link, s.Count)
	sxm := s.family().sxm
	for i := range t {
		t[i] = make([]gpu.Link, s.Count)
		for j := range t[i] {
			switch {
			case i == j:
				t[i][j] = gpu.LinkSelf
			case sxm:
				t[i][j] = gpu.LinkNVLink
			case i/2 == j/2:
				t[i][j] = gpu.LinkPIX
			case i/4 == j/4:
				t[i][j] = gpu.LinkPXB
			default:
				t[i][j] = gpu.LinkSys
			}
		}
	}
	return t
}

// inventory builds the static description of the node's cards.
func (s Spec) inventory(node string) gpu.Inventory {
	f := s.family()
	inv := gpu.Inventory{
		Backend:       "sim",
		DriverVersion: DriverVersion,
		CUDAVersion:   CUDAVersion,
		Devices:       make([]gpu.Device, s.Count),
		Topology:      s.topology(),
	}
	for i := range inv.Devices {
		d := gpu.Device{
			Index:       i,
			UUID:        uuid(node, i),
			Model:       s.productName(),
			MemoryBytes: int64(s.MemoryGiB) << 30,
			PCIBusID:    pciBusID(i, s.Count),
		}
		if f.sxm && s.Count > 1 {
			d.NVLinks = f.nvlinks
		}
		inv.Devices[i] = d
	}
	return inv
}
