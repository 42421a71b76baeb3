// Package sim is a simulated GPU node for development and tests: cards
// described by a spec string such as "8xH100-80GB", with UUIDs derived from
// the node name, a plausible topology, and telemetry driven by the real
// processes on the machine.
//
// A live process is a compute process on a simulated card when its
// environment (/proc/PID/environ) has CUDA_VISIBLE_DEVICES naming that
// card's UUID. The agent starts jobs that way, so their children and any
// grandchild that escaped the job's process group show as holding the card,
// exactly as NVML would show them; leak cleanup is exercised for real.
// SIM_GPU_MEMORY (a size like "20Gi"; default 1Gi) in the same environment
// is the memory the process holds on each of its cards, and SIM_GPU_UTIL
// (0-100; default 60) the compute it drives. A card's figures are the sums
// over its processes, capped at the card's size and at 100%.
//
// Tests steer the cards through hooks: InjectXID and InjectEvent queue an
// event for the next Sample, SetStuckMemory holds memory no process owns (a
// card that cannot be cleaned). Processes in other languages use the same
// hooks through files in Options.ControlDir; see ControlDir's comment.
package sim

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spillway-dev/spillway/onprem/gpu"
)

// Versions a simulated node reports. Every simulated node reports the same,
// so multi-node placement treats them as one pool.
const (
	DriverVersion = "sim"
	CUDAVersion   = "sim"
)

// Environment variables a process sets to drive the simulated cards.
const (
	EnvVisibleDevices = "CUDA_VISIBLE_DEVICES"
	EnvMemory         = "SIM_GPU_MEMORY"
	EnvUtil           = "SIM_GPU_UTIL"
)

// Defaults for a process on a simulated card that does not say otherwise.
const (
	DefaultProcessMemory int64 = 1 << 30
	DefaultProcessUtil         = 60
)

// Options tune a simulated backend. The zero value is ready to use.
type Options struct {
	// ControlDir, when set, is read at every Sample for trigger files, so
	// that tests driving a separate agent process can steer the cards:
	//
	//	xid-<index>    holds one or more XID numbers; the next Sample
	//	               reports them on card <index> once and removes the file
	//	stuck-<index>  holds a size like "4Gi"; card <index> shows that much
	//	               memory used by no process for as long as the file exists
	//	driver         holds a driver version that Inventory reports from
	//	               then on (a driver upgraded under a running agent)
	//
	// Write the files atomically (write elsewhere, then rename). The
	// directory is created when missing.
	ControlDir string
	// ProcRoot is where processes are listed; "/proc" when empty.
	ProcRoot string
	// Now is the clock for sample and event times; time.Now when nil.
	Now func() time.Time
	// Log receives warnings about malformed control files and process
	// environments; slog.Default() when nil.
	Log *slog.Logger
}

// Backend is a simulated node's cards. It implements gpu.Backend and is
// safe for concurrent use.
type Backend struct {
	spec   Spec
	inv    gpu.Inventory
	byUUID map[string]int
	family family
	opts   Options

	mu      sync.Mutex
	closed  bool
	pending [][]gpu.Event // per card, reported and cleared by the next Sample
	stuck   []int64       // per card, set through SetStuckMemory
	scanner procScanner
}

var _ gpu.Backend = (*Backend)(nil)

// New builds a simulated node from a spec like "8xH100-80GB". The node name
// seeds the UUIDs: the same name gives the same UUIDs, different names never
// share one.
func New(spec, node string, opts Options) (*Backend, error) {
	s, err := ParseSpec(spec)
	if err != nil {
		return nil, err
	}
	if node == "" {
		return nil, errors.New("sim backend: node name is empty")
	}
	if opts.ProcRoot == "" {
		opts.ProcRoot = "/proc"
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.ControlDir != "" {
		if err := os.MkdirAll(opts.ControlDir, 0o755); err != nil {
			return nil, fmt.Errorf("create sim control dir: %w", err)
		}
	}
	b := &Backend{
		spec:    s,
		inv:     s.inventory(node),
		byUUID:  make(map[string]int, s.Count),
		family:  s.family(),
		opts:    opts,
		pending: make([][]gpu.Event, s.Count),
		stuck:   make([]int64, s.Count),
	}
	for _, d := range b.inv.Devices {
		b.byUUID[d.UUID] = d.Index
	}
	b.scanner = procScanner{root: opts.ProcRoot, byUUID: b.byUUID, log: opts.Log}
	return b, nil
}

// Spec returns the parsed spec the backend was built from.
func (b *Backend) Spec() Spec { return b.spec }

// UUIDs returns the cards' UUIDs in index order.
func (b *Backend) UUIDs() []string {
	out := make([]string, len(b.inv.Devices))
	for i, d := range b.inv.Devices {
		out[i] = d.UUID
	}
	return out
}

// Inventory describes the simulated cards. The result is a copy the caller
// may keep or change.
func (b *Backend) Inventory() (gpu.Inventory, error) {
	inv := b.inv
	inv.Devices = slices.Clone(b.inv.Devices)
	inv.Topology = make([][]gpu.Link, len(b.inv.Topology))
	for i, row := range b.inv.Topology {
		inv.Topology[i] = slices.Clone(row)
	}
	if b.opts.ControlDir != "" {
		if raw, err := os.ReadFile(filepath.Join(b.opts.ControlDir, "driver")); err == nil && len(bytes.TrimSpace(raw)) > 0 {
			inv.DriverVersion = string(bytes.TrimSpace(raw))
		}
	}
	return inv, nil
}

// InjectXID makes the next Sample report an XID event on card index.
func (b *Backend) InjectXID(index int, code uint64) error {
	return b.InjectEvent(index, gpu.Event{Kind: gpu.EventXID, Code: code, Text: gpu.XIDText(code)})
}

// InjectEvent makes the next Sample report e on card index. A zero e.At is
// set to the sample's time.
func (b *Backend) InjectEvent(index int, e gpu.Event) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if index < 0 || index >= b.spec.Count {
		return fmt.Errorf("inject event: card %d out of range 0..%d", index, b.spec.Count-1)
	}
	b.pending[index] = append(b.pending[index], e)
	return nil
}

// SetStuckMemory makes card index show bytes of memory used by no process,
// as a card does after a driver-level leak; 0 clears it. Such a card cannot
// be cleaned by killing processes.
func (b *Backend) SetStuckMemory(index int, bytes int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if index < 0 || index >= b.spec.Count {
		return fmt.Errorf("set stuck memory: card %d out of range 0..%d", index, b.spec.Count-1)
	}
	if bytes < 0 {
		return fmt.Errorf("set stuck memory: %d bytes is negative", bytes)
	}
	b.stuck[index] = bytes
	return nil
}

// Sample reads the cards: the processes holding them now, the utilisation
// those processes declare, and the events queued since the last Sample.
func (b *Backend) Sample() (gpu.Sample, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return gpu.Sample{}, fmt.Errorf("sample sim backend: closed: %w", gpu.ErrUnavailable)
	}
	now := b.opts.Now()
	stuck := slices.Clone(b.stuck)
	b.readControlDir(now, stuck)
	procs, err := b.scanner.scan(now)
	if err != nil {
		return gpu.Sample{}, fmt.Errorf("sample sim backend: %w", err)
	}

	s := gpu.Sample{At: now, Devices: make([]gpu.DeviceSample, b.spec.Count)}
	util := make([]int, b.spec.Count)
	for i, d := range b.inv.Devices {
		s.Devices[i] = gpu.DeviceSample{Index: i, UUID: d.UUID, MemoryUsedBytes: stuck[i]}
	}
	for _, p := range procs {
		for _, i := range p.cards {
			ds := &s.Devices[i]
			ds.Processes = append(ds.Processes, gpu.Process{PID: p.pid, UsedMemoryBytes: p.memory, Name: p.name})
			ds.MemoryUsedBytes += p.memory
			util[i] += p.util
		}
	}
	for i := range s.Devices {
		ds := &s.Devices[i]
		ds.MemoryUsedBytes = min(ds.MemoryUsedBytes, b.inv.Devices[i].MemoryBytes)
		ds.SMUtil = min(util[i], 100)
		ds.PowerWatts = b.power(ds.SMUtil)
		ds.TemperatureC = temperature(ds.SMUtil)
		for _, e := range b.pending[i] {
			if e.At.IsZero() {
				e.At = now
			}
			ds.Events = append(ds.Events, e)
		}
		b.pending[i] = nil
	}
	return s, nil
}

// Close ends the backend; later Samples fail with gpu.ErrUnavailable.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	return nil
}

// power interpolates linearly between the card's idle draw and its board
// power limit, to a tenth of a watt.
func (b *Backend) power(util int) float64 {
	w := b.family.idleW + (b.family.maxW-b.family.idleW)*float64(util)/100
	return math.Round(w*10) / 10
}

// temperature runs from 32°C idle to 77°C at full load.
func temperature(util int) int { return 32 + util*45/100 }

// readControlDir applies trigger files: xid-N files queue events and are
// removed, stuck-N files add to stuck. A missing directory is no trigger.
func (b *Backend) readControlDir(now time.Time, stuck []int64) {
	dir := b.opts.ControlDir
	if dir == "" {
		return
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			b.opts.Log.Warn("read sim control dir", "dir", dir, "err", err)
		}
		return
	}
	for _, e := range entries {
		kind, idx, ok := strings.Cut(e.Name(), "-")
		if !ok || (kind != "xid" && kind != "stuck") || e.IsDir() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		index, err := strconv.Atoi(idx)
		if err != nil || index < 0 || index >= b.spec.Count {
			b.opts.Log.Warn("ignore sim control file: no such card", "file", path, "cards", b.spec.Count)
			continue
		}
		data, err := os.ReadFile(path)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				b.opts.Log.Warn("read sim control file", "file", path, "err", err)
			}
			continue
		}
		switch kind {
		case "xid":
			// The file is consumed whatever it holds, so a bad one does not
			// warn at every sample.
			if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				b.opts.Log.Warn("remove sim control file", "file", path, "err", err)
			}
			for _, f := range strings.Fields(string(data)) {
				code, err := strconv.ParseUint(f, 10, 32)
				if err != nil {
					b.opts.Log.Warn("ignore sim control file: not an XID number", "file", path, "value", f)
					continue
				}
				b.pending[index] = append(b.pending[index], gpu.Event{At: now, Kind: gpu.EventXID, Code: code, Text: gpu.XIDText(code)})
			}
		case "stuck":
			n, err := parseBytes(strings.TrimSpace(string(data)))
			if err != nil {
				b.opts.Log.Warn("ignore sim control file", "file", path, "err", err)
				continue
			}
			stuck[index] += n
		}
	}
}

// procScanner lists the processes that hold simulated cards.
type procScanner struct {
	root   string
	byUUID map[string]int
	log    *slog.Logger
	buf    []byte // reused between reads; guarded by Backend.mu
	// without[pid] is when the process was last found without
	// CUDA_VISIBLE_DEVICES (or unreadable). Such a process is not read again
	// for withoutTTL, unless it leaves the process table meanwhile: a scan
	// during a burst of short jobs reads only the new processes. A process
	// that execs into a GPU program under the same pid shows up at most
	// withoutTTL late; a recycled pid needs the whole pid space to wrap
	// within withoutTTL. Guarded by Backend.mu.
	without map[int]time.Time
	seen    map[int]bool // scratch: the pids of the current listing
}

// withoutTTL is how long a process found without the simulation's variable
// is trusted to stay that way.
const withoutTTL = time.Second

// simProc is one process on one or more simulated cards.
type simProc struct {
	pid    int
	name   string
	cards  []int
	memory int64
	util   int
}

var cudaKey = []byte(EnvVisibleDevices + "=")

// scan walks the process table once. Only numeric entries are processes;
// one that exits or whose environment this user may not read is skipped,
// as NVML skips processes outside its view. Most processes are rejected by
// one substring search of their environment, so a sample costs one small
// read per process.
func (s *procScanner) scan(now time.Time) ([]simProc, error) {
	d, err := os.Open(s.root)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var out []simProc
	if s.without == nil {
		s.without, s.seen = map[int]time.Time{}, map[int]bool{}
	}
	clear(s.seen)
	for _, n := range names {
		pid, ok := parsePID(n)
		if !ok {
			continue
		}
		s.seen[pid] = true
		if at, ok := s.without[pid]; ok && now.Sub(at) < withoutTTL {
			continue
		}
		env, err := s.read(filepath.Join(s.root, n, "environ"))
		if err != nil || !bytes.Contains(env, cudaKey) {
			// Unreadable counts as without: a kernel thread's environ
			// fails to open (ESRCH), and there are dozens of them; a
			// process that is gone leaves the table before the next
			// listing.
			s.without[pid] = now
			continue
		}
		delete(s.without, pid)
		p, ok := s.parse(pid, env)
		if !ok {
			continue
		}
		if comm, err := s.read(filepath.Join(s.root, n, "comm")); err == nil {
			p.name = string(bytes.TrimSpace(comm))
		}
		out = append(out, p)
	}
	for pid := range s.without {
		if !s.seen[pid] {
			delete(s.without, pid) // gone: a process with this pid later is new
		}
	}
	slices.SortFunc(out, func(a, b simProc) int { return a.pid - b.pid })
	return out, nil
}

// parse reads the simulation variables from a NUL-separated environment.
func (s *procScanner) parse(pid int, env []byte) (simProc, bool) {
	p := simProc{pid: pid, memory: DefaultProcessMemory, util: DefaultProcessUtil}
	for kv := range bytes.SplitSeq(env, []byte{0}) {
		k, v, ok := bytes.Cut(kv, []byte("="))
		if !ok {
			continue
		}
		switch string(k) {
		case EnvVisibleDevices:
			for u := range strings.SplitSeq(string(v), ",") {
				if i, ok := s.byUUID[strings.TrimSpace(u)]; ok && !slices.Contains(p.cards, i) {
					p.cards = append(p.cards, i)
				}
			}
		case EnvMemory:
			n, err := parseBytes(string(v))
			if err != nil {
				s.log.Debug("sim: bad "+EnvMemory+", using the default", "pid", pid, "err", err)
				continue
			}
			p.memory = n
		case EnvUtil:
			n, err := strconv.Atoi(string(v))
			if err != nil || n < 0 || n > 100 {
				s.log.Debug("sim: bad "+EnvUtil+", using the default", "pid", pid, "value", string(v))
				continue
			}
			p.util = n
		}
	}
	slices.Sort(p.cards)
	return p, len(p.cards) > 0
}

// read reads a small /proc file into the reused buffer. The result is valid
// until the next read.
func (s *procScanner) read(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if s.buf == nil {
		s.buf = make([]byte, 0, 16<<10)
	}
	s.buf = s.buf[:0]
	for {
		if len(s.buf) == cap(s.buf) {
			s.buf = slices.Grow(s.buf, cap(s.buf))
		}
		n, err := f.Read(s.buf[len(s.buf):cap(s.buf)])
		s.buf = s.buf[:len(s.buf)+n]
		if err == io.EOF {
			return s.buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// parsePID accepts only a decimal process id, as /proc names them.
func parsePID(s string) (int, bool) {
	if s == "" || len(s) > 10 {
		return 0, false
	}
	n := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, n > 0
}

// byteUnits are the suffixes parseBytes accepts, binary first.
var byteUnits = []struct {
	s string
	m float64
}{
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
}

// parseBytes reads a size like "20Gi", "512Mi", "1.5G" or "1024".
func parseBytes(s string) (int64, error) {
	num, mult := s, 1.0
	for _, u := range byteUnits {
		if strings.HasSuffix(s, u.s) {
			num, mult = strings.TrimSuffix(s, u.s), u.m
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) || f < 0 || f*mult > 1<<50 {
		return 0, fmt.Errorf("%q is not a size like 20Gi or 512Mi", s)
	}
	return int64(f * mult), nil
}
