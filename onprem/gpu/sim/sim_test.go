package sim

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spillway-dev/spillway/onprem/gpu"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func fixedClock() time.Time { return t0 }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestParseSpec(t *testing.T) {
	good := map[string]Spec{
		"8xH100-80GB":     {8, "H100", 80},
		"4xA100-40GB":     {4, "A100", 40},
		"2xL4-24GB":       {2, "L4", 24},
		" 1 x h200-141G":  {1, "H200", 141},
		"16xRTX4090-24GB": {16, "RTX4090", 24},
	}
	for in, want := range good {
		got, err := ParseSpec(in)
		if err != nil {
			t.Errorf("ParseSpec(%q): %v", in, err)
			continue
		}
		if got != want {
			t.Errorf("ParseSpec(%q) = %+v, want %+v", in, got, want)
		}
	}
	for _, in := range []string{"", "H100", "8xH100", "0xH100-80GB", "17xH100-80GB", "8x-80GB", "8xH100-0GB", "8xH100-80TB", "8xH100-80GB; rm -rf /", "99999999999999999999xH100-80GB"} {
		if _, err := ParseSpec(in); err == nil {
			t.Errorf("ParseSpec(%q) accepted a bad spec", in)
		}
	}
}

func TestInventoryH100(t *testing.T) {
	b := newBackend(t, "8xH100-80GB", "node-a", Options{})
	inv, err := b.Inventory()
	if err != nil {
		t.Fatal(err)
	}
	if inv.Backend != "sim" || len(inv.Devices) != 8 {
		t.Fatalf("inventory = %s with %d cards, want sim with 8", inv.Backend, len(inv.Devices))
	}
	uuidRE := regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for i, d := range inv.Devices {
		if !uuidRE.MatchString(d.UUID) {
			t.Errorf("card %d UUID %q is not shaped like NVML's", i, d.UUID)
		}
		if seen[d.UUID] {
			t.Errorf("card %d repeats UUID %s", i, d.UUID)
		}
		seen[d.UUID] = true
		want := gpu.Device{Index: i, UUID: d.UUID, Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30, PCIBusID: d.PCIBusID, NVLinks: 18}
		if diff := cmp.Diff(want, d); diff != "" {
			t.Errorf("card %d (-want +got):\n%s", i, diff)
		}
	}
	for i, row := range inv.Topology {
		for j, l := range row {
			want := gpu.LinkNVLink
			if i == j {
				want = gpu.LinkSelf
			}
			if l != want {
				t.Errorf("topology[%d][%d] = %s, want %s", i, j, l, want)
			}
		}
	}

	// Same node name, same UUIDs; another node, none shared.
	again := newBackend(t, "8xH100-80GB", "node-a", Options{})
	other := newBackend(t, "8xH100-80GB", "node-b", Options{})
	if diff := cmp.Diff(b.UUIDs(), again.UUIDs()); diff != "" {
		t.Errorf("UUIDs changed for the same node (-first +second):\n%s", diff)
	}
	for _, u := range other.UUIDs() {
		if seen[u] {
			t.Errorf("node-b shares UUID %s with node-a", u)
		}
	}

	// The inventory is a copy.
	inv.Devices[0].UUID = "changed"
	inv.Topology[0][1] = gpu.LinkSys
	again2, _ := b.Inventory()
	if again2.Devices[0].UUID == "changed" || again2.Topology[0][1] != gpu.LinkNVLink {
		t.Error("changing a returned inventory changed the backend's")
	}
}

func TestTopologyPCIe(t *testing.T) {
	const (
		X = gpu.LinkSelf
		I = gpu.LinkPIX
		B = gpu.LinkPXB
		S = gpu.LinkSys
	)
	tests := []struct {
		spec string
		want [][]gpu.Link
	}{
		{"2xL4-24GB", [][]gpu.Link{{X, I}, {I, X}}},
		{"4xL40S-48GB", [][]gpu.Link{
			{X, I, B, B},
			{I, X, B, B},
			{B, B, X, I},
			{B, B, I, X},
		}},
		{"8xL4-24GB", [][]gpu.Link{
			{X, I, B, B, S, S, S, S},
			{I, X, B, B, S, S, S, S},
			{B, B, X, I, S, S, S, S},
			{B, B, I, X, S, S, S, S},
			{S, S, S, S, X, I, B, B},
			{S, S, S, S, I, X, B, B},
			{S, S, S, S, B, B, X, I},
			{S, S, S, S, B, B, I, X},
		}},
		{"1xA100-40GB", [][]gpu.Link{{X}}},
	}
	for _, tt := range tests {
		inv, _ := newBackend(t, tt.spec, "n", Options{}).Inventory()
		if diff := cmp.Diff(tt.want, inv.Topology); diff != "" {
			t.Errorf("%s topology (-want +got):\n%s", tt.spec, diff)
		}
		for _, d := range inv.Devices {
			if d.NVLinks != 0 {
				t.Errorf("%s card %d reports %d NVLinks, want none", tt.spec, d.Index, d.NVLinks)
			}
		}
	}
	inv, _ := newBackend(t, "2xL4-24GB", "n", Options{}).Inventory()
	if got := inv.Devices[1].Model; got != "NVIDIA L4" {
		t.Errorf("L4 model = %q", got)
	}
	inv, _ = newBackend(t, "2xRTX4090-24GB", "n", Options{}).Inventory()
	if got := inv.Devices[0].Model; got != "NVIDIA RTX4090 24GB" {
		t.Errorf("unknown family model = %q", got)
	}
}

// fakeProc writes a process table: pid → environment (nil: no environ file,
// as for a process that is not ours) and comm.
func fakeProc(t *testing.T, procs map[string][]string) string {
	t.Helper()
	root := t.TempDir()
	for pid, env := range procs {
		dir := filepath.Join(root, pid)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if env == nil {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, "environ"), []byte(strings.Join(env, "\x00")+"\x00"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "comm"), []byte("proc"+pid+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestSampleSumsProcessesPerCard(t *testing.T) {
	uuids := newBackend(t, "4xA100-40GB", "node-a", Options{}).UUIDs()
	foreign := newBackend(t, "4xA100-40GB", "node-b", Options{}).UUIDs()
	root := fakeProc(t, map[string][]string{
		"100":  {"HOME=/root", "CUDA_VISIBLE_DEVICES=" + uuids[0], "SIM_GPU_MEMORY=20Gi", "SIM_GPU_UTIL=50"},
		"200":  {"CUDA_VISIBLE_DEVICES=" + uuids[0] + "," + uuids[1]},
		"300":  {"CUDA_VISIBLE_DEVICES=" + foreign[0], "SIM_GPU_UTIL=100"},
		"400":  {"PATH=/bin"},
		"500":  nil,
		"600":  {"CUDA_VISIBLE_DEVICES=" + uuids[3], "SIM_GPU_MEMORY=lots", "SIM_GPU_UTIL=900"},
		"self": {"CUDA_VISIBLE_DEVICES=" + uuids[2]},
	})
	b := newBackend(t, "4xA100-40GB", "node-a", Options{ProcRoot: root, Now: fixedClock})
	got, err := b.Sample()
	if err != nil {
		t.Fatal(err)
	}
	want := gpu.Sample{At: t0, Devices: []gpu.DeviceSample{
		{Index: 0, UUID: uuids[0], MemoryUsedBytes: 21 << 30, SMUtil: 100, PowerWatts: 400, TemperatureC: 77, Processes: []gpu.Process{
			{PID: 100, UsedMemoryBytes: 20 << 30, Name: "proc100"},
			{PID: 200, UsedMemoryBytes: 1 << 30, Name: "proc200"},
		}},
		{Index: 1, UUID: uuids[1], MemoryUsedBytes: 1 << 30, SMUtil: 60, PowerWatts: 262, TemperatureC: 59, Processes: []gpu.Process{
			{PID: 200, UsedMemoryBytes: 1 << 30, Name: "proc200"},
		}},
		{Index: 2, UUID: uuids[2], PowerWatts: 55, TemperatureC: 32},
		// Bad SIM_ values fall back to the defaults.
		{Index: 3, UUID: uuids[3], MemoryUsedBytes: 1 << 30, SMUtil: 60, PowerWatts: 262, TemperatureC: 59, Processes: []gpu.Process{
			{PID: 600, UsedMemoryBytes: 1 << 30, Name: "proc600"},
		}},
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sample (-want +got):\n%s", diff)
	}
}

func TestSampleCapsMemoryAtCardSize(t *testing.T) {
	uuids := newBackend(t, "1xL4-24GB", "n", Options{}).UUIDs()
	root := fakeProc(t, map[string][]string{
		"1": {"CUDA_VISIBLE_DEVICES=" + uuids[0], "SIM_GPU_MEMORY=20Gi", "SIM_GPU_UTIL=0"},
		"2": {"CUDA_VISIBLE_DEVICES=" + uuids[0], "SIM_GPU_MEMORY=20Gi", "SIM_GPU_UTIL=0"},
	})
	b := newBackend(t, "1xL4-24GB", "n", Options{ProcRoot: root})
	s, err := b.Sample()
	if err != nil {
		t.Fatal(err)
	}
	d := s.Devices[0]
	if d.MemoryUsedBytes != 24<<30 || d.SMUtil != 0 || len(d.Processes) != 2 {
		t.Errorf("card = %d bytes, %d%%, %d processes; want 24Gi, 0%%, 2", d.MemoryUsedBytes, d.SMUtil, len(d.Processes))
	}
}

func TestInjectedEventsReportOnce(t *testing.T) {
	b := newBackend(t, "2xH100-80GB", "n", Options{ProcRoot: t.TempDir(), Now: fixedClock})
	if err := b.InjectXID(1, 79); err != nil {
		t.Fatal(err)
	}
	if err := b.InjectEvent(1, gpu.Event{Kind: gpu.EventECCDBE, Code: 2}); err != nil {
		t.Fatal(err)
	}
	if err := b.InjectXID(2, 48); err == nil {
		t.Error("InjectXID accepted card 2 of a 2-card node")
	}
	s, err := b.Sample()
	if err != nil {
		t.Fatal(err)
	}
	want := []gpu.Event{
		{At: t0, Kind: gpu.EventXID, Code: 79, Text: "XID 79: GPU has fallen off the bus"},
		{At: t0, Kind: gpu.EventECCDBE, Code: 2},
	}
	if diff := cmp.Diff(want, s.Devices[1].Events); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if len(s.Devices[0].Events) != 0 {
		t.Errorf("card 0 has events %v", s.Devices[0].Events)
	}
	s, _ = b.Sample()
	if len(s.Devices[1].Events) != 0 {
		t.Errorf("events reported twice: %v", s.Devices[1].Events)
	}
}

func TestStuckMemory(t *testing.T) {
	b := newBackend(t, "2xH100-80GB", "n", Options{ProcRoot: t.TempDir()})
	if err := b.SetStuckMemory(0, 3<<30); err != nil {
		t.Fatal(err)
	}
	if err := b.SetStuckMemory(0, -1); err == nil {
		t.Error("SetStuckMemory accepted a negative size")
	}
	s, _ := b.Sample()
	if d := s.Devices[0]; d.MemoryUsedBytes != 3<<30 || len(d.Processes) != 0 {
		t.Errorf("card 0 = %d bytes, %d processes; want 3Gi held by none", d.MemoryUsedBytes, len(d.Processes))
	}
	b.SetStuckMemory(0, 0)
	if s, _ := b.Sample(); s.Devices[0].MemoryUsedBytes != 0 {
		t.Errorf("card 0 still holds %d bytes after clearing", s.Devices[0].MemoryUsedBytes)
	}
}

func TestControlDir(t *testing.T) {
	ctl := filepath.Join(t.TempDir(), "ctl")
	b := newBackend(t, "4xL4-24GB", "n", Options{ProcRoot: t.TempDir(), ControlDir: ctl, Now: fixedClock, Log: quiet})
	write := func(name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(ctl, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("xid-3", "79\n48")
	write("xid-9", "79")      // no card 9: ignored, left alone
	write("xid-0", "boom")    // consumed, nothing reported
	write("stuck-2", "512Mi") // held while the file exists
	write("notes", "xid")

	s, err := b.Sample()
	if err != nil {
		t.Fatal(err)
	}
	want := []gpu.Event{
		{At: t0, Kind: gpu.EventXID, Code: 79, Text: gpu.XIDText(79)},
		{At: t0, Kind: gpu.EventXID, Code: 48, Text: gpu.XIDText(48)},
	}
	if diff := cmp.Diff(want, s.Devices[3].Events); diff != "" {
		t.Errorf("card 3 events (-want +got):\n%s", diff)
	}
	if len(s.Devices[0].Events) != 0 {
		t.Errorf("bad xid file reported %v", s.Devices[0].Events)
	}
	if s.Devices[2].MemoryUsedBytes != 512<<20 {
		t.Errorf("card 2 memory = %d, want 512Mi", s.Devices[2].MemoryUsedBytes)
	}
	for _, gone := range []string{"xid-3", "xid-0"} {
		if _, err := os.Stat(filepath.Join(ctl, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s was not consumed: %v", gone, err)
		}
	}
	for _, kept := range []string{"xid-9", "stuck-2", "notes"} {
		if _, err := os.Stat(filepath.Join(ctl, kept)); err != nil {
			t.Errorf("%s was removed: %v", kept, err)
		}
	}

	s, _ = b.Sample()
	if len(s.Devices[3].Events) != 0 || s.Devices[2].MemoryUsedBytes != 512<<20 {
		t.Errorf("second sample: card 3 events %v, card 2 memory %d", s.Devices[3].Events, s.Devices[2].MemoryUsedBytes)
	}
	os.Remove(filepath.Join(ctl, "stuck-2"))
	if s, _ = b.Sample(); s.Devices[2].MemoryUsedBytes != 0 {
		t.Errorf("card 2 still holds %d bytes after stuck-2 was removed", s.Devices[2].MemoryUsedBytes)
	}
}

// TestRealProcessGrandchild runs a shell that leaves a grandchild in its own
// session holding a card, as a leaked job would, and checks that the real
// /proc scan finds it and lets it go once it is killed.
func TestRealProcessGrandchild(t *testing.T) {
	b := newBackend(t, "2xH100-80GB", "leak-node", Options{})
	uuid := b.UUIDs()[1]
	cmd := exec.Command("sh", "-c", "setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $!")
	cmd.Env = append(os.Environ(), "CUDA_VISIBLE_DEVICES="+uuid, "SIM_GPU_MEMORY=2Gi", "SIM_GPU_UTIL=0")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("start grandchild: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("grandchild pid %q: %v", out, err)
	}
	proc, _ := os.FindProcess(pid)
	t.Cleanup(func() { proc.Kill() })

	// setsid may not have exec'd sleep yet; the holder is there from the
	// start, its name settles once it has.
	want := []gpu.Process{{PID: pid, UsedMemoryBytes: 2 << 30, Name: "sleep"}}
	var s gpu.Sample
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var err error
		if s, err = b.Sample(); err != nil {
			t.Fatal(err)
		}
		diff := cmp.Diff(want, gpu.Holders(s, []string{uuid}))
		if diff == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("holders of card 1 (-want +got):\n%s", diff)
		}
	}
	if n := len(s.Devices[0].Processes); n != 0 {
		t.Errorf("card 0 has %d processes, want none", n)
	}

	if err := proc.Kill(); err != nil {
		t.Fatal(err)
	}
	// The grandchild belongs to init now; a killed process is at most a
	// zombie, whose environment reads empty.
	deadline := time.Now().Add(5 * time.Second)
	for {
		s, err := b.Sample()
		if err != nil {
			t.Fatal(err)
		}
		if len(gpu.Holders(s, []string{uuid})) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("card 1 still held after kill: %v", s.Devices[1].Processes)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestClose(t *testing.T) {
	b := newBackend(t, "1xT4-16GB", "n", Options{})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Sample(); !errors.Is(err, gpu.ErrUnavailable) {
		t.Errorf("Sample after Close = %v, want ErrUnavailable", err)
	}
}

func TestNewRejectsBadInput(t *testing.T) {
	if _, err := New("8xH100-80GB", "", Options{}); err == nil {
		t.Error("New accepted an empty node name")
	}
	if _, err := New("lots of GPUs", "n", Options{}); err == nil {
		t.Error("New accepted a bad spec")
	}
}

func TestParseBytes(t *testing.T) {
	good := map[string]int64{"20Gi": 20 << 30, "512Mi": 512 << 20, "1.5G": 1.5e9, "1024": 1024, "0": 0}
	for in, want := range good {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "Gi", "-1Gi", "NaN", "Inf", "1e30", "20 Gi"} {
		if _, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) accepted a bad size", in)
		}
	}
}

func newBackend(t testing.TB, spec, node string, opts Options) *Backend {
	t.Helper()
	b, err := New(spec, node, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// BenchmarkSampleRealProc measures one Sample against this machine's /proc,
// with one process holding a card.
func BenchmarkSampleRealProc(b *testing.B) {
	be := newBackend(b, "8xH100-80GB", "bench", Options{})
	cmd := exec.Command("sleep", "60")
	cmd.Env = append(os.Environ(), "CUDA_VISIBLE_DEVICES="+be.UUIDs()[0])
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	for b.Loop() {
		s, err := be.Sample()
		if err != nil {
			b.Fatal(err)
		}
		if len(s.Devices[0].Processes) != 1 {
			b.Fatalf("card 0 has %d processes", len(s.Devices[0].Processes))
		}
	}
	procs, _ := os.ReadDir("/proc")
	b.ReportMetric(float64(len(procs)), "proc-entries")
}
