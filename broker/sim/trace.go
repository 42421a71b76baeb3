package sim

import (
	"bufio"
	"cmp"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	_ "time/tzdata" // Philly is read in America/Los_Angeles wherever the zone database is missing
)

// Job is one job of a trace: when it was submitted, how long it runs once
// started (its work, excluding any wait), and who it belongs to.
type Job struct {
	// ID names the job in reports and start orders: "p" (Philly) or "j"
	// (generic CSV) and the job's place in submit order in the file, so
	// that ids sort like submit times.
	ID       string        `json:"id"`
	Submit   time.Time     `json:"submit"`
	Duration time.Duration `json:"duration"`
	// GPUs is the total the job holds; more than a node's GPUs makes a
	// gang (see Shape).
	GPUs     int    `json:"gpus"`
	Team     string `json:"team"`
	Priority string `json:"priority"`
	Queue    string `json:"queue"`
}

// Trace is a list of jobs in submit order.
type Trace struct {
	// Location is the zone the trace's wall-clock times are read in; dates
	// given to Window are read in it too.
	Location *time.Location `json:"-"`
	Jobs     []Job          `json:"jobs"`
}

// sortJobs orders jobs by submit time; rows with the same time keep their
// order in the file.
func sortJobs(jobs []Job) {
	slices.SortStableFunc(jobs, func(a, b Job) int { return a.Submit.Compare(b.Submit) })
}

// numberJobs names jobs in submit order, prefix + a zero-padded number,
// so that ids sort like submit times, as the broker's ULIDs do.
func numberJobs(jobs []Job, prefix string) {
	for i := range jobs {
		jobs[i].ID = fmt.Sprintf("%s%06d", prefix, i+1)
	}
}

// Window returns the jobs submitted in [from, to); a zero bound is open.
func (t *Trace) Window(from, to time.Time) *Trace {
	out := &Trace{Location: t.Location}
	for _, j := range t.Jobs {
		if (!from.IsZero() && j.Submit.Before(from)) || (!to.IsZero() && !j.Submit.Before(to)) {
			continue
		}
		out.Jobs = append(out.Jobs, j)
	}
	return out
}

// ParseTime reads a --from/--to bound: RFC 3339, or "2006-01-02" or
// "2006-01-02 15:04:05" as wall-clock time in loc.
func ParseTime(s string, loc *time.Location) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	for _, layout := range []string{"2006-01-02", "2006-01-02 15:04:05", "2006-01-02T15:04:05"} {
		if t, err := time.Parse(layout, s); err == nil {
			return wallTime(t, loc), nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a date (2017-10-01) or time (2017-10-01 08:00:00, or RFC 3339)", s)
}

// wallTime reads the wall clock of naive (a time whose fields are the
// wall clock, in UTC) as a time in loc. Around a DST change the wall
// clock can name two instants (the repeated hour in autumn): the earlier
// one is chosen, so the result never depends on the order of rows. A wall
// clock that names no instant (the skipped hour in spring) is read with
// the offset in force before the change, i.e. it moves forward.
func wallTime(naive time.Time, loc *time.Location) time.Time {
	if loc == nil || loc == time.UTC {
		return naive
	}
	var best time.Time
	found := false
	offsets := map[int]bool{}
	for _, probe := range []time.Duration{-36 * time.Hour, 0, 36 * time.Hour} {
		_, off := naive.Add(probe).In(loc).Zone()
		offsets[off] = true
	}
	for off := range offsets {
		cand := naive.Add(-time.Duration(off) * time.Second)
		if _, o := cand.In(loc).Zone(); o == off && (!found || cand.Before(best)) {
			best, found = cand, true
		}
	}
	if found {
		return best.In(loc)
	}
	_, before := naive.Add(-36 * time.Hour).In(loc).Zone()
	return naive.Add(-time.Duration(before) * time.Second).In(loc)
}

// PhillyOptions are the documented rules that turn the Philly extract,
// which has neither priorities, queues nor timeouts, into Spillway jobs.
type PhillyOptions struct {
	// Seed drives the priority rule.
	Seed uint64
	// High and Low are the shares of jobs given priority high and low
	// (the rest is medium); zero values mean 0.10 and 0.20.
	High, Low float64
	// LargeQueue receives jobs of at least LargeGPUs GPUs ("high_perf",
	// 8); the others go to "default".
	LargeQueue string
	LargeGPUs  int
}

func (o PhillyOptions) withDefaults() PhillyOptions {
	if o.High == 0 {
		o.High = 0.10
	}
	if o.Low == 0 {
		o.Low = 0.20
	}
	if o.LargeQueue == "" {
		o.LargeQueue = "high_perf"
	}
	if o.LargeGPUs == 0 {
		o.LargeGPUs = 8
	}
	return o
}

// PhillyZone is where Philly's naive timestamps were written.
const PhillyZone = "America/Los_Angeles"

// ReadPhilly reads the Pollux extract of the Microsoft Philly trace
// (columns timestamp,duration,num_gpus,gpu_time,cluster; see
// docs/sim.md). Timestamps are US-Pacific wall clock and rows are not
// sorted: the jobs come back in submit order. The virtual cluster becomes
// the team; priority and queue follow PhillyOptions.
func ReadPhilly(r io.Reader, opt PhillyOptions) (*Trace, error) {
	opt = opt.withDefaults()
	loc, err := time.LoadLocation(PhillyZone)
	if err != nil {
		return nil, fmt.Errorf("load zone %s: %w", PhillyZone, err)
	}
	cr := csv.NewReader(bufio.NewReader(r))
	cr.ReuseRecord = true
	cr.FieldsPerRecord = 5
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("read philly header: %w", err)
	}
	if strings.Join(head, ",") != "timestamp,duration,num_gpus,gpu_time,cluster" {
		return nil, fmt.Errorf("philly header is %q, want timestamp,duration,num_gpus,gpu_time,cluster", strings.Join(head, ","))
	}
	tr := &Trace{Location: loc}
	for row := 1; ; row++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read philly: %w", err)
		}
		line, _ := cr.FieldPos(0)
		naive, err := time.Parse("2006-01-02 15:04:05", rec[0])
		if err != nil {
			return nil, fmt.Errorf("philly line %d: timestamp %q is not YYYY-MM-DD HH:MM:SS", line, rec[0])
		}
		dur, err := parseSeconds(rec[1])
		if err != nil || dur <= 0 {
			return nil, fmt.Errorf("philly line %d: duration %q is not a positive number of seconds", line, rec[1])
		}
		gpus, err := strconv.Atoi(rec[2])
		if err != nil || gpus < 1 || gpus > maxTraceGPUs {
			return nil, fmt.Errorf("philly line %d: num_gpus %q is not between 1 and %d", line, rec[2], maxTraceGPUs)
		}
		team := rec[4]
		if team == "" {
			team = "unknown"
		}
		queue := "default"
		if gpus >= opt.LargeGPUs {
			queue = opt.LargeQueue
		}
		tr.Jobs = append(tr.Jobs, Job{
			Submit: wallTime(naive, loc), Duration: dur, GPUs: gpus,
			Team: team, Priority: phillyPriority(opt, uint64(row)), Queue: queue,
		})
	}
	sortJobs(tr.Jobs)
	numberJobs(tr.Jobs, "p")
	return tr, nil
}

// phillyPriority is the seeded priority rule: a hash of (seed, row) read
// as a uniform number u in [0, 1): u < High is high, u ≥ 1-Low is low,
// the rest medium. It depends on the row alone, so a window of the trace
// gives its jobs the same classes as the whole trace.
func phillyPriority(o PhillyOptions, row uint64) string {
	u := float64(splitmix64(o.Seed^splitmix64(row))>>11) / (1 << 53)
	switch {
	case u < o.High:
		return "high"
	case u >= 1-o.Low:
		return "low"
	}
	return "medium"
}

// splitmix64 is a 64-bit mixer (Steele, Lea, Flood: SplitMix).
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// maxTraceGPUs bounds a job's GPUs in a trace.
const maxTraceGPUs = 4096

// CSVHeader is the header of the generic trace CSV.
const CSVHeader = "submit_s,duration_s,gpus,team,priority,queue"

// csvStartPrefix starts the optional first line that anchors submit_s 0
// to a wall-clock instant.
const csvStartPrefix = "# start: "

// DefaultCSVStart anchors a generic CSV without a start line.
var DefaultCSVStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// ReadCSV reads the generic trace CSV (docs/sim.md): an optional line
// "# start: <RFC 3339>", the header submit_s,duration_s,gpus,team,
// priority,queue, then one job per row. Seconds may have decimals (to the
// millisecond); an empty priority or queue is medium or default. Rows
// need not be sorted.
func ReadCSV(r io.Reader) (*Trace, error) {
	br := bufio.NewReader(r)
	start := DefaultCSVStart
	first, err := br.Peek(len(csvStartPrefix))
	if err == nil && string(first) == csvStartPrefix {
		line, err := br.ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("read trace: %w", err)
		}
		s := strings.TrimSpace(strings.TrimPrefix(line, csvStartPrefix))
		if start, err = time.Parse(time.RFC3339Nano, s); err != nil {
			return nil, fmt.Errorf("trace start line: %q is not an RFC 3339 time", s)
		}
	}
	cr := csv.NewReader(br)
	cr.FieldsPerRecord = 6
	cr.TrimLeadingSpace = true
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("read trace header: %w", err)
	}
	if strings.Join(head, ",") != CSVHeader {
		return nil, fmt.Errorf("trace header is %q, want %s", strings.Join(head, ","), CSVHeader)
	}
	tr := &Trace{Location: time.UTC}
	for row := 1; ; row++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read trace: %w", err)
		}
		line, _ := cr.FieldPos(0)
		sub, err := parseSeconds(rec[0])
		if err != nil || sub < 0 {
			return nil, fmt.Errorf("trace line %d: submit_s %q is not a number of seconds ≥ 0", line, rec[0])
		}
		dur, err := parseSeconds(rec[1])
		if err != nil || dur <= 0 {
			return nil, fmt.Errorf("trace line %d: duration_s %q is not a positive number of seconds", line, rec[1])
		}
		gpus, err := strconv.Atoi(rec[2])
		if err != nil || gpus < 1 || gpus > maxTraceGPUs {
			return nil, fmt.Errorf("trace line %d: gpus %q is not between 1 and %d", line, rec[2], maxTraceGPUs)
		}
		j := Job{Submit: start.Add(sub), Duration: dur, GPUs: gpus,
			Team: rec[3], Priority: cmp.Or(rec[4], "medium"), Queue: cmp.Or(rec[5], "default")}
		if j.Team == "" {
			return nil, fmt.Errorf("trace line %d: team is empty", line)
		}
		tr.Jobs = append(tr.Jobs, j)
	}
	sortJobs(tr.Jobs)
	numberJobs(tr.Jobs, "j")
	return tr, nil
}

// WriteCSV writes t as the generic CSV, with submit_s relative to the
// first job and a start line anchoring it.
func WriteCSV(w io.Writer, t *Trace) error {
	bw := bufio.NewWriter(w)
	var start time.Time
	if len(t.Jobs) > 0 {
		start = t.Jobs[0].Submit
		for _, j := range t.Jobs {
			if j.Submit.Before(start) {
				start = j.Submit
			}
		}
		fmt.Fprintf(bw, "%s%s\n", csvStartPrefix, start.UTC().Format(time.RFC3339Nano))
	}
	fmt.Fprintln(bw, CSVHeader)
	cw := csv.NewWriter(bw)
	for _, j := range t.Jobs {
		rec := []string{formatSeconds(j.Submit.Sub(start)), formatSeconds(j.Duration), strconv.Itoa(j.GPUs), j.Team, j.Priority, j.Queue}
		if err := cw.Write(rec); err != nil {
			return fmt.Errorf("write trace: %w", err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("write trace: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write trace: %w", err)
	}
	return nil
}

// parseSeconds reads a decimal number of seconds, to the millisecond.
func parseSeconds(s string) (time.Duration, error) {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > 1e10 {
		return 0, fmt.Errorf("%q is not a number of seconds", s)
	}
	return time.Duration(math.Round(f*1000)) * time.Millisecond, nil
}

func formatSeconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64)
}

// timeoutLadder is the set of timeouts the trace rules declare: what a
// user would write (docs/sim.md).
var timeoutLadder = []time.Duration{
	15 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour, 4 * time.Hour, 8 * time.Hour, 12 * time.Hour,
	24 * time.Hour, 2 * 24 * time.Hour, 3 * 24 * time.Hour, 7 * 24 * time.Hour, 14 * 24 * time.Hour,
	30 * 24 * time.Hour, 60 * 24 * time.Hour,
}

// DeclaredTimeout is the timeout a trace job declares: its duration
// rounded up to the next step of 15m, 30m, 1h, 2h, 4h, 8h, 12h, 1d, 2d,
// 3d, 7d, 14d, 30d, 60d (a whole number of days past that). The traces
// have no timeout, and backfill needs one; a coarse ladder is what people
// write, and it never cuts a job short.
func DeclaredTimeout(d time.Duration) time.Duration {
	for _, t := range timeoutLadder {
		if d <= t {
			return t
		}
	}
	day := 24 * time.Hour
	return (d + day - 1) / day * day
}

// Shape is how a job of gpus GPUs is placed on nodes of nodeGPUs cards:
// on one node when it fits, else a gang on the fewest nodes, the GPUs
// spread evenly (rounded up: 12 GPUs on 8-GPU nodes is 2 × 6).
func Shape(gpus, nodeGPUs int) (perNode, nodes int) {
	if nodeGPUs <= 0 || gpus <= nodeGPUs {
		return gpus, 1
	}
	nodes = (gpus + nodeGPUs - 1) / nodeGPUs
	return (gpus + nodes - 1) / nodes, nodes
}

// Validate checks the jobs against the names a policy knows.
func (t *Trace) Validate(queues map[string]bool, priorities map[string]bool) error {
	for _, j := range t.Jobs {
		if !queues[j.Queue] {
			return fmt.Errorf("job %s: unknown queue %q (the cluster config's broker.queues)", j.ID, j.Queue)
		}
		if !priorities[j.Priority] {
			return fmt.Errorf("job %s: unknown priority %q (the cluster config's broker.priorities)", j.ID, j.Priority)
		}
		if err := checkName(j.Team); err != nil {
			return fmt.Errorf("job %s: team: %w", j.ID, err)
		}
	}
	return nil
}

// nameRe is what a team name in a job spec may be.
var nameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

func checkName(s string) error {
	if !nameRe.MatchString(s) {
		return fmt.Errorf("%q is not 1-63 letters, digits, '.', '_' or '-'", s)
	}
	return nil
}
