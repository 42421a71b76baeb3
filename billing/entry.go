package billing

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Kind says what a ledger entry charges for.
type Kind string

// Entry kinds.
const (
	// KindUsage is GPU-time held by a job.
	KindUsage Kind = "usage"
	// KindOverhead is GPU-time of a burst machine that no job held: boot,
	// bootstrap, idle and drain. It is charged to the overhead account or
	// to the team whose demand started the machine (OverheadPolicy).
	KindOverhead Kind = "overhead"
	// KindStaging is GPU-time a job held while its agent staged data
	// (fetching inputs, restoring or uploading a checkpoint, uploading
	// outputs) rather than computed. Like usage it is charged to the job's
	// team, but finance sees it apart from compute.
	KindStaging Kind = "staging"
)

// PoolKind says who owns the GPUs an entry charges for.
type PoolKind string

// Pool kinds.
const (
	// PoolOnPrem: owned GPUs, charged at the operators' amortised rate per
	// GPU model.
	PoolOnPrem PoolKind = "onprem"
	// PoolCloud: a cloud instance (AWS EC2, GCP Compute), charged at the
	// offer's instance price divided over the instance's GPUs.
	PoolCloud PoolKind = "cloud"
	// PoolLease: a leased machine, charged at the lease price divided over
	// its GPUs.
	PoolLease PoolKind = "lease"
)

// Burst reports whether GPUs of this kind are rented (cloud or lease): the
// kinds burst budgets count.
func (k PoolKind) Burst() bool { return k == PoolCloud || k == PoolLease }

func (k PoolKind) valid() bool { return k == PoolOnPrem || k.Burst() }

// Pool is where the GPUs of an entry are: an on-prem node, or a cloud or
// leased machine. Fields that do not apply to the kind are empty.
type Pool struct {
	Kind PoolKind `json:"kind"`
	// Name is the operator's name for the pool the node or machine belongs
	// to (optional).
	Name string `json:"name,omitempty"`
	// Node is the agent's node name: the on-prem host, or the name a burst
	// machine's agent registered under.
	Node string `json:"node,omitempty"`
	// Provider is the cloud ("aws", "gcp") or the lessor; empty on-prem.
	Provider string `json:"provider,omitempty"`
	// Region is the provider's region ("us-east-1"); empty on-prem.
	Region string `json:"region,omitempty"`
	// InstanceType is the provider's machine type ("p5.48xlarge").
	InstanceType string `json:"instanceType,omitempty"`
	// InstanceID is the provider's id of the machine ("i-0abc…"); burst
	// overhead entries are keyed on it.
	InstanceID string `json:"instanceId,omitempty"`
}

// Label is the pool as reports group it: "onprem", "onprem/<name>",
// "cloud/aws/us-east-1/p5.48xlarge", "lease/<lessor>/<type>".
func (p Pool) Label() string {
	parts := []string{string(p.Kind)}
	if p.Kind == PoolOnPrem {
		// A node pool named like its kind (pool: onprem, the dev default)
		// reads "onprem", not "onprem/onprem".
		if p.Name != "" && p.Name != string(p.Kind) {
			parts = append(parts, p.Name)
		}
		return strings.Join(parts, "/")
	}
	for _, s := range []string{p.Provider, p.Region, p.InstanceType} {
		if s != "" {
			parts = append(parts, s)
		}
	}
	return strings.Join(parts, "/")
}

// ResourceID is the one machine the GPUs sit in: the instance id for burst
// machines (the node name when it is unknown), the node name on-prem.
func (p Pool) ResourceID() string {
	if p.Kind != PoolOnPrem && p.InstanceID != "" {
		return p.InstanceID
	}
	return p.Node
}

// UtilUnknown is Entry.UtilPermille when no telemetry covered the slice.
const UtilUnknown int32 = -1

// MillisPerHour converts GPU-milliseconds to GPU-hours.
const MillisPerHour = 3_600_000

// Entry is one line of the GPU-time ledger: some GPU-time of one job (or
// of one burst machine's unallocated GPUs) in one time slice, at one rate.
// Entries are append-only; the ledger is never rewritten. Every field is
// documented in docs/billing.md.
//
// Invariants (Validate checks them; stores refuse entries that break them):
//   - ID is DeriveID over (Kind, Job, Attempt, Pool.ResourceID(), Start) for
//     usage, over (Kind, Pool.InstanceID, Start) for overhead, so writing the
//     same slice twice is a no-op.
//   - Start < End, both UTC and whole milliseconds; End-Start is at most one
//     metering slice and never crosses a grid boundary or a rate change.
//   - Cost is kept equal to Rate.MulDiv(GPUMillis, MillisPerHour).
//   - UtilPermille is in [0, 1000] or UtilUnknown.
type Entry struct {
	// ID identifies the slice; see DeriveID.
	ID string `json:"id"`
	// Start is the inclusive start of the time slice.
	Start time.Time `json:"start"`
	// End is the exclusive end of the time slice.
	End time.Time `json:"end"`
	// Kind is usage (a job held the GPUs) or overhead (nobody did).
	Kind Kind `json:"kind"`

	// Team is who pays: the job's team, or for overhead the overhead
	// account or the team whose demand started the machine.
	Team string `json:"team"`
	// Project is the job's project (optional).
	Project string `json:"project,omitempty"`
	// User is who submitted the job; empty for overhead.
	User string `json:"user,omitempty"`
	// Job is the broker's job id; empty for overhead.
	Job string `json:"job,omitempty"`
	// Attempt is the job's run number (1 for the first run, +1 after each
	// preemption, loss or retry); 0 for overhead.
	Attempt int `json:"attempt,omitempty"`
	// Queue is the job's queue; for overhead, the queue of the demand that
	// started the machine when known.
	Queue string `json:"queue,omitempty"`

	// Pool is where the GPUs are.
	Pool Pool `json:"pool"`
	// GPUModel is the GPU product name as the agent reports it ("H100").
	GPUModel string `json:"gpuModel"`
	// Spot is true for spot / preemptible cloud capacity.
	Spot bool `json:"spot,omitempty"`

	// GPUMillis is the GPU-time in GPU-milliseconds: slice milliseconds ×
	// GPUs held, with a shared card counted by its memory share, rounded
	// half up to a whole GPU-millisecond.
	GPUMillis int64 `json:"gpuMillis"`
	// Rate is the price of one GPU-hour in force at Start.
	Rate Amount `json:"rate"`
	// Cost is what the slice costs; kept equal to
	// Rate.MulDiv(GPUMillis, MillisPerHour).
	Cost Amount `json:"cost"`
	// Currency is the ISO 4217 code of Rate and Cost ("USD").
	Currency string `json:"currency"`
	// UtilPermille is the time-weighted mean compute utilisation of the
	// GPUs over the slice, in thousandths (873 = 87.3%), from the agent's
	// telemetry; UtilUnknown when no sample covered the slice.
	UtilPermille int32 `json:"utilPermille"`
}

// EffectiveGPUMillis is the GPU-time that was computing: GPUMillis scaled
// by UtilPermille, rounded half up; 0 when the utilisation is unknown.
func (e Entry) EffectiveGPUMillis() int64 {
	if e.UtilPermille < 0 {
		return 0
	}
	return divRound(e.GPUMillis*int64(e.UtilPermille), 1000)
}

// MeasuredGPUMillis is GPUMillis when telemetry covered the entry, else 0.
func (e Entry) MeasuredGPUMillis() int64 {
	if e.UtilPermille < 0 {
		return 0
	}
	return e.GPUMillis
}

// CostOf is the cost of gpuMillis GPU-milliseconds at rate per GPU-hour, the
// one formula every entry's Cost obeys.
func CostOf(rate Amount, gpuMillis int64) Amount { return rate.MulDiv(gpuMillis, MillisPerHour) }

// DeriveID returns the entry id for a slice: the first 128 bits of a
// SHA-256 over the kind, the job, the attempt, the resource (node or
// instance id) and the slice start in Unix milliseconds, in hex. Anything
// that meters the same slice again derives the same id.
func DeriveID(kind Kind, job string, attempt int, resource string, start time.Time) string {
	h := sha256.New()
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(start.UnixMilli()))
	for _, s := range []string{"v1", string(kind), job, strconv.Itoa(attempt), resource} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	h.Write(ms[:])
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// SortKey is the key stores order entries by: the start in Unix
// milliseconds (8 bytes, big-endian, offset so that byte order is numeric
// order) followed by the id. Scan returns entries in this order.
func (e Entry) SortKey() []byte {
	k := make([]byte, 8, 8+len(e.ID))
	binary.BigEndian.PutUint64(k, uint64(e.Start.UnixMilli())^(1<<63))
	return append(k, e.ID...)
}

// Less orders entries by (Start, ID), the order of Scan and of exports.
func (e Entry) Less(o Entry) bool {
	if !e.Start.Equal(o.Start) {
		return e.Start.Before(o.Start)
	}
	return e.ID < o.ID
}

// Validate checks the entry's invariants; the error wraps ErrInvalidEntry
// and names the field.
func (e Entry) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w %s: %s: %s", ErrInvalidEntry, e.ID, field, fmt.Sprintf(format, args...))
	}
	switch {
	case e.ID == "":
		return bad("id", "empty")
	case e.Start.IsZero() || e.End.IsZero():
		return bad("start", "start and end are required")
	case !e.Start.Before(e.End):
		return bad("end", "end %s is not after start %s", e.End, e.Start)
	case e.Start.Location() != time.UTC || e.End.Location() != time.UTC:
		return bad("start", "times must be UTC")
	case !e.Start.Equal(e.Start.Truncate(time.Millisecond)) || !e.End.Equal(e.End.Truncate(time.Millisecond)):
		return bad("start", "times must be whole milliseconds")
	case e.Kind != KindUsage && e.Kind != KindOverhead && e.Kind != KindStaging:
		return bad("kind", "%q is not usage, staging or overhead", e.Kind)
	case !e.Pool.Kind.valid():
		return bad("pool.kind", "%q is not onprem, cloud or lease", e.Pool.Kind)
	case e.Pool.ResourceID() == "":
		return bad("pool", "neither node nor instance id is set")
	case e.Kind == KindOverhead && (e.Pool.Kind == PoolOnPrem || e.Pool.InstanceID == ""):
		return bad("pool", "overhead is charged for burst machines only, by instance id")
	case e.Team == "":
		return bad("team", "empty")
	case (e.Kind == KindUsage || e.Kind == KindStaging) && e.Job == "":
		return bad("job", "%s needs a job", e.Kind)
	case e.GPUModel == "":
		return bad("gpuModel", "empty")
	case e.GPUMillis < 0:
		return bad("gpuMillis", "negative")
	case e.Rate < 0:
		return bad("rate", "negative")
	case e.Cost != CostOf(e.Rate, e.GPUMillis):
		return bad("cost", "%s is not rate %s × %d GPU-ms (%s)", e.Cost, e.Rate, e.GPUMillis, CostOf(e.Rate, e.GPUMillis))
	case len(e.Currency) != 3 || strings.ToUpper(e.Currency) != e.Currency:
		return bad("currency", "%q is not an ISO 4217 code", e.Currency)
	case e.UtilPermille < UtilUnknown || e.UtilPermille > 1000:
		return bad("utilPermille", "%d is outside 0..1000 (or -1 for unknown)", e.UtilPermille)
	}
	return nil
}

// ValidateEntries validates every entry; stores call it before writing.
func ValidateEntries(entries []Entry) error {
	for _, e := range entries {
		if err := e.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// divRound is n/d rounded half up, for n >= 0 and d > 0.
func divRound(n, d int64) int64 { return (n + d/2) / d }
