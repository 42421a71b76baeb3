package gpu

import (
	"fmt"
	"slices"
)

// Event kinds a backend reports.
const (
	EventXID    = "xid"     // Code is the XID number
	EventECCDBE = "ecc_dbe" // Code is the count of new uncorrectable (double-bit) errors
	EventECCSBE = "ecc_sbe" // Code is the count of new correctable (single-bit) errors
)

// xidInfo is one row of the criticality table.
type xidInfo struct {
	text     string
	critical bool
}

// xids follows NVIDIA's Xid catalog for Ampere and newer
// (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html).
// An XID is critical here when the catalog's immediate action is to reset
// the GPU or reboot the node, or when the card's memory or links can no
// longer be trusted: such a card must leave the pool until an operator has
// reset it. XIDs whose immediate action is to restart the application (13,
// 31, 43, 45, ...) describe a job's fault, not the card's; they are reported
// but leave the card in service.
var xids = map[uint64]xidInfo{
	8:   {"GPU stopped processing (channel idle timeout)", false},
	13:  {"graphics engine exception (usually an application fault)", false},
	31:  {"GPU memory page fault (usually an application fault)", false},
	32:  {"invalid or corrupted push buffer stream", false},
	38:  {"driver firmware error", false},
	43:  {"GPU stopped processing a channel (application fault)", false},
	45:  {"preemptive cleanup after a process ended", false},
	48:  {"double-bit ECC error", true},
	61:  {"internal micro-controller breakpoint/warning", false},
	62:  {"internal micro-controller halt", true},
	63:  {"ECC page retirement or row remapping recorded; reset to activate", true},
	64:  {"ECC page retirement or row remapping failure", true},
	68:  {"video processor exception", false},
	69:  {"graphics engine class error", false},
	74:  {"NVLink error", true},
	79:  {"GPU has fallen off the bus", true},
	92:  {"high single-bit ECC error rate", false},
	94:  {"contained ECC error; row remapping pending until reset", true},
	95:  {"uncontained ECC error", true},
	109: {"context switch timeout", false},
	119: {"GSP RPC timeout", true},
	120: {"GSP error", true},
	140: {"unrecovered ECC error", true},
	143: {"GPU initialisation failure", true},
	154: {"GPU recovery action changed (reset or reboot required)", true},
}

// CriticalXID reports whether an XID means the card must leave the pool
// until it is reset. Unknown XIDs are not critical: the event is still
// reported, and an operator can act on it.
func CriticalXID(code uint64) bool { return xids[code].critical }

// CriticalXIDs lists the critical XID codes in ascending order.
func CriticalXIDs() []uint64 {
	var out []uint64
	for c, x := range xids {
		if x.critical {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}

// XIDText describes an XID in a few words, e.g. "XID 79: GPU has fallen off
// the bus".
func XIDText(code uint64) string {
	if x, ok := xids[code]; ok {
		return fmt.Sprintf("XID %d: %s", code, x.text)
	}
	return fmt.Sprintf("XID %d", code)
}

// Critical reports whether an event means the card must leave the pool: a
// critical XID or any uncorrectable ECC error.
func Critical(e Event) bool {
	switch e.Kind {
	case EventXID:
		return CriticalXID(e.Code)
	case EventECCDBE:
		return e.Code > 0
	}
	return false
}

// Holders returns the processes on any of the given cards (by UUID), each
// process once with its memory summed over those cards, ordered by PID.
// This is what leak cleanup kills and what "who holds that card" shows.
func Holders(s Sample, uuids []string) []Process {
	byPID := map[int]*Process{}
	for _, d := range s.Devices {
		if !slices.Contains(uuids, d.UUID) {
			continue
		}
		for _, p := range d.Processes {
			if h, ok := byPID[p.PID]; ok {
				h.UsedMemoryBytes += p.UsedMemoryBytes
				if h.Name == "" {
					h.Name = p.Name
				}
				continue
			}
			c := p
			byPID[p.PID] = &c
		}
	}
	out := make([]Process, 0, len(byPID))
	for _, p := range byPID {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b Process) int { return a.PID - b.PID })
	return out
}
