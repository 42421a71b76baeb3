package nvml

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// DGX H100 figures the mock reports.
const (
	mockNVLinks    = 18      // NVLink 4 links per H100 SXM5
	mockIdleMW     = 70_000  // idle draw
	mockMaxMW      = 700_000 // board power limit
	mockEventTypes = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError
)

// mockBusIDs are the GPUs' PCI addresses on a DGX H100.
var mockBusIDs = [8]string{"1B", "43", "52", "61", "9D", "C3", "D1", "DF"}

// Mock is go-nvml's DGX H100 mock server (dgxh100.New: 8 H100 SXM5 80GB,
// driver 550.54.15, CUDA 12.4) completed with what this adapter reads and
// the mock leaves out: telemetry, compute processes, topology (NVSwitch
// between all cards; cards 0-3 and 4-7 on two CPU sockets), ECC counters
// and an event set. UUIDs are derived from a seed, as the simulated backend
// derives them from the node name. It serves `--gpus mock:dgxh100` demos and
// the adapter's tests; the setters steer it. Safe for concurrent use.
//
// Cards are wrappers around the mock's devices whose methods answer from
// the state below directly, so a long demo does not grow the mock's
// per-call records.
type Mock struct {
	*server.Server

	mu     sync.Mutex
	cards  []*mockCard
	events []nvml.EventData // queued for the event set, oldest first
}

// mockCard is one card's state.
type mockCard struct {
	*server.Device
	m      *Mock
	index  int
	util   uint32
	procs  []nvml.ProcessInfo
	eccDBE uint64
	lost   bool
}

// NewDGXH100Mock builds the completed mock; seed (a node name) fixes the
// UUIDs.
func NewDGXH100Mock(seed string) *Mock {
	m := &Mock{Server: dgxh100.New()}
	for i, d := range m.Devices {
		sd := d.(*server.Device)
		sum := sha256.Sum256([]byte(fmt.Sprintf("spillway-mock/%s/%d", seed, i)))
		h := hex.EncodeToString(sum[:16])
		sd.UUID = fmt.Sprintf("GPU-%s-%s-%s-%s-%s", h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
		sd.PciBusID = fmt.Sprintf("00000000:%s:00.0", mockBusIDs[i%len(mockBusIDs)])
		m.cards = append(m.cards, &mockCard{Device: sd, m: m, index: i})
	}
	m.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i < 0 || i >= len(m.cards) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return m.cards[i], nvml.SUCCESS
	}
	m.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return &mockEventSet{m: m}, nvml.SUCCESS }
	return m
}

// UUIDs returns the cards' UUIDs in index order.
func (m *Mock) UUIDs() []string {
	out := make([]string, len(m.cards))
	for i, c := range m.cards {
		out[i] = c.UUID
	}
	return out
}

// SetProcesses replaces the compute processes on card i; the card's used
// memory is their sum.
func (m *Mock) SetProcesses(i int, procs ...nvml.ProcessInfo) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cards[i].procs = append([]nvml.ProcessInfo(nil), procs...)
}

// SetUtilization sets card i's SM utilisation (0-100); power and
// temperature follow it.
func (m *Mock) SetUtilization(i int, pct uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cards[i].util = min(pct, 100)
}

// InjectXID queues an XID event on card i for the event set.
func (m *Mock) InjectXID(i int, code uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.events = append(m.events, nvml.EventData{Device: m.cards[i], EventType: nvml.EventTypeXidCriticalError, EventData: code})
}

// AddECCErrors adds n uncorrectable errors to card i's volatile counter and
// queues the matching event.
func (m *Mock) AddECCErrors(i int, n uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cards[i].eccDBE += n
	m.events = append(m.events, nvml.EventData{Device: m.cards[i], EventType: nvml.EventTypeDoubleBitEccError})
}

// SetLost makes every telemetry call on card i fail with
// ERROR_GPU_IS_LOST, as a card that fell off the bus does.
func (m *Mock) SetLost(i int, lost bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cards[i].lost = lost
}

// mockPeer is a card of this mock, possibly wrapped by a test.
type mockPeer interface{ card() *mockCard }

func (c *mockCard) card() *mockCard { return c }

// state runs f on the card's state under the mock's lock, or reports the
// card lost.
func (c *mockCard) state(f func()) nvml.Return {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	if c.lost {
		return nvml.ERROR_GPU_IS_LOST
	}
	f()
	return nvml.SUCCESS
}

// GetMemoryInfo reports the card's size and the sum of its processes' memory.
func (c *mockCard) GetMemoryInfo() (mem nvml.Memory, ret nvml.Return) {
	ret = c.state(func() {
		mem.Total = c.MemoryInfo.Total
		for _, p := range c.procs {
			if p.UsedGpuMemory != notAvailable {
				mem.Used += p.UsedGpuMemory
			}
		}
		mem.Used = min(mem.Used, mem.Total)
		mem.Free = mem.Total - mem.Used
	})
	return mem, ret
}

// GetUtilizationRates reports the utilisation set by SetUtilization.
func (c *mockCard) GetUtilizationRates() (u nvml.Utilization, ret nvml.Return) {
	ret = c.state(func() { u = nvml.Utilization{Gpu: c.util, Memory: c.util / 2} })
	return u, ret
}

// GetPowerUsage interpolates between idle draw and the power limit, in mW.
func (c *mockCard) GetPowerUsage() (mw uint32, ret nvml.Return) {
	ret = c.state(func() { mw = mockIdleMW + (mockMaxMW-mockIdleMW)*c.util/100 })
	return mw, ret
}

// GetTemperature runs from 30°C idle to 75°C at full load.
func (c *mockCard) GetTemperature(nvml.TemperatureSensors) (t uint32, ret nvml.Return) {
	ret = c.state(func() { t = 30 + c.util*45/100 })
	return t, ret
}

// GetComputeRunningProcesses reports the processes set by SetProcesses.
func (c *mockCard) GetComputeRunningProcesses() (procs []nvml.ProcessInfo, ret nvml.Return) {
	ret = c.state(func() { procs = append(procs, c.procs...) })
	return procs, ret
}

// GetTotalEccErrors reports the uncorrectable count added by AddECCErrors.
func (c *mockCard) GetTotalEccErrors(t nvml.MemoryErrorType, _ nvml.EccCounterType) (n uint64, ret nvml.Return) {
	ret = c.state(func() {
		if t == nvml.MEMORY_ERROR_TYPE_UNCORRECTED {
			n = c.eccDBE
		}
	})
	return n, ret
}

// GetPciInfo fills the bus id, which go-nvml's mock leaves empty.
func (c *mockCard) GetPciInfo() (nvml.PciInfo, nvml.Return) {
	p := nvml.PciInfo{PciDeviceId: c.Config.PciDeviceId}
	for i := 0; i < len(c.PciBusID) && i < len(p.BusId)-1; i++ {
		p.BusId[i] = int8(c.PciBusID[i])
	}
	return p, nvml.SUCCESS
}

// GetNvLinkState reports links 0-17 enabled.
func (c *mockCard) GetNvLinkState(link int) (nvml.EnableState, nvml.Return) {
	if link < 0 || link >= mockNVLinks {
		return nvml.FEATURE_DISABLED, nvml.ERROR_INVALID_ARGUMENT
	}
	return nvml.FEATURE_ENABLED, nvml.SUCCESS
}

// GetP2PStatus reports every pair reachable, as NVSwitch makes them.
func (c *mockCard) GetP2PStatus(d nvml.Device, idx nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
	if _, ok := d.(mockPeer); !ok {
		return nvml.P2P_STATUS_UNKNOWN, nvml.ERROR_INVALID_ARGUMENT
	}
	return nvml.P2P_STATUS_OK, nvml.SUCCESS
}

// GetTopologyCommonAncestor places cards 0-3 under one CPU socket and 4-7
// under the other, as on a DGX H100.
func (c *mockCard) GetTopologyCommonAncestor(d nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
	o, ok := d.(mockPeer)
	if !ok {
		return nvml.TOPOLOGY_SYSTEM, nvml.ERROR_INVALID_ARGUMENT
	}
	if o.card().index/4 == c.index/4 {
		return nvml.TOPOLOGY_NODE, nvml.SUCCESS
	}
	return nvml.TOPOLOGY_SYSTEM, nvml.SUCCESS
}

// GetSupportedEventTypes offers XID and ECC events.
func (c *mockCard) GetSupportedEventTypes() (uint64, nvml.Return) {
	return mockEventTypes, nvml.SUCCESS
}

// RegisterEvents accepts any registration; Mock queues events for all cards.
func (c *mockCard) RegisterEvents(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }

// mockEventSet hands out the mock's queued events.
type mockEventSet struct {
	mock.EventSet
	m *Mock
}

// Wait returns the oldest queued event, or ERROR_TIMEOUT when none is
// queued: the mock never blocks.
func (s *mockEventSet) Wait(uint32) (nvml.EventData, nvml.Return) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if len(s.m.events) == 0 {
		return nvml.EventData{}, nvml.ERROR_TIMEOUT
	}
	e := s.m.events[0]
	s.m.events = s.m.events[1:]
	return e, nvml.SUCCESS
}

// Free releases nothing.
func (s *mockEventSet) Free() nvml.Return { return nvml.SUCCESS }
