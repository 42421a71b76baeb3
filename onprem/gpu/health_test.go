package gpu

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCriticalXID(t *testing.T) {
	for _, c := range []uint64{48, 63, 64, 74, 79, 94, 95, 119, 120} {
		if !CriticalXID(c) {
			t.Errorf("XID %d is not critical", c)
		}
	}
	for _, c := range []uint64{13, 31, 43, 45, 92, 0, 9999} {
		if CriticalXID(c) {
			t.Errorf("XID %d is critical", c)
		}
	}
	for _, c := range CriticalXIDs() {
		if !CriticalXID(c) {
			t.Errorf("CriticalXIDs lists %d, which is not critical", c)
		}
	}
	if got := XIDText(79); got != "XID 79: GPU has fallen off the bus" {
		t.Errorf("XIDText(79) = %q", got)
	}
	if got := XIDText(9999); got != "XID 9999" {
		t.Errorf("XIDText(9999) = %q", got)
	}
}

func TestCriticalEvent(t *testing.T) {
	tests := []struct {
		e    Event
		want bool
	}{
		{Event{Kind: EventXID, Code: 79}, true},
		{Event{Kind: EventXID, Code: 13}, false},
		{Event{Kind: EventECCDBE, Code: 1}, true},
		{Event{Kind: EventECCDBE, Code: 0}, false},
		{Event{Kind: EventECCSBE, Code: 500}, false},
		{Event{Kind: "other", Code: 79}, false},
	}
	for _, tt := range tests {
		if got := Critical(tt.e); got != tt.want {
			t.Errorf("Critical(%+v) = %v, want %v", tt.e, got, tt.want)
		}
	}
}

func TestHolders(t *testing.T) {
	s := Sample{Devices: []DeviceSample{
		{Index: 0, UUID: "GPU-a", Processes: []Process{{PID: 30, UsedMemoryBytes: 5, Name: "train"}, {PID: 10, UsedMemoryBytes: 1}}},
		{Index: 1, UUID: "GPU-b", Processes: []Process{{PID: 30, UsedMemoryBytes: 7, Name: "train"}, {PID: 20, UsedMemoryBytes: 2}}},
		{Index: 2, UUID: "GPU-c", Processes: []Process{{PID: 40, UsedMemoryBytes: 9}, {PID: 10, UsedMemoryBytes: 3, Name: "leak"}}},
	}}
	tests := []struct {
		name  string
		uuids []string
		want  []Process
	}{
		{"one card", []string{"GPU-b"}, []Process{{PID: 20, UsedMemoryBytes: 2}, {PID: 30, UsedMemoryBytes: 7, Name: "train"}}},
		{"a process on two cards is listed once with its memory summed", []string{"GPU-a", "GPU-b"},
			[]Process{{PID: 10, UsedMemoryBytes: 1}, {PID: 20, UsedMemoryBytes: 2}, {PID: 30, UsedMemoryBytes: 12, Name: "train"}}},
		{"a name from either card", []string{"GPU-a", "GPU-c"},
			[]Process{{PID: 10, UsedMemoryBytes: 4, Name: "leak"}, {PID: 30, UsedMemoryBytes: 5, Name: "train"}, {PID: 40, UsedMemoryBytes: 9}}},
		{"unknown card", []string{"GPU-z"}, []Process{}},
		{"no cards", nil, []Process{}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, Holders(s, tt.uuids)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}
}

func TestLinkJSON(t *testing.T) {
	inv := Inventory{Backend: "sim", Devices: []Device{}, Topology: [][]Link{
		{LinkSelf, LinkNVLink, LinkPIX, LinkPXB},
		{LinkNVLink, LinkSelf, LinkPHB, LinkNode},
		{LinkPIX, LinkPHB, LinkSelf, LinkSys},
		{LinkPXB, LinkNode, LinkSys, LinkSelf},
	}}
	b, err := json.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"backend":"sim","devices":[],"topology":[["X","NV","PIX","PXB"],["NV","X","PHB","NODE"],["PIX","PHB","X","SYS"],["PXB","NODE","SYS","X"]]}`
	if string(b) != want {
		t.Errorf("JSON = %s\nwant   %s", b, want)
	}
	var back Inventory
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(inv, back); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	var l Link
	if err := l.UnmarshalText([]byte("NV18")); err != nil || l != LinkNVLink {
		t.Errorf("NV18 read as %v, %v", l, err)
	}
	if err := l.UnmarshalText([]byte("PCIE")); err == nil {
		t.Error("PCIE accepted as a link level")
	}
	if _, err := Link(9).MarshalText(); err == nil {
		t.Error("level 9 marshalled")
	}
}
