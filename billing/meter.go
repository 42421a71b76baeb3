package billing

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// DefaultSlice is the metering grid when the config sets none.
const DefaultSlice = 60 * time.Second

// DefaultOverheadAccount is the team name burst overhead is charged to when
// it goes to an account rather than to the demanding team.
const DefaultOverheadAccount = "burst-overhead"

// OverheadCharge says who pays for the unallocated GPU-time of burst
// machines.
type OverheadCharge string

// Overhead attribution modes.
const (
	// ChargeAccount charges overhead to OverheadPolicy.Account.
	ChargeAccount OverheadCharge = "account"
	// ChargeDemandTeam charges overhead to the team whose demand started
	// the machine (Machine.DemandTeam), falling back to the account when
	// the machine has none.
	ChargeDemandTeam OverheadCharge = "demand-team"
)

// OverheadPolicy is how burst overhead is attributed.
type OverheadPolicy struct {
	// ChargeTo picks the payer; ChargeAccount when empty.
	ChargeTo OverheadCharge
	// Account is the team name overhead is charged to; DefaultOverheadAccount
	// when empty.
	Account string
}

// MeterConfig is what the meter needs besides the allocations.
type MeterConfig struct {
	// Slice is the grid (DefaultSlice when zero). It must divide one hour,
	// so that slices never cross an hour, day or month boundary in UTC.
	// Change it only while the broker is stopped after a clean shutdown:
	// slice ids are keyed on slice starts.
	Slice time.Duration
	// Currency of every price ("USD").
	Currency string
	// OnPrem prices on-prem GPUs by model.
	OnPrem RateTable
	// Overhead attributes burst overhead.
	Overhead OverheadPolicy
}

func (c MeterConfig) slice() time.Duration {
	if c.Slice == 0 {
		return DefaultSlice
	}
	return c.Slice
}

// Validate checks the grid, the currency and the rates.
func (c MeterConfig) Validate() error {
	s := c.slice()
	if s < time.Second || s > time.Hour || time.Hour%s != 0 || s%time.Millisecond != 0 {
		return fmt.Errorf("%w: slice %s must be between 1s and 1h and divide one hour", ErrInvalidConfig, s)
	}
	if len(c.Currency) != 3 {
		return fmt.Errorf("%w: currency %q is not an ISO 4217 code", ErrInvalidConfig, c.Currency)
	}
	switch c.Overhead.ChargeTo {
	case ChargeAccount, ChargeDemandTeam, "":
	default:
		return fmt.Errorf("%w: overhead chargeTo %q is not account or demand-team", ErrInvalidConfig, c.Overhead.ChargeTo)
	}
	if err := c.OnPrem.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// UtilSample is one telemetry reading: the mean compute utilisation of an
// allocation's GPUs at an instant, in thousandths. It holds until the next
// sample.
type UtilSample struct {
	// At is when the reading was taken.
	At time.Time
	// Permille is the utilisation in thousandths (0..1000).
	Permille int32
}

// Allocation is GPUs a job attempt holds (or held) on one node or machine:
// what the broker knows about a running or recently ended job, per node.
// A gang job on four nodes is four allocations.
type Allocation struct {
	// Job, Attempt, Team, Project, User and Queue are copied onto every
	// entry (see Entry).
	Job     string
	Attempt int
	Team    string
	Project string
	User    string
	Queue   string
	// Pool is the node or machine; for burst machines Pool.InstanceID links
	// the allocation to its Machine.
	Pool Pool
	// GPUModel and Spot are copied onto every entry.
	GPUModel string
	Spot     bool
	// GPUMilli is the GPUs held in thousandths: 1000 per whole card; a job
	// sharing a card holds its memory share (see ShareMilli).
	GPUMilli int64
	// Start is when the GPUs were given to the job.
	Start time.Time
	// End is when the broker took them back; zero while the job runs. It is
	// never earlier than a `now` at which the meter saw the job running.
	End time.Time
	// Prices is the per-GPU-hour price of a cloud or leased machine, used
	// when no Machine with the same instance id is passed to the meter
	// (when one is, the machine's prices win so usage and overhead split
	// alike). Ignored on-prem, where MeterConfig.OnPrem prices by model.
	Prices PriceSchedule
	// Util is the allocation's telemetry, ordered by At. Samples before the
	// metered window are only needed for the one in force at its start.
	Util []UtilSample
	// Staging are the stretches in which the job's agent staged data
	// instead of running the job; their GPU-time is metered as
	// KindStaging. An open span (zero End) lasts until the allocation's
	// end.
	Staging []Span
}

// Span is a stretch of time [Start, End); a zero End is open.
type Span struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end,omitempty"`
}

// splitStaging cuts [s, e) into the parts inside and outside the staging
// spans, in order.
func splitStaging(s, e time.Time, spans []Span, fn func(s, e time.Time, staging bool)) {
	for t := s; t.Before(e); {
		inside, coverEnd, nextStart := false, t, e
		for _, sp := range spans {
			ss, se := utcMilli(sp.Start), e
			if !sp.End.IsZero() {
				se = utcMilli(sp.End)
			}
			switch {
			case !se.After(ss):
			case !ss.After(t) && se.After(t):
				inside = true
				coverEnd = maxTime(coverEnd, se)
			case ss.After(t) && ss.Before(nextStart):
				nextStart = ss
			}
		}
		next := nextStart
		if inside {
			next = minTime(coverEnd, e)
		}
		fn(t, next, inside)
		t = next
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// ShareMilli is the thousandths of a card a job holds when it asks for
// memBytes of a card with cardBytes: its memory share, rounded half up,
// at least 1 and at most 1000.
func ShareMilli(memBytes, cardBytes int64) int64 {
	if cardBytes <= 0 || memBytes >= cardBytes {
		return 1000
	}
	if memBytes <= 0 {
		return 1
	}
	// memBytes < cardBytes here, so memBytes*1000 overflows only for cards
	// over 9 PB; split the product to stay exact anyway.
	q := memBytes / cardBytes * 1000
	r := memBytes % cardBytes
	v := q + (r*1000+cardBytes/2)/cardBytes
	return min(max(v, 1), 1000)
}

// Machine is a burst machine (cloud instance or leased machine) for the
// time the provider charges for it: from launch to termination, through
// boot, bootstrap, busy, idle and drain.
type Machine struct {
	// Pool.Kind is cloud or lease; Pool.InstanceID is required.
	Pool Pool
	// GPUModel and Spot are copied onto overhead entries.
	GPUModel string
	// GPUs is the machine's GPU count.
	GPUs int
	Spot bool
	// Prices is the per-GPU-hour price: the offer's instance price over
	// the GPUs (InstancePrice), or the lease price.
	Prices PriceSchedule
	// Start is when the provider starts charging (launch).
	Start time.Time
	// End is when it stops (terminated); zero while the machine lives.
	End time.Time
	// DemandTeam, DemandProject and DemandQueue describe the waiting work
	// that made the burst controller start the machine.
	DemandTeam    string
	DemandProject string
	DemandQueue   string
}

// MeterInput is one metering cycle's view of the world.
type MeterInput struct {
	// From is the cursor: every slice that starts before it has been
	// written. Zero means nothing has been metered yet.
	From time.Time
	// Now is the cycle's clock reading.
	Now time.Time
	// Allocations running now or ended after From. Passing older ones is
	// harmless: time before From is not metered again.
	Allocations []Allocation
	// Machines (burst) alive now or terminated after From.
	Machines []Machine
}

// MeterResult is what one cycle produced.
type MeterResult struct {
	// Entries in (Start, ID) order.
	Entries []Entry
	// Through is the new cursor: Now rounded down to the grid (never before
	// From). Every slice starting before it is in Entries or was written by
	// an earlier cycle.
	Through time.Time
	// Problems are allocations or machines that could not be metered as
	// given (no rate in force, malformed). GPU-time without a rate is still
	// in Entries, at rate 0; malformed allocations are skipped.
	Problems []error
}

// Meter turns allocations and burst machines into ledger entries: pure, no
// I/O, no clock. It emits, for every allocation, one entry per grid slice
// (or part of a slice, split at a rate change) between From and the last
// complete slice before Now, plus the final partial slice of an allocation
// that has ended. For every burst machine it emits overhead entries for
// the GPU-time no allocation held in each slice, so that per slice the
// machine's GPU-time equals usage plus overhead exactly.
//
// Entry ids depend only on the slice, so running Meter again over the same
// window (after a crash, before the cursor was saved) yields the same ids
// and stores skip them: no slice is lost or counted twice.
func Meter(cfg MeterConfig, in MeterInput) MeterResult {
	slice := cfg.slice()
	from := utcMilli(in.From)
	now := utcMilli(in.Now)
	through := now.Truncate(slice)
	if through.Before(from) {
		through = from
	}
	res := MeterResult{Through: through}

	machines := make(map[string]*Machine, len(in.Machines))
	for i := range in.Machines {
		m := &in.Machines[i]
		if m.Pool.InstanceID != "" {
			machines[m.Pool.InstanceID] = m
		}
	}

	// usageOn collects usage entries per burst machine, for overhead.
	usageOn := make(map[string][]Entry)
	for _, a := range in.Allocations {
		if err := checkAllocation(a); err != nil {
			res.Problems = append(res.Problems, err)
			continue
		}
		prices := a.Prices
		m := machines[a.Pool.InstanceID]
		switch {
		case a.Pool.Kind == PoolOnPrem:
			prices = cfg.OnPrem.For(a.GPUModel)
		case m != nil:
			prices = m.Prices
		}
		start := maxTime(utcMilli(a.Start), from)
		end := meterEnd(a.End, now, through)
		var noRate bool
		forEachPiece(start, end, slice, prices, func(ps, pe time.Time) {
			rate, ok := prices.At(ps)
			noRate = noRate || !ok
			splitStaging(ps, pe, a.Staging, func(s, e time.Time, staging bool) {
				kind := KindUsage
				if staging {
					kind = KindStaging
				}
				gpuMillis := divRound(e.Sub(s).Milliseconds()*a.GPUMilli, 1000)
				ent := Entry{
					ID:           DeriveID(kind, a.Job, a.Attempt, a.Pool.ResourceID(), s),
					Start:        s,
					End:          e,
					Kind:         kind,
					Team:         a.Team,
					Project:      a.Project,
					User:         a.User,
					Job:          a.Job,
					Attempt:      a.Attempt,
					Queue:        a.Queue,
					Pool:         a.Pool,
					GPUModel:     a.GPUModel,
					Spot:         a.Spot,
					GPUMillis:    gpuMillis,
					Rate:         rate,
					Cost:         CostOf(rate, gpuMillis),
					Currency:     cfg.Currency,
					UtilPermille: meanUtil(a.Util, s, e),
				}
				res.Entries = append(res.Entries, ent)
				if m != nil {
					usageOn[m.Pool.InstanceID] = append(usageOn[m.Pool.InstanceID], ent)
				}
			})
		})
		if noRate {
			res.Problems = append(res.Problems, fmt.Errorf("meter job %s attempt %d on %s (%s): %w; metered at 0",
				a.Job, a.Attempt, a.Pool.ResourceID(), a.GPUModel, ErrNoRate))
		}
	}

	for i := range in.Machines {
		m := &in.Machines[i]
		if err := checkMachine(*m); err != nil {
			res.Problems = append(res.Problems, err)
			continue
		}
		res.Entries = append(res.Entries, overhead(cfg, m, from, now, through, usageOn[m.Pool.InstanceID], &res.Problems)...)
	}

	slices.SortFunc(res.Entries, func(a, b Entry) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		return compareStrings(a.ID, b.ID)
	})
	return res
}

// overhead emits the machine's unallocated GPU-time, slice by slice.
func overhead(cfg MeterConfig, m *Machine, from, now, through time.Time, usage []Entry, problems *[]error) []Entry {
	team, project, queue := cfg.Overhead.Account, "", ""
	if team == "" {
		team = DefaultOverheadAccount
	}
	if cfg.Overhead.ChargeTo == ChargeDemandTeam && m.DemandTeam != "" {
		team, project, queue = m.DemandTeam, m.DemandProject, m.DemandQueue
	}
	slices.SortFunc(usage, func(a, b Entry) int { return a.Start.Compare(b.Start) })
	var out []Entry
	var noRate bool
	start := maxTime(utcMilli(m.Start), from)
	end := meterEnd(m.End, now, through)
	next := 0 // first usage entry that may overlap the current piece
	forEachPiece(start, end, cfg.slice(), m.Prices, func(s, e time.Time) {
		capacity := e.Sub(s).Milliseconds() * int64(m.GPUs)
		var used int64
		for next < len(usage) && !usage[next].End.After(s) {
			next++
		}
		for j := next; j < len(usage) && usage[j].Start.Before(e); j++ {
			if usage[j].End.After(s) {
				used += usage[j].GPUMillis
			}
		}
		idle := capacity - used
		if idle <= 0 {
			return
		}
		rate, ok := m.Prices.At(s)
		noRate = noRate || !ok
		out = append(out, Entry{
			ID:           DeriveID(KindOverhead, "", 0, m.Pool.InstanceID, s),
			Start:        s,
			End:          e,
			Kind:         KindOverhead,
			Team:         team,
			Project:      project,
			Queue:        queue,
			Pool:         m.Pool,
			GPUModel:     m.GPUModel,
			Spot:         m.Spot,
			GPUMillis:    idle,
			Rate:         rate,
			Cost:         CostOf(rate, idle),
			Currency:     cfg.Currency,
			UtilPermille: 0,
		})
	})
	if noRate {
		*problems = append(*problems, fmt.Errorf("meter overhead of %s: %w; metered at 0", m.Pool.InstanceID, ErrNoRate))
	}
	return out
}

// forEachPiece walks [start, end) in pieces cut at every grid boundary and
// at every price change.
func forEachPiece(start, end time.Time, slice time.Duration, prices PriceSchedule, fn func(s, e time.Time)) {
	for t := start; t.Before(end); {
		next := t.Truncate(slice).Add(slice)
		if c, ok := prices.nextChange(t); ok && c.Before(next) {
			next = utcMilli(c)
		}
		if end.Before(next) {
			next = end
		}
		if !next.After(t) { // a change inside the current millisecond
			next = t.Add(time.Millisecond)
		}
		fn(t, next)
		t = next
	}
}

// meterEnd is where metering of an allocation or machine stops this cycle:
// its end once it has ended, else the last complete grid boundary.
func meterEnd(end, now, through time.Time) time.Time {
	if !end.IsZero() && !end.After(now) {
		return utcMilli(end)
	}
	return through
}

// meanUtil is the time-weighted mean of the samples over [s, e), counting
// only the covered part; UtilUnknown when nothing covers it.
func meanUtil(samples []UtilSample, s, e time.Time) int32 {
	// first sample in force at s: the last one at or before s.
	i, _ := slices.BinarySearchFunc(samples, s, func(u UtilSample, t time.Time) int { return u.At.Compare(t) })
	if i == len(samples) || !samples[i].At.Equal(s) {
		i = max(i-1, 0)
	}
	var sum, covered int64
	for ; i < len(samples) && samples[i].At.Before(e); i++ {
		from := maxTime(samples[i].At, s)
		to := e
		if i+1 < len(samples) && samples[i+1].At.Before(e) {
			to = samples[i+1].At
		}
		if !to.After(from) {
			continue
		}
		ms := to.Sub(from).Milliseconds()
		p := int64(min(max(samples[i].Permille, 0), 1000))
		sum += p * ms
		covered += ms
	}
	if covered == 0 {
		return UtilUnknown
	}
	return int32(divRound(sum, covered))
}

func checkAllocation(a Allocation) error {
	var err error
	switch {
	case a.Job == "":
		err = errors.New("empty job id")
	case a.Team == "":
		err = errors.New("empty team")
	case !a.Pool.Kind.valid():
		err = fmt.Errorf("pool kind %q", a.Pool.Kind)
	case a.Pool.ResourceID() == "":
		err = errors.New("no node or instance id")
	case a.GPUModel == "":
		err = errors.New("empty GPU model")
	case a.GPUMilli <= 0 || a.GPUMilli > 1_000_000:
		err = fmt.Errorf("GPUMilli %d outside 1..1000000", a.GPUMilli)
	case a.Start.IsZero():
		err = errors.New("no start time")
	case !a.End.IsZero() && a.End.Before(a.Start):
		err = errors.New("ends before it starts")
	}
	if err != nil {
		return fmt.Errorf("meter job %q attempt %d: %w", a.Job, a.Attempt, err)
	}
	return nil
}

func checkMachine(m Machine) error {
	var err error
	switch {
	case !m.Pool.Kind.Burst():
		err = fmt.Errorf("pool kind %q is not cloud or lease", m.Pool.Kind)
	case m.GPUModel == "":
		err = errors.New("empty GPU model")
	case m.GPUs <= 0 || m.GPUs > 1000:
		err = fmt.Errorf("%d GPUs outside 1..1000", m.GPUs)
	case m.Start.IsZero():
		err = errors.New("no start time")
	case !m.End.IsZero() && m.End.Before(m.Start):
		err = errors.New("ends before it starts")
	}
	if err != nil {
		return fmt.Errorf("meter machine %q: %w", m.Pool.InstanceID, err)
	}
	return nil
}

func utcMilli(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC().Truncate(time.Millisecond)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
