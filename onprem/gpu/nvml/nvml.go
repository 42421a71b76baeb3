// Package nvml reads real NVIDIA GPUs through NVML (github.com/NVIDIA/go-nvml).
//
// The adapter is written against nvml.Interface, so the same code runs on
// the driver's libnvidia-ml.so.1 (Open) and on go-nvml's mock servers (New
// with NewDGXH100Mock) in tests and demos. Every nvml.Return other than
// SUCCESS becomes a Go error here; nothing above this package sees one.
// A metric a card does not support (ERROR_NOT_SUPPORTED) is left at zero
// rather than failing the sample, and a card that reports ERROR_GPU_IS_LOST
// surfaces as an XID 79 event instead of blinding the agent to the others.
package nvml

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/spillway-dev/spillway/onprem/gpu"
)

// LibraryName is the shared library NVML is loaded from; the NVIDIA driver
// installs it.
const LibraryName = "libnvidia-ml.so.1"

// maxEventsPerSample bounds how many events one Sample drains, so an XID
// storm cannot hold the agent's loop.
const maxEventsPerSample = 256

// notAvailable is NVML_VALUE_NOT_AVAILABLE, what NVML puts in a process's
// used memory when it cannot tell (no permission, WDDM).
const notAvailable = ^uint64(0)

// Options tune the adapter. The zero value is ready to use.
type Options struct {
	// Name is the backend name the inventory reports; "nvml" when empty.
	Name string
	// ProcRoot is where process names are read (PID/comm); "/proc" when
	// empty.
	ProcRoot string
	// MPSPipeDir is where an MPS control daemon puts its "control" pipe;
	// $CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps, when empty.
	MPSPipeDir string
	// Now is the clock for sample and event times; time.Now when nil.
	Now func() time.Time
	// Log receives notes about features a card lacks; slog.Default() when
	// nil.
	Log *slog.Logger
}

// Backend reads a node's cards through NVML. It implements gpu.Backend and
// is safe for concurrent use.
type Backend struct {
	lib  nvml.Interface
	opts Options
	inv  gpu.Inventory

	mu      sync.Mutex
	closed  bool
	devices []nvml.Device
	events  nvml.EventSet // nil when the driver offers no events
	ecc     []eccCounter
	lost    []bool // card reported ERROR_GPU_IS_LOST; its XID 79 is sent once
	pending [][]gpu.Event
}

// eccCounter follows a card's volatile uncorrected ECC count, so each
// Sample reports only the errors since the last one.
type eccCounter struct {
	supported bool
	last      uint64
}

var _ gpu.Backend = (*Backend)(nil)

// nvmlError is a failed NVML call.
type nvmlError struct {
	op  string
	ret nvml.Return
}

func (e *nvmlError) Error() string { return e.op + ": " + nvml.ErrorString(e.ret) }

// check turns an NVML return code into an error.
func check(op string, ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return &nvmlError{op: op, ret: ret}
}

// returnOf is the NVML code behind err, or SUCCESS when err is not from
// NVML.
func returnOf(err error) nvml.Return {
	var e *nvmlError
	if errors.As(err, &e) {
		return e.ret
	}
	return nvml.SUCCESS
}

// optional reports whether err from an optional metric means only "this
// card has no such metric", which leaves the metric at zero.
func optional(err error) bool { return returnOf(err) == nvml.ERROR_NOT_SUPPORTED }

// Open starts NVML from the driver's library. When the library is missing,
// the driver is not loaded, or there are no cards, the error wraps
// gpu.ErrUnavailable and says what to install.
func Open(opts Options) (*Backend, error) {
	return New(nvml.New(), opts)
}

// New starts an adapter over lib (the real library or a mock) and reads the
// inventory. On error NVML is shut down again.
func New(lib nvml.Interface, opts Options) (*Backend, error) {
	if opts.Name == "" {
		opts.Name = "nvml"
	}
	if opts.ProcRoot == "" {
		opts.ProcRoot = "/proc"
	}
	if opts.MPSPipeDir == "" {
		opts.MPSPipeDir = os.Getenv("CUDA_MPS_PIPE_DIRECTORY")
		if opts.MPSPipeDir == "" {
			opts.MPSPipeDir = "/tmp/nvidia-mps"
		}
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if err := check("nvmlInit", lib.Init()); err != nil {
		switch returnOf(err) {
		case nvml.ERROR_LIBRARY_NOT_FOUND:
			return nil, fmt.Errorf("start NVML: %s not found; install the NVIDIA driver: %w: %w", LibraryName, gpu.ErrUnavailable, err)
		case nvml.ERROR_DRIVER_NOT_LOADED:
			return nil, fmt.Errorf("start NVML: the NVIDIA kernel driver is not loaded: %w: %w", gpu.ErrUnavailable, err)
		default:
			return nil, fmt.Errorf("start NVML: %w: %w", gpu.ErrUnavailable, err)
		}
	}
	b := &Backend{lib: lib, opts: opts}
	if err := b.start(); err != nil {
		b.shutdown()
		return nil, err
	}
	return b, nil
}

// start reads the inventory and registers for events.
func (b *Backend) start() error {
	n, ret := b.lib.DeviceGetCount()
	if err := check("nvmlDeviceGetCount", ret); err != nil {
		return fmt.Errorf("count GPUs: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("start NVML: the driver sees no GPUs: %w", gpu.ErrUnavailable)
	}
	inv := gpu.Inventory{Backend: b.opts.Name, Devices: make([]gpu.Device, n)}
	var err error
	inv.DriverVersion, ret = b.lib.SystemGetDriverVersion()
	if err := check("nvmlSystemGetDriverVersion", ret); err != nil {
		return fmt.Errorf("read driver version: %w", err)
	}
	if v, ret := b.lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS {
		inv.CUDAVersion = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	} else if err := check("nvmlSystemGetCudaDriverVersion", ret); !optional(err) {
		return fmt.Errorf("read CUDA version: %w", err)
	}

	b.devices = make([]nvml.Device, n)
	for i := range n {
		d, ret := b.lib.DeviceGetHandleByIndex(i)
		if err := check("nvmlDeviceGetHandleByIndex", ret); err != nil {
			return fmt.Errorf("open GPU %d: %w", i, err)
		}
		b.devices[i] = d
		if inv.Devices[i], err = b.device(i, d); err != nil {
			return fmt.Errorf("read GPU %d: %w", i, err)
		}
	}
	if inv.Topology, err = b.topology(); err != nil {
		return fmt.Errorf("read topology: %w", err)
	}
	if _, err := os.Stat(filepath.Join(b.opts.MPSPipeDir, "control")); err == nil {
		inv.MPS = true
	}
	b.inv = inv

	b.ecc = make([]eccCounter, n)
	b.lost = make([]bool, n)
	b.pending = make([][]gpu.Event, n)
	for i, d := range b.devices {
		c, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
		b.ecc[i] = eccCounter{supported: ret == nvml.SUCCESS, last: c}
	}
	return b.registerEvents()
}

// device reads one card's static description.
func (b *Backend) device(i int, d nvml.Device) (gpu.Device, error) {
	out := gpu.Device{Index: i}
	var ret nvml.Return
	if out.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
		return out, check("nvmlDeviceGetUUID", ret)
	}
	if out.Model, ret = d.GetName(); ret != nvml.SUCCESS {
		return out, check("nvmlDeviceGetName", ret)
	}
	mem, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return out, check("nvmlDeviceGetMemoryInfo", ret)
	}
	out.MemoryBytes = int64(mem.Total)

	pci, ret := d.GetPciInfo()
	if err := check("nvmlDeviceGetPciInfo", ret); err != nil && !optional(err) {
		return out, err
	}
	out.PCIBusID = cString(pci.BusId[:])

	mig, _, ret := d.GetMigMode()
	if err := check("nvmlDeviceGetMigMode", ret); err != nil && !optional(err) {
		return out, err
	}
	out.MIG = ret == nvml.SUCCESS && mig == nvml.DEVICE_MIG_ENABLE

	// Links past the card's last one answer INVALID_ARGUMENT or
	// NOT_SUPPORTED; only enabled links count.
	for l := range nvml.NVLINK_MAX_LINKS {
		if st, ret := d.GetNvLinkState(l); ret == nvml.SUCCESS && st == nvml.FEATURE_ENABLED {
			out.NVLinks++
		}
	}
	return out, nil
}

// topology fills the link matrix. The PCIe level comes from the common
// ancestor of the two cards; a working NVLink P2P path beats any PCIe level,
// as in nvidia-smi topo -m. A pair the driver cannot place is SYS.
func (b *Backend) topology() ([][]gpu.Link, error) {
	n := len(b.devices)
	t := make([][]gpu.Link, n)
	for i := range t {
		t[i] = make([]gpu.Link, n)
	}
	for i := range n {
		for j := i + 1; j < n; j++ {
			l := gpu.LinkSys
			lvl, ret := b.devices[i].GetTopologyCommonAncestor(b.devices[j])
			if err := check("nvmlDeviceGetTopologyCommonAncestor", ret); err == nil {
				l = linkOf(lvl)
			} else if !optional(err) {
				return nil, fmt.Errorf("GPUs %d and %d: %w", i, j, err)
			}
			st, ret := b.devices[i].GetP2PStatus(b.devices[j], nvml.P2P_CAPS_INDEX_NVLINK)
			if err := check("nvmlDeviceGetP2PStatus", ret); err == nil {
				if st == nvml.P2P_STATUS_OK {
					l = gpu.LinkNVLink
				}
			} else if !optional(err) {
				return nil, fmt.Errorf("GPUs %d and %d: %w", i, j, err)
			}
			t[i][j], t[j][i] = l, l
		}
	}
	return t, nil
}

// linkOf maps NVML's topology levels onto nvidia-smi's vocabulary.
// TOPOLOGY_INTERNAL (two GPUs on one board) has no nvidia-smi name; it is
// at least as close as one PCIe switch.
func linkOf(l nvml.GpuTopologyLevel) gpu.Link {
	switch l {
	case nvml.TOPOLOGY_INTERNAL, nvml.TOPOLOGY_SINGLE:
		return gpu.LinkPIX
	case nvml.TOPOLOGY_MULTIPLE:
		return gpu.LinkPXB
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return gpu.LinkPHB
	case nvml.TOPOLOGY_NODE:
		return gpu.LinkNode
	default:
		return gpu.LinkSys
	}
}

// registerEvents asks for XID and uncorrectable-ECC events on every card
// that supports them. A driver without event support leaves events nil:
// ECC counters are still polled.
func (b *Backend) registerEvents() error {
	set, ret := b.lib.EventSetCreate()
	if err := check("nvmlEventSetCreate", ret); err != nil {
		if optional(err) {
			b.opts.Log.Info("NVML offers no event set; XID events will not be reported")
			return nil
		}
		return fmt.Errorf("create event set: %w", err)
	}
	b.events = set
	const want = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError
	for i, d := range b.devices {
		sup, ret := d.GetSupportedEventTypes()
		if err := check("nvmlDeviceGetSupportedEventTypes", ret); err != nil {
			if optional(err) {
				b.opts.Log.Info("GPU reports no events", "gpu", i)
				continue
			}
			return fmt.Errorf("GPU %d: %w", i, err)
		}
		mask := uint64(want) & sup
		if mask == 0 {
			continue
		}
		if err := check("nvmlDeviceRegisterEvents", d.RegisterEvents(mask, set)); err != nil {
			if optional(err) {
				b.opts.Log.Info("GPU cannot deliver events", "gpu", i)
				continue
			}
			return fmt.Errorf("register events on GPU %d: %w", i, err)
		}
	}
	return nil
}

// Inventory describes the cards as read when the backend opened. The
// result is a copy the caller may keep or change.
func (b *Backend) Inventory() (gpu.Inventory, error) {
	inv := b.inv
	inv.Devices = append([]gpu.Device(nil), b.inv.Devices...)
	inv.Topology = make([][]gpu.Link, len(b.inv.Topology))
	for i, row := range b.inv.Topology {
		inv.Topology[i] = append([]gpu.Link(nil), row...)
	}
	return inv, nil
}

// Sample reads every card's telemetry and compute processes, and drains
// the events since the last Sample.
func (b *Backend) Sample() (gpu.Sample, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return gpu.Sample{}, fmt.Errorf("sample NVML: closed: %w", gpu.ErrUnavailable)
	}
	now := b.opts.Now()
	if err := b.drainEvents(now); err != nil {
		return gpu.Sample{}, err
	}
	s := gpu.Sample{At: now, Devices: make([]gpu.DeviceSample, len(b.devices))}
	for i, d := range b.devices {
		ds, err := b.sampleDevice(i, d, now)
		if returnOf(err) == nvml.ERROR_GPU_IS_LOST {
			ds = gpu.DeviceSample{Index: i, UUID: b.inv.Devices[i].UUID}
			if !b.lost[i] {
				b.lost[i] = true
				ds.Events = append(ds.Events, gpu.Event{At: now, Kind: gpu.EventXID, Code: 79,
					Text: "XID 79: GPU has fallen off the bus (NVML: " + err.Error() + ")"})
			}
			err = nil
		}
		if err != nil {
			return gpu.Sample{}, fmt.Errorf("sample GPU %d: %w", i, err)
		}
		ds.Events = append(b.pending[i], ds.Events...)
		b.pending[i] = nil
		s.Devices[i] = ds
	}
	return s, nil
}

// sampleDevice reads one card. Memory and processes are required; the rest
// may be unsupported.
func (b *Backend) sampleDevice(i int, d nvml.Device, now time.Time) (gpu.DeviceSample, error) {
	ds := gpu.DeviceSample{Index: i, UUID: b.inv.Devices[i].UUID}
	mem, ret := d.GetMemoryInfo()
	if err := check("nvmlDeviceGetMemoryInfo", ret); err != nil {
		return ds, err
	}
	ds.MemoryUsedBytes = int64(mem.Used)

	u, ret := d.GetUtilizationRates()
	if err := check("nvmlDeviceGetUtilizationRates", ret); err != nil && !optional(err) {
		return ds, err
	}
	ds.SMUtil = int(min(u.Gpu, 100))

	mw, ret := d.GetPowerUsage()
	if err := check("nvmlDeviceGetPowerUsage", ret); err != nil && !optional(err) {
		return ds, err
	}
	ds.PowerWatts = float64(mw) / 1000

	c, ret := d.GetTemperature(nvml.TEMPERATURE_GPU)
	if err := check("nvmlDeviceGetTemperature", ret); err != nil && !optional(err) {
		return ds, err
	}
	ds.TemperatureC = int(c)

	procs, ret := d.GetComputeRunningProcesses()
	if err := check("nvmlDeviceGetComputeRunningProcesses", ret); err != nil && !optional(err) {
		return ds, err
	}
	for _, p := range procs {
		used := int64(p.UsedGpuMemory)
		if p.UsedGpuMemory == notAvailable {
			used = 0
		}
		ds.Processes = append(ds.Processes, gpu.Process{PID: int(p.Pid), UsedMemoryBytes: used, Name: b.processName(int(p.Pid))})
	}

	if b.ecc[i].supported {
		n, ret := d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
		if err := check("nvmlDeviceGetTotalEccErrors", ret); err != nil && !optional(err) {
			return ds, err
		}
		if ret == nvml.SUCCESS && n > b.ecc[i].last {
			ds.Events = append(ds.Events, gpu.Event{At: now, Kind: gpu.EventECCDBE, Code: n - b.ecc[i].last,
				Text: fmt.Sprintf("%d new uncorrectable ECC errors (volatile count %d)", n-b.ecc[i].last, n)})
		}
		if ret == nvml.SUCCESS {
			b.ecc[i].last = n
		}
	}
	return ds, nil
}

// drainEvents reads what the event set holds without waiting, and queues
// each event on its card for this Sample.
func (b *Backend) drainEvents(now time.Time) error {
	if b.events == nil {
		return nil
	}
	for range maxEventsPerSample {
		ed, ret := b.events.Wait(0)
		if ret == nvml.ERROR_TIMEOUT {
			return nil
		}
		if err := check("nvmlEventSetWait", ret); err != nil {
			return fmt.Errorf("read GPU events: %w", err)
		}
		i := b.indexOf(ed.Device)
		if i < 0 {
			b.opts.Log.Warn("GPU event from an unknown device", "type", ed.EventType, "data", ed.EventData)
			continue
		}
		switch ed.EventType {
		case nvml.EventTypeXidCriticalError:
			b.pending[i] = append(b.pending[i], gpu.Event{At: now, Kind: gpu.EventXID, Code: ed.EventData, Text: gpu.XIDText(ed.EventData)})
		case nvml.EventTypeDoubleBitEccError:
			// With a readable counter, the counter's delta reports the
			// errors (once); without one, the event is all there is.
			if !b.ecc[i].supported {
				b.pending[i] = append(b.pending[i], gpu.Event{At: now, Kind: gpu.EventECCDBE, Code: 1, Text: "uncorrectable ECC error"})
			}
		}
	}
	return nil
}

// indexOf finds the card an event came from: by handle, else by UUID.
func (b *Backend) indexOf(d nvml.Device) int {
	if d == nil {
		return -1
	}
	// Handles are compared only when their type allows it: == on an
	// interface holding an incomparable value would panic.
	if reflect.TypeOf(d).Comparable() {
		for i, h := range b.devices {
			if reflect.TypeOf(h) == reflect.TypeOf(d) && h == d {
				return i
			}
		}
	}
	if u, ret := d.GetUUID(); ret == nvml.SUCCESS {
		for i, dev := range b.inv.Devices {
			if dev.UUID == u {
				return i
			}
		}
	}
	return -1
}

// processName reads /proc/PID/comm; empty when the process is gone or in
// another PID namespace.
func (b *Backend) processName(pid int) string {
	comm, err := os.ReadFile(filepath.Join(b.opts.ProcRoot, strconv.Itoa(pid), "comm"))
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(comm))
}

// Close frees the event set and shuts NVML down. Closing twice is a no-op.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	return b.shutdown()
}

func (b *Backend) shutdown() error {
	var errs []error
	if b.events != nil {
		if err := check("nvmlEventSetFree", b.events.Free()); err != nil {
			errs = append(errs, err)
		}
		b.events = nil
	}
	if err := check("nvmlShutdown", b.lib.Shutdown()); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close NVML: %w", err)
	}
	return nil
}

// cString reads a NUL-terminated C char array.
func cString(a []int8) string {
	b := make([]byte, 0, len(a))
	for _, c := range a {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}
