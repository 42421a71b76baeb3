package nvml

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/go-cmp/cmp"

	"github.com/spillway-dev/spillway/onprem/gpu"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// testOptions reads process names from a fake /proc holding PID 4242
// ("python") and nothing else.
func testOptions(t *testing.T) Options {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "4242"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "4242", "comm"), []byte("python\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return Options{
		ProcRoot:   root,
		MPSPipeDir: t.TempDir(),
		Now:        func() time.Time { return t0 },
		Log:        slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

func open(t *testing.T, lib nvml.Interface) *Backend {
	t.Helper()
	b, err := New(lib, testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestInventoryDGXH100(t *testing.T) {
	m := NewDGXH100Mock("node-a")
	inv, err := open(t, m).Inventory()
	if err != nil {
		t.Fatal(err)
	}
	uuids := m.UUIDs()
	want := gpu.Inventory{Backend: "nvml", DriverVersion: "550.54.15", CUDAVersion: "12.4"}
	for i, bus := range mockBusIDs {
		want.Devices = append(want.Devices, gpu.Device{
			Index: i, UUID: uuids[i], Model: "NVIDIA H100 80GB HBM3", MemoryBytes: 80 << 30,
			PCIBusID: "00000000:" + bus + ":00.0", NVLinks: 18,
		})
		row := make([]gpu.Link, 8)
		for j := range row {
			row[j] = gpu.LinkNVLink
		}
		row[i] = gpu.LinkSelf
		want.Topology = append(want.Topology, row)
	}
	if diff := cmp.Diff(want, inv); diff != "" {
		t.Errorf("inventory (-want +got):\n%s", diff)
	}
	if other := NewDGXH100Mock("node-b").UUIDs(); other[0] == uuids[0] {
		t.Errorf("two seeds gave the same UUID %s", uuids[0])
	}
}

// pcieOnly hides NVLink from a card so the PCIe level shows through.
type pcieOnly struct{ *mockCard }

func (p pcieOnly) GetP2PStatus(nvml.Device, nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
	return nvml.P2P_STATUS_NOT_SUPPORTED, nvml.SUCCESS
}

func TestTopologyWithoutNVLink(t *testing.T) {
	m := NewDGXH100Mock("n")
	m.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) { return pcieOnly{m.cards[i]}, nvml.SUCCESS }
	inv, err := open(t, m).Inventory()
	if err != nil {
		t.Fatal(err)
	}
	const X, N, S = gpu.LinkSelf, gpu.LinkNode, gpu.LinkSys
	want := [][]gpu.Link{
		{X, N, N, N, S, S, S, S},
		{N, X, N, N, S, S, S, S},
		{N, N, X, N, S, S, S, S},
		{N, N, N, X, S, S, S, S},
		{S, S, S, S, X, N, N, N},
		{S, S, S, S, N, X, N, N},
		{S, S, S, S, N, N, X, N},
		{S, S, S, S, N, N, N, X},
	}
	if diff := cmp.Diff(want, inv.Topology); diff != "" {
		t.Errorf("topology (-want +got):\n%s", diff)
	}
}

func TestLinkOf(t *testing.T) {
	want := map[nvml.GpuTopologyLevel]gpu.Link{
		nvml.TOPOLOGY_INTERNAL:   gpu.LinkPIX,
		nvml.TOPOLOGY_SINGLE:     gpu.LinkPIX,
		nvml.TOPOLOGY_MULTIPLE:   gpu.LinkPXB,
		nvml.TOPOLOGY_HOSTBRIDGE: gpu.LinkPHB,
		nvml.TOPOLOGY_NODE:       gpu.LinkNode,
		nvml.TOPOLOGY_SYSTEM:     gpu.LinkSys,
		77:                       gpu.LinkSys,
	}
	for l, w := range want {
		if got := linkOf(l); got != w {
			t.Errorf("linkOf(%d) = %s, want %s", l, got, w)
		}
	}
}

func TestSampleTelemetryAndProcesses(t *testing.T) {
	m := NewDGXH100Mock("n")
	m.SetProcesses(2,
		nvml.ProcessInfo{Pid: 4242, UsedGpuMemory: 20 << 30},
		nvml.ProcessInfo{Pid: 5151, UsedGpuMemory: notAvailable}, // no name: not in this /proc
	)
	m.SetProcesses(3, nvml.ProcessInfo{Pid: 4242, UsedGpuMemory: 2 << 30})
	m.SetUtilization(2, 80)
	b := open(t, m)
	s, err := b.Sample()
	if err != nil {
		t.Fatal(err)
	}
	if s.At != t0 || len(s.Devices) != 8 {
		t.Fatalf("sample at %v with %d cards", s.At, len(s.Devices))
	}
	want := gpu.DeviceSample{
		Index: 2, UUID: m.UUIDs()[2], MemoryUsedBytes: 20 << 30, SMUtil: 80, PowerWatts: 574, TemperatureC: 66,
		Processes: []gpu.Process{{PID: 4242, UsedMemoryBytes: 20 << 30, Name: "python"}, {PID: 5151}},
	}
	if diff := cmp.Diff(want, s.Devices[2]); diff != "" {
		t.Errorf("card 2 (-want +got):\n%s", diff)
	}
	idle := gpu.DeviceSample{Index: 0, UUID: m.UUIDs()[0], PowerWatts: 70, TemperatureC: 30}
	if diff := cmp.Diff(idle, s.Devices[0]); diff != "" {
		t.Errorf("idle card 0 (-want +got):\n%s", diff)
	}
	got := gpu.Holders(s, m.UUIDs()[2:4])
	wantHolders := []gpu.Process{{PID: 4242, UsedMemoryBytes: 22 << 30, Name: "python"}, {PID: 5151}}
	if diff := cmp.Diff(wantHolders, got); diff != "" {
		t.Errorf("holders of cards 2-3 (-want +got):\n%s", diff)
	}
}

func TestXIDEventSurfacesOnce(t *testing.T) {
	m := NewDGXH100Mock("n")
	b := open(t, m)
	m.InjectXID(3, 79)
	m.InjectXID(3, 13)
	s, err := b.Sample()
	if err != nil {
		t.Fatal(err)
	}
	want := []gpu.Event{
		{At: t0, Kind: gpu.EventXID, Code: 79, Text: "XID 79: GPU has fallen off the bus"},
		{At: t0, Kind: gpu.EventXID, Code: 13, Text: gpu.XIDText(13)},
	}
	if diff := cmp.Diff(want, s.Devices[3].Events); diff != "" {
		t.Errorf("card 3 events (-want +got):\n%s", diff)
	}
	if !gpu.Critical(s.Devices[3].Events[0]) || gpu.Critical(s.Devices[3].Events[1]) {
		t.Error("XID 79 should be critical and XID 13 not")
	}
	for i, d := range s.Devices {
		if i != 3 && len(d.Events) != 0 {
			t.Errorf("card %d has events %v", i, d.Events)
		}
	}
	if s, _ = b.Sample(); len(s.Devices[3].Events) != 0 {
		t.Errorf("events reported twice: %v", s.Devices[3].Events)
	}
}

func TestECCErrorsReportTheDelta(t *testing.T) {
	m := NewDGXH100Mock("n")
	m.AddECCErrors(5, 1) // before the backend opens: not new to it
	b := open(t, m)
	m.AddECCErrors(5, 2)
	s, err := b.Sample()
	if err != nil {
		t.Fatal(err)
	}
	want := []gpu.Event{{At: t0, Kind: gpu.EventECCDBE, Code: 2, Text: "2 new uncorrectable ECC errors (volatile count 3)"}}
	if diff := cmp.Diff(want, s.Devices[5].Events); diff != "" {
		t.Errorf("card 5 events (-want +got):\n%s", diff)
	}
	if s, _ = b.Sample(); len(s.Devices[5].Events) != 0 {
		t.Errorf("ECC errors reported twice: %v", s.Devices[5].Events)
	}
}

func TestLostGPUBecomesXID79(t *testing.T) {
	m := NewDGXH100Mock("n")
	m.SetProcesses(0, nvml.ProcessInfo{Pid: 4242, UsedGpuMemory: 1 << 30})
	b := open(t, m)
	m.SetLost(6, true)
	s, err := b.Sample()
	if err != nil {
		t.Fatalf("a lost card failed the whole sample: %v", err)
	}
	if ev := s.Devices[6].Events; len(ev) != 1 || ev[0].Code != 79 || !strings.Contains(ev[0].Text, "GPU_IS_LOST") {
		t.Errorf("lost card events = %v, want one XID 79 naming GPU_IS_LOST", ev)
	}
	if len(s.Devices[0].Processes) != 1 {
		t.Errorf("healthy card 0 lost its process: %v", s.Devices[0])
	}
	if s, _ = b.Sample(); len(s.Devices[6].Events) != 0 {
		t.Errorf("XID 79 repeated: %v", s.Devices[6].Events)
	}
}

// faulty makes one telemetry call on a card return ret.
type faulty struct {
	*mockCard
	util, power nvml.Return
}

func (f faulty) GetUtilizationRates() (nvml.Utilization, nvml.Return) {
	if f.util != nvml.SUCCESS {
		return nvml.Utilization{}, f.util
	}
	return f.mockCard.GetUtilizationRates()
}

func (f faulty) GetPowerUsage() (uint32, nvml.Return) {
	if f.power != nvml.SUCCESS {
		return 0, f.power
	}
	return f.mockCard.GetPowerUsage()
}

func TestErrorReturnsBecomeErrors(t *testing.T) {
	m := NewDGXH100Mock("n")
	m.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i == 1 {
			return faulty{mockCard: m.cards[i], util: nvml.ERROR_UNKNOWN}, nvml.SUCCESS
		}
		return m.cards[i], nvml.SUCCESS
	}
	b, err := New(m, testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, err = b.Sample()
	if err == nil {
		t.Fatal("Sample hid an ERROR_UNKNOWN")
	}
	if returnOf(err) != nvml.ERROR_UNKNOWN || !strings.Contains(err.Error(), "sample GPU 1: nvmlDeviceGetUtilizationRates: ERROR_UNKNOWN") {
		t.Errorf("error = %q (return %v)", err, returnOf(err))
	}
}

func TestUnsupportedMetricIsZero(t *testing.T) {
	m := NewDGXH100Mock("n")
	m.SetUtilization(1, 50)
	m.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i == 1 {
			return faulty{mockCard: m.cards[i], power: nvml.ERROR_NOT_SUPPORTED}, nvml.SUCCESS
		}
		return m.cards[i], nvml.SUCCESS
	}
	b, err := New(m, testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	s, err := b.Sample()
	if err != nil {
		t.Fatalf("an unsupported metric failed the sample: %v", err)
	}
	if d := s.Devices[1]; d.PowerWatts != 0 || d.SMUtil != 50 {
		t.Errorf("card 1 power %v W, util %d%%; want 0 W (unsupported), 50%%", d.PowerWatts, d.SMUtil)
	}
}

func TestInitFailuresAreUnavailable(t *testing.T) {
	tests := []struct {
		ret  nvml.Return
		want string
	}{
		{nvml.ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1 not found; install the NVIDIA driver"},
		{nvml.ERROR_DRIVER_NOT_LOADED, "NVIDIA kernel driver is not loaded"},
		{nvml.ERROR_NO_PERMISSION, "ERROR_NO_PERMISSION"},
	}
	for _, tt := range tests {
		m := NewDGXH100Mock("n")
		m.InitFunc = func() nvml.Return { return tt.ret }
		_, err := New(m, testOptions(t))
		if !errors.Is(err, gpu.ErrUnavailable) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("init %v: err = %v, want ErrUnavailable saying %q", tt.ret, err, tt.want)
		}
	}

	m := NewDGXH100Mock("n")
	m.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
	if _, err := New(m, testOptions(t)); !errors.Is(err, gpu.ErrUnavailable) {
		t.Errorf("no GPUs: err = %v, want ErrUnavailable", err)
	}
	if n := len(m.ShutdownCalls()); n != 1 {
		t.Errorf("a failed start shut NVML down %d times, want 1", n)
	}
}

func TestOpenRealLibrary(t *testing.T) {
	b, err := Open(testOptions(t))
	if err != nil {
		if !errors.Is(err, gpu.ErrUnavailable) {
			t.Fatalf("Open without a driver: %v, want ErrUnavailable", err)
		}
		if os.Getenv("SPILLWAY_REQUIRE_NVML") != "" {
			t.Fatalf("SPILLWAY_REQUIRE_NVML is set but NVML cannot start: %v", err)
		}
		t.Logf("no NVIDIA driver here, as expected on a CPU machine: %v", err)
		return
	}
	defer b.Close()
	// A machine with a driver: check what the real library answers.
	inv, _ := b.Inventory()
	t.Logf("real NVML: driver %s, CUDA %s, %d GPUs, MPS %v", inv.DriverVersion, inv.CUDAVersion, len(inv.Devices), inv.MPS)
	if len(inv.Devices) == 0 || inv.DriverVersion == "" || inv.CUDAVersion == "" {
		t.Errorf("real NVML inventory is incomplete: %+v", inv)
	}
	for _, d := range inv.Devices {
		t.Logf("GPU %d: %+v", d.Index, d)
		if !strings.HasPrefix(d.UUID, "GPU-") || d.Model == "" || d.MemoryBytes <= 0 || d.PCIBusID == "" {
			t.Errorf("GPU %d is missing fields: %+v", d.Index, d)
		}
	}
	if len(inv.Topology) != len(inv.Devices) {
		t.Errorf("topology has %d rows for %d GPUs", len(inv.Topology), len(inv.Devices))
	}
	for i, row := range inv.Topology {
		if len(row) != len(inv.Devices) || row[i] != gpu.LinkSelf {
			t.Errorf("topology row %d = %v", i, row)
		}
	}
	for range 2 {
		s, err := b.Sample()
		if err != nil {
			t.Fatalf("real NVML sample: %v", err)
		}
		if len(s.Devices) != len(inv.Devices) {
			t.Fatalf("sample has %d GPUs, inventory %d", len(s.Devices), len(inv.Devices))
		}
		for _, d := range s.Devices {
			t.Logf("GPU %d: %d MiB used, %d%% SM, %.1f W, %d C, processes %+v, events %+v",
				d.Index, d.MemoryUsedBytes>>20, d.SMUtil, d.PowerWatts, d.TemperatureC, d.Processes, d.Events)
			if d.UUID != inv.Devices[d.Index].UUID || d.TemperatureC <= 0 || d.PowerWatts <= 0 {
				t.Errorf("GPU %d sample looks wrong: %+v", d.Index, d)
			}
		}
	}
}

func TestClose(t *testing.T) {
	m := NewDGXH100Mock("n")
	b, err := New(m, testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if n := len(m.ShutdownCalls()); n != 1 {
		t.Errorf("nvmlShutdown called %d times, want 1", n)
	}
	if _, err := b.Sample(); !errors.Is(err, gpu.ErrUnavailable) {
		t.Errorf("Sample after Close = %v, want ErrUnavailable", err)
	}
}

// TestRawDGXH100 drives the adapter with go-nvml's dgxh100 mock itself,
// filling the calls it leaves unset through its Func fields, as a test of
// the adapter against an outside fake.
func TestRawDGXH100(t *testing.T) {
	s := dgxh100.New()
	var queued []nvml.EventData
	s.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
				if len(queued) == 0 {
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
				e := queued[0]
				queued = queued[1:]
				return e, nvml.SUCCESS
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	for i, dev := range s.Devices {
		d := dev.(*server.Device)
		d.GetNvLinkStateFunc = func(int) (nvml.EnableState, nvml.Return) { return nvml.FEATURE_DISABLED, nvml.ERROR_NOT_SUPPORTED }
		d.GetTopologyCommonAncestorFunc = func(nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) { return nvml.TOPOLOGY_SINGLE, nvml.SUCCESS }
		d.GetP2PStatusFunc = func(nvml.Device, nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
			return nvml.P2P_STATUS_NOT_SUPPORTED, nvml.SUCCESS
		}
		d.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
			return 0, nvml.ERROR_NOT_SUPPORTED
		}
		d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return nvml.EventTypeXidCriticalError, nvml.SUCCESS }
		d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
		d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 37}, nvml.SUCCESS }
		d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 123_456, nvml.SUCCESS }
		d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 41, nvml.SUCCESS }
		d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			if i != 4 {
				return nil, nvml.SUCCESS
			}
			return []nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 3 << 30}}, nvml.SUCCESS
		}
	}
	b := open(t, s)
	inv, _ := b.Inventory()
	if len(inv.Devices) != 8 || inv.Devices[4].UUID != s.Devices[4].(*server.Device).UUID || inv.Topology[0][1] != gpu.LinkPIX {
		t.Errorf("inventory from the raw mock: %+v", inv)
	}
	queued = append(queued, nvml.EventData{Device: s.Devices[4], EventType: nvml.EventTypeXidCriticalError, EventData: 48})
	smp, err := b.Sample()
	if err != nil {
		t.Fatal(err)
	}
	want := gpu.DeviceSample{
		Index: 4, UUID: inv.Devices[4].UUID, SMUtil: 37, PowerWatts: 123.456, TemperatureC: 41,
		Processes: []gpu.Process{{PID: 4242, UsedMemoryBytes: 3 << 30, Name: "python"}},
		Events:    []gpu.Event{{At: t0, Kind: gpu.EventXID, Code: 48, Text: gpu.XIDText(48)}},
	}
	if diff := cmp.Diff(want, smp.Devices[4]); diff != "" {
		t.Errorf("card 4 (-want +got):\n%s", diff)
	}
}
